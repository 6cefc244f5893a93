"""Exclusive chip leases: one ``flock``-held file per chip, for the life of a job.

Leases belong to the host, so they live where the host says (``Host.lease_dir``: under its
root, ``/run/lock/ttmesh`` on this machine, shared by every user). A lease IS the lock: the kernel drops it when
its holder dies, so no stale lease survives. The file's contents (job id, PID, command) only
help name the holder; when they can't be read, ``/proc/locks`` still names the PID.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ttmesh import procs
from ttmesh.errors import bad_input, from_os_error, refused
from ttmesh.vocab import ChipProcess, Role


class LeaseHost(Protocol):
    """What leases need from a host: where its lease files live."""

    def lease_dir(self, create: bool = False) -> Path: ...


@dataclass
class LeaseSet:
    """Leases a job holds; release() (or process death) frees them."""

    job: str
    directory: Path
    fds: dict[str, int] = field(default_factory=dict)

    def release(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

    def __enter__(self) -> LeaseSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _open(path: Path, create: bool) -> int | None:
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_RDWR | (os.O_CREAT if create else 0), 0o666)
    except FileNotFoundError:
        return None
    except PermissionError as denied:
        # Another user's lock file: a read-only descriptor is enough to flock it.
        try:
            return os.open(path, flags | os.O_RDONLY)
        except FileNotFoundError:
            if create:  # the directory itself is closed to us: no lease can be taken here
                raise from_os_error(denied, "lease chips in")
            return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise bad_input(
                f"{path} is a symbolic link", "remove it; lease files must be plain files"
            )
        raise


def _holder(path: Path, fd: int | None, asic: str) -> ChipProcess:
    """Who holds a chip's lease: the file names the job; /proc/locks, the locking PID."""
    data: dict = {}
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text() or "{}")
    pid = data.get("pid")
    if fd is not None:
        locked_by = _lock_pid(os.fstat(fd).st_ino)
        if locked_by is not None and locked_by != pid:
            pid, data = locked_by, {}
    cmd = data.get("cmd") or (procs.command_line(pid) if pid else None)
    return ChipProcess(
        pid,
        cmd=procs.one_line(cmd or "") or "?",
        job=data.get("job"),
        asic=asic,
        role=Role.LEASE,
        symmetric_dram_mb=data.get("symmetric_dram_mb"),
    )


def _lock_pid(inode: int) -> int | None:
    """The PID /proc/locks names for a FLOCK on ``inode``."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].split(":")[-1] == str(inode):
            with contextlib.suppress(ValueError):
                return int(parts[4])
    return None


def probe(host: LeaseHost, asics: list[str]) -> dict[str, ChipProcess]:
    """Which of ``asics`` are leased right now, and by whom."""
    directory = host.lease_dir()
    found: dict[str, ChipProcess] = {}
    if not directory.is_dir():
        return found
    for asic in asics:
        path = directory / f"{asic}.lock"
        fd = _open(path, create=False)
        if fd is None:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                found[asic] = _holder(path, fd, asic)
        finally:
            os.close(fd)
    return found


def acquire(
    host: LeaseHost,
    asics: list[str],
    job: str,
    *,
    cmd: str,
    symmetric_dram_mb: int | None = None,
    labels: dict[str, str] | None = None,
) -> LeaseSet:
    """Lease every chip of ``asics`` or none: a chip leased by another job refuses at once."""
    directory = host.lease_dir(create=True)
    leases = LeaseSet(job, directory)
    info = json.dumps(
        {"job": job, "pid": os.getpid(), "cmd": cmd, "symmetric_dram_mb": symmetric_dram_mb}
    )
    try:
        for asic in sorted(asics):
            path = directory / f"{asic}.lock"
            fd = _open(path, create=True)
            assert fd is not None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(path, fd, asic)
                os.close(fd)
                name = (labels or {}).get(asic, asic)
                who = f"job {holder.job}" if holder.job else "another job"
                pid = f" (pid {holder.pid}: {holder.cmd})" if holder.pid else ""
                raise refused(
                    f"chip {name} is leased by {who}{pid}",
                    "wait for it, pick other chips with --chips/--exclude, or see ttmesh ps",
                )
            leases.fds[asic] = fd
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, info.encode(), 0)
    except BaseException:
        leases.release()
        raise
    return leases
