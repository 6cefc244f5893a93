"""ttmesh from Python (docs/api.md): ``ttmesh.launch(options) -> Result``, the launch the
command line runs, embedded in a program: a job on a simulated host started, its result read,
stopped from another thread; a refusal raised as ``ttmesh.LaunchError`` with its code and line.

Each test is one in-process launch of two ranks of the standard-library test worker."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from conftest import TAG, TW, wait_for

import ttmesh


def _options(root: Path, *actions: str, **more: object) -> ttmesh.LaunchOptions:
    more.setdefault("tp_size", 2)
    return ttmesh.LaunchOptions(
        host=ttmesh.open_host(root), command=(sys.executable, TW, TAG, *actions),
        **more,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_job_started_from_python_returns_its_result(
    qb2: Path, runtime: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The job's exit code is the failing rank's, and the result says which rank and why."""
    from ttmesh import procs

    procs.set_subreaper(False)  # as a program that embeds ttmesh starts (other tests may not)
    result = ttmesh.launch(_options(qb2, "say=hello", "fail-rank=1:3", "exit=0"))
    assert not procs.is_subreaper()  # the process is left as it was: others' orphans go to init
    assert isinstance(result, ttmesh.Result)
    assert (result.code, result.rank, result.source, result.attempts) == (3, 1, "worker", 1)
    assert result.job and result.plan is None
    assert result.reason == "rank 1 exited with code 3"
    out, err = capfd.readouterr()
    assert "[r1] hello from rank 1" in out  # (rank 0 may be stopped before it says it)
    assert "exit 3: rank 1's exit code" in err


def test_a_stop_from_another_thread_stops_the_job(qb2: Path, runtime: Path, tmp_path: Path) -> None:
    """Control.stop() from another thread is ttmesh stop's SIGTERM: every rank stopped, the
    job's code 128 + 15, its chips' leases released."""
    from ttmesh.runtime import jobs

    pids = tmp_path / "pids"
    pids.mkdir()
    control = ttmesh.Control()

    def stop_once_running() -> None:
        wait_for(lambda: len(list(pids.glob("*.pid"))) == 2, 60, "both ranks")
        control.stop()

    stopper = threading.Thread(target=stop_once_running)
    stopper.start()
    try:
        result = ttmesh.launch(_options(qb2, f"pids={pids}"), control=control)
    finally:
        stopper.join()
    assert (result.code, result.reason) == (143, "terminated (SIGTERM)")
    assert not [r for r in jobs.running() if r["job"] == result.job]


def test_a_stop_asked_before_the_launch_starts_nothing(qb2: Path, runtime: Path) -> None:
    from ttmesh.runtime import jobs

    control = ttmesh.Control()
    control.stop()
    result = ttmesh.launch(_options(qb2, "exit=0"), control=control)
    assert (result.code, result.reason, result.attempts) == (143, "terminated (SIGTERM)", 0)
    assert not jobs.running()
    for sig in (9, 0, 999):  # a stop it cannot give is the API's one refusal type
        with pytest.raises(ttmesh.LaunchError) as info:
            ttmesh.Control().stop(sig)
        assert info.value.code == 2 and f"Control.stop({sig})" in info.value.line


def test_a_refusal_is_a_launch_error_with_its_code_and_line(qb2: Path, runtime: Path) -> None:
    with pytest.raises(ttmesh.LaunchError) as info:
        ttmesh.launch(_options(qb2, "exit=0", env_items=("RANK=5",)))
    assert info.value.code == 2
    assert info.value.line == (
        "--env RANK: ttmesh sets RANK for every rank (drop it: each rank gets its own)"
    )
    with pytest.raises(ttmesh.LaunchError) as info:
        ttmesh.launch(_options(qb2, "exit=0", chips="0000:01:00.0", tp_size=3))
    assert info.value.code == 2 and "--tp-size is 3" in info.value.line
    with pytest.raises(ttmesh.LaunchError) as info:  # the rule a mesh over hosts checks too
        ttmesh.launch(_options(qb2, "exit=0", mesh_shape="2x2"))
    assert info.value.code == 2
    assert info.value.line == (
        "--mesh-shape 2x2 has 4 chips but --tp-size is 2 (make ROWS x COLS equal the chip count)"
    )


def test_a_dry_run_returns_its_plan_and_runs_in_any_thread(qb2: Path, runtime: Path) -> None:
    """A dry run starts nothing and handles no signal: any thread may ask for one; a launch
    that starts a job runs in the main thread, and says so from any other."""
    got: list[object] = []

    def plan_it() -> None:
        got.append(ttmesh.launch(_options(qb2, "exit=0", dry_run=True)))
        try:
            ttmesh.launch(_options(qb2, "exit=0"))
        except ttmesh.LaunchError as exc:
            got.append(exc)

    thread = threading.Thread(target=plan_it)
    thread.start()
    thread.join()
    result, refusal = got
    assert isinstance(result, ttmesh.Result) and result.code == 0 and result.plan is not None
    assert result.plan["schema"] == "ttmesh.plan/1" and len(result.plan["ranks"]) == 2
    assert isinstance(refusal, ttmesh.LaunchError) and refusal.code == 2
    assert "runs in the main thread" in refusal.line


@pytest.mark.parametrize(
    ("given", "flags"),
    [
        ({"tp_size": 0}, ["--tp-size", "0"]),
        ({"grace": -1}, ["--grace", "-1"]),
        ({"grace": float("nan")}, ["--grace", "nan"]),
        ({"max_restarts": -1}, ["--max-restarts", "-1"]),
        ({"master_port": 70000}, ["--master-port", "70000"]),
        ({"op_timeout": 0}, ["--op-timeout", "0"]),
        ({"heartbeat_timeout": 3e6}, ["--heartbeat-timeout", "3000000.0"]),
        ({"replicas": 0}, ["--replicas", "0"]),
    ],
)
def test_a_number_from_python_is_held_to_the_flags_range(
    qb2: Path, runtime: Path, given: dict, flags: list[str]
) -> None:
    """What the command's parser refuses, ttmesh.launch refuses with the same line (its
    ranges are written once, launcher.limits), before anything is read of the host."""
    from click.testing import CliRunner

    from ttmesh.cli.launch import launch_cmd

    with pytest.raises(ttmesh.LaunchError) as info:
        ttmesh.launch(_options(qb2, "exit=0", **given))
    res = CliRunner().invoke(launch_cmd, [*flags, "--", "true"])
    assert isinstance(res.exception, ttmesh.errors.TTMeshError), res.output
    assert info.value.code == res.exception.code == 2
    assert info.value.line == str(res.exception)


@pytest.mark.parametrize(
    ("given", "line"),
    [
        ({"host": "/"}, "host str: not a host (give ttmesh.open_host(root) ('/': this one))"),
        ({"command": "python x.py"}, "command: 'python x.py': not a sequence of words"),
        ({"env_items": "A=1"}, "env_items: 'A=1': not a sequence of words"),
        ({"dry_run": "yes"}, "dry_run: 'yes': not True or False"),
        ({"torchrun_flags": None}, "torchrun_flags: not a TorchrunFlags"),
        (
            {"torchrun_flags": ttmesh.TorchrunFlags(numa_binding="socket")},
            "--numa-binding 'socket': ttmesh binds ranks by NUMA node only",
        ),
    ],
)
def test_a_value_of_the_wrong_kind_is_one_line(
    qb2: Path, runtime: Path, given: dict, line: str
) -> None:
    """A string where words are meant is refused, not read letter by letter."""
    options = {"host": ttmesh.open_host(qb2), "command": ("true",), **given}
    with pytest.raises(ttmesh.LaunchError) as info:
        ttmesh.launch(ttmesh.LaunchOptions(**options))
    assert info.value.code == 2 and info.value.line.startswith(line), info.value.line


def test_a_number_given_as_text_is_read_as_the_flag_reads_it(qb2: Path, runtime: Path) -> None:
    result = ttmesh.launch(_options(qb2, "exit=0", tp_size="2", dry_run=True))  # type: ignore[arg-type]
    assert result.plan is not None and len(result.plan["ranks"]) == 2
