"""One meaning of --tp-size (issue 22): the tensor-parallel degree, the chips of one model
instance over every host of the job (as SGLang's ``--tp-size 16 --nnodes 2`` is 8 chips on
each node), in every mode: one host, ``--nnodes`` by hand, Slurm, ``--hosts``. A server's own
``--tp-size``, ``--nnodes`` and ``--node-rank`` are checked against the job. Without
``--tp-size`` and ``--nproc-per-node`` a launch runs one worker per chip of the host (per board
on n300 systems), and its dry run says torchrun would start one.

The c10d cases here plan one host of the job (``--dry-run`` meets no other host) or run two
agents on one machine, each given its own chips of one simulated QuietBox 2 (loopback only)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli, worker

C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
SGLANG = [
    sys.executable,
    "-m",
    "sglang.launch_server",
    "--model-path",
    "Qwen/Qwen3-8B",
    "--device",
    "tpu",
]
NODE0 = ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1"]
TOKEN = {"TTMESH_RDZV_TOKEN": "test-token-22"}


def _dry(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ttmesh", "launch", "--root", str(root), "--dry-run", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **TOKEN, **(env or {})},
    )  # fmt: skip


def _plan(root: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    res = _dry(root, "--json", *args, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _refused(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    res = _dry(root, *args, env=env)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ttmesh: ")]
    return lines[-1]


def test_no_tp_size_runs_one_worker_per_chip(make_sim, tmp_path: Path) -> None:
    """As --help and the torchrun guide promise: one worker per chip (per board on an n300
    system); the dry run says torchrun would start one; the launch runs them all."""
    qb2 = make_sim("quietbox2")
    plan = _plan(qb2, *worker("exit=0"))
    assert len(plan["ranks"]) == 4 and plan["mesh_shape"] == [2, 2]
    assert any("torchrun starts one" in n for n in plan["notes"]), plan["notes"]
    text = _dry(qb2, *worker("exit=0"))
    assert text.returncode == 0 and "note: no --tp-size or --nproc-per-node" in text.stdout
    t3k = _plan(make_sim("t3k"), *worker("exit=0"))
    assert len(t3k["ranks"]) == 4 and all(len(r["chips"]) == 2 for r in t3k["ranks"])
    assert any("one worker per board" in n for n in t3k["notes"]), t3k["notes"]
    res = run_cli("launch", "--root", str(qb2), *worker(f"pids={tmp_path}", "exit=0"))
    assert res.code == 0, res.err
    assert len(list(tmp_path.glob("*.pid"))) == 4


def test_tp_size_counts_the_chips_of_every_host(qb2: Path) -> None:
    """--nnodes 2 --tp-size 4 is two chips on each host; --nproc-per-node stays per host."""
    plan = _plan(qb2, *NODE0, "--tp-size", "4", *worker("exit=0"))
    assert len(plan["ranks"]) == 2
    assert any("tp-size 4 over 2 hosts: 2 chips on each" in n for n in plan["notes"]), plan
    assert len(_plan(qb2, *NODE0, "--nproc-per-node", "3", *worker("exit=0"))["ranks"]) == 3
    slurm = {"SLURM_JOB_NODELIST": "localhost,node1", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0",
             "SLURM_NNODES": "2", "SLURM_JOB_ID": "22"}  # fmt: skip
    assert len(_plan(qb2, "--tp-size", "4", *worker("exit=0"), env=slurm)["ranks"]) == 2


def test_an_old_per_host_tp_size_says_what_to_write_now(qb2: Path) -> None:
    """A --tp-size the hosts cannot share equally (an old per-host command) is refused before
    anything starts, saying what to write for the same job; so is one this host cannot hold."""
    line = _refused(qb2, *NODE0, "--tp-size", "1", *worker("exit=0"))
    assert line.startswith("ttmesh: --tp-size 1 over 2 hosts: "), line
    assert "--tp-size 2 for 1 chip on each host" in line, line
    line = _refused(qb2, *NODE0, "--tp-size", "3", *worker("exit=0"))
    assert "--tp-size 6 for 3 chips on each host" in line, line
    line = _refused(qb2, "--hosts", "a,b", "--tp-size", "3", *worker("exit=0"))
    assert "--tp-size 6 for 3 chips on each host" in line, line
    line = _refused(qb2, *NODE0, "--tp-size", "16", *worker("exit=0"))
    assert "tp-size 16 over 2 hosts (8 chips on each): this host has 4 chips" in line, line


def test_a_servers_tp_size_nnodes_and_node_rank_are_checked_against_the_job(qb2: Path) -> None:
    """The server's --tp-size is the job's (SGLang's meaning); its --nnodes must be the job's
    host count and its --node-rank this host's, in every mode."""
    one = _refused(qb2, "--", *SGLANG, "--tp-size", "2", "--nnodes", "2")
    assert "the server's --nnodes 2 but the job runs on 1 host" in one, one
    plan = _plan(qb2, *NODE0, "--", *SGLANG, "--tp-size", "8", "--nnodes", "2", "--node-rank", "0")
    assert len(plan["ranks"][0]["chips"]) == 4
    assert [f for f in plan["serving"]["findings"] if f["severity"] == "error"] == []
    missing = _refused(qb2, *NODE0, "--", *SGLANG, "--tp-size", "8")
    assert "the job runs on 2 hosts but the server's command has no --nnodes" in missing, missing
    assert "--nnodes 2 --node-rank 0" in missing, missing
    rank = _refused(
        qb2, *NODE0, "--", *SGLANG, "--tp-size", "8", "--nnodes", "2", "--node-rank", "1"
    )
    assert "the server's --node-rank 1 but this host is node 0" in rank, rank
    odd = _refused(qb2, *NODE0, "--", *SGLANG, "--tp-size", "3", "--nnodes", "2")
    assert odd.startswith("ttmesh: the server's --tp-size 3 over 2 hosts: "), odd


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_agents(qb2: Path, per_node: list[list[str]]) -> list[tuple[int, str, str]]:
    """Two agents of one job on one machine, each with its own chips of ``qb2``."""
    port = _port()
    agents = []
    for n, args in enumerate(per_node):
        argv = [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), "--nnodes", "2",
                "--node-rank", str(n), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout",
                "60", "--heartbeat-timeout", "5", *args,
                "--", sys.executable, "-c", "import os; print(os.environ['WORLD_SIZE'])"]  # fmt: skip
        agents.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, env={**os.environ, **TOKEN}))  # fmt: skip
    out = []
    for p in agents:
        o, e = p.communicate(timeout=120)
        out.append((p.returncode, o, e))
    return out


@pytest.mark.torch  # the agents meet through torch's c10d store
def test_hosts_given_different_tp_sizes_are_refused(qb2: Path) -> None:
    """Every host must be given the job's --tp-size: one host told 2 and one told 4 (each fits
    its own chips) are both refused once they meet, naming the other host."""
    results = _two_agents(qb2, [["--tp-size", "2", "--chips", C01],
                                ["--tp-size", "4", "--chips", f"{C03},{C07}"]])  # fmt: skip
    assert [c for c, _o, _e in results] == [2, 2], results
    for _c, _o, err in results:
        assert "give every host the same --tp-size" in err.strip().splitlines()[-1], err
