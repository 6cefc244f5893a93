"""A tt-metal mesh over several hosts, checked by tt-metal itself (ttnn's control plane in mock
mode, no hardware): the files ``ttmesh descriptor --hosts`` writes from the reports of emulated
hosts (tests/hosts.py) are mapped by ``mesh-mpi-check``, one MPI rank per host, each rank with
its own mock cluster (tt-metal takes the file's name for the host's).

* tt-metal's own dual-T3K (Wormhole, 2 hosts): one 1x16 mesh, host_topology 1x2.
* tt-metal's own quad Galaxy (Wormhole 6U, 4 hosts): one 8x16 RING x RING mesh, host_topology 1x4,
  with the physical grouping descriptor ttmesh writes for Galaxy meshes.
* Host ranks swapped against the wiring are refused by tt-metal.

The reports go through mpirun (the emulated hosts' launch agent); the check itself runs every
rank on this machine (Open MPI does not carry MPI traffic between the emulated hosts: see
tests/data/captures/README.md). About 5-10 s a check on 2 cores.
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
from conftest import CONFORMANCE, scratch
from hosts import can_emulate, launch_agent, make_hosts, mpi_env

pytestmark = pytest.mark.conformance
WHY = can_emulate()
LIMIT = 90.0


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
