"""Healthy first (issue 22): a launch chooses chips whose links are up and whose heartbeats
move, says in ``--dry-run`` which chips it passed over and why, refuses only when no healthy
set of the size exists (naming the reset that gives one), keeps a user's ``--chips`` as given
(pre-flight refuses them), and a dry run runs pre-flight as a launch would, or says what it
skipped. On a QuietBox 2 the chips form a ring 01-03-07-05-01."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli, worker

C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
DOWN_01_03 = "2 of 2 links between 0000:01:00.0 and 0000:03:00.0 are down (ch9<->ch2, ch8<->ch3)"


def _fault(root: Path, *args: str) -> None:
    res = run_cli("sim", "fault", "--root", str(root), *args)
    assert res.code == 0, res.err


def _plan(root: Path, *args: str) -> dict:
    res = run_cli("launch", "--root", str(root), "--dry-run", "--json", *args, *worker("exit=0"))
    assert res.code == 0, res.err
    return json.loads(res.out)


def _bdfs(plan: dict) -> set[str]:
    return {b for r in plan["ranks"] for b in r["bdfs"]}


def _only_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if not ln.startswith("simulated host: ")]
    assert len(lines) == 1 and lines[0].startswith("ttmesh: "), err
    return lines[0]


def _checks(plan: dict) -> dict[str, dict]:
    return {c["check"]: c for c in plan["checks"]}


def test_a_broken_pair_is_passed_over_for_healthy_free_chips(qb2: Path) -> None:
    """The issue's case: 01-03's links down, --tp-size 2 takes 05/07 (healthy and free), says
    which chips it passed over and why (text and JSON), and the launch runs (exit 0)."""
    _fault(qb2, "link-down", C01, C03)
    plan = _plan(qb2, "--tp-size", "2")
    assert _bdfs(plan) == {C05, C07}
    assert plan["passed_over"] == [{"chips": [C01, C03], "why": DOWN_01_03}]
    text = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--dry-run", *worker("exit=0"))
    assert text.code == 0, text.err
    assert f"passed over {C01}, {C03}: {DOWN_01_03}" in text.out
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", *worker("exit=0"))
    assert res.code == 0, res.err


def test_one_end_of_a_broken_pair_serves_when_the_healthy_chips_are_too_few(qb2: Path) -> None:
    """Three chips: the two untouched chips are too few, but a set holding only one end of the
    broken pair is healthy (pre-flight checks the links between the job's chips): it runs."""
    _fault(qb2, "link-down", C01, C03)
    plan = _plan(qb2, "--tp-size", "3")
    chips = _bdfs(plan)
    assert len(chips) == 3 and not {C01, C03} <= chips, chips
    (left,) = {C01, C03} - chips
    assert plan["passed_over"] == [{"chips": [left], "why": DOWN_01_03}]
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "3", *worker("exit=0"))
    assert res.code == 0, res.err


def test_no_healthy_set_refuses_with_the_reset_that_gives_one(qb2: Path) -> None:
    """Four chips with 01-03 down: no healthy set of four exists. The launch and its dry run
    refuse alike (exit 3, one line) with the reset that gives one; that reset does; with
    --auto-reset the dry run says pre-flight would reset the chips first (exit 0)."""
    _fault(qb2, "link-down", C01, C03)
    lines = []
    for extra in (["--dry-run"], [], ["--dry-run", "--json"]):
        res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", *extra, *worker("exit=0"))
        assert res.code == 3, (extra, res.err)
        lines.append(_only_line(res.err))
    assert lines[0] == lines[1] == lines[2]
    line = lines[0]
    assert line.startswith(f"ttmesh: pre-flight: {DOWN_01_03}: no healthy 4-chip mesh on this host")
    assert "--auto-reset" in line
    reset = line.split("(", 2)[-1].split(", or add", 1)[0]
    assert reset.startswith(f"ttmesh reset --root {qb2} --chips "), line
    plan = _plan(qb2, "--tp-size", "4", "--auto-reset")
    check = _checks(plan)["pre-flight"]
    assert check["result"] == "failed" and DOWN_01_03 in check["detail"], check
    assert "--auto-reset" in check["detail"] and "resets nothing" in check["detail"]
    assert run_cli(*shlex.split(reset)[1:]).code == 0
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "4", *worker("exit=0"))
    assert res.code == 0, res.err


def test_chips_named_are_the_users_choice_and_pre_flight_refuses_them(qb2: Path) -> None:
    """--chips naming the broken pair: the user's choice wins (nothing is passed over) and
    pre-flight refuses it, in the dry run as in the launch: one line, exit 3."""
    _fault(qb2, "link-down", C01, C03)
    chips = ["--chips", f"{C01},{C03}"]
    dry = run_cli("launch", "--root", str(qb2), *chips, "--dry-run", *worker("exit=0"))
    real = run_cli("launch", "--root", str(qb2), *chips, *worker("exit=0"))
    assert dry.code == real.code == 3, (dry.err, real.err)
    assert _only_line(dry.err) == _only_line(real.err)
    assert _only_line(dry.err).startswith(f"ttmesh: pre-flight: {DOWN_01_03}")


def test_a_dry_run_says_what_it_checked_and_what_it_skipped(qb2: Path) -> None:
    """Pre-flight ran (passed); over several hosts the rendezvous is skipped, and said."""
    plan = _plan(qb2, "--tp-size", "2")
    assert _checks(plan)["pre-flight"]["result"] == "passed"
    assert plan["passed_over"] == []
    text = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--dry-run", *worker("exit=0"))
    assert "check pre-flight: passed" in text.out, text.out
    multi = _plan(qb2, "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1",
                  "--tp-size", "4")  # fmt: skip
    rdzv = _checks(multi)["rendezvous"]
    assert rdzv["result"] == "skipped" and "no other host" in rdzv["detail"], rdzv
    # A mesh layout started directly: the launch refuses it (exit 2), and so does its dry run.
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--mesh-layout", "mesh",
                  "--launcher", "direct", "--dry-run", *worker("exit=0"))  # fmt: skip
    assert res.code == 2 and "only an MPI launcher can start" in _only_line(res.err), res.err


def test_a_frozen_chip_is_passed_over_and_named(qb2: Path) -> None:
    """A chip whose heartbeat is frozen (its links go down with it) is passed over, named."""
    _fault(qb2, "chip-dead", C05)
    plan = _plan(qb2, "--tp-size", "2")
    assert C05 not in _bdfs(plan)
    assert {"chips": [C05], "why": "dead: its heartbeat is frozen"} in plan["passed_over"]


def test_auto_reset_resets_only_when_no_healthy_set_is_free(qb2: Path) -> None:
    """--auto-reset may take a frozen chip (it resets it first), but healthy chips come first:
    with one free, nothing is reset; only a mesh that needs the frozen chip resets it."""
    _fault(qb2, "chip-dead", C01)
    plan = _plan(qb2, "--tp-size", "2", "--auto-reset")
    assert C01 not in _bdfs(plan) and _checks(plan)["pre-flight"]["result"] == "passed"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--auto-reset", *worker("exit=0"))
    assert res.code == 0 and "resetting the chips first" not in res.err, res.err
    whole = _plan(qb2, "--tp-size", "4", "--auto-reset")
    assert C01 in _bdfs(whole) and _checks(whole)["pre-flight"]["result"] == "failed"


def test_healthy_first_adds_no_heartbeat_wait(make_sim, tmp_path: Path) -> None:
    """01-03 down, 05 excluded, --tp-size 2: 03/07 is the only healthy pair, and no heartbeat
    can change that (01 makes no healthy pair with either), so the workers start while the
    heartbeats are read: here no counter moves until rank 0 has started, yet the job runs."""
    root = make_sim("quietbox2", heartbeat_hz=2.0)
    _fault(root, "link-down", C01, C03)
    from ttmesh.sim.core import SimRoot

    with SimRoot(str(root)).change() as state:
        for chip in state["chips"].values():
            chip["hb_t0"] = time.time() + 3600  # no tick for an hour: counters stand still
    script = tmp_path / "tick.py"
    script.write_text(
        "import os, sys, time\n"
        "from ttmesh.sim.core import SimRoot\n"
        "sim = SimRoot(os.environ['TTMESH_SIM_ROOT'])\n"
        "still = all(c['hb_t0'] > time.time() for c in sim.read_state()['chips'].values())\n"
        "open(os.path.join(sys.argv[1], 'rank' + os.environ['RANK']), 'w').write(str(still))\n"
        "if os.environ['RANK'] == '0':\n"
        "    with sim.change() as state:\n"
        "        for chip in state['chips'].values():\n"
        "            chip['hb_t0'] = time.time() - 0.49  # the next tick: 10 ms from now\n"
    )
    res = run_cli(
        "launch", "--root", str(root), "--tp-size", "2", "--exclude", C05,
        "--", sys.executable, str(script), str(tmp_path), "ttmesh-test-worker",
    )  # fmt: skip
    assert res.code == 0, res.err
    seen = {p.name: p.read_text() for p in tmp_path.glob("rank*")}
    assert seen == {"rank0": "True", "rank1": seen.get("rank1")}, seen


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (openmpi-bin)")
def test_a_dry_run_over_hosts_says_no_host_was_checked(qb2: Path) -> None:
    """--hosts with --dry-run prints the mpirun command and starts no agent: it says that no
    host's plan or pre-flight was checked, and how to have them checked."""
    res = run_cli("launch", "--root", str(qb2), "--hosts", "a,b", "--tp-size", "2", "--dry-run",
                  *worker("exit=0"))  # fmt: skip
    assert res.code == 0, res.err
    assert "--dry-run" in res.out.split()
    assert "a dry run of --hosts starts no agent, so no host's plan or pre-flight was checked" in (
        res.err
    )
