"""A job's own copy of its ranks' output, kept with its record: what ``ttmesh logs JOB`` reads.

Every job keeps every stream of every rank (a server's too; mpirun's own) under the private
runtime directory its record lives in, unless launched with ``--no-logs``::

    logs/<job>/attempt_<N>/<owner>/<stream>.log           the stream's first bytes (its head)
    logs/<job>/attempt_<N>/<owner>/<stream>.log.<offset>  its last bytes (at most two tail
                                                          segments, named by where they start)
    logs/<job>/attempt_<N>/<owner>/<stream>.idx           when its bytes were written

``owner`` is a rank's number (its index in the plan) or ``mpirun``; ``stream`` ``stdout`` or
``stderr``. Everything is this user's alone: directories 0700, files 0600, made exclusively and
never through a link (each name opened relative to its directory's descriptor, ``O_NOFOLLOW``).

**Bounds.** A job keeps at most ``TTMESH_JOB_LOG_MB`` (default 64) MiB: its first attempt and
its last two (the first failure and the latest say most), each stream a share of it, as a head
(a quarter of the share) and a tail (two segments of three eighths: the oldest is dropped when a
third begins, so the last bytes are always there). What falls between is cut, and the reader
says how much. Across jobs, logs go with the records ``ttmesh ps --all`` keeps
(``TTMESH_JOB_HISTORY``), and the oldest ended jobs' logs go first once all of them hold more
than ``TTMESH_LOGS_MB`` (default 256) MiB. Writing stops (said in the log) when the file system
has less than :data:`FLOOR_BYTES` or :data:`FLOOR_SHARE` of itself free: a log never fills
``/dev/shm`` or a disk.

**Cost.** The guardian already reads every rank's pipes; a kept stream is one buffered file
written a block of whole lines at a time (never a line at a time), flushed every
:data:`FLUSH_EVERY` seconds at most; the index gets 16 bytes per stream at most once a second.
"""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from ttmesh import numeric, paths
from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError

MiB = 1 << 20
JOB_MB = 64  # what one job keeps (TTMESH_JOB_LOG_MB)
ALL_MB = 256  # what every job's logs together keep (TTMESH_LOGS_MB)
KEEP_ATTEMPTS = 3  # the first attempt and the last two
MIN_SHARE = 64 * 1024  # a stream's smallest share, however many ranks a job has
FLOOR_BYTES = 64 * MiB  # stop writing below this much free space ...
FLOOR_SHARE = 0.05  # ... or below this share of the file system free
SPACE_EVERY = MiB  # bytes written between two looks at the free space
FLUSH_EVERY = 0.25  # seconds between two flushes of a stream's buffer (ttmesh logs --follow)
INDEX_EVERY = 1.0  # seconds between two index entries of a stream
INDEX_ENTRY = struct.Struct("<dQ")  # (when, the stream's bytes written by then)
INDEX_MAX = 1 << 16  # entries; past it every other one is dropped (coarser, still bounded)
BUFFER = 256 * 1024
STREAMS = ("stdout", "stderr")
LAUNCHER_OWNER = "mpirun"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
HINT = "set XDG_RUNTIME_DIR to a directory of your own"
SIZE_FILE = ".bytes"  # what an ended job's logs hold, written as its directory is closed


@dataclass(frozen=True)
class Limits:
    """What one job's logs may hold, and every job's together (bytes)."""

    job: int = JOB_MB * MiB
    every: int = ALL_MB * MiB


def limits(environ: Mapping[str, str] | None = None) -> Limits:
    """The bounds this user asked for (``TTMESH_JOB_LOG_MB``, ``TTMESH_LOGS_MB``); a bad value
    is bad input (exit 2), said before the job starts."""
    env = os.environ if environ is None else environ
    job = numeric.number(
        env.get("TTMESH_JOB_LOG_MB", JOB_MB), "TTMESH_JOB_LOG_MB", low=1, high=1 << 20,
        unit="MiB", example=str(JOB_MB),
    )  # fmt: skip
    every = numeric.number(
        env.get("TTMESH_LOGS_MB", ALL_MB), "TTMESH_LOGS_MB", low=1, high=1 << 24,
        unit="MiB", example=str(ALL_MB),
    )  # fmt: skip
    return Limits(int(job * MiB), int(every * MiB))


def logs_dir() -> Path:
    from ttmesh.runtime import jobs

    return jobs.base_dir() / "logs"


def job_dir(job: str) -> Path:
    return logs_dir() / paths.safe_name(job, "job id")


def owner_name(rank: int) -> str:
    return LAUNCHER_OWNER if rank < 0 else str(rank)


# --------------------------------------------------------------------------- writing


class JobLogs:
    """One job's log directory, made when the job starts and open for its life (the guardian,
    forked from the launcher, writes through the same descriptor)."""

    def __init__(self, path: Path, fd: int, limits: Limits) -> None:
        self.path = path
        self.fd = fd
        self.limits = limits

    @classmethod
    def create(cls, job: str, bounds: Limits | None = None) -> JobLogs:
        """A new, empty directory for ``job`` (an ended job of the same name had its logs
        replaced: its record is replaced too)."""
        from ttmesh.runtime import jobs

        base = logs_dir()
        paths.private_dir(jobs.base_dir(), HINT)
        paths.private_dir(base, HINT)
        path = job_dir(job)
        paths.remove_tree(path)  # only a real directory of this user's, never through a link
        try:
            os.mkdir(path, 0o700)
            fd = os.open(path, DIR_FLAGS)
        except OSError as exc:
            from ttmesh.errors import from_os_error

            raise from_os_error(exc, "create the job's log directory", str(path)) from None
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(fd)
            raise TTMeshError(f"{path} was changed by another user", HINT, 2)
        return cls(path, fd, bounds or Limits())

    def attempt(self, attempt: int, owners: list[str]) -> AttemptLogs | None:
        """The files of one attempt (older attempts but the first and the last are removed);
        None when the directory cannot be written (the job goes on without its copy)."""
        name = f"attempt_{attempt}"
        keep = {f"attempt_{a}" for a in (0, attempt - 1, attempt)}
        with contextlib.suppress(OSError):
            for entry in os.listdir(self.fd):
                if entry.startswith("attempt_") and entry not in keep:
                    _remove_entry(self.fd, entry)
        share = max(MIN_SHARE, self.limits.job // (KEEP_ATTEMPTS * max(1, len(owners)) * 2))
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError:
            return None
        return AttemptLogs(fd, share, self.path.name)

    def close(self) -> None:
        """Close the directory, leaving what it holds in :data:`SIZE_FILE`: the retention of
        later jobs reads that one number rather than walking every job's files."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            total = _tree_bytes(str(self.path))
            fd = os.open(SIZE_FILE, NEW_FILE & ~os.O_EXCL | os.O_TRUNC, 0o600, dir_fd=self.fd)
            with os.fdopen(fd, "w") as f:
                f.write(str(total))
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1


def _remove_entry(dir_fd: int, name: str) -> None:
    """Remove ``name`` under the directory ``dir_fd`` (a tree of this user's; never a link's
    target: rmtree does not follow links)."""
    import shutil

    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        shutil.rmtree(name, dir_fd=dir_fd, ignore_errors=True)
    else:
        os.unlink(name, dir_fd=dir_fd)


class AttemptLogs:
    """One attempt's directory: a :class:`StreamLog` per owner and stream."""

    def __init__(self, fd: int, share: int, job: str = "") -> None:
        self.fd = fd
        self.share = share  # bytes each stream may keep
        self.job = job
        self.logs: list[StreamLog] = []

    def stream(self, owner: str, name: str) -> StreamLog | None:
        try:
            try:
                os.mkdir(owner, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
            fd = os.open(owner, DIR_FLAGS, dir_fd=self.fd)
        except OSError:
            return None
        try:
            log = StreamLog(fd, name, head=self.share // 4, tail=self.share * 3 // 8)
        except OSError:
            os.close(fd)
            return None
        self.logs.append(log)
        return log

    def flush(self) -> None:
        for log in self.logs:
            log.flush()

    def close(self) -> None:
        for log in self.logs:
            log.close()
        self.logs = []
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _new_file(dir_fd: int, name: str) -> int:
    return os.open(name, NEW_FILE, 0o600, dir_fd=dir_fd)


class StreamLog:
    """One stream kept as a head and a tail of at most two segments (module docstring)."""

    def __init__(self, dir_fd: int, name: str, head: int, tail: int) -> None:
        self.dir_fd = dir_fd
        self.name = name
        self.head_room = max(head, 1)
        self.tail_cap = max(tail, 1)
        self.offset = 0  # bytes of the stream so far (kept or not)
        self.file: IO[bytes] | None = os.fdopen(_new_file(dir_fd, f"{name}.log"), "ab", BUFFER)
        self.in_head = True
        self.segments: list[int] = []  # where each tail segment on disk starts
        self.segment_size = 0
        self.index_fd = _new_file(dir_fd, f"{name}.idx")
        self.indexed = (0.0, 0)  # the last entry written (when, offset)
        self.index_entries = 0
        self.flushed = time.monotonic()
        self.space_due = SPACE_EVERY
        self.stopped: str | None = None  # why nothing more is written

    def write(self, block: bytes) -> None:
        """Keep ``block`` (whole lines): the head while it has room, then the tail."""
        if self.stopped is not None or self.file is None:
            self.offset += len(block)
            return
        self.space_due -= len(block)
        if self.space_due <= 0 and not self._room():
            self.offset += len(block)
            return
        if self.in_head:
            if len(block) <= self.head_room:
                self.file.write(block)
                self.head_room -= len(block)
                self.offset += len(block)
                return
            cut = block.rfind(b"\n", 0, self.head_room) + 1 or self.head_room
            self.file.write(block[:cut])
            self.offset += cut
            block = block[cut:]
            self.in_head = False
            self.file.close()
            self.file = None
        if len(block) > self.tail_cap:  # more than the tail keeps: its end only
            skip = block.find(b"\n", len(block) - self.tail_cap) + 1 or len(block) - self.tail_cap
            self.offset += skip
            block = block[skip:]
            self._segment(drop_all=True)
        elif self.file is None or self.segment_size + len(block) > self.tail_cap:
            self._segment()
        assert self.file is not None
        self.file.write(block)
        self.segment_size += len(block)
        self.offset += len(block)

    def _segment(self, drop_all: bool = False) -> None:
        """Start a tail segment at the current offset; keep at most the one before it."""
        if self.file is not None:
            self.file.close()
            self.file = None
        keep = 0 if drop_all else 1
        while len(self.segments) > keep:
            with contextlib.suppress(OSError):
                os.unlink(f"{self.name}.log.{self.segments.pop(0)}", dir_fd=self.dir_fd)
        try:
            fd = _new_file(self.dir_fd, f"{self.name}.log.{self.offset}")
        except FileExistsError:  # a zero-length segment at this offset: write on after it
            fd = os.open(f"{self.name}.log.{self.offset}", os.O_WRONLY | os.O_APPEND
                         | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)  # fmt: skip
        self.segments.append(self.offset)
        self.file = os.fdopen(fd, "ab", BUFFER)
        self.segment_size = 0

    def _room(self) -> bool:
        """Enough free space to go on writing (looked at every :data:`SPACE_EVERY` bytes)."""
        self.space_due = SPACE_EVERY
        try:
            fs = os.fstatvfs(self.dir_fd)
        except OSError:
            return True
        free = fs.f_bavail * fs.f_frsize
        if free >= FLOOR_BYTES and free >= fs.f_blocks * fs.f_frsize * FLOOR_SHARE:
            return True
        self.stop(
            f"the file system has only {free / MiB:.0f} MiB free: ttmesh keeps no more of "
            "this stream"
        )
        return False

    def stop(self, why: str) -> None:
        """Write no more, and say why at the end of what is kept."""
        self.stopped = why
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.write(f"\n[ttmesh: {why}]\n".encode())
                self.file.close()
            self.file = None

    def flush(self, now: float | None = None, force: bool = False) -> None:
        """The buffer to the file (at most every :data:`FLUSH_EVERY` s) and an index entry
        (at most every :data:`INDEX_EVERY` s), so that a reader sees the output soon."""
        mono = time.monotonic()
        if not force and mono - self.flushed < FLUSH_EVERY:
            return
        self.flushed = mono
        if self.file is not None:
            try:
                self.file.flush()
            except OSError as exc:  # a full file system: the rest is not kept
                self.file = None
                self.stopped = exc.strerror or str(exc)
        wall = time.time() if now is None else now
        if self.offset != self.indexed[1] and (force or wall - self.indexed[0] >= INDEX_EVERY):
            self._index(wall)

    def _index(self, when: float) -> None:
        with contextlib.suppress(OSError):
            if self.index_entries >= INDEX_MAX:
                self._thin_index()
            os.write(self.index_fd, INDEX_ENTRY.pack(when, self.offset))
            self.index_entries += 1
            self.indexed = (when, self.offset)

    def _thin_index(self) -> None:
        """Every other entry, rewritten in place: a quiet stream's index stays bounded."""
        size = INDEX_ENTRY.size
        os.lseek(self.index_fd, 0, os.SEEK_SET)
        data = _read_fd(self.index_fd, self.index_entries * size)
        kept = b"".join(data[i : i + size] for i in range(size, len(data), 2 * size))
        os.lseek(self.index_fd, 0, os.SEEK_SET)
        os.write(self.index_fd, kept)
        os.ftruncate(self.index_fd, len(kept))
        os.lseek(self.index_fd, 0, os.SEEK_END)
        self.index_entries = len(kept) // size

    def close(self) -> None:
        self.flush(force=True)
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
            self.file = None
        for fd in (self.index_fd, self.dir_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.index_fd = self.dir_fd = -1


def _read_fd(fd: int, limit: int) -> bytes:
    chunks = []
    while limit > 0:
        chunk = os.read(fd, min(limit, MiB))
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- retention


def sizes() -> dict[str, tuple[float, int]]:
    """Each job's logs: (when last written, bytes), read without following a link."""
    out: dict[str, tuple[float, int]] = {}
    base = logs_dir()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return out
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            out[entry.name] = (st.st_mtime, _recorded_bytes(entry.path))
    return out


def _recorded_bytes(path: str) -> int:
    """A job's logs' size: the number it left when it ended (a few bytes read), else (still
    running, or killed before) a walk of its files."""
    try:
        dir_fd = os.open(path, DIR_FLAGS)
        try:
            fd = os.open(SIZE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=dir_fd)  # fmt: skip
        finally:
            os.close(dir_fd)
        try:
            st = os.fstat(fd)
            text = (
                os.read(fd, 32) if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() else b""
            )
        finally:
            os.close(fd)
        if numeric.digits(text.decode("ascii", "replace")):
            return int(text)
    except OSError:
        pass
    return _tree_bytes(path)


def _tree_bytes(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
        total += len(dirs) * 4096
    return total


def _exists(path: Path) -> bool:
    """``path`` is a private directory of this user's (else False: nothing is read there)."""
    try:
        return paths.private_dir(path, HINT, create=False) is not None
    except TTMeshError:
        return False


def prune(bound: Limits | None = None) -> list[str]:
    """Remove the logs of jobs whose records are gone (a listing of names only), then, when
    every job's logs hold more than the bound, the oldest ended jobs' until they do not (the
    records are read only then). The names removed."""
    from ttmesh.runtime import jobs

    if not _exists(logs_dir()):
        return []
    try:
        bound = bound or limits()
    except TTMeshError:
        bound = Limits()
    try:
        recorded = {n[:-5] for n in os.listdir(jobs.jobs_dir()) if n.endswith(".json")}
    except OSError:
        recorded = set()
    found = sizes()
    removed = [name for name in found if name not in recorded]
    total = sum(size for name, (_, size) in found.items() if name not in removed)
    if total > bound.every:
        running = {r["job"] for r in jobs.running()}
        for name, (_, size) in sorted(found.items(), key=lambda kv: kv[1][0]):
            if total <= bound.every:
                break
            if name in running or name in removed:
                continue
            removed.append(name)
            total -= size
    base = logs_dir()
    for name in removed:
        paths.remove_tree(base / name)
    return removed
