"""``ttmesh launch``: one worker per chip, supervised.

The command declares its options and makes one call: ``launcher.api.launch`` (what
``ttmesh.launch`` is from Python) checks them once, decides the job's mode, plans and runs it;
what is left here is what a terminal shows (:class:`_Console`) and a dry run's plan."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import click

from ttmesh.cli import torchrun
from ttmesh.cli.launch_args import LaunchCommand
from ttmesh.cli.params import CONTEXT, bounded, host_options
from ttmesh.version import __version__
from ttmesh.vocab import LAYOUTS, StartMode

if TYPE_CHECKING:
    from ttmesh.launcher.attempt.events import Observer
    from ttmesh.launcher.fleet.run import Watcher
    from ttmesh.launcher.planning.plan import LaunchPlan

LAUNCH_CONTEXT = {**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False}


@click.command("launch", cls=LaunchCommand, context_settings=LAUNCH_CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="ttmesh")
@host_options
@torchrun.options
@click.option(
    "--tp-size",
    type=bounded("tp_size"),
    metavar="N",
    help="Chips of the job, one worker each (per board on n300): the tensor-parallel degree, "
    "over every host. Default: every chip.",
)
@click.option(
    "--replicas",
    type=bounded("replicas"),
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
    type=bounded("events_fd"),
)  # fmt: skip
@click.option(
    "--nproc-per-node",
    "--nproc_per_node",
    "nproc",
    type=torchrun.Nproc(bounded("nproc")),
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
    type=bounded("symmetric_dram_mb"),
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
    type=bounded("master_port"),
    default=0,
    metavar="PORT",
    help="torch.distributed's port (default: a free one).",
)
@click.option(
    "--max-restarts",
    "--max_restarts",
    type=bounded("max_restarts"),
    default=0,
    show_default=True,
    metavar="K",
    help="Relaunch every rank up to K times after a failure.",
)
@click.option(
    "--grace",
    "--shutdown-timeout",
    "--shutdown_timeout",
    type=bounded("grace"),
    metavar="S",
    help="Seconds between SIGTERM and SIGKILL when stopping workers [default: 5; a server's "
    "profile gives its own].",
)
@click.option(
    "--fabric-grace",
    type=bounded("fabric_grace"),
    default=20.0,
    show_default=True,
    metavar="S",
    help="Extra seconds for a rank still bringing up the fabric when the job stops (killed then, "
    "its links stay wedged).",
)
@click.option(
    "--op-timeout",
    type=bounded("op_timeout"),
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
    type=bounded("node_rank"),
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
    type=bounded("heartbeat_timeout"),
    default=5.0,
    show_default=True,
    metavar="S",
    help="A host silent this long is gone: every other host stops.",
)
@click.option(
    "--rdzv-timeout",
    type=bounded("rdzv_timeout"),
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
    type=bounded("health_interval"),
    metavar="S",
    help="After a server is ready, ask its health endpoint every S seconds; --health-failures in "
    "a row fail the job.",
)
@click.option(
    "--health-failures",
    type=bounded("health_failures"),
    default=3,
    show_default=True,
    metavar="K",
    help="Health checks that may fail in a row (with --health-interval).",
)
@click.option(
    "--probe-interval",
    type=bounded("probe_interval"),
    metavar="S",
    help="After a server is ready, ask it for a one-token generation every S seconds: no answer "
    "in --probe-timeout is a hang.",
)
@click.option(
    "--probe-timeout",
    type=bounded("probe_timeout"),
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
    type=bounded("ready_timeout"),
    metavar="S",
    help="Every rank must be ready within S seconds (its ready file, or --ready-pattern), or the "
    "job is treated as hung.",
)
@click.option(
    "--hang-timeout",
    type=bounded("hang_timeout"),
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
    type=bounded("train_timeout"),
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
    from ttmesh.launcher.api import launch
    from ttmesh.launcher.planning.options import LaunchOptions

    argv = (click.get_current_context().find_root().obj or {}).get("argv", sys.argv[1:])
    result = launch(LaunchOptions(**options, argv=tuple(argv)), _Console(options["no_live"]))
    if result.plan is not None:  # a dry run: its plan, as JSON or as text
        _show(result.plan, options["as_json"])
    return result.code


torchrun.adopt(launch_cmd)


class _Console:
    """What ``ttmesh launch`` shows while its job runs (``launcher.modes.View``): on a terminal
    the live views (``cli.live``, ``cli.fleetview``) unless --no-live, CI or a dumb terminal;
    plain prefixed lines otherwise."""

    def __init__(self, no_live: bool) -> None:
        self.no_live = no_live

    def started(self) -> None:
        from ttmesh.cli import streams

        streams.job_code = True  # from here the job's code is the exit code, whatever is lost

    @contextlib.contextmanager
    def job(self, plan: LaunchPlan) -> Iterator[Observer | None]:
        from ttmesh.cli.streams import live_enabled

        if not live_enabled(sys.stdout, self.no_live):
            yield None
            return
        from ttmesh.cli.live import JobView

        with JobView(plan) as view:
            yield view

    @contextlib.contextmanager
    def fleet(self, job: str) -> Iterator[Watcher | None]:
        from ttmesh.cli.streams import live_enabled

        if not live_enabled(sys.stdout, self.no_live):
            yield None  # the replicas' lines, plain
            return
        from ttmesh.cli.fleetview import FleetView

        with FleetView(job) as view:
            yield view


def _show(plan: Mapping[str, Any], as_json: bool) -> None:
    """A dry run's plan (a job's ttmesh.plan/1, a fleet's ttmesh.fleet-plan/1)."""
    from ttmesh.render import emit_json

    if as_json:
        emit_json(dict(plan))
        return
    from ttmesh.cli.views import fleet_text, plan_text

    fleet = str(plan.get("schema", "")).startswith("ttmesh.fleet-plan/")
    click.echo(fleet_text(dict(plan)) if fleet else plan_text(dict(plan)))
