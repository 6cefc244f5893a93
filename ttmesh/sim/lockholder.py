"""The simulator's stand-in for a tt-umd process that holds one of a chip's locks.

``python -m ttmesh.sim.lockholder PATH held|dead TAG``: creates (or opens) the lock file as
tt-umd's ``RobustMutex::open_shm_file`` does (mode 0666), sizes and maps it, and writes the
wrapper's fields as ``RobustMutex::record_acquisition`` does (the ``initialized`` flag, owner
TID and PID at the end; the robust futex word at offset 0 holds the owner's TID). It says
``ok`` on stdout once written, then holds the lock (sleeps, the mapping kept) or, ``dead``,
exits holding it, as a killed tt-umd process would (and marks the lock word as the
kernel then does: bit 30, FUTEX_OWNER_DIED). TAG marks it for ``sim clear``.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import sys
import time

from ttmesh.fabric.umdlocks import INITIALIZED, SIZES


def _refuse(why: str) -> int:
    sys.stdout.write(f"refused: {why}\n")
    sys.stdout.flush()
    return 1


def main(argv: list[str]) -> int:
    path, how = argv[0], argv[1]
    size = SIZES[0]
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        try:
            fd = os.open(path, flags)
        except OSError as e:
            return _refuse(f"{path} cannot be opened ({e.strerror})")
        st = os.fstat(fd)
        # Never write a file another user could have put there (a hard link to theirs or
        # to a system file): only a plain one of this user's, one name, tt-umd's size or empty.
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
            return _refuse(f"{path} exists and is not a plain file of yours alone")
        if st.st_size not in (0, size):
            return _refuse(f"{path} exists and is {st.st_size} bytes, not tt-umd's {size}")
    os.fchmod(fd, 0o666)
    os.ftruncate(fd, size)
    mem = mmap.mmap(fd, size)
    os.close(fd)  # as tt-umd: the mapping stays, the descriptor goes
    me = os.getpid()
    struct.pack_into("<i", mem, 0, me)
    struct.pack_into("<Qii", mem, size - 16, INITIALIZED, me, me)
    sys.stdout.write("ok\n")
    sys.stdout.flush()
    if how == "dead":  # what the kernel does to a robust lock whose owner exits holding it
        struct.pack_into("<I", mem, 0, me | 0x40000000)
        os._exit(0)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
