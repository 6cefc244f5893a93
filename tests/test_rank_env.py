"""A rank's environment is built in one place (launcher.planning.rankenv.rank_env): what
``--dry-run --json`` says a rank gets is what the rank's process really gets, for every start
mode; and the plan is built without reading ttmesh's own environment."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from conftest import worker
from users import users_fixture  # noqa: F401

# The only variables a rank's process may have that the dry run does not show, all mpirun's,
# which it adds to every rank it starts (ttmesh neither sets nor can know them): Open MPI's
# and PMIx's own (each process's place in the MPI world, its daemon's URI, its session
# directory: OMPI_COMM_WORLD_RANK and the like; PSM's *_NO_BACKTRACE), PWD (orted sets it to
# the rank's working directory: checked against the plan's workdir), and the front of PATH
# and LD_LIBRARY_PATH (orted puts Open MPI's directories first: the rest is checked). Nothing
# else may differ: not a port, not a path, not a value.
MPI_OWN = ("OMPI_", "PMIX_", "OPAL_", "PRTE_", "HFI_NO_BACKTRACE", "IPATH_NO_BACKTRACE")
MPI_PREPENDS = ("PATH", "LD_LIBRARY_PATH")

needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_env(tmp_path: Path) -> dict[str, str]:
    """The environment both ttmesh runs get, complete (not merged into pytest's): rank
    variables a torchrun above would leave (dropped), settings of the user's (kept)."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "XDG_RUNTIME_DIR", "VIRTUAL_ENV")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {
        **env,
        "LC_ALL": "C.UTF-8",  # Python coerces a C locale by setting LC_CTYPE in its own environ
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "RANK": "99",
        "TORCHELASTIC_RESTART_COUNT": "7",
        "TTMESH_SOMETHING": "stale",
        "MY_SETTING": "kept",
    }


def _run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "ttmesh", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=120,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def _expected(rank: Mapping, launch_env: Mapping[str, str]) -> dict[str, str]:
    """What the dry run says rank ``rank`` gets: the launcher's environment without its
    ``unset``, then its ``env``."""
    unset = set(rank["unset"])
    return {**{k: v for k, v in launch_env.items() if k not in unset}, **rank["env"]}


def _same_env(
    qb2: Path, tmp_path: Path, flags: list[str], mpi: bool = False, threads: str = "1"
) -> None:
    """The dry run of a launch and the launch itself, in one environment and directory: every
    rank's environment is the dry run's, key for key."""
    env = _launch_env(tmp_path)
    out = tmp_path / "envs"
    out.mkdir()
    args = ["launch", "--root", str(qb2), "--job-id", "rankenv", "--master-port",
            str(_free_port()), *flags]  # fmt: skip
    dry = [*args, "--dry-run", "--json", "--show-env", *worker("exit=0")]
    code, text, err = _run(dry, env, tmp_path)
    assert code == 0, err
    planned = json.loads(text)["ranks"]
    code, _, err = _run([*args, *worker(f"env={out}", "exit=0")], env, tmp_path)
    assert code == 0, err
    assert len(planned) == len(list(out.glob("rank*.json"))) > 1
    for rank in planned:
        got = json.loads((out / f"rank{rank['rank']}.json").read_text())
        want = _expected(rank, env)
        if mpi:
            assert got.pop("PWD") == rank["workdir"]
            got = {k: v for k, v in got.items() if not k.startswith(MPI_OWN)}
            for key in MPI_PREPENDS:
                value = got.pop(key, None)
                if key in want:  # what the rank has of it comes after mpirun's
                    assert value is not None and value.endswith(want[key]), (key, value)
                    got[key] = want[key]
        assert sorted(got) == sorted(want), (rank["rank"], set(got) ^ set(want))
        assert got == want, rank["rank"]
        assert got["RANK"] == str(rank["rank"]) and "TTMESH_SOMETHING" not in got
        assert got["MY_SETTING"] == "kept" and got["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert got["OMP_NUM_THREADS"] == threads


@pytest.fixture(autouse=True)
def _runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(rt))
    yield


def test_direct_ranks_get_what_the_dry_run_shows(qb2: Path, tmp_path: Path) -> None:
    # --env wins over torchrun's one OpenMP thread, as over every default of ttmesh's.
    # --op-timeout reaches the ranks as the dry run shows it (TT_METAL_OPERATION_TIMEOUT_SECONDS).
    _same_env(qb2, tmp_path, ["--tp-size", "2", "--env", "OMP_NUM_THREADS=4", "--op-timeout", "7.5"],
              threads="4")  # fmt: skip


@needs_mpirun
def test_mpi_ranks_get_what_the_dry_run_shows(qb2: Path, tmp_path: Path) -> None:
    _same_env(qb2, tmp_path, ["--tp-size", "4", "--launcher", "mpi", "--mesh-layout", "mesh"],
              mpi=True)  # fmt: skip


@needs_mpirun
def test_rank_binding_ranks_get_what_the_dry_run_shows(qb2: Path, tmp_path: Path) -> None:
    import yaml

    mgd = tmp_path / "m.textproto"
    mgd.write_text("# placeholder\n")
    bind = tmp_path / "bind.yaml"
    ranks = [
        {"rank": 0, "mesh_id": 0, "mesh_host_rank": 1,
         "env_overrides": {"TT_VISIBLE_DEVICES": "0000:03:00.0", "FOO": "${HOME}/x"}},
        {"rank": 1, "mesh_id": 0, "mesh_host_rank": 0,
         "env_overrides": {"TT_VISIBLE_DEVICES": "0000:01:00.0"}},
    ]  # fmt: skip
    bind.write_text(yaml.safe_dump({"rank_bindings": ranks, "mesh_graph_desc_path": str(mgd),
                                    "global_env": {"BAR": "b"}}))  # fmt: skip
    _same_env(qb2, tmp_path, ["--rank-binding", str(bind), "--env", "BAZ=z"], mpi=True)


class _Untouchable(dict):
    """An os.environ that may not be read."""

    def _no(self, *_: object) -> None:
        raise AssertionError("build read os.environ")

    __getitem__ = __contains__ = __iter__ = __len__ = get = keys = items = copy = _no  # type: ignore[assignment]


def test_build_reads_no_environment(qb2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan comes from its arguments only: the request's environment and directory."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.planning import plan as planmod
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    req = LaunchRequest(command=[sys.executable, "-c", "pass"], tp_size=2, no_python=True,
                        environ={"HOME": "/home/someone", "MINE": "1"}, cwd="/somewhere",
                        run_dir="/nonexistent/run")  # fmt: skip
    prepared = prepare(req, open_host(qb2), ask_metal=False)
    sel = prepared.selection
    assert sel is not None
    split, outside = planmod.plan_split(req, sel), planmod.surroundings(req)
    monkeypatch.setattr(os, "environ", _Untouchable())
    monkeypatch.setattr(os, "getcwd", lambda: pytest.fail("build read the working directory"))
    try:
        plan = planmod.build(req, prepared.inv, sel, list(req.command), split, outside)
    finally:
        monkeypatch.undo()
    assert plan.ranks[0].env["TT_METAL_CACHE"] == "/home/someone/.cache/ttmesh/tt-metal-cache/rank0"
    assert plan.cwd == "/somewhere" and plan.environ["MINE"] == "1"


DUMP = (
    "import json, os\n"
    "open(os.path.join(os.environ['OUT'], 'rank' + os.environ['RANK'] + '.json'), 'w')"
    ".write(json.dumps(dict(os.environ)))"
)


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_each_users_ranks_get_what_their_dry_run_shows(users: dict, who: str) -> None:
    """Another user's launch (its own HOME, here one that does not exist, and its own cache
    directory): its ranks' environment is its dry run's too."""
    if who not in users:
        pytest.skip("cannot switch to nobody here")
    user = users[who]
    out = Path(tempfile.mkdtemp(dir=user.base))
    out.chmod(0o777)
    args = ["launch", "--root", str(user.sim), "--tp-size", "2", "--job-id", f"env-{who}",
            "--master-port", str(_free_port()), "--env", f"OUT={out}"]  # fmt: skip
    command = ["--", "/usr/bin/python3", "-c", DUMP]
    extra = {"LC_ALL": "C.UTF-8"}  # else Python coerces a C locale by setting LC_CTYPE
    dry = user.run(*args, "--dry-run", "--json", "--show-env", *command, env=extra)
    assert dry.returncode == 0, dry.stderr
    real = user.run(*args, *command, env=extra)
    assert real.returncode == 0, real.stderr
    # The launcher's environment: nobody's is exactly its own (env -i), root's is pytest's.
    launcher_env = {**(user.env if who == "nobody" else os.environ), **extra}
    for rank in json.loads(dry.stdout)["ranks"]:
        got = json.loads((out / f"rank{rank['rank']}.json").read_text())
        want = _expected(rank, launcher_env)
        assert sorted(got) == sorted(want), (who, rank["rank"], set(got) ^ set(want))
        assert got == want, (who, rank["rank"])
        cache = user.env.get("XDG_CACHE_HOME") or os.environ.get("XDG_CACHE_HOME") or "/"
        assert got["TT_METAL_CACHE"].startswith(cache), who


def _sections(argv: list[str]) -> list[dict[str, str]]:
    """The ``-x K=V`` exports of each rank section of an MPMD mpirun command line."""
    out: list[dict[str, str]] = [{}]
    for i, word in enumerate(argv):
        if word == ":":
            out.append({})
        elif word == "-x":
            key, _, value = argv[i + 1].partition("=")
            out[-1][key] = value
    return out


@pytest.mark.parametrize(
    "environ",
    [
        {"PATH": "/bin", "RANK": "9", "MINE": "x"},
        {"PATH": "/usr/bin", "OMP_NUM_THREADS": "8", "PYTHONUNBUFFERED": "", "MINE": "y"},
    ],
)
def test_mpirun_exports_the_rank_env_but_what_it_passes_itself(
    qb2: Path, environ: dict[str, str]
) -> None:
    """Under mpirun a rank gets mpirun's environment and its section's exports: together
    exactly rank_env; every variable of the plan is exported (on another host only the
    exports reach the rank), and nothing mpirun passes through the same is repeated."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.nodes import mpi
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.rankenv import rank_env
    from ttmesh.launcher.planning.request import LaunchRequest

    req = LaunchRequest(command=[sys.executable, "-c", "pass"], tp_size=2, no_python=True,
                        env=[("PATH", "/bin"), ("MINE", "x")], environ=environ)  # fmt: skip
    plan = prepare(req, open_host(qb2), ask_metal=False).plan
    argv, mpirun_env = mpi.mpirun_argv("/usr/bin/mpirun", plan, environ, 3)
    sections = _sections(argv)
    assert len(sections) == len(plan.ranks) == 2
    for rank, exports in zip(plan.ranks, sections, strict=True):
        assert {**mpirun_env, **exports} == rank_env(plan, rank, environ, 3)
        assert set(rank.env) <= set(exports)
        assert exports["TORCHELASTIC_RESTART_COUNT"] == "3"
        repeated = {k for k, v in exports.items() if mpirun_env.get(k) == v} - set(rank.env)
        assert not repeated
