"""Reading back what a job kept of its output (:mod:`ttmesh.runtime.joblogs` writes it):
``ttmesh logs``, ``ttmesh ps JOB``'s last lines, a support bundle's log tails.

Only this user's private runtime directory is read, and in it only regular files of this
user's, each opened relative to its directory's descriptor, never through a link, FIFO or
device. A stream is its head, its tail segments (named by the offset they start at) and its
index of when its bytes were written; what fell between head and tail is a gap, said by the
reader with its size.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.runtime.joblogs import (
    DIR_FLAGS,
    INDEX_ENTRY,
    INDEX_MAX,
    STREAMS,
    _exists,
    job_dir,
    logs_dir,
)


@dataclass
class Extent:
    """Bytes of a stream kept in one file: the stream's ``start`` .. ``start + length``."""

    start: int
    length: int
    name: str


@dataclass
class Piece:
    """Bytes of one stream written by ``when`` (the index's resolution, a second)."""

    when: float
    start: int
    end: int


@dataclass
class StreamFiles:
    """One kept stream, read back: its files, its index, what was cut."""

    dir_fd: int
    name: str
    extents: list[Extent] = field(default_factory=list)
    index: list[tuple[float, int]] = field(default_factory=list)
    mtime: float = 0.0

    @property
    def end(self) -> int:
        return max((e.start + e.length for e in self.extents), default=0)

    def pieces(self, since: int = 0) -> list[Piece]:
        """The stream's bytes from ``since`` in pieces, each with when it was written; what
        was written after the last index entry gets the file's time."""
        out: list[Piece] = []
        last = since
        for when, offset in self.index:
            offset = self._kept_from(offset)  # never split what was cut: it is said once
            if offset > last:
                out.append(Piece(when, last, offset))
                last = offset
        if self.end > last:
            out.append(Piece(self.mtime, last, self.end))
        return out

    def _kept_from(self, offset: int) -> int:
        """``offset``, or where kept bytes resume when nothing was kept there (the cut between
        the head and the tail): a piece boundary inside a cut would say it twice."""
        for e in sorted(self.extents, key=lambda e: e.start):
            if offset < e.start:
                return e.start
            if offset < e.start + e.length:
                return offset
        return offset

    def read(self, start: int, end: int) -> Iterator[tuple[int, bytes | int]]:
        """(offset, bytes) of ``start`` .. ``end`` as kept, and (offset, n) for n bytes not
        kept (cut between the head and the tail, or dropped as the tail moved on)."""
        pos = start
        for e in self.extents:
            lo, hi = max(pos, e.start), min(end, e.start + e.length)
            if hi <= lo:
                continue
            if lo > pos:
                yield pos, lo - pos
            data = _read_range(self.dir_fd, e.name, lo - e.start, hi - lo)
            yield lo, data
            pos = lo + len(data)
            if len(data) < hi - lo:  # the file went (a tail segment rotated meanwhile)
                yield pos, hi - pos
                pos = hi
        if pos < end:
            yield pos, end - pos


def _read_range(dir_fd: int, name: str, offset: int, length: int, close_dir: bool = False) -> bytes:
    """``length`` bytes at ``offset`` of the regular file ``name`` of this user's (never a
    link, a FIFO or a device; b"" when it is none)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd
        )
    except OSError:
        return b""
    finally:
        if close_dir:
            os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return b""
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def open_stream(dir_fd: int, name: str) -> StreamFiles | None:
    """A stream's files in an owner's directory, None when it kept nothing."""
    found = StreamFiles(dir_fd, name)
    try:
        entries = os.listdir(dir_fd)
    except OSError:
        return None
    for entry in entries:
        if entry == f"{name}.log":
            start = 0
        elif entry.startswith(f"{name}.log.") and numeric.digits(entry[len(name) + 5 :]):
            start = int(entry[len(name) + 5 :])
        else:
            continue
        try:
            st = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            continue
        found.extents.append(Extent(start, st.st_size, entry))
        found.mtime = max(found.mtime, st.st_mtime)
    if not found.extents:
        return None
    found.extents.sort(key=lambda e: e.start)
    data = _read_range(dir_fd, f"{name}.idx", 0, INDEX_MAX * 2 * INDEX_ENTRY.size)
    usable = len(data) - len(data) % INDEX_ENTRY.size
    found.index = [INDEX_ENTRY.unpack_from(data, i) for i in range(0, usable, INDEX_ENTRY.size)]
    return found


@dataclass
class Kept:
    """What a job's log directory holds: ``attempts[N][owner][stream]``."""

    path: Path
    fd: int
    attempts: dict[int, dict[str, dict[str, StreamFiles]]]

    def close(self) -> None:
        for owners in self.attempts.values():
            for streams in owners.values():
                for s in streams.values():
                    with contextlib.suppress(OSError):
                        os.close(s.dir_fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def read(job: str) -> Kept | None:
    """The job's kept logs (None: none were kept, or they were removed)."""
    path = job_dir(job)
    if not _exists(logs_dir()):
        return None
    try:
        fd = os.open(path, DIR_FLAGS)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        return None
    kept = Kept(path, fd, {})
    for entry in sorted(os.listdir(fd)):
        number = entry.removeprefix("attempt_")
        if not entry.startswith("attempt_") or not numeric.digits(number):
            continue
        owners: dict[str, dict[str, StreamFiles]] = {}
        try:
            afd = os.open(entry, DIR_FLAGS, dir_fd=fd)
        except OSError:
            continue
        try:
            for owner in sorted(os.listdir(afd), key=_owner_order):
                try:
                    ofd = os.open(owner, DIR_FLAGS, dir_fd=afd)
                except OSError:
                    continue
                streams = {}
                for name in STREAMS:
                    sfd = os.dup(ofd)
                    s = open_stream(sfd, name)
                    if s is None:
                        os.close(sfd)
                    else:
                        streams[name] = s
                os.close(ofd)
                if streams:
                    owners[owner] = streams
        finally:
            os.close(afd)
        kept.attempts[int(number)] = owners
    return kept


def _owner_order(owner: str) -> tuple[int, str]:
    return (int(owner), "") if numeric.digits(owner) else (1 << 30, owner)


def tail_bytes(job: str, limit: int) -> dict[str, bytes]:
    """The last ``limit`` bytes of each stream of the job's last attempt, by
    ``attempt_N/<owner>/<stream>`` (what a support bundle takes)."""
    kept = read(job)
    if kept is None:
        return {}
    out: dict[str, bytes] = {}
    try:
        for attempt, owners in kept.attempts.items():
            for owner, streams in owners.items():
                for name, s in streams.items():
                    end = s.end
                    parts = []
                    for _, data in s.read(max(0, end - limit), end):
                        parts.append(data if isinstance(data, bytes) else b"[...]\n")
                    out[f"attempt_{attempt}/{owner}/{name}"] = b"".join(parts)
    finally:
        kept.close()
    return out
