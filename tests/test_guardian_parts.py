"""The states ttmesh moves through (ttmesh.states), and the guardian's parts, in-process.

Each part of the guardian (signals, readiness, fabric marks, the record and verdict) is tested
here without starting ttmesh: on a plan prepared in this process for a simulated host (the
``qb2`` fixture). The guardian itself runs one attempt here too, and so does a whole job
(:func:`ttmesh.launcher.job.run.execute`, whose guardian is forked from this process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ttmesh import states
from ttmesh.errors import TTMeshError
from ttmesh.launcher.attempt import record, signals
from ttmesh.launcher.attempt.marks import FabricMarks
from ttmesh.launcher.attempt.readiness import Readiness, job_phase
from ttmesh.launcher.attempt.record import HUNG, AttemptResult
from ttmesh.launcher.attempt.starters import RankExit
from ttmesh.launcher.planning.request import Policy
from ttmesh.states import (
    AttemptEnd,
    GuardianPhase,
    IllegalTransition,
    JobPhase,
    Machine,
    ResetStage,
    ResetStatus,
)
from ttmesh.vocab import Source

# --------------------------------------------------------------------------- the machines


def test_a_machine_moves_only_as_its_table_allows() -> None:
    heard: list[tuple[str, str]] = []
    machine = Machine(
        GuardianPhase.STARTING, states.GUARDIAN_MOVES, "guardian", lambda a, b: heard.append((a, b))
    )
    with pytest.raises(IllegalTransition, match="STARTING -> DONE"):
        machine.change_state(GuardianPhase.DONE)
    assert machine.state is GuardianPhase.STARTING and heard == []
    for phase in ("running", "stopping", "draining", "done"):
        machine.change_state(GuardianPhase(phase))
    assert machine.state is GuardianPhase.DONE
    assert [b for _, b in heard] == ["running", "stopping", "draining", "done"]
    with pytest.raises(IllegalTransition):
        machine.change_state(GuardianPhase.RUNNING)  # nothing leaves DONE


def test_an_illegal_move_is_a_bug_not_a_users_error() -> None:
    """A user's error is one line and exit 2; a wrong move is ttmesh's bug: never a TTMeshError."""
    assert not issubclass(IllegalTransition, TTMeshError)
    view = Machine(JobPhase.READY, states.ATTEMPT_MOVES, "view")
    with pytest.raises(IllegalTransition):
        view.change_state(JobPhase.STARTING)  # readiness only grows
    view.change_state(JobPhase.STOPPING)
    view.change_state(JobPhase.STOPPING)  # the drain's detail changes
    resets = Machine(ResetStage.QUEUED, states.RESET_MOVES, "reset")
    with pytest.raises(IllegalTransition):
        resets.change_state(ResetStage.WAIT_LINKS)  # tt-smi has not run yet
    for stage in (ResetStage.RESETTING, ResetStage.WAIT_PCI, ResetStage.RETRYING):
        resets.change_state(stage)
    resets.change_state(ResetStage.FAILED)
    with pytest.raises(IllegalTransition):
        resets.change_state(ResetStage.DONE)


def test_every_table_here_is_what_production_code_moves_by() -> None:
    """states.py names no machine that nothing drives: each ``*_MOVES`` table is the one
    production code moves its machine by (a test's use alone does not count)."""
    import ast

    root = Path(states.__file__).parent
    used: set[str] = set()  # the names code (not a comment, not a docstring) refers to
    for path in root.rglob("*.py"):
        text = path.read_text()
        if path == Path(states.__file__) or "_MOVES" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
    tables = sorted(name for name in vars(states) if name.endswith("_MOVES"))
    assert tables == ["ATTEMPT_MOVES", "GUARDIAN_MOVES", "RESET_MOVES"]
    assert [name for name in tables if name not in used] == []  # each one, moved by


def test_a_chips_reset_moves_only_as_its_table_allows() -> None:
    """The reset's progress (recovery.reset's tracker) moves each chip through the reset
    machine's door: a stage out of order is ttmesh's bug, said, not shown."""
    from ttmesh.recovery.reset import ResetPlan, _Tracker

    plan = ResetPlan(("a",), ("a", "b"), {"a": "asked", "b": "linked"}, False, True, (), ())
    heard: list[list[tuple[str, str]]] = []
    track = _Tracker(plan, lambda chips: heard.append([(c.asic, c.stage) for c in chips]))
    with pytest.raises(IllegalTransition, match="the reset of a: QUEUED -> WAIT_LINKS"):
        track.set(["a"], ResetStage.WAIT_LINKS, 1)  # tt-smi has not run yet
    for word in ("done", GuardianPhase.DONE):  # equal to ResetStage.DONE as strings, no stage
        with pytest.raises(IllegalTransition, match="is not one of its states"):
            track.set(["a"], word, 1)  # type: ignore[arg-type]
    track.set(["a", "b", "not in the plan"], ResetStage.RESETTING, 1, "tt-smi -r")
    track.set(["b"], ResetStage.WAIT_PCI, 1)
    track.set(["a"], ResetStage.DONE, 1)
    track.set(["b"], ResetStage.FAILED, 1, "gone")
    track.tell()
    assert heard == [[("a", "done"), ("b", "failed")]]
    with pytest.raises(IllegalTransition, match="FAILED -> DONE"):
        track.set(["b"], ResetStage.DONE, 1)  # the reset has ended for it
    assert track.chips["b"].stage is ResetStage.FAILED and track.chips["b"].detail == "gone"


def test_the_words_are_what_output_and_json_always_said() -> None:
    assert [str(p) for p in JobPhase] == [
        "checking fabric", "resetting", "starting", "ready", "running", "stopping",
        "recovering", "restarting", "done",
    ]  # fmt: skip
    assert (
        ResetStage.QUEUED, ResetStage.STOPPING, ResetStage.WAIT_PCI, ResetStatus.NOT_RESET,
        ResetStatus.LINKS_DOWN,
    ) == (
        "queued", "stopping holders", "waiting for PCI", "not reset", "links down",
    )  # fmt: skip
    assert (
        json.dumps([ResetStage.WAIT_HEARTBEAT, ResetStatus.OK]) == '["waiting for heartbeat", "ok"]'
    )
    words = {str(w) for w in states.ChipUnavailable}
    assert words == {"leased", "locked", "held", "dead", "excluded"}
    from ttmesh.launcher.attempt import events

    assert events.JobPhase is JobPhase  # one enum, wherever it is imported from


@pytest.mark.parametrize("end", list(AttemptEnd))
def test_each_end_crosses_the_pipe(end: AttemptEnd) -> None:
    error = TTMeshError("rank 1 x: not found", "check the path", 127)
    result = AttemptResult(
        2, 127, Source.TTMESH, 1, "why", end, error if end is not AttemptEnd.COMPLETED else None,
        exits=[RankExit(1, 0, 127, "x: not found", False, started=False, hint="h")],
    )  # fmt: skip
    back = AttemptResult.from_json(json.loads(json.dumps(result.to_json())))
    assert back.end is end and back.exits == result.exits and back.attempt == 2
    if end is AttemptEnd.COMPLETED:
        assert back.error is None
    else:
        assert back.error is not None and isinstance(back.error, TTMeshError)
        assert (back.error.message, back.error.hint, back.error.code) == (
            error.message, error.hint, error.code,
        )  # fmt: skip
    assert result.error is (None if end is AttemptEnd.COMPLETED else error)  # to_json keeps it
    assert end.restartable == (end in (AttemptEnd.FAILED, AttemptEnd.HUNG))


@pytest.fixture(autouse=True)
def _not_a_subreaper() -> Iterator[None]:
    """An attempt's front makes its process a child subreaper (run_attempt): here that is
    pytest's own process, which must not stay one (orphans of later tests, meant for init to
    reap, would stay its zombies)."""
    yield
    import ctypes

    from ttmesh import procs

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(procs.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) == 0
    procs.reap_all()


# --------------------------------------------------------------------------- plans


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "rt"
    where.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(where))
    return where


def _prepare(root: Path, code: str, **req: Any) -> Any:
    from ttmesh.cli.hosts import open_host as Host
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    request = LaunchRequest(command=[sys.executable, "-c", code], tp_size=2, no_python=True, **req)
    return prepare(request, Host(root))


@pytest.fixture
def run_dir(qb2: Path, runtime: Path) -> Iterator[Any]:
    """A plan's run directory, made as JobRun makes it (and removed after)."""
    from ttmesh.launcher.job.run import write_files
    from ttmesh.runtime import jobs

    made: list[Any] = []

    def make(plan: Any) -> Any:
        where = jobs.create_run_dir(plan.job)
        made.append(where)
        write_files(plan)
        return where

    yield make
    for where in made:
        where.remove()


def test_the_plans_files_are_written_inside_its_run_directory_and_never_through_a_link(
    qb2: Path, run_dir: Any
) -> None:
    from dataclasses import replace

    from ttmesh.launcher.job.run import write_files

    plan = _prepare(qb2, "pass").plan
    where = run_dir(plan)
    written = {p: Path(p).read_text() for p in plan.files}
    assert written == dict(plan.files) and all(Path(p).is_relative_to(where.path) for p in written)
    for outside in (f"{plan.run_dir}/../escaped", f"{plan.run_dir}/mesh/../../escaped", "/tmp/x"):
        with pytest.raises(TTMeshError, match="outside the run directory"):
            write_files(replace(plan, files={outside: "x"}))
    assert not (Path(plan.run_dir).parent / "escaped").exists()
    first = next(iter(plan.files))
    decoy = Path(plan.run_dir, "decoy")
    decoy.write_text("kept")
    Path(first).unlink()
    Path(first).symlink_to(decoy)
    with pytest.raises(OSError):
        write_files(plan)
    assert decoy.read_text() == "kept"


# --------------------------------------------------------------------------- signals


def test_what_each_signal_does() -> None:
    first = signals.react(signal.SIGINT, None, failing=False)
    assert first.stop is not None and not first.kill
    assert (first.stop.code, first.stop.user, first.stop.sends) == (130, True, signal.SIGINT)
    assert "Ctrl-C again" in first.say
    second = signals.react(signal.SIGINT, first.stop, failing=False)
    assert second.kill and second.stop is None and second.say.startswith("second interrupt")
    # Ctrl-C while a failing rank's teardown runs: the user's stop wins, and kills at once.
    during = signals.react(signal.SIGINT, None, failing=True)
    assert during.kill and during.stop is not None and during.stop.code == 130
    term = signals.react(signal.SIGTERM, None, failing=False)
    assert (
        term.stop is not None
        and term.stop.code == 143
        and term.stop.reason == ("terminated (SIGTERM)")
    )
    assert signals.react(signal.SIGTERM, term.stop, failing=False) == signals.Reaction()
    peer = signals.react(signals.PEER_STOP, None, failing=False)
    assert peer.stop is not None and not peer.stop.user and peer.say == ""
    stops = [first.stop, during.stop, term.stop, peer.stop]
    assert {s.end for s in stops} == {AttemptEnd.STOPPED}  # for good: no restart
    assert signals.react(signals.PEER_STOP, None, failing=True) == signals.Reaction()
    assert signals.react(signal.SIGUSR1, None, failing=False).forward


def test_the_wakeups_hear_signals_and_give_the_process_back() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    wakeups = signals.Wakeups()
    wakeups.install()
    try:
        assert signal.getsignal(signal.SIGUSR2) is not before
        os.kill(os.getpid(), signal.SIGUSR2)
        assert signal.SIGUSR2 in wakeups.heard()
        assert wakeups.heard() == []
    finally:
        wakeups.restore()
    assert signal.getsignal(signal.SIGUSR2) is before


# --------------------------------------------------------------------------- readiness


def test_ready_by_pattern_file_and_timeout(qb2: Path, runtime: Path, run_dir: Any) -> None:
    prepared = _prepare(qb2, "pass", policy=Policy(ready_pattern="model loaded", ready_timeout=5.0))
    plan = prepared.plan
    run_dir(plan)
    ready = Readiness(plan, started=100.0)
    assert ready.watched
    ready.on_line(0, "loading ...")
    ready.on_line(0, "the model loaded in 3 s")
    ready.on_line(-1, "model loaded")  # mpirun's own line is no rank's
    assert ready.ready == {0}
    assert ready.overdue({0, 1}, now=104.0) is None
    line, stop = ready.overdue({0, 1}, now=105.0) or ("", None)
    assert line == "rank 1 not ready after 5 s: treating the job as hung in bring-up"
    assert stop is not None and (stop.code, stop.end.restartable) == (HUNG, True)
    assert stop.end is AttemptEnd.HUNG
    Path(plan.ranks[1].env["TTMESH_READY_FILE"]).touch()
    assert ready.overdue({0, 1}, now=200.0) is None and ready.ready == {0, 1}


def test_what_a_person_sees_of_an_attempt() -> None:
    running, none = {0, 1}, set[int]()
    assert job_phase(GuardianPhase.STARTING, False, none, none, none, False) is JobPhase.STARTING
    assert job_phase(GuardianPhase.RUNNING, False, running, none, {0}, False) is JobPhase.STARTING
    assert (
        job_phase(GuardianPhase.RUNNING, False, running, none, running, False) is JobPhase.RUNNING
    )
    assert (
        job_phase(GuardianPhase.RUNNING, False, running, none, running, True) is JobPhase.STARTING
    )
    assert (
        job_phase(GuardianPhase.RUNNING, False, running, running, running, True) is JobPhase.READY
    )
    assert job_phase(GuardianPhase.RUNNING, True, running, none, running, True) is JobPhase.STOPPING
    assert job_phase(GuardianPhase.DRAINING, False, none, none, running, False) is None


# --------------------------------------------------------------------------- fabric marks


class _Host:
    def __init__(self) -> None:
        self.heard: list[tuple[str, Any]] = []

    def workers_started(self, workers: Any) -> None:
        self.heard.append(("started", workers))

    def fabric_opened(self, marks: Any, owner: str, supervisor: int) -> None:
        self.heard.append(("opened", (marks, owner, supervisor)))

    def worker_ended(self, pid: int, clean: bool) -> None:
        self.heard.append(("ended", (pid, clean)))


class _Starter:
    def __init__(self, pids: dict[int, int], known: bool = True) -> None:
        self.pids = pids
        self._known = known

    def discover(self) -> None:
        pass

    def known(self) -> bool:
        return self._known


def test_fabric_marks(qb2: Path, runtime: Path, run_dir: Any) -> None:
    plan = _prepare(qb2, "pass").plan
    run_dir(plan)
    host = _Host()
    marks = FabricMarks(plan, host, guardian=77)  # type: ignore[arg-type]
    assert not marks.register(_Starter({0: 10}, known=False), {0, 1})  # 1's PID not known yet
    assert marks.register(_Starter({0: 10, 1: 11}), {0, 1})  # type: ignore[arg-type]
    assert not marks.register(_Starter({0: 10, 1: 11}), {0, 1})  # type: ignore[arg-type]
    chips = [list(r.chips) for r in plan.ranks]
    assert host.heard == [
        ("started", [(chips[0], 10), (chips[1], 11)]),
        ("opened", ([], plan.job, 77)),
    ]
    assert marks.fabric == set()  # isolated ranks join no chips
    Path(plan.ranks[1].env["TTMESH_FABRIC_FILE"]).touch()  # rank 1 brought the fabric up
    marks.poll({0, 1}, {0: 10, 1: 11})
    assert marks.fabric == {1} and host.heard[-1] == (
        "opened",
        ([(plan.all_chips(), 11)], plan.job, 77),
    )
    marks.ended(RankExit(0, 10, 1, "exit 1", False), {0: 10, 1: 11})  # no fabric: no mark ends
    marks.ended(RankExit(1, 11, 1, "exit 1", False), {0: 10, 1: 11})
    assert host.heard[-1] == ("ended", (11, False))


# --------------------------------------------------------------------------- the record


def test_the_verdict(qb2: Path, runtime: Path) -> None:
    plan = _prepare(qb2, "pass").plan
    base = AttemptResult(0, 0, Source.WORKER, None, "every rank succeeded", AttemptEnd.COMPLETED)

    def tail(owner: int, stream: str) -> list[str]:
        return [f"{owner} {stream} {i}" for i in range(12)]

    ok = record.verdict(plan, base, None, None, None, tail)
    assert ok is base
    user = signals.Stop("interrupted (SIGINT)", 130, user=True)
    stopped = record.verdict(plan, base, user, None, None, tail)
    assert (stopped.end, stopped.code, stopped.source) == (AttemptEnd.STOPPED, 130, "ttmesh")
    # A stop's end is the attempt's, and says all the rest: a restart, a refusal's quiet.
    for end in (AttemptEnd.HUNG, AttemptEnd.FAILED, AttemptEnd.REFUSED, AttemptEnd.RESET_ELSEWHERE):
        stop = signals.Stop("why", 9, end)
        assert record.verdict(plan, base, stop, None, None, tail).end is end
        assert stop.quiet == (end is AttemptEnd.REFUSED)
    failed = RankExit(1, 11, 3, "exited with code 3", False)
    result = record.verdict(plan, base, None, failed, None, tail)
    assert (result.end, result.code, result.rank, result.reason) == (
        AttemptEnd.FAILED, 3, 1, "rank 1 exited with code 3",
    )  # fmt: skip
    assert result.stderr_tail == [f"1 stderr {i}" for i in range(2, 12)]
    never = RankExit(1, 0, 127, "x: command not found", False, started=False, hint="check PATH")
    unstarted = record.verdict(plan, base, None, never, None, tail)
    assert unstarted.end is AttemptEnd.UNSTARTED and unstarted.error is not None
    assert unstarted.error.code == 127 and unstarted.error.hint == "check PATH"
    assert (
        unstarted.error.message.startswith("rank 1 (")
        and "x: command not found" in unstarted.reason
    )
    mpirun = record.verdict(plan, base, None, None, "no such file", tail)
    assert mpirun.end is AttemptEnd.LAUNCHER_FAILED and mpirun.code == 2
    frozen = record.refused(result, TTMeshError("chip x is dead", "reset it", 3))
    assert (frozen.end, frozen.code, frozen.reason) == (
        AttemptEnd.REFUSED, 3, "refused: chip x is dead (reset it)",
    )  # fmt: skip


def test_the_job_record_learns_the_ranks(qb2: Path, runtime: Path) -> None:
    from ttmesh.runtime import jobs

    plan = _prepare(qb2, "pass").plan
    jobs.write({"job": plan.job, "pid": os.getpid(), "ranks": []})
    record.write_record(plan, 4242, 1, {0: 10})
    (written,) = [r for r in jobs.every() if r["job"] == plan.job]
    assert (written["guardian"], written["attempt"]) == (4242, 1)
    assert [r["pid"] for r in written["ranks"]] == [10, None]
    jobs.remove(plan.job)


# --------------------------------------------------------------------------- the view


def test_the_view_hears_each_change_once_and_never_back() -> None:
    from ttmesh.launcher.attempt.view import AttemptView

    heard = _View()
    view = AttemptView(heard)  # type: ignore[arg-type]
    view.line(0, "x" * 600)
    view.report({0: 10}, set(), JobPhase.STARTING, "")
    view.report({0: 10, 1: 11}, {0}, JobPhase.STARTING, "")  # the same phase: not said again
    view.report({0: 10, 1: 11}, {0, 1}, JobPhase.READY, "")
    assert heard.phases == ["starting", "ready"] and heard.started == [0, 1]
    assert heard.ready == [0, 1] and heard.heard_lines == [{0: "x" * 500}]
    with pytest.raises(IllegalTransition):
        view.report({0: 10, 1: 11}, {0, 1}, JobPhase.STARTING, "")
    view.report({0: 10, 1: 11}, {0, 1}, JobPhase.STOPPING, "draining, 5 s left")
    view.report({0: 10, 1: 11}, {0, 1}, JobPhase.STOPPING, "draining, 4 s left")
    assert heard.phases == ["starting", "ready", "stopping", "stopping"]


def test_what_a_drain_says() -> None:
    import time

    from ttmesh.launcher.attempt.view import DrainWords

    said: list[str] = []
    drain = DrainWords(said.append)
    deadline = time.monotonic() + 4.95
    drain.draining(deadline, 2)
    drain.draining(deadline, 1)  # within DRAIN_SAY, the same wait: only the view's detail
    drain.draining(deadline, 0, 1)  # from ranks to their leftovers: said at once
    drain.grace_over(1)
    assert said == [
        "draining, 5 s left (2 ranks still running)",
        "draining, 5 s left (1 leftover process)",
        "grace over: SIGKILL of 1 process",
    ]
    assert drain.detail == "grace over: SIGKILL of 1 process"


# --------------------------------------------------------------------------- the guardian


class _View:
    """An observer that keeps what it hears."""

    def __init__(self) -> None:
        self.phases: list[str] = []
        self.exited: list[tuple[int, int]] = []
        self.started: list[int] = []
        self.ready: list[int] = []
        self.heard_lines: list[dict[int, str]] = []
        self.data = b""

    def phase(self, phase: JobPhase, detail: str = "") -> None:
        self.phases.append(str(phase))

    def attempt(self, attempt: int) -> None:
        pass

    def rank_started(self, rank: int, pid: int) -> None:
        self.started.append(rank)

    def rank_ready(self, rank: int) -> None:
        self.ready.append(rank)

    def rank_exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        self.exited.append((rank, code))

    def lines(self, last: dict[int, str]) -> None:
        self.heard_lines.append(last)

    def output(self, fd: int, data: bytes) -> None:
        self.data += data

    def tick(self) -> None:
        pass


FAILS_AS_RANK_1 = (
    "import os, sys, time\n"
    "if os.environ['RANK'] == '1':\n"
    "    print('rank 1 gives up', file=sys.stderr, flush=True); sys.exit(3)\n"
    "time.sleep(60)\n"
)


def test_the_guardian_in_process(qb2: Path, runtime: Path, run_dir: Any) -> None:
    """Two ranks; rank 1 fails with 3: rank 0 is stopped, the attempt ends FAILED with rank
    1's code, and the process is given back as it was (its signal handling)."""
    from ttmesh.cli.hosts import open_host as Host
    from ttmesh.launcher.attempt.guardian import Guardian, Options

    prepared = _prepare(qb2, FAILS_AS_RANK_1, policy=Policy(grace=5.0))
    plan = prepared.plan
    run_dir(plan)
    alive_r, alive_w = os.pipe()
    view = _View()
    before = signal.getsignal(signal.SIGINT)
    try:
        guardian = Guardian(plan, 0, Options(), dict(os.environ), alive_r, Host(qb2), view)
        result = guardian.run(own_group=False)
    finally:
        os.close(alive_r)
        os.close(alive_w)
    assert signal.getsignal(signal.SIGINT) is before
    assert (result.end, result.code, result.rank, result.source) == (
        AttemptEnd.FAILED, 3, 1, "worker",
    )  # fmt: skip
    assert result.reason == "rank 1 exited with code 3"
    assert "rank 1 gives up" in result.stderr_tail
    assert sorted(view.exited) == [(0, 128 + signal.SIGTERM), (1, 3)]  # 0 stopped by ttmesh
    assert view.phases[0] == "starting" and view.phases[-1] == "stopping"
    assert guardian.phase is GuardianPhase.DONE
    # Its phase has one door, its machine's, and nothing leaves DONE through it.
    assert guardian.phases.allowed is states.GUARDIAN_MOVES
    with pytest.raises(IllegalTransition, match="the guardian: DONE -> RUNNING"):
        guardian.phases.change_state(GuardianPhase.RUNNING)
    with pytest.raises(AttributeError):
        guardian.phase = GuardianPhase.RUNNING  # type: ignore[misc]


# --------------------------------------------------------------------------- the job


def test_the_job_ends_with_the_failing_ranks_code(
    qb2: Path, runtime: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.job.run import execute

    prepared = _prepare(qb2, FAILS_AS_RANK_1)
    assert execute(prepared, Options()) == 3
    err = capfd.readouterr().err
    assert "exit 3: rank 1's exit code" in err


def test_a_rank_that_never_started_is_a_refusal(qb2: Path, runtime: Path, tmp_path: Path) -> None:
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.job.run import execute
    from ttmesh.runtime import jobs

    prepared = _prepare(qb2, "pass")
    missing = str(tmp_path / "no-such-program")
    ranks = [replace(r, argv=(missing,)) for r in prepared.plan.ranks]
    prepared = replace(prepared, plan=replace(prepared.plan, ranks=ranks))
    with pytest.raises(TTMeshError) as info:
        execute(prepared, Options())
    assert info.value.code == 127 and "rank 0" in info.value.message
    assert missing in str(info.value)
    assert not [r for r in jobs.running() if r["job"] == prepared.plan.job]


class _Watch:
    """The heartbeats, read at once: chip 'x' frozen."""

    def __init__(self) -> None:
        self.states = {"x": "frozen"}

    def step(self) -> float | None:
        return None

    def known(self) -> dict[str, str]:
        return self.states


def test_a_frozen_chip_found_as_the_ranks_run_refuses_the_attempt(
    qb2: Path, runtime: Path, run_dir: Any
) -> None:
    """The deferred heartbeat check (Liveness) refuses while the ranks run: they are stopped
    and the attempt ends REFUSED, its error the refusal, whatever the ranks did."""
    from ttmesh.cli.hosts import open_host as Host
    from ttmesh.launcher.attempt.guardian import Guardian, Options
    from ttmesh.launcher.planning.liveness import Liveness

    plan = _prepare(qb2, "import time; time.sleep(60)").plan
    run_dir(plan)
    frozen = TTMeshError("chip x is dead: its heartbeat is frozen", "ttmesh reset", 3)
    liveness = Liveness(_Watch(), lambda states: frozen)  # type: ignore[arg-type]
    alive_r, alive_w = os.pipe()
    try:
        guardian = Guardian(
            plan, 0, Options(), dict(os.environ), alive_r, Host(qb2), None, liveness
        )
        result = guardian.run(own_group=False)
    finally:
        os.close(alive_r)
        os.close(alive_w)
    assert (result.end, result.code, result.error) == (AttemptEnd.REFUSED, 3, frozen)
    assert result.reason == "refused: chip x is dead: its heartbeat is frozen (ttmesh reset)"
    assert all(e.stopped for e in result.exits) and len(result.exits) == 2


def test_every_attempt_end_has_one_answer_and_only_failures_restart() -> None:
    """job.run decides recover, restart or refuse from a table over AttemptEnd, the same for
    every mode (the modes differ in how they recover, job.hostset): a new end without a row,
    or a row that restarts what AttemptEnd says no restart helps, fails here."""
    from ttmesh.launcher.job.run import AFTER, After

    assert set(AFTER) == set(AttemptEnd)
    assert {e for e, a in AFTER.items() if a is After.RESTART} == {
        e for e in AttemptEnd if e.restartable
    }
    assert {e for e, a in AFTER.items() if a in (After.REFUSE, After.NOT_RUN, After.LEAVE)} <= {
        e for e in AttemptEnd if e.interrupted
    }


def test_each_mode_is_one_kind_of_host_set(tmp_path: Path) -> None:
    """One host, c10d peers and a mesh over hosts answer the same protocol (job.hostset.of)."""
    from types import SimpleNamespace

    from ttmesh.launcher.job import hostset
    from ttmesh.launcher.job.repair import Recovery

    def prepared(hosts: list[str]) -> Any:
        return SimpleNamespace(plan=SimpleNamespace(hosts=hosts))

    state: Any = SimpleNamespace()  # (the job's own; no question is asked here)
    one = hostset.of(prepared([]), state, Recovery(), None, None)
    mesh = hostset.of(prepared(["a", "b"]), state, Recovery(), None, None)
    c10d = hostset.of(prepared([]), state, Recovery(), None, peers=SimpleNamespace())  # type: ignore[arg-type]
    assert [type(h).__name__ for h in (one, mesh, c10d)] == [
        "OneHost",
        "MeshOverHosts",
        "C10dHosts",
    ]
    assert one.leases_here() and c10d.leases_here() and not mesh.leases_here()
    for h in (one, mesh, c10d):
        for name in (
            "before_start",
            "agree",
            "watch",
            "started",
            "refused",
            "ended",
            "recover",
            "close",
        ):
            assert callable(getattr(h, name)), (h, name)


def test_a_plan_is_not_changed_once_made(qb2: Path) -> None:
    """Planning's values are read, never written, by the stages after it: the options, the
    launch and its request, the plan and each rank's (its environment too). A stage with more to
    say makes a new plan (dataclasses.replace), so a write anywhere after planning fails here
    and in every test that runs a launch."""
    import dataclasses

    from ttmesh.launcher.planning.options import Launch, LaunchOptions
    from ttmesh.launcher.planning.plan import LaunchPlan, RankPlan

    prepared = _prepare(qb2, "pass")
    plan = prepared.plan
    assert isinstance(plan, LaunchPlan) and isinstance(plan.ranks[0], RankPlan)
    for value, name in (
        (plan, "job"),
        (plan, "notes"),
        (plan, "host_view"),
        (plan.ranks[0], "env"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
    with pytest.raises(TypeError):
        plan.ranks[0].env["RANK"] = "7"  # type: ignore[index]
    again = dataclasses.replace(plan, report=plan.report.noted("a later stage's note"))
    assert again.report.notes[-1] == "a later stage's note"
    assert "a later stage's note" not in plan.report.notes
    launch = Launch.from_options(LaunchOptions(host=prepared.inv.host, command=("true",)))
    for value in (launch, launch.options, launch.request):
        with pytest.raises((dataclasses.FrozenInstanceError, AttributeError)):
            value.job = "other"  # type: ignore[misc, union-attr]


def test_no_stage_value_is_changed_by_the_job(qb2: Path, runtime: Path, tmp_path: Path) -> None:
    """The stages' values after planning are frozen too: the prepared launch and the job's
    recovery policy. What a job learns as it runs (its chips as a reset renumbered them, the
    resets it ran, the warnings said once, the heartbeats and tt-metal's verdict taken once) is
    the job's own. A whole launch runs on them here: links down that --auto-reset resets before
    the start, the heartbeats read as the ranks start, a failing attempt whose chips are reset
    (--reset-on-failure) and a restart; the values it was given are the same after it."""
    import dataclasses
    import json

    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.job.repair import Recovery
    from ttmesh.launcher.job.run import execute
    from ttmesh.launcher.planning.logspec import LogSpec
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest
    from ttmesh.sim import faults

    host = open_host(qb2)
    faults.link_down(host, "0000:01:00.0", "0000:03:00.0")
    fails_once = (  # rank 0 fails the first attempt; every rank passes the next
        "import os, sys; first = os.environ['TORCHELASTIC_RESTART_COUNT'] == '0'; "
        "sys.exit(3 if first and os.environ['RANK'] == '0' else 0)"
    )
    request = LaunchRequest(
        command=[sys.executable, "-c", fails_once], tp_size=4, no_python=True,
        policy=Policy(max_restarts=1, grace=1.0),
    )  # fmt: skip
    prepared = prepare(request, host, repairable=True, defer_liveness=True)
    recovery = Recovery(auto_reset=True, reset_on_failure=True)
    given = {f.name: getattr(prepared, f.name) for f in dataclasses.fields(prepared)}
    watch, report = prepared.plan.policy, prepared.plan.report  # the plan's policy: the request's
    assert watch is prepared.request.policy
    watched, reported = dataclasses.replace(watch), dataclasses.replace(report)
    policy = dataclasses.replace(recovery)
    options = Options(ranks_filter=frozenset({0, 1}))
    shown = dataclasses.replace(options)
    ended = AttemptResult(0, 3, Source.WORKER, 0, "rank 0 exited with code 3", AttemptEnd.FAILED)
    for value, name in (
        (prepared, "plan"),
        (prepared, "inv"),
        (prepared, "liveness"),
        (prepared, "metal"),
        (prepared, "hosts_not_ready"),
        (prepared, "beats"),
        (prepared.request, "job"),
        (watch, "grace"),
        (watch, "max_restarts"),
        (report, "notes"),
        (report, "passed_over"),
        (report, "checks"),
        (recovery, "own_pids"),
        (recovery, "preflight"),
        (options, "observer"),
        (options, "checklist_drawn"),
        (options, "keep"),
        (LogSpec(), "run_dir"),  # the job's log directory, made: a new spec
        (ended, "reason"),
        (ended, "diagnosis"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
    with pytest.raises(TypeError):  # the heartbeats planning read: read-only, as the rest
        prepared.beats["0"] = "alive"  # type: ignore[index]
    with pytest.raises((TypeError, AttributeError)):  # what --dry-run says: read-only too
        report.notes.append("a note")  # type: ignore[attr-defined]
    summary = tmp_path / "summary.json"
    code = execute(prepared, options, str(summary), restart_backoff=0.0, recovery=recovery)
    assert code == 0
    facts = json.loads(summary.read_text())
    assert [r["when"] for r in facts["resets"]] == ["before the start", "after an attempt"]
    assert all(r["recovered"] for r in facts["resets"]), facts["resets"]
    assert len(facts["attempts"]) == 2
    assert {f.name: getattr(prepared, f.name) for f in dataclasses.fields(prepared)} == given
    assert all(getattr(prepared, name) is value for name, value in given.items())
    assert prepared.plan.policy is watch and watch == watched and watch.max_restarts == 1
    assert prepared.plan.report is report and report == reported
    assert recovery == policy and recovery.own_pids == ()
    assert options == shown and options.keep is None  # the job's own logs are the job's


@pytest.mark.parametrize("device", ["tpu", "cpu"])
def test_a_servers_spec_is_built_whole_and_frozen(qb2: Path, runtime: Path, device: str) -> None:
    """A server's spec (its address, timeouts, notes, findings, environment) is built whole by
    planning, on chips or chipless (stock SGLang on --device cpu: its note is the plan's), and
    nothing after planning writes it: its fields and its lists cannot be changed."""
    import dataclasses
    import socket

    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest
    from ttmesh.launcher.serving import profiles
    from ttmesh.launcher.serving.args import ServerArgs

    profile = profiles.named("sglang-torchtpu" if device == "tpu" else "sglang")
    with socket.socket() as taken:  # a port in use: a dry run says so in the spec's notes
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        words = ["--model-path", "m", "--device", device, "--port", port]
        args = profile.read(ServerArgs("sglang.launch_server", words))
        request = LaunchRequest(
            command=[sys.executable, "-m", "sglang.launch_server", *words], no_python=True,
            profile=profile, server_args=args, policy=Policy(health_interval=5.0, probe_interval=30.0),
            tp_size=1 if device == "tpu" else None,
        )  # fmt: skip
        prepared = prepare(request, open_host(qb2), dry_run=True, ask_metal=False)
    serving = prepared.plan.serving
    assert serving is not None and serving.port == int(port)
    assert (serving.health_interval, serving.probe_interval) == (5.0, 30.0)
    assert any("(a launch now is refused)" in n for n in serving.notes), serving.notes
    assert prepared.plan.chipless == (device == "cpu")
    if device == "cpu":
        assert any("none is chosen, leased, checked or recovered" in n for n in serving.notes)
    for name in ("notes", "findings", "port", "host", "ready_timeout", "health_interval"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(serving, name, None)
    with pytest.raises((TypeError, AttributeError)):
        serving.notes.append("a note after planning")  # type: ignore[attr-defined]
    with pytest.raises((TypeError, AttributeError)):
        serving.findings.append(serving.findings[0] if serving.findings else None)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        serving.env["X"] = "1"  # type: ignore[index]
