"""A reset runs: the mark ttmesh's resets leave while tt-smi resets chips, for pollers to pause.

A poller that reads chips while they are reset breaks the reset (tt-smi#172), so ``ttmesh
metrics`` skips every chip read while a reset runs. ttmesh's own resets say so by holding a
shared ``flock`` on ``resetting.lock`` in the host's lease directory (every user's resets, at
once: shared locks do not exclude each other) for as long as they run; the lock goes with the
process, so a killed reset leaves no mark. Readers ask the kernel (``/proc/locks``) and take no
lock themselves.

The file is in a directory every user may write: a mark anyone could plant only ever pauses a
poller (never a job or a reset), and it is never followed through a link nor read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator

from ttmesh.errors import TTMeshError
from ttmesh.runtime.leases import LeaseHost, _kernel_locks

NAME = "resetting.lock"


@contextlib.contextmanager
def marked(host: LeaseHost) -> Iterator[None]:
    """Hold the "a reset runs" mark on ``host`` while the block runs. A mark that cannot be
    made (the lease directory refused, a link in the file's place) does not stop the reset:
    the reset matters more than a poller's pause."""
    fd = None
    try:
        directory = host.open_lease_dir(create=True)
    except (OSError, TTMeshError):
        directory = None
    if directory is not None:
        with directory:
            with contextlib.suppress(OSError):
                fd = os.open(
                    NAME,
                    os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                    0o644,
                    dir_fd=directory.fd,
                )
            if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                fd = None
    try:
        if fd is not None:
            # Never waits: a lock someone else holds exclusively (another user's file, locked
            # to stall resets) marks the host already, and a reset must not hang on it.
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def running(host: LeaseHost) -> bool:
    """Does a reset hold the mark on ``host`` now? (Takes no lock where ``/proc/locks`` tells.)"""
    try:
        directory = host.open_lease_dir(create=False)
    except (OSError, TTMeshError):
        return False
    if directory is None:
        return False
    with directory:
        try:
            st = os.stat(NAME, dir_fd=directory.fd, follow_symlinks=False)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode):
            return False
        locks = _kernel_locks()
        if locks is not None:
            if locks.get((st.st_dev, st.st_ino)):
                return True
            if not any(ino == st.st_ino for _dev, ino in locks):
                return False  # the kernel shows no lock on any file with this inode
        return _try_exclusive(directory.fd, st)


def _try_exclusive(dir_fd: int, st: os.stat_result) -> bool:
    """Where the kernel cannot tell (/proc/locks unreadable, btrfs, overlayfs): an exclusive
    lock, for a moment, fails while any reset holds its shared one."""
    try:
        fd = os.open(
            NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return False
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
