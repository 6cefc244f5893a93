"""Host: a root path (``/`` or a simulated root) and the one layer that reads it.

Everything ttmesh knows about a machine's chips comes through :class:`Host`: the kernel driver's
files (``sys/``, ``dev/``, ``proc/driver/``), the chips' firmware telemetry and the ``tt-smi`` to
run. A simulated root (marker ``.ttmesh-sim``) has the same files; the values that move on real
hardware (heartbeats, holders, Ethernet status) are computed from the simulator's state at the
moment they are read, here and nowhere else, so discovery, health checks and resets run the
same code against ``/`` and against a simulated root.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import stat
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from ttmesh.errors import bad_input, from_os_error

if TYPE_CHECKING:
    from ttmesh.sim.core import SimRoot

_DEV_ATTR = re.compile(r"^sys/class/tenstorrent/tenstorrent!(\d+)/(tt_heartbeat)$")
_PIDS = re.compile(r"^proc/driver/tenstorrent/(\d+)/pids$")

CLASS_DIR = "sys/class/tenstorrent"
DRIVER_VERSION = "sys/module/tenstorrent/version"


class Host:
    """A machine's Tenstorrent view, rooted at ``root``."""

    def __init__(self, root: str | os.PathLike[str] = "/", flag: str | None = None) -> None:
        path = Path(root)
        if not path.is_dir():
            raise bad_input(
                f"root {root} is not a directory",
                "give --root an existing directory, or use --sim NAME",
            )
        self.root = path.resolve()
        # How a user names this host on ttmesh's command line, for the fix lines ttmesh prints
        # ("ttmesh reset --sim quietbox2 --chips ..."): "" for this machine.
        if flag is None:
            flag = "" if self.root == Path("/") else f"--root {shlex.quote(str(self.root))}"
        self.flag = flag

    def __repr__(self) -> str:
        return f"Host({str(self.root)!r}{', simulated' if self.simulated else ''})"

    # -- identity

    @cached_property
    def simulated(self) -> bool:
        from ttmesh.sim.core import MARKER

        return (self.root / MARKER).is_file()

    @cached_property
    def sim(self) -> SimRoot:
        """The simulator's mechanics behind a simulated root (its 'firmware')."""
        if not self.simulated:
            raise bad_input(
                f"{self.root} is not a simulated host (no .ttmesh-sim marker)",
                "create one with: ttmesh sim create --system quietbox2 --root DIR",
            )
        from ttmesh.sim.core import SimRoot

        return SimRoot(str(self.root))

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def check_changeable(self) -> None:
        """Changing a simulated host (a reset, a job's holders) writes its state: refuse at
        once, naming the owner, when this user cannot (a real host's tools check their own)."""
        if not self.simulated:
            return
        state_dir, lock = self.path("sim"), self.path("sim/state.lock")
        if not os.access(state_dir, os.W_OK | os.X_OK) or (
            lock.exists() and not os.access(lock, os.W_OK)
        ):
            denied = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(lock))
            raise from_os_error(denied, "change the simulated host")

    # -- the reader

    def read_text(self, rel: str) -> str | None:
        """Read a host file (``rel`` is relative to the root); None when it does not exist.

        On a simulated root the files whose content moves on hardware are computed now.
        """
        rel = rel.lstrip("/")
        if self.simulated:
            dynamic = self._sim_read(rel)
            if dynamic is not None:
                return dynamic
        try:
            return self.path(rel).read_text()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _sim_read(self, rel: str) -> str | None:
        match = _DEV_ATTR.match(rel)
        if match:
            asic = self.attr(int(match.group(1)), "tt_asic_id")
            if asic is None:
                return None
            state = self.sim.read_state()
            return f"{self.sim.heartbeat(state, asic)}\n" if asic in state["chips"] else None
        match = _PIDS.match(rel)
        if match and self.path(rel).exists():
            asic = self.attr(int(match.group(1)), "tt_asic_id")
            if asic is None:
                return ""
            pids = self.sim.holders(self.sim.read_state(), asic)
            return "".join(f"{p}\n" for p in pids)
        return None

    def attr(self, dev: int, name: str) -> str | None:
        """A driver attribute of /dev/tenstorrent/<dev>, stripped."""
        text = self.read_text(f"{CLASS_DIR}/tenstorrent!{dev}/{name}")
        return None if text is None else text.strip()

    # -- what the driver shows

    def driver_version(self) -> str | None:
        text = self.read_text(DRIVER_VERSION)
        return None if text is None else text.strip()

    def dev_indexes(self) -> list[int]:
        """N of every /sys/class/tenstorrent/tenstorrent!N, ascending."""
        try:
            names = os.listdir(self.path(CLASS_DIR))
        except FileNotFoundError:
            return []
        found = []
        for name in names:
            match = re.fullmatch(r"tenstorrent!(\d+)", name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def bdf_of(self, dev: int) -> str | None:
        """The PCI address of /dev/tenstorrent/<dev>: the basename of its ``device`` link."""
        link = self.path(f"{CLASS_DIR}/tenstorrent!{dev}/device")
        if not link.exists():
            return None
        return os.path.basename(os.path.realpath(link))

    def pci_attr(self, bdf: str, name: str) -> str | None:
        text = self.read_text(f"sys/bus/pci/devices/{bdf}/{name}")
        return None if text is None else text.strip()

    def dev_node(self, dev: int) -> Path:
        return self.path(f"dev/tenstorrent/{dev}")

    def holder_pids(self, dev: int) -> list[int] | None:
        """PIDs holding /dev/tenstorrent/<dev>; None when it cannot be known (permissions)."""
        text = self.read_text(f"proc/driver/tenstorrent/{dev}/pids")
        if text is not None:
            return sorted({int(tok) for tok in text.split() if tok.isdigit()})
        if self.simulated:
            return []
        return _scan_proc_fds(str(self.dev_node(dev)))

    # -- firmware telemetry (not in sysfs: tt_umd or tt-smi on hardware, the state on a sim)

    def eth_live_status(self, asics: list[str]) -> dict[str, int | None]:
        """ETH_LIVE_STATUS per chip (None = unknown)."""
        if self.simulated:
            state = self.sim.read_state()
            return {
                a: (self.sim.eth_live_status(state, a) if a in state["chips"] else None)
                for a in asics
            }
        from ttmesh.fabric import telemetry

        return telemetry.eth_live_status(self, asics)

    def remote_heartbeats(self, asics: list[str]) -> dict[str, int | None]:
        """Heartbeats of chips without a driver node of their own (remote chips)."""
        if self.simulated:
            state = self.sim.read_state()
            return {
                a: (self.sim.heartbeat(state, a) if a in state["chips"] else None) for a in asics
            }
        from ttmesh.fabric import telemetry

        return telemetry.remote_heartbeats(self, asics)

    # -- tools

    def cluster_descriptor_path(self) -> Path | None:
        """A simulated host's topology, as tt-umd would have written it."""
        path = self.path("cluster_descriptor.yaml")
        return path if self.simulated and path.is_file() else None

    def check_trusted(self, path: Path) -> None:
        """Refuse to run an executable from a simulated root not owned by us (or root)."""
        for p in (self.root, path):
            st = p.stat()
            if st.st_uid not in (0, os.getuid()) or st.st_mode & stat.S_IWOTH:
                raise bad_input(
                    f"refusing to run {path}: {p} is not owned by you or root, or is "
                    "writable by others",
                    "recreate the simulated host with ttmesh sim create",
                )


def _scan_proc_fds(node: str) -> list[int] | None:
    """What fuser does: every process with an open fd on ``node``. None if any was hidden."""
    pids: set[int] = set()
    hidden = False
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            hidden = True
            continue
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == node:
                    pids.add(int(name))
                    break
            except OSError:
                continue
    if hidden and not pids:
        return None
    return sorted(pids)
