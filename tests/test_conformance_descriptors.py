"""Simulated hosts' cluster descriptors against the real Tenstorrent libraries (no hardware).

``mgd-check`` asks tt-metal's control plane (ttnn in mock-cluster mode) to map the stock mesh
graph descriptor of each system onto the simulated host's ``cluster_descriptor.yaml``; ``umd-parse``
asks tt-umd's own parser to read it. Expected results: tests/data/captures/README.md.
The first run installs ttnn and tt-umd into ``$TTMESH_CONFORMANCE_CACHE`` (Python 3.12, network).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CAPTURES, CONFORMANCE, STOCK

from ttmesh.sim import system

pytestmark = pytest.mark.conformance

# system: (tt-metal's stock MGD, the mesh shapes tt-metal derives), from the captures' README.
EXPECTED = {
    "p150": ("p150", "{0: [1, 1]}"),
    "p300": ("p300", "{0: [1, 2]}"),
    "quietbox2": ("p300_x2", "{0: [2, 2]}"),
    "p150x4": ("p150_x4", "{0: [2, 2]}"),
    "p150x8": ("p150_x8", "{0: [2, 4]}"),
    "n150": ("n150", "{0: [1, 1]}"),
    "n300": ("n300", "{0: [1, 2]}"),
    "t3k": ("t3k", "{0: [2, 4]}"),
    "galaxy-wh": ("single_galaxy", "{0: [8, 4]}"),
    "galaxy-bh": ("single_bh_galaxy", "{0: [8, 4]}"),
}


@pytest.fixture(scope="session")
def mgd_dir(ttnn_python: str) -> Path:
    """tt-metal's stock mesh graph descriptors, from the cached ttnn wheel (installed if needed)."""
    ttnn_py = ttnn_python
    proc = subprocess.run(
        [ttnn_py, "-c", "import ttnn, os; print(os.path.dirname(ttnn.__file__))"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TT_LOGGER_LEVEL": "error"},
    )
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1]) / "tt_metal/fabric/mesh_graph_descriptors"
    assert path.is_dir(), path
    return path


def _mgd(mgd_dir: Path, name: str) -> Path:
    path = mgd_dir / f"{name}_mesh_graph_descriptor.textproto"
    assert path.is_file(), path
    return path


def _run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("name", STOCK)
def test_mgd_check_accepts_stock_system(
    name: str, mgd_dir: Path, make_sim: Callable[..., Path]
) -> None:
    mgd, shape = EXPECTED[name]
    root = make_sim(name)
    proc = _run(CONFORMANCE / "mgd-check", root / "cluster_descriptor.yaml", _mgd(mgd_dir, mgd))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == shape


def test_mgd_check_rejects_uncabled_p300_pair(mgd_dir: Path, make_sim: Callable[..., Path]) -> None:
    root = make_sim("p300x2-disconnected")
    proc = _run(
        CONFORMANCE / "mgd-check", root / "cluster_descriptor.yaml", _mgd(mgd_dir, "p300_x2")
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rejected:" in proc.stdout
    assert "mesh_groupings != nullptr" in proc.stdout


@pytest.mark.parametrize("name", STOCK)
def test_umd_parse_accepts_stock_system(name: str, make_sim: Callable[..., Path]) -> None:
    model = system.load(name)
    root = make_sim(name)
    proc = _run(CONFORMANCE / "umd-parse", root / "cluster_descriptor.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    view = json.loads(proc.stdout)
    assert view["ok"] is True
    assert view["chips"] == sorted(c.id for c in model.chips)
    assert view["pci_bdfs"] == {
        str(c.id): c.bdf for c in sorted(model.chips, key=lambda c: c.id) if c.bdf
    }
    assert view["chips_with_mmio"] == {
        str(c.id): c.dev_index for c in model.chips if c.dev_index is not None
    }
    links = {frozenset({(a, ca), (b, cb)}) for a, ca, b, cb in view["links"]}
    assert links == {
        frozenset({(lk.chip_a, lk.chan_a), (lk.chip_b, lk.chan_b)}) for lk in model.links
    }


@pytest.mark.parametrize(("name", "hosts"), [("dual-t3k", 2), ("quad-galaxy", 4)])
def test_umd_parse_sees_each_hosts_cables_as_remote_links(
    name: str, hosts: int, tmp_path: Path
) -> None:
    """tt-umd reads every host of a multi-host system as it reads tt-metal's own capture of that
    host: the same chips and links, and each cable as a link to a remote device (read back from
    tt-umd's own serialization of what it parsed)."""
    from ttmesh.sim.create import create

    cluster = system.load_any(name)
    assert isinstance(cluster, system.ClusterModel)
    for i in range(hosts):
        root = create(cluster.host(i), tmp_path / f"host{i}")
        ours = _run(CONFORMANCE / "umd-parse", root / "cluster_descriptor.yaml")
        theirs = _run(CONFORMANCE / "umd-parse", CAPTURES / f"{name}-host{i}.yaml")
        assert ours.returncode == theirs.returncode == 0, ours.stdout + theirs.stdout
        mine, capture = json.loads(ours.stdout), json.loads(theirs.stdout)
        for key in ("chips", "chips_with_mmio", "links", "remote_links"):
            assert mine[key] == capture[key], (i, key)
        peers = {u for _c, _ch, u, _pc in mine["remote_links"]}
        others = {c.unique_id for j, h in enumerate(cluster.hosts) if j != i for c in h.chips}
        assert mine["remote_links"] and peers <= others
