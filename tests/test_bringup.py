"""A stop that does not wedge the fabric (issue 24): a rank bringing up the fabric gets
--fabric-grace beyond --grace before SIGKILL, and says so; a plain rank gets the grace only;
--op-timeout reaches the ranks; a hung job's stacks are dumped before the kill and named in
--summary-json.

The guardian runs in this process (as in test_guardian_parts.py); every wait awaits an event
(a file, a line), and no assertion is about time.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from users import users_fixture  # noqa: F401

from ttmesh.launcher.attempt import dumps
from ttmesh.launcher.planning.request import Policy
from ttmesh.states import AttemptEnd

# What tt-metal's logger prints as FabricFirmwareInitializer::init starts the fabric
# (tt_metal/impl/device/firmware/fabric_firmware_initializer.cpp).
TT_METAL_START = (
    "2026-12-01 10:00:00.000 | info     |          Metal | Initializing Fabric "
    "(fabric_firmware_initializer.cpp:296)"
)
USERS_SHELL = {"PYTHONUNBUFFERED": ""}  # this machine sets it everywhere; users' shells do not


@pytest.fixture(autouse=True)
def _not_a_subreaper() -> Iterator[None]:
    """The in-process guardian must leave pytest's process as it found it (no subreaper)."""
    yield
    import ctypes

    from ttmesh import procs

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(procs.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) == 0
    procs.reap_all()


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "rt"
    where.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(where))
    return where


def _prepare(root: Path, code: str, **req: Any) -> Any:
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    request = LaunchRequest(command=[sys.executable, "-c", code], tp_size=2, no_python=True, **req)
    return prepare(request, open_host(root))


class _View:
    """An observer: the guardian's lines, and whether rank 1 was alive when it said it waits."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}
        self.data = b""
        self.alive_when_waited: bool | None = None

    def output(self, fd: int, data: bytes) -> None:
        self.data += data
        if b"is bringing up the fabric" in data and self.alive_when_waited is None:
            from conftest import alive

            self.alive_when_waited = alive(self.pids[1])

    def rank_started(self, rank: int, pid: int) -> None:
        self.pids[rank] = pid

    def phase(self, *_: Any) -> None: ...
    def attempt(self, *_: Any) -> None: ...
    def rank_ready(self, *_: Any) -> None: ...
    def rank_exited(self, *_: Any) -> None: ...
    def lines(self, *_: Any) -> None: ...
    def tick(self) -> None: ...


def _stopped_by_a_failure(qb2: Path, tmp_path: Path, bringup: bool) -> tuple[Any, _View]:
    """Two ranks that ignore SIGTERM: rank 1 (printing tt-metal's bring-up line, or not)
    touches a flag; rank 0 fails once it sees it, which stops rank 1."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.attempt.guardian import Guardian, Options
    from ttmesh.launcher.job.run import write_files
    from ttmesh.runtime import jobs

    flag = tmp_path / "rank1-started"
    line = f"print({TT_METAL_START!r}, flush=True)\n    " if bringup else ""
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "if os.environ['RANK'] == '1':\n"
        f"    {line}open({str(flag)!r}, 'w').close()\n"
        "    time.sleep(60)\n"
        f"while not os.path.exists({str(flag)!r}): time.sleep(0.01)\n"
        "sys.exit(3)\n"
    )
    plan = _prepare(qb2, code, policy=Policy(grace=0.2, fabric_grace=1.0)).plan
    where = jobs.create_run_dir(plan.job)
    write_files(plan)
    alive_r, alive_w = os.pipe()
    view = _View()
    try:
        guardian = Guardian(plan, 0, Options(), dict(os.environ), alive_r, open_host(qb2), view)  # type: ignore[arg-type]
        result = guardian.run(own_group=False)
    finally:
        os.close(alive_r)
        os.close(alive_w)
        where.remove()
    return result, view


def test_a_rank_in_fabric_bringup_gets_the_fabric_grace_then_is_killed(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    result, view = _stopped_by_a_failure(qb2, tmp_path, bringup=True)
    said = view.data.decode()
    assert "ttmesh: rank 1 is bringing up the fabric: waiting up to 1 s before killing it" in said
    assert view.alive_when_waited is True  # the grace was over, and it was not killed with it
    assert (result.end, result.code, result.rank) == (AttemptEnd.FAILED, 3, 0)
    ends = {e.rank: e.code for e in result.exits}
    assert ends[1] == 128 + signal.SIGKILL  # killed at the end of the fabric's grace
    assert said.index("is bringing up the fabric") < said.rindex("grace over: SIGKILL")


def test_a_plain_rank_gets_only_the_grace(qb2: Path, runtime: Path, tmp_path: Path) -> None:
    result, view = _stopped_by_a_failure(qb2, tmp_path, bringup=False)
    said = view.data.decode()
    assert "bringing up the fabric" not in said and view.alive_when_waited is None
    assert "grace over: SIGKILL of 1 process" in said
    assert {e.rank: e.code for e in result.exits}[1] == 128 + signal.SIGKILL


def test_what_is_bringup(tmp_path: Path) -> None:
    """From tt-metal's start line to its fabric mark (the file) or tt-metal's own line after
    the routers' sync; a rank without chips never; 'Fabric Initialized with config' (logged
    before the sync) is still bring-up."""
    from ttmesh.launcher.attempt.bringup import BringUp

    files = {0: str(tmp_path / "rank0"), 1: str(tmp_path / "rank1")}
    seen = BringUp([0, 1], files)
    seen.scan(2, TT_METAL_START.encode())  # rank 2 has no chips: a plain torch rank
    seen.scan(1, b"loss 0.5\nstep 1")
    assert seen.ranks({0, 1, 2}) == []
    seen.scan(0, f"x\n{TT_METAL_START}\ny".encode())
    seen.scan(1, TT_METAL_START.encode())
    seen.scan(1, b"info | Metal | Fabric Initialized with config FabricConfig.FABRIC_1D")
    assert seen.ranks({0, 1, 2}) == [0, 1]
    assert seen.ranks({1}) == [1]  # only the ranks still running
    seen.scan(0, b"2026 | info | Metal | Devices initialized (device_pool.cpp:420)")
    assert seen.ranks({0, 1}) == [1]
    Path(files[1]).touch()  # TTMESH_FABRIC_FILE: ttmesh.worker.fabric_up()
    assert seen.ranks({0, 1}) == []
    seen.scan(0, f"{TT_METAL_START}\nDevices initialized\n{TT_METAL_START}".encode())
    assert seen.ranks({0}) == [0]  # the last line of a block decides


def test_no_fabric_grace_keeps_no_watch(qb2: Path, runtime: Path) -> None:
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.attempt.guardian import Guardian, Options

    plan = _prepare(qb2, "pass", policy=Policy(fabric_grace=0.0)).plan
    guardian = Guardian(plan, 0, Options(), dict(os.environ), -1, open_host(qb2))
    assert guardian.bringup is None


# --------------------------------------------------------------------------- the flags


def test_op_timeout_is_in_the_ranks_env_and_the_dry_run(qb2: Path, runtime: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--op-timeout", "7.5",
                  "--dry-run", "--json", "--", "true")  # fmt: skip
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert plan["op_timeout"] == 7.5 and plan["fabric_grace"] == 20.0
    assert [r["env"]["TT_METAL_OPERATION_TIMEOUT_SECONDS"] for r in plan["ranks"]] == ["7.5"] * 2
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--dry-run", "--json",
                  "--", "true", env={"TT_METAL_OPERATION_TIMEOUT_SECONDS": "9"})  # fmt: skip
    plan = json.loads(res.out)  # off by default: the shell's own is inherited, not set
    assert plan["op_timeout"] is None
    assert not any("TT_METAL_OPERATION_TIMEOUT_SECONDS" in r["env"] for r in plan["ranks"])


def test_op_timeout_and_env_together_are_refused(qb2: Path, runtime: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--op-timeout", "5",
                  "--env", "TT_METAL_OPERATION_TIMEOUT_SECONDS=3", "--dry-run", "--", "true")  # fmt: skip
    assert res.code == 2
    assert res.err.strip().splitlines()[-1] == (
        "ttmesh: --op-timeout and --env TT_METAL_OPERATION_TIMEOUT_SECONDS both set the ranks' "
        "operation timeout (give one of them)"
    )


# --------------------------------------------------------------------------- stack dumps

HUNG = "def stuck_in_bringup():\n    import time; time.sleep(60)\nstuck_in_bringup()\n"


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        ("--ready-timeout", "rank 0 not ready after 0.5 s: treating the job as hung in bring-up"),
        ("--hang-timeout", "no output from any rank for 0.5 s: treating the job as hung"),
    ],
    ids=["ready-timeout", "hang-timeout"],
)
def test_a_hung_ranks_stack_dump_is_kept_and_named_in_the_summary(
    qb2: Path, runtime: Path, tmp_path: Path, flag: str, said: str
) -> None:
    summary = tmp_path / "summary.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--grace", "1",
                  flag, "0.5", "--summary-json", str(summary), "--",
                  sys.executable, "-c", HUNG, env=USERS_SHELL)  # fmt: skip
    assert res.code == 124, res.err
    assert f"ttmesh: {said}" in res.err
    files = json.loads(summary.read_text())["dumps"]
    assert len(files) == 1 and files[0].endswith("/rank0.txt")
    assert Path(files[0]).is_relative_to(runtime)  # the job's own, private dump directory
    assert "stuck_in_bringup" in Path(files[0]).read_text()  # py-spy's stack of the rank
    assert f"the stacks taken before the kill are in {Path(files[0]).parent}" in res.err
    assert oct(Path(files[0]).parent.stat().st_mode & 0o777) == "0o700"


def test_without_py_spy_the_dumps_are_skipped_in_one_line(
    qb2: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ttmesh.launcher.attempt import dumps

    plan = _prepare(qb2, "pass").plan
    monkeypatch.setattr(dumps, "py_spy", lambda: None)
    monkeypatch.setenv("PATH", "/nonexistent")  # no tt-triage either
    said: list[str] = []
    assert dumps.take(plan, {0: os.getpid()}, 0, said.append) == []
    assert said == [
        "py-spy not found: the ranks' Python stacks were not dumped (install it: pip install "
        "'ttmesh[debug]' (or pip install py-spy==0.4.3))"
    ]


def test_ttmesh_stop_dump_dumps_the_stacks_before_the_stop(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    from conftest import start_launch

    summary = tmp_path / "summary.json"
    code = "print('started', flush=True)\n" + HUNG
    proc = start_launch(qb2, "--tp-size", "1", "--grace", "1", "--no-live", "--job-id",
                        "dumped", "--summary-json", str(summary), "--", sys.executable, "-c",
                        code, env=USERS_SHELL)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the rank runs: its stack can be dumped
        assert "started" in line, line
        stop = run_cli("stop", "--dump", "dumped", env=USERS_SHELL)
        assert stop.code == 0, stop.err
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    assert "stacks of 1 rank before killing them" in err
    files = json.loads(summary.read_text())["dumps"]
    assert len(files) == 1 and "stuck_in_bringup" in Path(files[0]).read_text()


def test_output_keeps_a_job_from_being_hung(qb2: Path, runtime: Path) -> None:
    """--hang-timeout counts from a rank's last output, not from the start: a rank that
    prints every 0.1 s for twice the timeout is not hung (a hang guard of ten times the
    cadence, not a timed assertion)."""
    talks = "import time\nfor i in range(20):\n    print(i, flush=True); time.sleep(0.1)\n"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--hang-timeout", "1",
                  "--", sys.executable, "-c", talks, env=USERS_SHELL)  # fmt: skip
    assert res.code == 0, res.err
    assert "hung" not in res.err


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_each_user_dumps_its_own_hung_ranks(users: dict, who: str, tmp_path: Path) -> None:
    """py-spy reads the rank's memory: root may, and so may the rank's own user where the
    kernel's Yama (ptrace_scope 1 or more) does not limit it to the rank's ancestors. py-spy
    is found on this user's PATH (nobody's venv has none beside its Python)."""
    import shutil
    import tempfile

    if who not in users:
        pytest.skip("cannot switch to nobody here")
    user = users[who]
    tools = Path(tempfile.mkdtemp(dir=user.base))
    tools.chmod(0o755)
    spy = dumps.py_spy()
    assert spy is not None, "py-spy is in the test extra"
    shutil.copy(spy, tools / "py-spy")
    (tools / "py-spy").chmod(0o755)
    summary = Path(tempfile.mkdtemp(dir=user.base))
    summary.chmod(0o777)
    path = user.env.get("PATH", os.environ["PATH"])
    own: dict[str, str] = {}
    if who == "root":  # root's runtime directory is this test's (nobody's is its own already)
        (tmp_path / "rt").mkdir(mode=0o700)
        own["XDG_RUNTIME_DIR"] = str(tmp_path / "rt")
    res = user.run("launch", "--root", str(user.sim), "--tp-size", "1", "--grace", "1",
                   "--ready-timeout", "0.5", "--job-id", f"dumps-{who}", "--summary-json",
                   str(summary / "s.json"), "--", "/usr/bin/python3", "-c", HUNG,
                   env={"PATH": f"{tools}:{path}", **USERS_SHELL, **own})  # fmt: skip
    assert res.returncode == 124, res.stderr
    files = json.loads((summary / "s.json").read_text())["dumps"]
    ptrace_scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    limited = ptrace_scope.exists() and ptrace_scope.read_text().strip() != "0"
    text = Path(files[0]).read_text()
    if who == "nobody" and limited:
        assert "py-spy could not dump rank 0" in res.stderr
    else:
        assert "stuck_in_bringup" in text, text
        assert "py-spy could not" not in res.stderr


def test_tt_triage_runs_when_on_path_on_a_real_host(
    qb2: Path, runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tt-metal's tt-triage (its console script) runs once, with the job's chips visible, its
    output kept beside the stacks; on a simulated host it is not run (the chips are not the
    machine's), and says so."""
    from dataclasses import replace

    fake = tmp_path / "bin" / "tt-triage"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "triage $* on $TT_VISIBLE_DEVICES"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(dumps, "py_spy", lambda: None)
    plan = _prepare(qb2, "pass").plan
    said: list[str] = []
    assert dumps.take(plan, {0: os.getpid()}, 0, said.append) == []
    assert "tt-triage: not run (a simulated host: its chips are not this machine's)" in said
    said.clear()
    files = dumps.take(replace(plan, simulated=False), {0: os.getpid()}, 1, said.append)
    assert len(files) == 1 and files[0].endswith("/tt-triage.txt")
    bdfs = ",".join(b for r in plan.ranks for b in r.bdfs)
    assert Path(files[0]).read_text() == f"triage --disable-progress --disable-colors on {bdfs}\n"


def test_dumps_are_kept_as_job_records_are(
    runtime: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The dumps outlive their job, but not the history: the last TTMESH_JOB_HISTORY jobs'
    (this one's among them) and none older than TTMESH_JOB_HISTORY_DAYS; a link planted among
    them is left alone, never followed."""
    from ttmesh.runtime import jobs

    monkeypatch.setenv("TTMESH_JOB_HISTORY", "2")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    for age, job in ((30, "old"), (20, "older-still-kept"), (10, "newest")):
        made = jobs.dumps_dir(job)
        (made / "attempt0-x").mkdir()
        os.utime(made, (made.stat().st_atime - age, made.stat().st_mtime - age))
    (runtime / "ttmesh" / "dumps" / "planted").symlink_to(outside)
    jobs.dumps_dir("this")
    left = sorted(p.name for p in (runtime / "ttmesh" / "dumps").iterdir())
    assert left == ["newest", "planted", "this"]  # a link is not a directory of dumps: left
    assert (outside / "keep").exists()
    monkeypatch.setenv("TTMESH_JOB_HISTORY_DAYS", "0")
    jobs.dumps_dir("this")
    assert sorted(p.name for p in (runtime / "ttmesh" / "dumps").iterdir()) == ["planted", "this"]
