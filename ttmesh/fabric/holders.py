"""Which processes hold which chip, and who they are.

The driver lists the PIDs with a device open in ``/proc/driver/tenstorrent/N/pids`` (driver >=
2.5); :meth:`Host.holder_pids` falls back to scanning ``/proc/*/fd`` and answers None ("unknown")
where permissions hide processes, never an empty list. Processes are always this machine's, so
who they are comes from the real ``/proc`` even for a simulated host.
"""

from __future__ import annotations

from ttmesh import procs
from ttmesh.fabric.devices import Chip, Inventory
from ttmesh.vocab import ChipProcess, Role


def describe(pid: int, asic: str = "", job: str | None = None) -> ChipProcess:
    user, cmd, start = procs.identity(pid)
    role = Role.WORKER if job else Role.HOLDER
    return ChipProcess(pid, user, cmd, start, job=job, asic=asic, role=role)


def holders(inv: Inventory, chip: Chip) -> list[ChipProcess] | None:
    """Processes holding ``chip`` (through its own device or its board partner's)."""
    lead = inv.lead(chip)
    if lead is None or lead.dev_index is None:
        return None
    pids = inv.host.holder_pids(lead.dev_index)
    if pids is None:
        return None
    return [describe(p, chip.asic_id) for p in pids]
