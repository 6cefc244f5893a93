"""``ttmesh launch``: one worker per chip, supervised.

The command declares its options and hands them to ``launcher.planning.options`` (checked
once, the job's mode decided, the request built); what is left here is starting the job the
way its mode says (:data:`START`)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ttmesh import __version__, numeric
from ttmesh.cli import torchrun
from ttmesh.cli.launch_args import LaunchCommand
from ttmesh.cli.params import CONTEXT, host_options, seconds, whole
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.render import plural
from ttmesh.vocab import LAYOUTS, JobMode, StartMode

if TYPE_CHECKING:
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.nodes.multihost import MultiHost, Peers
    from ttmesh.launcher.planning.options import Launch
    from ttmesh.launcher.planning.prepare import Prepared
    from ttmesh.launcher.planning.request import LaunchRequest

LAUNCH_CONTEXT = {**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False}


@click.command("launch", cls=LaunchCommand, context_settings=LAUNCH_CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="ttmesh")
@host_options
@torchrun.options
@click.option(
    "--tp-size",
    type=whole(low=1, high=numeric.MAX_CHIPS, unit="chips", example="4"),
    metavar="N",
    help="Chips of the job, one worker each (per board on n300): the tensor-parallel degree, "
    "over every host. Default: every chip.",
)
@click.option(
    "--replicas",
    type=whole(low=1, high=numeric.MAX_CHIPS, unit="replicas", example="2"),
    metavar="N",
    help="A serving fleet: N servers, each on --tp-size chips of its own, behind SGLang's router "
    "at the server's --host:--port.",
)
@click.option(
    "--replicas-parallel",
    is_flag=True,
    help="With --replicas: start every replica at once (default: each after the previous is "
    "ready, or after 120 s).",
)
@click.option(
    "--router-arg",
    "router_args",
    multiple=True,
    metavar="ARG",
    help="With --replicas: pass ARG to SGLang's router (repeatable; e.g. --router-arg=--policy "
    "--router-arg=round_robin).",
)
@click.option(
    "--no-memory-check",
    "no_memory_check",
    is_flag=True,
    help="With --replicas: start even when the replicas' peak host memory is more than "
    "MemAvailable.",
)
@click.option("--fleet-of", "fleet_of", hidden=True, metavar="JOB")
@click.option(
    "--events-fd", "events_fd", hidden=True, metavar="FD",
    type=whole(low=0, high=2**31 - 1, unit="file descriptor", example="3"),
)  # fmt: skip
@click.option(
    "--nproc-per-node",
    "--nproc_per_node",
    "nproc",
    type=torchrun.Nproc(whole(low=1, high=numeric.MAX_CHIPS, unit="processes", example="2")),
    metavar="N|auto",
    help="Workers on this host (torchrun's; each host's). Default: one per chip; fewer, each a "
    "block of chips, with --mesh-layout mesh.",
)
@click.option(
    "--chips",
    metavar="BDF,...",
    help="Use exactly these chips (PCI addresses or /dev/tenstorrent/by-id names).",
)
@click.option("--exclude", metavar="BDF,...", help="Never use these chips.")
@click.option(
    "--mesh-shape",
    metavar="RxC",
    help="Mesh shape of the chips (default: the squarest the host has).",
)
@click.option(
    "--mesh-layout",
    type=click.Choice(LAYOUTS),
    help="isolated (the default: a chip and descriptor each), single-process (one worker, every "
    "chip), mesh/multi-mesh (MPI).",
)
@click.option(
    "--symmetric-dram-mb",
    type=whole(low=1, high=1 << 20, unit="MB", example="2048"),
    default=2048,
    show_default=True,
    metavar="MB",
    help="LIBTT_SYMMETRIC_DRAM_MB, equal on every rank (DRAM reserved per chip for collectives).",
)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set for every rank (repeatable).",
)
@click.option(
    "--master-port",
    "--master_port",
    type=whole(low=0, high=65535, example="29500"),
    default=0,
    metavar="PORT",
    help="torch.distributed's port (default: a free one).",
)
@click.option(
    "--max-restarts",
    "--max_restarts",
    type=whole(low=0, example="3"),
    default=0,
    show_default=True,
    metavar="K",
    help="Relaunch every rank up to K times after a failure.",
)
@click.option(
    "--grace",
    "--shutdown-timeout",
    "--shutdown_timeout",
    type=seconds(example="5"),
    metavar="S",
    help="Seconds between SIGTERM and SIGKILL when stopping workers [default: 5; a server's "
    "profile gives its own].",
)
@click.option(
    "--fabric-grace",
    type=seconds(example="20"),
    default=20.0,
    show_default=True,
    metavar="S",
    help="Extra seconds for a rank still bringing up the fabric when the job stops (killed then, "
    "its links stay wedged).",
)
@click.option(
    "--op-timeout",
    type=seconds(zero=False, example="60"),
    metavar="S",
    help="TT_METAL_OPERATION_TIMEOUT_SECONDS: a dispatch operation slower than S raises instead "
    "of hanging. Default: off.",
)
@click.option(
    "--on-reset-notice",
    type=click.Choice(["stop", "pass"]),
    default="stop",
    show_default=True,
    help="When another tool announces a reset of the job's chips (tt-umd's notice): stop every "
    "rank, or pass it on.",
)
@click.option(
    "--ranks-filter",
    "--local-ranks-filter",
    "--local_ranks_filter",
    metavar="R,...",
    help="Show only these ranks' output on the console (log files get everything).",
)
@click.option(
    "--log-dir",
    "--log_dir",
    metavar="DIR",
    help="Write each rank's stdout and stderr to files, in torchrun's layout: "
    "DIR/<job>_<random>/attempt_N/<local rank>/.",
)
@click.option(
    "-r",
    "--redirects",
    metavar="0-3|R:S,...",
    help="torchrun's: these streams to the log files only: 1 stdout, 2 stderr, 3 both, 0 none, "
    "or per local rank (0:1,1:2).",
)
@click.option(
    "-t",
    "--tee",
    metavar="0-3|R:S,...",
    help="torchrun's: these streams go to the console and the log files (values as --redirects).",
)
@click.option(
    "--no-logs",
    is_flag=True,
    help="Keep no copy of the ranks' output with the job's record (ttmesh logs JOB then has none).",
)
@click.option("--quiet", "-q", is_flag=True, help="No worker output on the console.")
@click.option(
    "--no-live",
    is_flag=True,
    help="On a terminal, the ranks' prefixed lines only, without the live table (as in a pipe, "
    "or with CI set).",
)
@click.option(
    "-m", "--module", is_flag=True, help="COMMAND is a Python module (python -m COMMAND)."
)
@click.option(
    "--no-python", "--no_python", is_flag=True, help="Run COMMAND as is, even if it ends in .py."
)
@click.option(
    "--nnodes",
    metavar="N",
    help="Hosts in the job (torchrun's): one ttmesh agent per host, joined at --rdzv-endpoint. "
    "Under Slurm: SLURM_NNODES.",
)
@click.option(
    "--node-rank",
    "--node_rank",
    "node_rank",
    type=whole(low=0, high=numeric.MAX_CHIPS),
    metavar="R",
    help="This host's place, 0..N-1 (node 0 hosts the rendezvous). Under Slurm: SLURM_NODEID.",
)
@click.option(
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "rdzv_endpoint",
    metavar="HOST[:PORT]",
    help="Where the hosts meet: node 0's address (port 29400 by default; IPv6 in brackets). "
    "Under Slurm: the job's first host.",
)
@click.option(
    "--rdzv-backend",
    "--rdzv_backend",
    "rdzv_backend",
    type=click.Choice(["c10d", "static"]),
    help="The rendezvous: ttmesh's own over torch's c10d store (torchrun's static is taken as "
    "the same).",
)
@click.option(
    "--rdzv-token",
    metavar="TOKEN",
    envvar="TTMESH_RDZV_TOKEN",
    help="A secret every host of the job shares: what an agent publishes is signed with it (for "
    "this job and run). Env: TTMESH_RDZV_TOKEN.",
)
@click.option(
    "--local-addr",
    "--local_addr",
    "local_addr",
    metavar="ADDR",
    help="This host's address for the other hosts (default: the one that reaches the endpoint).",
)
@click.option(
    "--heartbeat-timeout",
    type=seconds(zero=False, example="5"),
    default=5.0,
    show_default=True,
    metavar="S",
    help="A host silent this long is gone: every other host stops.",
)
@click.option(
    "--rdzv-timeout",
    type=seconds(zero=False, example="300"),
    default=300.0,
    show_default=True,
    metavar="S",
    help="How long hosts wait for each other to join (and to agree to start).",
)
@click.option(
    "--hosts",
    metavar="HOST,...",
    help="A job over these hosts, started with mpirun: an agent per host, or one tt-metal mesh "
    "with --mesh-layout mesh.",
)
@click.option(
    "--launch-agent",
    metavar="CMD",
    help="With --hosts: how mpirun reaches the hosts instead of ssh (Open MPI's plm_rsh_agent).",
)
@click.option(
    "--tcp-interface",
    metavar="IF",
    help="With --hosts and a tt-metal mesh: MPI's TCP traffic on this interface (default: all "
    "but docker0 and lo).",
)
@click.option(
    "--profile",
    "profile_name",
    metavar="NAME",
    help="The serving stack COMMAND runs (default: recognised from the command; none: run a "
    "server as any command).",
)
@click.option(
    "--strict", is_flag=True, help="A server's rule warnings are errors (nothing starts)."
)
@click.option(
    "--health-interval",
    type=seconds(zero=False, example="10"),
    metavar="S",
    help="After a server is ready, ask its health endpoint every S seconds; --health-failures in "
    "a row fail the job.",
)
@click.option(
    "--health-failures",
    type=whole(low=1, example="3"),
    default=3,
    show_default=True,
    metavar="K",
    help="Health checks that may fail in a row (with --health-interval).",
)
@click.option(
    "--probe-interval",
    type=seconds(zero=False, example="60"),
    metavar="S",
    help="After a server is ready, ask it for a one-token generation every S seconds: no answer "
    "in --probe-timeout is a hang.",
)
@click.option(
    "--probe-timeout",
    type=seconds(zero=False, example="60"),
    metavar="S",
    help="Seconds a --probe-interval generation may take (default: the profile's, 60).",
)
@click.option(
    "--strict-links",
    is_flag=True,
    help="Descriptors demand the weakest neighbour pair's link count of every pair (STRICT).",
)
@click.option(
    "--launcher",
    type=click.Choice([str(m) for m in StartMode]),
    default=None,
    help="How ranks start: direct (a process each, the default) or mpi (one MPMD mpirun: the "
    "default for a tt-metal mesh).",
)
@click.option(
    "--auto-reset",
    is_flag=True,
    help="When pre-flight finds the chips unhealthy (links down, a hung chip), reset them "
    "(tt-smi -r), verify, then start.",
)
@click.option(
    "--reset-on-failure",
    is_flag=True,
    help="After an abnormal end, always reset the job's chips (default: only when links are down).",
)
@click.option(
    "--ready-timeout",
    type=seconds(zero=False, example="600"),
    metavar="S",
    help="Every rank must be ready within S seconds (its ready file, or --ready-pattern), or the "
    "job is treated as hung.",
)
@click.option(
    "--hang-timeout",
    type=seconds(zero=False, example="900"),
    metavar="S",
    help="Ranks that print nothing for S seconds are hung: stacks dumped (py-spy), stopped, "
    "restarted. Default: off.",
)
@click.option(
    "--ready-pattern",
    metavar="REGEX",
    help="A line of output that means a rank is ready (RE2 syntax: matched in linear time).",
)
@click.option("--tt-smi", "tt_smi", metavar="PATH", help="The tt-smi to recover chips with.")
@click.option(
    "--train-timeout",
    "train_timeout",
    type=seconds(example="60"),
    metavar="S",
    help="After ttmesh resets the job's chips, wait up to S seconds for their links to train "
    "(default: the boards' bound).",
)
@click.option(
    "--rank-binding",
    metavar="FILE.yaml",
    help="Run a tt-run rank-binding file: its ranks, chips, mesh ids and descriptor, under "
    "mpirun and ttmesh's supervision.",
)
@click.option(
    "--rank-bindings-mapping",
    metavar="FILE.yaml",
    help="tt-run's sub-contexts: a map of sub-context id to rank-binding file, run as one job in "
    "id order.",
)
@click.option(
    "--workdir",
    metavar="DIR",
    help="The ranks' working directory (default: yours; under --launcher mpi, one of the job's "
    "own: docs/tt-run.md).",
)
@click.option(
    "--job-id",
    "--run-id",
    "--rdzv-id",
    "job_id",
    metavar="ID",
    help="Name the job (default: generated).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan and run the checks a launch runs before it starts (refused alike, exit "
    "3); start nothing.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="With --dry-run: the ttmesh.plan/1 JSON document."
)
@click.option(
    "--show-env", is_flag=True, help="Show --env values in plans and records (hidden by default)."
)
@click.option(
    "--summary-json",
    metavar="FILE",
    help="Write the outcome {source, rank, code, reason} to FILE (unwritable: said, and a job "
    "that succeeded exits 2).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] COMMAND [ARGS]...")
def launch_cmd(**options: Any) -> int:
    """Run COMMAND once per chip, supervised: the torchrun contract plus chips and fabric.

    \b
    Each rank gets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, ...), its chips
    (TT_VISIBLE_DEVICES) and a mesh graph descriptor (TT_MESH_GRAPH_DESC_PATH). Its lines are
    prefixed [rN] (or as TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE says, as torchrun's). The first
    rank to fail stops the job, and its exit code is ttmesh's. Before anything starts,
    pre-flight refuses (exit 3) chips that are held, leased, frozen or whose links are down. A
    server ttmesh knows (ttmesh profiles) runs as its makers intend. On a terminal a live table
    of the ranks stays under their output. Every flag of torchrun's is taken, also as torchrun
    spells it (--nproc_per_node for --nproc-per-node).

    \b
    More: docs/torchrun.md (each rank's environment, output, exit codes, signals, hangs),
    docs/serving.md (servers, --replicas), docs/multihost.md (several hosts), docs/tt-run.md
    (meshes, rank bindings), docs/recovery.md (resets), docs/quickstart.md (pre-flight,
    --dry-run, the live view).

    \b
    Examples:
      ttmesh launch --sim quietbox2 --tp-size 4 examples/allreduce.py
      ttmesh launch --sim quietbox2 --tp-size 4 --dry-run --json -- ./run.sh
      ttmesh launch --tp-size 2 --chips 0000:01:00.0,0000:03:00.0 -- python -m mypkg.serve
      ttmesh launch --sim quietbox2 -- python -m sglang.launch_server --model-path M --device tpu --tp-size 4
      ttmesh launch --sim quietbox2 --replicas 2 --tp-size 2 -- python -m sglang.launch_server --model-path M --device tpu --tp-size 2 --port 30000
    """
    from ttmesh.launcher.planning.options import Launch, LaunchOptions

    launch = Launch.from_options(LaunchOptions(**options))
    if launch.options.events_fd is not None:
        from ttmesh.launcher.job.feed import open_channel

        open_channel(launch.options.events_fd)  # a pipe of this user's, or one line, exit 2
    return START[launch.mode](launch)


torchrun.adopt(launch_cmd)


def _agents(launch: Launch) -> int:
    """--hosts: mpirun starts one agent per host, each a c10d launch of its own host."""
    from ttmesh.launcher.nodes import agents

    o = launch.options
    assert launch.join is not None and o.hosts is not None
    argv = (click.get_current_context().find_root().obj or {}).get("argv", sys.argv[1:])
    return agents.start(o.hosts, (_multihost(launch), launch.join.job), argv, dry_run=o.dry_run)


def _mesh_over_hosts(launch: Launch) -> int:
    """--hosts with a tt-metal mesh: one global plan over the hosts' reports, one mpirun."""
    from ttmesh.launcher.nodes import meshhosts

    o, request = launch.options, _request(launch)
    assert o.hosts is not None
    mh = meshhosts.setup(meshhosts.parse_hosts(o.hosts), agent=o.launch_agent,
                         tcp_interface=o.tcp_interface)  # fmt: skip

    def plan() -> Prepared:
        if o.chips or o.exclude:
            raise bad_input("--chips/--exclude name one host's chips", "drop them with --hosts")
        return meshhosts.prepare(dataclasses.replace(request, mpirun=mh.mpirun), mh)

    return _run(launch, plan)


def _this_host(launch: Launch) -> int:
    """This host's chips: the whole job (one host), or this host's part of it (c10d)."""
    from ttmesh.launcher.planning import tpsize
    from ttmesh.launcher.planning.prepare import prepare

    o, request = launch.options, _request(launch)
    mh = None
    if launch.mode is JobMode.C10D:
        from ttmesh.launcher.nodes import multihost

        mh = _multihost(launch)
        multihost.check(mh)

    def plan() -> Prepared:
        try:
            prepared = prepare(
                request, o.host, o.chips, o.exclude, repairable=o.auto_reset,
                defer_liveness=not o.dry_run and mh is None, dry_run=o.dry_run,
            )  # fmt: skip
        except TTMeshError as exc:
            raise tpsize.over_hosts(exc, launch.job_tp, request.tp_hosts, request.tp_size) from None
        if launch.job_tp is not None and request.tp_hosts > 1:
            prepared.plan.notes.append(tpsize.note(launch.job_tp, request.tp_hosts))
        return prepared

    return _run(launch, plan, mh)


def _fleet(launch: Launch) -> int:
    """--replicas N: N servers on their own chips behind SGLang's router (launcher.fleet)."""
    from ttmesh.launcher.fleet import place, router
    from ttmesh.launcher.job.summary import write_refusal
    from ttmesh.render import note

    o = launch.options
    try:
        if not o.dry_run:
            router.check_installed()  # before the host is read or anything is planned
        fp = place.plan_fleet(launch, o.host)
        if not o.dry_run:
            from ttmesh.launcher.planning import ports

            ports.check_server_port(fp.host, fp.port)  # the router's: the user's --host:--port
            if fp.router_opts is not None:
                from ttmesh.launcher.fleet import routeropts

                routeropts.check_free(fp.router_opts)  # its metrics port, when given
    except TTMeshError as exc:
        if o.summary_json and not o.dry_run:
            write_refusal(o.summary_json, exc)
        raise
    serving = fp.replicas[0].prepared.plan.serving
    assert serving is not None  # a fleet is of servers
    note(f"{serving.profile.name}: {serving.profile.title}")
    for n in serving.notes + ([serving.budget_note] if serving.budget_note else []):
        note(f"note: {n}")
    for f in serving.findings:
        note(f"{f.severity}: {f.message} (fix: {f.fix})")
    for n in fp.notes:
        note(f"note: {n}")
    if fp.router_opts is not None:
        note(f"router: Prometheus metrics at {fp.router_opts.announced}")
    if o.dry_run:
        from ttmesh.render import emit_json

        if o.as_json:
            emit_json(fp.to_json(o.show_env))
        else:
            from ttmesh.cli.views import fleet_text

            click.echo(fleet_text(fp.to_json(o.show_env)))
        return 0
    from ttmesh.cli import streams
    from ttmesh.cli.live import enabled
    from ttmesh.launcher.fleet.run import Fleet

    streams.job_code = True
    if not enabled(sys.stdout, o.no_live):
        return Fleet(o, o.host, fp).run()  # the replicas' lines, plain
    from ttmesh.cli.fleetview import FleetView

    with FleetView(fp.job) as view:
        return Fleet(o, o.host, fp, view).run()


# How each mode starts (``Launch.mode``, decided once by launcher.planning.options).
START: dict[JobMode, Callable[[Launch], int]] = {
    JobMode.ONE_HOST: _this_host,
    JobMode.C10D: _this_host,
    JobMode.HOSTS: _agents,
    JobMode.MESH_OVER_HOSTS: _mesh_over_hosts,
    JobMode.FLEET: _fleet,
}


def _request(launch: Launch) -> LaunchRequest:
    assert launch.request is not None  # every mode but --hosts has one
    return launch.request


def _multihost(launch: Launch) -> MultiHost:
    """How this agent joins the job, as the rendezvous takes it."""
    from ttmesh.launcher.nodes.multihost import MultiHost

    join = launch.join
    assert join is not None
    return MultiHost(
        nnodes=join.nnodes,
        node_rank=join.node_rank,
        endpoint=join.endpoint,
        token=join.token,
        local_addr=join.local_addr,
        join_timeout=join.join_timeout,
        heartbeat_timeout=join.heartbeat_timeout,
        tp_size=launch.job_tp or 0,
    )


def _run(launch: Launch, plan: Callable[[], Prepared], mh: MultiHost | None = None) -> int:
    """The plan, its checks (a refusal written to --summary-json), then the dry run's output
    or the job."""
    from ttmesh.launcher.job.preflight import dry_run_checks
    from ttmesh.launcher.job.summary import write_refusal

    o = launch.options
    try:
        prepared = plan()
        _check_planned(launch, prepared)
        if o.dry_run:  # every check the launch runs before its start, or why it is skipped
            dry_run_checks(prepared, o.auto_reset, rendezvous=mh is not None)
        torchrun.apply_plan(prepared.plan, o.torchrun_flags, o.host)
    except TTMeshError as exc:
        if o.summary_json and not o.dry_run:
            write_refusal(o.summary_json, exc)
        raise
    if prepared.plan.passed_over and not o.dry_run:  # --dry-run lists them in its plan
        from ttmesh.render import note

        note(passed_over_line(prepared.plan))
    program = prepared.plan.program
    if program is not None:  # a program profile's job: which, why, and its stack
        from ttmesh.render import note

        note(f"{program.profile.name}: {program.profile.title}, chosen because {program.why}")
        for n in program.notes:
            note(f"note: {n}")
    serving = prepared.plan.serving
    if serving is not None:
        from ttmesh.render import note

        note(f"{serving.profile.name}: {serving.profile.title}")
        for n in serving.notes + ([serving.budget_note] if serving.budget_note else []):
            note(f"note: {n}")
        for f in serving.findings:
            note(f"{f.severity}: {f.message} (fix: {f.fix})")
    if o.dry_run:
        from ttmesh.render import emit_json

        data = prepared.plan.to_json(o.show_env)
        if o.as_json:
            emit_json(data)
        else:
            from ttmesh.cli.views import plan_text

            click.echo(plan_text(data))
        return 0
    return _start(launch, prepared, mh)


def passed_over_line(plan: Any) -> str:
    """The chips the choice left out, and why, in one line (``--dry-run`` lists them)."""
    parts = [f"{', '.join(p['chips'])} ({p['why']})" for p in plan.passed_over]
    used = ", ".join(b for r in plan.ranks for b in r.bdfs)
    return f"note: passed over {'; '.join(parts)}: the job runs on {used}"


def _check_planned(launch: Launch, prepared: Prepared) -> None:
    """The options that could only be checked against the plan."""
    o = launch.options
    serving = prepared.plan.serving
    if serving is not None and serving.profile.extra.get("failures") is not None:
        from ttmesh.launcher.attempt import failures  # its own known lines: read before the start

        where = f"profile {serving.profile.path or serving.profile.name}: failures"
        failures.profile_entries(serving.profile.extra["failures"], where)
    if prepared.plan.chipless:  # no chip to recover (chipless refuses the rest)
        for flag, given in (
            ("--reset-on-failure", o.reset_on_failure),
            ("--tt-smi", o.tt_smi),
            ("--train-timeout", o.train_timeout is not None),
        ):
            if given:
                assert prepared.plan.serving is not None
                raise bad_input(f"{flag}: {prepared.plan.serving.chipless_what}", "drop it")
    shown_ranks = launch.shown_ranks
    if shown_ranks is not None:
        world = len(prepared.plan.ranks)
        extra = sorted(r for r in shown_ranks if not 0 <= r < world)
        if extra:
            err = bad_input(
                f"--ranks-filter {o.ranks_filter}: no rank {', '.join(map(str, extra))} "
                f"in a job of {plural(world, 'rank')}",
                f"ranks are 0..{world - 1}",
            )
            raise prepared.liveness.first(err) if prepared.liveness else err


def _start(launch: Launch, prepared: Prepared, mh: MultiHost | None) -> int:
    """The job itself: its hosts joined (c10d), its logs' directory, then its attempts."""
    from ttmesh.cli import streams
    from ttmesh.cli.live import JobView, enabled
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.job.repair import Recovery
    from ttmesh.launcher.job.run import execute
    from ttmesh.runtime import joblogs

    o = launch.options
    shown = set(launch.shown_ranks) if launch.shown_ranks is not None else None
    options = Options(
        ranks_filter=shown, quiet=o.quiet, logs=launch.logs, keep_logs=not o.no_logs,
        log_limits=joblogs.limits() if not o.no_logs else None,
    )  # fmt: skip
    recovery = Recovery(
        auto_reset=o.auto_reset,
        reset_on_failure=o.reset_on_failure,
        tt_smi=o.tt_smi,
        train_timeout=o.train_timeout,
        fleet_of=o.fleet_of,
    )
    peers = None if mh is None else _join(launch, prepared, mh)
    if launch.log_dir is not None or (launch.logs is not None and launch.logs.files_wanted):
        from ttmesh.launcher.job import logdir
        from ttmesh.render import note

        assert launch.logs is not None
        where = logdir.make_run_dir(launch.logs, launch.log_dir, prepared.plan.job)
        note(f"the ranks' logs: {where}/attempt_N/<local rank>/stdout.log, stderr.log")
    streams.job_code = True  # from here the job's code is the exit code, whatever is lost
    if o.events_fd is not None:  # a replica of a fleet: its events on the fleet's pipe
        return _fed(prepared, options, o.events_fd, lambda: execute(
            prepared, options, o.summary_json, recovery=recovery, peers=peers))  # fmt: skip
    if not enabled(sys.stdout, o.no_live):
        return execute(prepared, options, o.summary_json, recovery=recovery, peers=peers)
    with JobView(prepared.plan) as view:
        options.observer = view
        options.checklist_drawn = True  # the view draws a server's start: no line per step
        return execute(prepared, options, o.summary_json, recovery=recovery, peers=peers)


def _fed(prepared: Prepared, options: Options, fd: int, run: Callable[[], int]) -> int:
    """The job with its events written to its fleet's pipe (``launcher.job.feed``), the last
    one its exit code: also when it is refused, or stopped between attempts."""
    from ttmesh.launcher.job.feed import Feed

    plan = prepared.plan
    url = plan.serving.url if plan.serving is not None else None
    feed = Feed(fd, url, [b for r in plan.ranks for b in r.bdfs], options.observer)
    options.observer = feed
    code = 1
    try:
        code = run()
    except TTMeshError as exc:
        code = exc.code
        raise
    finally:
        feed.ended(code)
    return code


def _join(launch: Launch, prepared: Prepared, mh: MultiHost) -> Peers:
    """The other hosts joined: the plan becomes the job's global one."""
    from ttmesh.launcher.nodes.multihost import Peers

    peers = Peers(mh, launch.rdzv_job)
    try:
        prepared.plan = peers.join(prepared.plan)
        torchrun.apply_plan(prepared.plan, launch.options.torchrun_flags, launch.options.host)
    except BaseException:
        peers.coord.close()
        raise
    return peers
