"""``ttmesh launch``: one worker per chip, supervised."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click

from ttmesh import __version__, numeric
from ttmesh.cli import torchrun
from ttmesh.cli.launch_args import LaunchCommand
from ttmesh.cli.options import CONTEXT, host_options, seconds, shape, whole
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.render import plural
from ttmesh.vocab import LAYOUTS, MPI_LAYOUTS, Layout, StartMode

LAUNCH_CONTEXT = {**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False}


def _ranks(value: str | None) -> set[int] | None:
    if value is None:
        return None
    try:
        ranks = {int(v) for v in value.split(",") if v.strip()}
    except ValueError:
        ranks = set()
    if not ranks:
        raise bad_input(
            f"--ranks-filter {value!r}: expected rank numbers", "e.g. --ranks-filter 0,2"
        )
    return ranks


def _workdir(value: str | None) -> str:
    """--workdir: an existing directory (never created: a typo must not start a job elsewhere)."""
    if value is None:
        return ""
    if not value.strip():
        raise bad_input("--workdir '': no directory named", "omit it to run in this directory")
    path = os.path.abspath(value)
    if not os.path.exists(path):
        raise bad_input(f"--workdir {value}: no such directory", "create it first, or fix the path")
    if not os.path.isdir(path):
        raise bad_input(f"--workdir {value} is a file, not a directory", "give a directory")
    if not os.access(path, os.X_OK):
        raise bad_input(f"--workdir {value}: permission denied", "give a directory you can enter")
    return path


def _log_dir(value: str | None) -> str | None:
    """--log-dir: a file or an unwritable place is bad input. Only checked here: the launch
    makes it, and the job's directory in it (launcher.attempt.logspec.make_run_dir)."""
    if value is None:
        return None
    from ttmesh import paths

    return str(paths.writable_dir(value, "--log-dir", "the rank logs"))


def _log_spec(redirects: str | None, tee: str | None) -> Any:
    """torchrun's --redirects, --tee and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, checked."""
    from ttmesh.launcher.attempt import logspec

    return logspec.LogSpec(
        redirects=logspec.parse_std(redirects, "--redirects"),
        tee=logspec.parse_std(tee, "--tee"),
        template=os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or None,  # as torchrun
    )


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
@click.option("--quiet", "-q", is_flag=True, help="No worker output on the console.")
@click.option(
    "--no-live",
    is_flag=True,
    help="On a terminal, print the ranks' prefixed lines only, without the live table of ranks "
    "and phases (as in a pipe, or with CI set).",
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
    help="Where the hosts meet: node 0's address (port 29400 by default). Under Slurm: the first "
    "host of SLURM_JOB_NODELIST (its NodeAddr when its name does not resolve).",
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
    help="A secret every host of the job shares: what an agent publishes is signed with it and "
    "what is not is ignored. Env: TTMESH_RDZV_TOKEN.",
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
    "matching --ready-pattern), or the job is treated as hung: stopped, recovered, restarted.",
)
@click.option(
    "--ready-pattern",
    metavar="REGEX",
    help="A line of output that means a rank is ready (RE2 syntax: no backreferences or "
    "lookaround; matched in linear time).",
)
@click.option("--tt-smi", "tt_smi", metavar="PATH", help="The tt-smi to recover chips with.")
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
def launch_cmd(
    host: Any,
    command: tuple[str, ...],
    tp_size: int | None,
    nproc: int | None,
    chips: str | None,
    exclude: str | None,
    mesh_shape: str | None,
    mesh_layout: str | None,
    symmetric_dram_mb: int,
    env_items: tuple[str, ...],
    master_port: int,
    max_restarts: int,
    grace: float,
    ranks_filter: str | None,
    log_dir: str | None,
    redirects: str | None,
    tee: str | None,
    quiet: bool,
    no_live: bool,
    module: bool,
    no_python: bool,
    strict_links: bool,
    job_id: str | None,
    dry_run: bool,
    as_json: bool,
    show_env: bool,
    summary_json: str | None,
    launcher: str | None,
    workdir: str | None,
    rank_binding: str | None,
    rank_bindings_mapping: str | None,
    auto_reset: bool,
    reset_on_failure: bool,
    ready_timeout: float | None,
    ready_pattern: str | None,
    tt_smi: str | None,
    profile_name: str | None,
    strict: bool,
    health_interval: float | None,
    health_failures: int,
    nnodes: str | None,
    node_rank: int | None,
    rdzv_endpoint: str | None,
    rdzv_backend: str | None,
    rdzv_token: str | None,
    local_addr: str | None,
    heartbeat_timeout: float,
    rdzv_timeout: float,
    hosts: str | None,
    launch_agent: str | None,
    tcp_interface: str | None,
    torchrun_flags: torchrun.Flags,
) -> int:
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
    """
    from ttmesh import paths
    from ttmesh.cli import ttrun_files
    from ttmesh.launcher.attempt.guardian import Options
    from ttmesh.launcher.job.preflight import dry_run_checks
    from ttmesh.launcher.job.recovery import Recovery
    from ttmesh.launcher.job.run import execute
    from ttmesh.launcher.job.summary import write_refusal
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest, parse_env
    from ttmesh.runtime import jobs

    jobs.history()  # read when the job ends: a bad setting stops the launch now, not then
    rank_binding = ttrun_files.binding_flag(rank_binding, rank_bindings_mapping)
    tt_metal_world = (mesh_layout in MPI_LAYOUTS) or rank_binding is not None
    if hosts is not None and tt_metal_world:
        from ttmesh.launcher.hosts import meshhosts

        mesh_hosts = meshhosts.setup(meshhosts.parse_hosts(hosts), agent=launch_agent,
                                     tcp_interface=tcp_interface)  # fmt: skip
        hosts = None
    else:
        mesh_hosts = None
        for flag, value in (("--launch-agent", launch_agent), ("--tcp-interface", tcp_interface)):
            if value is not None:
                raise bad_input(
                    f"{flag} goes with --hosts and a tt-metal mesh",
                    "add --mesh-layout mesh (or drop it)",
                )
    multi = _multihost(
        nnodes, node_rank, rdzv_endpoint, rdzv_token, local_addr, heartbeat_timeout, rdzv_timeout,
        hosts, job_id,
    )  # fmt: skip
    if hosts is not None:
        from ttmesh.launcher.hosts import agents
        from ttmesh.launcher.planning import tpsize

        if tp_size is not None and multi is not None:  # each host would refuse it: say it once
            tpsize.per_host(tp_size, multi[0].nnodes)
        argv = (click.get_current_context().find_root().obj or {}).get("argv", sys.argv[1:])
        return agents.start(hosts, multi, argv, dry_run=dry_run)
    rdzv_job = ""
    if multi is not None:
        # The job's id is shared by every host; this host's part of it (its run directory,
        # leases and `ttmesh ps` record) is named per node, so two agents on one machine
        # (a split Galaxy, a test) never meet in one run directory.
        rdzv_job = paths.safe_name(multi[1], "--job-id")
        job_id = f"{rdzv_job[:56]}-n{multi[0].node_rank}"
    if rank_binding is not None and mesh_layout is not None:
        raise bad_input(
            "--rank-binding and --mesh-layout together",
            "the rank-binding file decides the layout: drop --mesh-layout",
        )
    mesh_layout = mesh_layout or Layout.ISOLATED
    workdir = _workdir(workdir)
    log_dir = _log_dir(log_dir)
    logs = _log_spec(redirects, tee)
    if summary_json is not None:
        from ttmesh import paths

        paths.writable_file(summary_json, "--summary-json")
    if tt_smi is not None:
        from ttmesh.recovery.reset import find_tt_smi

        find_tt_smi(host, tt_smi)  # not an executable: say so now, not after a crash
    env = parse_env(list(env_items))
    binding = None
    if rank_binding is not None:
        binding = ttrun_files.load(rank_binding, rank_bindings_mapping)
    server = _server(command, module, profile_name, tp_size, rank_binding, mesh_layout, nproc)
    if server is not None and server[0].chipless and multi is not None:
        raise bad_input(
            f"a job over {multi[0].nnodes} hosts (--nnodes, or Slurm's SLURM_NNODES): "
            f"{server[0].name} drives no Tenstorrent chip, and ttmesh runs it on one host",
            "give --nnodes 1 (the server's own --nnodes, after the command, spans hosts)",
        )
    job_tp, tp_size, tp_hosts = _tp_over_hosts(tp_size, server, multi)
    if health_interval is not None and server is None:
        raise bad_input("--health-interval goes with a server", "see ttmesh profiles")
    if grace is None:
        grace = server[0].grace if server is not None else 5.0
    if as_json and not dry_run:
        raise bad_input("--json goes with --dry-run", "the job's own output is not JSON")
    request = LaunchRequest(
        command=list(command),
        tp_size=tp_size,  # type: ignore[arg-type]
        module=module,
        no_python=no_python,
        layout=mesh_layout,
        mesh_shape=shape(mesh_shape),
        symmetric_dram_mb=symmetric_dram_mb,
        env=env,
        master_port=master_port,
        max_restarts=max_restarts,
        grace=grace,
        job=paths.safe_name(job_id, "--job-id") if job_id is not None else "",
        strict_links=strict_links,
        nproc=nproc,
        launcher=launcher
        or (
            StartMode.MPI if mesh_layout in MPI_LAYOUTS or binding is not None else StartMode.DIRECT
        ),
        workdir=workdir,
        binding=binding,
        environ=dict(os.environ),
        master_addr=torchrun_flags.master_addr or "127.0.0.1",
        ready_timeout=ready_timeout,
        ready_pattern=ready_pattern,
        profile=server[0] if server else None,
        server_args=server[1] if server else None,
        server_findings=server[3] if server else [],
        strict=strict,
        health_interval=health_interval,
        health_failures=health_failures,
        tp_hosts=tp_hosts,
    )
    if ready_pattern is not None:
        from ttmesh.patterns import PatternError, compile_pattern

        try:
            compile_pattern(ready_pattern)  # matched in linear time by the guardian
        except PatternError as exc:
            shown = ready_pattern if len(ready_pattern) <= 80 else ready_pattern[:77] + "..."
            # As the user would type it again (the shell's quoting), unless it holds what a
            # terminal must not be sent as it is.
            quoted = shlex.quote(shown) if shown.isprintable() else repr(shown)
            raise bad_input(f"--ready-pattern {quoted}: {exc}", exc.hint)
    shown_ranks = _ranks(ranks_filter)
    options = Options(ranks_filter=shown_ranks, quiet=quiet, logs=logs)
    try:
        if mesh_hosts is not None:
            from ttmesh.launcher.hosts import meshhosts

            if chips or exclude:
                raise bad_input("--chips/--exclude name one host's chips", "drop them with --hosts")
            request.mpirun = mesh_hosts.mpirun
            prepared = meshhosts.prepare(request, mesh_hosts)
        else:
            from ttmesh.launcher.planning import tpsize

            try:
                prepared = prepare(
                    request, host, chips, exclude, repairable=auto_reset,
                    defer_liveness=not dry_run and multi is None, dry_run=dry_run,
                )  # fmt: skip
            except TTMeshError as exc:
                raise tpsize.over_hosts(exc, job_tp, tp_hosts, tp_size) from None
            if job_tp is not None and tp_hosts > 1:
                prepared.plan.notes.append(tpsize.note(job_tp, tp_hosts))
        if prepared.plan.chipless:  # no chip to recover (chipless refuses the rest)
            for flag, given in (("--reset-on-failure", reset_on_failure), ("--tt-smi", tt_smi)):
                if given:
                    raise bad_input(f"{flag}: {prepared.plan.serving.chipless_what}", "drop it")
        if shown_ranks is not None:
            world = len(prepared.plan.ranks)
            extra = sorted(r for r in shown_ranks if not 0 <= r < world)
            if extra:
                err = bad_input(
                    f"--ranks-filter {ranks_filter}: no rank {', '.join(map(str, extra))} "
                    f"in a job of {plural(world, 'rank')}",
                    f"ranks are 0..{world - 1}",
                )
                raise prepared.liveness.first(err) if prepared.liveness else err
        if dry_run:  # every check the launch runs before its start, or why it is skipped
            dry_run_checks(prepared, auto_reset, rendezvous=multi is not None)
        torchrun.apply_plan(prepared.plan, torchrun_flags, host)
    except TTMeshError as exc:
        if summary_json and not dry_run:
            write_refusal(summary_json, exc)
        raise
    serving = prepared.plan.serving
    if serving is not None:
        from ttmesh.render import note

        note(f"{serving.profile.name}: {serving.profile.title}")
        for n in serving.notes + ([serving.budget_note] if serving.budget_note else []):
            note(f"note: {n}")
        for f in serving.findings:
            note(f"{f.severity}: {f.message} (fix: {f.fix})")
    if dry_run:
        from ttmesh.render import emit_json

        data = prepared.plan.to_json(show_env)
        if as_json:
            emit_json(data)
        else:
            from ttmesh.cli.views import plan_text

            click.echo(plan_text(data))
        return 0
    recovery = Recovery(auto_reset=auto_reset, reset_on_failure=reset_on_failure, tt_smi=tt_smi)
    peers = None
    if multi is not None:
        from ttmesh.launcher.hosts.multihost import Peers

        multi[0].tp_size = job_tp or 0
        peers = Peers(multi[0], rdzv_job)
        try:
            prepared.plan = peers.join(prepared.plan)
            torchrun.apply_plan(prepared.plan, torchrun_flags, host)
        except BaseException:
            peers.coord.close()
            raise
    if log_dir is not None or logs.files_wanted:
        from ttmesh.launcher.attempt import logspec
        from ttmesh.render import note

        where = logspec.make_run_dir(logs, log_dir, prepared.plan.job)
        note(f"the ranks' logs: {where}/attempt_N/<local rank>/stdout.log, stderr.log")
    from ttmesh.cli import streams
    from ttmesh.cli.live import JobView, enabled

    streams.job_code = True  # from here the job's code is the exit code, whatever is lost
    if not enabled(sys.stdout, no_live):
        return execute(prepared, options, summary_json, recovery=recovery, peers=peers)
    with JobView(prepared.plan) as view:
        options.observer = view
        return execute(prepared, options, summary_json, recovery=recovery, peers=peers)


torchrun.adopt(launch_cmd)


def _tp_over_hosts(
    tp_size: int | None, server: tuple[Any, Any, int | None, list[Any]] | None, multi: Any
) -> tuple[int | None, int | None, int]:
    """(the job's --tp-size, this host's share of it, the hosts sharing it). --tp-size is the
    tensor-parallel degree over every host of the job (a server's own --tp-size too); a
    server's --nnodes and --node-rank must be the job's (its findings, errors)."""
    from ttmesh.launcher.planning import tpsize

    hosts = multi[0].nnodes if multi is not None else 1
    flag = write = "--tp-size"
    if server is not None:
        profile, parsed, tp, findings = server
        node = multi[0].node_rank if multi is not None else 0
        findings.extend(tpsize.server_hosts(profile, parsed, hosts, node))
        if tp_size is None and profile.tp_flag:
            flag = write = f"the server's {profile.tp_flag}"
            if parsed.value(profile.tp_flag) is None:
                flag = f"the server's default {profile.tp_flag}"
        tp_size = tp
    if tp_size is None or hosts <= 1:
        return tp_size, tp_size, 1
    return tp_size, tpsize.per_host(tp_size, hosts, flag, write), hosts


def _server(
    command: tuple[str, ...],
    module: bool,
    profile_name: str | None,
    tp_size: int | None,
    rank_binding: str | None,
    mesh_layout: str,
    nproc: int | None,
) -> tuple[Any, Any, int | None, list[Any]] | None:
    """(profile, server args, chips, findings) when COMMAND is a server a profile knows."""
    from ttmesh.launcher.serving import args, profiles

    if profile_name == "none":
        return None
    parsed = args.parse(list(command), module)
    profile = (
        profiles.named(profile_name)
        if profile_name
        else profiles.recognise(parsed, dict(os.environ))
    )
    if profile is None:
        return None
    for flag, value in (("--rank-binding", rank_binding), ("--nproc-per-node", nproc)):
        if value is not None:
            raise bad_input(
                f"{flag} with a server ({profile.name} starts its own processes)",
                f"drop {flag}, or run it as any command with --profile none",
            )
    if mesh_layout != Layout.ISOLATED:
        raise bad_input(
            f"--mesh-layout with a server ({profile.name} drives every chip from one process)",
            "drop --mesh-layout",
        )
    parsed = profile.read(parsed, os.getcwd())  # as the server's own parser reads it
    if profile.chipless:  # its --tp-size is its own processes; ttmesh's is refused (no chips)
        return profile, parsed, tp_size, []
    from ttmesh.launcher.serving import spec

    tp, findings = spec.server_tp(profile, parsed, tp_size)
    if tp is None and profile.tp_flag:
        tp = 1  # the server's own default: one chip
    return profile, parsed, tp, findings


def _multihost(
    nnodes: str | None,
    node_rank: int | None,
    endpoint: str | None,
    token: str | None,
    local_addr: str | None,
    heartbeat_timeout: float,
    rdzv_timeout: float,
    hosts: str | None,
    job_id: str | None,
) -> tuple[Any, str] | None:
    """(how this agent joins, the job's id) for a job over several hosts; None for one host.

    torchrun's flags win over Slurm's environment (SLURM_NNODES, SLURM_NODEID, the first host
    of SLURM_JOB_NODELIST, at its NodeAddr when DNS does not know its name) and over mpirun's
    (OMPI_COMM_WORLD_RANK, when --hosts started us)."""
    from ttmesh.launcher.hosts import slurm

    env = os.environ
    count = _nnodes(nnodes)
    if hosts is not None:
        names = [h.strip() for h in hosts.split(",") if h.strip()]
        if len(names) < 2 or len(set(names)) != len(names):
            raise bad_input(
                f"--hosts {hosts!r}: name two or more different hosts", "e.g. --hosts node0,node1"
            )
        if count not in (None, len(names)):
            raise bad_input(
                f"--nnodes {count} but --hosts names {len(names)} hosts", "drop --nnodes"
            )
        count, endpoint = len(names), endpoint or names[0]
    in_slurm = "SLURM_JOB_NODELIST" in env and "SLURM_NODEID" in env and "SLURM_STEP_ID" in env
    hosts_of = "--nnodes"
    if count is None and in_slurm:
        slurm_count = _env_whole("SLURM_NNODES", "1", low=1)
        if slurm_count > 1:
            count, hosts_of = slurm_count, "SLURM_NNODES"
    if count is None or count == 1:
        for flag, value in (("--node-rank", node_rank), ("--rdzv-endpoint", endpoint)):
            if value is not None and count is None:
                raise bad_input(f"{flag} goes with --nnodes N (a job over N hosts)", "add --nnodes")
        return None
    rank_of = "--node-rank"
    if node_rank is None and "OMPI_COMM_WORLD_RANK" in env and env.get("TTMESH_AGENT") == "1":
        node_rank, rank_of = _env_whole("OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_RANK"
    if node_rank is None and in_slurm:
        node_rank, rank_of = _env_whole("SLURM_NODEID"), "SLURM_NODEID"
    if node_rank is not None and not node_rank < count:
        raise bad_input(
            f"{rank_of} {node_rank}: must be 0..{count - 1} for {hosts_of} {count}",
            "give each host its own node rank",
        )
    if endpoint is None and in_slurm:
        endpoint = slurm.address(slurm.expand(env["SLURM_JOB_NODELIST"])[0])
    if node_rank is None and hosts is None:
        raise bad_input(
            f"--nnodes {count}: which host is this?", "give --node-rank 0..N-1 on each host"
        )
    if endpoint is None:
        raise bad_input(
            f"--nnodes {count}: where do the hosts meet?",
            "give --rdzv-endpoint HOST:PORT (node 0's address)",
        )
    from ttmesh.launcher.hosts import multihost, rendezvous

    point = rendezvous.parse_endpoint(endpoint)
    if job_id is None:  # every host must name the job alike: derive it from where they meet
        job_id = (
            env.get("SLURM_JOB_ID") and f"slurm-{env['SLURM_JOB_ID']}"
        ) or f"rdzv-{point.host}-{point.port}"
        job_id = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in job_id)
        job_id = job_id.lstrip("-.")[:64]
    mh = multihost.MultiHost(
        nnodes=count,
        node_rank=node_rank if node_rank is not None else 0,
        endpoint=point,
        token=rendezvous.token_of(token),
        local_addr=local_addr,
        join_timeout=rdzv_timeout,
        heartbeat_timeout=heartbeat_timeout,
    )
    multihost.check(mh) if hosts is None else None
    return mh, job_id


def _env_whole(name: str, default: str | None = None, low: int = 0) -> int:
    """A number ttmesh reads from the environment (Slurm's, mpirun's), named as the variable:
    ``SLURM_NNODES=abc`` is one line, not an internal error."""
    return numeric.whole(os.environ.get(name, default), name, low=low, high=numeric.MAX_CHIPS)


def _nnodes(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if ":" in text:
        low, _, high = text.partition(":")
        if low != high:
            raise bad_input(
                f"--nnodes {value}: ttmesh runs a fixed number of hosts (no elastic MIN:MAX)",
                f"e.g. --nnodes {high or low}",
            )
        text = low
    return numeric.whole(
        text, "--nnodes", low=1, high=numeric.MAX_CHIPS, unit="hosts", example="--nnodes 2"
    )
