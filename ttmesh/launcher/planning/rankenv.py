"""The rules of a rank's environment: what ttmesh sets for every rank, what is never inherited
from ttmesh's own environment, and what the user may not set with ``--env``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from ttmesh.dataclass import dataclass

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


def unbuffered(*envs: Mapping[str, str]) -> dict[str, str]:
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


# --------------------------------------------------------------------------- torchrun's contract


class _Policy(Protocol):
    """What a rank's environment reads of the job's policy (``planning.request.Policy``)."""

    @property
    def max_restarts(self) -> int: ...
    @property
    def op_timeout(self) -> float | None: ...


class _Job(Protocol):
    """What torchrun's variables take from the request (``planning.request.LaunchRequest``)."""

    @property
    def master_addr(self) -> str: ...
    @property
    def master_port(self) -> int: ...
    @property
    def policy(self) -> _Policy: ...
    @property
    def job(self) -> str: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def role(self) -> str | None: ...
    @property
    def virtual_local_rank(self) -> bool: ...


@dataclass(frozen=True)
class Place:
    """A rank's place in the job, as torchrun's variables say it (node-major over hosts)."""

    rank: int
    world: int
    local_world: int  # ranks on its host
    node: int  # its host (0 on one host)
    nnodes: int


def torchrun_env(place: Place, req: _Job) -> dict[str, str]:
    """torchrun's contract and ttmesh's own variables for a rank of ``req``
    (``planning.request.LaunchRequest``): its place, where ranks meet, the job's restarts,
    id and error file; ``ROLE_NAME`` and ``LOCAL_RANK`` as torchrun's ``--role`` and
    ``--virtual-local-rank`` say (:func:`torchrun_flags`)."""
    rank, world = place.rank, place.world
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank - place.node * place.local_world),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(place.local_world),
        "GROUP_RANK": str(place.node),
        "GROUP_WORLD_SIZE": str(place.nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        "MASTER_ADDR": req.master_addr,
        "MASTER_PORT": str(req.master_port),
        "TORCHELASTIC_MAX_RESTARTS": str(req.policy.max_restarts),
        "TORCHELASTIC_RUN_ID": req.job,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": f"{req.run_dir}/errors/rank{rank}.json",
        **torchrun_flags(req),
    }


def torchrun_flags(req: _Job) -> dict[str, str]:
    """What torchrun's ``--role`` and ``--virtual-local-rank`` set in every rank, whatever its
    kind (a server's too): ROLE_NAME, and LOCAL_RANK 0 (each rank sees only its own chips)."""
    out = {}
    if req.role is not None:
        out["ROLE_NAME"] = req.role
    if req.virtual_local_rank:
        out["LOCAL_RANK"] = "0"
    return out


# --------------------------------------------------------------------------- program profiles

# torch_tpu's distributed variables (torch_tpu 0.2.0: WORLD_SIZE present, even 1, puts it in
# distributed mode, which needs the first two; torch_tpu/_internal/distributed/distributed.py
# describes them, and torchrun sets none). A torch-tpu job's ranks get ttmesh's (torch_tpu_env),
# never a launcher's above, and --env may not set them.
TORCH_TPU_OWNED = {
    "TORCH_TPU_SLICEBUILDER_ADDRESSES": "each rank gets the job's slice addresses (a free "
    "port per process)",
    "TORCH_TPU_TOPOLOGY": "--mesh-shape (the job's chips, as C,R,1)",
    "TORCH_TPU_INTERNAL_HANDSHAKE_PORT": "each job gets a free handshake port of its own",
    "TORCH_TPU_DEVICES_PER_HOST": "--tp-size or --nproc-per-node (processes on each host)",
    "TORCH_TPU_XPROF_SESSION_ID": "every rank of a job shares one profiling session",
    "TPU_WORKER_HOSTNAMES": "--nnodes (the job's hosts)",
    "NNODES": "--nnodes",
    "NODE_RANK": "each host's --node-rank",
}
# What torch_tpu derives from those for its PJRT plugin (libtpu's variables) and its process
# group: it keeps a value it finds, so one a launcher above left would win over the job's own.
TORCH_TPU_DERIVED = (
    "TPU_VISIBLE_CHIPS",
    "TPU_VISIBLE_DEVICES",
    "TPU_PROCESS_BOUNDS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_HOST_BOUNDS",
    "TPU_PROCESS_ADDRESSES",
    "TPU_PROCESS_PORT",
    "CLOUD_TPU_TASK_ID",
    "TORCHCOMM_RANK",
    "TORCHCOMM_SIZE",
    "JOB_COMPLETION_INDEX",
)
# A rank's own TMPDIR: libtt extracts its runtime (415 MB) there at every start.
PRIVATE_DIRS_OWNED = {
    "TMPDIR": "each rank gets a TMPDIR of its own, under the job's run directory (libtt "
    "extracts its runtime there at every start)"
}


def program_owner(contract: str, private_dirs: bool, key: str) -> str | None:
    """Why a program profile's job sets ``key`` for every rank (None: the user may)."""
    if contract == "torch-tpu":
        if key in TORCH_TPU_OWNED:
            return TORCH_TPU_OWNED[key]
        if key in TORCH_TPU_DERIVED:
            return "torch_tpu derives it from the job's TORCH_TPU_ variables"
    return PRIVATE_DIRS_OWNED.get(key) if private_dirs else None


def program_scrubbed(program: Any) -> frozenset[str]:
    """The launcher's variables a program profile's ranks never inherit (``plan.program``)."""
    if program is None:
        return frozenset()
    profile = program.profile
    keys: set[str] = set()
    if profile.contract == "torch-tpu":
        keys |= set(TORCH_TPU_OWNED) | set(TORCH_TPU_DERIVED)
    if profile.private_dirs:
        keys |= set(PRIVATE_DIRS_OWNED)
    return frozenset(keys)


@dataclass(frozen=True)
class TpuSlice:
    """What every rank of a torch-tpu job shares (chosen once, when the job is prepared)."""

    addresses: tuple[str, ...]  # host:port, one per process in global rank order
    topology: str  # TORCH_TPU_TOPOLOGY: the job's chips as x,y,z bounds (C,R,1)
    handshake_port: int  # rank 0 binds it on MASTER_ADDR (torch_tpu's default, 36423, is shared)
    session: str  # TORCH_TPU_XPROF_SESSION_ID
    hosts: tuple[str, ...] = ()  # TPU_WORKER_HOSTNAMES, over several hosts

    def to_json(self) -> dict[str, Any]:
        return {
            "addresses": list(self.addresses),
            "topology": self.topology,
            "handshake_port": self.handshake_port,
            "session": self.session,
            "hosts": list(self.hosts),
        }


def topology(shape: tuple[int, int]) -> str:
    """TORCH_TPU_TOPOLOGY of an R x C mesh: ``C,R,1``. torch_tpu's bounds are TPU chip bounds,
    x first: x is the minor (fastest-changing) dimension, as a row's columns are in ttmesh's
    row-major mesh coordinates; the product is the chip count, the world size with one process
    per chip."""
    rows, cols = shape
    return f"{cols},{rows},1"


def slice_over_hosts(local: TpuSlice, hosts: list[tuple[str, list[int], int]]) -> TpuSlice:
    """The slice of a job over several hosts, from each host's part in node order (its
    address, the ports it chose and holds for its processes, its handshake port): every
    process's address, node 0's handshake port (rank 0 binds it on MASTER_ADDR, node 0's), the
    hosts stacked along y (each host's C,R,1 is C,R x hosts,1 in all), as torch_tpu's own
    launcher sets TPU_WORKER_HOSTNAMES and the addresses for a multi-host slice."""
    x, y, z = (int(v) for v in local.topology.split(","))
    return TpuSlice(
        addresses=tuple(f"{addr}:{port}" for addr, ports, _ in hosts for port in ports),
        topology=f"{x},{y * len(hosts)},{z}",
        handshake_port=hosts[0][2],
        session=local.session,
        hosts=tuple(addr for addr, _, _ in hosts),
    )


def torch_tpu_env(tpu: TpuSlice, per_host: int, node: int = 0) -> dict[str, str]:
    """torch_tpu's contract for a rank of a torch-tpu job (beyond torchrun's variables, which
    ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` already give): the same slice addresses,
    topology, handshake port and profiling session on every rank, and the processes on each
    host (``TORCH_TPU_DEVICES_PER_HOST``, which with ``LOCAL_RANK`` gives torch_tpu its
    node-local store). Over several hosts, the hosts too (``TPU_WORKER_HOSTNAMES``,
    ``NNODES``, ``NODE_RANK``), as torch_tpu's own launcher (``set_tpu_launch_env``) sets them."""
    env = {
        "TORCH_TPU_SLICEBUILDER_ADDRESSES": ",".join(tpu.addresses),
        "TORCH_TPU_TOPOLOGY": tpu.topology,
        "TORCH_TPU_INTERNAL_HANDSHAKE_PORT": str(tpu.handshake_port),
        "TORCH_TPU_DEVICES_PER_HOST": str(per_host),
        "TORCH_TPU_XPROF_SESSION_ID": tpu.session,
    }
    if len(tpu.hosts) > 1:
        env["TPU_WORKER_HOSTNAMES"] = ",".join(tpu.hosts)
        env["NNODES"] = str(len(tpu.hosts))
        env["NODE_RANK"] = str(node)
    return env


SERVER_KEEPS = (
    "TTMESH_",
    "TT_METAL_MOCK_CLUSTER_DESC_PATH",
    "TT_METAL_CACHE",
    "TORCHELASTIC_ERROR_FILE",
)


# --------------------------------------------------------------------------- a rank's environment


class _Rank(Protocol):
    @property
    def env(self) -> Mapping[str, str]: ...


class _Plan(Protocol):  # what a rank's environment reads of the (frozen) plan
    @property
    def serving(self) -> Any: ...

    @property
    def policy(self) -> _Policy: ...

    @property
    def program(self) -> Any: ...


def inherited(environ: Mapping[str, str], also: frozenset[str] = frozenset()) -> dict[str, str]:
    """What a rank keeps of the launcher's environment: all of it but the rank variables a
    torchrun, ttmesh or tt-run above left (:func:`scrubbed`), and ``also`` (a program
    profile's own: :func:`program_scrubbed`)."""
    return {k: v for k, v in environ.items() if not scrubbed(k) and k not in also}


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
    op_timeout = plan.policy.op_timeout
    if op_timeout is not None:  # the flag wins over the shell's (--env is refused with it)
        out[OP_TIMEOUT_VAR] = f"{op_timeout:g}"
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
    kept = inherited(environ, program_scrubbed(getattr(plan, "program", None)))
    return {**own, **{k: v for k, v in kept.items() if k not in own}}


def unset(plan: _Plan, rank: _Rank, environ: Mapping[str, str]) -> list[str]:
    """The launcher's variables a rank does not get at all (rank variables ttmesh does not set
    for it): a rank's environment is ``environ`` minus these, plus :func:`ttmesh_env`, as
    ``--dry-run`` shows them (``unset``, ``env``)."""
    own = ttmesh_env(plan, rank, environ)
    also = program_scrubbed(getattr(plan, "program", None))
    return sorted(k for k in environ if (scrubbed(k) or k in also) and k not in own)
