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

from ttmesh import numeric
from ttmesh.cli import torchrun
from ttmesh.cli.launch_args import LaunchCommand
from ttmesh.cli.options import CONTEXT, host_options, seconds, whole
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
    type=whole(low=1, high=numeric.MAX_CHIPS, unit="chips", example="4"),
    metavar="N",
    help="Chips of the job (the tensor-parallel degree, over every host of a job on several); "
    "one worker per chip (per board on n300 systems). Default: every chip of the host.",
)
@click.option(
    "--replicas",
    type=whole(low=1, high=numeric.MAX_CHIPS, unit="replicas", example="2"),
    metavar="N",
    help="A serving fleet: N copies of the server, each on its own --tp-size chips (N x T in "
    "all, placed on disjoint connected sub-meshes, whole reset units each), on a free loopback "
    "port of its own, behind SGLang's router at the server's --host:--port (pip install "
    "'ttmesh[router]'). One replica that fails is taken out of the router, its chips alone "
    "checked and reset, and restarted (--max-restarts each) while the others serve. 1: one "
    "server, as without it. vLLM is refused (it assigns chips to its own data-parallel ranks).",
)
@click.option(
    "--replicas-parallel",
    is_flag=True,
    help="With --replicas: start every replica at once (default: each after the previous is "
    "ready, or after 120 s, as a first start compiles for minutes and takes host memory).",
)
@click.option(
    "--router-arg",
    "router_args",
    multiple=True,
    metavar="ARG",
    help="With --replicas: pass ARG to the router (repeatable; e.g. --router-arg=--policy "
    "--router-arg=round_robin, --router-arg=--prometheus-port=29001), after the profile's "
    "router.args, read by the router's own parser before anything starts; its --host, --port "
    "and --worker-urls are ttmesh's, and a flag whose value is a secret (--api-key, ...) is "
    "refused: ttmesh closes the router's admin routes with a key of its own, in no command "
    "line. Its policy and health checks are SGLang's defaults otherwise; its Prometheus "
    "metrics listen on 127.0.0.1 and a free port unless given.",
)
@click.option(
    "--no-memory-check",
    "no_memory_check",
    is_flag=True,
    help="With --replicas: start even when the host memory the replicas need at their peak "
    "(the model's weight files on disk times the profile's host_memory factors) is more than "
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
    help="Workers on this host (torchrun's flag; each host's, over several). Default: one per "
    "chip (per board on n300 "
    "systems); fewer, each driving a block of chips, with --mesh-layout mesh or multi-mesh "
    "(alone, it splits the host's whole mesh).",
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
    help="isolated (the default): each worker its own chip and one-chip descriptor; "
    "single-process: one worker drives every chip; mesh/multi-mesh: one tt-metal world (needs MPI).",
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
    "profile gives its own, e.g. 30 for SGLang].",
)
@click.option(
    "--fabric-grace",
    type=seconds(example="20"),
    default=20.0,
    show_default=True,
    metavar="S",
    help="A rank still bringing up the fabric when the job stops (it printed tt-metal's "
    "'Initializing Fabric' and has not marked the fabric open: TTMESH_FABRIC_FILE, or "
    "tt-metal's 'Devices initialized') gets up to S seconds beyond --grace to finish or abort "
    "before SIGKILL: killed mid bring-up, Ethernet cores stay wedged ('Fabric Router Sync: "
    "Timeout' in the next job). 0: no extra wait.",
)
@click.option(
    "--op-timeout",
    type=seconds(zero=False, example="60"),
    metavar="S",
    help="Set TT_METAL_OPERATION_TIMEOUT_SECONDS=S for the ranks: a dispatch operation that "
    "takes longer raises in the rank instead of hanging. It bounds dispatch operations, not "
    "opening the mesh (the fabric's bring-up); see --ready-timeout for that. Default: off.",
)
@click.option(
    "--on-reset-notice",
    type=click.Choice(["stop", "pass"]),
    default="stop",
    show_default=True,
    help="When another tool announces a reset of the job's chips (tt-umd's reset notice, as "
    "tt-smi -r sends): stop every rank at once, or pass (the ranks get tt-umd's notice "
    "themselves: a tt-umd client that pauses and resumes; ttmesh only says who reset).",
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
    help="Write each rank's stdout and stderr to files, as torchrun lays them out: "
    "DIR/<job>_<random>/attempt_N/<local rank>/stdout.log and stderr.log (ttmesh names the "
    "directory when the job starts).",
)
@click.option(
    "-r",
    "--redirects",
    metavar="0-3|R:S,...",
    help="torchrun's: these streams go to the log files only, not the console: 1 stdout, 2 "
    "stderr, 3 both, 0 none; or per local rank (0:1,1:2). Without --log-dir the files go to a "
    "new torchelastic_* directory under $TMPDIR.",
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
    help="Keep no copy of the ranks' output with the job's record (ttmesh logs JOB then has "
    "none). By default every stream is kept, bounded: TTMESH_JOB_LOG_MB per job (64), "
    "TTMESH_LOGS_MB for every job's together (256).",
)
@click.option("--quiet", "-q", is_flag=True, help="No worker output on the console.")
@click.option(
    "--no-live",
    is_flag=True,
    help="On a terminal, print the ranks' prefixed lines only, without the live table of ranks "
    "and phases, or of a fleet's replicas and router (as in a pipe, or with CI set).",
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
    help="Hosts in the job (torchrun's flag): one ttmesh agent per host, joined through torch's "
    "c10d rendezvous at --rdzv-endpoint. Under Slurm: SLURM_NNODES.",
)
@click.option(
    "--node-rank",
    "--node_rank",
    "node_rank",
    type=whole(low=0, high=numeric.MAX_CHIPS),
    metavar="R",
    help="This host's place, 0..N-1 (node 0 hosts the rendezvous). Under Slurm: SLURM_NODEID; "
    "started by --hosts: mpirun's rank.",
)
@click.option(
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "rdzv_endpoint",
    metavar="HOST[:PORT]",
    help="Where the hosts meet: node 0's address (port 29400 by default; an IPv6 address in "
    "brackets: [fd00::1]:29400). Under Slurm: the first host of SLURM_JOB_NODELIST (its NodeAddr "
    "when its name does not resolve).",
)
@click.option(
    "--rdzv-backend",
    "--rdzv_backend",
    "rdzv_backend",
    type=click.Choice(["c10d", "static"]),
    help="The rendezvous engine: ttmesh's own over torch's c10d store (torchrun's static, with "
    "--master-addr, is taken as the same).",
)
@click.option(
    "--rdzv-token",
    metavar="TOKEN",
    envvar="TTMESH_RDZV_TOKEN",
    help="A secret every host of the job shares: what an agent publishes is signed with it, for "
    "this job and this run; what is not is ignored. Env: TTMESH_RDZV_TOKEN.",
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
    help="A job over these hosts, started with mpirun (ttmesh itself opens no connection to "
    "them): torch-style, one agent per host (--map-by ppr:1:node); with --mesh-layout mesh or "
    "multi-mesh (or --rank-binding), one tt-metal mesh over the hosts in one MPMD mpirun. "
    "--tp-size counts every host's chips, --nproc-per-node one host's processes.",
)
@click.option(
    "--launch-agent",
    metavar="CMD",
    help="With --hosts: how mpirun reaches the hosts instead of ssh (Open MPI 4 plm_rsh_agent, "
    "5 plm_ssh_agent).",
)
@click.option(
    "--tcp-interface",
    metavar="IF",
    help="With --hosts and a tt-metal mesh: MPI's TCP traffic on this interface (tt-run's "
    "--tcp-interface; default: every interface but docker0 and lo).",
)
@click.option(
    "--profile",
    "profile_name",
    metavar="NAME",
    help="The serving stack COMMAND runs (default: recognised from the command; `none` treats "
    "a server like any command). See `ttmesh profiles`.",
)
@click.option(
    "--strict", is_flag=True, help="A server's rule warnings are errors (nothing starts)."
)
@click.option(
    "--health-interval",
    type=seconds(zero=False, example="10"),
    metavar="S",
    help="After a server is ready, ask its health endpoint every S seconds; --health-failures "
    "failures in a row fail the job.",
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
    help="After a server is ready, ask it for a one-token generation every S seconds (its "
    "profile's probe): no answer within --probe-timeout is a hung server, even while its "
    "/health answers: its stacks are dumped, it is stopped, recovered and restarted if allowed.",
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
    help="How ranks start: direct (one process each, the default) or mpi (one MPMD mpirun, the "
    "default for --mesh-layout mesh/multi-mesh: tt-metal worlds form through MPI).",
)
@click.option(
    "--auto-reset",
    is_flag=True,
    help="When pre-flight finds the chips unhealthy (links down, a hung chip), recover them with "
    "tt-smi -r, verify, then start.",
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
    help="Every rank must be ready within S seconds (it creates TTMESH_READY_FILE, or prints a line "
    "matching --ready-pattern), or the job is treated as hung: every rank's Python stacks are "
    "dumped (py-spy), then it is stopped, recovered, restarted.",
)
@click.option(
    "--hang-timeout",
    type=seconds(zero=False, example="900"),
    metavar="S",
    help="A job whose ranks print nothing for S seconds is treated as hung: every rank's "
    "Python stacks are dumped (py-spy), then it is stopped, recovered, restarted (exit 124 "
    "when out of restarts). Default: off.",
)
@click.option(
    "--ready-pattern",
    metavar="REGEX",
    help="A line of output that means a rank is ready (RE2 syntax: no backreferences or "
    "lookaround; matched in linear time).",
)
@click.option("--tt-smi", "tt_smi", metavar="PATH", help="The tt-smi to recover chips with.")
@click.option(
    "--train-timeout",
    "train_timeout",
    type=seconds(example="60"),
    metavar="S",
    help="When ttmesh resets the job's chips (--auto-reset, after a crash), wait up to S "
    "seconds for their links to train, and over several hosts for the cables between them "
    "(default: the boards' bound: 60 s for links within a host, 180 s for Wormhole's cables "
    "between hosts; a reset that worked returns as soon as they are up). A cable still down "
    "then is named and the job is not restarted.",
)
@click.option(
    "--rank-binding",
    metavar="FILE.yaml",
    help="Run a tt-run rank-binding file: its ranks, chips (TT_VISIBLE_DEVICES), mesh ids and "
    "descriptor, under mpirun, with ttmesh's environment and supervision added. Its global_env "
    "and env_overrides may not set what --env may not (RANK, MASTER_PORT, TTMESH_*, ...). "
    "Ranks run in this directory, PYTHONPATH defaulting to it, as tt-run runs them.",
)
@click.option(
    "--rank-bindings-mapping",
    metavar="FILE.yaml",
    help="tt-run's sub-contexts: a map (subcontext_id_to_rank_bindings) of sub-context id to "
    "rank-binding file, merged into one job in id order, each rank with its file's descriptor "
    "and TT_RUN_SUBCONTEXT_ID (and _SIZE, _COUNT, _SIZES).",
)
@click.option(
    "--workdir",
    metavar="DIR",
    help="Ranks' working directory. Default: yours; under --launcher mpi a directory of the job's "
    "own (tt-metal writes generated/ there), with TTMESH_ORIGINAL_CWD set, except for a "
    "rank-binding job (yours, as tt-run); '.' keeps yours.",
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
    help="Print the plan (and the chips passed over, and why), run the checks a launch runs "
    "before its start (pre-flight; refused alike, exit 3), and start nothing.",
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
    help="Write the outcome {source, rank, code, reason} to FILE. If FILE cannot be written "
    "ttmesh says so, and a job that succeeded exits 2.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[--] COMMAND [ARGS]...")
def launch_cmd(**options: Any) -> int:
    """Run COMMAND once per chip, supervised: the torchrun contract plus chips and fabric.

    \b
    Each rank gets RANK, WORLD_SIZE, MASTER_ADDR/PORT and the rest of torchrun's environment,
    its chip (TT_VISIBLE_DEVICES, by PCI address), a mesh graph descriptor
    (TT_MESH_GRAPH_DESC_PATH) and LIBTT_SYMMETRIC_DRAM_MB. The first rank to fail stops the
    job: every worker's process tree is stopped (SIGTERM, SIGKILL after --grace) and ttmesh
    exits with that rank's code.

    \b
    Output as torchrun's: each line of a rank is prefixed [rN] (or as
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE says, e.g. '[rank${rank}]: ', with ${rank},
    ${local_rank} and ${role_name}); Python runs unbuffered, as torchrun's python -u
    (PYTHONUNBUFFERED=1 unless you set it), so prints arrive as they are made.

    \b
    A serving stack ttmesh knows (`ttmesh profiles`: SGLang-TorchTPU, SGLang-JAX, vLLM, SGLang)
    runs as its makers intend: one server process for every chip, its flag rules checked before
    anything starts, its port checked free, ready when its /health answers from the server's
    own processes, stopped with a bounded drain. The server's command is read as its own parser
    reads it (its whole flag table: the last of a repeated flag wins, prefixes, --flag=value);
    one it would refuse is refused with its complaint. --tp-size is read from the server's own
    flag when not given. Stock SGLang on --device cpu or cuda drives no Tenstorrent chip: nothing
    is chosen, leased or checked, and no driver is needed (its --tp-size is its own ranks).

    \b
    --replicas N runs a serving fleet: N copies of the server, each on --tp-size chips of its
    own (disjoint, whole boards), its own descriptor and a free loopback port, behind SGLang's
    router at the server's own --host:--port (pip install 'ttmesh[router]'). Each replica is a
    job of its own (FLEET-rK in ttmesh ps): one that fails is taken out of the router the
    moment its job says so, its chips alone checked and reset, restarted under --max-restarts
    and put back when its job says it is ready (what a job says reaches the fleet on a pipe
    of its own, never from its output), while the others serve. On a Galaxy one reset is the
    whole host (tt-smi -glx_reset): a replica whose chips need one makes the fleet take every
    replica out of the router, drain them within --grace, reset the host once (verified) and
    restart them all; that replica counts a restart, the others a drain. Ctrl-C stops the router,
    then every replica within --grace, then resets the links between replicas; a chip the host
    lost is named as not recovered (exit 1). If ttmesh is killed, the fleet's guard does the
    same in its place. The router's admin routes (/workers) take only ttmesh's own key, new at
    each router start and in no command line. vLLM is refused: it assigns chips to its own
    data-parallel ranks. The host memory the replicas need at their peak (their model's
    weight files on disk times the profile's host_memory factors) is checked against
    MemAvailable before anything starts (--no-memory-check skips it); the router's metrics
    get a free Prometheus port unless --router-arg gives one. On a terminal a live table of
    the replicas (job, chips, URL, state, restarts, last line) and the router (state, PID,
    restarts, metrics URL) stays under their [replicaK] lines.

    \b
    Pre-flight, before anything is leased or started, refuses (exit 3) chips that are held,
    leased, frozen or whose links are down, and a host tt-umd cannot run on: a driver older
    than 2.0.0, no 1 GiB hugepages on a chip's NUMA node (unless an IOMMU translates for it),
    or what the server's profile asks under system: (minimum firmware, hugepages per chip).
    Chips that run different firmware bundles are a warning, said once. With
    TTMESH_TTNN_PYTHON set to a Python with ttnn, it also asks tt-metal's own control plane
    (mock mode) whether it maps the ranks' exact mesh graph descriptor and cluster descriptor,
    while the rest of pre-flight runs; a refusal stops the launch before any rank starts (exit
    3). Without it that check is skipped, and --dry-run says so.

    \b
    On a terminal a live table of the ranks (chip, PID, state, uptime, restarts, last line)
    stays under their scrolling output, with the job's phases and their times (checking
    fabric, resetting, starting, ready or running, stopping, recovering). --no-live, a pipe
    or CI set in the environment give plain prefixed lines only.

    \b
    Examples:
      ttmesh launch --sim quietbox2 --tp-size 4 examples/allreduce.py
      ttmesh launch --sim quietbox2 -- python -m sglang.launch_server --model-path M --device tpu --tp-size 4 ...
      ttmesh launch --tp-size 2 --chips 0000:01:00.0,0000:03:00.0 -- python -m mypkg.serve
      ttmesh launch --sim quietbox2 --tp-size 4 --dry-run --json -- ./run.sh
      ttmesh launch --sim quietbox2 --replicas 2 --tp-size 2 -- python -m sglang.launch_server --model-path M --device tpu --tp-size 2 --host 0.0.0.0 --port 30000
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
        from ttmesh.cli.live import JobView, enabled

        if not enabled(sys.stdout, self.no_live):
            yield None
            return
        with JobView(plan) as view:
            yield view

    @contextlib.contextmanager
    def fleet(self, job: str) -> Iterator[Watcher | None]:
        from ttmesh.cli.live import enabled

        if not enabled(sys.stdout, self.no_live):
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
