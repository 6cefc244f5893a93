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
from conftest import run_cli

HOST = socket.gethostname()
UID = os.getuid()

# A rank as ttnn's Open MPI would be: creates its segment (mode 0600, the transport's name) in
# the backing directory its environment names, maps it, and exits without unlinking it.
RANK = r"""
import json, mmap, os, sys
d = os.environ.get("OMPI_MCA_btl_sm_backing_directory") or "/dev/shm"
name = f"sm_segment.{os.uname().nodename}.{os.getuid()}.f62b{os.getpid():04x}.0"
fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
m[0:1] = b"x"
print("SEGMENT " + json.dumps({"dir": d, "name": name, "run": os.environ["TTMESH_READY_FILE"]}))
"""


def _env(shm: Path) -> dict[str, str]:
    return {"OMPI_MCA_btl_sm_backing_directory": str(shm)}


def _make(path: Path, mode: int = 0o600) -> Path:
    path.write_bytes(b"\0" * 4096)
    path.chmod(mode)
    return path


def _segments_of(out: str) -> list[dict[str, str]]:
    return [
        json.loads(line.split("SEGMENT ", 1)[1]) for line in out.splitlines() if "SEGMENT " in line
    ]


def test_the_ranks_segments_go_with_the_job(qb2: Path, tmp_path: Path) -> None:
    """Each rank's Open MPI keeps its segments in a directory of the job's (in memory, as the
    run directory is), which goes when the job ends: nothing is left in /dev/shm, and nothing
    of anyone else's there is looked at."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    before = {n for n in os.listdir("/dev/shm") if n.startswith("sm_segment.")}
    r = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--", sys.executable, str(script),
                env={"PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert r.code == 0, r.err
    made = _segments_of(r.out)
    assert len(made) == 2, r.out
    for seg in made:
        run_dir = Path(seg["run"]).parent.parent
        assert seg["dir"] == f"{run_dir}/shm", seg
        assert not run_dir.exists()  # the segments went with the run directory
    after = {n for n in os.listdir("/dev/shm") if n.startswith("sm_segment.")}
    assert not {s["name"] for s in made} & (after - before)


def test_the_dry_run_shows_the_segment_directory(qb2: Path) -> None:
    r = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", "--json", "--", "true")
    assert r.code == 0, r.err
    (rank,) = json.loads(r.out)["ranks"]
    run_dir = Path(rank["env"]["TTMESH_READY_FILE"]).parent.parent
    assert rank["env"]["OMPI_MCA_btl_sm_backing_directory"] == f"{run_dir}/shm"


@pytest.mark.parametrize("how", ["shell", "--env"])
def test_the_users_own_backing_directory_is_kept(qb2: Path, tmp_path: Path, how: str) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    args = ["launch", "--root", str(qb2), "--tp-size", "1"]
    env = {"PYTHONUNBUFFERED": "1"}
    if how == "shell":
        env["OMPI_MCA_btl_sm_backing_directory"] = str(mine)
    else:
        args += ["--env", f"OMPI_MCA_btl_sm_backing_directory={mine}"]
    r = run_cli(*args, "--", sys.executable, str(script), env=env)
    assert r.code == 0, r.err
    (seg,) = _segments_of(r.out)
    assert seg["dir"] == str(mine)
    assert (mine / seg["name"]).exists()  # the user's directory: theirs to clean


def test_a_run_directory_on_disk_leaves_open_mpi_its_default(qb2: Path, tmp_path: Path) -> None:
    """Segments on a disk would be written back to it: a run directory that is not in memory
    (an $XDG_RUNTIME_DIR on disk) leaves Open MPI's own default, /dev/shm."""
    from ttmesh.runtime import jobs

    rt = tmp_path / "xdg"
    rt.mkdir(mode=0o700)
    if jobs._fstype(str(rt)) in jobs.MEMORY_FS:
        pytest.skip("the test's temporary directory is in memory here")
    r = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", "--json", "--", "true",
                env={"XDG_RUNTIME_DIR": str(rt)})  # fmt: skip
    assert r.code == 0, r.err
    (rank,) = json.loads(r.out)["ranks"]
    assert "OMPI_MCA_btl_sm_backing_directory" not in rank["env"]


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


def test_history_keeps_every_job_while_there_are_fewer_than_the_count(
    qb2: Path, tmp_path: Path
) -> None:
    """30 ended jobs of the 50 kept: ps --all shows all 30, and a prune (forced by one record
    past the age) removes only that one. Before, a negative slice kept the last 50 - 30 = 20:
    ps hid 10 jobs and the prune removed them (CI: a fleet's replica missing from ps --all)."""
    env = _runtime(tmp_path)
    jobs_dir = Path(env["XDG_RUNTIME_DIR"]) / "ttmesh" / "jobs"
    jobs_dir.mkdir(mode=0o700, parents=True)
    now = time.time()
    ids = [f"kept-{i:02d}" for i in range(30)]
    for i, job in enumerate(ids):
        when = now - 100 + i
        (jobs_dir / f"{job}.json").write_text(json.dumps(
            {"job": job, "pid": 1, "started": when - 1, "ended": when, "code": 0}
        ))  # fmt: skip
    assert _ended(env) == ids
    two_weeks = now - 14 * 86400
    old = jobs_dir / "old.json"
    old.write_text(json.dumps({"job": "old", "pid": 1, "started": two_weeks, "ended": two_weeks}))
    os.utime(old, (two_weeks, two_weeks))
    r = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--job-id", "new", "--", "true",
                env=env)  # fmt: skip
    assert r.code == 0, r.err
    assert sorted(p.stem for p in jobs_dir.glob("*.json")) == [*ids, "new"]
    assert _ended(env) == [*ids, "new"]


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


def test_the_mount_table_is_read_as_the_kernel_writes_it() -> None:
    """/proc/self/mounts escapes a space, tab, newline and backslash in octal and writes every
    other byte as it is: a UTF-8 mount point is itself, not its bytes read as Latin-1."""
    from ttmesh.runtime.jobs import fs_of

    table = (
        "/dev/vda / ext4 rw 0 0\n"
        "tmpfs /run/user/0 tmpfs rw 0 0\n"
        "tmpfs /mnt/caf\u00e9 tmpfs rw 0 0\n"
        "tmpfs /mnt/a\\040b tmpfs rw 0 0\n"
        "broken\n"
    )
    assert fs_of("/run/user/0/ttmesh", table) == "tmpfs"
    assert fs_of("/run/user/01", table) == "ext4"  # a sibling, not inside
    assert fs_of("/mnt/caf\u00e9/x", table) == "tmpfs"
    assert fs_of("/mnt/a b/x", table) == "tmpfs"
    assert fs_of("/mnt/a\\040b/x", table) == "ext4"  # the escape is not the name
