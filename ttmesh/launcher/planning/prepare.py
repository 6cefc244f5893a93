"""Everything before a launch, changing nothing: discovery, chip choice, the server's spec,
ports, the job's identity, mock clusters and the plan. ``--dry-run`` stops after it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from ttmesh import paths
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.fabric.devices import Chip, Inventory, discover
from ttmesh.host.base import Host
from ttmesh.host.clusterdesc import ClusterDescriptor
from ttmesh.launcher.planning.choose import Choice, choose_chips, default_tp, parse_bdfs
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
    from collections.abc import Mapping

    from ttmesh.fabric.syscheck import Requirements
    from ttmesh.launcher.nodes.reach import MpiHosts
    from ttmesh.launcher.planning.metalcheck import Pending
    from ttmesh.mesh import layout


@dataclass(frozen=True)
class Prepared:
    """A launch ready to run: its plan, the inventory and selection it came from. Frozen, as
    the plan is: a stage with more to say makes a new one (``dataclasses.replace``); what a
    job learns as it runs is its own (``launcher.job.jobstate.JobState``)."""

    plan: LaunchPlan
    inv: Inventory
    selection: meshselect.Selection | None  # None: a chipless server (no chips chosen)
    liveness: Liveness | None = None  # heartbeats still being read as the workers start
    mesh_hosts: MpiHosts | None = None  # how mpirun reaches the hosts of a mesh over several
    # A mesh over several hosts: links down between the job's chips, as each host reported
    # them: (host, what, the fix to run there). The start is refused unless --auto-reset.
    hosts_not_ready: tuple[tuple[str, str, str], ...] = ()
    # No healthy mesh of the size on this host: the chips are the mesh a reset makes healthy,
    # and pre-flight refuses them with this (the reset that gives one), unless --auto-reset.
    unhealthy: TTMeshError | None = None
    # tt-metal's mock control plane asked about the ranks' own files (launcher.planning.metalcheck),
    # under way while the launch goes on (the job, or a dry run, waits for it once); or why it
    # is not asked.
    metal: Pending | None = None
    metal_skipped: str = ""
    # What the job needs of the host's system software (a server's profile: ``system:``);
    # None: ttmesh's defaults (fabric.syscheck). Its warnings are said once per launch.
    requires: Requirements | None = None
    # The chips' heartbeats as the launch last read them (pre-flight polls only the others).
    beats: Mapping[str, str] = field(default_factory=lambda: _NO_BEATS)
    # The request as planned: the user's, with what the stages resolved (chips, job, ...).
    request: LaunchRequest | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.beats, MappingProxyType):  # read-only: copied once, when planned
            object.__setattr__(self, "beats", MappingProxyType(dict(self.beats)))


_NO_BEATS: Mapping[str, str] = MappingProxyType({})


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
    """Everything before a launch, changing nothing (``req`` included: each step hands the
    next a new request). ``descriptor_only``: plan the mesh and its
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
    req, chips_arg = _bound(req, inv, chips_arg, exclude_arg)
    chosen, excluded = _named_chips(inv, chips_arg, exclude_arg)
    req = _start_mode(req, allow_mpi_layouts, descriptor_only)
    chosen, excluded, cards = _within_cards(req, inv, chips_arg, chosen, excluded)
    req, default_note = _chip_count(req, inv, chosen)
    choice = choose_chips(
        req, inv, chosen, excluded, descriptor_only=descriptor_only, repairable=repairable,
        defer_liveness=defer_liveness,
    )  # fmt: skip
    _each_card_used(inv, cards, choice.sel.chips)
    liveness = choice.liveness
    try:
        req, plan = _plan(req, inv, choice.sel, host, descriptor_only, dry_run)
        if not (dry_run or descriptor_only):
            _descriptors_fit(plan)
    except TTMeshError as exc:
        raise (liveness.first(exc) if liveness is not None else exc) from None
    beats = choice.beats  # seen alive now: pre-flight need not poll these again
    if default_note:
        plan = replace(plan, report=plan.report.noted(default_note))
    if not (descriptor_only or chosen or cards):
        passed_over = tuple(_passed_over(inv, choice))
        plan = replace(plan, report=replace(plan.report, passed_over=passed_over))
    if liveness is not None and not can_start_unverified(plan):
        refusal = liveness.wait()  # a job that opens the fabric at once waits, as it did
        if refusal is not None:
            raise refusal
        liveness = None
    if liveness is not None:
        beats = liveness.known()
    metal, metal_skipped = None, ""
    if ask_metal and not descriptor_only:  # (check --active asks tt-metal itself)
        from ttmesh.launcher.planning import metalcheck

        try:
            metal, metal_skipped = metalcheck.check(plan)
        except TTMeshError as exc:
            raise (liveness.first(exc) if liveness is not None else exc) from None
    requires = req.profile.system if req.profile is not None else None
    return Prepared(
        plan, inv, choice.sel, liveness=liveness, unhealthy=choice.unhealthy, metal=metal,
        metal_skipped=metal_skipped, requires=requires, beats=beats, request=req,
    )  # fmt: skip


def _descriptors_fit(plan: LaunchPlan) -> None:
    """Refuse now, in one line, a job this process cannot open files enough for (``ulimit
    -n``), not with the guardian's EMFILE once some ranks run (``LaunchPlan.open_files``)."""
    need = plan.open_files()
    allowed = os.sysconf("SC_OPEN_MAX")  # RLIMIT_NOFILE's soft limit
    if 0 <= allowed < need:
        ranks = plural(len(plan.ranks), "rank")
        raise bad_input(
            f"{ranks} need about {need} open files, and this process may open {allowed} "
            "(ulimit -n)",
            f"raise the limit: ulimit -n {max(1024, 2 * need)}",
        )


def _bound(
    req: LaunchRequest, inv: Inventory, chips_arg: str | None, exclude_arg: str | None
) -> tuple[LaunchRequest, str | None]:
    """A tt-run rank binding decides the chips: each binding rank's units, the chips they
    name (as --chips would) and their count (--tp-size)."""
    if req.binding is None:
        return req, chips_arg
    from ttmesh.launcher.adapters import ttrun

    if chips_arg or exclude_arg or req.mesh_shape:
        raise bad_input("--rank-binding decides the chips", "drop --chips/--exclude/--mesh-shape")
    units = ttrun.rank_units(req.binding, inv, meshselect.units_of(inv))
    n = sum(u.size for us in units for u in us)
    if req.tp_size not in (None, n):
        raise bad_input(
            f"--tp-size {req.tp_size} but {req.binding.path} gives its ranks {plural(n, 'chip')}",
            "drop --tp-size with --rank-binding",
        )
    chips = ",".join(u.bdf for us in units for u in us)
    return replace(req, binding_units=units, tp_size=n), chips


def _named_chips(
    inv: Inventory, chips_arg: str | None, exclude_arg: str | None
) -> tuple[list[Chip], list[Chip]]:
    """--chips and --exclude, read against the host's chips."""
    chosen = parse_bdfs(chips_arg, inv, "--chips")
    excluded = parse_bdfs(exclude_arg, inv, "--exclude")
    both = {c.asic_id for c in chosen} & {c.asic_id for c in excluded}
    if both:
        chip = inv.chip(sorted(both)[0])
        raise bad_input(f"chip {chip.label} is both chosen (--chips) and excluded (--exclude)")
    return chosen, excluded


def _within_cards(
    req: LaunchRequest,
    inv: Inventory,
    chips_arg: str | None,
    chosen: list[Chip],
    excluded: list[Chip],
) -> tuple[list[Chip], list[Chip], list[list[Chip]]]:
    """A PCI address names a card, and an n300 card is two chips: ``--chips`` of fewer cards
    than ``--tp-size`` wants chips of theirs (``--chips 0000:01:00.0 --tp-size 1`` on a T3K: one
    chip of that card; a fleet's replica of one chip is given so) is a choice among those
    cards' chips, each card giving one at least, the rest of the host excluded. Returns the
    chips named (none when the choice is made among them), excluded, and the cards named."""
    tp = req.tp_size
    if not chosen or tp is None or tp <= 0 or len(chosen) <= tp:
        return chosen, excluded, []
    cards: list[list[Chip]] = []
    for chip in chosen:
        if not any(chip in card for card in cards):
            cards.append(inv.board_peers(chip) if chip.bdf else [chip])
    if len(cards) > tp:
        return chosen, excluded, []  # more cards than chips wanted: _chip_count says so
    named = {c.asic_id for c in chosen}
    rest = [c for c in inv.chips if c.asic_id not in named and c not in excluded]
    return [], [*excluded, *rest], cards


def _each_card_used(inv: Inventory, cards: list[list[Chip]], chips: list[str]) -> None:
    """Every card ``--chips`` named gives the job a chip (see :func:`_within_cards`)."""
    for card in cards:
        if not any(c.asic_id in chips for c in card):
            lead = inv.lead(card[0])
            bdf = lead.bdf if lead is not None else card[0].label
            raise bad_input(
                f"--chips {bdf}: no chip of this card is in the connected mesh of --tp-size "
                f"{len(chips)} chosen among the cards named",
                "name the cards whose chips connect, or give --tp-size as their chip count",
            )


def _start_mode(
    req: LaunchRequest, allow_mpi_layouts: bool, descriptor_only: bool
) -> LaunchRequest:
    """How the ranks start: a server is one process driving every chip; a tt-metal world
    needs MPI (its mpirun found, and its version read, once here)."""
    if req.profile is not None:  # a server: one process drives every chip
        req = replace(req, layout=Layout.SINGLE_PROCESS, launcher=StartMode.DIRECT, nproc=None)
    if req.layout in MPI_LAYOUTS and req.launcher != StartMode.MPI and not allow_mpi_layouts:
        raise bad_input(
            f"--mesh-layout {req.layout} forms one tt-metal world across processes, which only an "
            "MPI launcher can start (each process spawned alone sees a world of one)",
            "drop --launcher direct (mesh layouts start under mpirun), or use isolated/single-process",
        )
    if req.launcher == StartMode.MPI and not descriptor_only:
        from ttmesh.launcher.nodes import mpi

        req = replace(req, mpirun=mpi.find_mpirun(req.mpirun or None))
        mpi.version(req.mpirun)  # read once here: each attempt's guardian (a fork) reuses it
    return req


def _chip_count(
    req: LaunchRequest, inv: Inventory, chosen: list[Chip]
) -> tuple[LaunchRequest, str | None]:
    """--tp-size, or its default (and what --dry-run says of it), against --chips and
    --mesh-shape."""
    default_note = None
    if req.tp_size is None:
        tp, default_note = default_tp(req, inv, chosen)
        req = replace(req, tp_size=tp)
    if req.tp_size <= 0:
        raise bad_input(
            f"--tp-size {req.tp_size}: must be a positive number of chips", "e.g. --tp-size 4"
        )
    if chosen and len(chosen) != req.tp_size:
        raise bad_input(
            f"--chips names {plural(len(chosen), 'chip')} but --tp-size is {req.tp_size}",
            "give as many chips as --tp-size, or drop --tp-size",
        )
    check_mesh_shape(req.mesh_shape, req.tp_size)
    return req, default_note


def check_mesh_shape(shape: tuple[int, int] | None, tp_size: int) -> None:
    """--mesh-shape against the job's chip count (one host's, or a mesh over hosts'): the one
    place the rule is checked."""
    if shape and shape[0] * shape[1] != tp_size:
        rows, cols = shape
        raise bad_input(
            f"--mesh-shape {rows}x{cols} has {plural(rows * cols, 'chip')} but --tp-size is "
            f"{tp_size}",
            "make ROWS x COLS equal the chip count",
        )


def _passed_over(inv: Inventory, choice: Choice) -> list[dict[str, object]]:
    """The chips the choice passed over, and why."""
    used = {a for u in choice.sel.units for a in u.chips}
    broken = choice.broken
    # A mesh holding a broken pair is --auto-reset's to mend: its links are no reason.
    avoided = [b for b in broken if not set(b.chips) <= used]
    if len(avoided) == len(broken):
        return healthy.passed_over(inv, used, *choice.seen, broken)
    return healthy.passed_over(inv, used, *choice.seen, [])


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
    profile, args = req.profile, req.server_args
    assert profile is not None and args is not None
    from ttmesh.launcher.serving import spec

    what = spec.ServingSpec(profile, args).chipless_what
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
    tp, findings = spec.server_tp(profile, args, None)
    req = replace(
        req, layout=Layout.SINGLE_PROCESS, launcher=StartMode.DIRECT, nproc=None,
        server_findings=[*req.server_findings, *findings],
    )  # fmt: skip
    req = _with_serving(req, tp or 1, None)
    assert req.serving is not None
    argv = resolve_command(req)
    serving = server_port_free(req.serving, dry_run)
    req = _identity(req)
    if req.numa_binding:
        from ttmesh.launcher.planning import numa

        numa.prefixes(host, [])  # no chip to be near, but taskset is still asked for
    unused = f"; {host.flag} is not read" if host.flag else ""
    said = f"{what}: none is chosen, leased, checked or recovered{unused}"
    req = replace(req, serving=replace(serving, notes=(*serving.notes, said)))
    inv = Inventory(host=host, driver="", chips=[], links=[], topology="none")
    return Prepared(build_chipless(req, argv), inv, None, request=req)


def _identity(req: LaunchRequest) -> LaunchRequest:
    """The job's id (generated unless --job-id), its run directory and working directory."""
    job = req.job or jobs.new_job_id()
    run_dir, segment_dir = req.run_dir, req.segment_dir
    if not run_dir:
        run_dir = str(jobs.runs_dir() / job)
        segment_dir = jobs.segment_dir(run_dir)
    return replace(
        req, job=job, run_dir=run_dir, segment_dir=segment_dir, cwd=req.cwd or paths.cwd()
    )


def _plan(
    req: LaunchRequest,
    inv: Inventory,
    sel: meshselect.Selection,
    host: Host,
    descriptor_only: bool,
    dry_run: bool = False,
) -> tuple[LaunchRequest, LaunchPlan]:
    """The rest of :func:`prepare` once the chips are chosen: memory, server, command, port,
    job id, mock clusters and the plan; the request as planned, and the plan."""
    dram = memory.plan(req.symmetric_dram_mb, [inv.chip(a).dram_mb for a in sel.chips])
    req = replace(req, symmetric_dram_mb=dram)
    if req.profile is not None:
        # The job's tensor-parallel degree: every host's chips (this host has its share).
        tp = len(sel.chips) * req.tp_hosts
        req = _with_serving(req, tp, min(inv.chip(a).dram_mb for a in sel.chips))
    if descriptor_only:
        argv: list[str] = []
    else:
        argv = resolve_command(req)
        if req.serving is not None:
            req = replace(req, serving=server_port_free(req.serving, dry_run))
        if req.master_port:
            check_port(req.master_port, req.master_addr)
        else:
            req = replace(req, master_port=free_port(req.master_addr))
    req = _identity(req)
    split = plan_split(req, sel)  # once per launch: the mock clusters and the plan share it
    if req.program is not None and not descriptor_only:
        req = _with_program(req, argv, split, sel)
    cluster = None if descriptor_only else host.mock_cluster()
    if cluster is not None:
        req = replace(req, mocks=mock_clusters(cluster, split, req))
    outside = surroundings(req)
    if req.numa_binding:  # each rank's command under taskset, near its chips
        from ttmesh.launcher.planning import numa

        ranks = [(b.rank, b.bdfs) for b in split.blocks]
        outside = replace(outside, numa=numa.prefixes(host, ranks))
    plan = build(req, inv, sel, argv, split, outside)
    if not descriptor_only:
        plan = _host_view(plan, inv)
    return req, plan


def _host_view(plan: LaunchPlan, inv: Inventory) -> LaunchPlan:
    """A simulated host's job: its ranks see the host's chips at the real paths, each in a mount
    namespace of its own (launcher.planning.simview; the starter says so in one line when none
    can be made). Ranks mpirun starts see the machine's paths, as before."""
    from ttmesh.launcher.planning import simview

    if plan.launcher != StartMode.DIRECT:
        return plan
    return replace(plan, host_view=simview.wanted(inv, plan.all_chips()))


def _with_program(
    req: LaunchRequest, argv: list[str], split: layout.Split, sel: meshselect.Selection
) -> LaunchRequest:
    """A program profile's job: which libtt the ranks' Python has (what that release cannot run
    is refused now, not minutes into a start) and, for torch_tpu, what every rank shares: a
    free port per process for its slice, a handshake port of the job's own (both held until
    the ranks start) and the topology of the job's chips."""
    import time

    from ttmesh.launcher.planning import programs, rankenv
    from ttmesh.launcher.planning.ports import hold_free

    spec = req.program
    assert spec is not None
    world = len(split.blocks)
    libtt = spec.profile.libtt
    if libtt is not None:
        python = programs.rank_python(argv, req.python, req.environ.get("PATH"))
        names = [libtt.distribution, *([libtt.required] if libtt.required else [])]
        stack = programs.read_stack(python, names, {**req.environ, **dict(req.env)})
        spec = programs.check_stack(spec, stack, world * req.nnodes, len(sel.chips))
    if spec.profile.contract == "torch-tpu":
        held = hold_free(world + 1, req.master_addr)
        spec = replace(
            spec,
            tpu=rankenv.TpuSlice(
                addresses=tuple(f"{req.master_addr}:{port}" for port in held[:world]),
                topology=rankenv.topology(sel.shape),
                handshake_port=held[world],
                session=str(time.time_ns()),
            ),
        )
    return replace(req, program=spec)


def _with_serving(req: LaunchRequest, tp: int, chip_mb: int | None) -> LaunchRequest:
    """The request with the server's spec for ``tp`` chips (a chipless server: its own
    ``--tp-size``, and no chip memory) and its ready timeout; its rules' errors refuse the
    launch (exit 2)."""
    from ttmesh.launcher.serving import spec

    profile, args = req.profile, req.server_args
    assert profile is not None and args is not None
    serving = spec.build(
        profile,
        args,
        tp=tp,
        environ=req.environ,
        user_env=dict(req.env),
        symmetric_mb=req.symmetric_dram_mb,
        chip_mb=chip_mb,
        cwd=req.cwd or paths.cwd(),
        findings=req.server_findings,
    )
    policy = req.policy
    ready_timeout = serving.ready_timeout if policy.ready_timeout is None else policy.ready_timeout
    probe_timeout = serving.probe_timeout
    if policy.probe_interval is not None:
        probe_timeout = policy.probe_timeout or serving.profile.probe.get("timeout", 60.0)
    serving = replace(  # the watch the request asks for (the profile's ready timeout unless)
        serving, health_interval=policy.health_interval, health_failures=policy.health_failures,
        probe_interval=policy.probe_interval, probe_timeout=probe_timeout,
        ready_timeout=ready_timeout,
    )  # fmt: skip
    errors = serving.errors(req.strict)
    if errors:
        for extra in [f for f in serving.findings if f not in errors[:1]]:
            note(f"{extra.severity}: {extra.message} (fix: {extra.fix})")
        first = errors[0]
        more = f" ({len(errors) - 1} more above)" if len(errors) > 1 else ""
        raise bad_input(  # an error, said as one, as warnings say theirs
            f"error: {profile.name}: {first.message}{more}",
            f"fix: {first.fix}"
            + ("; --strict makes warnings errors" if first.severity == "warning" else ""),
        )
    return replace(req, serving=serving, policy=replace(policy, ready_timeout=ready_timeout))


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
