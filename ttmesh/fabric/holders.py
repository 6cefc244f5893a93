"""Which processes hold which chip, and who they are.

The driver lists the PIDs with a device open in ``/proc/driver/tenstorrent/N/pids`` (driver >=
2.5); :meth:`Host.holder_pids` falls back to scanning ``/proc/*/fd`` and answers None ("unknown")
where permissions hide processes, never an empty list. Processes are always this machine's, so
their details come from the real ``/proc`` even for a simulated host.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from ttmesh.fabric.devices import Chip, Inventory
from ttmesh.sim.core import proc_start_time


@dataclass(frozen=True)
class Holder:
    pid: int
    user: str
    cmd: str
    start: int | None  # clock ticks since boot: check it before signalling the PID

    def to_json(self) -> dict:
        return {"pid": self.pid, "user": self.user, "cmd": self.cmd}


def one_line(text: str) -> str:
    """A command line as one printable line (as tt-smi shows it): newlines and tabs become
    spaces, other control characters \\xNN; an argument like ``-c "a\\nb"`` stays on one line."""
    text = text.replace("\n", " ").replace("\r", " ").replace("\t", " ")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text).strip()


def describe(pid: int) -> Holder:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = " ".join(p.decode(errors="replace") for p in f.read().split(b"\0") if p)
    except OSError:
        cmd = "?"
    cmd = one_line(cmd)
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    except OSError:
        user = "?"
    return Holder(pid, user, cmd or "?", proc_start_time(pid))


def holders(inv: Inventory, chip: Chip) -> list[Holder] | None:
    """Processes holding ``chip`` (through its own device or its board partner's)."""
    lead = chip if chip.bdf else next((c for c in inv.chips if c.asic_id == chip.via), None)
    if lead is None or lead.dev_index is None:
        return None
    pids = inv.host.holder_pids(lead.dev_index)
    if pids is None:
        return None
    return [describe(p) for p in pids]
