"""A stop is always honoured (issue 19): no pattern, no flood of output and no stopped process
makes ttmesh deaf to Ctrl-C, SIGTERM or ``ttmesh stop``; a rank that never started ends the job
at once with one line; a drain says what it does.

Every wait here awaits an event (a line, a file, a process state); timeouts are hang guards.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, run_cli, start_launch, worker

HANG = 30.0  # seconds: a hang guard, never a timed assertion
CATASTROPHIC = "(a+)+$"  # exponential in Python's re against "aaaa...a!"
HOSTILE_LINE = "a" * 48 + "!"
# Output as a user's shell has it: this machine sets PYTHONUNBUFFERED=1 everywhere (an empty value
# is unset for Python).
USERS_SHELL = {"PYTHONUNBUFFERED": ""}


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A runtime directory of the test's own (job records, run directories)."""
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(rt))
    return rt


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
    assert "Traceback" not in err


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
    assert lines[0].startswith(f"ttmesh: --ready-pattern {pattern!r}: "), res.err
    assert why in lines[0], res.err


def _profile(tmp_path: Path, model: str) -> dict[str, str]:
    """A user profile (TTMESH_PROFILES) for stock SGLang whose one rule matches the model."""
    directory = tmp_path / "profiles"
    directory.mkdir()
    (directory / "hostile.yaml").write_text(
        "name: hostile\n"
        "title: a profile with a model rule\n"
        "recognise: {program: sglang.launch_server}\n"
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
