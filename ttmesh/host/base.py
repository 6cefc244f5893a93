"""Host: a root path (``/`` or a simulated root) and the one layer that reads it.

Everything ttmesh knows about a machine's chips comes through a :class:`Host`: the kernel
driver's files (``sys/``, ``dev/``, ``proc/driver/``), the chips' firmware telemetry, the
topology, the ``tt-smi`` to run and where chip leases live. The readers are shared; what differs
between a real machine and a simulated one is a method a backend overrides:

* :class:`ttmesh.host.real.RealHost` reads this machine (telemetry and topology through tt-umd);
* ``ttmesh.sim.backend.SimHost`` computes the values that move on hardware (heartbeats, holders,
  Ethernet status) from the simulator's state at the moment they are read.

A job's events on the host (workers started and holding chips, the fabric opened, a worker
ended) are calls that do nothing on a real machine, where the driver and firmware see them by
themselves; the simulator implements them. Only the command line chooses a backend
(docs/simulator.md, "Host backends").
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ttmesh import fileread, numeric
from ttmesh.errors import TTMeshError, bad_input, from_os_error, owner_of
from ttmesh.host import boards
from ttmesh.paths import SharedDir, shared_dir

if TYPE_CHECKING:
    from ttmesh.host.clusterdesc import ClusterDescriptor

CLASS_DIR = "sys/class/tenstorrent"
BY_ID = "dev/tenstorrent/by-id"  # tt-kmd's udev rules (udev-50-tenstorrent.rules): by-id links
# A PCI address, as sysfs names a device's directory.
BDF_NAME = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
BY_ID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}")  # never a control character
DRIVER_VERSION = "sys/module/tenstorrent/version"
LEASES = "run/lock/ttmesh"
RUN_LOCK = "/run/lock"
RUN_LOCK_LEASES = Path("/run/lock/ttmesh")
TMP_LEASES = Path("/tmp/ttmesh-leases")  # on a machine without /run/lock (never $TMPDIR)
MAX_FILE = 1024 * 1024  # a driver file (sysfs says 4096 bytes for every attribute)

Marks = list[tuple[list[str], int]]  # (asic ids, pid) per process


class Host:
    """A machine's Tenstorrent view, rooted at ``root``."""

    simulated = False
    records_known_good = False  # ``check`` records a last known-good topology (real hosts)
    # Reading the topology, Ethernet status or remote heartbeats opens chips (tt-umd on
    # hardware); a poller that must never open one (``ttmesh metrics``) leaves them out.
    firmware_opens_chips = False

    def train_timeout(self, archs: Iterable[str]) -> float:
        """Seconds a reset waits, after tt-smi returns, for its chips' links to train: the
        bound of the boards' links within a host (``boards.link_training``: 60 s on
        Wormhole and Blackhole), the longest of ``archs``. The wait polls: a reset whose
        chips look right returns at once, so this only bounds a reset that did not work."""
        return max(
            (boards.link_training(a, external=False).timeout for a in set(archs)), default=0.0
        )

    def __init__(self, root: str | os.PathLike[str] = "/", flag: str | None = None) -> None:
        path = Path(root)
        if not path.is_dir():
            raise bad_input(
                f"root {root} is not a directory",
                "give --root an existing directory, or use --sim NAME",
            )
        self.root = path.resolve()
        self._root = str(self.root)
        # How a user names this host on ttmesh's command line, for the fix lines ttmesh prints
        # ("ttmesh reset --sim quietbox2 --chips ..."): "" for this machine.
        if flag is None:
            flag = "" if self.root == Path("/") else f"--root {shlex.quote(str(self.root))}"
        self.flag = flag

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.root)!r})"

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    # -- the reader

    def _join(self, rel: str) -> str:
        """:meth:`path` as a string (a Path per read costs more than the read, for a host's
        hundreds of driver files)."""
        return os.path.join(self._root, rel.lstrip("/"))

    def read_text(self, rel: str) -> str | None:
        """Read a host file (``rel`` is relative to the root); None when it does not exist.
        Bounded and regular files only (:mod:`ttmesh.fileread`): anything else in a driver
        file's place is :meth:`corrupt`. Bytes that are not UTF-8 are replaced: whoever reads
        the value checks it."""
        rel = rel.lstrip("/")
        dynamic = self._dynamic(rel)
        if dynamic is not None:
            return dynamic
        path = self._join(rel)
        try:
            data = fileread.read_bytes(path, MAX_FILE, "driver file", self._root)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except fileread.Refused as exc:
            raise self.corrupt(path, exc.why) from None
        return data.decode(errors="replace")

    def corrupt(self, path: str, why: str) -> TTMeshError:
        """A host file that cannot be what the driver writes: one line naming it, and the fix
        for this kind of host (bad input, exit 2)."""
        return bad_input(f"{path} {why}", self.repair_hint())

    def repair_hint(self) -> str:
        """How to get sane driver files back on this host."""
        if self.root == Path("/"):
            return (
                "the tenstorrent driver writes this file: reload it (modprobe -r tenstorrent; "
                "modprobe tenstorrent) or reboot, and report it if it stays"
            )
        return f"check the files under {self.root}"

    def _dynamic(self, rel: str) -> str | None:
        """A file whose content a backend computes when read (None: read the file)."""
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
            match = re.fullmatch(r"tenstorrent!([0-9]+)", name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

    def bdf_of(self, dev: int) -> str | None:
        """The PCI address of /dev/tenstorrent/<dev>: the basename of its ``device`` link."""
        link = self._join(f"{CLASS_DIR}/tenstorrent!{dev}/device")
        if not os.path.exists(link):
            return None
        # The driver's link names the device's own directory (``../../../0000:01:00.0``): its
        # last name is the address, read in one call (resolving the whole path takes some ten).
        # A name that is not an address is resolved whole, as it always was.
        last = os.path.basename(os.readlink(link))
        return last if BDF_NAME.fullmatch(last) else os.path.basename(os.path.realpath(link))

    def pci_attr(self, bdf: str, name: str) -> str | None:
        text = self.read_text(f"sys/bus/pci/devices/{bdf}/{name}")
        return None if text is None else text.strip()

    @staticmethod
    def _by_id_target(nodes: str, link: str) -> str:
        """Where a ``by-id`` link leads (names only: nothing is opened). udev's own form,
        ``../N`` to a node that is no link, is read in two calls; anything else is resolved
        whole (some ten)."""
        text = os.readlink(link)
        index = text.removeprefix("../")
        if text.startswith("../") and numeric.digits(index):
            node = os.path.join(nodes, index)
            if not os.path.islink(node):
                return node
        return os.path.realpath(link)

    def by_id_links(self) -> dict[int, str]:
        """N of /dev/tenstorrent/N -> the name of its ``/dev/tenstorrent/by-id`` link, where
        the driver's udev rules made one (tt-kmd's udev-50-tenstorrent.rules since 2.1:
        ``<wormhole|blackhole>-<tt_asic_id>``, a relative link ``../N``). Links are read, never
        opened: one that resolves out of this host's ``dev/tenstorrent`` is a planted link and
        refused (:meth:`corrupt`), as any driver file leading out of the root is."""
        folder = self._join(BY_ID)
        try:
            names = sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except OSError as exc:
            raise from_os_error(exc, f"list {folder}") from None
        nodes = self._join("dev/tenstorrent")  # the root is resolved: never a link followed
        if os.path.realpath(folder) != os.path.join(nodes, "by-id"):
            raise self.corrupt(
                folder,
                f"leads out of {nodes} (to {os.path.realpath(folder)[:200]}): udev makes a "
                "directory there",
            )
        out: dict[int, str] = {}
        for name in names:
            link = os.path.join(folder, name)
            if not BY_ID_NAME.fullmatch(name) or not os.path.islink(link):
                continue  # udev makes links of printable names only; the rest is not the driver's
            real = self._by_id_target(nodes, link)
            if os.path.dirname(real) != nodes:
                raise self.corrupt(
                    link,
                    f"leads out of {nodes} (to {real[:200]}): not a link tt-kmd's udev rules make",
                )
            base = os.path.basename(real)
            if numeric.digits(base) and int(base) not in out:
                out[int(base)] = name
        return out

    def dev_node(self, dev: int) -> Path:
        return self.path(f"dev/tenstorrent/{dev}")

    def holder_pids(self, dev: int) -> list[int] | None:
        """PIDs holding /dev/tenstorrent/<dev>; None when it cannot be known (permissions)."""
        text = self.read_text(f"proc/driver/tenstorrent/{dev}/pids")
        if text is not None:
            return sorted({int(tok) for tok in text.split() if numeric.digits(tok)})
        return self._scan_holders(dev)

    def _scan_holders(self, dev: int) -> list[int] | None:
        """Holders when the driver does not list them (drivers before 2.5)."""
        return []

    # -- firmware telemetry and topology (not in sysfs: each backend has its source)

    def eth_live_status(self, asics: list[str]) -> dict[str, int | None]:
        """ETH_LIVE_STATUS per chip (None = unknown)."""
        return {a: None for a in asics}

    def remote_heartbeats(self, asics: list[str]) -> dict[str, int | None]:
        """Heartbeats of chips without a driver node of their own (remote chips)."""
        return {a: None for a in asics}

    def heartbeat_intervals(self, chips: list[tuple[str, int | None]]) -> dict[str, float | None]:
        """The seconds between heartbeat updates each chip's firmware reports, per asic id, for
        ``(asic id, /dev/tenstorrent number or None)`` pairs; None where it reports none
        (Wormhole has no such telemetry tag) or cannot be asked. The heartbeat watch waits
        about two of these before it calls a chip frozen, instead of assuming a rate."""
        return {a: None for a, _ in chips}

    def topology(self) -> tuple[ClusterDescriptor | None, str, list[str]]:
        """(remote chips and Ethernet links as a cluster descriptor, its source, notes)."""
        return None, "none", []

    def mock_cluster(self) -> ClusterDescriptor | None:
        """The host as tt-metal's mock mode should see it now (None: real chips are used)."""
        return None

    # -- tools

    def default_tt_smi(self) -> str:
        """The tt-smi that resets this host's chips (bad input when there is none)."""
        raise bad_input(
            f"tt-smi not found for root {self.root} (a tt-smi on PATH would reset this "
            "machine's chips)",
            "give --tt-smi PATH",
        )

    def tt_smi_env(self) -> dict[str, str | None]:
        """Environment changes for running tt-smi (None removes a variable)."""
        return {}

    def check_trusted(self, path: Path) -> None:
        """Refuse to run an executable from under this root unless it is owned by this user
        or root and writable by no one else."""
        for p in (self.root, path):
            st = p.stat()
            if st.st_uid not in (0, os.getuid()) or st.st_mode & stat.S_IWOTH:
                raise bad_input(
                    f"refusing to run {path}: {p} is not owned by you or root, or is "
                    "writable by others",
                    "recreate the simulated host with ttmesh sim create",
                )

    # -- where leases live (docs/conventions.md, "Leases and job records")

    def lease_dir(self) -> Path:
        """Where this host's leases live, shared by every user of it: ``TTMESH_RUNTIME_DIR``
        when set, else ``<root>/run/lock/ttmesh``. On ``/`` that is ``/run/lock/ttmesh``, or
        ``/tmp/ttmesh-leases`` on a machine without ``/run/lock``: the choice depends on the
        machine only (never on who asks, their TMPDIR or what they may write), so every user
        leases in one place."""
        override = os.environ.get("TTMESH_RUNTIME_DIR")
        if override:
            if not os.path.isabs(override):
                raise bad_input(
                    f"TTMESH_RUNTIME_DIR={override} is not an absolute path",
                    "set it to the absolute path of the host's lease directory, or unset it",
                )
            return Path(os.path.normpath(override))
        if self.root != Path("/"):
            return self.path(LEASES)
        return RUN_LOCK_LEASES if os.path.isdir(RUN_LOCK) else TMP_LEASES

    def open_lease_dir(self, create: bool = False) -> SharedDir | None:
        """The lease directory, checked and open (``paths.shared_dir``); None when it does not
        exist and ``create`` is false.

        Trusted owners: root, this user, and the owner of the host's root (a simulated host is
        its owner's). Root meeting the standard location made by another user (the first user
        of a fresh host) takes it over rather than refusing; anyone else is refused with the
        command that fixes it."""
        path = self.lease_dir()
        standard = path in (RUN_LOCK_LEASES, TMP_LEASES) and self.root == Path("/")
        try:
            owner = os.stat(self.root).st_uid
        except OSError:
            owner = 0
        fix = (
            f"ask root to run: chown root:root {path} && chmod 1777 {path} (or any ttmesh "
            "command as root does it); docs/troubleshooting.md has the tmpfiles.d line"
            if standard
            else f"set TTMESH_RUNTIME_DIR to a directory root or you own, or remove {path}"
        )
        try:
            return shared_dir(
                path,
                what="the lease directory",
                create=create,
                trusted=frozenset({0, os.geteuid(), owner}),
                heal=standard,
                fix=fix,
                elsewhere=(
                    "set TTMESH_RUNTIME_DIR to a directory every user of the host shares, or "
                    "unset it"
                    if os.environ.get("TTMESH_RUNTIME_DIR")
                    else None
                ),
            )
        except PermissionError as exc:
            parent = path.parent
            if create and standard and not os.path.exists(path):
                raise bad_input(
                    f"the lease directory {path} does not exist and you cannot create it in "
                    f"{parent} (owned by {owner_of(str(parent))})",
                    f"ask root to run: install -d -m 1777 -o root -g root {path} (or any ttmesh "
                    "command as root does it); docs/troubleshooting.md has the tmpfiles.d line",
                ) from None
            raise from_os_error(exc, "open the lease directory") from None

    # -- what a job does on the host (nothing to do on a real machine)

    def rank_env(self, job_chips: list[str]) -> dict[str, str]:
        """Variables every rank of a job on these chips needs from this host."""
        return {}

    def workers_started(self, holders: Marks) -> None:
        """Workers (pid) opened their chips (asic ids)."""

    def fabric_opened(self, marks: Marks, owner: str, supervisor: int) -> None:
        """Workers brought the Ethernet fabric between their chips up; ``supervisor`` decides
        how each ended (``worker_ended``)."""

    def worker_ended(self, pid: int, clean: bool) -> None:
        """A worker that opened the fabric ended: cleanly (it closed it) or not."""

    def check_changeable(self) -> None:
        """Refuse at once when this user cannot change the host's state (a simulated host's
        state file); a real machine's tools check their own permissions."""
