"""tt-metal worlds over several processes, launched by ttmesh under real mpirun (no hardware).

Every rank runs examples/ttnn_mesh_probe.py with the conformance ttnn: on a simulated host ttmesh
gives each rank its own mock cluster descriptor, so tt-metal's control plane maps the mesh graph
descriptor onto the rank's chips and the probe prints ``PROBE {json}`` (mesh ids, global and local
shape, or tt-metal's refusal). ttmesh prefixes each line with ``[rN] ``.

* Accepted: QuietBox 2 as one 2x2 mesh over 4 processes, four 1x1 meshes, 2 processes x 2 chips,
  one process; p150x4 and p150x8 meshes; T3K as one mesh over its 4 boards and as 4 meshes. STRICT
  descriptors (``--strict-links``), exact shapes, mesh ids and host ranks (checked against the
  ``--dry-run --json`` plan).
* Refused: a link down (ttmesh's pre-flight refuses with exit 3; tt-metal itself refuses the
  per-rank files ``ttmesh descriptor`` writes meanwhile), a host_topology that does not divide the
  mesh, too few ranks for the host_topology. ttmesh exits with the failing rank's code and no
  launch hangs.
* tt-run parity: for an exported rank binding, tt-run's own ``--dry-run`` command gives each rank
  the same tt-metal variables as ttmesh's plan (except TT_METAL_RUNTIME_ROOT, on purpose), and the
  binding runs under ``ttmesh launch --rank-binding``.

Needs mpirun (Debian: openmpi-bin; .ci/run installs it) and the cached ttnn (Python 3.12, network
on first use). Each launch costs 1-6 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import CONFORMANCE, REPO, Result, run_cli

pytestmark = pytest.mark.conformance

PROBE = str(REPO / "examples" / "ttnn_mesh_probe.py")  # absolute: MPI ranks run in a job directory
QUIET = ("--env", "TT_LOGGER_LEVEL=error", "--env", "LOGURU_LEVEL=INFO")
LIMIT = 60.0  # seconds a launch may take, refused or not: a refusal must not hang the world
PROBE_LINE = re.compile(r"^\[r(\d+)\] PROBE (\{.*\})\s*$")
QB2 = ["0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"]


# --------------------------------------------------------------------------- fixtures, helpers


@pytest.fixture(scope="session")
def ttnn_py(ttnn_python: str) -> str:
    """The conformance Python 3.12 with ttnn; these tests also need mpirun."""
    if shutil.which("mpirun") is None:
        pytest.skip("conformance prerequisite missing: mpirun (apt-get install openmpi-bin)")
    return ttnn_python


@dataclass
class Launch:
    res: Result
    seconds: float
    probes: dict[int, dict]  # rank -> the probe's report


def probes_of(stdout: str) -> dict[int, dict]:
    """Each rank's ``[rN] PROBE {json}`` line; a rank reporting twice or under another rank's
    prefix is an error."""
    found: dict[int, dict] = {}
    for line in stdout.splitlines():
        match = PROBE_LINE.match(line)
        if not match:
            continue
        rank, report = int(match.group(1)), json.loads(match.group(2))
        assert report["rank"] == rank, line
        assert rank not in found, f"rank {rank} reported twice:\n{stdout}"
        found[rank] = report
    return found


def launch(ttnn_py: str, root: Path, cwd: Path, *args: str) -> Launch:
    """``ttmesh launch --root ROOT ARGS -- ttnn-python probe``, timed."""
    start = time.monotonic()
    res = run_cli(
        "launch",
        "--root",
        str(root),
        *args,
        *QUIET,
        "--",
        ttnn_py,
        PROBE,
        cwd=cwd,  # single-process ranks run here, and tt-metal writes generated/ under it
        timeout=2 * LIMIT,
    )
    seconds = time.monotonic() - start
    assert seconds < LIMIT, f"launch took {seconds:.1f} s:\n{res.err[-3000:]}"
    return Launch(res, seconds, probes_of(res.out))


def dry_plan(ttnn_py: str, root: Path, cwd: Path, *args: str, env: dict | None = None) -> dict:
    res = run_cli(
        "launch",
        "--root",
        str(root),
        *args,
        "--dry-run",
        "--json",
        "--",
        ttnn_py,
        PROBE,
        cwd=cwd,
        env=env,
    )
    assert res.code == 0, res.err
    plan = json.loads(res.out)
    assert [r["rank"] for r in plan["ranks"]] == list(range(len(plan["ranks"])))
    return plan


def text(run: Launch) -> str:
    return f"exit {run.res.code} after {run.seconds:.1f} s\n{run.res.out}\n{run.res.err[-4000:]}"


def refused_by_tt_metal(run: Launch, summary: Path, needle: str) -> dict:
    """ttmesh exits with the failing rank's code (1); every rank that reported was refused and at
    least one report carries tt-metal's message. Returns the failing rank's report."""
    assert run.res.code == 1, text(run)
    assert run.probes, text(run)
    for report in run.probes.values():
        assert "error" in report and "global" not in report, text(run)
    outcome = json.loads(summary.read_text())
    assert (outcome["source"], outcome["code"]) == ("worker", 1), outcome
    assert outcome["rank"] in run.probes, text(run)
    failing = run.probes[outcome["rank"]]
    assert needle in failing["error"], text(run)
    assert f"exit 1: rank {outcome['rank']}'s exit code" in run.res.err, text(run)
    return failing


def write_binding(path: Path, mgd: Path, ranks: list[tuple[int, str]]) -> Path:
    """A tt-run rank-binding file written by hand: one mesh, (host rank, chips) per MPI rank."""
    data = {
        "rank_bindings": [
            {
                "rank": r,
                "mesh_id": 0,
                "mesh_host_rank": host_rank,
                "env_overrides": {"TT_VISIBLE_DEVICES": chips},
            }
            for r, (host_rank, chips) in enumerate(ranks)
        ],
        "mesh_graph_desc_path": str(mgd),
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def blackhole_2x2(path: Path, host_topology: tuple[int, int]) -> Path:
    """A hand-written STRICT 2x2 Blackhole mesh (a QuietBox 2: 2 links between neighbours)."""
    rows, cols = host_topology
    path.write_text(
        "mesh_descriptors {\n"
        '  name: "M0"\n'
        "  arch: BLACKHOLE\n"
        "  device_topology { dims: 2 dims: 2 }\n"
        "  channels { count: 2 policy: STRICT }\n"
        f"  host_topology {{ dims: {rows} dims: {cols} }}\n"
        "}\n"
        'top_level_instance { mesh { mesh_descriptor: "M0" } }\n'
    )
    return path


# --------------------------------------------------------------------------- 1. accepted


@dataclass(frozen=True)
class Case:
    system: str
    args: tuple[str, ...]
    ranks: int
    global_shape: list[int]
    local_shape: list[int]
    mesh_ids: list[int]  # every fabric mesh id, as each rank sees them
    layout: str  # mesh: one mesh, host ranks 0..n-1; multi-mesh: mesh ids 0..n-1; single-process
    host_ranks: list[int] | None = None  # exact, by MPI rank, where pinned down


CASES = [
    pytest.param(
        Case("quietbox2", ("--tp-size", "4", "--mesh-layout", "mesh"), 4, [2, 2], [1, 1], [0],
             "mesh", [0, 1, 3, 2]),
        id="qb2-2x2-over-4-processes",
    ),
    pytest.param(
        Case("quietbox2", ("--tp-size", "4", "--mesh-layout", "multi-mesh"), 4, [1, 1], [1, 1],
             [0, 1, 2, 3], "multi-mesh"),
        id="qb2-four-1x1-meshes",
    ),
    pytest.param(
        Case("quietbox2", ("--tp-size", "4", "--nproc-per-node", "2", "--mesh-layout", "mesh"), 2,
             [2, 2], [1, 2], [0], "mesh"),
        id="qb2-2-processes-x-2-chips",
    ),
    pytest.param(
        Case("quietbox2", ("--tp-size", "4", "--mesh-layout", "single-process"), 1, [2, 2],
             [2, 2], [0], "single-process"),
        id="qb2-single-process",
    ),
    pytest.param(
        Case("p150x4", ("--tp-size", "4", "--mesh-layout", "mesh"), 4, [2, 2], [1, 1], [0],
             "mesh"),
        id="p150x4-2x2-over-4",
    ),
    pytest.param(
        Case("p150x8", ("--tp-size", "8", "--mesh-layout", "mesh"), 8, [2, 4], [1, 1], [0],
             "mesh"),
        id="p150x8-2x4-over-8",
    ),
    pytest.param(
        Case("t3k", ("--tp-size", "8", "--mesh-layout", "mesh"), 4, [2, 4], [1, 2], [0], "mesh"),
        id="t3k-2x4-over-4-boards",
    ),
    pytest.param(
        Case("t3k", ("--tp-size", "8", "--mesh-layout", "multi-mesh"), 4, [1, 2], [1, 2],
             [0, 1, 2, 3], "multi-mesh"),
        id="t3k-four-1x2-meshes",
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_mesh_accepted_by_tt_metal(
    case: Case, ttnn_py: str, make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    root = make_sim(case.system)
    args = (*case.args, "--strict-links")
    plan = dry_plan(ttnn_py, root, tmp_path, *args)
    assert plan["layout"] == case.layout
    assert len(plan["ranks"]) == case.ranks
    run = launch(ttnn_py, root, tmp_path, *args)
    assert run.res.code == 0, text(run)
    assert sorted(run.probes) == list(range(case.ranks)), text(run)
    for rank, report in run.probes.items():
        planned = plan["ranks"][rank]
        assert "error" not in report, text(run)
        assert report["global"] == case.global_shape, text(run)
        assert report["local"] == case.local_shape, text(run)
        assert report["mesh_ids"] == case.mesh_ids, text(run)
        # What the rank was given is what the dry-run plan said it would be.
        assert report["host_rank"] == planned["env"].get("TT_MESH_HOST_RANK"), planned
        assert report["mesh_id"] == planned["env"].get("TT_MESH_ID"), planned
        assert report["visible"] == ",".join(planned["bdfs"]), planned
        assert report["mock"] == f"rank{rank}_cluster_descriptor.yaml", report
    host_ranks = [int(run.probes[r]["host_rank"]) for r in range(case.ranks)]
    mesh_ids = [int(run.probes[r]["mesh_id"]) for r in range(case.ranks)]
    if case.layout == "mesh":
        assert sorted(host_ranks) == list(range(case.ranks)) and set(mesh_ids) == {0}
    elif case.layout == "multi-mesh":
        assert sorted(mesh_ids) == list(range(case.ranks)) and set(host_ranks) == {0}
    else:
        assert (host_ranks, mesh_ids) == ([0], [0])
    if case.host_ranks is not None:
        assert host_ranks == case.host_ranks
        assert [r["host_rank"] for r in plan["ranks"]] == case.host_ranks


# --------------------------------------------------------------------------- 2. refused


def test_link_down_refused_by_preflight(
    ttnn_py: str, make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    """With a link down between two ranks' chips ttmesh does not start the world at all: its
    pre-flight refuses (exit 3) and names the link (the refusal a user sees first)."""
    root = make_sim("quietbox2")
    res = run_cli(
        "sim", "fault", "--root", str(root), "link-down", QB2[0], QB2[2], "--channel", "3"
    )  # fmt: skip
    assert res.code == 0 and "1 link" in res.out, res.err
    run = launch(ttnn_py, root, tmp_path, "--tp-size", "4", "--mesh-layout", "mesh",
                 "--strict-links")  # fmt: skip
    assert run.res.code == 3, text(run)
    assert run.probes == {}, text(run)  # no rank started
    refusal = [ln for ln in run.res.err.splitlines() if ln.startswith("ttmesh: pre-flight:")]
    assert len(refusal) == 1, text(run)
    assert f"between {QB2[0]} and {QB2[2]} is down (ch3<->ch7)" in refusal[0], refusal


def _per_rank_files(root: Path, out: Path) -> list[dict]:
    """``ttmesh descriptor --mesh-layout mesh --per-rank --strict-links -o OUT`` and its ranks."""
    res = run_cli(
        "descriptor", "--root", str(root), "--mesh-layout", "mesh", "--per-rank",
        "--strict-links", "-o", str(out), "--export-rank-binding", str(out / "b.yaml"),
    )  # fmt: skip
    assert res.code == 0, res.err
    return yaml.safe_load((out / "b.yaml").read_text())["rank_bindings"]


def _mesh_mpi_check(out: Path, bindings: list[dict]) -> tuple[int, dict[int, dict], str, float]:
    specs = [
        f"{out}/rank{b['rank']}_cluster_descriptor.yaml,mesh_id={b['mesh_id']},"
        f"host_rank={b['mesh_host_rank']},visible={b['env_overrides']['TT_VISIBLE_DEVICES']}"
        for b in bindings
    ]
    start = time.monotonic()
    proc = subprocess.run(
        [str(CONFORMANCE / "mesh-mpi-check"), str(out / "mesh.textproto"), *specs],
        capture_output=True,
        text=True,
        timeout=2 * LIMIT,
    )
    seconds = time.monotonic() - start
    # The script prints mpirun's untagged output: two ranks' lines may run together, so decode
    # every report wherever it starts.
    decoder = json.JSONDecoder()
    reports = {}
    for match in re.finditer(r'\{"rank": ', proc.stdout):
        report = decoder.raw_decode(proc.stdout, match.start())[0]
        reports[report["rank"]] = report
    return proc.returncode, reports, proc.stdout + proc.stderr, seconds


@pytest.mark.parametrize("link_down", [False, True], ids=["all-links-up", "link-down"])
def test_link_down_refused_by_tt_metal(
    link_down: bool, ttnn_py: str, make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    """tt-metal's own refusal of the same fault: the per-rank mock clusters of the host with the
    link down leave it out, and the STRICT 2x2 mesh over 4 processes no longer fits (with every
    link up the same files are accepted). ``ttmesh descriptor`` itself, once the link is down,
    refuses that mesh as the launch does (exit 3, naming the link: issue 22), so the files are
    written with the links up and each rank's mock cluster rewritten from the damaged host."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.fabric.devices import discover
    from ttmesh.mesh import mock

    root = make_sim("quietbox2")
    out = tmp_path / "desc"
    bindings = _per_rank_files(root, out)
    assert [b["mesh_host_rank"] for b in bindings] == [0, 1, 3, 2]
    if link_down:
        res = run_cli(
            "sim", "fault", "--root", str(root), "link-down", QB2[0], QB2[2], "--channel", "3"
        )  # fmt: skip
        assert res.code == 0, res.err
        again = run_cli("descriptor", "--root", str(root), "--mesh-layout", "mesh",
                        "--strict-links", "-o", str(tmp_path / "again"))  # fmt: skip
        assert again.code == 3 and f"between {QB2[0]} and {QB2[2]} is down" in again.err, again
        host = open_host(str(root))
        asic = {c.bdf: c.asic_id for c in discover(host).chips}
        for b in bindings:
            chips = [asic[bdf] for bdf in b["env_overrides"]["TT_VISIBLE_DEVICES"].split(",")]
            view = mock.for_chips(host, chips, f"rank {b['rank']}, link down")
            (out / f"rank{b['rank']}_cluster_descriptor.yaml").write_text(view)
    mgd = out / "mesh.textproto"
    assert "count: 2" in mgd.read_text() and "policy: STRICT" in mgd.read_text()
    rank0 = yaml.safe_load((out / "rank0_cluster_descriptor.yaml").read_text())
    chans = sorted(c[0]["chan"] for c in rank0["ethernet_connections_to_remote_devices"])
    assert chans == ([6, 8, 9] if link_down else [3, 6, 8, 9])  # ch3 is the link to 05:00.0
    code, reports, output, seconds = _mesh_mpi_check(out, bindings)
    assert seconds < LIMIT, output
    if not link_down:
        assert code == 0, output
        assert sorted(reports) == [0, 1, 2, 3], output
        for report in reports.values():
            assert (report["global"], report["local"]) == ([2, 2], [1, 1]), output
        return
    assert code == 1, output
    assert "global" not in reports.get(0, {}), output
    error = reports[0]["error"]
    assert "could not fit in the discovered physical topology" in error, output
    assert "Strict mode validation failed" in error and "only has 1 channels" in error, output


def test_host_topology_not_dividing_the_mesh_refused(
    ttnn_py: str, make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    """A hand-written binding whose descriptor splits a 2x2 mesh over a 3x1 host topology."""
    root = make_sim("quietbox2")
    mgd = blackhole_2x2(tmp_path / "m.textproto", (3, 1))
    binding = write_binding(
        tmp_path / "b.yaml", mgd, [(0, QB2[0]), (1, QB2[1]), (2, f"{QB2[2]},{QB2[3]}")]
    )
    summary = tmp_path / "summary.json"
    run = launch(ttnn_py, root, tmp_path, "--rank-binding", str(binding),
                 "--summary-json", str(summary))  # fmt: skip
    refused_by_tt_metal(
        run, summary, "Device topology dimensions must be divisible by host topology dimensions"
    )


def test_too_few_ranks_for_the_host_topology_refused(
    ttnn_py: str, make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    """3 ranks of 1 chip for a 2x2 mesh whose descriptor says host_topology 2x2 (4 host ranks)."""
    root = make_sim("quietbox2")
    mgd = blackhole_2x2(tmp_path / "m.textproto", (2, 2))
    binding = write_binding(tmp_path / "b.yaml", mgd, [(0, QB2[0]), (1, QB2[1]), (2, QB2[2])])
    summary = tmp_path / "summary.json"
    run = launch(ttnn_py, root, tmp_path, "--rank-binding", str(binding),
                 "--summary-json", str(summary))  # fmt: skip
    failing = refused_by_tt_metal(run, summary, "mesh_groupings != nullptr")
    assert "has no grouping" in failing["error"], text(run)


# --------------------------------------------------------------------------- 3. tt-run parity

# The variables tt-run manages for each rank (ttnn/distributed/ttrun.py, get_rank_environment),
# besides the binding's global_env and env_overrides.
TTRUN_MANAGED = [
    "TT_MESH_ID",
    "TT_MESH_HOST_RANK",
    "TT_MESH_GRAPH_DESC_PATH",
    "TT_VISIBLE_DEVICES",
    "TT_RUN_RANK",
    "TT_RUN_ORIGINAL_CWD",
    "TT_METAL_HOME",
]


def _ttrun_pythonpath(ttnn_py: str) -> str:
    """tt-run's module imports pydantic, which the ttnn 0.81.1 wheel does not declare: give it
    one, installed next to the cached ttnn (not into it). Empty when ttnn already has it."""
    probe = subprocess.run([ttnn_py, "-c", "import pydantic"], capture_output=True, timeout=120)
    if probe.returncode == 0:
        return ""
    cache = Path(
        os.environ.get("TTMESH_CONFORMANCE_CACHE") or Path.home() / ".cache" / "ttmesh-conformance"
    )
    deps = cache / "ttrun-deps"
    if not (deps / "pydantic").is_dir():
        tmp = cache / f".ttrun-deps.{os.getpid()}"
        proc = subprocess.run(
            [ttnn_py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--target", str(tmp), "pydantic"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, "pip install pydantic for tt-run: " + proc.stderr
        try:
            os.rename(tmp, deps)
        except OSError:  # another run got there first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(deps)


def ttrun_dry_run(ttnn_py: str, binding: Path, cwd: Path, env: dict[str, str]) -> dict[int, dict]:
    """The environment tt-run's ``--dry-run`` would give each rank, from the mpirun command it
    prints (``[tt-run] Command: mpirun ... -np 1 -x K=V ... prog : -np 1 ...``)."""
    tt_run = Path(ttnn_py).parent / "tt-run"
    assert tt_run.is_file(), tt_run
    full = {**env, "TT_LOGGER_LEVEL": "error"}
    extra = _ttrun_pythonpath(ttnn_py)
    if extra:
        full["PYTHONPATH"] = extra
    mpirun_dir = os.path.dirname(shutil.which("mpirun") or "/usr/bin/mpirun")
    full["PATH"] = mpirun_dir + os.pathsep + full.get("PATH", "")
    proc = subprocess.run(
        [str(tt_run), "--dry-run", "--rank-binding", str(binding), ttnn_py, PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env=full,
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "[tt-run] Command: " in ln]
    assert len(lines) == 1, proc.stdout + proc.stderr
    command = lines[0].split("[tt-run] Command: ", 1)[1]
    ranks: dict[int, dict] = {}
    for section in command.split(" : "):
        tokens = section.split()
        assert tokens.count("-np") == 1 and tokens[-1] == PROBE, section
        env_of = dict(
            tokens[i + 1].split("=", 1) for i, tok in enumerate(tokens[:-1]) if tok == "-x"
        )
        ranks[int(env_of["TT_RUN_RANK"])] = env_of
    return ranks


@pytest.fixture
def exported(make_sim: Callable[..., Path], tmp_path: Path) -> tuple[Path, Path]:
    """A QuietBox 2 and the rank binding ttmesh exports for it (a STRICT 2x2 over 4 processes)."""
    root = make_sim("quietbox2")
    out = tmp_path / "desc"
    res = run_cli(
        "descriptor", "--root", str(root), "--mesh-layout", "mesh", "--strict-links",
        "-o", str(out), "--export-rank-binding", str(out / "b.yaml"),
    )  # fmt: skip
    assert res.code == 0, res.err
    return root, out / "b.yaml"


@pytest.mark.parametrize("user_env", [False, True], ids=["defaults", "user-set-env"])
def test_tt_run_and_ttmesh_give_ranks_the_same_env(
    user_env: bool,
    ttnn_py: str,
    exported: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, binding = exported
    for key in ("TT_METAL_HOME", "TT_METAL_RUNTIME_ROOT"):
        monkeypatch.delenv(key, raising=False)
    env: dict[str, str] = {}
    if user_env:
        # The user's own TT_METAL_HOME/RUNTIME_ROOT, and binding variables with ${VAR} in them.
        data = yaml.safe_load(binding.read_text())
        data["global_env"]["PARITY_GLOBAL"] = "${HOME}/global"
        for b in data["rank_bindings"]:
            b["env_overrides"]["PARITY_RANK"] = f"rank{b['rank']}:${{HOME}}"
        binding = binding.with_name("b-user.yaml")
        binding.write_text(yaml.safe_dump(data, sort_keys=False))
        env = {
            "TT_METAL_HOME": str(tmp_path / "metal-home"),
            "TT_METAL_RUNTIME_ROOT": str(tmp_path / "runtime-root"),
        }
    data = yaml.safe_load(binding.read_text())
    from_binding = set(data["global_env"]) | {
        k for b in data["rank_bindings"] for k in b["env_overrides"]
    }
    keys = sorted(set(TTRUN_MANAGED) | from_binding)

    ttrun = ttrun_dry_run(ttnn_py, binding, tmp_path, {**os.environ, **env})
    plan = dry_plan(ttnn_py, root, tmp_path, "--rank-binding", str(binding), env=env)
    assert sorted(ttrun) == [r["rank"] for r in plan["ranks"]] == [0, 1, 2, 3]
    for planned in plan["ranks"]:
        theirs, ours = ttrun[planned["rank"]], planned["env"]
        missing = [k for k in keys if k not in theirs]
        assert not missing, f"tt-run did not set {missing}"  # the comparison is not vacuous
        assert {k: ours.get(k) for k in keys} == {k: theirs[k] for k in keys}, planned["rank"]
        assert theirs["TT_RUN_ORIGINAL_CWD"] == str(tmp_path)
        assert theirs["TT_MESH_HOST_RANK"] == str(data["rank_bindings"][planned["rank"]]
                                                 ["mesh_host_rank"])  # fmt: skip
        if user_env:
            assert theirs["PARITY_GLOBAL"] == os.environ["HOME"] + "/global"
            assert ours["TT_METAL_HOME"] == env["TT_METAL_HOME"]
            assert ours["TT_METAL_RUNTIME_ROOT"] == theirs["TT_METAL_RUNTIME_ROOT"]
            assert ours["TT_METAL_RUNTIME_ROOT"] == env["TT_METAL_RUNTIME_ROOT"]
        else:
            # tt-run defaults TT_METAL_RUNTIME_ROOT to the launch directory (its TT_METAL_HOME
            # default). With an installed ttnn wheel that is wrong: tt-metal then looks for its
            # SoC descriptors under the launch directory and fails ("SoC descriptor file does
            # not exist"). ttmesh deliberately passes TT_METAL_RUNTIME_ROOT only when the user
            # sets it, so the wheel finds its own files.
            assert theirs["TT_METAL_RUNTIME_ROOT"] == str(tmp_path)
            assert "TT_METAL_RUNTIME_ROOT" not in ours
            assert ours["TT_METAL_HOME"] == str(tmp_path)


def test_exported_rank_binding_runs_under_ttmesh(
    ttnn_py: str, exported: tuple[Path, Path], tmp_path: Path
) -> None:
    root, binding = exported
    bindings = yaml.safe_load(binding.read_text())["rank_bindings"]
    run = launch(ttnn_py, root, tmp_path, "--rank-binding", str(binding))
    assert run.res.code == 0, text(run)
    assert sorted(run.probes) == [0, 1, 2, 3], text(run)
    for b in bindings:
        report = run.probes[b["rank"]]
        assert "error" not in report, text(run)
        assert (report["global"], report["local"], report["mesh_ids"]) == ([2, 2], [1, 1], [0])
        assert report["host_rank"] == str(b["mesh_host_rank"])
        assert report["mesh_id"] == str(b["mesh_id"]) == "0"
        assert report["visible"] == b["env_overrides"]["TT_VISIBLE_DEVICES"]
    assert [b["mesh_host_rank"] for b in bindings] == [0, 1, 3, 2]
