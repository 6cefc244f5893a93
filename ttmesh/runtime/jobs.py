"""Job records for ``ttmesh ps`` and run directories, per user, in a private runtime directory.

A record names the launcher's and the guardian's PIDs and start times. While either lives the job
is running; when the job ends its record is closed with how it ended (``ttmesh ps --all`` shows
the last :data:`HISTORY` ended jobs). A record whose processes are gone without closing it ended
abnormally (both ttmesh processes were killed). Run directories live beside the records and are
locked by their job (:mod:`ttmesh.paths`): one whose lock is free is stale and is removed by the
next command that looks.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ttmesh import paths
from ttmesh.procs import alive as proc_alive
from ttmesh.procs import start_time as proc_start_time

HISTORY = 50  # ended jobs kept for ``ps --all``
HINT = "set XDG_RUNTIME_DIR to a directory of your own"
KILLED = "ttmesh killed (its processes are gone)"


def base_dir() -> Path:
    """Per-user runtime state: $XDG_RUNTIME_DIR, else a RAM-backed /dev/shm, else the temp dir
    (a job's run directory is written and removed on every launch: keep it off slow disks)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return Path(base) / "ttmesh"
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm / f"ttmesh-{os.getuid()}"
    return Path(tempfile.gettempdir()) / f"ttmesh-{os.getuid()}"


def jobs_dir() -> Path:
    return base_dir() / "jobs"


def runs_dir() -> Path:
    return base_dir() / "runs"


def _ensure(directory: Path) -> Path:
    paths.private_dir(base_dir(), HINT)
    return paths.private_dir(directory, HINT)


def create_run_dir(job: str) -> paths.RunDir:
    """The job's run directory, created exclusively; stale ones are swept first."""
    sweep()
    return paths.create_run_dir(_ensure(runs_dir()), job, HINT)


def sweep() -> list[str]:
    """Remove run directories whose jobs are gone."""
    return paths.sweep_stale(runs_dir())


def write(record: dict[str, Any]) -> Path:
    directory = _ensure(jobs_dir())
    record = dict(record)
    if record.get("supervisor_start") is None:
        record["supervisor_start"] = proc_start_time(record["pid"])
    if record.get("guardian") and record.get("guardian_start") is None:
        record["guardian_start"] = proc_start_time(record["guardian"])
    path = directory / f"{paths.safe_name(record['job'], 'job id')}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".job.")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def update(job: str, **fields: Any) -> None:
    """Merge ``fields`` into the job's record (written by the launcher when the job starts)."""
    record = _read(jobs_dir() / f"{paths.safe_name(job, 'job id')}.json") or {
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
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def close(job: str, status: str, code: int | None) -> None:
    """Mark the job ended (``status`` says how, e.g. "exited 0", "launcher killed")."""
    path = jobs_dir() / f"{job}.json"
    record = _read(path)
    if record is None:
        return
    record.update(ended=time.time(), status=status, code=code)
    with contextlib.suppress(OSError, ValueError):
        write(record)
    _prune()


def remove(job: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (jobs_dir() / f"{job}.json").unlink()


def is_running(record: dict[str, Any]) -> bool:
    if record.get("ended"):
        return False
    front = proc_alive(record.get("pid", -1), record.get("supervisor_start"))
    guardian = record.get("guardian")
    return front or bool(guardian and proc_alive(guardian, record.get("guardian_start")))


def _records() -> list[dict[str, Any]]:
    directory = jobs_dir()
    if not directory.is_dir():
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
    """Running and ended jobs, oldest first."""
    out = [r for r in _records() if root is None or r.get("root") == root]
    return sorted(out, key=lambda r: r.get("started", 0))


def _prune() -> None:
    ended = sorted((r for r in _records() if r.get("ended")), key=lambda r: r["ended"])
    for r in ended[:-HISTORY]:
        remove(r["job"])


def new_job_id() -> str:
    return time.strftime("%m%d-%H%M%S-") + os.urandom(2).hex()
