"""Jobs over several hosts (issue 13), on hosts emulated on this machine (tests/hosts.py):
an 8-rank all-reduce over two QuietBox 2s started by hand, by ``--hosts`` and by Slurm's
``srun`` (a throwaway cluster over the emulated hosts), failures and a
lost host across hosts, and the rendezvous' refusals (wrong token, duplicate node rank)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, SESSION, TAG, TW, alive, run_cli, scratch, wait_for
from hosts import SlurmCluster, can_emulate, can_slurm, launch_agent, make_hosts, mpi_env

from ttmesh import procs
from ttmesh.launcher.nodes import slurm

WHY = can_emulate()
needs_hosts = pytest.mark.skipif(WHY is not None, reason=WHY or "")
ALLREDUCE = str(REPO / "examples" / "allreduce.py")
TOKEN = {"TTMESH_RDZV_TOKEN": "test-token-1"}


def _port(addr: str = "127.0.0.2") -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _listening(addr: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((addr, port)) == 0


def _agents(
    hosts, port: int, *args: str, env: dict[str, str] | None = None, ranks=None, nnodes=None
):
    """One agent per host, by hand (torchrun's flags), stdout and stderr piped."""
    procs_ = []
    for i, host in enumerate(hosts):
        rank = i if ranks is None else ranks[i]
        procs_.append(
            host.ttmesh(
                "launch", "--nnodes", str(nnodes or len(hosts)), "--node-rank", str(rank),
                "--rdzv-endpoint", f"{hosts[0].addr}:{port}", "--job-id", f"mh-{port}",
                "--heartbeat-timeout", "3", "--rdzv-timeout", "60", *args,
                env={**TOKEN, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
        )  # fmt: skip
    return procs_


def _finish(procs_, timeout: float = 120) -> list[tuple[int, str, str]]:
    out = []
    for p in procs_:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        out.append((p.returncode, o, e))
    return out


@pytest.fixture
def world(tmp_path: Path):
    """A directory every emulated host sees (their /tmp is their own: not under it)."""
    with scratch(tmp_path / "world") as path:
        path.chmod(0o777)
        yield path


@pytest.fixture
def two_qb2(world: Path):
    return make_hosts(world, "quietbox2", 2)


def _slurm(hosts, world: Path):
    """``hosts`` as the nodes of a throwaway Slurm cluster (skipped, saying why, when Slurm or
    root is missing here; a cluster that does not come up though every program is there fails,
    with the daemons' logs)."""
    why = can_slurm()
    if why is not None:
        pytest.skip(why)
    # Under srun node 0 listens on ttmesh's default port, 29400: on addresses of this test's own.
    net = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}"
    for i, host in enumerate(hosts):
        host.addr = f"{net}.{2 + i}"
    cluster = SlurmCluster(world / "slurm", hosts)
    try:
        cluster.up()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        cluster.down()
        pytest.fail(f"the test's Slurm cluster did not come up: {exc}")
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def slurm_qb2(two_qb2, world: Path):
    """The two QuietBox 2s as the nodes of a throwaway Slurm cluster."""
    yield from _slurm(two_qb2, world)


@pytest.fixture
def slurm_t3k(world: Path):
    """Two cabled T3Ks (dual-t3k, one cable state) as the nodes of a throwaway Slurm cluster."""
    yield from _slurm(make_hosts(world, "dual-t3k"), world)


# --------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("galaxy[01-03,07]", ["galaxy01", "galaxy02", "galaxy03", "galaxy07"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("rack[1-2]-n[8-9]", ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]),
        ("node007", ["node007"]),
    ],
)
def test_slurm_nodelists_expand_as_scontrol_does(nodelist: str, names: list[str]) -> None:
    assert slurm.expand(nodelist) == names


def test_slurm_node_address_is_its_name_or_else_its_node_addr(tmp_path: Path, monkeypatch) -> None:
    """The first node's name when it resolves; else the NodeAddr ``scontrol show node`` gives
    (slurm.conf's NodeAddr, when DNS does not know the name); else the name."""
    asked = tmp_path / "asked"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        f'#!/bin/sh\necho "$@" >> {asked}\n'
        'case "$4" in gx01.invalid) echo "NodeName=gx01.invalid Arch=x86_64 NodeAddr=10.1.2.3 '
        'NodeHostName=gx01 Port=0";; *) echo "Node $4 not found"; exit 1;; esac\n'
    )
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert slurm.address("localhost") == "localhost"
    assert not asked.exists()  # a name that resolves costs no call to slurmctld
    assert slurm.address("gx01.invalid") == "10.1.2.3"
    assert slurm.address("gx02.invalid") == "gx02.invalid"
    assert asked.read_text().split("\n")[0] == "show node --oneliner gx01.invalid"


def test_multihost_bad_input(qb2: Path) -> None:
    for args, needle in (
        (["--nnodes", "2", "--tp-size", "2"], "which host is this?"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1", "--tp-size", "2"], "--node-rank 2: must be 0..1"),
        (["--nnodes", "1:4", "--tp-size", "1"], "no elastic MIN:MAX"),
        (["--node-rank", "1", "--tp-size", "1"], "--node-rank goes with --nnodes N"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "x:99999", "--tp-size", "2"], "port 99999: too large"),
        (["--hosts", "a", "--tp-size", "1"], "name two or more different hosts"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1", "--tp-size", "1", "--dry-run"], "--tp-size 2 for 1 chip on each host"),
    ):  # fmt: skip
        res = run_cli("launch", "--root", str(qb2), *args, "true")
        assert res.code == 2, (args, res.err)
        assert needle in res.err.strip().splitlines()[-1], (args, res.err)


def _split_host(qb2: Path, port: int, max_restarts: int, code: str) -> list:
    """Two agents of one job on one machine, each given one chip of ``qb2`` (a split host: the
    job's --tp-size 2 is one chip on each), each running ``python -c CODE``; their (exit code,
    stdout, stderr)."""
    common = ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "60",
              "--heartbeat-timeout", "5", "--tp-size", "2", "--max-restarts", str(max_restarts)]  # fmt: skip
    agents = []
    for n in (0, 1):
        argv = [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), "--node-rank", str(n),
                *common, "--chips", ("0000:01:00.0", "0000:03:00.0")[n],
                "--", sys.executable, "-c", code]  # fmt: skip
        env = {**__import__("os").environ, **TOKEN}
        pipe = subprocess.PIPE
        agents.append(subprocess.Popen(argv, stdout=pipe, stderr=pipe, text=True, env=env))
    return _finish(agents, timeout=120)


def test_two_agents_on_one_machine_keep_their_parts_apart(qb2: Path, tmp_path: Path) -> None:
    """Two agents of one job on one machine (a split host, each given its chips): each part
    has its own run directory, leases and record (JOB-n0, JOB-n1); ranks and messages are
    global."""
    port = _port("127.0.0.1")
    code = (
        "import os, sys; print(os.environ['RANK'], os.environ['TT_VISIBLE_DEVICES']); "
        "sys.exit(7 if os.environ['RANK'] == '1' else 0)"
    )
    results = _split_host(qb2, port, 1, code)
    assert [c for c, _o, _e in results] == [7, 7], results
    assert "already exists" not in results[0][2] + results[1][2]
    assert [o.split()[-1] for _c, o, _e in results] == ["0000:01:00.0", "0000:03:00.0"], results
    err1 = results[1][2]
    assert "attempt 1 of 2 failed (rank 1 exited with code 7)" in err1, err1
    assert "rank 1 (0000:03:00.0) exited with code 7" in err1 and "rank 0" not in err1, err1
    listed = json.loads(run_cli("ps", "--all", "--json").out)
    ours = {j["job"] for j in listed["jobs"] if j["job"].startswith(f"rdzv-127.0.0.1-{port}")}
    assert ours == {f"rdzv-127.0.0.1-{port}-n0", f"rdzv-127.0.0.1-{port}-n1"}, ours


def test_every_host_restarts_together_after_one_hosts_rank_fails(qb2: Path, tmp_path: Path) -> None:
    """--max-restarts over hosts: rank 1 (node 1) fails in the first attempt only; node 0's
    rank, stopped for it, runs again in the second attempt, and every agent exits 0."""
    code = (
        "import os, sys, time; n = os.environ['TORCHELASTIC_RESTART_COUNT']; "
        "print('ran', os.environ['RANK'], n, flush=True); "
        "sys.exit(9) if os.environ['RANK'] == '1' and n == '0' else time.sleep(0.5 if n == '0' "
        "and os.environ['RANK'] == '0' else 0)"
    )
    results = _split_host(qb2, _port("127.0.0.1"), 2, code)
    assert [c for c, _o, _e in results] == [0, 0], results
    ran = [sorted(line.split()[2:] for line in o.splitlines() if line.split()[1:2] == ["ran"])
           for _c, o, _e in results]  # fmt: skip
    # Two attempts on each host, the second together: rank 0 ran in attempts 0 and 1 as well.
    assert ran == [[["0", "0"], ["0", "1"]], [["1", "0"], ["1", "1"]]], results
    for _c, _o, err in results:
        assert "attempt 1 of 3 failed" in err, err


# --------------------------------------------------------------------------- emulated hosts


@needs_hosts
def test_two_hosts_by_hand_all_reduce(two_qb2, world: Path) -> None:
    """8 ranks over two QuietBox 2s (--tp-size 8: the job's chips, four on each host): global
    ranks node-major, one world, the right sum."""
    port = _port()
    envs = world / "envs"
    envs.mkdir()
    envs.chmod(0o777)
    results = _finish(_agents(two_qb2, port, "--tp-size", "8", "--",
                              sys.executable, TW, TAG, f"env={envs}", "exit=0"))  # fmt: skip
    for code, _o, e in results:
        assert code == 0, e
    seen = {}
    for path in envs.glob("rank*.json"):
        env = json.loads(path.read_text())
        seen[int(env["RANK"])] = env
    assert sorted(seen) == list(range(8))
    for rank, env in seen.items():
        node = rank // 4
        assert env["WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4"
        assert env["LOCAL_RANK"] == str(rank % 4) and env["GROUP_RANK"] == str(node)
        assert env["GROUP_WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "127.0.0.2"
        assert env["TTMESH_SIM_ROOT"] == str(two_qb2[node].root)
    results = _finish(_agents(two_qb2, _port(), "--tp-size", "8", ALLREDUCE))
    lines = [ln for _c, o, _e in results for ln in o.splitlines()]
    assert len([ln for ln in lines if "all_reduce = 36 ok" in ln]) == 8, lines
    assert {re.match(r"\[r(\d)\]", ln).group(1) for ln in lines} == {str(r) for r in range(8)}


@needs_hosts
@pytest.mark.skipif(
    shutil.which("mpirun") is None, reason="needs mpirun (apt-get install openmpi-bin)"
)
def test_two_hosts_started_by_hosts_flag(two_qb2, world: Path) -> None:
    agent = launch_agent(world, two_qb2)
    port = _port()
    res = subprocess.run(
        [sys.executable, "-m", "ttmesh", "launch", "--hosts", ",".join(h.name for h in two_qb2),
         "--rdzv-endpoint", f"{two_qb2[0].addr}:{port}", "--tp-size", "8", ALLREDUCE],
        capture_output=True, text=True, timeout=180, env={**__import__("os").environ, **mpi_env(agent), **TOKEN},
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("all_reduce = 36 ok") == 8, res.stdout + res.stderr


def _srun(cluster: SlurmCluster, *launch_args: str) -> subprocess.CompletedProcess:
    """``srun -N2 --ntasks-per-node=1 ttmesh launch ARGS``: no --nnodes, --node-rank or
    --rdzv-endpoint; each agent learns them from its task's Slurm environment."""
    env = {**cluster.env(), **TOKEN, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1",
           "TTMESH_TEST_SESSION": SESSION}  # fmt: skip
    return subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "ttmesh", "launch",
         "--heartbeat-timeout", "3", "--rdzv-timeout", "60", *launch_args],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip


@needs_hosts
def test_two_hosts_started_by_slurm(slurm_qb2: SlurmCluster, two_qb2, world: Path) -> None:
    """One agent per node by srun; the node count, node rank and endpoint (the first node's
    NodeAddr: DNS does not know the emulated names) from Slurm; 8 ranks, the right sum, the
    global environment. A rank failing makes its exit code srun's."""
    envs = world / "envs"
    envs.mkdir()
    envs.chmod(0o777)
    dump = f'env > {envs}/rank"$RANK".env && exec "$0" "$1"'
    res = _srun(slurm_qb2, "--tp-size", "8", "--", "sh", "-c", dump, sys.executable, ALLREDUCE)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if "all_reduce = 36 ok" in ln]
    assert len(lines) == 8, res.stdout + res.stderr
    assert {re.match(r"\[r(\d)\]", ln).group(1) for ln in lines} == {str(r) for r in range(8)}
    seen = {}
    for path in envs.glob("rank*.env"):
        env = dict(ln.partition("=")[::2] for ln in path.read_text().splitlines() if "=" in ln)
        seen[int(env["RANK"])] = env
    assert sorted(seen) == list(range(8))
    for rank, env in seen.items():
        node = rank // 4
        assert env["SLURM_NODEID"] == env["GROUP_RANK"] == str(node), env
        assert env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == str(rank % 4)
        assert env["GROUP_WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == two_qb2[0].addr
        assert env["TTMESH_SIM_ROOT"] == str(two_qb2[node].root)
        assert env["TTMESH_JOB_ID"].startswith(f"slurm-{env['SLURM_JOB_ID']}"), env
    res = _srun(slurm_qb2, "--tp-size", "8", "--grace", "2", "--",
                sys.executable, TW, TAG, "fail-after=6:1:7")  # fmt: skip
    assert res.returncode == 7, res.stdout + res.stderr
    assert "exit 7: rank 6's exit code (on host ttmh-1)" in res.stderr, res.stderr


@needs_hosts
def test_a_crash_under_slurm_resets_both_t3ks_cable_ends_together(slurm_t3k: SlurmCluster) -> None:
    """srun's two agents over two cabled T3Ks: rank 0 opens the fabric and crashes once. The
    agents agree through their store (as with --nnodes): both hosts reset their cables' ends
    at one moment, the 8 cables train and are verified from both ends, then both restart."""
    crash_once = (f'{sys.executable} {TW} {TAG} fabric exit=0; '
                  'exit $(( TORCHELASTIC_RESTART_COUNT == 0 && RANK == 0 ? 7 : 0 ))')  # fmt: skip
    res = _srun(slurm_t3k, "--tp-size", "16", "--max-restarts", "1", "--", "sh", "-c", crash_once)
    assert res.returncode == 0, res.stdout + res.stderr
    notes = [ln for ln in res.stderr.splitlines() if ln.startswith("ttmesh: ")]
    together = [n for n in notes if "cables reset together at both ends and trained" in n]
    assert len(together) == 2 and all(": 8 between ttmh-0 and ttmh-1 (" in n for n in together)
    for host in ("ttmh-0", "ttmh-1"):
        mine = [n for n in notes if n.startswith(f"ttmesh: host {host}: ")]
        assert mine and all("chips reset and verified" in n for n in mine), notes
    assert notes.index(together[0]) < next(
        i for i, n in enumerate(notes) if "restarting every rank" in n
    ), notes


def _without_numpy(world: Path) -> dict[str, str]:
    """An environment in which ``import numpy`` fails, as where torch was installed alone
    (NumPy is no dependency of torch): torch then warns when it is imported."""
    stand_in = world / "no-numpy" / "numpy"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n"
    )
    (world / "no-numpy").chmod(0o755)
    return {"PYTHONPATH": f"{world / 'no-numpy'}:{REPO}"}


@needs_hosts
def test_a_rank_failing_on_host1_stops_every_host(two_qb2, world: Path) -> None:
    """Rank 6 (host 1) fails: both agents stop and exit 7, naming it. Without NumPy, the agents'
    torch (the store, the rendezvous) says nothing of it: torch's NumPy warning was printed by
    every agent of every launch over hosts."""
    pids = world / "pids"
    pids.mkdir()
    pids.chmod(0o777)
    t0 = time.monotonic()
    results = _finish(_agents(two_qb2, _port(), "--tp-size", "8", "--grace", "2", "--",
                              sys.executable, TW, TAG, f"pids={pids}", "fail-after=6:2:7",
                              env=_without_numpy(world)))  # fmt: skip
    took = time.monotonic() - t0
    for code, _o, e in results:
        assert code == 7, e
        assert "NumPy" not in e, e
    assert "exit 7: rank 6's exit code (on host ttmh-1)" in results[0][2]
    assert "rank 6 (0000:" in results[1][2]
    assert took < 60
    workers = [int(p.read_text()) for p in pids.glob("*.pid")]
    assert len(workers) == 8 and not any(alive(p) for p in workers)


@needs_hosts
def test_an_agent_killed_stops_the_others_within_the_heartbeat_timeout(
    two_qb2, world: Path
) -> None:
    pids = world / "pids"
    pids.mkdir()
    pids.chmod(0o777)
    agents = _agents(
        two_qb2, _port(), "--tp-size", "4", "--", sys.executable, TW, TAG, f"pids={pids}"
    )
    try:
        wait_for(
            lambda: len(list(pids.glob("*.pid"))) == 4 or any(a.poll() is not None for a in agents),
            timeout=90,
            what="every rank",
        )
        assert len(list(pids.glob("*.pid"))) == 4, _finish(agents, 5)
        assert "ttmesh" in (procs.command_line(agents[1].pid) or "")  # unshare and sh exec'd it
        t0 = time.monotonic()
        agents[1].send_signal(signal.SIGKILL)  # the agent of host 1, gone without a word
        code0, _o, err0 = _finish(agents[:1], timeout=60)[0]
        took = time.monotonic() - t0
    finally:
        _finish(agents, timeout=30)
    assert code0 != 0, err0
    assert "stopped answering" in err0 or "store" in err0, err0
    assert took < 3 + 5 + 5, took  # heartbeat timeout + grace + a beat
    workers = [int(p.read_text()) for p in pids.glob("*.pid")]
    wait_for(lambda: not any(alive(p) for p in workers), timeout=10, what="every worker gone")


@needs_hosts
def test_a_wrong_token_and_a_duplicate_node_rank_are_refused(two_qb2) -> None:
    port = _port()
    good = _agents(two_qb2[:1], port, "--tp-size", "2", "--", "sleep", "30", nnodes=2)
    try:
        wait_for(lambda: _listening(two_qb2[0].addr, port), timeout=60, what="node 0's store")
        bad = two_qb2[1].ttmesh(
            "launch", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", f"{two_qb2[0].addr}:{port}",
            "--job-id", f"mh-{port}", "--rdzv-timeout", "900", "--tp-size", "2", "--", "true",
            env={"TTMESH_RDZV_TOKEN": "wrong"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        # Refused as soon as the job record is read, not at the end of --rdzv-timeout.
        code, _o, err = _finish([bad], timeout=60)[0]
        assert code == 3, err
        assert "is not signed with this job's token" in err.strip().splitlines()[-1], err
        dup = two_qb2[1].ttmesh(
            "launch", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", f"{two_qb2[0].addr}:{port}",
            "--job-id", f"mh-{port}", "--rdzv-timeout", "5", "--tp-size", "2", "--", "true",
            env=TOKEN, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        code, _o, err = _finish([dup], timeout=60)[0]
        assert code == 2, err
        assert "--node-rank 0 is already taken" in err.strip().splitlines()[-1], err
    finally:
        for p in good:
            p.send_signal(signal.SIGINT)
        _finish(good, timeout=30)


@needs_hosts
def test_a_crash_over_nnodes_resets_both_hosts_cable_ends_together(world: Path) -> None:
    """Two T3Ks by hand (--nnodes 2): rank 0 brings the fabric up and crashes once. Both agents
    check, publish their cable ends through the store and take the same decision: both hosts
    reset (a T3K's reset takes every chip, so every cable's both ends), the cables train and are
    verified from both ends, then both restart together and exit 0."""
    hosts = make_hosts(world, "dual-t3k")
    crash_once = (f'{sys.executable} {TW} {TAG} fabric exit=0; '
                  'exit $(( TORCHELASTIC_RESTART_COUNT == 0 && RANK == 0 ? 7 : 0 ))')  # fmt: skip
    results = _finish(_agents(hosts, _port(), "--tp-size", "16", "--max-restarts", "1",
                              "--", "sh", "-c", crash_once))  # fmt: skip
    for code, _o, err in results:
        assert code == 0, err
    for (_c, _o, err), host in zip(results, ("ttmh-0", "ttmh-1"), strict=True):
        notes = [ln for ln in err.splitlines() if ln.startswith("ttmesh: ")]
        mine = [n for n in notes if n.startswith(f"ttmesh: host {host}: ")]
        assert len(mine) == 1 and "chips reset and verified" in mine[0], notes
        together = [n for n in notes if "cables reset together at both ends and trained" in n]
        assert len(together) == 1 and ": 8 between ttmh-0 and ttmh-1 (" in together[0], notes
        restart = next(i for i, n in enumerate(notes) if "restarting every rank" in n)
        assert notes.index(together[0]) < restart, notes


def test_a_host_left_alone_at_the_rendezvous_is_told_why(qb2: Path, runtime: Path) -> None:
    """torch's RendezvousTimeoutError says nothing: the refusal names the hosts expected, the
    wait and the fix, in one line (exit 3)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_cli(
        "launch", "--root", str(qb2), "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
        f"127.0.0.1:{port}", "--rdzv-timeout", "1", "--tp-size", "2", "--no-python", "true",
        timeout=120,
    )  # fmt: skip
    assert res.code == 3, res.err
    (line,) = [ln for ln in res.err.splitlines() if "rendezvous at" in ln]
    assert f"127.0.0.1:{port}: not every one of the 2 hosts joined within 1 s" in line
    assert "--rdzv-timeout" in line and "RendezvousTimeoutError" not in res.err
