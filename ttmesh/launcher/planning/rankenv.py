"""The rules of a rank's environment: what ttmesh sets for every rank, what is never inherited
from ttmesh's own environment, and what the user may not set with ``--env``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

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


# tt-metal's bound on a dispatch operation (tt_metal/llrt/rtoptions.cpp, a float of seconds):
# a hung operation raises instead of waiting forever. It does not bound opening the mesh (the
# fabric's bring-up). Set by --op-timeout.
OP_TIMEOUT_VAR = "TT_METAL_OPERATION_TIMEOUT_SECONDS"

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


# --------------------------------------------------------------------------- a rank's environment


class _Rank(Protocol):
    @property
    def env(self) -> dict[str, str]: ...


class _Plan(Protocol):
    serving: Any
    op_timeout: float | None


def inherited(environ: Mapping[str, str]) -> dict[str, str]:
    """What a rank keeps of the launcher's environment: all of it but the rank variables a
    torchrun, ttmesh or tt-run above left (:func:`scrubbed`)."""
    return {k: v for k, v in environ.items() if not scrubbed(k)}


def threads(environ: Mapping[str, str]) -> dict[str, str]:
    """torchrun's one OpenMP thread per rank, unless the launcher's environment sets it. The
    same for every rank: under MPI it is in mpirun's own environment, which its ranks inherit."""
    return {} if "OMP_NUM_THREADS" in environ else {"OMP_NUM_THREADS": "1"}


def ttmesh_env(
    plan: _Plan, rank: _Rank, environ: Mapping[str, str], attempt: int = 0
) -> dict[str, str]:
    """What ttmesh sets in a rank's environment, on top of what it inherits: the plan's (its
    variables, ``--env``), then, unless the launcher's environment or ``--env`` sets them,
    ``PYTHONUNBUFFERED`` (:func:`unbuffered`) and, for a worker (a server sizes its own
    threads and has no torchrun contract), one OpenMP thread and the attempt's
    ``TORCHELASTIC_RESTART_COUNT``; with ``--op-timeout``, tt-metal's operation timeout.
    ``--dry-run`` prints this as a rank's ``env``."""
    env = dict(environ)
    out = {**rank.env, **unbuffered(env, rank.env)}
    if plan.op_timeout is not None:  # the flag wins over the shell's (--env is refused with it)
        out[OP_TIMEOUT_VAR] = f"{plan.op_timeout:g}"
    if plan.serving is None:
        out["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
        out.update({k: v for k, v in threads(env).items() if k not in rank.env})
    return out


def rank_env(
    plan: _Plan, rank: _Rank, environ: Mapping[str, str], attempt: int = 0
) -> dict[str, str]:
    """The complete environment of one rank's process in attempt ``attempt``: ``environ`` (the
    launcher's, passed in, never read here) without the rank variables, then
    :func:`ttmesh_env`. Every starter runs a rank with it, mpirun's ``-x`` exports are it
    minus what mpirun passes through itself, and ``--dry-run`` prints it (as ``env`` and
    ``unset``): what a rank gets is what the dry run shows, by construction."""
    own = ttmesh_env(plan, rank, environ, attempt)
    return {**own, **{k: v for k, v in inherited(environ).items() if k not in own}}


def unset(plan: _Plan, rank: _Rank, environ: Mapping[str, str]) -> list[str]:
    """The launcher's variables a rank does not get at all (rank variables ttmesh does not set
    for it): a rank's environment is ``environ`` minus these, plus :func:`ttmesh_env`, as
    ``--dry-run`` shows them (``unset``, ``env``)."""
    own = ttmesh_env(plan, rank, environ)
    return sorted(k for k in environ if scrubbed(k) and k not in own)
