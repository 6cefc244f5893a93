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
                  "--logs_specs", "default", "--event_log_handler", "null",
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


# --------------------------------------------------------------------------- as written


@pytest.mark.parametrize(
    ("args", "written"),
    [
        (["--redirect", "3"], ["--redirects", "3"]),  # pytorch's launcher tests type it so
        (["--redirect=3"], ["--redirects=3"]),
        (["--nproc_per", "2"], ["--nproc_per_node", "2"]),
        (["--nproc-per", "2", "--stand"], ["--nproc-per-node", "2", "--standalone"]),
        (["--rdzv-i=5", "--no-py"], ["--rdzv-id=5", "--no-python"]),
        (["--master-a", "h", "--max-restarts", "1"], ["--master-addr", "h", "--max-restarts", "1"]),
        (["--env", "--redirect", "--redirect", "1"], ["--env", "--redirect", "--redirects", "1"]),
        (["-r3", "-t1", "--virtual-l"], ["-r3", "-t1", "--virtual-local-rank"]),
        (["-r=3", "-t==1"], ["-r3", "-t=1"]),  # argparse reads 3 and =1
    ],
)
def test_a_torchrun_flag_is_taken_by_any_prefix_no_other_option_has(
    args: list[str], written: list[str]
) -> None:
    """torchrun's argparse takes any unambiguous prefix of a long flag; so does ttmesh, for
    torchrun's flags (a value is never read as a flag)."""
    from ttmesh.cli.launch_args import spelled_out

    line = [*args, "train.py", "--redirect", "1"]
    assert command_start(_params(), line) == (len(args), len(args))
    assert spelled_out(_params(), line[: len(args)]) == written


@pytest.mark.parametrize(
    ("prefix", "candidates"),
    [
        ("--nproc", ["--nproc-per-node", "--nproc_per_node"]),  # torchrun refuses it too
        ("--max", ["--max-restarts", "--max_restarts"]),
        ("--sign", ["--signals-to-handle", "--signals_to_handle"]),
        ("--t", ["--tp-size", "--tee", "--tcp-interface"]),  # torchrun's --tee; ttmesh's --tp-size
        ("--r", ["--redirects", "--role", "--run-path", "--rdzv-id", "--root"]),
        ("--lo", ["--log-dir", "--local-addr", "--logs-specs", "--local-ranks-filter"]),
    ],
)
def test_an_ambiguous_prefix_is_refused_naming_every_option_it_could_be(
    prefix: str, candidates: list[str]
) -> None:
    from ttmesh.errors import TTMeshError

    with pytest.raises(TTMeshError) as info:
        command_start(_params(), [prefix, "1", "train.py"])
    assert info.value.code == 2
    said = str(info.value)
    assert said.startswith(f"ambiguous option: {prefix} could match ")
    named = said.split(" could match ", 1)[1].split(" (", 1)[0].split(", ")
    assert set(candidates) <= set(named) and all(n.startswith(prefix) for n in named)


def test_prefixes_end_to_end(qb2: Path, tmp_path: Path) -> None:
    """A torchrun command line with abbreviated flags plans as written out; an ambiguous one
    is one line, exit 2; ttmesh's own options are not abbreviated."""
    script = tmp_path / "t.py"
    script.write_text("")
    data = _plan(qb2, "--nproc_per=2", "--redirect", "3", "--rol", "trainer", str(script))
    assert len(data["ranks"]) == 2 and data["ranks"][0]["env"]["ROLE_NAME"] == "trainer"
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--nproc", "2", str(script))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert res.err.startswith(
        "ttmesh: ambiguous option: --nproc could match --nproc-per-node, --nproc_per_node"
    )
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--summary-js", "x", str(script))
    assert res.code == 2 and "no such option: --summary-js" in res.err


@pytest.mark.slow
def test_prefixes_are_read_as_torchruns_own_parser_reads_them() -> None:
    """Every prefix (3 characters or more) of every long flag of the installed torch's own
    torchrun parser: where torchrun takes it as one flag, ttmesh takes it as that flag, or
    refuses it naming that flag among options of its own that share the prefix; where
    torchrun refuses it as ambiguous, ttmesh refuses it too."""
    import argparse

    from torch.distributed.run import get_args_parser

    from ttmesh.cli.launch_args import spelled_out
    from ttmesh.errors import TTMeshError

    parser = get_args_parser()
    longs = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    longs.remove("--help")  # argparse's own; ttmesh launch --help is ttmesh's
    dest = {o: a.dest for a in parser._actions for o in a.option_strings}
    ours = {o: torchrun.FLAGS.get(o) or torchrun.FLAGS.get("--" + o[2:].replace("_", "-"))
            for o in longs}  # fmt: skip
    checked = 0
    for flag in longs:
        for n in range(3, len(flag) + 1):
            prefix = flag[:n]
            theirs = [o for o in longs if o.startswith(prefix)]
            exact = prefix in dest
            try:
                mine = spelled_out(_params(), [prefix, "1"])[0]
            except TTMeshError as exc:
                named = str(exc).split(" could match ", 1)[-1].split(" (", 1)[0].split(", ")
                assert not exact, prefix
                assert set(theirs) <= set(named), (prefix, theirs, named)
                checked += 1
                continue
            assert exact or len(theirs) == 1, (prefix, theirs)
            assert ours.get(mine) == dest[theirs[0] if not exact else prefix] or mine == prefix, (
                prefix
            )
            checked += 1
    assert checked > 300
    assert isinstance(parser, argparse.ArgumentParser) and parser.allow_abbrev


def test_logs_specs_torchrun_cannot_find_is_refused(qb2: Path, tmp_path: Path) -> None:
    """torchrun resolves --logs-specs NAME among the torchrun.logs_specs entry points and
    refuses a name none has (torch/distributed/run.py _get_logs_specs_class); torch's own
    "default" is taken (and said: ttmesh writes the logs itself)."""
    script = tmp_path / "t.py"
    script.write_text("")
    for spelling in ("--logs-specs", "--logs_specs", "--logs-spec"):
        res = run_cli("launch", "--root", str(qb2), "--dry-run", spelling, "DOESNOT_EXIST",
                      str(script))  # fmt: skip
        assert res.code == 2, res.err
        line = res.err.strip().splitlines()[-1]
        assert "Traceback" not in res.err
        said = spelling if spelling != "--logs-spec" else "--logs-specs"  # as written out
        assert line.startswith(
            f"ttmesh: {said} DOESNOT_EXIST: torchrun finds no entry point "
            "torchrun.logs_specs[DOESNOT_EXIST] (installed: default"
        ), line
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--logs-specs", "default",
                  str(script))  # fmt: skip
    assert res.code == 0, res.err
    assert "note: --logs-specs is torchrun's: ttmesh writes the ranks' logs itself" in res.err


def test_rdzv_conf_keys_are_shown_as_torchrun_reads_them(qb2: Path, tmp_path: Path) -> None:
    """pytorch's launcher tests pass "--rdzv-conf='join_timeout=5,last_call_timeout=1,
    timeout=5'" as one word: the quotes are part of the first key and the last value, as
    torchrun's _parse_rendezvous_config reads them. The note names that key whole, in quotes
    of its own, and says it is not join_timeout."""
    script = tmp_path / "t.py"
    script.write_text("")
    res = run_cli("launch", "--root", str(qb2), "--dry-run",
                  "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'", str(script))  # fmt: skip
    assert res.code == 0, res.err
    notes = [ln for ln in res.err.splitlines() if "--rdzv-conf" in ln]
    assert notes == [
        'ttmesh: note: --rdzv-conf key "\'join_timeout" is not join_timeout (its quotes are part '
        "of it, as torchrun reads it; drop them to set the join timeout): not used",
        "ttmesh: note: --rdzv-conf key last_call_timeout: not used by ttmesh's rendezvous "
        "(--rdzv-timeout, --heartbeat-timeout)",
        "ttmesh: note: --rdzv-conf key timeout: not used by ttmesh's rendezvous "
        "(--rdzv-timeout, --heartbeat-timeout)",
    ]
    assert "--rdzv-conf 'join_timeout" not in res.err
