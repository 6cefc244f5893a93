"""tt-umd's per-chip locks: who holds them, and which a dead process left.

tt-umd serialises access to a chip with robust, process-shared pthread mutexes, each in a
shared-memory file ``/dev/shm/TT_UMD_LOCK.<name>`` (``RobustMutex::SHM_FILE_PREFIX``,
``device/api/umd/device/utils/robust_mutex.hpp``). A chip's lock is named
``<KIND>_<device number>_<device type>`` (``LockManager::acquire_mutex``,
``device/utils/lock_manager.cpp``): the device number is the N of ``/dev/tenstorrent/N``, the
type ``PCIe`` (or ``JTAG``), the kinds ``ARC_MSG``, ``REMOTE_ARC_MSG``, ``NON_MMIO``,
``MEM_BARRIER``, ``CHIP_IN_USE``, ``PCIE_DMA``; system-wide locks (``ARC_MSG``,
``CREATE_ETH_MAP``) have no number. ``LocalChip::start_device`` takes ``CHIP_IN_USE`` and
keeps it until the chip is closed: a second process opening the chip waits on it without
bound (and, tt-umd#2336, without heeding Ctrl-C).

The file is ``pthread_mutex_wrapper`` (robust_mutex.hpp): the ``pthread_mutex_t``, then a
``uint64_t initialized`` equal to ``0x5454554d444d5458`` ("TTUMDMTX", robust_mutex.cpp), then
``pid_t owner_tid`` and ``pid_t owner_pid``, which tt-umd sets on every acquisition and clears
on unlock. The mutex's size depends on the C library's architecture (40 bytes on x86-64, 48 on
aarch64), so the three fields are read from the end: the file is 56 or 64 bytes. A holder
closes its descriptor after mapping the file (``RobustMutex::initialize``), so it shows in
``/proc/PID/maps``, not ``/proc/PID/fd``. The mutex's first word is glibc's ``__lock``, the
robust futex's lock word: the owner's TID in its lower 30 bits, bit 30 (``FUTEX_OWNER_DIED``)
set by the kernel when the owner exits holding it (the kernel's
``Documentation/locking/robust-futex-ABI.rst``). A word of 0 is an unlocked mutex, whatever the
owner fields say (tt-umd clears them just before unlocking).

Files outlive the processes (tt-umd#691, #736): tt-umd recovers a dead owner's lock itself
(``EOWNERDEAD`` then ``pthread_mutex_consistent``) and "relies on the client not deleting
underlying /dev/shm files" (robust_mutex.hpp), so ttmesh never deletes one: a dead owner's lock
is a note. A process that is alive and maps the file is its live holder: root sees every
process's mappings; a user sees only their own, and then a live owner PID is believed as it is.

Where: ``ROOT/dev/shm``, the host's root joined to ``/dev/shm`` (``/dev/shm`` itself on a real
host; under a simulated root, the simulator's own directory, so its faults never touch the
machine's real locks).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh import numeric, procs
from ttmesh.dataclass import dataclass, field
from ttmesh.fabric.problem import ERROR, Problem, chip_name, kill_fix
from ttmesh.host.base import Host

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ttmesh.fabric.devices import Inventory

PREFIX = "TT_UMD_LOCK."
INITIALIZED = 0x5454554D444D5458  # "TTUMDMTX", tt-umd's INITIALIZED_FLAG
SIZES = (56, 64)  # pthread_mutex_t (40 x86-64, 48 aarch64) + u64 + 2 x pid_t
OLD_SIZES = (48, 56)  # before tt-umd #1539 (2025-11): the mutex and the flag only
KINDS = ("ARC_MSG", "REMOTE_ARC_MSG", "NON_MMIO", "MEM_BARRIER", "CHIP_IN_USE", "PCIE_DMA")
BLOCKING = "CHIP_IN_USE"  # held for a chip's whole open: a launch would wait on it
MAX_FILES = 1024  # lock files judged (7 kinds x 64 chips is ~450)
MAX_SCAN = 1 << 20  # directory entries looked at, at most
MAX_ODD = 4  # notes about files that are not tt-umd's, at most
NAME_RE = re.compile(r"(?P<kind>[A-Z_]+?)_(?P<dev>[0-9]{1,4})_(?P<type>PCIe|JTAG|Undefined)")

OWNER_DIED = 0x40000000  # the kernel's mark on a dead owner's lock word (robust-futex-ABI.rst)
TID_MASK = 0x3FFFFFFF  # the owner's TID, in the lock word's lower 30 bits
HELD, FREE, DEAD, UNREADABLE = "held", "free", "dead-owner", "unreadable"


@dataclass
class Lock:
    """One lock file and what it says."""

    name: str  # after the prefix: CHIP_IN_USE_0_PCIe
    path: str
    kind: str  # CHIP_IN_USE, ...; "" when the name is no chip lock tt-umd makes
    dev: int | None  # /dev/tenstorrent/N
    state: str = UNREADABLE
    owner_pid: int | None = None
    owner_tid: int | None = None
    why: str = ""  # unreadable: what the file is instead
    mappers: list[int] = field(default_factory=list)  # live processes that map it
    holder: tuple[str, str] | None = None  # (user, command) of a live owner
    chips: list[str] = field(default_factory=list)  # the asic ids on its device

    def to_json(self) -> dict[str, Any]:
        return {
            "name": procs.one_line(self.name),
            "path": procs.one_line(self.path),
            "kind": self.kind or None,
            "dev_index": self.dev,
            "asic_ids": self.chips,
            "state": self.state,
            "owner_pid": self.owner_pid,
            "owner_tid": self.owner_tid,
            "owner_alive": self.state == HELD,
            "user": self.holder[0] if self.holder else None,
            "cmd": self.holder[1] if self.holder else None,
            "mapped_by": self.mappers,
            "why": self.why or None,
        }

    @property
    def who(self) -> str:
        user, cmd = self.holder or ("?", "?")
        return f"pid {self.owner_pid} ({user}: {cmd})"


def lock_dir(host: Host) -> Path:
    return host.path("dev/shm")


def _read_one(path: str) -> tuple[tuple[int, int] | None, bytes | None, str]:
    """((dev, inode), the file's bytes, why not): never follows a link, never blocks on a
    FIFO, reads at most 64 bytes of a plain file of one of tt-umd's sizes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, None, "a symbolic link, not tt-umd's file (not followed)"
        return None, None, f"unreadable ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, None, "not a plain file (tt-umd makes plain files)"
        key = (st.st_dev, st.st_ino)
        if st.st_size not in (*OLD_SIZES, *SIZES):
            return key, None, f"{st.st_size} bytes, not tt-umd's 48, 56 or 64"
        data = os.pread(fd, st.st_size, 0)
    except OSError as e:
        return None, None, f"unreadable ({e.strerror})"
    finally:
        os.close(fd)
    if len(data) != st.st_size:
        return key, None, "changed while read"
    return key, data, ""


def raw(path: str) -> bytes | None:
    """The bytes of the lock file ``path`` when it is a plain file of one of tt-umd's sizes
    (read as :func:`read` reads it: no link followed, at most 64 bytes); None otherwise."""
    _, data, _ = _read_one(path)
    return data


def fields(data: bytes) -> dict[str, Any]:
    """What :func:`read` takes from a lock file's bytes: the lock word (its owner-died bit and
    TID), tt-umd's flag and the owner fields (where this layout has them)."""
    (word,) = struct.unpack_from("<I", data, 0)
    out: dict[str, Any] = {
        "lock_word": word,
        "word_owner_died": bool(word & OWNER_DIED),
        "word_tid": word & TID_MASK,
        "flag": None,
        "field_tid": None,
        "field_pid": None,
    }
    if struct.unpack_from("<Q", data, len(data) - 16)[0] == INITIALIZED:
        tid, pid = struct.unpack_from("<ii", data, len(data) - 8)
        out |= {"flag": f"{INITIALIZED:#x}", "field_tid": tid, "field_pid": pid}
    elif struct.unpack_from("<Q", data, len(data) - 8)[0] == INITIALIZED:
        out["flag"] = f"{INITIALIZED:#x}"
    return out


def _thread_group(tid: int, mappers: list[int]) -> int:
    """The process whose thread ``tid`` is: a mapper of the file with that task, else the TID
    itself (a process's first thread has its PID as TID)."""
    for pid in mappers:
        if os.path.exists(f"/proc/{pid}/task/{tid}"):
            return pid
    return tid


def _mappers(keys: set[tuple[int, int]]) -> dict[tuple[int, int], set[int]] | None:
    """Live processes mapping each file (None when this user cannot see everyone's)."""
    out: dict[tuple[int, int], set[int]] = {k: set() for k in keys}
    if not keys:
        return out
    from ttmesh.runtime.leftovers import mapped

    for name in os.listdir("/proc"):
        if not numeric.digits(name):
            continue
        try:
            keys_mapped = mapped(name) & keys
        except (OSError, ValueError):
            continue
        for key in keys_mapped:
            out[key].add(int(name))
    return out


def _known(name: str) -> bool:
    """A name tt-umd gives its locks (a chip's, or a system-wide one)."""
    m = NAME_RE.fullmatch(name)
    return bool(m and m["kind"] in KINDS) or name in ("ARC_MSG", "CREATE_ETH_MAP")


def read(host: Host) -> list[Lock]:
    """Every tt-umd lock file in the host's ``/dev/shm``, each judged (see the module)."""
    base = lock_dir(host)
    names: list[str] = []  # tt-umd's names first: junk never crowds a real lock out
    junk: list[str] = []
    try:
        with os.scandir(base) as it:
            for n, entry in enumerate(it):
                if n >= MAX_SCAN:
                    break
                if not entry.name.startswith(PREFIX):
                    continue
                if _known(entry.name[len(PREFIX) :]) and len(names) < MAX_FILES:
                    names.append(entry.name)
                elif len(junk) < MAX_FILES:
                    junk.append(entry.name)
    except OSError:
        return []
    names += sorted(junk)[: MAX_FILES - len(names)]
    found: list[tuple[Lock, tuple[int, int] | None, bytes | None]] = []
    for fname in names:
        name = fname[len(PREFIX) :]
        m = NAME_RE.fullmatch(name)
        kind = m["kind"] if m and m["kind"] in KINDS else ""
        dev = int(m["dev"]) if kind and m and m["type"] == "PCIe" else None
        lock = Lock(name, str(base / fname), kind, dev)
        key, data, why = _read_one(lock.path)
        lock.why = why
        found.append((lock, key, data))
    keys = {k for _, k, d in found if k is not None and d is not None}
    maps = _mappers(keys)
    root = os.getuid() == 0
    for lock, key, data in found:
        if data is None or key is None:
            continue
        lock.mappers = sorted(maps.get(key, set())) if maps else []
        (word,) = struct.unpack_from("<I", data, 0)  # glibc's __lock: the robust futex word
        if struct.unpack_from("<Q", data, len(data) - 16)[0] == INITIALIZED:
            tid, pid = struct.unpack_from("<ii", data, len(data) - 8)
        elif struct.unpack_from("<Q", data, len(data) - 8)[0] == INITIALIZED:
            # tt-umd before its owner fields (#1539, 2025-11): the futex word names the TID
            tid = word & TID_MASK
            pid = _thread_group(tid, lock.mappers) if tid else 0
        else:
            lock.why = "not initialised by tt-umd (its flag is missing)"
            continue
        lock.owner_pid, lock.owner_tid = (pid if pid > 0 else None), (tid if tid > 0 else None)
        if word & OWNER_DIED:  # the kernel marked it: its owner exited holding it
            lock.state = DEAD
            continue
        if not word & TID_MASK:
            lock.state, lock.owner_pid, lock.owner_tid = FREE, None, None
            continue
        # A recycled PID is no owner: the live owner maps the file (root sees every mapping;
        # another user's process is believed as it is, its mappings are hidden from a user).
        # (PID 1 is another PID namespace's: a container's tt-umd, tt-umd#2097.)
        hidden = not root and pid > 1 and procs.uid_of(pid) not in (None, os.getuid())
        if pid > 0 and procs.alive(pid) and (pid in lock.mappers or hidden):
            user, cmd, _ = procs.identity(pid)
            lock.state, lock.holder = HELD, (user, cmd)
        elif lock.mappers:  # locked, mapped, its owner PID not ours to see: a container's?
            other = lock.mappers[0]
            user, cmd, _ = procs.identity(other)
            lock.state, lock.holder = HELD, (user, cmd)
            lock.why = f"owner pid {pid} is not this PID namespace's; pid {other} maps it"
            lock.owner_pid = other
        else:
            lock.state = DEAD
    return [lock for lock, _, _ in found]


LOCK_FIX = (
    "{kill}, or wait for it to close the chip; never delete {path}: tt-umd relies on its "
    "files staying and recovers a dead owner's lock itself"
)


def problems(
    inv: Inventory,
    asics: Iterable[str] | None,
    allowed: Any = None,
    locks: list[Lock] | None = None,
) -> tuple[list[Problem], list[str], list[Lock]]:
    """(errors, notes, every lock read) for the chips ``asics`` (None: all): an error per chip
    whose ``CHIP_IN_USE`` lock a live process holds, unless ``allowed(pid, asics)`` says it is
    the job's own; a note per lock a dead process left (never deleted) and per file that is not
    tt-umd's."""
    from ttmesh.fabric.holders import describe

    locks = read(inv.host) if locks is None else locks
    wanted = None if asics is None else set(asics)
    by_dev: dict[int, list[str]] = {}
    for c in inv.chips:
        lead = inv.lead(c)
        if (
            lead is not None
            and lead.dev_index is not None
            and (wanted is None or c.asic_id in wanted)
        ):
            by_dev.setdefault(lead.dev_index, []).append(c.asic_id)
    found: list[Problem] = []
    notes: list[str] = []
    odd: list[str] = []
    for lock in locks:
        chips = by_dev.get(lock.dev, []) if lock.dev is not None else []
        lock.chips = chips
        if lock.dev is not None and not chips:
            continue  # another chip's (not selected), or a device this host does not list
        where = f" ({chip_name(inv, chips[0])})" if chips else ""
        if lock.state == UNREADABLE:
            odd.append(f"{procs.one_line(lock.path)} is {lock.why}")
        elif lock.state == DEAD:
            pid = lock.owner_pid
            if pid is None:
                by = "a process that is gone"
            elif procs.alive(pid):
                by = f"pid {pid}, which no longer maps it (another PID namespace's, or reused)"
            else:
                by = f"pid {pid}, which is gone"
            notes.append(
                f"tt-umd lock {procs.one_line(lock.name)}{where} was left locked by {by}: "
                "harmless, tt-umd recovers it when the chip is next opened (do not delete it)"
            )
        elif lock.state == HELD and lock.kind == BLOCKING and chips:
            pid = lock.owner_pid or -1
            if allowed is not None and allowed(pid, chips):
                continue
            h = describe(pid, chips[0])
            found.append(
                Problem(
                    ERROR,
                    f"{chip_name(inv, chips[0])} is in use: tt-umd's lock {lock.name} is held "
                    f"by {h.who}, and a job's ranks would wait on it without end",
                    LOCK_FIX.format(kill=kill_fix(h), path=lock.path),
                    "umd-lock",
                    tuple(chips),
                )
            )
    notes += [f"tt-umd lock {o}: not judged" for o in odd[:MAX_ODD]]
    if len(odd) > MAX_ODD:  # a directory full of junk is a few notes, not thousands
        notes.append(f"{len(odd) - MAX_ODD} more {PREFIX}* files are not tt-umd's: not judged")
    return found, notes, locks
