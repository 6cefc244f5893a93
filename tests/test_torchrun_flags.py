"""torchrun's command lines start under ttmesh, one word changed (issue 23, "Flags").

Driven as pytorch/examples' READMEs and run_example.sh drive torchrun: underscore spellings
(``--rdzv_id=101 --rdzv_endpoint=localhost:9999``), ``PET_*`` environment defaults, and the
flags of torch 2.13's ``torchrun --help`` that mean something on one host.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from ttmesh.cli import torchrun
from ttmesh.cli.launch import launch_cmd
from ttmesh.cli.launch_args import command_start

# Every flag is taken now (the Output change brought -r/--redirects and -t/--tee).
OUTPUT: set[str] = set()  # -r/--redirects, -t/--tee: the Output change, taken too
# torch 2.13's store_true / check_env flags: they take no value.
NO_VALUE = {"--standalone", "--module", "--no-python", "--run-path", "--virtual-local-rank"}
VALUE = {
    "--nnodes": "1", "--nproc-per-node": "2", "--rdzv-backend": "c10d",
    "--rdzv-endpoint": "localhost:29400", "--rdzv-id": "101", "--rdzv-conf": "join_timeout=60",
    "--max-restarts": "0", "--monitor-interval": "0.1", "--start-method": "spawn",
    "--event-log-handler": "null", "--role": "trainer", "--log-dir": "/tmp",
    "--local-ranks-filter": "0", "--duplicate-stdout-filters": "a",
    "--duplicate-stderr-filters": "b", "--node-rank": "0", "--master-addr": "127.0.0.1",
    "--master-port": "29500", "--local-addr": "127.0.0.1", "--logs-specs": "default",
    "--numa-binding": "node", "--signals-to-handle": "SIGTERM,SIGINT",
    "--shutdown-timeout": "5", "--redirects": "3", "--tee": "1",
}  # fmt: skip


def _params() -> list:
    import click

    return launch_cmd.get_params(click.Context(launch_cmd))


@pytest.mark.parametrize("flag", sorted(set(torchrun.FLAGS) - OUTPUT))
@pytest.mark.parametrize("spelling", ["dash", "underscore"])
def test_every_torchrun_flag_is_taken_in_both_spellings(flag: str, spelling: str) -> None:
    """Each flag of torch 2.13's --help, as --a-b and --a_b, with a value exactly when
    torchrun takes one: the command starts after it."""
    name = flag if spelling == "dash" else torchrun.underscore(flag)
    args = [name] if flag in NO_VALUE else [name, VALUE[flag]]
    assert command_start(_params(), [*args, "train.py", "--lr", "1"]) == (len(args),) * 2


@pytest.mark.slow
def test_the_flag_table_is_torch_2_13s_help() -> None:
    """The table ttmesh keeps is every long flag of the installed torch's own --help."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("  -")]  # options
    found = {f for line in lines for f in re.findall(r"(--[a-z][a-z-]*[a-z])(?=[ ,]|$)", line)}
    helped = found - {"--help"}
    assert helped == set(torchrun.FLAGS)


def _plan(root: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    res = run_cli("launch", "--root", str(root), "--dry-run", "--json", *args, env=env)
    assert res.code == 0, res.err
    return json.loads(res.out)


def test_pytorch_examples_command_line_runs(qb2: Path, tmp_path: Path) -> None:
    """pytorch/examples' distributed/tensor_parallelism README line, torchrun -> ttmesh launch."""
    script = tmp_path / "main.py"
    script.write_text("print('ok')\n")
    res = run_cli(
        "launch", "--root", str(qb2), "--nnodes=1", "--node_rank=0", "--nproc_per_node=2",
        "--rdzv_id=101", "--rdzv-backend=c10d", '--rdzv_endpoint=localhost:9999', str(script),
        "--epochs=4",
    )  # fmt: skip
    assert res.code == 0, res.err
    assert res.out.count("ok") == 2
    assert "--rdzv-endpoint localhost:9999 on one host" in res.err


def test_pet_environment_defaults_as_torchrun_reads_them(qb2: Path, tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    env = {"PET_NPROC_PER_NODE": "2", "PET_ROLE": "trainer", "PET_STANDALONE": "1",
           "PET_RDZV_ID": "pet-job"}  # fmt: skip
    data = _plan(qb2, str(script), env=env)
    assert len(data["ranks"]) == 2
    assert data["job"] == "pet-job"
    assert {r["env"]["ROLE_NAME"] for r in data["ranks"]} == {"trainer"}
    data = _plan(qb2, "--nproc-per-node", "1", str(script), env=env)  # the flag wins
    assert len(data["ranks"]) == 1
    # --shutdown-timeout's default, as torchrun reads it (torch.distributed.launcher.api).
    data = _plan(qb2, str(script), env={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "12"})
    assert data["grace"] == 12
    data = _plan(qb2, str(script), env={"PET_SHUTDOWN_TIMEOUT": "7"})
    assert data["grace"] == 7
    res = run_cli("launch", "--root", str(qb2), "--dry-run", str(script),
                  env={"PET_NNODES": "1:2"})  # fmt: skip
    assert res.code == 2 and "--nnodes 1:2: ttmesh runs a fixed number of hosts" in res.err


def test_master_addr_and_port_as_torchrun_gives_them(qb2: Path, tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    port = _free_port()
    data = _plan(qb2, "--nproc-per-node", "2", "--master_addr", "127.0.0.1",
                 "--master_port", str(port), str(script))  # fmt: skip
    assert data["master"] == {"addr": "127.0.0.1", "port": port}
    assert {r["env"]["MASTER_ADDR"] for r in data["ranks"]} == {"127.0.0.1"}
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--master-addr", "192.0.2.1",
                  "--master-port", str(port), str(script))  # fmt: skip
    assert res.code == 2
    assert res.err.splitlines()[-1] == (
        "ttmesh: --master-addr 192.0.2.1: not an address of this host (rank 0 listens there) "
        "(give an address of this host, or drop it (ranks meet at 127.0.0.1))"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_role_virtual_local_rank_and_nproc_auto(qb2: Path, tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    data = _plan(qb2, "--nproc-per-node", "auto", "--role", "trainer", "--virtual-local-rank",
                 str(script))  # fmt: skip
    assert len(data["ranks"]) == 4  # one per chip of a QuietBox 2
    assert {r["env"]["LOCAL_RANK"] for r in data["ranks"]} == {"0"}
    assert {r["env"]["RANK"] for r in data["ranks"]} == {"0", "1", "2", "3"}
    assert {r["env"]["ROLE_NAME"] for r in data["ranks"]} == {"trainer"}


def test_flags_with_no_meaning_here_are_taken_and_said_once(qb2: Path, tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--standalone",
                  "--monitor_interval", "5", "--start_method", "fork", "--run_path",
                  "--logs_specs", "x", "--event_log_handler", "null",
                  "--signals_to_handle", "SIGTERM,SIGUSR1", str(script))  # fmt: skip
    assert res.code == 0, res.err
    for flag in ("--monitor-interval", "--start-method", "--run-path", "--logs-specs",
                 "--event-log-handler", "--signals-to-handle"):  # fmt: skip
        assert res.err.count(f"note: {flag} is torchrun's: ") == 1, res.err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--nnodes", "1:2"],
         "ttmesh: --nnodes 1:2: ttmesh runs a fixed number of hosts (no elastic MIN:MAX) "
         "(e.g. --nnodes 2)"),
        (["--numa-binding", "socket"],
         "ttmesh: --numa-binding socket: ttmesh binds ranks by NUMA node only (use "
         "--numa-binding node (each rank on the CPUs of its chip's NUMA node))"),
        (["--numa-binding", "gpu"],
         "ttmesh: --numa-binding 'gpu': torchrun takes node, socket, exclusive, core-complex "
         "(--numa-binding node binds each rank to its chip's NUMA node)"),
        (["--start-method", "thread"],
         "ttmesh: --start-method 'thread': torchrun takes spawn, fork, forkserver (drop it: "
         "each rank is a new process)"),
        (["--nproc-per-node", "gpu"],
         "ttmesh: --nproc-per-node gpu: ttmesh starts workers for chips, not gpus (use "
         "--nproc-per-node auto (one per chip) or a number)"),
        (["--signals-to-handle", "SIGALRM"],
         "ttmesh: --signals-to-handle SIGALRM: ttmesh does not pass it on (ttmesh handles "
         "SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2: drop it)"),
        (["--standalone", "--nnodes", "2"],
         "ttmesh: --standalone with --nnodes 2: --standalone is one host (drop --standalone "
         "for a job over several hosts)"),
    ],
)  # fmt: skip
def test_what_cannot_mean_anything_here_is_one_line(
    qb2: Path, tmp_path: Path, args: list[str], line: str
) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    res = run_cli("launch", "--root", str(qb2), "--dry-run", *args, str(script))
    assert res.code == 2
    assert res.err.splitlines()[-1] == line
    assert "Traceback" not in res.err


def _numa(root: Path, nodes: dict[str, int]) -> None:
    """Put the chips on NUMA nodes (numa_node) and give each node one of this machine's CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    for bdf, node in nodes.items():
        (root / "sys/bus/pci/devices" / bdf / "numa_node").write_text(f"{node}\n")
    for node in set(nodes.values()):
        d = root / f"sys/devices/system/node/node{node}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(f"{cpus[node % len(cpus)]}\n")
        # and its chips' 1 GiB hugepages there (system pre-flight asks per node), 4 a chip
        pages = d / "hugepages" / "hugepages-1048576kB"
        pages.mkdir(parents=True, exist_ok=True)
        count = 4 * sum(n == node for n in nodes.values())
        for name in ("nr_hugepages", "free_hugepages"):
            (pages / name).write_text(f"{count}\n")
    (root / "sys/devices/system/node/online").write_text(f"0-{max(nodes.values())}\n")


def test_numa_binding_node_runs_each_rank_near_its_chip(qb2: Path, tmp_path: Path) -> None:
    """Each rank runs on the CPUs of its chip's NUMA node, read from the root's sysfs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    script = tmp_path / "aff.py"
    script.write_text(
        "import os\nprint('AFF', os.environ['RANK'], sorted(os.sched_getaffinity(0)))\n"
    )
    plan = _plan(qb2, "--tp-size", "2", str(script))
    bdfs = [r["bdfs"][0] for r in plan["ranks"]]
    _numa(qb2, {bdfs[0]: 0, bdfs[1]: 1})
    data = _plan(qb2, "--tp-size", "2", "--numa_binding", "node", str(script))
    assert [r["argv"][1:3] for r in data["ranks"]] == [["-c", str(cpus[0])], ["-c", str(cpus[1])]]
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "2", "--numa-binding", "node",
                  str(script))  # fmt: skip
    assert res.code == 0, res.err
    assert f"[r0] AFF 0 [{cpus[0]}]" in res.out and f"[r1] AFF 1 [{cpus[1]}]" in res.out, res.out


def test_numa_binding_without_numa_node_files_is_one_line(qb2: Path, tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    plan = _plan(qb2, "--tp-size", "1", str(script))
    (qb2 / "sys/bus/pci/devices" / plan["ranks"][0]["bdfs"][0] / "numa_node").unlink()
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--tp-size", "1",
                  "--numa-binding", "node", str(script))  # fmt: skip
    assert res.code == 2
    assert "numa_node does not exist" in res.err.splitlines()[-1]


def test_the_docs_flag_table_covers_every_torchrun_flag() -> None:
    """docs/torchrun.md's table has a row for every torch 2.13 flag (the Output flags: theirs)."""
    from conftest import REPO

    text = (REPO / "docs" / "torchrun.md").read_text()
    table = text[text.index("| torchrun | ttmesh | notes |") :].split("\n\n", 1)[0]
    firsts = [row.split("|")[1] for row in table.splitlines()[2:]]
    missing = [f for f in torchrun.FLAGS if not any(f"`{f}" in cell for cell in firsts)]
    assert not missing


@pytest.mark.parametrize(
    "line",
    [
        "--nnodes=1 --nproc_per_node=2 --rdzv_id=101 --rdzv_endpoint=localhost:5666 "
        "--master_port {port}",
        "--standalone --nnodes 1 --node-rank 0 --nproc-per-node 2",
        "--node_rank 0 --nproc_per_node 2",
        "--nnodes 1:1 --nproc-per-node=2 --max_restarts=0 --rdzv_backend=static",
    ],
)
def test_command_lines_torchrun_users_type_plan_two_ranks(
    qb2: Path, tmp_path: Path, line: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    port = _free_port()
    data = _plan(qb2, *line.format(port=port).split(), str(script), "--lr", "1")
    assert len(data["ranks"]) == 2
    assert data["ranks"][0]["argv"][-3:] == [str(script), "--lr", "1"]
    if "master_port" in line:
        assert data["master"]["port"] == port
