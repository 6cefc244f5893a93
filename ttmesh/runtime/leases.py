"""Exclusive chip leases: one ``flock``-held file per chip, for the life of a job.

Leases belong to the host, so they live where the host says (``Host.lease_dir``: under its
root, ``/run/lock/ttmesh`` on this machine), in one directory every user shares. Every user of
ttmesh may be hostile to every other, so (docs/conventions.md, "Leases and job records"):

* the directory is opened once without following a link anyone but root or this user owns, and
  checked (``paths.shared_dir``: a trusted owner, sticky when others may write); everything
  after is done relative to its descriptor;
* a job creates its lease file ``<asic>.lock`` itself (``O_EXCL``, mode 0644), locks it and
  writes a record (:data:`SCHEMA`: job, uid, user, pid and its start time, command). In a
  sticky directory only the file's owner (or root) may remove it, so no other user can delete
  or rewrite a running job's lease. The job removes the file when it ends, still holding the
  lock; a file left by a job that was killed is stale (no lock) and is removed by the next job
  allowed to (its owner, root, the directory's owner);
* a lease is **verified** when the lock is held, the file's owner is the record's uid, and the
  locking process the kernel names (``/proc/locks``) is the record's process (or its job's
  guardian, which finishes the job when the launcher is killed) alive with the recorded start
  time and running as that user. Anything else holding the lock is named from the kernel as a
  lock that is no ttmesh lease; a record nobody verifies is never believed.

``probe`` reads ``/proc/locks`` instead of trying locks (a test lock, even shared, would make a
concurrent launch's exclusive lock fail); it tries one only where the kernel cannot tell.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Protocol

from ttmesh import fileread, procs
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input, refused
from ttmesh.paths import NAME_RE, SharedDir
from ttmesh.vocab import ChipProcess, Role

SCHEMA = "ttmesh.lease/1"
RECORD_MAX = 4096  # bytes of a record read (a record is written well under it)
CMD_MAX = 1024  # characters of the command kept in a record
LINKS_MAX = 64  # peers a record names (a chip has at most 16 Ethernet channels)
TRIES = 8  # rounds of create / lock / remove a stale file before giving up
ASIC_RE = re.compile(r"[0-9a-f]{16}")
WAIT_FIX = "wait for it, pick other chips with --chips/--exclude, or see ttmesh ls"


class LeaseHost(Protocol):
    """What leases need from a host: where its lease files live, checked and open."""

    def lease_dir(self) -> Path: ...

    def open_lease_dir(self, create: bool = False) -> SharedDir | None: ...


# The lease files this process holds locked (a forked guardian inherits them with their
# descriptors): (device, inode) -> the PID that took the lock, as /proc/locks names it. While
# the descriptor is open the inode cannot be reused, so a probe knows these without asking
# the kernel (a job's own pre-flight, on the leases it has just taken).
_HELD: dict[tuple[int, int], int] = {}


@dataclass
class LeaseSet:
    """Leases a job holds; release() (or process death) frees them."""

    job: str
    directory: Path
    fds: dict[str, int] = field(default_factory=dict)
    inodes: dict[str, tuple[int, int]] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)
    dir: SharedDir | None = None
    uses: dict[str, list[str]] | None = None  # chip -> the chips its mesh reaches from it

    def record_of(self, asic: str) -> dict[str, Any]:
        """Chip ``asic``'s record: the job's, and the links its mesh uses from that chip."""
        if self.uses is None:
            return self.record
        return {**self.record, "links": sorted(self.uses.get(asic, []))[:LINKS_MAX]}

    def add_guardian(self, pid: int) -> None:
        """``pid`` (a forked guardian sharing these leases' descriptors) holds them too: named
        in every record, so the leases stay verified as this job's when the launcher dies and
        the guardian finishes the job."""
        start = procs.start_time(pid)
        if start is None or not self.fds:
            return
        self.record = {**self.record, "guardian": {"pid": pid, "start": start}}
        for asic, fd in self.fds.items():
            data = _encode(self.record_of(asic))
            with contextlib.suppress(OSError):
                # Overwrite, then cut: a reader never sees an empty record (the new one is
                # the old one and more), so the lease never looks unverified meanwhile.
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))

    def release(self) -> None:
        """Remove each lease file while still holding its lock (only while the name is still
        that very file), then unlock."""
        d = self.dir
        for asic, fd in self.fds.items():
            if d is not None and d.fd >= 0:
                name = f"{asic}.lock"
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
                    if (st.st_dev, st.st_ino) == self.inodes.get(asic):
                        os.unlink(name, dir_fd=d.fd)
            with contextlib.suppress(OSError):
                os.close(fd)
        for inode in self.inodes.values():
            _HELD.pop(inode, None)
        self.fds.clear()
        self.inodes.clear()
        if d is not None:
            d.close()

    def __enter__(self) -> LeaseSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- the kernel's locks


def _kernel_locks() -> dict[tuple[int, int], list[int]] | None:
    """(device, inode) -> PIDs holding an FLOCK on it, from /proc/locks; None if unreadable.

    A line reads ``1: FLOCK  ADVISORY  WRITE 1234 fe:00:56789 0 EOF`` (device as hex
    major:minor); waiters' lines (``1: -> FLOCK ...``) are skipped. The PID is the process that
    took the lock; in this PID namespace it stays that number after the process exits (0 in a
    namespace that cannot see it)."""
    try:
        with open("/proc/locks", "rb") as f:
            data = f.read(8 << 20)
    except OSError:
        return None
    out: dict[tuple[int, int], list[int]] = {}
    for line in data.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] != b"FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(b":")
            key = (os.makedev(int(major, 16), int(minor, 16)), int(inode))
            out.setdefault(key, []).append(int(parts[4]))
        except ValueError:
            continue
    return out


def _locked(
    dir_fd: int, name: str, st: os.stat_result, locks: dict[tuple[int, int], list[int]] | None
) -> tuple[bool, int | None]:
    """(is the file locked, the PID the kernel names or None when it cannot tell)."""
    if locks is not None:
        pids = locks.get((st.st_dev, st.st_ino))
        if pids:
            return True, pids[0]
        if not any(ino == st.st_ino for _dev, ino in locks):
            return False, None  # the kernel shows no lock on any file with this inode
    # Unreadable /proc/locks, or a file system whose devices it shows otherwise (btrfs,
    # overlayfs): try a shared lock, for a moment.
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return False, None
    try:
        if not _same(os.fstat(fd), st):
            return False, None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False, None
    except BlockingIOError:
        return True, None
    finally:
        os.close(fd)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


# --------------------------------------------------------------------------- who holds a lease


def _read_record(dir_fd: int, name: str, st: os.stat_result) -> dict[str, Any]:
    """The record in lease file ``name`` (still the file ``st``), bounded; {} when unreadable."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return {}
    try:
        here = os.fstat(fd)
        if not _same(here, st) or not stat.S_ISREG(here.st_mode):
            return {}
        data = os.pread(fd, RECORD_MAX + 1, 0)
    except OSError:
        return {}
    finally:
        os.close(fd)
    if len(data) > RECORD_MAX:
        return {}
    with contextlib.suppress(ValueError):  # fileread.TooDeep too: anyone may plant one
        record = fileread.load_json(data)
        if isinstance(record, dict):
            return record
    return {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _claims(record: dict[str, Any], uid: int) -> list[tuple[int, int]]:
    """The (pid, start) the record says hold its lease, when it can be a lease of user
    ``uid`` at all (the schema, a job name, this uid)."""
    job = record.get("job")
    if record.get("schema") != SCHEMA or record.get("uid") != uid:
        return []
    if not isinstance(job, str) or not NAME_RE.fullmatch(job):
        return []
    out = []
    guardian = record.get("guardian")
    for entry in (record, guardian if isinstance(guardian, dict) else {}):
        pid, start = _int(entry.get("pid")), _int(entry.get("start"))
        if pid and start is not None:
            out.append((pid, start))
    return out


def _uses(record: dict[str, Any]) -> tuple[str, ...] | None:
    """The chips the record's job's mesh reaches from its chip (``links``), or None when the
    record does not say or says it in any other shape (then every link counts as used)."""
    value = record.get("links")
    if not isinstance(value, list) or len(value) > LINKS_MAX:
        return None
    if not all(isinstance(v, str) and ASIC_RE.fullmatch(v) for v in value):
        return None
    return tuple(value)


def _live(pid: int, start: int, uid: int) -> bool:
    return procs.alive(pid, start) and procs.uid_of(pid) == uid


def identify(
    dir_fd: int, name: str, st: os.stat_result, kernel_pid: int | None, asic: str
) -> ChipProcess:
    """Who holds the locked lease file ``name`` (``st``): its job when the lease is verified,
    else the locking process as the kernel names it (``Role.LOCK``)."""
    record = _read_record(dir_fd, name, st)
    uid = st.st_uid
    claims = _claims(record, uid)
    holder: tuple[int, int] | None = None
    if claims:
        front = claims[0]
        if kernel_pid in (None, front[0]) and _live(*front, uid):
            holder = front
        elif kernel_pid in (None, 0, front[0]):
            # The launcher that took the lock is gone (the kernel still names its PID): its
            # guardian, forked with the same descriptors, holds the lock while it finishes.
            holder = next((c for c in claims[1:] if _live(*c, uid)), None)
    if holder is not None:
        cmd = record.get("cmd")
        dram = _int(record.get("symmetric_dram_mb"))
        return ChipProcess(
            holder[0],
            user=procs.user_name(uid),
            cmd=procs.one_line(cmd[:CMD_MAX] if isinstance(cmd, str) else "") or "?",
            start=holder[1],
            job=record["job"],
            asic=asic,
            role=Role.LEASE,
            symmetric_dram_mb=dram,
            uid=uid,
            verified=True,
            related=tuple(pid for pid, _start in claims),
            uses=_uses(record),
        )
    if not kernel_pid:
        return ChipProcess(None, asic=asic, role=Role.LOCK)
    user, cmd, start = procs.identity(kernel_pid)
    return ChipProcess(
        kernel_pid,
        user=user,
        cmd=cmd,
        start=start,
        asic=asic,
        role=Role.LOCK,
        uid=procs.uid_of(kernel_pid),
    )


def probe(host: LeaseHost, asics: list[str]) -> dict[str, ChipProcess]:
    """Which of ``asics`` are leased (or their lease files locked) right now, and by whom.

    Takes no lock where the kernel can tell (``/proc/locks``)."""
    directory = host.open_lease_dir(create=False)
    found: dict[str, ChipProcess] = {}
    if directory is None:
        return found
    with directory:
        # Read once a lease file is there: a job's leases are removed when it ends, so free
        # chips have none, and the first read of /proc/locks in a while waits for the
        # kernel's RCU grace period (it takes its lock rwsem for writing): about 10 ms.
        locks: dict[tuple[int, int], list[int]] | None = None
        read = False
        for asic in asics:
            name = f"{asic}.lock"
            try:
                st = os.stat(name, dir_fd=directory.fd, follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue  # not a lease (a link or worse someone left): acquire deals with it
            mine = _HELD.get((st.st_dev, st.st_ino))
            if mine is not None:
                found[asic] = identify(directory.fd, name, st, mine, asic)
                continue
            if not read:
                locks, read = _kernel_locks(), True
            held, pid = _locked(directory.fd, name, st, locks)
            if held:
                found[asic] = identify(directory.fd, name, st, pid, asic)
    return found


# --------------------------------------------------------------------------- taking leases


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def acquire(
    host: LeaseHost,
    asics: list[str],
    job: str,
    *,
    cmd: str,
    symmetric_dram_mb: int | None = None,
    labels: dict[str, str] | None = None,
    uses: dict[str, list[str]] | None = None,
) -> LeaseSet:
    """Lease every chip of ``asics`` or none: a chip leased by another job (or whose lease
    file another process holds) refuses at once (exit 3), naming the holder.

    ``uses``: chip -> the chips the job's mesh reaches from it, kept in each chip's record
    (``links``), so a reset beside the job may leave the links it does not use down."""
    directory = host.open_lease_dir(create=True)
    assert directory is not None
    uid = os.geteuid()
    record = {
        "schema": SCHEMA,
        "job": job,
        "uid": uid,
        "user": procs.user_name(uid),
        "pid": os.getpid(),
        "start": procs.start_time(os.getpid()),
        "cmd": procs.one_line(cmd)[:CMD_MAX],
        "symmetric_dram_mb": symmetric_dram_mb,
    }
    leases = LeaseSet(job, directory.path, record=record, dir=directory, uses=uses)
    try:
        for asic in sorted(asics):
            label = (labels or {}).get(asic, asic)
            data = _encode(leases.record_of(asic))
            fd, st = _take(directory, f"{asic}.lock", asic, label, data)
            leases.fds[asic] = fd
            leases.inodes[asic] = (st.st_dev, st.st_ino)
            _HELD[(st.st_dev, st.st_ino)] = os.getpid()
    except BaseException:
        leases.release()
        raise
    return leases


def _take(
    d: SharedDir, name: str, asic: str, label: str, record: bytes
) -> tuple[int, os.stat_result]:
    """This job's lock on a lease file of its own for chip ``asic``, holding ``record``:
    (descriptor, its stat)."""
    path = d.path / name
    for _ in range(TRIES):
        try:
            fd = os.open(
                name,
                os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o644,
                dir_fd=d.fd,
            )
        except FileExistsError:
            _clear(d, name, asic, label)
            continue
        except OSError as exc:  # closed to this user; no file can be made there (/proc), full
            raise _uncreatable(d, path, exc) from None
        try:
            os.fchmod(fd, 0o644)  # readable by every user (their ttmesh names the holder)
            with contextlib.suppress(OSError):
                os.pwrite(fd, record, 0)  # before the lock: a locked file always names its job
            st = os.fstat(fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # Another job may have taken the name between the create and the lock (it took
            # this file for a stale one, and removed it): then this file is no lease.
            if _still(d, name, st):
                return fd, st
        except BlockingIOError:
            if _still(d, name, st):
                holder = identify(d.fd, name, st, _pid_of(st), asic)
                os.close(fd)
                raise _blocked(label, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise refused(
        f"chip {label}: its lease file {path} keeps changing under this launch",
        "another program is creating and removing it: see ttmesh ls",
    )


def _still(d: SharedDir, name: str, st: os.stat_result) -> bool:
    """Is ``name`` still the file ``st``?"""
    try:
        return _same(os.stat(name, dir_fd=d.fd, follow_symlinks=False), st)
    except OSError:
        return False


def _pid_of(st: os.stat_result) -> int | None:
    locks = _kernel_locks()
    if locks is None:
        return None
    pids = locks.get((st.st_dev, st.st_ino))
    return pids[0] if pids else None


def _blocked(label: str, holder: ChipProcess) -> TTMeshError:
    if holder.role == Role.LEASE:
        return refused(f"chip {label} is leased by {holder.holder}", WAIT_FIX)
    fix = (
        f"that process blocks the chip for every ttmesh job: ask {holder.user} to end it "
        f"(kill {holder.pid}), or pick other chips with --chips/--exclude"
        if holder.pid
        else "pick other chips with --chips/--exclude, or ask root to see who holds it"
    )
    return refused(f"chip {label} is {holder.holder}", fix)


def _uncreatable(d: SharedDir, path: Path, exc: OSError) -> TTMeshError:
    """A lease file the system would not create (the error names no path: the create was
    relative to the directory's descriptor): one line naming both, and what to do."""
    me = os.geteuid()
    closed = exc.errno in (errno.EACCES, errno.EPERM) and not (
        me == 0 or d.mode & 0o002 or (d.uid == me and d.mode & 0o200)
    )
    if closed:  # the directory's mode keeps this user out
        owner = procs.user_name(d.uid)
        why = f"it is {owner}'s (mode {d.mode:04o}) and closed to you"
        who = "root" if d.uid == 0 else f"{owner} or root"
        fix = f"ask {who} to run: chmod 1777 {d.path}"
    else:
        why = {
            errno.ENOSPC: "free space on its file system",
            errno.EDQUOT: "free space on its file system",
            errno.EROFS: "its file system is read-only",
        }.get(exc.errno or 0, "no file can be made there")
        fix = why
    override = os.environ.get("TTMESH_RUNTIME_DIR")
    if override:  # the user chose the directory: choose another
        fix = (
            f"TTMESH_RUNTIME_DIR={override}: set it to a writable directory every user of the "
            "host shares, or unset it"
        )
    elif not closed:
        fix += "; docs/troubleshooting.md, Leases and shared directories"
    return bad_input(
        f"cannot create the lease file {path} in the lease directory {d.path}: "
        f"{exc.strerror or exc}" + (f": {why}" if closed else ""),
        fix,
    )


def _clear(d: SharedDir, name: str, asic: str, label: str) -> None:
    """``name`` exists: refuse if a job (or any process) holds it; remove it if it is stale or
    no lease at all and this user may; else refuse, naming whose it is and who may remove it."""
    try:
        st = os.stat(name, dir_fd=d.fd, follow_symlinks=False)
    except FileNotFoundError:
        return  # released meanwhile: create it again
    owner = procs.user_name(st.st_uid)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        what = "a file with other names (a hard link)" if stat.S_ISREG(st.st_mode) else None
        _remove(d, name, st, label, what or _what(st.st_mode), owner)
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=d.fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return  # replaced by a link meanwhile: looked at again
        if exc.errno in (errno.EACCES, errno.EPERM):
            _remove(
                d, name, st, label, f"a file you cannot read (mode {st.st_mode & 0o777:04o})", owner
            )
            return
        raise
    try:
        here = os.fstat(fd)
        if not _same(here, st):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not _still(d, name, here):
                return  # its job released it meanwhile
            raise _blocked(label, identify(d.fd, name, here, _pid_of(here), asic)) from None
        # Stale: no process holds it (a job killed before it could remove it). Remove it,
        # holding its lock, if it is still this file.
        if _still(d, name, here):
            _remove(d, name, here, label, "a stale lease file (no job holds it)", owner)
    finally:
        os.close(fd)


def _what(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _remove(d: SharedDir, name: str, st: os.stat_result, label: str, what: str, owner: str) -> None:
    try:
        if stat.S_ISDIR(st.st_mode):
            os.rmdir(name, dir_fd=d.fd)
        else:
            os.unlink(name, dir_fd=d.fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        path = d.path / name
        who = "root" if owner == "root" else f"{owner} or root"
        fix = f"{who} can remove it: rm {'-r ' if stat.S_ISDIR(st.st_mode) else ''}{path}"
        if exc.errno in (errno.EPERM, errno.EACCES):
            raise refused(
                f"chip {label}: its lease file {path} is {what}, owned by {owner}", fix
            ) from None
        raise refused(f"chip {label}: cannot remove {path} ({what}): {exc.strerror}", fix) from None
