"""Signals sent to ttmesh reach the ranks as torchrun's users expect (issue 23).

torchrun's agent passes the signal it got (SIGINT, SIGHUP, SIGQUIT, ...) to its workers, so a
rank's ``KeyboardInterrupt`` checkpoint handler runs on Ctrl-C; ttmesh sent SIGTERM instead,
and SIGQUIT killed ttmesh itself. Each test awaits the ranks' own markers (no sleeps) and
checks that no rank outlives the job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TAG, alive, start_launch, wait_for

RANK = r"""
import os, signal, sys, time
out, rank = sys.argv[1], os.environ["RANK"]

def mark(name):  # whole when it appears: the test reads the pid as soon as it sees the file
    part = os.path.join(out, f".{name}.{rank}")  # not matched by the test's name.* globs
    with open(part, "w") as f:
        f.write(str(os.getpid()))
    os.rename(part, os.path.join(out, f"{name}.{rank}"))

def usr(sig, _frame):
    mark(signal.Signals(sig).name)

def stop(sig, _frame):
    mark(signal.Signals(sig).name)
    sys.exit(0)

signal.signal(signal.SIGUSR1, usr)
signal.signal(signal.SIGUSR2, usr)
signal.signal(signal.SIGHUP, stop)
signal.signal(signal.SIGQUIT, stop)
mark("ready")
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    mark("KeyboardInterrupt")
    sys.exit(0)
"""


def _start(qb2: Path, tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = start_launch(
        qb2, "--tp-size", "2", "--no-live", "--", sys.executable, str(script), str(tmp_path), TAG
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("ready.*"))) == 2, what="both ranks ready")
    except BaseException:
        _end(proc)
        raise
    return proc, [int((tmp_path / f"ready.{r}").read_text()) for r in (0, 1)]


def _end(proc: subprocess.Popen) -> tuple[str, str]:
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.communicate(timeout=30)
    proc.kill()
    return proc.communicate()


@pytest.mark.parametrize(
    ("sig", "marker"),
    [
        (signal.SIGINT, "KeyboardInterrupt"),
        (signal.SIGHUP, "SIGHUP"),
        (signal.SIGQUIT, "SIGQUIT"),
    ],
)
def test_a_stop_signal_reaches_the_ranks_as_sent(
    qb2: Path, tmp_path: Path, sig: int, marker: str
) -> None:
    """Ctrl-C runs a rank's KeyboardInterrupt handler (a checkpoint on interrupt); SIGHUP and
    SIGQUIT reach a rank's handler for them; ttmesh exits 128 + the signal, nothing left."""
    proc, pids = _start(qb2, tmp_path)
    try:
        proc.send_signal(sig)
        _out, err = _end(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, err
    for rank in (0, 1):
        assert (tmp_path / f"{marker}.{rank}").exists(), err
    assert err.splitlines()[-1].startswith(f"ttmesh: exit {128 + sig}: "), err
    assert not [p for p in pids if alive(p)]


def test_sigusr1_reaches_every_rank_and_the_job_goes_on(qb2: Path, tmp_path: Path) -> None:
    """SIGUSR1 (Slurm's "time is nearly up") is each rank's to handle; the job runs on until
    it is stopped."""
    proc, pids = _start(qb2, tmp_path)
    try:
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: len(list(tmp_path.glob("SIGUSR1.*"))) == 2, what="SIGUSR1 markers")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _out, err = _end(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert not [p for p in pids if alive(p)]
    for p in pids:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
