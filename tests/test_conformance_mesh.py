"""ttmesh's mesh graph descriptors and per-rank mock clusters against tt-metal itself (no hardware).

* ``mgd-check`` (tt-metal's control plane in one process, mock-cluster mode): the descriptor
  ``ttmesh descriptor --strict-links`` writes for every stock system fits that system; it does
  not fit a QuietBox 2 with a link down or two uncabled p300 cards; sub-meshes fit the whole host.
* ``mesh-mpi-check`` (one MPI rank per process, each with its per-rank mock cluster): a QuietBox 2
  as one 2x2 mesh over 4 processes, as four 1x1 meshes, and as 2 processes of 2 chips; a plan
  with two host ranks swapped is refused (the check can fail).
* tt-run's own model (``ttnn.distributed.ttrun.parse_binding_config``) loads the rank-binding
  YAML ttmesh exports.

STRICT everywhere: RELAXED descriptors hide missing links. Each script call costs 1-2 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from conftest import CAPTURES, CONFORMANCE, STOCK, run_cli

from ttmesh.cli.hosts import open_host as Host
from ttmesh.mesh import descriptor as mgd
from ttmesh.mesh import mock

pytestmark = pytest.mark.conformance

SHAPES = {
    "p150": (1, 1),
    "p300": (1, 2),
    "quietbox2": (2, 2),
    "p150x4": (2, 2),
    "p150x8": (2, 4),
    "n150": (1, 1),
    "n300": (1, 2),
    "t3k": (2, 4),
    "galaxy-wh": (8, 4),
    "galaxy-bh": (8, 4),
}
QB2 = ["0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"]


def _run(*argv: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)


def mgd_check(cluster: Path, descriptor: Path) -> subprocess.CompletedProcess[str]:
    return _run(CONFORMANCE / "mgd-check", cluster, descriptor)


def accepted(proc: subprocess.CompletedProcess[str], shape: tuple[int, int]) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"{{0: [{shape[0]}, {shape[1]}]}}"


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("rejected:"), proc.stdout + proc.stderr
    return line


def descriptor(root: Path, out: Path, *args: str) -> Path:
    """``ttmesh descriptor --root ROOT ARGS`` printed to a file; checks it is STRICT."""
    res = run_cli("descriptor", "--root", str(root), *args)
    assert res.code == 0, res.err
    out.write_text(res.out)
    graph = mgd.parse(res.out)
    assert all(m.policy == "STRICT" or m.dims == (1, 1) for m in graph.meshes)
    return out


# --------------------------------------------------------------------------- one process


@pytest.mark.parametrize("name", STOCK)
def test_whole_system_descriptor_fits_the_system(
    name: str, ttnn_python: str, make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    root = make_sim(name)
    desc = descriptor(root, tmp_path / "mesh.textproto", "--strict-links")
    (mesh,) = mgd.parse(desc.read_text()).meshes
    assert mesh.dims == SHAPES[name]
    accepted(mgd_check(root / "cluster_descriptor.yaml", desc), SHAPES[name])


def test_quietbox2_with_a_link_down_is_refused(ttnn_python: str, qb2: Path, tmp_path: Path) -> None:
    """One of the two 01-05 links down: STRICT 2 channels no longer fit; RELAXED still does
    (so the refusal is the link count, not a broken file)."""
    strict = descriptor(qb2, tmp_path / "strict.textproto", "--strict-links")
    relaxed = tmp_path / "relaxed.textproto"
    res = run_cli("descriptor", "--root", str(qb2))
    assert res.code == 0, res.err
    relaxed.write_text(res.out)
    res = run_cli("sim", "fault", "--root", str(qb2), "link-down", QB2[0], QB2[2], "--channel", "3")
    assert res.code == 0, res.err
    live = tmp_path / "live_cluster.yaml"
    live.write_text(mock.whole_host(Host(qb2)))
    # The sim's own file still lists every link; the live view has one 01-05 link fewer.
    assert (
        live.read_text().count("chan:")
        == (qb2 / "cluster_descriptor.yaml").read_text().count("chan:") - 2
    )
    refused(mgd_check(live, strict))
    accepted(mgd_check(live, relaxed), (2, 2))


def test_quietbox2_descriptor_does_not_fit_uncabled_p300s(
    ttnn_python: str, qb2: Path, tmp_path: Path
) -> None:
    strict = descriptor(qb2, tmp_path / "strict.textproto", "--strict-links")
    line = refused(mgd_check(CAPTURES / "p300x2-disconnected.yaml", strict))
    assert "mesh_groupings != nullptr" in line


@pytest.mark.parametrize(
    ("name", "args", "shape"),
    [
        ("galaxy-wh", ["--tp-size", "2"], (1, 2)),
        ("galaxy-wh", ["--tp-size", "4", "--mesh-shape", "2x2"], (2, 2)),
        ("galaxy-bh", ["--tp-size", "2"], (1, 2)),
        ("galaxy-bh", ["--tp-size", "4", "--mesh-shape", "2x2"], (2, 2)),
        ("quietbox2", ["--tp-size", "2"], (1, 2)),
    ],
)
def test_sub_mesh_fits_the_whole_host(
    name: str,
    args: list[str],
    shape: tuple[int, int],
    ttnn_python: str,
    make_sim: Callable[..., Path],
    tmp_path: Path,
) -> None:
    root = make_sim(name)
    desc = descriptor(root, tmp_path / "sub.textproto", *args, "--strict-links")
    (mesh,) = mgd.parse(desc.read_text()).meshes
    assert mesh.dims == shape
    accepted(mgd_check(root / "cluster_descriptor.yaml", desc), shape)


# --------------------------------------------------------------------------- several processes


def per_rank(root: Path, out: Path, *args: str) -> tuple[Path, list[dict], dict]:
    """Descriptor, per-rank mock clusters and rank binding for a plan; (mgd, bindings, yaml)."""
    bind = out / "bind.yaml"
    res = run_cli(
        "descriptor", "--root", str(root), *args, "--per-rank", "-o", str(out),
        "--strict-links", "--export-rank-binding", str(bind),
    )  # fmt: skip
    assert res.code == 0, res.err
    data = yaml.safe_load(bind.read_text())
    return Path(data["mesh_graph_desc_path"]), data["rank_bindings"], data


def rank_spec(out: Path, b: dict, visible: bool = True) -> str:
    spec = f"{out}/rank{b['rank']}_cluster_descriptor.yaml,mesh_id={b['mesh_id']},host_rank={b['mesh_host_rank']}"
    # mesh-mpi-check splits options on commas: one PCI address per rank at most.
    if visible:
        spec += f",visible={b['env_overrides']['TT_VISIBLE_DEVICES']}"
    return spec


def mpi_check(desc: Path, specs: list[str]) -> tuple[int, list[dict], str]:
    """Run mesh-mpi-check; the ranks' JSON reports sorted by rank. mpirun may run two ranks'
    lines together ("{...}PROBE {...}"), so every report is decoded wherever it starts."""
    proc = _run(CONFORMANCE / "mesh-mpi-check", desc, *specs)
    decoder = json.JSONDecoder()
    reports = []
    for match in re.finditer(r'\{"rank": ', proc.stdout):
        reports.append(decoder.raw_decode(proc.stdout, match.start())[0])
    reports.sort(key=lambda r: r["rank"])
    return proc.returncode, reports, proc.stdout + proc.stderr


def test_mpi_quietbox2_one_mesh_over_four_processes(
    ttnn_python: str, qb2: Path, tmp_path: Path
) -> None:
    desc, bindings, _ = per_rank(qb2, tmp_path, "--mesh-layout", "mesh")
    assert [b["mesh_host_rank"] for b in bindings] == [0, 1, 3, 2]
    code, ranks, text = mpi_check(desc, [rank_spec(tmp_path, b) for b in bindings])
    assert code == 0, text
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], text
    for r, b in zip(ranks, bindings, strict=True):
        assert "error" not in r, text
        assert r["global"] == [2, 2] and r["local"] == [1, 1], text
        assert r["mesh_ids"] == [0]
        assert (r["mesh_id"], r["host_rank"]) == ("0", str(b["mesh_host_rank"]))
        assert r["cluster"] == f"rank{b['rank']}_cluster_descriptor.yaml"


def test_mpi_quietbox2_host_ranks_against_the_wiring_are_refused(
    ttnn_python: str, qb2: Path, tmp_path: Path
) -> None:
    """The same plan with ranks 2 and 3 trading host ranks: 01:00.0 and 07:00.0 become mesh
    neighbours, which they are not (the check can fail)."""
    desc, bindings, _ = per_rank(qb2, tmp_path, "--mesh-layout", "mesh")
    swapped = [dict(b) for b in bindings]
    swapped[2]["mesh_host_rank"], swapped[3]["mesh_host_rank"] = (
        bindings[3]["mesh_host_rank"],
        bindings[2]["mesh_host_rank"],
    )
    code, ranks, text = mpi_check(desc, [rank_spec(tmp_path, b) for b in swapped])
    assert code == 1, text
    assert any("error" in r for r in ranks), text


def test_mpi_quietbox2_four_meshes(ttnn_python: str, qb2: Path, tmp_path: Path) -> None:
    desc, bindings, _ = per_rank(qb2, tmp_path, "--mesh-layout", "multi-mesh")
    graph = mgd.parse(desc.read_text())
    assert graph.instances == [("M0", r) for r in range(4)] and len(graph.connections) == 4
    assert [(b["mesh_id"], b["mesh_host_rank"]) for b in bindings] == [(r, 0) for r in range(4)]
    code, ranks, text = mpi_check(desc, [rank_spec(tmp_path, b) for b in bindings])
    assert code == 0, text
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3], text
    for r in ranks:
        assert "error" not in r, text
        assert r["mesh_ids"] == [0, 1, 2, 3]
        assert r["local"] == [1, 1]
        assert r["mesh_id"] == str(r["rank"]) and r["host_rank"] == "0"


def test_mpi_quietbox2_two_processes_of_two_chips(
    ttnn_python: str, qb2: Path, tmp_path: Path
) -> None:
    desc, bindings, _ = per_rank(qb2, tmp_path, "--mesh-layout", "mesh", "--nproc-per-node", "2")
    (mesh,) = mgd.parse(desc.read_text()).meshes
    assert mesh.host_dims == (2, 1)
    assert [b["env_overrides"]["TT_VISIBLE_DEVICES"] for b in bindings] == [
        ",".join(QB2[:2]),
        ",".join(QB2[2:]),
    ]
    code, ranks, text = mpi_check(desc, [rank_spec(tmp_path, b, visible=False) for b in bindings])
    assert code == 0, text
    assert [r["rank"] for r in ranks] == [0, 1], text
    for r in ranks:
        assert "error" not in r, text
        assert r["global"] == [2, 2] and r["local"] == [1, 2], text
        assert r["host_rank"] == str(r["rank"])


# --------------------------------------------------------------------------- tt-run


def _ttrun_path(ttnn_python: str) -> str:
    """tt-run's module imports pydantic, which the ttnn 0.81.1 wheel does not declare: give it
    one, installed next to the cached ttnn (not into it). Empty when ttnn already has it."""
    probe = _run(ttnn_python, "-c", "import pydantic")
    if probe.returncode == 0:
        return ""
    cache = Path(
        os.environ.get("TTMESH_CONFORMANCE_CACHE") or Path.home() / ".cache" / "ttmesh-conformance"
    )
    deps = cache / "ttrun-deps"
    if not (deps / "pydantic").is_dir():
        tmp = cache / f".ttrun-deps.{os.getpid()}"
        proc = _run(
            ttnn_python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
            "--target", tmp, "pydantic",
        )  # fmt: skip
        assert proc.returncode == 0, "pip install pydantic for tt-run: " + proc.stderr
        try:
            os.rename(tmp, deps)
        except OSError:  # another run got there first
            subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return str(deps)


TTRUN_PROBE = """\
import json, sys
from pathlib import Path
from ttnn.distributed.ttrun import parse_binding_config
out = []
for name in sys.argv[1:]:
    cfg = parse_binding_config(Path(name))
    out.append({
        "ranks": [
            {"rank": b.rank, "mesh_id": b.mesh_id, "mesh_host_rank": b.mesh_host_rank,
             "env_overrides": dict(b.env_overrides)}
            for b in cfg.rank_bindings
        ],
        "global_env": dict(cfg.global_env),
        "mesh_graph_desc_path": str(cfg.mesh_graph_desc_path),
    })
print("TTRUN " + json.dumps(out))
"""


def test_rank_binding_loads_in_tt_run(ttnn_python: str, qb2: Path, tmp_path: Path) -> None:
    files = []
    for lay in ("mesh", "multi-mesh"):
        out = tmp_path / lay
        _, _, data = per_rank(qb2, out, "--mesh-layout", lay)
        files.append((out / "bind.yaml", data))
    extra = _ttrun_path(ttnn_python)
    env = {**os.environ, "TT_LOGGER_LEVEL": "error", "LOGURU_LEVEL": "ERROR"}
    if extra:
        env["PYTHONPATH"] = extra
    proc = subprocess.run(
        [ttnn_python, "-c", TTRUN_PROBE, *(str(f) for f, _ in files)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,  # ttnn may write generated/ under the working directory
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("TTRUN "))
    parsed = json.loads(line.removeprefix("TTRUN "))
    for (path, data), seen in zip(files, parsed, strict=True):
        assert seen["ranks"] == data["rank_bindings"], path
        assert [b["rank"] for b in seen["ranks"]] == [0, 1, 2, 3]
        assert seen["global_env"] == data["global_env"]
        assert Path(seen["mesh_graph_desc_path"]) == Path(data["mesh_graph_desc_path"])
        assert Path(seen["mesh_graph_desc_path"]).is_file()
    mesh_ranks, multi_ranks = (p["ranks"] for p in parsed)
    assert [(b["mesh_id"], b["mesh_host_rank"]) for b in mesh_ranks] == [
        (0, 0),
        (0, 1),
        (0, 3),
        (0, 2),
    ]
    assert [(b["mesh_id"], b["mesh_host_rank"]) for b in multi_ranks] == [(r, 0) for r in range(4)]
