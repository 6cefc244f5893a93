"""Fabric health in launches: pre-flight, recovery after a crash, restarts, hang detection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, TAG, run_cli, start_launch, wait_for, worker


def links(root: Path) -> set[str]:
    return {
        link["state"]
        for link in json.loads(run_cli("ls", "--root", str(root), "--json").out)["links"]
    }


def test_killed_fabric_job_is_caught_then_recovered(qb2: Path, tmp_path: Path) -> None:
    """Both ttmesh processes (launcher and guardian) SIGKILLed while a single-process job
    holds the fabric of 4 chips: nobody is left to recover, so the links stay down; check says
    so, launch refuses (3), launch --auto-reset recovers and runs."""
    proc = start_launch(
        qb2,
        "--tp-size",
        "4",
        "--mesh-layout",
        "single-process",
        *worker(f"pids={tmp_path}"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (tmp_path / "rank0.pid").exists(), what="the worker")
        wait_for(
            lambda: json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"][0][
                "holders"
            ],
            what="the worker to hold its chips",
        )
        import psutil

        (guardian,) = [c.pid for c in psutil.Process(proc.pid).children()]
        os.kill(proc.pid, signal.SIGSTOP)  # it cannot react to its guardian's death
        os.kill(guardian, signal.SIGKILL)
        proc.kill()
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
    worker_pid = int((tmp_path / "rank0.pid").read_text())
    wait_for(lambda: not Path(f"/proc/{worker_pid}").exists(), timeout=2, what="worker gone")
    assert links(qb2) == {"down"}

    check = run_cli("check", "--root", str(qb2), "--json")
    assert check.code == 1, check.err
    report = json.loads(check.out)
    assert report["schema"] == "ttmesh.check/1" and report["healthy"] is False
    assert any("down" in p["what"] for p in report["problems"])
    assert any("ttmesh reset" in (p["fix"] or "") for p in report["problems"])

    refused = run_cli("launch", "--root", str(qb2), "--tp-size", "4", *worker("exit=0"))
    assert refused.code == 3, refused.err
    assert "pre-flight" in refused.err and "down" in refused.err

    fixed = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "4", "--auto-reset", *worker("exit=0")
    )
    assert fixed.code == 0, fixed.err
    assert "recovered and verified" in fixed.err
    assert links(qb2) == {"up"}


def test_max_restarts_then_summary(qb2: Path, tmp_path: Path) -> None:
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "2",
        "--max-restarts",
        "2",
        "--summary-json",
        str(tmp_path / "s.json"),
        "--",
        sys.executable,
        "-c",
        "import os, sys\n"
        f"open(os.path.join({str(tmp_path)!r}, 'r' + os.environ['RANK'] + '-' +"
        " os.environ['TORCHELASTIC_RESTART_COUNT']), 'w').close()\n"
        "sys.exit(5 if os.environ['RANK'] == '1' else 0)\n",
        TAG,
    )
    assert res.code == 5, res.err
    assert sorted(p.name for p in tmp_path.glob("r1-*")) == ["r1-0", "r1-1", "r1-2"]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [a["attempt"] for a in summary["attempts"]] == [0, 1, 2]
    assert all(a["code"] == 5 and a["rank"] == 1 for a in summary["attempts"])
    for k in (1, 2, 3):
        assert f"attempt {k}: rank 1 exited with code 5" in res.err
    assert res.err.strip().splitlines()[-1] == "ttmesh: exit 5: rank 1's exit code"


def test_ready_timeout_catches_a_rank_that_never_gets_ready(qb2: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "2",
        "--ready-timeout",
        "1",
        "--grace",
        "1",
        "--",
        sys.executable,
        "-c",
        "import os, time\n"
        "if os.environ['RANK'] == '0': open(os.environ['TTMESH_READY_FILE'], 'w').close()\n"
        "time.sleep(60)\n",
        TAG,
    )
    assert res.code == 124, res.err
    assert time.monotonic() - t0 < 15
    assert "rank 1 not ready after 1 s" in res.err
    assert res.err.strip().splitlines()[-1].startswith("ttmesh: exit 124: hung in bring-up")


def test_ready_pattern_marks_the_job_ready_and_bad_values_are_refused(qb2: Path) -> None:
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "2",
        "--ready-timeout",
        "20",
        "--ready-pattern",
        r"server (is )?up",
        "--",
        sys.executable,
        "-c",
        "print('server is up', flush=True)",
        TAG,
    )
    assert res.code == 0, res.err
    bad = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "2", "--ready-pattern", "(", *worker("exit=0")
    )
    assert bad.code == 2 and "regular expression" in bad.err
    neg = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "2", "--ready-timeout", "-1", *worker("exit=0")
    )
    assert neg.code == 2 and "--ready-timeout" in neg.err


def test_link_down_mid_way_hangs_bring_up_then_recovers(qb2: Path, tmp_path: Path) -> None:
    """A link goes down after pre-flight: the fabric bring-up (wait_fabric) hangs; the chips
    watched while the job runs (fabric.chipwatch) see the links down and stop it within
    seconds, long before its ready timeout; ttmesh resets the chips and the relaunch succeeds."""
    go = tmp_path / "go"
    script = tmp_path / "fabric_job.py"
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from ttmesh import worker\n"
        f"go = {str(go)!r}\n"
        "while not os.path.exists(go):\n"
        "    time.sleep(0.01)\n"
        "worker.fabric_up()\n"
        "worker.wait_fabric(timeout=None)\n"
        "worker.ready()\n"
        f"open(os.path.join({str(tmp_path)!r}, 'done' + os.environ['RANK'] + '-'"
        " + os.environ['TORCHELASTIC_RESTART_COUNT']), 'w').close()\n"
    )
    proc = start_launch(
        qb2,
        "--tp-size",
        "4",
        "--ready-timeout",
        "300",
        "--grace",
        "1",
        "--max-restarts",
        "1",
        str(script),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: json.loads(run_cli("ps", "--root", str(qb2), "--json").out)["jobs"],
            what="the job",
        )
        fault = run_cli(
            "sim", "fault", "--root", str(qb2), "link-down", "0000:01:00.0", "0000:03:00.0"
        )
        assert fault.code == 0, fault.err
        go.touch()
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert (
        "ttmesh: chip 0000:01:00.0 failed under the job: 2 links to 0000:03:00.0 went down" in err
    )
    assert "not ready after" not in err and "recovered and verified" in err
    assert sorted(p.name for p in tmp_path.glob("done*")) == [f"done{r}-1" for r in range(4)]
    assert links(qb2) == {"up"}


def test_reset_on_failure_always_resets(qb2: Path) -> None:
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "2",
        "--reset-on-failure",
        *worker("fail-rank=0:4"),
    )
    assert res.code == 4, res.err
    assert "resetting its chips" in res.err and "recovered and verified" in res.err


def test_clean_end_leaves_links_up(qb2: Path) -> None:
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "4",
        "--mesh-layout",
        "single-process",
        *worker("exit=0"),
    )
    assert res.code == 0, res.err
    assert "reset" not in res.err
    assert links(qb2) == {"up"}


def test_renumbered_chips_are_found_by_address(qb2: Path, tmp_path: Path) -> None:
    assert run_cli("sim", "fault", "--root", str(qb2), "reset-renumbers").code == 0
    before = {
        c["bdf"]: c["dev_index"]
        for c in json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"]
    }
    res = run_cli("reset", "--root", str(qb2), "--json")
    assert res.code == 0, res.err
    after = {
        c["bdf"]: c["dev_index"]
        for c in json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"]
    }
    assert set(before) == set(after) and before != after
    run = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "4", *worker(f"env={tmp_path}", "exit=0")
    )
    assert run.code == 0, run.err
    seen = {json.loads(p.read_text())["TT_VISIBLE_DEVICES"] for p in tmp_path.glob("*.json")}
    assert seen == set(after)


def test_sigterm_to_ttmesh_is_a_graceful_stop(qb2: Path, tmp_path: Path) -> None:
    proc = start_launch(
        qb2,
        "--tp-size",
        "2",
        *worker(f"pids={tmp_path}", "on-term=0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 2, what="workers")
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert len(list(tmp_path.glob("*.term"))) == 2


def test_summary_json_when_nothing_starts(qb2: Path, tmp_path: Path) -> None:
    """Pre-flight refusal (3) and bad input (2) still leave the outcome for scripts."""
    assert run_cli("sim", "fault", "--root", str(qb2), "chip-dead", "0000:01:00.0").code == 0
    out = tmp_path / "s.json"
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--chips",
        "0000:01:00.0",
        "--summary-json",
        str(out),
        *worker("exit=0"),
    )
    assert res.code == 3, res.err
    data = json.loads(out.read_text())
    assert (data["source"], data["rank"], data["code"]) == ("ttmesh", None, 3)
    assert "0000:01:00.0" in data["reason"]
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--tp-size",
        "9",
        "--summary-json",
        str(out),
        *worker("exit=0"),
    )
    assert res.code == 2 and json.loads(out.read_text())["code"] == 2


def test_nproc_alone_splits_the_whole_mesh(qb2: Path) -> None:
    res = run_cli(
        "launch",
        "--root",
        str(qb2),
        "--nproc-per-node",
        "2",
        "--mesh-layout",
        "mesh",
        "--dry-run",
        "--json",
        *worker("exit=0"),
    )
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert plan["mesh_shape"] == [2, 2] and len(plan["ranks"]) == 2
    assert all(len(r["chips"]) == 2 for r in plan["ranks"])


def test_fault_help_needs_no_simulated_root() -> None:
    res = run_cli("sim", "fault", "link-down", "--help")
    assert res.code == 0 and "BDF_A BDF_B" in res.out
