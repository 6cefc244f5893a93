"""ttmesh check --active: tt-metal's own verdict on the chips' mesh, run as a ttmesh job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_cli


def test_no_ttnn_is_bad_input(qb2: Path) -> None:
    res = run_cli("check", "--root", str(qb2), "--active", "--ttnn-python", sys.executable)
    assert res.code == 2, res.err
    line = [ln for ln in res.err.splitlines() if ln.startswith("ttmesh:")]
    assert len(line) == 1 and "cannot import ttnn" in line[0] and "pip install ttnn" in line[0]
    res = run_cli("check", "--root", str(qb2), "--active", "--ttnn-python", "/nonexistent/py")
    assert res.code == 2 and "no such interpreter" in res.err


@pytest.mark.conformance
@pytest.mark.parametrize("layout, ranks", [("single-process", 1), ("mesh", 4)])
def test_active_probe_maps_the_mesh(qb2: Path, ttnn_python: str, layout: str, ranks: int) -> None:
    res = run_cli(
        "check",
        "--root",
        str(qb2),
        "--active",
        "--ttnn-python",
        ttnn_python,
        "--mesh-layout",
        layout,
        "--json",
        timeout=300,
    )
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert data["healthy"] is True and data["active"]["ok"] is True
    assert len(data["active"]["ranks"]) == ranks
    assert all(r["global"] == [2, 2] for r in data["active"]["ranks"])


@pytest.mark.conformance
def test_active_probe_on_a_sub_mesh(make_sim, ttnn_python: str) -> None:
    root = make_sim("galaxy-wh")
    res = run_cli(
        "check",
        "--root",
        str(root),
        "--active",
        "--ttnn-python",
        ttnn_python,
        "--chips",
        "0000:01:00.0",
        "--json",
        timeout=300,
    )
    assert res.code == 0, res.err
    assert json.loads(res.out)["active"]["ranks"][0]["global"] == [1, 1]
