"""Everything before a launch, changing nothing: discovery, chip choice, the server's spec,
ports, the job's identity, mock clusters and the plan. ``--dry-run`` stops after it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ttmesh.errors import TTMeshError, bad_input
from ttmesh.fabric import heartbeat
from ttmesh.fabric.devices import Inventory, discover
from ttmesh.host.base import Host
from ttmesh.host.clusterdesc import ClusterDescriptor
from ttmesh.launcher.planning.choose import (
    NoHealthy,
    alive_first,
    blocked_chips,
    broken_pairs,
    default_tp,
    frozen_refusal,
    parse_bdfs,
    pick,
    verdict_cannot_change,
    with_dead,
)
from ttmesh.launcher.planning.liveness import Liveness, can_start_unverified
from ttmesh.launcher.planning.plan import (
    LaunchPlan,
    build,
    build_chipless,
    plan_split,
    surroundings,
)
from ttmesh.launcher.planning.ports import check_port, free_port, server_port_free
from ttmesh.launcher.planning.request import LaunchRequest, resolve_command
from ttmesh.mesh import healthy, memory
from ttmesh.mesh import select as meshselect
from ttmesh.render import note, plural
from ttmesh.runtime import jobs
from ttmesh.vocab import MPI_LAYOUTS, Layout, StartMode

if TYPE_CHECKING:
    from ttmesh.launcher.hosts.reach import MpiHosts
    from ttmesh.mesh import layout


@dataclass
class Prepared:
    """A launch ready to run: its plan, the inventory and selection it came from."""

    plan: LaunchPlan
    inv: Inventory
    selection: meshselect.Selection | None  # None: a chipless server (no chips chosen)
    liveness: Liveness | None = None  # heartbeats still being read as the workers start
    mesh_hosts: MpiHosts | None = None  # how mpirun reaches the hosts of a mesh over several
    # A mesh over several hosts: links down between the job's chips, as each host reported
    # them: (host, what, the fix to run there). The start is refused unless --auto-reset.
    hosts_not_ready: list[tuple[str, str, str]] = field(default_factory=list)
    # No healthy mesh of the size on this host: the chips are the mesh a reset makes healthy,
    # and pre-flight refuses them with this (the reset that gives one), unless --auto-reset.
    unhealthy: TTMeshError | None = None
    # tt-metal's mock control plane asked about the ranks' own files (launcher.planning.metalcheck),
    # under way while the launch goes on; or why it is not asked.
    metal: Any = None
    metal_skipped: str = ""
    # What the job needs of the host's system software (a server's profile: ``system:``);
    # None: ttmesh's defaults (fabric.syscheck). Its warnings are said once per launch.
    requires: Any = None
    warned: bool = False


def prepare(
    req: LaunchRequest,
    host: Host,
    chips_arg: str | None = None,
    exclude_arg: str | None = None,
    allow_mpi_layouts: bool = False,
    descriptor_only: bool = False,
    repairable: bool = False,
    defer_liveness: bool = False,
    dry_run: bool = False,
    ask_metal: bool = True,
) -> Prepared:
    """Everything before a launch, changing nothing. ``descriptor_only``: plan the mesh and its
    descriptors without a command, a port or availability checks (``ttmesh descriptor``).
    ``repairable``: chips a reset can recover are chosen too (``--auto-reset`` resets them).
    ``ask_metal``: start tt-metal's verdict on the plan (``launcher.planning.metalcheck``) when a ttnn
    Python is configured (``check --active`` asks tt-metal itself).
    ``defer_liveness``: when the heartbeats cannot change the choice of chips, do not wait for
    them: ``Prepared.liveness`` reads them while the workers start (:class:`Liveness`).
    ``dry_run``: a server's port taken now is a note of the plan, not a refusal. A server
    that drives no Tenstorrent chip is planned without the host (:func:`chipless`)."""
    if req.profile is not None and req.profile.chipless:
        return chipless(req, host, chips_arg, exclude_arg, repairable, dry_run)
    inv = discover(host)
    if not inv.chips:
        raise bad_input("no Tenstorrent chips found on this host", "see ttmesh ls")
    if req.binding is not None:
        from ttmesh.launcher.adapters import ttrun

        if chips_arg or exclude_arg or req.mesh_shape:
            raise bad_input(
                "--rank-binding decides the chips", "drop --chips/--exclude/--mesh-shape"
            )
        req.binding_units = ttrun.rank_units(req.binding, inv, meshselect.units_of(inv))
        chips_arg = ",".join(u.bdf for units in req.binding_units for u in units)
        n = sum(u.size for units in req.binding_units for u in units)
        if req.tp_size not in (None, n):
            raise bad_input(
                f"--tp-size {req.tp_size} but {req.binding.path} gives its ranks "
                f"{plural(n, 'chip')}",
                "drop --tp-size with --rank-binding",
            )
        req.tp_size = n
    chosen = parse_bdfs(chips_arg, inv, "--chips")
    excluded = parse_bdfs(exclude_arg, inv, "--exclude")
    both = {c.asic_id for c in chosen} & {c.asic_id for c in excluded}
    if both:
        chip = inv.chip(sorted(both)[0])
        raise bad_input(f"chip {chip.label} is both chosen (--chips) and excluded (--exclude)")
    if req.profile is not None:  # a server: one process drives every chip
        req.layout, req.launcher, req.nproc = Layout.SINGLE_PROCESS, StartMode.DIRECT, None
    if req.launcher not in tuple(StartMode):
        raise bad_input(f"--launcher {req.launcher!r}: use direct or mpi")
    if req.layout in MPI_LAYOUTS and req.launcher != StartMode.MPI and not allow_mpi_layouts:
        raise bad_input(
            f"--mesh-layout {req.layout} forms one tt-metal world across processes, which only an "
            "MPI launcher can start (each process spawned alone sees a world of one)",
            "drop --launcher direct (mesh layouts start under mpirun), or use isolated/single-process",
        )
    if req.launcher == StartMode.MPI and not descriptor_only:
        from ttmesh.launcher.hosts import mpi

        req.mpirun = mpi.find_mpirun(req.mpirun or None)
        mpi.version(req.mpirun)  # read once here: each attempt's guardian (a fork) reuses it
    default_note = None
    if req.tp_size is None:
        req.tp_size, default_note = default_tp(req, inv, chosen)
    if req.tp_size <= 0:
        raise bad_input(
            f"--tp-size {req.tp_size}: must be a positive number of chips", "e.g. --tp-size 4"
        )
    if chosen and len(chosen) != req.tp_size:
        raise bad_input(
            f"--chips names {plural(len(chosen), 'chip')} but --tp-size is {req.tp_size}",
            "give as many chips as --tp-size, or drop --tp-size",
        )
    if req.mesh_shape and req.mesh_shape[0] * req.mesh_shape[1] != req.tp_size:
        rows, cols = req.mesh_shape
        raise bad_input(
            f"--mesh-shape {rows}x{cols} has {plural(rows * cols, 'chip')} but --tp-size is "
            f"{req.tp_size}",
            "make ROWS x COLS equal the chip count",
        )
    if descriptor_only:
        blocked: tuple[dict[str, str], dict[str, str]] = ({}, {})
        watch = None
    else:
        blocked = blocked_chips(inv)
        watch = heartbeat.Watch(inv, [c for c in inv.chips if c.asic_id not in blocked[0]])
    # Healthy first: the links down between the host's chips, read once (cheap: link telemetry),
    # only when the choice is ttmesh's to make (chips named are the user's choice). A descriptor
    # reads them too: tt-metal is given the host as discovery finds it, links down left out,
    # and refuses a mesh over them (``ttmesh descriptor`` then refuses as the launch would).
    broken = [] if chosen else broken_pairs(inv)
    choose = functools.partial(pick, broken=broken, repairable=repairable)

    def availability(
        beats: dict[str, str], repairable: bool = repairable
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Why each chip can't be used (in this order: leased, held, dead, excluded), who."""
        why, who = with_dead(*blocked, beats, repairable)
        for c in excluded:
            why.setdefault(c.asic_id, "excluded")
        return why, who

    sel = None
    seen: tuple[dict[str, str], dict[str, str]] = ({}, {})  # (why, who) the choice was made with
    unhealthy = None
    if watch is not None and defer_liveness and not repairable:
        # Choose as if every chip's heartbeat moved. When the verdict cannot change that choice
        # (chips named, or every usable chip taken), a frozen chip can only refuse the launch:
        # the workers start while the heartbeats are read (Liveness); otherwise, as always,
        # the heartbeats are read first.
        try:
            guess = choose(inv, req, chosen, *availability({}))
        except TTMeshError:
            guess = None  # the refusal might name a frozen chip: read the heartbeats first
        if guess is not None and verdict_cannot_change(
            inv, req, guess, chosen, availability({}), choose, broken
        ):
            sel, seen = guess, availability({})
    if sel is None:
        beats = watch.wait() if watch is not None else {}
        inv.beats = beats  # seen alive now: pre-flight need not poll these again
        watch = None
        seen = availability(beats)
        if repairable and not chosen:  # healthy first: reset frozen chips only when needed
            sel = alive_first(inv, req, choose, availability(beats, repairable=False), broken)
            seen = availability(beats, repairable=False) if sel is not None else seen
        try:
            sel = sel or choose(inv, req, chosen, *seen)
        except NoHealthy as exc:  # planned all the same: pre-flight refuses it (exit 3)
            sel, unhealthy = exc.selection, exc
    liveness = None
    if watch is not None:
        job_chips = [a for u in sel.units for a in u.chips]
        watch.only(job_chips)
        liveness = Liveness(
            watch,
            functools.partial(frozen_refusal, inv, req, chosen, availability, job_chips, choose),
        )
    try:
        prepared = _plan(req, inv, sel, host, descriptor_only, dry_run)
    except TTMeshError as exc:
        raise (liveness.first(exc) if liveness is not None else exc) from None
    prepared.unhealthy = unhealthy
    if default_note:
        prepared.plan.notes.append(default_note)
    if not (descriptor_only or chosen):
        used = {a for u in sel.units for a in u.chips}
        # A mesh holding a broken pair is --auto-reset's to mend: its links are no reason.
        avoided = [b for b in broken if not set(b.chips) <= used]
        if len(avoided) == len(broken):
            prepared.plan.passed_over = healthy.passed_over(inv, used, *seen, broken)
        else:
            prepared.plan.passed_over = healthy.passed_over(inv, used, *seen, [])
    if liveness is not None and not can_start_unverified(prepared.plan):
        refusal = liveness.wait()  # a job that opens the fabric at once waits, as it did
        if refusal is not None:
            raise refusal
        liveness = None
    if liveness is not None:
        inv.beats = liveness.known()
    prepared.liveness = liveness
    if ask_metal and not descriptor_only:  # (check --active asks tt-metal itself)
        from ttmesh.launcher.planning import metalcheck

        try:
            prepared.metal, prepared.metal_skipped = metalcheck.check(prepared.plan)
        except TTMeshError as exc:
            raise (liveness.first(exc) if liveness is not None else exc) from None
    return prepared


def chipless(
    req: LaunchRequest,
    host: Host,
    chips_arg: str | None = None,
    exclude_arg: str | None = None,
    repairable: bool = False,
    dry_run: bool = False,
) -> Prepared:
    """A server that drives no Tenstorrent chip (stock SGLang on ``--device cpu`` or ``cuda``:
    a profile with ``chips: none``): no discovery, no chips chosen or leased, no pre-flight,
    no recovery, so it runs on a host without the Tenstorrent driver. What ttmesh adds is the
    server's own: readiness, the bounded stop, the watch on its processes, the clean-up. The
    server's ``--tp-size`` counts its own processes; ttmesh's, and every flag that chooses or
    recovers chips, has nothing to act on and is refused (one line, exit 2)."""
    profile = req.profile
    from ttmesh.launcher.serving import spec

    what = spec.ServingSpec(profile, req.server_args).chipless_what
    for flag, given in (
        ("--tp-size", req.tp_size is not None),
        ("--chips", chips_arg is not None),
        ("--exclude", exclude_arg is not None),
        ("--mesh-shape", req.mesh_shape is not None),
        ("--auto-reset", repairable),
    ):
        if given:
            fix = (
                f"drop it: the server's own {profile.tp_flag} (after the command) sets its ranks"
                if flag == "--tp-size" and profile.tp_flag
                else "drop it"
            )
            raise bad_input(f"{flag}: {what}", fix)
    req.layout, req.launcher, req.nproc = Layout.SINGLE_PROCESS, StartMode.DIRECT, None
    tp, findings = spec.server_tp(profile, req.server_args, None)
    req.server_findings = [*req.server_findings, *findings]
    req.serving = _serving(req, tp or 1, None)
    argv = resolve_command(req)
    server_port_free(req.serving, dry_run)
    if not req.job:
        req.job = jobs.new_job_id()
    if not req.run_dir:
        req.run_dir = str(jobs.runs_dir() / req.job)
        req.segment_dir = jobs.segment_dir(req.run_dir)
    if not req.cwd:
        req.cwd = os.getcwd()
    unused = f"; {host.flag} is not read" if host.flag else ""
    req.serving.notes.append(f"{what}: none is chosen, leased, checked or recovered{unused}")
    inv = Inventory(host=host, driver="", chips=[], links=[], topology="none")
    return Prepared(build_chipless(req, argv), inv, None)


def _plan(
    req: LaunchRequest,
    inv: Inventory,
    sel: meshselect.Selection,
    host: Host,
    descriptor_only: bool,
    dry_run: bool = False,
) -> Prepared:
    """The rest of :func:`prepare` once the chips are chosen: memory, server, command, port,
    job id, mock clusters and the plan."""
    req.symmetric_dram_mb = memory.plan(
        req.symmetric_dram_mb, [inv.chip(a).dram_mb for a in sel.chips]
    )
    if req.profile is not None:
        # The job's tensor-parallel degree: every host's chips (this host has its share).
        tp = len(sel.chips) * req.tp_hosts
        req.serving = _serving(req, tp, min(inv.chip(a).dram_mb for a in sel.chips))
    if descriptor_only:
        argv: list[str] = []
    else:
        argv = resolve_command(req)
        if req.serving is not None:
            server_port_free(req.serving, dry_run)
        if req.master_port:
            check_port(req.master_port, req.master_addr)
        else:
            req.master_port = free_port(req.master_addr)
    if not req.job:
        req.job = jobs.new_job_id()
    if not req.run_dir:
        req.run_dir = str(jobs.runs_dir() / req.job)
        req.segment_dir = jobs.segment_dir(req.run_dir)
    if not req.cwd:
        req.cwd = os.getcwd()
    split = plan_split(req, sel)  # once per launch: the mock clusters and the plan share it
    cluster = None if descriptor_only else host.mock_cluster()
    if cluster is not None:
        req.mocks = mock_clusters(cluster, split, req)
    plan = build(req, inv, sel, argv, split, surroundings(req))
    requires = req.profile.system if req.profile is not None else None
    return Prepared(plan, inv, sel, requires=requires)


def _serving(req: LaunchRequest, tp: int, chip_mb: int | None) -> Any:
    """The server's spec for ``tp`` chips (a chipless server: its own ``--tp-size``, and no
    chip memory); its rules' errors refuse the launch (exit 2)."""
    from ttmesh.launcher.serving import spec

    serving = spec.build(
        req.profile,
        req.server_args,
        tp=tp,
        environ=req.environ,
        user_env=dict(req.env),
        symmetric_mb=req.symmetric_dram_mb,
        chip_mb=chip_mb,
        cwd=req.cwd or os.getcwd(),
        findings=req.server_findings,
    )
    serving.health_interval = req.health_interval
    serving.health_failures = req.health_failures
    if req.ready_timeout is None:
        req.ready_timeout = serving.ready_timeout
    serving.ready_timeout = req.ready_timeout
    errors = serving.errors(req.strict)
    if errors:
        for extra in [f for f in serving.findings if f not in errors[:1]]:
            note(f"{extra.severity}: {extra.message} (fix: {extra.fix})")
        first = errors[0]
        more = f" ({len(errors) - 1} more above)" if len(errors) > 1 else ""
        raise bad_input(
            f"{req.profile.name}: {first.message}{more}",
            f"fix: {first.fix}"
            + ("; --strict makes warnings errors" if first.severity == "warning" else ""),
        )
    return serving


def mock_clusters(
    cluster: ClusterDescriptor, split: layout.Split, req: LaunchRequest
) -> dict[int, str]:
    """tt-metal's view of a mock cluster per rank (TT_METAL_MOCK_CLUSTER_DESC_PATH): each rank
    of ``split`` (the plan's own, :func:`plan_split`) sees its chips; one process, all of them."""
    from ttmesh.mesh import mock

    if req.layout == Layout.SINGLE_PROCESS and req.binding is None:
        return {0: mock.whole_view(cluster, f"ttmesh job {req.job}")}
    views = mock.ChipViews(cluster)
    return {
        b.rank: views.of(list(b.chips), f"ttmesh job {req.job}, rank {b.rank}")
        for b in split.blocks
    }
