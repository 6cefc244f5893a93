"""tt-run's rank-binding file, written from a ttmesh plan (``ttmesh descriptor --rank-bindings``).

tt-run (tt-metal's MPI launcher) reads ``rank_bindings`` (rank, mesh_id, mesh_host_rank,
env_overrides), ``global_env`` and ``mesh_graph_desc_path``; :func:`ttrun.dump` writes it."""

from __future__ import annotations

from typing import Any

from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.vocab import Layout


def rank_binding(plan: LaunchPlan, mesh_graph_desc_path: str) -> dict[str, Any]:
    bindings = []
    for r in plan.ranks:
        overrides = {"TT_VISIBLE_DEVICES": r.env["TT_VISIBLE_DEVICES"]}
        if plan.layout == Layout.ISOLATED:
            overrides["TT_MESH_GRAPH_DESC_PATH"] = r.env["TT_MESH_GRAPH_DESC_PATH"]
        bindings.append(
            {
                "rank": r.rank,
                "mesh_id": r.mesh_id,
                "mesh_host_rank": r.host_rank,
                "env_overrides": overrides,
            }
        )
    return {
        "rank_bindings": bindings,
        "global_env": {"LIBTT_SYMMETRIC_DRAM_MB": str(plan.symmetric_dram_mb)},
        "mesh_graph_desc_path": mesh_graph_desc_path,
    }
