"""LaunchPlan: what to run, on which chips, with which environment. Pure and printable.

:func:`build` turns a request, the host's inventory and a chip selection into a plan without
touching anything: the same plan is what ``--dry-run`` prints and what the supervisor executes.
Files the job needs (mesh graph descriptors) are part of the plan, with their contents.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ttmesh.dataclass import dataclass, field
from ttmesh.fabric.devices import Inventory
from ttmesh.launcher.planning import rankenv
from ttmesh.launcher.planning.rankenv import SEGMENT_VAR, SERVER_KEEPS
from ttmesh.launcher.planning.request import LaunchRequest, Policy
from ttmesh.mesh import layout
from ttmesh.mesh.select import Selection, Unit
from ttmesh.render import plural
from ttmesh.vocab import Layout, StartMode

if TYPE_CHECKING:
    from ttmesh.launcher.planning.programs import ProgramSpec
    from ttmesh.launcher.planning.simview import HostView
    from ttmesh.launcher.serving.spec import ServingSpec

SCHEMA = "ttmesh.plan/1"


GUARDIAN_FILES = 64  # the launcher's and the guardian's own open files, with room to spare


@dataclass(frozen=True)
class RankPlan:
    """One rank: its chips, place in the mesh, command and the environment ttmesh adds."""

    rank: int
    units: tuple[Unit, ...]
    chips: tuple[str, ...]  # asic ids
    bdfs: tuple[str, ...]
    coord: tuple[int, int]
    host_rank: int
    mesh_id: int
    argv: tuple[str, ...]
    # Only what ttmesh adds or changes; read-only (a copy is taken), as the rest of the plan:
    # a stage that wants another environment makes another RankPlan (dataclasses.replace).
    env: Mapping[str, str]
    block_shape: tuple[int, int] = (1, 1)
    workdir: str = ""  # the rank's working directory when not the user's (tt-metal worlds)
    node: int = 0  # the host it runs on (an index into LaunchPlan.hosts)
    tmpdir: str = ""  # its own TMPDIR (a program profile's private_dirs), made before it starts

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def joins_chips(self) -> bool:
        """The worker drives several chips, so it brings their fabric up itself."""
        return len(self.chips) > 1


@dataclass(frozen=True)
class Report:
    """What ``--dry-run`` says beside the ranks: facts about the choice (``notes``), the chips
    the choice left out and why (``passed_over``: ``[{chips, why}]``), and the checks a launch
    runs before its start (``checks``: ``[{check, result: passed | failed | skipped,
    detail}]``). Frozen: a stage with more to say makes a new one (:meth:`noted`, ``replace``)."""

    notes: tuple[str, ...] = ()
    passed_over: tuple[Mapping[str, Any], ...] = ()
    checks: tuple[Mapping[str, str], ...] = ()

    def __post_init__(self) -> None:  # read-only to the entries: a copy is taken, as RankPlan's env
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(
            self, "passed_over", tuple(MappingProxyType(dict(p)) for p in self.passed_over)
        )
        object.__setattr__(self, "checks", tuple(MappingProxyType(dict(c)) for c in self.checks))

    def noted(self, note: str) -> Report:
        """This report with ``note`` after its notes."""
        return replace(self, notes=(*self.notes, note))


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch runs, pure and printable (``--dry-run`` shows it). Frozen: each stage
    after planning reads it, and one that has more to say makes a new one (``replace``): the
    c10d rendezvous's global plan, a dry run's checks."""

    job: str
    layout: str
    mesh_shape: tuple[int, int]
    dim_types: tuple[str, str]
    host_dims: tuple[int, int]
    symmetric_dram_mb: int
    ranks: list[RankPlan]
    files: dict[str, str]  # path -> contents, written before any worker starts
    descriptors: dict[str, str]  # name -> path
    run_dir: str
    root: str
    simulated: bool
    master_addr: str
    master_port: int
    policy: Policy  # how the job is watched and ended: the request's, the very same value
    cwd: str
    user_env_keys: tuple[str, ...] = ()
    grouping: str = ""
    launcher: str = StartMode.DIRECT
    mpirun: str = ""
    serving: ServingSpec | None = None  # readiness, stop, health of a server
    rank_offset: int = 0  # this host's first global rank, in a job over several hosts
    hosts: list[str] = field(default_factory=list)  # a tt-metal mesh over several hosts
    mpi_args: list[str] = field(default_factory=list)  # how mpirun reaches them
    chipless: bool = False  # a server that drives no Tenstorrent chip (build_chipless)
    report: Report = Report()  # what --dry-run says beside the ranks
    # The launcher's environment the plan was made in (the request's): what ``--dry-run``
    # shows each rank's environment against (rankenv.rank_env; the starters pass their own).
    environ: dict[str, str] = field(default_factory=dict)
    # A program profile's job (launcher.planning.programs.ProgramSpec): torch_tpu on libtt, ...
    program: ProgramSpec | None = None
    # A simulated host's view, at the real paths, in each rank's own mount namespace
    # (runtime.hostview); None: the ranks see the machine's own paths.
    host_view: HostView | None = None

    @property
    def fabric_at_start(self) -> bool:
        """The job's layout joins chips, so its workers bring the fabric between them up."""
        return self.layout != Layout.ISOLATED or any(r.joins_chips for r in self.ranks)

    def open_files(self) -> int:
        """About the open files the job's guardian needs at once: each rank's two output pipes
        and, when the ranks write both, their two log files; a simulated host's view's two
        entries a chip; its own (:data:`GUARDIAN_FILES`)."""
        view = len(self.host_view.devices) if self.host_view is not None else 0
        return GUARDIAN_FILES + 4 * len(self.ranks) + 2 * view

    def all_chips(self) -> list[str]:
        """Every chip the job's processes open: their meshes' chips, then the idle rest of their
        boards (a 1x1 mesh on an n300 still opens both chips, so it leases both)."""
        meshes = [a for r in self.ranks for a in r.chips]
        idle = [a for r in self.ranks for u in r.units for a in u.chips if a not in meshes]
        return meshes + list(dict.fromkeys(idle))

    def passed_over_line(self) -> str:
        """The chips the choice left out, and why, in one line (``--dry-run`` lists them)."""
        parts = [f"{', '.join(p['chips'])} ({p['why']})" for p in self.report.passed_over]
        used = ", ".join(b for r in self.ranks for b in r.bdfs)
        return f"note: passed over {'; '.join(parts)}: the job runs on {used}"

    def to_json(self, show_env: bool = False) -> dict[str, Any]:
        def shown(env: Mapping[str, str]) -> dict[str, str]:
            if show_env:
                return dict(env)
            return {k: ("***" if k in self.user_env_keys else v) for k, v in env.items()}

        if self.chipless:
            return self._chipless_json(shown)
        return {
            "schema": SCHEMA,
            "chipless": False,
            "job": self.job,
            "layout": self.layout,
            "mesh_shape": list(self.mesh_shape),
            "dim_types": list(self.dim_types),
            "host_topology": list(self.host_dims),
            "symmetric_dram_mb": self.symmetric_dram_mb,
            "descriptors": dict(self.descriptors),
            "host": {"root": self.root, "simulated": self.simulated},
            "master": {"addr": self.master_addr, "port": self.master_port},
            "grace": self.policy.grace,
            "fabric_grace": self.policy.fabric_grace,
            "op_timeout": self.policy.op_timeout,
            "on_reset_notice": self.policy.on_reset_notice,
            "max_restarts": self.policy.max_restarts,
            "grouping": self.grouping,
            "launcher": self.launcher,
            "ready_timeout": self.policy.ready_timeout,
            "hang_timeout": self.policy.hang_timeout,
            "serving": self.serving.to_json() if self.serving is not None else None,
            "program": self.program.to_json() if self.program is not None else None,
            "host_view": self.host_view.to_json() if self.host_view is not None else None,
            "hosts": list(self.hosts),
            "notes": list(self.report.notes),
            "passed_over": [dict(p) for p in self.report.passed_over],
            "checks": [dict(c) for c in self.report.checks],
            "ranks": [
                {
                    "rank": r.rank,
                    "chips": list(r.chips),
                    "bdfs": list(r.bdfs),
                    "coord": list(r.coord),
                    "block": list(r.block_shape),
                    "host_rank": r.host_rank,
                    "mesh_id": r.mesh_id,
                    **({"node": r.node, "host": self.hosts[r.node]} if self.hosts else {}),
                    "argv": list(r.argv),
                    "workdir": r.workdir or self.cwd,
                    "tmpdir": r.tmpdir or None,
                    **self._env_json(r, shown),
                }
                for r in self.ranks
            ],
        }

    def _env_json(self, rank: RankPlan, shown: Any) -> dict[str, Any]:
        """A rank's environment as ``--dry-run`` shows it, from :func:`rankenv.rank_env`'s own
        parts: what ttmesh sets (``env``) and the launcher's variables it drops (``unset``);
        the rest of the launcher's environment (``environ``) is inherited as it is."""
        return {
            "env": shown(rankenv.ttmesh_env(self, rank, self.environ)),
            "unset": rankenv.unset(self, rank, self.environ),
        }

    def _chipless_json(self, shown: Any) -> dict[str, Any]:
        """A chipless plan in ``ttmesh.plan/1``: the same keys, and null (or empty) for every
        one about chips, a mesh or a host, since none is read (docs/conventions.md)."""
        return {
            "schema": SCHEMA,
            "chipless": True,
            "job": self.job,
            "layout": self.layout,
            "mesh_shape": None,
            "dim_types": None,
            "host_topology": None,
            "symmetric_dram_mb": None,
            "descriptors": {},
            "host": None,
            "master": None,
            "grace": self.policy.grace,
            "fabric_grace": self.policy.fabric_grace,
            "op_timeout": self.policy.op_timeout,
            "max_restarts": self.policy.max_restarts,
            "grouping": "",
            "launcher": self.launcher,
            "ready_timeout": self.policy.ready_timeout,
            "hang_timeout": self.policy.hang_timeout,
            "serving": self.serving.to_json() if self.serving is not None else None,
            "hosts": [],
            "ranks": [
                {
                    "rank": r.rank,
                    "chips": [],
                    "bdfs": [],
                    "coord": None,
                    "block": None,
                    "host_rank": None,
                    "mesh_id": None,
                    "argv": list(r.argv),
                    **self._env_json(r, shown),
                }
                for r in self.ranks
            ],
        }


# --------------------------------------------------------------------------- building


def _binding_split(req: LaunchRequest, sel: Selection) -> layout.Split:
    """A tt-run rank binding decides the ranks: one block per binding, its chips as given."""
    bf = req.binding
    assert bf is not None
    blocks = []
    for b, units in zip(bf.bindings, req.binding_units, strict=True):
        chips = tuple(a for u in units for a in u.chips)
        coords = tuple(sel.coord_of(a) for a in chips)
        blocks.append(
            layout.Block(
                rank=b.rank,
                origin=coords[0],
                shape=(1, len(chips)),
                host_coord=(0, 0),
                host_rank=b.mesh_host_rank or 0,
                coords=coords,
                chips=chips,
                units=tuple(units),
            )
        )
    return layout.Split(Layout.RANK_BINDING, (1, 1), blocks)


def _server_env(job: _Job, env: dict[str, str], desc_path: str) -> dict[str, str]:
    """A server's environment: no torchrun contract (it starts its own processes), the chips
    as its profile passes them, the profile's variables (their notes: ``job.server_notes``)."""
    from ttmesh.launcher.serving import spec as serving

    req, inv, sel = job.req, job.inv, job.sel
    server = req.serving
    assert server is not None
    profile = server.profile
    out = {k: v for k, v in env.items() if k.startswith(SERVER_KEEPS)}
    out["LIBTT_SYMMETRIC_DRAM_MB"] = str(req.symmetric_dram_mb)
    board = inv.chip(sel.chips[0]).board_type
    chips, notes = serving.chip_env(
        profile,
        whole_host=len(sel.chips) == len(inv.chips),
        bdfs=env["TT_VISIBLE_DEVICES"].split(","),
        descriptor=desc_path,
        mesh_device=serving.mesh_device(profile, len(sel.chips), board, sel.shape),
    )
    job.server_notes.extend(notes)
    return {**out, **chips, **server.env}


def plan_split(req: LaunchRequest, sel: Selection) -> layout.Split:
    """The split of the chosen chips into ranks: a rank binding's own, else the layout's (over
    the hosts of a cluster). Made once per launch: the mock clusters and :func:`build` take it."""
    if req.binding is not None:
        return _binding_split(req, sel)
    host_of = req.cluster.host_of if req.cluster is not None else None
    return layout.split(sel, req.layout, req.nproc, host_of)


@dataclass(frozen=True)
class Surroundings:
    """What a plan needs from outside the request, read before :func:`build` (which reads
    nothing): :func:`surroundings`."""

    home: str  # the launcher's home directory (its caches go under it)
    cwd_refusal: str | None = None  # why the launch directory is not on PYTHONPATH (rank binding)
    # --numa-binding node: each rank's command prefix (rank -> taskset -c CPUS, planning.numa)
    numa: Mapping[int, tuple[str, ...]] = field(default_factory=dict)


def surroundings(req: LaunchRequest) -> Surroundings:
    """The home directory (the request's HOME, else the password database's, as
    ``os.path.expanduser`` does) and why a rank-binding job's launch directory is not put on
    its ranks' PYTHONPATH (None: it is, as tt-run does; ``ttrun.pythonpath_refusal``)."""
    home = req.environ.get("HOME")
    if not home:
        import pwd

        try:
            home = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            home = "/"
    if req.binding is None:
        return Surroundings(home)
    from ttmesh.launcher.adapters import ttrun

    return Surroundings(home, ttrun.pythonpath_refusal(req.cwd))


@dataclass(frozen=True)
class _Job:
    """What every rank's plan is made from: the request, the host, the chips, their split into
    ranks, the ranks' hosts and mesh descriptors, and the facts read before the build."""

    req: LaunchRequest
    inv: Inventory
    sel: Selection
    sp: layout.Split
    nodes: dict[int, int]  # rank -> its host (0 on one host)
    per_node: int  # ranks per host
    descriptors: dict[str, str]  # name -> path
    desc_of: dict[int, str]  # rank -> its mesh graph descriptor
    outside: Surroundings
    host_envs: dict[int, dict[str, str]] = field(default_factory=dict)  # node -> _host_env's
    # What a server's ranks say of how their chips reach it (serving.spec.chip_env), in order:
    # the plan's server spec is built with them.
    server_notes: list[str] = field(default_factory=list)

    @property
    def world(self) -> int:
        return len(self.sp.blocks)

    @property
    def nnodes(self) -> int:
        return len(self.req.cluster.hosts) if self.req.cluster is not None else 1


def build(
    req: LaunchRequest,
    inv: Inventory,
    sel: Selection,
    argv: list[str],
    split: layout.Split,
    outside: Surroundings,
) -> LaunchPlan:
    """The plan of a launch, pure: everything it needs comes in (the launcher's environment
    and directory in ``req.environ`` and ``req.cwd``, the split from :func:`plan_split`, the
    home directory and the launch directory's verdict from :func:`surroundings`); it reads no
    environment and no file, so ``--dry-run`` and the launch get the same plan from the same inputs."""
    sp = split
    files, descriptors, desc_of = _descriptors(req, inv, sel, sp)
    files.update(_mock_files(req))
    world = len(sp.blocks)
    job = _Job(
        req=req,
        inv=inv,
        sel=sel,
        sp=sp,
        nodes=_nodes(req, sp),
        per_node=world // len(req.cluster.hosts) if req.cluster is not None else world,
        descriptors=descriptors,
        desc_of=desc_of,
        outside=outside,
    )
    ranks = [_rank_plan(job, block, argv) for block in sp.blocks]
    serving = req.serving
    if serving is not None and job.server_notes:  # each note once, after the profile's own
        said = list(serving.notes)
        said += [n for n in dict.fromkeys(job.server_notes) if n not in said]
        serving = replace(serving, notes=tuple(said))
    used = {
        r.env.get(k)
        for r in ranks
        for k in ("TT_MESH_GRAPH_DESC_PATH", "TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH")
    }
    plan = LaunchPlan(
        job=req.job,
        layout=sp.layout,
        mesh_shape=sel.shape,
        dim_types=sel.dim_types,
        host_dims=sp.host_dims if sp.layout == "mesh" else (1, 1),
        symmetric_dram_mb=req.symmetric_dram_mb,
        ranks=ranks,
        files=files,
        descriptors={name: path for name, path in descriptors.items() if path in used},
        run_dir=req.run_dir,
        root=str(inv.host.root),
        simulated=inv.host.simulated,
        master_addr=req.master_addr,
        master_port=req.master_port,
        policy=req.policy,
        cwd=req.cwd,
        user_env_keys=tuple(dict(req.env)),
        grouping=_grouping(job),
        launcher=req.launcher,
        mpirun=req.mpirun,
        serving=serving,
        hosts=[v.name for v in req.cluster.hosts] if req.cluster is not None else [],
        mpi_args=list(req.mpi_args),
        environ=dict(req.environ),
        program=req.program,
    )
    if req.binding is not None:
        from ttmesh.launcher.adapters import ttrun

        where = ttrun.where_note(
            req.workdir, req.cwd, ranks[0].env, req.environ, outside.cwd_refusal
        )
        plan = replace(plan, report=plan.report.noted(where))
    return plan


def _descriptors(
    req: LaunchRequest, inv: Inventory, sel: Selection, sp: layout.Split
) -> tuple[dict[str, str], dict[str, str], dict[int, str]]:
    """The mesh graph descriptors: (files to write, name -> path, rank -> its descriptor). A
    rank binding names its own; a mesh over several hosts adds the physical groupings."""
    run_dir = req.run_dir
    if req.binding is not None:
        files: dict[str, str] = {}
        bf = req.binding
        desc_of = {b.rank: bf.descriptor_of(bf.bindings[b.rank]) for b in sp.blocks}
        descriptors = bf.descriptors()
    else:
        texts, of_rank = layout.descriptors(inv, sel, sp, req.strict_links)
        files = {f"{run_dir}/mesh/{name}": text for name, text in texts.items()}
        desc_of = {r: f"{run_dir}/mesh/{name}" for r, name in of_rank.items()}
        if sp.layout == Layout.ISOLATED:
            descriptors = {f"rank{r}": path for r, path in desc_of.items()}
        else:
            descriptors = {"mesh": f"{run_dir}/mesh/mesh.textproto"}
    groupings = _groupings(req, sp) if req.cluster is not None else None
    if groupings is not None:
        files[f"{run_dir}/mesh/groupings.textproto"] = groupings
        descriptors["groupings"] = f"{run_dir}/mesh/groupings.textproto"
    return files, descriptors, desc_of


def _mock_path(req: LaunchRequest, rank: int) -> str:
    return f"{req.run_dir}/mock/rank{rank}_cluster_descriptor.yaml"


def _mock_files(req: LaunchRequest) -> dict[str, str]:
    """A simulated host's mock cluster of each rank (TT_METAL_MOCK_CLUSTER_DESC_PATH)."""
    return {_mock_path(req, rank): text for rank, text in req.mocks.items()}


def _cache_base(req: LaunchRequest, home: str) -> str:
    """Where the ranks' tt-metal caches go (one per rank, TT_METAL_CACHE/rankN): under the
    launcher's TT_METAL_CACHE, else ttmesh's under the XDG cache directory (paths.xdg_dir's
    rule), read from the request's environment and ``home``."""
    environ = req.environ
    if environ.get("TT_METAL_CACHE"):
        return environ["TT_METAL_CACHE"]
    xdg = environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(home, ".cache")
    return str(Path(base) / "ttmesh" / "tt-metal-cache")


def _host_env(job: _Job, node: int) -> dict[str, str]:
    """What the rank's host adds for the job's chips there (a simulated host: its root), the
    same for every rank of the host: asked once per host."""
    if node in job.host_envs:
        return job.host_envs[node]
    if job.req.cluster is None:
        env = job.inv.host.rank_env(job.sel.chips)
    else:
        view = job.req.cluster.hosts[node]
        mine = {c.asic_id for c in view.inv.chips}
        env = view.inv.host.rank_env([a for a in job.sel.chips if a in mine])
    job.host_envs[node] = env
    return env


def _workdir(req: LaunchRequest) -> str:
    """The ranks' working directory when not the user's ("" = the user's)."""
    if req.workdir == "" and req.binding is not None:
        # tt-run runs a rank-binding job in the launch directory (`python tests/x.py` from a
        # checkout finds its script and files there): ttmesh too, for its files.
        return req.cwd
    if req.workdir == "" and req.launcher == StartMode.MPI:
        # tt-metal writes generated/fabric/... under the working directory: a world of its
        # own gets a directory of its own, so concurrent jobs don't overwrite each other.
        return f"{req.run_dir}/work"
    return req.workdir


def _rank_plan(job: _Job, block: layout.Block, argv: list[str]) -> RankPlan:
    """One rank's plan: its chips, place in the mesh and every variable ttmesh gives it."""
    req, rank, run_dir = job.req, block.rank, job.req.run_dir
    node = job.nodes[rank]
    mesh_id, host_rank = layout.mesh_ids(job.sp, block)
    place = rankenv.Place(rank, job.world, job.per_node, node, job.nnodes)
    env = {
        **rankenv.torchrun_env(place, req),
        "TT_VISIBLE_DEVICES": ",".join(block.bdfs),
        "TT_MESH_GRAPH_DESC_PATH": job.desc_of[rank],
        "TT_MESH_ID": str(mesh_id),
        "TT_MESH_HOST_RANK": str(host_rank),
        "LIBTT_SYMMETRIC_DRAM_MB": str(req.symmetric_dram_mb),
        "TT_METAL_CACHE": f"{_cache_base(req, job.outside.home)}/rank{rank}",
        "TTMESH_JOB_ID": req.job,
        "TTMESH_RANK": str(rank),
        "TTMESH_READY_FILE": f"{run_dir}/ready/rank{rank}",
        "TTMESH_FABRIC_FILE": f"{run_dir}/fabric/rank{rank}",
        **_host_env(job, node),
    }
    if req.cluster is not None:
        env["TTMESH_NODE_RANK"] = str(node)
        env["TTMESH_NNODES"] = str(job.nnodes)
        grouping = job.descriptors.get("groupings")
        if grouping and "TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH" not in req.environ:
            env["TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH"] = grouping
    if rank in req.mocks:
        env["TT_METAL_MOCK_CLUSTER_DESC_PATH"] = _mock_path(req, rank)
    if req.segment_dir and SEGMENT_VAR not in req.environ:
        env[SEGMENT_VAR] = req.segment_dir
    workdir = _workdir(req)
    if workdir:
        env["TT_RUN_ORIGINAL_CWD"] = req.cwd
        env["TTMESH_ORIGINAL_CWD"] = req.cwd
    if req.binding is not None:
        from ttmesh.launcher.adapters import ttrun

        binding = req.binding.bindings[rank]
        env.update(
            ttrun.binding_env(binding, req.binding, req.environ, req.cwd, job.outside.cwd_refusal)
        )
        env["TT_VISIBLE_DEVICES"] = ",".join(block.bdfs)  # by PCI address, whatever was given
        mesh_id, host_rank = binding.mesh_id, binding.mesh_host_rank or 0
        if binding.mesh_host_rank is None:
            env.pop("TT_MESH_HOST_RANK", None)
    if req.serving is not None:
        env = _server_env(job, env, job.desc_of[rank])
    tmpdir = ""
    if req.program is not None:
        env, workdir, tmpdir = _program_env(job, rank, env, workdir)
    env.update(dict(req.env))
    env.update(rankenv.torchrun_flags(req))  # a server's too, as torchrun's agent sets them
    return RankPlan(
        rank=rank,
        units=block.units,
        chips=block.chips,
        bdfs=block.bdfs,
        coord=block.origin,
        host_rank=host_rank,
        mesh_id=mesh_id,
        argv=(*job.outside.numa.get(rank, ()), *argv),
        env=env,
        block_shape=block.shape,
        workdir=workdir,
        node=node,
        tmpdir=tmpdir,
    )


# The variables by which libtt 0.1.3 is given its chips: a libtt that joins processes sets them
# for each process itself (the seed: "Leave TT_VISIBLE_DEVICES and TT_MESH_GRAPH_DESC_PATH unset;
# libtt sets both for each process").
_LIBTT_SETS = ("TT_VISIBLE_DEVICES", "TT_MESH_GRAPH_DESC_PATH", "TT_MESH_ID", "TT_MESH_HOST_RANK")


def _program_env(
    job: _Job, rank: int, env: dict[str, str], workdir: str
) -> tuple[dict[str, str], str, str]:
    """A program profile's rank: the stack's variables, its chips as the libtt in use wants
    them, torch_tpu's contract (rankenv.torch_tpu_env) and, with ``private_dirs``, a TMPDIR
    and working directory of its own under the run directory. (env, workdir, tmpdir)."""
    req = job.req
    spec = req.program
    assert spec is not None
    profile = spec.profile
    env = {**env, **profile.env}
    if spec.chips == "libtt":
        for key in _LIBTT_SETS:
            env.pop(key, None)
    if profile.contract == "torch-tpu" and spec.tpu is not None:
        env.update(rankenv.torch_tpu_env(spec.tpu, job.per_node, job.nodes[rank]))
    tmpdir = ""
    if profile.private_dirs:
        own = f"{req.run_dir}/ranks/rank{rank}"
        tmpdir = env["TMPDIR"] = f"{own}/tmp"
        if not workdir:  # tt-metal writes generated/ in it (a --workdir of yours is kept)
            workdir = f"{own}/work"
            env["TT_RUN_ORIGINAL_CWD"] = req.cwd
            env["TTMESH_ORIGINAL_CWD"] = req.cwd
    return env, workdir, tmpdir


def _grouping(job: _Job) -> str:
    """What --dry-run says of how the chips are grouped into workers and the mesh."""
    sel, sp, req = job.sel, job.sp, job.req
    unit_size = max(u.size for u in sel.units)
    grouping = ""
    if unit_size > 1:
        grouping = (
            f"{plural(len(sel.chips), 'chip')} in {plural(len(sel.units), 'board')} of {unit_size}: "
            "each worker drives "
            "a whole board (its PCI chip and the remote chip behind it)"
        )
        idle = sum(u.size for u in sel.units) - len(sel.chips)
        if idle:
            grouping += f"; {plural(idle, 'chip')} of these boards stay out of the mesh, idle"
    if sp.layout == "mesh":
        grouping = (grouping + "; " if grouping else "") + (
            f"one {sel.shape[0]}x{sel.shape[1]} mesh over "
            f"{plural(job.world, 'process', 'processes')}, host_topology "
            f"{sp.host_dims[0]}x{sp.host_dims[1]}"
        )
    if req.cluster is not None:
        grouping += f" on {len(req.cluster.hosts)} hosts ({job.per_node} per host)"
    return grouping


def build_chipless(req: LaunchRequest, argv: list[str]) -> LaunchPlan:
    """The plan of a server that drives no Tenstorrent chip (stock SGLang on a CPU or GPU): one
    process, its own ranks, no chips, descriptors, mock clusters or torchrun variables. Its
    environment is ttmesh's job and rank, the ready file, the profile's variables and ``--env``;
    everything else is inherited (without the rank variables a torchrun or ttmesh above left)."""
    run_dir = req.run_dir
    assert req.serving is not None
    env = {
        "TTMESH_JOB_ID": req.job,
        "TTMESH_RANK": "0",
        "TTMESH_READY_FILE": f"{run_dir}/ready/rank0",
        **req.serving.env,
        **dict(req.env),
        **rankenv.torchrun_flags(req),
    }
    rank = RankPlan(
        rank=0, units=(), chips=(), bdfs=(), coord=(0, 0), host_rank=0, mesh_id=0,
        argv=tuple(argv), env=env,
    )  # fmt: skip
    return LaunchPlan(
        job=req.job, layout=Layout.SINGLE_PROCESS, mesh_shape=(0, 0), dim_types=("", ""),
        host_dims=(1, 1), symmetric_dram_mb=0, ranks=[rank], files={}, descriptors={},
        run_dir=run_dir, root="", simulated=False, master_addr="", master_port=0,
        policy=req.policy, cwd=req.cwd, user_env_keys=tuple(k for k, _ in req.env),
        launcher=StartMode.DIRECT, serving=req.serving, chipless=True, environ=dict(req.environ),
    )  # fmt: skip


def _nodes(req: LaunchRequest, sp: layout.Split) -> dict[int, int]:
    """The host of each rank (0 on one host)."""
    if req.cluster is None:
        return {b.rank: 0 for b in sp.blocks}
    return {b.rank: req.cluster.host_of[b.chips[0]] for b in sp.blocks}


def _groupings(req: LaunchRequest, sp: layout.Split) -> str | None:
    from ttmesh.mesh import cluster

    if sp.layout != Layout.MESH or req.cluster is None:
        return None
    return cluster.groupings(cluster.merged_descriptor(req.cluster), sp.blocks, sp.host_dims)
