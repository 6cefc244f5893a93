"""What a job leaves in shared memory, and how long its record stays (issue 26, "What stays in
/dev/shm"): Open MPI's segments the job's ranks left are removed after the job, never one in use,
one from before the job, or another user's; ``check`` counts the stale ones; the history of ended
jobs is bounded by count and age, as the user sets it."""

from __future__ import annotations

import json
import mmap
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

HOST = socket.gethostname()
UID = os.getuid()

# A rank as ttnn's Open MPI would be: creates its segment (mode 0600, the transport's name),
# maps it, and exits without unlinking it. Rank 1 also makes a second one and waits until the
# test has mapped it (a process outside the job still uses it when the job ends).
RANK = r"""
import mmap, os, sys, time
d, flag = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
def segment(name):
    fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096)
    os.close(fd)
    m[0:1] = b"x"
    return m
keep = [segment(f"sm_segment.{os.uname().nodename}.{os.getuid()}.f62b0000.{rank}")]
if rank == 1:
    keep.append(segment(f"sm_segment.{os.uname().nodename}.{os.getuid()}.f62c0000.0"))
    open(os.path.join(d, "made"), "w").close()
    while not os.path.exists(flag):
        time.sleep(0.02)
"""


def _env(shm: Path) -> dict[str, str]:
    return {"OMPI_MCA_btl_sm_backing_directory": str(shm)}


def _make(path: Path, mode: int = 0o600) -> Path:
    path.write_bytes(b"\0" * 4096)
    path.chmod(mode)
    return path


def test_segments_the_ranks_left_are_removed_after_the_job(qb2: Path, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    before = _make(shm / f"sm_segment.{HOST}.{UID}.aaaa0000.0")  # there before the job
    flag = tmp_path / "mapped"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    # The test maps rank 1's second segment once it exists, then lets the rank end: that one is
    # in use when the job ends.

    argv = ["launch", "--root", str(qb2), "--tp-size", "2", "--", sys.executable, str(script)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ttmesh", *argv, str(shm), str(flag)],
        env={**os.environ, **_env(shm)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (shm / "made").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "rank 1 never made its segments"
        time.sleep(0.02)
    # Another user's segment, and one of this user's that is not private, made meanwhile.
    other = _make(shm / f"sm_segment.{HOST}.65534.bbbb0000.0")
    shared = _make(shm / f"sm_segment.{HOST}.{UID}.cccc0000.0", 0o644)
    in_use = shm / f"sm_segment.{HOST}.{UID}.f62c0000.0"
    with open(in_use, "r+b") as f:
        held = mmap.mmap(f.fileno(), 4096)
    flag.touch()
    _out, err = proc.communicate(timeout=60)
    held.close()
    assert proc.returncode == 0, err
    left = sorted(p.name for p in shm.iterdir())
    assert left == sorted(["made", before.name, other.name, shared.name, in_use.name]), left
    assert f"removed 2 Open MPI shared-memory segments the job's ranks left in {shm}" in err


def test_no_line_when_the_ranks_left_nothing(qb2: Path, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    r = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--", "true", env=_env(shm))
    assert r.code == 0, r.err
    assert "Open MPI" not in r.err


def test_check_counts_the_stale_segments(qb2: Path, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    _make(shm / f"sm_segment.{HOST}.{UID}.aaaa0000.0")
    _make(shm / f"sm_segment.{HOST}.{UID}.aaaa0000.1")
    used = _make(shm / f"sm_segment.{HOST}.{UID}.bbbb0000.0")
    with open(used, "r+b") as f:
        held = mmap.mmap(f.fileno(), 4096)
    try:
        r = run_cli("check", "--root", str(qb2), "--json", env=_env(shm))
        text = run_cli("check", "--root", str(qb2), env=_env(shm))
    finally:
        held.close()
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["shm"] == {
        "directory": str(shm),
        "stale_segments": 2,
        "bytes": doc["shm"]["bytes"],
        "others_unjudged": 0,
    }
    assert doc["shm"]["bytes"] >= 2 * 4096
    assert any("2 stale Open MPI segments" in n for n in doc["notes"]), doc["notes"]
    assert f"note: 2 stale Open MPI segments in {shm}" in text.out


def test_check_says_nothing_of_an_empty_directory(qb2: Path, tmp_path: Path) -> None:
    r = run_cli("check", "--root", str(qb2), "--json", env=_env(tmp_path))
    doc = json.loads(r.out)
    assert doc["shm"]["stale_segments"] == 0
    assert not any("Open MPI" in n for n in doc["notes"])


# --------------------------------------------------------------------------- job history


def _runtime(tmp_path: Path) -> dict[str, str]:
    rt = tmp_path / "xdg-run"
    rt.mkdir(mode=0o700, exist_ok=True)
    return {"XDG_RUNTIME_DIR": str(rt)}


def _ended(env: dict[str, str]) -> list[str]:
    r = run_cli("ps", "--all", "--json", env=env)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    return [j["job"] for j in doc["jobs"] if j.get("ended")]


def test_history_keeps_the_count_the_user_sets(qb2: Path, tmp_path: Path) -> None:
    env = {**_runtime(tmp_path), "TTMESH_JOB_HISTORY": "2"}
    ids = [f"hist-{i}" for i in range(4)]
    for job in ids:
        r = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", job, "--", "true",
                    env=env)  # fmt: skip
        assert r.code == 0, r.err
    assert _ended(env) == ids[-2:]
    jobs_dir = Path(env["XDG_RUNTIME_DIR"]) / "ttmesh" / "jobs"
    # On disk the count is pruned only past a slack (reading every record then): all 4 here.
    assert len(list(jobs_dir.glob("*.json"))) == 4


def test_history_drops_records_older_than_the_age(qb2: Path, tmp_path: Path) -> None:
    env = {**_runtime(tmp_path), "TTMESH_JOB_HISTORY_DAYS": "1"}
    r = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", "old", "--", "true",
                env=env)  # fmt: skip
    assert r.code == 0, r.err
    jobs_dir = Path(env["XDG_RUNTIME_DIR"]) / "ttmesh" / "jobs"
    record = jobs_dir / "old.json"
    data = json.loads(record.read_text())
    two_days = time.time() - 2 * 86400
    data.update(started=two_days - 5, ended=two_days)
    record.write_text(json.dumps(data))
    os.utime(record, (two_days, two_days))
    assert _ended(env) == []  # ps no longer shows it
    r = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", "new", "--", "true",
                env=env)  # fmt: skip
    assert r.code == 0, r.err
    assert sorted(p.name for p in jobs_dir.glob("*.json")) == ["new.json"]  # and it is gone


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("TTMESH_JOB_HISTORY", "nan", "not a number"),
        ("TTMESH_JOB_HISTORY", "-1", "cannot be negative"),
        ("TTMESH_JOB_HISTORY", "2.5", "not a whole number"),
        ("TTMESH_JOB_HISTORY_DAYS", "inf", "not a number"),
        ("TTMESH_JOB_HISTORY_DAYS", "1e400", "too large"),
        ("TTMESH_JOB_HISTORY_DAYS", "", "not a number"),
    ],
)
def test_a_bad_history_setting_is_one_line(
    qb2: Path, tmp_path: Path, name: str, value: str, problem: str
) -> None:
    env = {**_runtime(tmp_path), name: value}
    for args in (["ps", "--all"], ["launch", "--root", str(qb2), "--tp-size", "1", "--", "true"]):
        r = run_cli(*args, env=env)
        assert r.code == 2, (args, r.err)
        # (a simulated host is named first, as every command on one does)
        (line,) = [x for x in r.err.splitlines() if not x.startswith("simulated host:")]
        assert line.startswith(f"ttmesh: {name} ") and problem in line, line
    assert not (Path(env["XDG_RUNTIME_DIR"]) / "ttmesh" / "jobs").exists()  # nothing started


# --------------------------------------------------------------------------- the real library


def test_the_segment_ttnns_open_mpi_leaves_is_removed(
    qb2: Path, tmp_path: Path, ttnn_python: str
) -> None:
    """The real thing: ttnn's bundled Open MPI 5 opening a mesh (``check --active`` runs it as a
    ttmesh job) leaves ``sm_segment.*`` (it does, under ttmesh before this rule); after the job
    none is left. In a mount namespace of its own with a tmpfs at
    /dev/shm, so other runs' segments on this machine do not count."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a private /dev/shm")
    ttmesh = [sys.executable, "-m", "ttmesh"]
    root = shlex.quote(str(tmp_path / "root"))
    script = "\n".join(
        [
            "set -e",
            # the simulated root may live on /dev/shm: keep it in sight
            f"mkdir {root} && mount --bind {shlex.quote(str(qb2))} {root}",
            "mount -t tmpfs none /dev/shm",
            f"{shlex.join(ttmesh)} check --root {root} --active "
            f"--ttnn-python {shlex.quote(ttnn_python)} >&2",
            "echo after-job: $(ls /dev/shm | grep -c '^sm_segment\\.' || true)",
        ]
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "after-job: 0" in proc.stdout, proc.stdout
