"""scripts/chaos.py: ttmesh's fault matrix, every case twice (seed 1), and the harness's own
detectors (a harness that never reports a violation proves nothing)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO, alive, wait_for

CHAOS = REPO / "scripts" / "chaos.py"


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos", CHAOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_harness_sees_what_a_run_leaves(tmp_path: Path) -> None:
    """A run that leaves a process of its job, a lease, a host with links down, and ends with
    another code and record than expected: each is a violation."""
    chaos = _chaos()
    chaos.SETTLE = 0.5
    from ttmesh.runtime import leases

    held: list[leases.LeaseSet] = []

    def broken(t) -> None:  # type: ignore[no-untyped-def]
        t.create()
        la = t.launch("--tp-size", "1", worker=["exit=3"], n=1)
        la.expect = chaos.Expect({0}, ("every rank succeeded",))
        la.wait()
        subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)", chaos.TAG, "grandchild"],
            env={**t.env, "TTMESH_JOB_ID": la.job},
            start_new_session=True,
        )
        t.fault("link-down", t.bdfs[0], t.bdfs[1])

        from ttmesh.host.base import Host

        held.append(leases.acquire(Host(t.root), ["00008a26321e00c1"], "stray", cmd="stray"))

    try:
        outcome = chaos.run_one(chaos.Case("selftest", "self", broken, ""), 0, "1", tmp_path)
    finally:
        for lease in held:
            lease.release()
    said = "\n".join(outcome.violations)
    assert not outcome.ok
    assert "process left" in said
    assert "lease left on 00008a26321e00c1" in said
    assert "exit 3, expected 0" in said
    assert "record says 'rank 0 exited with code 3'" in said
    assert "host unhealthy after the job" in said and "down" in said


@pytest.mark.slow
def test_the_short_matrix(tmp_path: Path) -> None:
    """Every case twice with seed 1 (about 2-3 minutes on 2 cores): no violation. (The cases
    over hosts, slower, run once each below.)"""
    out = tmp_path / "chaos.json"
    cases = [c for c in _chaos().CASES if c.group != "hosts"]
    proc = subprocess.run(
        [sys.executable, str(CHAOS), "--quick", "--seed", "1", "-q", "-v", "--json", str(out),
         "--cases", *(c.name for c in cases)],
        capture_output=True,
        text=True,
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert len(data["outcomes"]) == 2 * len(cases)
    assert all(o["ok"] for o in data["outcomes"])
    ran = [o for o in data["outcomes"] if not o["skipped"] and not o["missed"]]
    assert sum(o["faults"] for o in ran) >= len(cases)  # the faults really were injected


FAKE_FRONT = r"""
import os, sys, time

def child(kind):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        if kind == "group":
            os.setpgid(0, 0)
        elif kind == "session":
            os.setsid()
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    if kind == "group":
        try:
            os.setpgid(pid, pid)  # either side may do it first
        except OSError:
            pass
    os.read(r, 1)  # it is in its group or session now
    return pid

print(child("plain"), child("session"), flush=True)
sys.stdin.readline()
print(child("group"), flush=True)
sys.stdin.readline()
"""


def test_the_guardian_is_never_a_child_the_front_forked_for_a_program(tmp_path: Path) -> None:
    """A child the front forks to run a program has the front's command line until it execs
    (under load long enough to be seen: ``mpirun --version`` while an MPI launch prepares):
    neither one in the front's process group nor one leading a session of its own is taken for
    the guardian, which leads a group of its own in the front's session. (Taken for it, the
    guardian was "gone" a moment later, the fault never sent, and the run waited out the
    launch timeout: "ttmesh did not exit within 90 s".)"""
    chaos = _chaos()
    script = tmp_path / "front.py"
    script.write_text(FAKE_FRONT)
    argv = [sys.executable, str(script), chaos.TAG]
    front = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    kids: list[int] = []
    try:
        assert front.stdout is not None and front.stdin is not None
        kids += [int(p) for p in front.stdout.readline().split()]
        la = chaos.Launch(None, "job", front, tmp_path / "err", 1, " ".join(argv))  # type: ignore[arg-type]
        assert len(kids) == 2 and la.guardian() is None
        front.stdin.write("\n")
        front.stdin.flush()
        kids.append(int(front.stdout.readline()))
        assert la.guardian() == kids[-1]
    finally:
        for pid in kids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        front.kill()
        front.wait()
        wait_for(lambda: not any(alive(p) for p in kids), what="the fake front's children")


def test_a_missed_fault_stops_the_job_it_never_reached(tmp_path: Path) -> None:
    """The moment a fault was aimed at never came (Missed): the job its workers were waiting
    in is stopped by the harness, not waited for until the launch timeout, where it counted as
    a violation ("did not exit within 90 s") of a run that was only missed."""
    chaos = _chaos()
    chaos.SETTLE = 5.0

    def never(t) -> None:  # type: ignore[no-untyped-def]
        t.create()
        la = t.launch("--tp-size", "1", "--grace", "1", n=1)  # its worker waits for a signal
        t.until("every worker", lambda: la.started_workers() == 1)
        raise chaos.Missed("the moment never came")

    outcome = chaos.run_one(chaos.Case("missed", "self", never, ""), 0, "1", tmp_path)
    assert outcome.missed == "the moment never came"
    assert outcome.ok, outcome.violations


def test_chaos_over_hosts_sees_a_cable_left_down_and_none_after_a_kill(tmp_path: Path) -> None:
    """Over two emulated T3Ks: a cable left down (one host reset alone) is a violation the
    harness reports; SIGKILL of either host's ttmesh or of a rank (the two cases at once) is
    recovered on both hosts, every cable up again from both ends, nothing left."""
    chaos = _chaos()
    if (why := chaos.emuhosts_why()) is not None:
        pytest.skip(why)
    chaos.CABLES_SETTLE = 0.0

    def one_end(t) -> None:  # type: ignore[no-untyped-def]
        t.create_hosts()
        t.train = 0.0  # no wait: the cables would never train
        from ttmesh.sim import core

        sim = core.SimRoot(str(t.hosts[0].root))
        sim.reset([core.asic_hex(c["unique_id"]) for c in sim.chips() if c.get("bdf")])

    left = chaos.run_one(chaos.Case("selftest", "hosts", one_end, ""), 0, "1", tmp_path)
    assert not left.ok and "hosts unhealthy after the job" in "\n".join(left.violations)
    assert "is down (and 7 more)" in "\n".join(left.violations), left.violations
    chaos.CABLES_SETTLE = 15.0
    out = tmp_path / "chaos.json"
    code = chaos.main(["--cases", "hosts-*", "--repeat", "1", "--jobs", "2", "--seed", "1",
                       "-q", "--json", str(out)])  # fmt: skip
    outcomes = json.loads(out.read_text())["outcomes"]
    assert code == 0, outcomes
    assert [o["faults"] for o in outcomes] == [1, 1], outcomes
