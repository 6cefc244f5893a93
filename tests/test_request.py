"""The launch request (issue 21): built and checked once from the command line, frozen, the
job's mode one value decided in one place, and every stage handing the next a new request
instead of editing the one it got."""

from __future__ import annotations

import copy
import dataclasses
import os
import traceback
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import run_cli, worker

from ttmesh.launcher.planning.request import LaunchRequest

RDZV = ["--rdzv-endpoint", "127.0.0.1:29400"]


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm's, mpirun's and torchrun's variables decide a mode too: none from this shell."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "PET_", "OMPI_")) or key in ("TTMESH_AGENT", "TTMESH_ROOT"):
            monkeypatch.delenv(key)


def _launch(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """What ``ttmesh launch ARGS`` builds from its options (the job is not started)."""
    from ttmesh.cli import launch
    from ttmesh.launcher import modes

    built: list[Any] = []

    class Built(modes.Mode):
        def run(self) -> modes.Result:
            built.append(self.launch)
            return modes.Result(0, self.launch.mode)

    for mode in list(modes.MODES):
        monkeypatch.setitem(modes.MODES, mode, Built)
    res = CliRunner().invoke(launch.launch_cmd, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert len(built) == 1
    return built[0]


def test_the_request_is_frozen() -> None:
    req = LaunchRequest(command=["train.py"], tp_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.tp_size = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.job = "mine"  # type: ignore[misc]


def test_the_request_is_checked_when_made() -> None:
    from ttmesh.errors import TTMeshError

    with pytest.raises(TTMeshError, match="--launcher 'ssh': use direct or mpi"):
        LaunchRequest(command=["train.py"], tp_size=2, launcher="ssh")


def test_the_same_options_build_equal_requests(qb2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--root", str(qb2), "--tp-size", "2", "--env", "A=1", "--grace", "3", "--", "true"]
    first, second = _launch(monkeypatch, *args), _launch(monkeypatch, *args)
    assert first.request == second.request
    assert first.request is not second.request
    request = first.request
    assert (request.tp_size, request.env, request.policy.grace) == (2, [("A", "1")], 3)


@pytest.mark.parametrize(
    ("args", "mode", "tp_size"),
    [
        (["--tp-size", "2"], "one-host", 2),
        ([], "one-host", None),
        (["--nnodes", "1", "--tp-size", "2"], "one-host", 2),
        (["--nnodes", "2", "--node-rank", "1", *RDZV, "--tp-size", "4"], "c10d", 2),
        (["--nnodes", "2:2", "--node-rank", "0", *RDZV], "c10d", None),
        (["--hosts", "a,b", "--tp-size", "4"], "hosts", None),
        (["--hosts", "a,b", "--nnodes", "2"], "hosts", None),
        (["--hosts", "a,b", "--mesh-layout", "mesh", "--tp-size", "4"], "mesh-over-hosts", 4),
        (["--hosts", "a,b", "--mesh-layout", "multi-mesh"], "mesh-over-hosts", None),
    ],
)
def test_the_mode_comes_from_the_flags(
    qb2: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], mode: str, tp_size: int | None
) -> None:
    """One value says how the job starts; --tp-size is the job's over every host (this host's
    share in the request of a c10d agent; --hosts' agents each build their own)."""
    from ttmesh.vocab import JobMode

    launch = _launch(monkeypatch, "--root", str(qb2), *args, "--", "true")
    assert launch.mode is JobMode(mode)
    if mode == "hosts":
        assert launch.request is None
    else:
        assert launch.request.tp_size == tp_size


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--launch-agent", "ssh"], "--launch-agent goes with --hosts and a tt-metal mesh"),
        (
            ["--hosts", "a,b", "--tcp-interface", "eth0"],
            "--tcp-interface goes with --hosts and a tt-metal mesh",
        ),
        (
            ["--hosts", "a,b", "--mesh-layout", "mesh", "--nnodes", "2"],
            "--nnodes 2 with --hosts and a tt-metal mesh",
        ),
        (["--node-rank", "1"], "--node-rank goes with --nnodes N"),
        (["--rdzv-endpoint", "127.0.0.1:29400", "--nnodes", "1:2"], "no elastic MIN:MAX"),
        (["--hosts", "a,b", "--nnodes", "3"], "--nnodes 3 but --hosts names 2 hosts"),
        (["--nnodes", "2\x1b[31m"], "--nnodes '2\\x1b[31m': not a number"),
        (["--hosts", "a"], "name two or more different hosts"),
        (["--nnodes", "2", *RDZV], "--nnodes 2: which host is this?"),
        (
            ["--rank-binding", "a.yaml", "--rank-bindings-mapping", "b.yaml"],
            "--rank-binding and --rank-bindings-mapping together",
        ),
    ],
)
def test_a_mix_no_mode_takes_is_refused_in_one_place(qb2: Path, args: list[str], line: str) -> None:
    """Through the CLI: one line, exit 2, nothing started; in process: refused by the one
    builder of the launch (launcher.planning.options), before anything of the host is read."""
    from ttmesh.cli import launch
    from ttmesh.errors import TTMeshError

    res = run_cli("launch", "--root", str(qb2), *args, *worker("exit=0"))
    said = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
    assert res.code == 2, res.err
    assert len(said) == 1 and line in said[0], res.err
    assert "Traceback" not in res.err
    got = CliRunner().invoke(launch.launch_cmd, ["--root", str(qb2), *args, "--", "true"])
    assert isinstance(got.exception, TTMeshError) and got.exception.code == 2
    assert got.exc_info is not None
    frames = [f.filename for f in traceback.extract_tb(got.exc_info[2])]
    assert any(f.endswith(os.path.join("launcher", "planning", "options.py")) for f in frames)


@pytest.mark.parametrize("tp_size", [2, None])
def test_prepare_does_not_change_the_request(qb2: Path, tmp_path: Path, tp_size: Any) -> None:
    """The request prepare got is what the user asked, after as before; what it resolved
    (chips, port, job, directories) is in the new request it planned from."""
    from ttmesh.cli.params import resolve_host
    from ttmesh.launcher.planning.prepare import prepare

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    req = LaunchRequest(command=[str(script)], tp_size=tp_size, env=[("A", "1")])
    before = copy.deepcopy(req)
    prepared = prepare(req, resolve_host(None, str(qb2)), dry_run=True, ask_metal=False)
    assert req == before
    assert prepared.plan.job and not req.job
    assert len(prepared.plan.ranks) == (tp_size or 4)


def test_a_ranks_environment_is_read_only_once_planned() -> None:
    """RankPlan.env is the plan's: no later stage writes into it (a stage that wants another
    environment makes another RankPlan), and the dict it was made from is copied."""
    from ttmesh.launcher.planning.plan import RankPlan

    given = {"RANK": "0"}
    rank = RankPlan(rank=0, units=(), chips=(), bdfs=(), coord=(0, 0), host_rank=0, mesh_id=0,
                    argv=("true",), env=given)  # fmt: skip
    given["RANK"] = "7"
    assert rank.env == {"RANK": "0"}
    with pytest.raises(TypeError):
        rank.env["ROLE_NAME"] = "trainer"  # type: ignore[index]
    changed = dataclasses.replace(rank, env={**rank.env, "ROLE_NAME": "trainer"})
    assert changed.env == {"RANK": "0", "ROLE_NAME": "trainer"} and rank.env == {"RANK": "0"}


def test_a_mesh_over_hosts_does_not_change_the_request(tmp_path: Path) -> None:
    """meshhosts plans from new requests too: the one it got keeps --tp-size and
    --nproc-per-node unresolved (nproc is one host's, the plan's is every host's)."""
    import json

    from conftest import scratch

    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.nodes import hostreport, meshhosts
    from ttmesh.sim import system
    from ttmesh.sim.create import create

    model = system.load_any("dual-t3k")
    assert isinstance(model, system.ClusterModel)
    with scratch(tmp_path / "hosts") as base:
        reported = []
        for i in range(len(model.hosts)):
            create(model.host(i), base / f"h{i}", config={"reset_seconds": 0.0})
            data = json.loads(json.dumps(hostreport.make(open_host(base / f"h{i}"))))
            reported.append(hostreport.parse(data, f"h{i}"))
        mh = meshhosts.MpiHosts(["h0", "h1"], "/usr/bin/mpirun", (4, 1), environ={})
        req = LaunchRequest(
            command=[], tp_size=None, layout="mesh", nproc=1,  # type: ignore[arg-type]
            job="mh-test", run_dir="/run-dir", cwd="/",
        )  # fmt: skip
        before = copy.deepcopy(req)
        prepared = meshhosts.plan_over(req, reported, mh, descriptor_only=True)
    assert req == before
    assert len(prepared.plan.ranks) == 2
    assert prepared.request is not None
    assert (prepared.request.tp_size, prepared.request.nproc) == (16, 2)


# What ``launch --dry-run --json`` (``ttmesh.plan/1``) holds, in its order: other tools read
# it (docs/conventions.md), so no reshuffle of the stages' values may change it.
PLAN_KEYS = [
    "schema", "chipless", "job", "layout", "mesh_shape", "dim_types", "host_topology",
    "symmetric_dram_mb", "descriptors", "host", "master", "grace", "fabric_grace", "op_timeout",
    "on_reset_notice", "max_restarts", "grouping", "launcher", "ready_timeout", "hang_timeout",
    "serving", "program", "host_view", "hosts", "notes", "passed_over", "checks", "ranks",
]  # fmt: skip
CHIPLESS_KEYS = [
    "schema", "chipless", "job", "layout", "mesh_shape", "dim_types", "host_topology",
    "symmetric_dram_mb", "descriptors", "host", "master", "grace", "fabric_grace", "op_timeout",
    "max_restarts", "grouping", "launcher", "ready_timeout", "hang_timeout", "serving", "hosts",
    "ranks",
]  # fmt: skip
RANK_KEYS = [
    "rank", "chips", "bdfs", "coord", "block", "host_rank", "mesh_id", "argv", "workdir",
    "tmpdir", "env", "unset",
]  # fmt: skip


def test_the_dry_run_json_keeps_its_keys(qb2: Path, runtime: Path) -> None:
    """A plan's JSON from the options through planning, in process: its keys in their order,
    on chips and chipless, and the watch settings and the report where they always were."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.planning.options import Launch, LaunchOptions
    from ttmesh.launcher.planning.prepare import prepare

    host = open_host(qb2)
    options = LaunchOptions(
        host=host, command=("true",), tp_size=2, no_python=True, grace=3.0, max_restarts=2,
        fabric_grace=9.0, op_timeout=7.5, on_reset_notice="pass", ready_timeout=60.0,
        hang_timeout=30.0,
    )  # fmt: skip
    launch = Launch.from_options(options)
    assert launch.request is not None
    plan = prepare(launch.request, host, exclude_arg="0000:01:00.0").plan
    data = plan.to_json()
    assert list(data) == PLAN_KEYS
    assert list(data["ranks"][0]) == RANK_KEYS
    assert list(data["master"]) == ["addr", "port"] and data["master"]["addr"] == "127.0.0.1"
    said = {k: data[k] for k in PLAN_KEYS[11:16] + PLAN_KEYS[18:20]}
    assert said == {
        "grace": 3.0, "fabric_grace": 9.0, "op_timeout": 7.5, "on_reset_notice": "pass",
        "max_restarts": 2, "ready_timeout": 60.0, "hang_timeout": 30.0,
    }  # fmt: skip
    assert [p["why"] for p in data["passed_over"]] == ["excluded: --exclude"]
    assert data["checks"] == [] and isinstance(data["notes"], list)
    chipless = dataclasses.replace(plan, chipless=True).to_json()
    assert list(chipless) == CHIPLESS_KEYS
    assert (chipless["grace"], chipless["max_restarts"]) == (3.0, 2)


def test_the_policy_is_checked_when_made(qb2: Path) -> None:
    """How a job is watched and ended is one frozen value with its own rules, checked when
    made whoever makes it (the launch's options, ``check --active``, a program): one line."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.errors import TTMeshError
    from ttmesh.launcher.planning.options import Launch, LaunchOptions
    from ttmesh.launcher.planning.request import Policy

    for settings, said in (
        ({"on_reset_notice": "bogus"}, "--on-reset-notice 'bogus': use stop or pass"),
        ({"on_reset_notice": "STOP"}, "--on-reset-notice 'STOP': use stop or pass"),
        ({"probe_timeout": 5.0}, "--probe-timeout goes with --probe-interval"),
        ({"ready_pattern": "("}, "--ready-pattern '(': not a regular expression RE2 can run"),
    ):
        with pytest.raises(TTMeshError, match=said.replace("(", r"\(")) as made:
            Policy(**settings)  # type: ignore[arg-type]
        assert "\n" not in str(made.value)
        options = LaunchOptions(host=open_host(qb2), command=("true",), **settings)  # type: ignore[arg-type]
        with pytest.raises(TTMeshError, match="--") as launched:
            Launch.from_options(options)
        assert str(launched.value) == str(made.value) or "goes with a server" in str(launched.value)
    policy = Policy(max_restarts=2, grace=1.5, ready_pattern="^ready$")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.grace = 9.0  # type: ignore[misc]
    request = LaunchRequest(command=["true"], tp_size=2, policy=policy)
    assert request.policy is policy and LaunchRequest(command=["t"], tp_size=1).policy == Policy()
