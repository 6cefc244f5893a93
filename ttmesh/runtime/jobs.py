"""Job records for ``ttmesh ps`` and run directories, per user, in a private runtime directory.

A record names the launcher's and the guardian's PIDs and start times. While either lives the job
is running; when the job ends its record is closed with how it ended (``ttmesh ps --all`` shows
the ended jobs kept: the last :data:`HISTORY`, none older than :data:`HISTORY_DAYS`, both
settings of the user's environment). A record whose processes are gone without closing it ended
abnormally (both ttmesh processes were killed). Run directories live beside the records and are
locked by their job (:mod:`ttmesh.paths`): one whose lock is free is stale and is removed by the
next command that looks.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard

from ttmesh import fileread, numeric, paths
from ttmesh.dataclass import dataclass
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.procs import alive as proc_alive
from ttmesh.procs import environ_value
from ttmesh.procs import start_time as proc_start_time
from ttmesh.procs import state as proc_state

HISTORY = 50  # ended jobs kept (``ps --all`` shows them); TTMESH_JOB_HISTORY changes it
HISTORY_DAYS = 7.0  # ended jobs older than this are removed; TTMESH_JOB_HISTORY_DAYS changes it
RECORD_MAX = 16 << 20  # bytes of a job record read (a fleet's, the largest, is a few KiB)
SLACK = 50  # records beyond the count kept before the oldest are removed (reads them all)
_tmp_names = itertools.count()
HINT = "set XDG_RUNTIME_DIR to a directory of your own"
KILLED = "ttmesh killed (its processes are gone)"


def base_dir() -> Path:
    """Per-user runtime state: $XDG_RUNTIME_DIR, else a RAM-backed /dev/shm, else the temp dir
    (a job's run directory is written and removed on every launch: keep it off slow disks)."""
    base = paths.xdg_dir("XDG_RUNTIME_DIR", None)  # a relative one is ignored (XDG spec)
    if base and os.path.isdir(base):
        return Path(base) / "ttmesh"
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm / f"ttmesh-{os.getuid()}"
    import tempfile

    return Path(tempfile.gettempdir()) / f"ttmesh-{os.getuid()}"


def jobs_dir() -> Path:
    return base_dir() / "jobs"


def runs_dir() -> Path:
    return base_dir() / "runs"


# ``ttmesh stop --dump`` leaves this in the job's run directory before its SIGTERM: the
# guardian dumps the ranks' stacks before it stops them.
DUMP_REQUEST = "dump-request"


def dumps_dir(job: str) -> Path:
    """Where a job's stack dumps are kept (private, beside the run directories): the run
    directory goes with the job, the dumps must outlive it to be read. Kept as job records
    are (the last ``TTMESH_JOB_HISTORY`` jobs' dumps, none older than
    ``TTMESH_JOB_HISTORY_DAYS``): older ones are removed as a new one is made."""
    paths.safe_name(job, "job id")
    every = _ensure(base_dir() / "dumps")
    _prune_dumps(every, job)
    return _ensure(every / job)


def _prune_dumps(every: Path, job: str) -> None:
    """Remove the dumps of other jobs beyond the history kept (oldest first, never through a
    link: ``paths.remove_tree`` removes only a real directory of this user's)."""
    try:
        keep = history()
        found = []
        for entry in os.scandir(every):
            if entry.name != job and entry.is_dir(follow_symlinks=False):
                found.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
    except (OSError, TTMeshError):
        return
    found.sort()
    now = time.time()
    recent = [name for when, name in found if now - when <= keep.seconds]
    kept = set(recent[max(0, len(recent) - max(keep.count - 1, 0)) :])  # this job's is one
    for _, name in found:
        if name not in kept:
            paths.remove_tree(every / name)


def _ensure(directory: Path) -> Path:
    paths.private_dir(base_dir(), HINT)
    paths.private_dir(directory, HINT)
    return directory


def _exists(directory: Path) -> bool:
    """``directory`` is there, ours and on a path no one else can change (else bad input);
    False when it does not exist. Reading records or sweeping run directories through a
    path another user could change would read (or remove) what they chose."""
    return paths.private_dir(directory, HINT, create=False) is not None


MEMORY_FS = {"tmpfs", "ramfs"}


def _fstype(path: str) -> str | None:
    """The type of the filesystem ``path`` lies on (the longest mount point above it in
    /proc/self/mounts; octal escapes as the kernel writes them), None when unknown."""
    try:
        text = fileread.read_text("/proc/self/mounts", 16 * 1024 * 1024, "mount table")
    except (OSError, ValueError):
        return None
    return fs_of(os.path.abspath(path), text)


def _unescaped(field: str) -> str:
    """A mount table's field as it is: the kernel writes a space, tab, newline or backslash as
    an octal escape (``\\040``), and every other byte as it is (a UTF-8 name stays one)."""
    if "\\" not in field:
        return field
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def fs_of(target: str, mounts: str) -> str | None:
    """The type of the filesystem the absolute path ``target`` lies on, in the mount table
    ``mounts`` (/proc/self/mounts' lines): the longest mount point above it."""
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescaped(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def segment_dir(run_dir: str) -> str:
    """Where the job's ranks keep Open MPI's shared-memory segments: ``RUN_DIR/shm`` when the
    run directory is in memory (tmpfs, as /dev/shm and $XDG_RUNTIME_DIR are), so the segments
    every process loading ttnn's Open MPI leaves behind (``sm_segment.*``) go with the job's
    run directory; "" (Open MPI's default, /dev/shm) when it is on a disk."""
    return f"{run_dir}/shm" if _fstype(run_dir) in MEMORY_FS else ""


def create_run_dir(job: str) -> paths.RunDir:
    """The job's run directory, created exclusively; stale ones are swept first."""
    sweep()
    return paths.create_run_dir(_ensure(runs_dir()), job, HINT)


def sweep() -> list[str]:
    """Remove run directories whose jobs are gone."""
    if not _exists(runs_dir()):
        return []
    return paths.sweep_stale(runs_dir())


def write(record: dict[str, Any]) -> Path:
    """Write ``record`` (replaced whole). A record that cannot be written is one line naming
    the directory and the fix (:func:`unrecordable`): a job ``ps`` and ``stop`` cannot see
    must not start (the launch refuses); later writes of a running job may ignore it."""
    directory = jobs_dir()
    try:
        return _write(directory, record)
    except TTMeshError as exc:  # the directory is not a private one of this user's
        raise unrecordable(directory, exc.message, exc.hint) from None
    except OSError as exc:  # not writable, read-only, full
        raise unrecordable(directory, exc.strerror or str(exc), _write_fix(exc, directory))


def unrecordable(directory: Path, why: str, fix: str | None) -> TTMeshError:
    """The job's record cannot be written in ``directory``: one line, bad environment
    (exit 2), naming what ``ps`` and ``stop`` would then miss."""
    where = "" if str(directory) in why else f" in {directory}"
    return bad_input(
        f"cannot write the job's record{where}: {why}: ttmesh ps and ttmesh stop would not "
        "know the job",
        f"{fix or HINT}; nothing started",
    )


def _write_fix(exc: OSError, directory: Path) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"make it yours and writable: chmod 700 {directory}, or {HINT}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on its file system, or {HINT}"
    if exc.errno == errno.EROFS:
        return f"its file system is read-only: {HINT} on a writable one"
    return HINT


def _write(directory: Path, record: dict[str, Any]) -> Path:
    _ensure(directory)
    record = dict(record)
    if record.get("supervisor_start") is None:
        record["supervisor_start"] = proc_start_time(record["pid"])
    if record.get("guardian") and record.get("guardian_start") is None:
        record["guardian_start"] = proc_start_time(record["guardian"])
    path = directory / f"{paths.safe_name(record['job'], 'job id')}.json"
    # A name of this process's own in a private directory (no tempfile: its import costs more
    # than the write). One that exists was left by a killed process that had this PID.
    tmp = directory / f".job.{os.getpid()}.{next(_tmp_names)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record))  # dumps encodes in C; dump, in Python
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def update(job: str, **fields: Any) -> None:
    """Merge ``fields`` into the job's record (written by the launcher when the job starts)."""
    name = f"{paths.safe_name(job, 'job id')}.json"
    record = (_read(jobs_dir() / name) if _exists(jobs_dir()) else None) or {
        "job": job,
        "pid": os.getppid(),
        "started": time.time(),
    }
    if "guardian" in fields and fields["guardian"] != record.get("guardian"):
        record["guardian_start"] = None  # a new attempt's guardian: read its start time
    record.update(fields)
    write(record)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = fileread.load_json(fileread.read_bytes(path, RECORD_MAX, "job record"))
    except (OSError, ValueError):  # fileread.Refused, TooDeep: no record
        return None
    return record if isinstance(record, dict) else None


def close(job: str, status: str, code: int | None, facts: Mapping[str, Any] | None = None) -> None:
    """Mark the job ended (``status`` says how, e.g. "exited 0", "launcher killed");
    ``facts``: how it went (attempts, restarts, resets, diagnosis: ``ttmesh ps JOB``)."""
    path = jobs_dir() / f"{job}.json"
    record = _read(path) if _exists(jobs_dir()) else None
    if record is None:
        return
    record.update(facts or {})
    record.update(ended=time.time(), status=status, code=code)
    with contextlib.suppress(OSError, ValueError):
        write(record)
    _prune()


def remove(job: str) -> None:
    if not _exists(jobs_dir()):
        return
    with contextlib.suppress(FileNotFoundError):
        (jobs_dir() / f"{job}.json").unlink()


def is_running(record: dict[str, Any]) -> bool:
    if record.get("ended"):
        return False
    front = proc_alive(record.get("pid", -1), record.get("supervisor_start"))
    guardian = record.get("guardian")
    return front or bool(guardian and proc_alive(guardian, record.get("guardian_start")))


STOPPED_STATES = ("T", "t")  # stopped by a signal (SIGSTOP, Ctrl-Z), held by a debugger


def stopped(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The running job's processes that are stopped (``T``: SIGSTOP, SIGTSTP; ``t``: held by
    a debugger), each ``{pid, what}`` (``what``: ``launcher``, ``guardian``, ``rank N``): a
    stopped job's record still says running (its processes live), and nothing moves until
    someone continues it (``kill -CONT PID``; ``ttmesh stop`` does it after its SIGTERM).
    A rank's PID is believed only while that process names the job (``TTMESH_JOB_ID``)."""
    if record.get("ended"):
        return []
    found = []
    for what, pid, start in (
        ("launcher", record.get("pid"), record.get("supervisor_start")),
        ("guardian", record.get("guardian"), record.get("guardian_start")),
    ):
        if _is_stopped(pid) and proc_alive(pid, start):
            found.append({"pid": pid, "what": what})
    for rank in record.get("ranks") or []:
        pid = rank.get("pid") if isinstance(rank, dict) else None
        if _is_stopped(pid) and environ_value(pid, "TTMESH_JOB_ID") == record.get("job"):
            found.append({"pid": pid, "what": f"rank {rank.get('rank')}"})
    return found


def _is_stopped(pid: object) -> TypeGuard[int]:
    return isinstance(pid, int) and pid > 0 and proc_state(pid) in STOPPED_STATES


def _records() -> list[dict[str, Any]]:
    directory = jobs_dir()
    if not _exists(directory):
        return []
    out = []
    for path in directory.glob("*.json"):
        record = _read(path)
        if record is None or "job" not in record:
            continue
        if not record.get("ended") and not is_running(record):
            # Both ttmesh processes were killed before either could close the record.
            record.update(ended=time.time(), status=KILLED, code=None)
            with contextlib.suppress(OSError, ValueError):
                write(record)
        out.append(record)
    return out


def running(root: str | None = None) -> list[dict[str, Any]]:
    """Live job records (optionally only those on host ``root``), oldest first."""
    out = [r for r in _records() if is_running(r) and (root is None or r.get("root") == root)]
    return sorted(out, key=lambda r: r.get("started", 0))


def every(root: str | None = None) -> list[dict[str, Any]]:
    """Running jobs and the ended ones the history keeps, oldest first."""
    records = _records()
    ended = sorted((r for r in records if r.get("ended")), key=lambda r: r["ended"])
    kept = {id(r) for r in _kept(ended, history(), time.time())}
    old = {id(r) for r in ended if id(r) not in kept}
    out = [r for r in records if id(r) not in old and (root is None or r.get("root") == root)]
    return sorted(out, key=lambda r: r.get("started", 0))


@dataclass(frozen=True)
class History:
    """How many ended jobs to keep, and for how long."""

    count: int
    seconds: float


def history(environ: Mapping[str, str] | None = None) -> History:
    """The history this user asked for (``TTMESH_JOB_HISTORY``: ended jobs kept, 0 keeps none;
    ``TTMESH_JOB_HISTORY_DAYS``: their age at most); a bad value is bad input (exit 2)."""
    env = os.environ if environ is None else environ
    count = numeric.whole(
        env.get("TTMESH_JOB_HISTORY", HISTORY), "TTMESH_JOB_HISTORY", high=100_000, example="50"
    )
    days = numeric.number(
        env.get("TTMESH_JOB_HISTORY_DAYS", HISTORY_DAYS),
        "TTMESH_JOB_HISTORY_DAYS",
        low=0,
        high=3650,
        unit="days",
        example="7",
    )
    return History(count, days * 86400.0)


def _kept(ended: list[dict[str, Any]], keep: History, now: float) -> list[dict[str, Any]]:
    """The ended records ``keep`` keeps, of ``ended`` sorted oldest first."""
    recent = [r for r in ended if now - r["ended"] <= keep.seconds]
    # Never a negative start: with fewer recent jobs than the count, recent[-k:] would keep
    # only the last k of them (48 ended jobs of 50 kept showed 2, and a prune removed 46).
    return recent[max(0, len(recent) - keep.count) :] if keep.count else []


def _prune(keep: History | None = None) -> None:
    """Remove ended records beyond the history kept: a directory listing (names and times, no
    reading) on every job's end, and reading them all only when there are :data:`SLACK` records
    too many or one is older than the age kept."""
    try:
        keep = keep or history()
    except TTMeshError:
        keep = History(HISTORY, HISTORY_DAYS * 86400.0)  # checked when the launch started
    now = time.time()
    try:
        with os.scandir(jobs_dir()) as entries:
            times = [
                e.stat(follow_symlinks=False).st_mtime for e in entries if e.name.endswith(".json")
            ]
    except OSError:
        return
    # A record is written last when its job ends: its time is at least that.
    if len(times) < keep.count + SLACK and all(now - t <= keep.seconds for t in times):
        return
    ended = sorted((r for r in _records() if r.get("ended")), key=lambda r: r["ended"])
    kept = {r["job"] for r in _kept(ended, keep, now)}
    for r in ended:
        if r["job"] not in kept:
            remove(r["job"])


def new_job_id() -> str:
    return time.strftime("%m%d-%H%M%S-") + os.urandom(2).hex()
