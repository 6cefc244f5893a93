"""The simulated host's mechanics: its file tree, its state and how that state moves.

STANDARD LIBRARY ONLY. This file is copied into every simulated root as ``bin/_ttmesh_simcore.py``
(with the bounded reader, ``ttmesh.fileread``, as ``bin/_ttmesh_fileread.py``) so the
``bin/tt-smi`` stand-in keeps working when the venv that made the root is gone; ttmesh itself
imports the same code as ``ttmesh.sim.core``.

A simulated root holds what the kernel driver shows on a real host (``sys/``, ``dev/``,
``proc/driver/``), tt-umd's ``cluster_descriptor.yaml``, the marker ``.ttmesh-sim`` and:

* ``sim/system.json`` - the hardware: chips, boards, links (a stock system model, see system.py);
* ``sim/state.json``  - everything that changes, written under ``sim/state.lock`` and replaced
  atomically: chips alive or dead, links down, armed faults, fabric marks, holders.

A root's files are read as hostile (a user may truncate, garble or replace any of them): every
read is bounded and regular files only (``fileread``), and what is read is checked against the
shape this module writes (:func:`check_system`, :func:`check_state`). Anything else is a
:class:`SimCorrupt`, one line naming the file and the command that recreates the root.

Dynamic values are computed when read: a live chip's heartbeat advances with the clock, a dead
chip's is frozen; a holder is listed only while its process lives; a fabric mark whose process
died without clearing it takes down the links between its chips, as a killed multi-chip tt-metal
job leaves them on hardware.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import itertools
import json
import math
import os
import re
import shlex
import shutil
import stat
import time
from collections.abc import Iterator
from typing import Any

if __package__:
    from ttmesh import fileread
    from ttmesh.sim import cables as simcables
else:  # the copies in a simulated root's bin/, next to the copy of the reader
    import _ttmesh_fileread as fileread  # type: ignore[import-not-found, no-redef]
    import _ttmesh_simcables as simcables  # type: ignore[import-not-found, no-redef]

MARKER = ".ttmesh-sim"
SYSTEM_FILE = "sim/system.json"
STATE_FILE = "sim/state.json"
LOCK_FILE = "sim/state.lock"
STATE_SCHEMA = "ttmesh.simstate/1"
VENDOR_ID = 0x1E52
IOMMU_TYPES = ("identity", "DMA", "DMA-FQ", "blocked", "unmanaged")  # sysfs-kernel-iommu_groups
_FW = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9}){2,3}")
_DIGITS = re.compile(r"[0-9]+", re.ASCII)  # the digit rule (ttmesh.numeric: not importable here)
PCI_DEVICE = {"blackhole": 0xB140, "wormhole_b0": 0x401E}
LINK_SPEED = {"blackhole": "32.0 GT/s PCIe", "wormhole_b0": "16.0 GT/s PCIe"}
DEFAULT_CONFIG = {"heartbeat_hz": 10.0, "reset_seconds": 0.05}
# How fast each architecture's firmware advances its heartbeat. Blackhole's updates its telemetry,
# the heartbeat included, every 100 ms (tt-zephyr-platforms lib/tenstorrent/bh_arc/telemetry.c,
# telem_update_interval; tt-umd's firmware-info test waits 150 ms because "heartbeat increments
# every 100ms") and reports that interval (TAG_UPDATE_TELEM_SPEED, in ms). Wormhole's ARC0_HEALTH
# rate is not published, nor reported: 10 Hz is an assumption, set yours with
# ``ttmesh sim create --heartbeat-hz`` or ``ttmesh sim config --heartbeat-hz``.
HEARTBEAT_HZ = {"blackhole": 10.0, "wormhole_b0": 10.0}
REPORTS_INTERVAL = {"blackhole"}  # firmware with a telemetry update interval tag
_tmp_names = itertools.count()
FAULT_KINDS = (
    "link-down",
    "chip-dead",
    "reset-fails",
    "reset-renumbers",
    "reset-hangs",
    "hold",
)


# The most each file of a root can hold (a Galaxy's are tens of KiB).
MAX_JSON = 64 * fileread.MiB  # system.json, state.json (the state keeps every reset's record)
MAX_SMALL = 64 * fileread.KiB  # the marker, a driver attribute
MAX_DESCRIPTOR = 16 * fileread.MiB  # cluster_descriptor.yaml
CAPTURE_INFO = "sim/capture.json"
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


class SimError(Exception):
    """A problem with a simulated root (bad target, missing chip); the message is one line.
    ``message``, ``hint`` and ``code`` are what the command line prints (exit 2)."""

    code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class SimCorrupt(SimError):
    """A file of the root that is not what this module wrote: truncated, garbled, missing, a
    directory, a FIFO. Names the file and the command that recreates the root."""

    def __init__(self, root: str, path: str, why: str) -> None:
        # "... state.json is not valid JSON"; a part of it: "... state.json: chips is not ..."
        sep = " " if why.startswith(("is ", "has ", "holds ", "cannot ", "leads ")) else ": "
        super().__init__(
            f"the simulated host's {path}{sep}{why}", f"recreate it: {recreate_command(root)}"
        )
        self.path = path


def recreate_command(root: str) -> str:
    """The ``ttmesh sim create --force ...`` that rebuilds ``root`` as it was made (from its
    marker and ``sim/capture.json``, read bounded; ``--system NAME`` when they cannot say)."""
    where = shlex.quote(os.path.abspath(root))
    info = _small_json(os.path.join(root, CAPTURE_INFO), MAX_JSON)
    if isinstance(info, dict) and isinstance(info.get("archive"), str):
        archive = shlex.quote(info["archive"])
        return f"ttmesh sim create --force --from-capture {archive} --root {where}"
    marker = _small_json(os.path.join(root, MARKER), MAX_SMALL)
    system = marker.get("system") if isinstance(marker, dict) else None
    if not isinstance(system, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", system):
        system = "NAME"
    host = marker.get("host") if isinstance(marker, dict) else None
    part = f" --host {host}" if isinstance(host, int) and not isinstance(host, bool) else ""
    return f"ttmesh sim create --force --system {system}{part} --root {where}"


def read_marker(root: str | os.PathLike[str]) -> dict | None:
    """The root's marker (``{}`` when it is garbled: still a simulated host, a broken one);
    None when there is none. Read bounded: it may be a FIFO or /dev/zero."""
    try:
        data = fileread.load_json(
            fileread.read_bytes(os.path.join(root, MARKER), MAX_SMALL, "marker") or b"{}"
        )
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):  # fileread.Refused is a ValueError
        return {}
    return data if isinstance(data, dict) else {}


def _small_json(path: str, limit: int) -> Any:
    try:
        return fileread.load_json(fileread.read_bytes(path, limit))
    except (OSError, ValueError):
        return None


def read_json(root: str, rel: str, what: str, limit: int = MAX_JSON) -> Any:
    """A JSON file of the root, read bounded; :class:`SimCorrupt` when it cannot be."""
    path = os.path.join(root, rel)
    try:
        data = fileread.read_bytes(path, limit, what, os.path.realpath(root))
    except fileread.Refused as exc:
        raise SimCorrupt(root, path, exc.why) from None
    except (FileNotFoundError, NotADirectoryError):
        raise SimCorrupt(root, path, "is missing") from None
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise  # whose it is: the command line names the owner
        raise SimCorrupt(root, path, f"cannot be read ({exc.strerror})") from None
    try:
        return fileread.load_json(data)
    except UnicodeDecodeError:
        raise SimCorrupt(root, path, "is not UTF-8 text (garbled?)") from None
    except ValueError as exc:
        raise SimCorrupt(root, path, f"is not valid JSON ({exc})") from None


# --------------------------------------------------------------------------- shapes


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _quads(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(q, list) and len(q) == 4 and all(_int(x) for x in q) for q in value
    )


def check_system(data: Any) -> str | None:
    """What is wrong with a ``sim/system.json`` (None: it has the shape this module reads)."""
    if not isinstance(data, dict):
        return "is not a JSON object"
    chips = data.get("chips")
    if not isinstance(chips, list) or not chips:
        return "has no list of chips"
    ids = set()
    for i, chip in enumerate(chips):
        where = f"chips[{i}]"
        if not isinstance(chip, dict):
            return f"{where} is not an object"
        for key in ("id", "unique_id", "board_id"):
            if not _int(chip.get(key)) or chip[key] < 0:
                return f"{where}.{key} is not a whole number"
        if chip.get("arch") not in PCI_DEVICE:
            return f"{where}.arch is not one of {', '.join(PCI_DEVICE)}"
        if not isinstance(chip.get("card_type"), str):
            return f"{where}.card_type is not a string"
        bdf = chip.get("bdf")
        if bdf is not None and not (isinstance(bdf, str) and _BDF.match(bdf)):
            return f"{where}.bdf is not a PCI address"
        if chip.get("dev_index") is not None and not _int(chip.get("dev_index")):
            return f"{where}.dev_index is not a whole number"
        ids.add(chip["id"])
    boards = data.get("boards", [])
    if not isinstance(boards, list) or not all(
        isinstance(b, dict) and isinstance(b.get("chips"), list) for b in boards
    ):
        return "boards is not a list of boards with chips"
    for key in ("links", "remote_links"):
        if not _quads(data.get(key, [])):
            return f"{key} is not a list of [chip, channel, chip, channel]"
    for a, _, b, _ in data.get("links", []):
        if a not in ids or b not in ids:
            return f"links names chip {a if a not in ids else b}, which chips has not"
    for a, *_ in data.get("remote_links", []):
        if a not in ids:
            return f"remote_links names chip {a}, which chips has not"
    for b in boards:
        if not all(c in ids for c in b["chips"]):
            return "a board names a chip that chips has not"
    for key in ("name", "driver_version", "fw_bundle_version"):
        if key in data and not isinstance(data[key], str):
            return f"{key} is not a string"
    shared = data.get("cables")
    if shared is not None and not (
        isinstance(shared, dict)
        and isinstance(shared.get("dir"), str)
        and os.path.isabs(shared["dir"])
        and _int(shared.get("host"))
    ):
        return "cables is not the shared cables' directory and this host's index"
    return _check_machine(data.get("machine", {}))


def _check_machine(m: Any) -> str | None:
    """What is wrong with a system's ``machine`` (NUMA, hugepages, IOMMU, firmware per chip)."""
    if not isinstance(m, dict):
        return "machine is not an object"
    if "numa_nodes" in m and not (_int(m["numa_nodes"]) and 1 <= m["numa_nodes"] <= 1024):
        return "machine.numa_nodes is not a count of NUMA nodes"
    pages = m.get("hugepages", {})
    if not isinstance(pages, dict) or not all(
        isinstance(k, str) and _DIGITS.fullmatch(k) is not None and _int(v) and 0 <= v < 1 << 20
        for k, v in pages.items()
    ):
        return "machine.hugepages is not NUMA node -> count of pages"
    numa = m.get("numa", {})
    if not isinstance(numa, dict) or not all(_int(v) and -1 <= v < 1024 for v in numa.values()):
        return "machine.numa is not PCI address -> NUMA node"
    if m.get("iommu", "identity") not in (*IOMMU_TYPES, "none"):
        return "machine.iommu is not an IOMMU group type"
    fw = m.get("firmware", {})
    if not isinstance(fw, dict) or not all(
        isinstance(v, dict) and all(isinstance(x, str) and _FW.fullmatch(x) for x in v.values())
        for v in fw.values()
    ):
        return "machine.firmware is not PCI address -> firmware versions"
    hwmon = m.get("hwmon", {})
    if not isinstance(hwmon, dict) or not all(
        isinstance(v, dict)
        and all(
            isinstance(k, str) and HWMON_FILE.fullmatch(k) and isinstance(x, str)
            and HWMON_VALUE.fullmatch(x)
            for k, x in v.items()
        )
        for v in hwmon.values()
    ):  # fmt: skip
        return "machine.hwmon is not PCI address -> hwmon file -> value"
    by_id = m.get("by_id", {})
    if not isinstance(by_id, dict) or not all(
        isinstance(v, list) and all(isinstance(x, str) and BY_ID_NAME.fullmatch(x) for x in v)
        for v in by_id.values()
    ):
        return "machine.by_id is not unique id -> /dev/tenstorrent/by-id names"
    return None


# The hwmon files the simulator writes (Documentation/hwmon/sysfs-interface.rst: the kernel's
# names and one value a line), and what it writes by default: 45 °C, TDP 35 W, VCORE 750 mV.
HWMON_FILE = re.compile(r"name|(temp|power|in|curr)[0-9]{1,3}_(input|label)")
HWMON_VALUE = re.compile(r"[ -~]{0,64}")
# A /dev/tenstorrent/by-id name as ttmesh.host.base reads one (BY_ID_NAME: this file is
# standard library only): printable, never a path.
BY_ID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}")


def hwmon_files(chip: dict[str, Any]) -> dict[str, str]:
    """The hwmon node the simulator writes for a chip without captured values."""
    return {
        "name": chip["arch"].split("_")[0],
        "temp1_input": "45000",
        "power1_input": "35000000",
        "in0_input": "750",
    }


def check_state(state: Any, asics: list[str]) -> str | None:
    """What is wrong with a ``sim/state.json`` for chips ``asics`` (None: the shape is right)."""
    if not isinstance(state, dict):
        return "is not a JSON object"
    if state.get("schema") != STATE_SCHEMA:
        return f"has an unknown state schema {state.get('schema')!r}"[:200]
    config = state.get("config")
    if not isinstance(config, dict) or not all(
        _num(config.get(k)) and config[k] >= 0 for k in DEFAULT_CONFIG
    ):
        return "config is not heartbeat_hz and reset_seconds as numbers"
    chips = state.get("chips")
    if not isinstance(chips, dict):
        return "chips is not an object"
    for asic in asics:
        chip = chips.get(asic)
        if not isinstance(chip, dict):
            return f"has no state for chip {asic}"
        if not (isinstance(chip.get("alive"), bool) and isinstance(chip.get("present"), bool)):
            return f"chips.{asic}: alive and present are not true or false"
        if not (_num(chip.get("hb_base")) and _num(chip.get("hb_t0"))):
            return f"chips.{asic}: hb_base and hb_t0 are not numbers"
        if chip.get("dev") is not None and not (_int(chip["dev"]) and chip["dev"] >= 0):
            return f"chips.{asic}.dev is not a /dev/tenstorrent number"
    if not isinstance(state.get("links_down"), list) or not all(
        isinstance(k, str) for k in state["links_down"]
    ):
        return "links_down is not a list of links"
    faults = state.get("faults")
    if not (
        isinstance(faults, dict)
        and isinstance(faults.get("permanent", []), list)
        and (faults.get("reset_fails") is None or isinstance(faults["reset_fails"], dict))
        and (faults.get("reset_hangs") is None or _num(faults["reset_hangs"]))
    ):
        return "faults is not the faults this module writes"
    mismatch = faults.get("fw_mismatch", {})
    if not (
        isinstance(mismatch, dict)
        and all(isinstance(v, str) and _FW.fullmatch(v) for v in mismatch.values())
    ) or not (
        faults.get("old_kmd") is None
        or (isinstance(faults["old_kmd"], str) and _FW.fullmatch(faults["old_kmd"]))
    ):
        return "faults is not the faults this module writes"
    for key, needs in (("fabric_marks", ("pid", "chips")), ("holders", ("pid", "asic"))):
        entries = state.get(key)
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and _int(e.get("pid")) and all(n in e for n in needs)
            for e in entries
        ):
            return f"{key} is not a list of processes"
    if not isinstance(state.get("resets"), list):
        return "resets is not a list"
    return None


def asic_hex(unique_id: int) -> str:
    return format(int(unique_id), "016x")


# --------------------------------------------------------------------------- processes


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    return int(rest[19])


def _or_gone(start: int | None) -> int:
    """A start time to record for a process; -1 (matches no process) when it is gone."""
    return -1 if start is None else start


def proc_alive(pid: int, start: int | None) -> bool:
    now = proc_start_time(pid)
    return now is not None and (start is None or now == start)


# --------------------------------------------------------------------------- the root


class SimRoot:
    """One simulated host under ``root``; every change goes through :meth:`change`."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self._system: dict[str, Any] | None = None
        self._links: list[tuple[str, int, str, int]] | None = None
        self._remote_links: list[tuple[str, int, str, int]] | None = None
        self._ends: dict[str, list[tuple[int, tuple[str, int, str, int], bool]]] | None = None
        self._seen: tuple[tuple[int, int, int], dict[str, Any]] | None = None
        self._by_asic: dict[str, dict[str, Any]] | None = None
        self._store: Any = None

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    # -- system (static)

    @property
    def system(self) -> dict[str, Any]:
        if self._system is None:
            data = read_json(self.root, SYSTEM_FILE, "system file")
            why = check_system(data)
            if why is not None:
                raise SimCorrupt(self.root, self.path(SYSTEM_FILE), why)
            self._system = data
        return self._system

    def chips(self) -> list[dict[str, Any]]:
        return self.system["chips"]

    def chip_by_asic(self, asic: str) -> dict[str, Any]:
        if self._by_asic is None:  # the system never changes: indexed once
            self._by_asic = {asic_hex(c["unique_id"]): c for c in self.chips()}
        chip = self._by_asic.get(asic)
        if chip is None:
            raise SimError(f"no chip {asic} on this simulated host")
        return chip

    def chip_by_id(self, cid: int) -> dict[str, Any]:
        for chip in self.chips():
            if chip["id"] == cid:
                return chip
        raise SimError(f"no chip {cid} on this simulated host")

    def chip_by_bdf(self, bdf: str) -> dict[str, Any]:
        for chip in self.chips():
            if chip.get("bdf") and chip["bdf"] == bdf.lower():
                return chip
        raise SimError(f"no PCI device {bdf} on this simulated host")

    def board_chips(self, chip: dict[str, Any]) -> list[dict[str, Any]]:
        for board in self.system["boards"]:
            if chip["id"] in board["chips"]:
                return [self.chip_by_id(c) for c in board["chips"]]
        return [chip]

    def links(self) -> list[tuple[str, int, str, int]]:
        """Local links as (asic_a, chan_a, asic_b, chan_b) (the system never changes: kept)."""
        if self._links is None:
            ids = {c["id"]: asic_hex(c["unique_id"]) for c in self.chips()}
            self._links = [(ids[a], ca, ids[b], cb) for a, ca, b, cb in self.system["links"]]
        return list(self._links)

    def remote_links(self) -> list[tuple[str, int, str, int]]:
        if self._remote_links is None:
            ids = {c["id"]: asic_hex(c["unique_id"]) for c in self.chips()}
            self._remote_links = [
                (ids[a], ca, asic_hex(r), cr) for a, ca, r, cr in self.system["remote_links"]
            ]
        return list(self._remote_links)

    def _link_ends(self) -> dict[str, list[tuple[int, tuple[str, int, str, int], bool]]]:
        """Per chip: (its channel, the link, remote?) for every link it is an end of."""
        if self._ends is None:
            ends: dict[str, list[tuple[int, tuple[str, int, str, int], bool]]] = {}
            for remote, found in ((False, self.links()), (True, self.remote_links())):
                for link in found:
                    a, ca, b, cb = link
                    ends.setdefault(a, []).append((ca, link, remote))
                    if b != a or cb != ca:
                        ends.setdefault(b, []).append((cb, link, remote))
            self._ends = ends
        return self._ends

    # -- the cables to other hosts (shared by every host of the system: sim/cables.py)

    def host_index(self) -> int | None:
        """This host's index in its system of several hosts (None: a single host)."""
        host = self.system.get("host")
        return host if _int(host) else None

    def cable_store(self) -> Any:
        """The system's shared cable state (``cables.Store``), or None where the root has
        none (a single host; a host made before the cables were shared, or from a capture:
        its links to remote devices come back with a reset of its own end, as before)."""
        shared = self.system.get("cables")
        if shared is None:
            return None
        if self._store is None:
            owner = os.stat(self.root).st_uid
            self._store = simcables.Store(shared["dir"], owner)
        return self._store

    @contextlib.contextmanager
    def cable_errors(self) -> Iterator[None]:
        """The shared cable state's complaints as the simulated host's (one line, exit 2)."""
        try:
            yield
        except simcables.CableError as exc:
            raise SimError(exc.message, exc.hint) from None

    def cables_now(self) -> dict[str, Any] | None:
        """The shared cable state as it is now (for reading only), or None (no shared state)."""
        store = self.cable_store()
        if store is None:
            return None
        with self.cable_errors():
            return store.state_now()

    def cable_of(self, data: dict[str, Any] | None, asic: str, chan: int) -> dict[str, Any] | None:
        """The shared record of the cable on this host's chip ``asic``, channel ``chan``."""
        if data is None:
            return None
        host = self.host_index()
        for c in data["cables"]:
            for e in c["ends"]:
                if e["host"] == host and e["asic"] == asic and e["chan"] == chan:
                    return c
        return None

    def remote_up(
        self,
        state: dict[str, Any],
        link: tuple[str, int, str, int],
        dead_marks: list[set[str]] | None = None,
        cables: dict[str, Any] | None = None,
    ) -> bool:
        """Whether a link to a remote device (a cable to another host) is up, as this host
        sees it: not taken down by a fault here, not under a fabric mark of a job that died
        here (its Ethernet core is wedged), and, with the shared cable state, up there (both
        ends trained, not bad)."""
        a, ca, _b, _cb = link
        if self.link_key(*link) in state["links_down"]:
            return False
        marks = self.dead_marked_chips(state) if dead_marks is None else dead_marks
        if any(a in m for m in marks):
            self._wedge_lazily(a)
            return False
        if self.cable_store() is None:
            return True
        data = self.cables_now() if cables is None else cables
        cable = self.cable_of(data, a, ca)
        return cable is None or simcables.is_up(cable)

    def _wedge_lazily(self, asic: str) -> None:
        """A job that died with the fabric open here has wedged this chip's cables: say so in
        the shared state, so the other ends' hosts see them down too (as on hardware, where
        the peer's link drops). Best effort, and only once: a reader who may not write the
        state (another user) still sees them down here."""
        store = self.cable_store()
        host = self.host_index()
        if store is None or host is None:
            return
        with contextlib.suppress(OSError, simcables.CableError):
            data = store.state_now()
            if not any(
                simcables.end_of(c, host)[0]["asic"] == asic and c["trained"]
                for c in simcables.of_host(data, host)
            ):
                return
            if not os.access(store.directory, os.W_OK):
                return
            with store.change() as data:
                simcables.wedge(
                    data, host, {asic}, f"a job died with the fabric open on host {host}"
                )

    # -- state

    def read_state(self) -> dict[str, Any]:
        state = read_json(self.root, STATE_FILE, "state file")
        why = check_state(state, [asic_hex(c["unique_id"]) for c in self.chips()])
        if why is not None:
            raise SimCorrupt(self.root, self.path(STATE_FILE), why)
        return state

    def state_now(self) -> dict[str, Any]:
        """The state as it is now, for reading only (never change what this returns): parsed
        again only when the file was replaced. Every change replaces it (a new inode, a new
        modification time), so a heartbeat or holder read costs a stat, not a JSON parse."""
        try:
            st = os.stat(self.path(STATE_FILE))
        except (FileNotFoundError, NotADirectoryError):
            raise SimCorrupt(self.root, self.path(STATE_FILE), "is missing") from None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._seen is None or self._seen[0] != key:
            self._seen = (key, self.read_state())
        return self._seen[1]

    def _state_dir(self) -> int:
        """An ``O_PATH`` descriptor of the root's ``sim/``, reached without following a link
        there (whoever owns the root could plant one to make another user write elsewhere),
        owned by this user, root or the root's owner. Every change is made relative to it."""
        root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            owner = os.fstat(root_fd).st_uid
            try:
                fd = os.open("sim", os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
            except FileNotFoundError:
                raise SimError(f"{self.path('sim')} is missing: not a simulated host") from None
        finally:
            os.close(root_fd)
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid(), owner):
            os.close(fd)
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            if stat.S_ISDIR(st.st_mode):
                what = f"a directory of another user's (uid {st.st_uid})"
            raise SimError(
                f"{self.path('sim')} is {what}: refusing to change this simulated host "
                "(recreate it with ttmesh sim create --force)"
            )
        return fd

    @contextlib.contextmanager
    def change(self) -> Iterator[dict[str, Any]]:
        """Yield the state under the lock; on a normal exit write it back atomically.

        The lock file is mode 0600, so only the host's owner (and root) can open it: a lock
        anyone else could take would let them stop every change to the host."""
        directory = self._state_dir()
        try:
            lock = self.path(LOCK_FILE)
            try:
                fd = _lock_file(directory, os.fstat(directory).st_uid)
            except _NotAFile as exc:
                raise SimCorrupt(self.root, lock, str(exc)) from None
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                    exc.filename = lock  # whose it is: the command line names the owner
                    raise
                raise SimCorrupt(self.root, lock, f"cannot be opened ({exc.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                state = self.read_state()
                yield state
                self._write_state(state, directory)
            finally:
                os.close(fd)
        finally:
            os.close(directory)

    def _write_state(self, state: dict[str, Any], directory: int | None = None) -> None:
        own = directory is None
        if directory is None:
            directory = self._state_dir()
        # Written under the state lock: a name of this process's own is enough (O_EXCL still).
        tmp = f".state.{os.getpid()}.{next(_tmp_names)}"
        try:
            fd = _create(tmp, 0o644, directory)
            try:
                os.fchmod(fd, 0o644)  # readable by every user, as the driver's files are
                with os.fdopen(fd, "w") as f:
                    # One line: json.dumps encodes in C, json.dump (or any indent) in Python,
                    # ten times slower on a big host's state (``ttmesh sim show`` shows it
                    # readably).
                    f.write(json.dumps(state, sort_keys=True))
                os.replace(tmp, "state.json", src_dir_fd=directory, dst_dir_fd=directory)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=directory)
                raise
        finally:
            if own:
                os.close(directory)

    def make_lock(self) -> None:
        """Create the state lock (when the host is made, so it is its owner's)."""
        directory = self._state_dir()
        try:
            os.close(_lock_file(directory, os.fstat(directory).st_uid))
        finally:
            os.close(directory)

    def default_hz(self) -> float:
        """The heartbeat rate of this host's firmware (its chips' architecture; the slowest
        when it has several)."""
        fallback = DEFAULT_CONFIG["heartbeat_hz"]
        rates = [HEARTBEAT_HZ.get(c.get("arch", ""), fallback) for c in self.chips()]
        return min(rates, default=fallback)

    def initial_state(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        now = time.time()
        chips = {}
        for c in self.chips():
            chips[asic_hex(c["unique_id"])] = {
                "alive": True,
                "hb_base": 1000 + c["id"] * 7919,
                "hb_t0": now,
                "present": True,
                "dev": c.get("dev_index"),
            }
        return {
            "schema": STATE_SCHEMA,
            "config": {**DEFAULT_CONFIG, "heartbeat_hz": self.default_hz(), **(config or {})},
            "chips": chips,
            "links_down": [],
            "faults": {
                "reset_fails": None,
                "reset_renumbers": False,
                "reset_hangs": 0.0,
                "permanent": [],
                "no_hugepages": False,
                "fw_mismatch": {},
                "old_kmd": None,
            },
            "fabric_marks": [],
            "holders": [],
            "resets": [],
        }

    # -- computed views (pure functions of state and the clock)

    @staticmethod
    def heartbeat(state: dict[str, Any], asic: str, now: float | None = None) -> int:
        chip = state["chips"][asic]
        if not chip["alive"]:
            return int(chip["hb_base"])
        now = time.time() if now is None else now
        return int(
            chip["hb_base"] + max(0.0, now - chip["hb_t0"]) * state["config"]["heartbeat_hz"]
        )

    def update_interval_ms(self, state: dict[str, Any], asic: str) -> int | None:
        """The telemetry update interval a chip's firmware reports, in ms (Blackhole's
        ``UPDATE_TELEM_SPEED``: the heartbeat advances once per update); None where the
        firmware reports none (Wormhole) or the chip is gone. A hung chip's telemetry table
        still holds the interval its firmware wrote at boot, as on hardware."""
        chip = state["chips"].get(asic)
        if chip is None or not chip["present"]:
            return None
        if self.chip_by_asic(asic).get("arch") not in REPORTS_INTERVAL:
            return None
        hz = state["config"]["heartbeat_hz"]
        ms = round(1000.0 / hz) if hz > 0 else 0  # 0 Hz (a hand-edited state): no updates
        return ms if 0 < ms <= 60_000 else None

    @staticmethod
    def link_key(a: str, ca: int, b: str, cb: int) -> str:
        ends = sorted([f"{a}:{ca}", f"{b}:{cb}"])
        return f"{ends[0]}-{ends[1]}"

    @staticmethod
    def mark_dead(mark: dict[str, Any]) -> bool:
        """A mark is abandoned when its supervisor says so, or when the process that opened
        the fabric is gone and no live supervisor is there to decide (a clean end clears it)."""
        if mark.get("abandoned"):
            return True
        if proc_alive(mark["pid"], mark.get("start")):
            return False
        sup = mark.get("supervisor")
        return sup is None or not proc_alive(sup, mark.get("supervisor_start"))

    def dead_marked_chips(self, state: dict[str, Any]) -> list[set[str]]:
        """Chip sets of fabric marks whose process died without clearing them."""
        return [set(m["chips"]) for m in state["fabric_marks"] if self.mark_dead(m)]

    def link_up(
        self,
        state: dict[str, Any],
        link: tuple[str, int, str, int],
        dead_marks: list[set[str]] | None = None,
    ) -> bool:
        a, ca, b, cb = link
        if self.link_key(a, ca, b, cb) in state["links_down"]:
            return False
        for asic in (a, b):
            chip = state["chips"].get(asic)
            if chip is not None and (not chip["alive"] or not chip["present"]):
                return False
        marks = self.dead_marked_chips(state) if dead_marks is None else dead_marks
        return not any(a in m and b in m for m in marks)

    def eth_live_status(self, state: dict[str, Any], asic: str) -> int:
        """ETH_LIVE_STATUS: low 16 bits channel heartbeat, high 16 bits link up, per channel."""
        chip = state["chips"][asic]
        if not chip["alive"] or not chip["present"]:
            return 0
        return self.eth_live_statuses(state, [asic])[asic]

    def eth_live_statuses(self, state: dict[str, Any], asics: list[str]) -> dict[str, int]:
        """:meth:`eth_live_status` of several chips (the fabric marks and the shared cable
        state are looked at once)."""
        marks: list[set[str]] | None = None
        cables: dict[str, Any] | None = None
        out = {}
        for asic in asics:
            chip = state["chips"][asic]
            value = 0
            if chip["alive"] and chip["present"]:
                for chan, link, remote in self._link_ends().get(asic, ()):
                    value |= 1 << chan
                    if marks is None:
                        marks = self.dead_marked_chips(state)
                    if remote:
                        if cables is None:
                            cables = self.cables_now() or {}
                        up = self.remote_up(state, link, marks, cables or None)
                    else:
                        up = self.link_up(state, link, marks)
                    if up:
                        value |= 1 << (16 + chan)
            out[asic] = value
        return out

    def holders(self, state: dict[str, Any], asic: str) -> list[int]:
        return sorted(
            {
                h["pid"]
                for h in state["holders"]
                if h["asic"] == asic and proc_alive(h["pid"], h.get("start"))
            }
        )

    def dev_of(self, state: dict[str, Any], asic: str) -> int | None:
        chip = state["chips"][asic]
        return chip["dev"] if chip["present"] else None

    # -- changes

    @staticmethod
    def prune(state: dict[str, Any]) -> None:
        """Forget holders whose process is gone (dead marks stay: they are the fault)."""
        state["holders"] = [h for h in state["holders"] if proc_alive(h["pid"], h.get("start"))]

    def add_holder(self, asics: list[str], pid: int, kind: str = "job") -> None:
        self.add_holders([(asics, pid)], kind)

    def add_holders(self, holders: list[tuple[list[str], int]], kind: str = "job") -> None:
        """Register processes as holding chips (as if they had opened their devices)."""
        with self.change() as state:
            self.prune(state)
            for asics, pid in holders:
                start = proc_start_time(pid)
                for asic in asics:
                    self.chip_by_asic(asic)
                    if start is None:  # gone already: holds nothing (recorded without a start
                        continue  # time, it would match whichever process reuses the PID)
                    state["holders"].append(
                        {"pid": pid, "start": start, "asic": asic, "kind": kind}
                    )

    def remove_holder(self, pid: int) -> None:
        with self.change() as state:
            state["holders"] = [h for h in state["holders"] if h["pid"] != pid]
            self.prune(state)

    def mark_fabric(
        self, asics: list[str], pid: int, owner: str = "", supervisor: int | None = None
    ) -> None:
        """The fabric between ``asics`` is up, opened by process ``pid``.

        With a ``supervisor`` (a ttmesh job), the supervisor decides how the process ended
        (clear_fabric or abandon_fabric); without one, the process's death abandons the mark.
        """
        self.mark_fabric_many([(asics, pid)], owner, supervisor)

    def mark_fabric_many(
        self, marks: list[tuple[list[str], int]], owner: str = "", supervisor: int | None = None
    ) -> None:
        sup_start = proc_start_time(supervisor) if supervisor is not None else None
        with self.change() as state:
            for asics, pid in marks:
                for asic in asics:
                    self.chip_by_asic(asic)
                state["fabric_marks"].append(
                    {
                        "pid": pid,
                        # gone already: -1 never matches, so a reused PID does not revive it
                        "start": _or_gone(proc_start_time(pid)),
                        "chips": sorted(asics),
                        "owner": owner,
                        "supervisor": supervisor,
                        "supervisor_start": sup_start,
                        "abandoned": False,
                    }
                )

    def clear_fabric(self, pid: int, owner: str | None = None) -> None:
        """A clean end: the process closed the fabric it opened."""
        with self.change() as state:
            state["fabric_marks"] = [
                m
                for m in state["fabric_marks"]
                if not (m["pid"] == pid and (owner is None or m.get("owner") == owner))
            ]

    def abandon_fabric(self, pid: int) -> None:
        """An abnormal end: the links between the process's chips are left down, and the
        cables on them (on both sides: the shared cable state says so)."""
        with self.change() as state:
            chips: set[str] = set()
            for m in state["fabric_marks"]:
                if m["pid"] == pid:
                    m["abandoned"] = True
                    chips |= set(m["chips"])
            store, host = self.cable_store(), self.host_index()
            if chips and store is not None and host is not None:
                with self.cable_errors(), store.change() as shared:
                    simcables.wedge(
                        shared, host, chips, f"a job died with the fabric open on host {host}"
                    )

    # -- the reset a tt-smi -r performs

    def reset(self, asics: list[str], log: Any = None, command: str = "-r") -> dict[str, Any]:
        """Reset the PCI devices ``asics`` (with the remote chips behind them); ``command``:
        tt-smi's flag that did it (``-r``, or ``-glx_reset`` for a Galaxy's whole host), kept in
        the reset's record so a test tells a whole-host reset from one of some chips.

        Returns a record of what happened. Like real hardware: a link comes back only when the
        chips at both ends were reset together; resetting one end leaves it down.
        """
        with self.change() as state:
            config = state["config"]
            faults = state["faults"]
            delay = float(config.get("reset_seconds", 0.0)) + float(faults.get("reset_hangs") or 0)
        if delay > 0:
            time.sleep(delay)
        with self.change() as state:
            faults = state["faults"]
            targets: list[str] = []
            for asic in asics:
                # A PCI device's reset takes the remote chips behind it (an n300's right chip).
                lead = self.chip_by_asic(asic)
                for chip in self.board_chips(lead):
                    if chip is not lead and chip.get("bdf"):
                        continue
                    h = asic_hex(chip["unique_id"])
                    if h not in targets:
                        targets.append(h)
            record: dict[str, Any] = {
                "t": time.time(), "targets": targets, "effective": True, "command": command,
            }  # fmt: skip
            failing = faults.get("reset_fails")
            if failing is not None:
                times = failing.get("times")
                if times is None or times > 0:
                    record["effective"] = False
                    if times is not None:
                        failing["times"] = times - 1
                        if failing["times"] <= 0:
                            faults["reset_fails"] = None
                    state["resets"].append(record)
                    return record
            now = time.time()
            reset_set = set(targets)
            for asic in targets:
                chip = state["chips"][asic]
                if asic in faults.get("permanent", []):
                    chip["alive"] = False
                    chip["present"] = False
                    continue
                chip["present"] = True
                if not chip["alive"]:
                    chip["alive"] = True
                    chip["hb_t0"] = now
            # Links: both ends reset -> trained again; one end only -> the other fails to train.
            down = set(state["links_down"])
            for a, ca, b, cb in self.links():
                key = self.link_key(a, ca, b, cb)
                if a in reset_set and b in reset_set:
                    down.discard(key)
                elif a in reset_set or b in reset_set:
                    down.add(key)
            # Cables to other hosts: this end is reset. With the shared cable state the cable
            # trains only if the other host resets its end too, within the window (cables.py);
            # without one (an older root, a capture), this end alone brings it back.
            store = self.cable_store()
            wedged: set[str] = set()
            for a, ca, b, cb in self.remote_links():
                if a in reset_set:
                    down.discard(self.link_key(a, ca, b, cb))
            # Marks of the reset chips are gone; links between chips not reset stay down.
            marks = []
            for m in state["fabric_marks"]:
                if self.mark_dead(m):
                    for a, ca, b, cb in self.links():
                        if (
                            a in m["chips"]
                            and b in m["chips"]
                            and ((a in reset_set) != (b in reset_set))
                        ):
                            down.add(self.link_key(a, ca, b, cb))
                    wedged |= {c for c in m["chips"] if c not in reset_set}
                rest = [c for c in m["chips"] if c not in reset_set]
                if len(rest) >= 2:
                    marks.append({**m, "chips": rest})
            state["fabric_marks"] = marks
            state["links_down"] = sorted(down)
            host = self.host_index()
            if store is not None and host is not None:
                # Under the state lock, then the cables' (always in this order: no deadlock).
                with self.cable_errors(), store.change() as shared:
                    record["cable_ends"] = simcables.reset_ends(shared, host, reset_set, now)
                    if wedged:
                        simcables.wedge(
                            shared, host, wedged, f"a job died with the fabric open on host {host}"
                        )
            if faults.get("reset_renumbers"):
                faults["reset_renumbers"] = False
                self._renumber(state, targets)
                record["renumbered"] = True
            state["resets"].append(record)
            self.render(state)
            return record

    def _renumber(self, state: dict[str, Any], targets: list[str]) -> None:
        pci = [
            a
            for a in targets
            if state["chips"][a]["present"] and state["chips"][a]["dev"] is not None
        ]
        numbers = [state["chips"][a]["dev"] for a in pci]
        if len(pci) >= 2:
            rotated = numbers[1:] + numbers[:1]
        else:
            top = max(
                (c["dev"] for c in state["chips"].values() if c["dev"] is not None), default=-1
            )
            rotated = [top + 1 + i for i in range(len(pci))]
        for asic, n in zip(pci, rotated, strict=True):
            state["chips"][asic]["dev"] = n

    # -- the file tree

    def render(self, state: dict[str, Any]) -> None:
        """(Re)write the parts of the tree that depend on device numbers and presence.

        Each directory is written whole beside its place (``NAME.new``) and then exchanged with
        it in one step (renameat2 RENAME_EXCHANGE): a reader (another job's ttmesh, tt-smi,
        tt-umd) sees the old tree or the new one, never a chip missing because another chip is
        being reset, as on a real host, where the driver re-enumerates only the reset devices.
        """
        tops = {rel: self.path(rel) for rel in RENDERED}
        staged = {rel: f"{path}.new" for rel, path in tops.items()}
        for path in staged.values():
            _clear(path)
            os.makedirs(path)
        os.makedirs(os.path.join(staged["dev/tenstorrent"], "by-id"))

        def at(rel: str) -> str:  # where ``rel`` is written: its directory's staged copy
            top = next(t for t in RENDERED if rel.startswith(f"{t}/"))
            return staged[top] + rel[len(top) :]

        swaps: list[tuple[str, str]] = []  # (staged, its place), the chips' own directories first
        for chip in self.chips():
            bdf = chip.get("bdf")
            if not bdf:
                continue
            asic = asic_hex(chip["unique_id"])
            pci_dir = self.path(f"sys/devices/pci0000:00/{bdf}")
            for name in ("tenstorrent", "hwmon"):
                _clear(os.path.join(pci_dir, f"{name}.new"))
                swaps.append((os.path.join(pci_dir, f"{name}.new"), os.path.join(pci_dir, name)))
            n = self.dev_of(state, asic)
            if n is None:
                continue
            # The hwmon node tt-kmd registers on the PCI device, in the kernel's units
            # (Documentation/hwmon/sysfs-interface.rst: m°C, µW, mV); the values the
            # simulated tt-smi reports (45 °C, TDP 35 W, VCORE 750 mV), or a capture's
            # (machine.hwmon: a host recreated by sim create --from-capture).
            captured = self.machine().get("hwmon", {})
            files = captured[bdf] if bdf in captured else hwmon_files(chip)
            hwmon = os.path.join(pci_dir, "hwmon.new", f"hwmon{n}")
            if files:  # {}: a driver without hwmon (tt-kmd before 1.29)
                os.makedirs(hwmon)
            for name, value in files.items():
                _write(os.path.join(hwmon, name), value + "\n")
            node = os.path.join(pci_dir, "tenstorrent.new", f"tenstorrent!{n}")
            os.makedirs(node)
            attrs = {
                "tt_card_type": chip["card_type"],
                "tt_serial": format(chip["board_id"], "016x"),
                "tt_asic_id": asic,
                "tt_heartbeat": str(self.heartbeat(state, asic)),
                **self.firmware(state, chip),
                "tt_aiclk": "1350" if chip["arch"] == "blackhole" else "1000",
                "tt_therm_trip_count": "0",
                "dev": f"240:{n}",
            }
            for name, value in attrs.items():
                _write(os.path.join(node, name), value + "\n")
            # As sysfs writes it (fs/kernfs/symlink.c, kernfs_get_target_path): up to the first
            # directory holding the target's parent, then down to the target by name.
            os.symlink(f"../../../{bdf}", os.path.join(node, "device"))
            os.symlink(
                f"../../devices/pci0000:00/{bdf}/tenstorrent/tenstorrent!{n}",
                at(f"sys/class/tenstorrent/tenstorrent!{n}"),
            )
            _write(at(f"dev/tenstorrent/{n}"), "")
            # tt-kmd's udev rule (udev-50-tenstorrent.rules: KERNEL=="tenstorrent*",
            # MODE="0666"): every local user may open every chip (../shared/reference).
            os.chmod(at(f"dev/tenstorrent/{n}"), 0o666)
            # tt-kmd's udev rules (udev-50-tenstorrent.rules): SYMLINK+="tenstorrent/by-id/
            # <wormhole|blackhole>-%s{tt_asic_id}", a link relative to the node; the driver
            # prints tt_asic_id as %08X%08X (telemetry.c, tt_sysfs_show_u64_hex).
            # A capture's names instead (machine.by_id: none, on a driver without the rules).
            prefix = "blackhole" if chip["arch"] == "blackhole" else "wormhole"
            names = self.machine().get("by_id", {}).get(asic, [f"{prefix}-{asic.upper()}"])
            if "by_id" in self.machine() and asic not in self.machine()["by_id"]:
                names = []
            for name in names:
                with contextlib.suppress(FileExistsError):
                    os.symlink(f"../{n}", at(f"dev/tenstorrent/by-id/{name}"))
            os.makedirs(at(f"proc/driver/tenstorrent/{n}"))
            _write(at(f"proc/driver/tenstorrent/{n}/pids"), "")
        for rel in RENDERED:
            swaps.append((staged[rel], tops[rel]))
        for new, place in swaps:
            _put_in_place(new, place)
        self._rewrite_mmio(state)
        self.render_system(state)

    # -- the machine around the chips (docs/simulator.md, "System files")

    def machine(self) -> dict[str, Any]:
        m = self.system.get("machine")
        return m if isinstance(m, dict) else {}

    def firmware(self, state: dict[str, Any], chip: dict[str, Any]) -> dict[str, str]:
        """tt-kmd's firmware attributes of one chip (docs/sysfs-attributes.md): the bundle on
        every chip, ARC and Ethernet firmware on Wormhole only; ``A.B.C.D`` each (Ethernet:
        ``A.B.C``, its own packing in tt_sysfs_show_u32_ver)."""
        asic = asic_hex(chip["unique_id"])
        per = self.machine().get("firmware", {}).get(chip.get("bdf") or "", {})
        bundle = per.get("tt_fw_bundle_ver") or self.system.get("fw_bundle_version", "19.10.0.0")
        out = {"tt_fw_bundle_ver": bundle}
        if chip["arch"] == "wormhole_b0":
            out["tt_arc_fw_ver"] = per.get("tt_arc_fw_ver", "2.33.0.0")
            out["tt_eth_fw_ver"] = per.get("tt_eth_fw_ver", "7.0.0")
        for name, value in per.items():
            if name not in out and name.startswith("tt_"):
                out[name] = value
        mismatch = state.get("faults", {}).get("fw_mismatch")
        if isinstance(mismatch, dict) and asic in mismatch:
            out["tt_fw_bundle_ver"] = str(mismatch[asic])
        return out

    def render_system(self, state: dict[str, Any]) -> None:
        """The driver's version, NUMA nodes, 1 GiB hugepages (in all, per node, and in
        /proc/meminfo as hugetlbpage.rst shows them), each PCI device's numa_node and IOMMU
        group, as the kernel shows them; the faults no-hugepages and old-kmd change them."""
        faults = state.get("faults", {})
        machine = self.machine()
        version = faults.get("old_kmd") or self.system.get("driver_version", "2.10.0")
        _write(self.path("sys/module/tenstorrent/version"), f"{version}\n")
        pci = [c for c in self.chips() if c.get("bdf")]
        nodes = int(machine.get("numa_nodes", 1))
        numa = machine.get("numa", {})
        node_of = {c["bdf"]: int(numa.get(c["bdf"], 0 if nodes > 1 else -1)) for c in pci}
        pages = machine.get("hugepages")
        if pages is None:  # hugepages-setup.sh: 4 per device, on the device's node
            per: dict[int, int] = {}
            for bdf in node_of:
                n = max(node_of[bdf], 0)
                per[n] = per.get(n, 0) + 4
        else:
            per = {int(k): int(v) for k, v in pages.items()}
        if faults.get("no_hugepages"):
            per = dict.fromkeys(per, 0)
        total = sum(per.values())
        for size in ("hugepages-1048576kB", "hugepages-2048kB"):
            count = total if size.startswith("hugepages-1048576") else 0
            base = f"sys/kernel/mm/hugepages/{size}"
            for name, value in (
                ("nr_hugepages", count),
                ("free_hugepages", count),
                ("resv_hugepages", 0),
                ("surplus_hugepages", 0),
                ("nr_overcommit_hugepages", 0),
            ):
                _write(self.path(f"{base}/{name}"), f"{value}\n")
        shutil.rmtree(self.path("sys/devices/system/node"), ignore_errors=True)
        for n in range(max(nodes, 1)):
            for size in ("hugepages-1048576kB", "hugepages-2048kB"):
                count = per.get(n, 0) if size.startswith("hugepages-1048576") else 0
                base = f"sys/devices/system/node/node{n}/hugepages/{size}"
                for name in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                    _write(self.path(f"{base}/{name}"), f"{0 if 'surplus' in name else count}\n")
        _write(
            self.path("sys/devices/system/node/online"),
            ("0" if nodes <= 1 else f"0-{nodes - 1}") + "\n",
        )
        mem_kb = 128 * 1024 * 1024
        meminfo = [
            ("MemTotal", mem_kb),
            ("MemFree", mem_kb - total * 1048576),
            ("MemAvailable", mem_kb - total * 1048576),
            ("HugePages_Total", 0),  # the default size's (2 MiB): hugetlbpage.rst
            ("HugePages_Free", 0),
            ("HugePages_Rsvd", 0),
            ("HugePages_Surp", 0),
            ("Hugepagesize", 2048),
            ("Hugetlb", total * 1048576),  # every size's, in kB
        ]
        _write(
            self.path("proc/meminfo"),
            "".join(
                f"{k + ':':<16}{v:>8}" + ("" if k.startswith("HugePages_") else " kB") + "\n"
                for k, v in meminfo
            ),
        )
        iommu = str(machine.get("iommu", "identity"))
        shutil.rmtree(self.path("sys/kernel/iommu_groups"), ignore_errors=True)
        for i, chip in enumerate(pci):
            pci_dir = self.path(f"sys/devices/pci0000:00/{chip['bdf']}")
            os.makedirs(pci_dir, exist_ok=True)
            _write(os.path.join(pci_dir, "numa_node"), f"{node_of[chip['bdf']]}\n")
            link = os.path.join(pci_dir, "iommu_group")
            if os.path.islink(link):
                os.unlink(link)
            if iommu != "none":
                _write(self.path(f"sys/kernel/iommu_groups/{i}/type"), f"{iommu}\n")
                os.symlink(f"../../../kernel/iommu_groups/{i}", link)

    def _rewrite_mmio(self, state: dict[str, Any]) -> None:
        """Keep chips_with_mmio of the cluster descriptor in step with device numbers."""
        path = self.path("cluster_descriptor.yaml")
        try:
            real = os.path.realpath(self.root)
            lines = fileread.read_text(path, MAX_DESCRIPTOR, "cluster descriptor", real).split("\n")
        except FileNotFoundError:
            return
        except fileread.Refused as exc:
            raise SimCorrupt(self.root, path, exc.why) from None
        try:
            start = lines.index("chips_with_mmio:") + 1
        except ValueError:
            return
        end = start
        while end < len(lines) and lines[end].startswith("  "):
            end += 1
        block = []
        for chip in sorted(self.chips(), key=lambda c: c["id"]):
            dev = state["chips"][asic_hex(chip["unique_id"])]["dev"]
            if chip.get("bdf") and dev is not None:
                block.append(f"  - {chip['id']}: {dev}")
        lines[start:end] = block or ["  []"]
        _write(path, "\n".join(lines))

    def write_static(self) -> None:
        """The parts of the tree that never change: driver module, PCI devices."""
        _write(
            self.path("sys/module/tenstorrent/version"),
            self.system.get("driver_version", "2.10.0") + "\n",
        )
        os.makedirs(self.path("sys/bus/pci/devices"), exist_ok=True)
        for chip in self.chips():
            bdf = chip.get("bdf")
            if not bdf:
                continue
            pci_dir = self.path(f"sys/devices/pci0000:00/{bdf}")
            os.makedirs(pci_dir, exist_ok=True)
            attrs = {
                "vendor": f"0x{VENDOR_ID:04x}",
                "device": f"0x{PCI_DEVICE[chip['arch']]:04x}",
                "subsystem_vendor": f"0x{VENDOR_ID:04x}",
                # The board id's product code, which is also what the PCI subsystem id carries.
                "subsystem_device": f"0x{(chip['board_id'] >> 36) & 0xFFFFF:04x}",
                "class": "0x120000",
                "current_link_speed": LINK_SPEED[chip["arch"]],
                "max_link_speed": LINK_SPEED[chip["arch"]],
                "current_link_width": "16",
                "max_link_width": "16",
                # Its NUMA node, as the kernel gives it (-1 without NUMA): what torchrun's
                # --numa-binding node binds a rank to (one node, below, unless a system says).
                "numa_node": str(chip.get("numa_node", 0)),
            }
            for name, value in attrs.items():
                _write(os.path.join(pci_dir, name), value + "\n")
            link = self.path(f"sys/bus/pci/devices/{bdf}")
            if not os.path.islink(link):
                os.symlink(f"../../../devices/pci0000:00/{bdf}", link)
        # The NUMA nodes' CPUs are this machine's (a rank bound to them must be able to run).
        nodes = {int(c.get("numa_node", 0)) for c in self.chips() if c.get("bdf")} - {-1}
        cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        for node in sorted(nodes):
            node_dir = self.path(f"sys/devices/system/node/node{node}")
            os.makedirs(node_dir, exist_ok=True)
            _write(os.path.join(node_dir, "cpulist"), cpus + "\n")


def _create(path: str, mode: int, dir_fd: int | None = None) -> int:
    """A new file ``path`` (O_EXCL); one with that name is left by a killed process that had
    this PID (two processes never share one), so it is replaced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, mode, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(path, dir_fd=dir_fd)
        return os.open(path, flags, mode, dir_fd=dir_fd)


class _NotAFile(Exception):
    """Something that is no file stands where one of the root's files should be."""


def _lock_file(directory: int, owner: int) -> int:
    """``state.lock`` in ``sim/`` (``directory``), opened without following a link; made mode
    0600 for the directory's owner (root changing another's host makes it theirs)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open("state.lock", flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=directory)
        if owner != os.geteuid():
            with contextlib.suppress(OSError):
                os.fchown(fd, owner, -1)
    except FileExistsError:
        fd = os.open("state.lock", flags, dir_fd=directory)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _NotAFile("is not a regular file")
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.fchmod(fd, 0o600)  # made by an older ttmesh: mode 0644 let anyone hold it
    return fd


RENDERED = ("sys/class/tenstorrent", "dev/tenstorrent", "proc/driver/tenstorrent")
RENAME_EXCHANGE = 2  # renameat2(2): swap two existing names atomically
AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    """libc's renameat2, looked up once (a rewrite swaps two directories a chip); None when
    this libc has none."""
    import ctypes

    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def _exchange(a: str, b: str) -> bool:
    """Swap ``a`` and ``b`` in one step; False where the system cannot (no renameat2, or a
    file system without RENAME_EXCHANGE)."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def _clear(path: str) -> None:
    """Nothing at ``path``: a link left there is removed, never followed."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _put_in_place(new: str, place: str) -> None:
    """The directory ``new`` takes ``place``'s name (none written: ``place`` goes), in one
    step where the system can swap them; the old tree is removed after."""
    if not os.path.isdir(new):
        _clear(place)
        return
    if os.path.isdir(place) and not os.path.islink(place) and _exchange(new, place):
        shutil.rmtree(new, ignore_errors=True)  # (the old tree, now under the staged name)
        return
    _clear(place)
    os.rename(new, place)


def _write(path: str, text: str) -> None:
    """Write a file of the tree; never through a link, never blocking on a FIFO put in its
    place, never into anything but a regular file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise
        raise SimCorrupt(_root_of(path), path, "is not a regular file") from None
    with os.fdopen(fd, "w") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SimCorrupt(_root_of(path), path, "is not a regular file")
        os.ftruncate(fd, 0)
        f.write(text)


def _root_of(path: str) -> str:
    """The simulated root ``path`` is in (the nearest directory above it with the marker)."""
    current = os.path.dirname(os.path.abspath(path))
    while not os.path.isfile(os.path.join(current, MARKER)):
        parent = os.path.dirname(current)
        if parent == current:
            return os.path.dirname(os.path.abspath(path))
        current = parent
    return current
