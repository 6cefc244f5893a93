"""tt-run compatibility: its rank-binding YAML, written from a ttmesh plan.

tt-run (tt-metal's MPI launcher) reads ``rank_bindings`` (rank, mesh_id, mesh_host_rank,
env_overrides), ``global_env`` and ``mesh_graph_desc_path``; each rank then gets TT_MESH_ID,
TT_MESH_HOST_RANK and TT_MESH_GRAPH_DESC_PATH from it. ttmesh writes the file so a plan can be
handed to tt-run (or to ``ttmesh launch --rank-binding``) unchanged.
"""

from __future__ import annotations

from typing import Any

from ttmesh.launcher.plan import LaunchPlan


def rank_binding(plan: LaunchPlan, mesh_graph_desc_path: str) -> dict[str, Any]:
    bindings = []
    for r in plan.ranks:
        overrides = {"TT_VISIBLE_DEVICES": r.env["TT_VISIBLE_DEVICES"]}
        if plan.layout == "isolated":
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


def dump(data: dict[str, Any], header: str = "") -> str:
    import yaml

    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
