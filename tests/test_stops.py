"""A stop is always honoured (issue 19): no pattern, no flood of output and no stopped process
makes ttmesh deaf to Ctrl-C, SIGTERM or ``ttmesh stop``; a rank that never started ends the job
at once with one line; a drain says what it does.

Every wait here awaits an event (a line, a file, a process state); timeouts are hang guards.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, alive, run_cli, start_launch, wait_for, worker

from ttmesh.runtime import jobs

HANG = 30.0  # seconds: a hang guard, never a timed assertion
CATASTROPHIC = "(a+)+$"  # exponential in Python's re against "aaaa...a!"
HOSTILE_LINE = "a" * 48 + "!"
# Output as a user's shell has it: this machine sets PYTHONUNBUFFERED=1 everywhere (an empty value
# is unset for Python).
USERS_SHELL = {"PYTHONUNBUFFERED": ""}


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        me = psutil.Process(pid)
        return [me, *me.children(recursive=True)]
    return []


@contextlib.contextmanager
def _cleanup(proc: subprocess.Popen):
    """Whatever a test leaves running (a guardian spinning in a regex on a broken build, a
    stopped ttmesh) is continued and killed, the whole tree."""
    try:
        yield
    finally:
        tree = _tree(proc.pid)
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
                p.kill()
        with contextlib.suppress(Exception):
            proc.communicate(timeout=HANG)


def _read_until(stream, needle: str, seen: list[str], timeout: float = HANG) -> bool:
    """Read lines of ``stream`` until one holds ``needle`` (True) or the guard passes."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                continue
            line = stream.readline()
            if not line:
                return False
            seen.append(line)
            if needle in line:
                return True
    return False


# --------------------------------------------------------------------------- patterns


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_backtracking_ready_pattern_leaves_the_job_stoppable(
    qb2: Path, runtime: Path, sig: int
) -> None:
    """``(a+)+$`` against ``aaaa...a!`` takes Python's re longer than the universe; the guardian
    matched every line with it and, meanwhile, heard no signal. Matched in linear time now: the
    line is shown and the stop is honoured at once."""
    proc = start_launch(
        qb2, "--tp-size", "1", "--job-id", f"redos-{os.getpid()}-{sig}",
        "--ready-pattern", CATASTROPHIC, *worker(f"say={HOSTILE_LINE}"),
        env=USERS_SHELL,
    )  # fmt: skip
    seen: list[str] = []
    with _cleanup(proc):
        assert proc.stdout is not None
        shown = _read_until(proc.stdout, HOSTILE_LINE, seen)
        proc.send_signal(sig)
        try:
            _out, err = proc.communicate(timeout=HANG)
        except subprocess.TimeoutExpired:
            pytest.fail("the guardian ignored the stop (still matching the line?)")
    assert shown, "the guardian never got past the line: " + "".join(seen)
    assert proc.returncode == 128 + sig, err
    # ttmesh's own lines: a rank's KeyboardInterrupt (it gets the SIGINT, as under torchrun) is
    # the rank's, prefixed.
    assert not [line for line in err.splitlines() if "Traceback" in line and line[:2] != "[r"]


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(ready)\1", "backreference"),
        (r"(?P<w>ok)(?P=w)", "backreference"),
        (r"ready(?=:)", "lookahead and lookbehind"),
        (r"(?<!not )ready", "lookahead and lookbehind"),
        (r"a++", "possessive"),
        (r"(?>ready)", "atomic"),
        (r"ready\Z", r"\z"),
    ],
)
def test_a_pattern_re2_cannot_run_is_refused_at_parse_time(
    qb2: Path, pattern: str, why: str
) -> None:
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--ready-pattern", pattern,
                  *worker("exit=0"))  # fmt: skip
    assert res.code == 2, res.err
    lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host: ")]
    assert len(lines) == 1, res.err
    assert lines[0].startswith(f"ttmesh: --ready-pattern {shlex.quote(pattern)}: "), res.err
    assert why in lines[0], res.err


def _profile(tmp_path: Path, model: str) -> dict[str, str]:
    """A user profile (TTMESH_PROFILES) for stock SGLang whose one rule matches the model."""
    directory = tmp_path / "profiles"
    directory.mkdir()
    (directory / "hostile.yaml").write_text(
        "name: hostile\n"
        "title: a profile with a model rule\n"
        "recognise: {program: sglang.launch_server}\n"
        "flags: sglang\n"
        "priority: 100\n"
        "chips: none\n"
        "ready: {http: /health}\n"
        "rules:\n"
        "  - id: model-rule\n"
        "    severity: warning\n"
        f"    when: [{{model: '{model}'}}]\n"
        "    check: {flag: --tp-size}\n"
        "    message: a model the rule knows\n"
    )
    return {"PYTHONPATH": str(REPO / "tests" / "fakes"), "TTMESH_PROFILES": str(directory)}


def test_a_profiles_model_pattern_is_matched_in_linear_time(qb2: Path, tmp_path: Path) -> None:
    """A profile's ``model:`` rule is matched in the launching ttmesh, before anything starts:
    a backtracking pattern there hung it as deaf to Ctrl-C as the guardian."""
    env = _profile(tmp_path, CATASTROPHIC)
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", HOSTILE_LINE]
    try:
        res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *argv, env=env,
                      timeout=HANG)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the profile's model pattern hung ttmesh")
    assert res.code == 0, res.err


def test_a_profiles_model_pattern_re2_cannot_run_is_refused(qb2: Path, tmp_path: Path) -> None:
    env = _profile(tmp_path, r"(qwen)\1")
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", "qwenqwen"]
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--", *argv, env=env)
    assert res.code == 2, res.err
    lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host: ")]
    assert len(lines) == 1 and "Traceback" not in res.err, res.err
    assert "hostile.yaml: rule model-rule: model pattern" in lines[0], res.err
    assert "backreference" in lines[0], res.err


# --------------------------------------------------------------------------- stopped processes


def _state(pid: int) -> str | None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
    return None


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and await it stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: _state(pid) == "T", timeout=HANG, what=f"pid {pid} stopped")


def _guardian(front: int) -> int:
    found: list[int] = []

    def known() -> bool:
        with contextlib.suppress(psutil.Error):
            found[:] = [c.pid for c in psutil.Process(front).children()]
        return bool(found)

    wait_for(known, timeout=HANG, what="the guardian")
    return found[0]


def _job(qb2: Path, tmp_path: Path, name: str, *actions: str, grace: str = "300"):
    """A one-rank job whose worker wrote its pid; (ttmesh, job id, the worker's pid)."""
    job = f"{name}-{os.getpid()}"
    proc = start_launch(qb2, "--tp-size", "1", "--grace", grace, "--job-id", job,
                        *worker(f"pids={tmp_path}", *actions), env=USERS_SHELL)  # fmt: skip
    wait_for(lambda: (tmp_path / "rank0.pid").exists(), timeout=HANG, what="the worker")
    return proc, job, int((tmp_path / "rank0.pid").read_text())


def _status(job: str) -> str | None:
    record = next((r for r in jobs.every() if r["job"] == job), None)
    return record.get("status") if record else None


def test_ttmesh_stop_of_a_stopped_ttmesh_is_honoured(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    """The issue's case exactly: ``kill -STOP`` ttmesh, ``ttmesh stop JOB``, and the rank goes on
    to end by itself; ``kill -CONT`` after that. The SIGTERM waited, pending, in the stopped
    ttmesh, and the job exited 0 "every rank succeeded". ``ttmesh stop`` continues a stopped
    ttmesh now (as a shell's kill does a stopped job): the job ends as stopped."""
    done = tmp_path / "done"
    proc, job, rank = _job(qb2, tmp_path, "stopped", f"await={done}", "exit=0")
    with _cleanup(proc):
        _stop(proc.pid)
        stop = run_cli("stop", job, "--wait", "0")
        assert stop.code == 0, stop.err
        done.touch()  # the rank may end by itself now: ttmesh was told to stop it first
        wait_for(lambda: not alive(rank), timeout=HANG, what="the rank's end")
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        _out, err = proc.communicate(timeout=HANG)
    assert f"pid {proc.pid} was stopped (SIGSTOP): continued it" in stop.out, stop.out
    assert proc.returncode == 143, err
    assert _status(job) == "terminated (SIGTERM)"


def test_a_stop_a_stopped_ttmesh_could_not_act_on_is_said(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    """SIGTERM straight to a stopped ttmesh (nothing continues it) and every rank ends by itself
    before ``kill -CONT``: nothing is left to stop, and ttmesh says so rather than drop it."""
    done = tmp_path / "done"
    proc, job, rank = _job(qb2, tmp_path, "dropped", f"await={done}", "exit=0")
    with _cleanup(proc):
        guardian = _guardian(proc.pid)
        _stop(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        done.touch()
        # The rank ends and the guardian makes its verdict, then waits for ttmesh (stopped) to
        # take it over.
        wait_for(lambda: not alive(rank), timeout=HANG, what="the rank's end")
        wait_for(lambda: not psutil.Process(guardian).children(), timeout=HANG, what="the drain")
        os.kill(proc.pid, signal.SIGCONT)
        _out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, err
    assert (
        "ttmesh: SIGTERM (sent while ttmesh was stopped) came after every rank had ended: "
        "nothing was left to stop"
    ) in err, err
    assert _status(job) == "every rank succeeded"


@pytest.mark.parametrize("how", ["sigterm", "ttmesh stop"])
def test_a_stop_reaches_a_stopped_guardian(
    qb2: Path, runtime: Path, tmp_path: Path, how: str
) -> None:
    """The guardian SIGSTOPped: the stop ttmesh forwarded waited in it for ever (the job ran on,
    ``ttmesh stop`` gave up after --wait). ttmesh continues it after forwarding a stop."""
    proc, job, rank = _job(qb2, tmp_path, "guardian-stopped")
    with _cleanup(proc):
        guardian = _guardian(proc.pid)
        _stop(guardian)
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            stop = run_cli("stop", job, "--wait", str(HANG))
            assert stop.code == 0, stop.err + stop.out
        _out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 143, err
    assert f"the supervisor (pid {guardian}) was stopped (SIGSTOP): continued it" in err, err
    assert not alive(rank)


def test_a_stopped_rank_handles_its_sigterm_within_the_grace(
    qb2: Path, runtime: Path, tmp_path: Path
) -> None:
    """A rank SIGSTOPped when the job is stopped sat on its SIGTERM until the grace ran out and
    SIGKILL came: it is continued right after its SIGTERM now, and handles it."""
    proc, _job_id, rank = _job(qb2, tmp_path, "rank-stopped", "on-term=7")
    with _cleanup(proc):
        _stop(rank)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=HANG)  # the grace (300 s) is not waited out
    assert proc.returncode == 143, err
    assert (tmp_path / "rank0.term").exists(), "the rank never handled its SIGTERM"


# --------------------------------------------------------------------------- what a drain says

DRAINING = re.compile(r"^ttmesh: draining, (?:\d+|\d\.\d) s left \((.+)\)$", re.M)
GRACE_OVER = "ttmesh: grace over: SIGKILL of {} processes"


def test_a_drain_says_what_it_waits_for_and_what_it_kills(qb2: Path, tmp_path: Path) -> None:
    """A failure stops the other ranks; two of them ignore SIGTERM. The grace used to pass in
    silence: now the drain says it began (with how long is left and for what), then what the
    end of the grace killed, before the job's end."""
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "3", "--grace", "1",
        *worker("ignore-term", f"pids={tmp_path}", f"await={tmp_path / 'rank1.pid'}",
                f"await={tmp_path / 'rank2.pid'}", "fail-rank=0:3"),
        env=USERS_SHELL, timeout=HANG * 2,
    )  # fmt: skip
    assert res.code == 3, res.err
    lines = res.err.splitlines()
    draining = [i for i, ln in enumerate(lines) if DRAINING.match(ln)]
    assert draining, res.err
    assert DRAINING.match(lines[draining[0]]).group(1) == "2 ranks still running", res.err
    over = lines.index(GRACE_OVER.format(2))
    assert draining[0] < over < lines.index("ttmesh: exit 3: rank 0's exit code"), res.err


def test_a_drain_of_leftovers_says_so(qb2: Path, tmp_path: Path) -> None:
    """Every rank succeeded, a process one started lingers: it is swept with the same words."""
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--grace", "30",
                  *worker(f"child={tmp_path}", "exit=0"), env=USERS_SHELL, timeout=HANG * 2)  # fmt: skip
    assert res.code == 0, res.err
    found = DRAINING.findall(res.err)
    assert found == ["1 leftover process"], res.err
