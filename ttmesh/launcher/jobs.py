"""Job records for ``ttmesh ps``: one JSON file per running job, per user, mode 0600.

A record names the supervisor's PID and start time; a record whose supervisor is gone is stale
and is removed when listed, so ``ps`` never shows a job that is not running.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ttmesh.sim.core import proc_alive, proc_start_time


def jobs_dir() -> Path:
    """Per-user runtime state: $XDG_RUNTIME_DIR, else a RAM-backed /dev/shm, else the temp dir
    (a job's run directory is written and removed on every launch: keep it off slow disks)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isdir(base):
        return Path(base) / "ttmesh" / "jobs"
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm / f"ttmesh-{os.getuid()}" / "jobs"
    return Path(tempfile.gettempdir()) / f"ttmesh-{os.getuid()}" / "jobs"


def runs_dir() -> Path:
    return jobs_dir().parent / "runs"


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.parent.stat()
    if st.st_uid == os.getuid():
        with contextlib.suppress(OSError):
            os.chmod(path.parent, 0o700)


def write(record: dict[str, Any]) -> Path:
    directory = jobs_dir()
    _private_dir(directory)
    record = {**record, "supervisor_start": proc_start_time(record["pid"])}
    path = directory / f"{record['job']}.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".job.")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def remove(job: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (jobs_dir() / f"{job}.json").unlink()


def running(root: str | None = None) -> list[dict[str, Any]]:
    """Live job records (optionally only those on host ``root``), oldest first."""
    directory = jobs_dir()
    out = []
    if not directory.is_dir():
        return out
    for path in directory.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not proc_alive(record.get("pid", -1), record.get("supervisor_start")):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        if root is None or record.get("root") == root:
            out.append(record)
    return sorted(out, key=lambda r: r.get("started", 0))


def new_job_id() -> str:
    return time.strftime("%m%d-%H%M%S-") + os.urandom(2).hex()
