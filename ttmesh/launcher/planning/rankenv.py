"""The rules of a rank's environment: what ttmesh sets for every rank, what is never inherited
from ttmesh's own environment, and what the user may not set with ``--env``.
"""

from __future__ import annotations

import re

ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Never inherited from ttmesh's own environment: each rank gets its own (or none).
RANK_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TT_VISIBLE_DEVICES",
    "TT_METAL_VISIBLE_DEVICES",
    "LIBTT_SYMMETRIC_DRAM_MB",
    "TT_METAL_MOCK_CLUSTER_DESC_PATH",
)
# TT_RUN_SUBCONTEXT_*: tt-metal splits its world by them (--rank-bindings-mapping); tt-run
# never passes them on from its own environment either.
RANK_PREFIXES = ("TT_MESH_", "TORCHELASTIC_", "TTMESH_", "TT_RUN_SUBCONTEXT_")


# Open MPI 5's MCA parameter for btl/sm's backing directory (opal/mca/btl/sm); ttnn bundles it.
SEGMENT_VAR = "OMPI_MCA_btl_sm_backing_directory"


def scrubbed(key: str) -> bool:
    return key in RANK_VARS or key.startswith(RANK_PREFIXES)


def unbuffered(*envs: dict[str, str]) -> dict[str, str]:
    """``PYTHONUNBUFFERED=1`` unless one of ``envs`` (the user's shell, ``--env``) sets it, even
    empty. torchrun runs a script as ``python -u``: a rank's prints reach the console as they
    are made, and a rank killed by SIGKILL keeps its last lines. The variable does the same for
    every Python process of the rank (``python x.py`` after ``--``, a shell script's python),
    and nothing to a program that is not Python."""
    if any("PYTHONUNBUFFERED" in env for env in envs):
        return {}
    return {"PYTHONUNBUFFERED": "1"}


# Variables ttmesh sets for every rank, and the flag that decides each: --env may not set them
# (a rank told RANK=5, or given a chip outside the job's lease, breaks the job's contract).
_EACH_RANK = "each rank gets its own"
_WORLD = "--tp-size or --nproc-per-node"
OWNED = {
    "RANK": _EACH_RANK,
    "LOCAL_RANK": _EACH_RANK,
    "GROUP_RANK": _EACH_RANK,
    "ROLE_RANK": _EACH_RANK,
    "WORLD_SIZE": _WORLD,
    "LOCAL_WORLD_SIZE": _WORLD,
    "GROUP_WORLD_SIZE": _WORLD,
    "ROLE_WORLD_SIZE": _WORLD,
    "ROLE_NAME": "every rank's role is 'default'",
    "MASTER_ADDR": "ranks on one host meet at 127.0.0.1",
    "MASTER_PORT": "--master-port",
    "TT_VISIBLE_DEVICES": "--chips (and --exclude)",
    "TT_METAL_VISIBLE_DEVICES": "--chips (and --exclude)",
    "TT_MESH_GRAPH_DESC_PATH": "--mesh-layout and --mesh-shape, or --rank-binding",
    "TT_MESH_ID": "--mesh-layout, or --rank-binding",
    "TT_MESH_HOST_RANK": "--mesh-layout, or --rank-binding",
    "LIBTT_SYMMETRIC_DRAM_MB": "--symmetric-dram-mb",
    "TT_METAL_MOCK_CLUSTER_DESC_PATH": "--sim or --root (a simulated host gives each rank its "
    "mock cluster)",
    "TORCHELASTIC_MAX_RESTARTS": "--max-restarts",
    "TORCHELASTIC_RUN_ID": "--job-id",
    "TORCHELASTIC_RESTART_COUNT": "each attempt counts itself",
}
OWNED_PREFIXES = {
    "TT_MESH_": "--mesh-layout",
    "TT_RUN_SUBCONTEXT_": "--rank-bindings-mapping",
    "TORCHELASTIC_": "ttmesh keeps torchrun's contract",
    "TTMESH_": "TTMESH_ variables are ttmesh's own",
}


def owner_flag(key: str) -> str | None:
    """What decides ``key`` when ttmesh owns it (None: the user may set it)."""
    if key in OWNED:
        return OWNED[key]
    return next((flag for p, flag in OWNED_PREFIXES.items() if key.startswith(p)), None)


SERVER_KEEPS = (
    "TTMESH_",
    "TT_METAL_MOCK_CLUSTER_DESC_PATH",
    "TT_METAL_CACHE",
    "TORCHELASTIC_ERROR_FILE",
)
