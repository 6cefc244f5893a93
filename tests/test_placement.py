"""tt-metal's placement beyond the link graph (issue 22), without tt-metal: the rules of
``ttmesh.mesh.placement`` on stock systems whole and damaged, and the refusals they give.
tests/test_conformance_shapes.py checks the same verdicts against tt-metal itself."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from conftest import run_cli

from ttmesh.cli.hosts import open_host
from ttmesh.fabric.devices import discover
from ttmesh.mesh import placement
from ttmesh.mesh.select import link_graph, select
from ttmesh.sim.system import SystemModel, load


def _without_pair(name: str, a: int, b: int, keep: int = 0) -> SystemModel:
    """The stock system with the links of chips ``a``-``b`` (UMD ids) cut to ``keep``."""
    model = load(name)
    pair = {a, b}
    links = [lk for lk in model.links if {lk.chip_a, lk.chip_b} == pair]
    gone = links[keep:]
    return dataclasses.replace(model, links=[lk for lk in model.links if lk not in gone])


def _build(model: SystemModel, where: Path) -> Path:
    from ttmesh.sim.create import create

    return create(model, where, config={"reset_seconds": 0.0})


def _links_and_chips(root: Path) -> tuple[dict, list[str]]:
    inv = discover(open_host(str(root)))
    return link_graph(inv), [c.asic_id for c in inv.chips]


def test_a_pair_missing_a_link_is_weak_and_only_then(tmp_path: Path) -> None:
    """Whole stock hosts have no weak pair (a Blackhole Galaxy's 2-link pairs beside 4-link
    ones included); a link down makes its pair weak, and STRICT channels drop to its count."""
    for name in ("galaxy-bh", "galaxy-wh", "t3k", "quietbox2"):
        links, chips = _links_and_chips(_build(load(name), tmp_path / name))
        assert placement.weak_pairs(links, chips) == {}, name
    links, chips = _links_and_chips(_build(_without_pair("galaxy-wh", 0, 4, 3), tmp_path / "w"))
    (pair,) = placement.weak_pairs(links, chips)
    assert placement.weak_pairs(links, chips)[pair] == 3
    assert placement.strict_channels(links, chips[:2], chips) == 3


def test_a_whole_galaxy_2x16_needs_its_torus(tmp_path: Path) -> None:
    """tt-metal places a whole Galaxy's 2x16 in its 4x8 grouping: on a Blackhole Galaxy with
    a torus pair gone ttmesh refuses it (exit 2, why, the shapes that fit), keeps 4x8 and
    1x32, and still gives 2x16 on the whole Galaxy."""
    whole = _build(load("galaxy-bh"), tmp_path / "whole")
    cut = _build(_without_pair("galaxy-bh", 0, 8), tmp_path / "cut")
    assert select(discover(open_host(str(whole))), 32, shape=(2, 16)).shape == (2, 16)
    inv = discover(open_host(str(cut)))
    assert select(inv, 32, shape=(4, 8)).shape == (4, 8)
    assert select(inv, 32, shape=(1, 32)).shape == (1, 32)
    res = run_cli("descriptor", "--root", str(cut), "--tp-size", "32", "--mesh-shape", "2x16")
    (line,) = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host")]
    assert res.code == 2 and "only on the Galaxy's whole torus" in line, res.err
    assert "(possible shapes: " in line and ", 4x8)" in line and "2x16" not in line.split("(")[-1]


def test_descriptor_refuses_chips_over_links_down(tmp_path: Path) -> None:
    """``ttmesh descriptor --chips`` over a pair whose links are down: tt-metal, given the host
    as discovery finds it, refuses that mesh, so ttmesh refuses as the launch would (exit 3,
    one line, the reset; no --auto-reset, which descriptor does not have) and writes nothing."""
    root = _build(load("t3k"), tmp_path / "t3k")
    res = run_cli("sim", "fault", "--root", str(root), "link-down", "0000:01:00.0", "0000:02:00.0")
    assert res.code == 0, res.err
    out = tmp_path / "out"
    for args in (["--chips", "0000:01:00.0,0000:02:00.0"], ["--tp-size", "8"]):
        res = run_cli("descriptor", "--root", str(root), *args, "-o", str(out))
        lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host")]
        assert res.code == 3 and len(lines) == 1, (args, res.err)
        assert "ttmesh reset --root" in lines[0] and "--auto-reset" not in lines[0], lines
        assert not out.exists()
    res = run_cli("descriptor", "--root", str(root), "--chips", "0000:03:00.0,0000:04:00.0")
    assert res.code == 0, res.err
