"""``ttmesh launch``'s options, checked once and built into what the launch runs (torch's
``config_from_args`` -> ``LaunchConfig``): the job's mode (:class:`~ttmesh.vocab.JobMode`,
decided here and nowhere else, with every mix of flags no mode takes refused here), the
request (:class:`~ttmesh.launcher.planning.request.LaunchRequest`) and what the command does
around it (the console, the logs, recovery). The click command declares the options, calls
:meth:`Launch.from_options` and starts the job the way its mode says."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from ttmesh import addresses, numeric, paths
from ttmesh.dataclass import dataclass
from ttmesh.errors import bad_input
from ttmesh.launcher.planning.rankenv import OP_TIMEOUT_VAR
from ttmesh.launcher.planning.request import (
    DEFAULT_GRACE,
    LaunchRequest,
    Policy,
    parse_env,
    parse_shape,
)
from ttmesh.vocab import MPI_LAYOUTS, JobMode, Layout, StartMode

if TYPE_CHECKING:
    from ttmesh.host.base import Host
    from ttmesh.launcher.adapters.ttrun import BindingFile
    from ttmesh.launcher.nodes.rendezvous import Endpoint
    from ttmesh.launcher.planning.logspec import LogSpec
    from ttmesh.launcher.serving.args import ServerArgs
    from ttmesh.launcher.serving.profiles import Profile
    from ttmesh.launcher.serving.rules import Finding

    # (profile, the server's command line as its parser reads it, its chips, its findings)
    Server = tuple[Profile, ServerArgs, int | None, list[Finding]]


@dataclass(frozen=True)
class TorchrunFlags:
    """What the plan takes from torchrun's flags (``cli.torchrun`` resolves them): rank 0's
    address on one host, every rank's ROLE_NAME, LOCAL_RANK 0 in every rank, the NUMA binding
    (``node``: each rank on its chips' NUMA node's CPUs, ``planning.numa``)."""

    master_addr: str | None = None
    role: str | None = None
    virtual_local_rank: bool = False
    numa_binding: str | None = None


@dataclass(frozen=True, eq=False)
class LaunchOptions:
    """``ttmesh launch``'s options (named as the command's parameters; the defaults are the
    command's), read-only: what ``ttmesh.launch`` takes from Python too (docs/api.md).

    A ``ttmesh.dataclass`` (its methods made without compiling code: a launch imports this
    module) so that a program's keyword arguments are type-checked; nothing compares them."""

    host: Host
    command: tuple[str, ...]
    tp_size: int | None = None
    nproc: int | None = None
    chips: str | None = None
    exclude: str | None = None
    mesh_shape: str | None = None
    mesh_layout: str | None = None
    symmetric_dram_mb: int = 2048
    env_items: tuple[str, ...] = ()
    master_port: int = 0
    max_restarts: int = 0
    grace: float | None = None
    fabric_grace: float = 20.0
    op_timeout: float | None = None
    on_reset_notice: str = "stop"
    ranks_filter: str | None = None
    log_dir: str | None = None
    redirects: str | None = None
    tee: str | None = None
    quiet: bool = False
    no_live: bool = False
    module: bool = False
    no_python: bool = False
    strict_links: bool = False
    job_id: str | None = None
    dry_run: bool = False
    as_json: bool = False
    show_env: bool = False
    summary_json: str | None = None
    launcher: str | None = None
    workdir: str | None = None
    rank_binding: str | None = None
    rank_bindings_mapping: str | None = None
    auto_reset: bool = False
    reset_on_failure: bool = False
    train_timeout: float | None = None
    ready_timeout: float | None = None
    hang_timeout: float | None = None
    ready_pattern: str | None = None
    tt_smi: str | None = None
    profile_name: str | None = None
    strict: bool = False
    health_interval: float | None = None
    health_failures: int = 3
    probe_interval: float | None = None
    probe_timeout: float | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str | None = None
    rdzv_token: str | None = None
    local_addr: str | None = None
    heartbeat_timeout: float = 5.0
    rdzv_timeout: float = 300.0
    hosts: str | None = None
    launch_agent: str | None = None
    tcp_interface: str | None = None
    torchrun_flags: TorchrunFlags = TorchrunFlags()
    replicas: int | None = None  # --replicas: a serving fleet (launcher.fleet)
    replicas_parallel: bool = False
    router_args: tuple[str, ...] = ()
    no_memory_check: bool = False  # --replicas: do not check the host memory the replicas need
    fleet_of: str | None = None  # hidden: this job is one replica of that fleet
    events_fd: int | None = None  # hidden: the fleet's pipe for this replica's events
    no_logs: bool = False  # --no-logs: keep no copy of the output with the job's record
    # The ttmesh command line (its words after ``ttmesh``): --hosts' agents each run it again.
    argv: tuple[str, ...] = ()

    def replace(self, **changes: Any) -> LaunchOptions:
        """A copy with ``changes`` (as ``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Join:
    """How this host's agent joins a job over several hosts (torchrun's flags, Slurm's
    environment or mpirun's): ``nodes.multihost.MultiHost`` is made of it."""

    nnodes: int
    node_rank: int
    endpoint: Endpoint
    token: str
    local_addr: str | None
    join_timeout: float
    heartbeat_timeout: float
    job: str  # the job's id, every host's alike


@dataclass(frozen=True)
class Launch:
    """What ``ttmesh launch`` runs: built once from its options, never changed after."""

    mode: JobMode
    options: LaunchOptions
    request: LaunchRequest | None = None  # None: --hosts (each host's agent builds its own)
    join: Join | None = None  # a job over several hosts: how this host joins it
    job_tp: int | None = None  # the job's --tp-size over every host (request.tp_size: this one's)
    rdzv_job: str = ""  # the job's id every host shares (the request's job: this host's part)
    shown_ranks: frozenset[int] | None = None  # --ranks-filter
    logs: LogSpec | None = None
    log_dir: str | None = None

    @classmethod
    def from_options(cls, o: LaunchOptions) -> Launch:
        """Every option checked (one line, exit 2, before anything is read of the host), the
        mode decided, and the request built."""
        from ttmesh.runtime import jobs

        o = _typed(o)
        jobs.history()  # read when the job ends: a bad setting stops the launch now, not then
        rank_binding = binding_flag(o.rank_binding, o.rank_bindings_mapping)
        mode, join = job_mode(o, rank_binding)
        if mode is JobMode.HOSTS:
            assert join is not None
            if o.tp_size is not None:  # each host would refuse it: say it once
                from ttmesh.launcher.planning import tpsize

                tpsize.per_host(o.tp_size, join.nnodes)
            return cls(mode, o, join=join)
        job_id, rdzv_job = o.job_id, ""
        if join is not None:
            # The job's id is shared by every host; this host's part of it (its run directory,
            # leases and `ttmesh ps` record) is named per node, so two agents on one machine
            # (a split Galaxy, a test) never meet in one run directory.
            rdzv_job = paths.safe_name(join.job, "--job-id")
            job_id = f"{rdzv_job[:56]}-n{join.node_rank}"
        if rank_binding is not None and o.mesh_layout is not None:
            raise bad_input(
                "--rank-binding and --mesh-layout together",
                "the rank-binding file decides the layout: drop --mesh-layout",
            )
        workdir = _workdir(o.workdir)
        log_dir = _log_dir(o.log_dir)
        logs = _log_spec(o.redirects, o.tee)
        request, job_tp = _request(o, rank_binding, join, job_id, workdir)
        if o.events_fd is not None and o.fleet_of is None:
            raise bad_input(
                "--events-fd goes with --fleet-of: it is a replica's pipe to its fleet",
                "ttmesh's fleet (--replicas N) sets both; drop --events-fd",
            )
        if mode is JobMode.FLEET:
            from ttmesh.launcher.fleet import check

            check.request(o, request)
        elif o.replicas_parallel or o.router_args or o.no_memory_check:
            flag = (
                "--replicas-parallel" if o.replicas_parallel
                else "--router-arg" if o.router_args else "--no-memory-check"
            )  # fmt: skip
            raise bad_input(
                f"{flag} goes with --replicas N (N > 1)", f"add --replicas, or drop {flag}"
            )
        return cls(mode, o, request, join, job_tp, rdzv_job, _ranks(o.ranks_filter), logs, log_dir)


def _typed(o: LaunchOptions) -> LaunchOptions:
    """The options a program gave ``ttmesh.launch`` held to what the command's parser makes
    of its flags (the command's own pass unchanged): a host, words, flags that are bools, and
    every number in its range (``launcher.limits``), "4" read as 4; else one line (exit 2)."""
    from ttmesh.host.base import Host
    from ttmesh.launcher import limits

    if not isinstance(o.host, Host):
        raise bad_input(
            f"host {type(o.host).__name__}: not a host",
            "give ttmesh.open_host(root) ('/': this one)",
        )
    words: dict[str, tuple[str, ...]] = {}
    for name in ("command", "env_items", "router_args", "argv"):
        value = getattr(o, name)
        if isinstance(value, (str, bytes)) or not all(isinstance(w, str) for w in value):
            raise bad_input(f"{name}: {value!r:.60}: not a sequence of words",
                            f"give a tuple of strings, e.g. {name}=('a', 'b')")  # fmt: skip
        words[name] = tuple(value)
    for name, kind in LaunchOptions.__annotations__.items():
        if kind == "bool" and not isinstance(getattr(o, name), bool):
            raise bad_input(f"{name}: {getattr(o, name)!r:.60}: not True or False")
    flags = o.torchrun_flags
    if not isinstance(flags, TorchrunFlags):
        raise bad_input("torchrun_flags: not a TorchrunFlags", "give ttmesh.TorchrunFlags(...)")
    if flags.numa_binding not in (None, "node"):
        raise bad_input(f"--numa-binding {flags.numa_binding!r:.40}: ttmesh binds ranks by NUMA "
                        "node only", "use numa_binding='node', or None")  # fmt: skip
    numbers = limits.checked({name: getattr(o, name) for name in limits.NUMBERS})
    changed = {k: v for k, v in {**words, **numbers}.items() if getattr(o, k) is not v}
    return o.replace(**changed) if changed else o


def binding_flag(rank_binding: str | None, mapping: str | None) -> str | None:
    """The file that names the ranks (either flag's), refusing both at once."""
    if rank_binding is not None and mapping is not None:
        raise bad_input(
            "--rank-binding and --rank-bindings-mapping together",
            "give one: the mapping names every sub-context's rank-binding file",
        )
    return rank_binding if rank_binding is not None else mapping


def job_mode(o: LaunchOptions, rank_binding: str | None) -> tuple[JobMode, Join | None]:
    """The job's mode from the flags (and Slurm's environment), and how this host joins a job
    over several; the flags no mode takes together are refused here."""
    tt_metal_world = (o.mesh_layout in MPI_LAYOUTS) or rank_binding is not None
    mesh_over_hosts = o.hosts is not None and tt_metal_world
    if not mesh_over_hosts:
        for flag, value in (
            ("--launch-agent", o.launch_agent),
            ("--tcp-interface", o.tcp_interface),
        ):
            if value is not None:
                raise bad_input(
                    f"{flag} goes with --hosts and a tt-metal mesh",
                    "add --mesh-layout mesh (or drop it)",
                )
    if o.replicas is not None and o.replicas > 1:
        from ttmesh.launcher.fleet import check

        check.mode(o, rank_binding, tt_metal_world)
        return JobMode.FLEET, None
    hosts = None if mesh_over_hosts else o.hosts
    if mesh_over_hosts and _nnodes(o.nnodes) not in (None, 1):
        # One mpirun starts the mesh on every host: no agent of one host joins another's.
        raise bad_input(
            f"--nnodes {shown(o.nnodes)} with --hosts and a tt-metal mesh (one mpirun starts "
            "the mesh over the hosts --hosts names)",
            "drop --nnodes",
        )
    join = _join(o, hosts)
    if mesh_over_hosts:
        if join is not None:  # Slurm's SLURM_NNODES: this launch is one of several
            raise bad_input(
                f"a job over {join.nnodes} hosts (Slurm's SLURM_NNODES) with --hosts and a "
                "tt-metal mesh: one mpirun starts the mesh over the hosts",
                "run one ttmesh launch --hosts for the job (srun -N1), or drop --hosts",
            )
        return JobMode.MESH_OVER_HOSTS, None
    if hosts is not None:
        return JobMode.HOSTS, join
    return (JobMode.C10D if join is not None else JobMode.ONE_HOST), join


def _request(
    o: LaunchOptions, rank_binding: str | None, join: Join | None, job_id: str | None, workdir: str
) -> tuple[LaunchRequest, int | None]:
    """The request (and the job's --tp-size over its hosts) from the options."""
    mesh_layout = o.mesh_layout or Layout.ISOLATED
    if o.summary_json is not None:
        paths.writable_file(o.summary_json, "--summary-json")
    if o.tt_smi is not None:
        from ttmesh.recovery.reset import find_tt_smi

        find_tt_smi(o.host, o.tt_smi)  # not an executable: say so now, not after a crash
    env = parse_env(list(o.env_items))
    binding = _load_binding(rank_binding, o.rank_bindings_mapping)
    server = _server(o, rank_binding, mesh_layout)
    if server is not None and server[0].chipless and join is not None:
        raise bad_input(
            f"a job over {join.nnodes} hosts (--nnodes, or Slurm's SLURM_NNODES): "
            f"{server[0].name} drives no Tenstorrent chip, and ttmesh runs it on one host",
            "give --nnodes 1 (the server's own --nnodes, after the command, spans hosts)",
        )
    program = None
    if server is None:  # a program on a stack a profile knows (torch_tpu on libtt, ...)
        from ttmesh.launcher.planning import programs

        program = programs.choose(o.profile_name, dict(os.environ), env)
        if program is not None:
            programs.check_layout(program, mesh_layout, rank_binding)
    job_tp, tp_size, tp_hosts = _tp_over_hosts(o.tp_size, server, join)
    policy = _policy(o, server[0] if server is not None else None)
    if o.as_json and not o.dry_run:
        raise bad_input("--json goes with --dry-run", "the job's own output is not JSON")
    if o.op_timeout is not None and any(k == OP_TIMEOUT_VAR for k, _ in env):
        raise bad_input(
            f"--op-timeout and --env {OP_TIMEOUT_VAR} both set the ranks' operation timeout",
            "give one of them",
        )
    one_world = mesh_layout in MPI_LAYOUTS or binding is not None
    request = LaunchRequest(
        command=list(o.command),
        tp_size=tp_size,  # type: ignore[arg-type]
        module=o.module,
        no_python=o.no_python,
        layout=mesh_layout,
        mesh_shape=parse_shape(o.mesh_shape),
        symmetric_dram_mb=o.symmetric_dram_mb,
        env=env,
        master_port=o.master_port,
        policy=policy,
        job=paths.safe_name(job_id, "--job-id") if job_id is not None else "",  # the one check
        strict_links=o.strict_links,
        nproc=o.nproc,
        launcher=o.launcher or (StartMode.MPI if one_world else StartMode.DIRECT),
        workdir=workdir,
        binding=binding,
        environ=dict(os.environ),
        master_addr=o.torchrun_flags.master_addr or "127.0.0.1",
        role=o.torchrun_flags.role,
        virtual_local_rank=o.torchrun_flags.virtual_local_rank,
        numa_binding=o.torchrun_flags.numa_binding == "node",
        profile=server[0] if server else None,
        server_args=server[1] if server else None,
        server_findings=server[3] if server else [],
        program=program,
        strict=o.strict,
        tp_hosts=tp_hosts,
        nnodes=join.nnodes if join is not None else 1,
    )
    return request, job_tp


def _policy(o: LaunchOptions, profile: Profile | None) -> Policy:
    """The policy the options ask for (request.Policy); ``profile``: the server's, when the
    command is a server a profile knows (its watch flags need one, its grace is the default).
    The rules of the policy alone are the Policy's own; these are of the flags and the command."""
    if o.health_interval is not None and profile is None:
        raise bad_input("--health-interval goes with a server", "see ttmesh profiles")
    for flag, given in (
        ("--probe-interval", o.probe_interval),
        ("--probe-timeout", o.probe_timeout),
    ):
        if given is not None and profile is None:
            raise bad_input(f"{flag} goes with a server", "see ttmesh profiles")
    if o.probe_interval is not None and profile is not None and not profile.probe:
        raise bad_input(
            f"--probe-interval: profile {profile.name} has no probe (a one-token generation)",
            "add probe: {path, body, timeout} to the profile, or drop --probe-interval",
        )
    grace = o.grace
    if grace is None:
        grace = profile.grace if profile is not None else DEFAULT_GRACE
    return Policy(
        max_restarts=o.max_restarts,
        grace=grace,
        fabric_grace=o.fabric_grace,
        op_timeout=o.op_timeout,
        on_reset_notice=o.on_reset_notice,
        ready_timeout=o.ready_timeout,
        hang_timeout=o.hang_timeout,
        ready_pattern=o.ready_pattern,
        health_interval=o.health_interval,
        health_failures=o.health_failures,
        probe_interval=o.probe_interval,
        probe_timeout=o.probe_timeout,
    )


def _load_binding(path: str | None, mapping: str | None) -> BindingFile | None:
    """The rank-binding file (adapters.ttrun.BindingFile) of either flag."""
    if path is None:
        return None
    if mapping is not None:
        from ttmesh.launcher.adapters import subcontexts

        return subcontexts.load(path, dict(os.environ), paths.cwd())
    from ttmesh.launcher.adapters import ttrun

    return ttrun.load(path, dict(os.environ), paths.cwd())


def _ranks(value: str | None) -> frozenset[int] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    ranks = frozenset(int(v) for v in items if numeric.digits(v))
    if not ranks or len(ranks) != len(set(items)) or max(ranks) >= numeric.MAX_CHIPS:
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
    makes it, and the job's directory in it (launcher.job.logdir.make_run_dir)."""
    if value is None:
        return None
    return str(paths.writable_dir(value, "--log-dir", "the rank logs"))


def _log_spec(redirects: str | None, tee: str | None) -> LogSpec:
    """torchrun's --redirects, --tee and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, checked."""
    from ttmesh.launcher.planning import logspec

    return logspec.LogSpec(
        redirects=logspec.parse_std(redirects, "--redirects"),
        tee=logspec.parse_std(tee, "--tee"),
        template=os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE") or None,  # as torchrun
    )


def _tp_over_hosts(
    tp_size: int | None, server: Server | None, join: Join | None
) -> tuple[int | None, int | None, int]:
    """(the job's --tp-size, this host's share of it, the hosts sharing it). --tp-size is the
    tensor-parallel degree over every host of the job (a server's own --tp-size too); a
    server's --nnodes and --node-rank must be the job's (its findings, errors). The one place
    --tp-size is given its meaning, whatever the mode."""
    from ttmesh.launcher.planning import tpsize

    hosts = join.nnodes if join is not None else 1
    flag = write = "--tp-size"
    if server is not None:
        profile, parsed, tp, findings = server
        node = join.node_rank if join is not None else 0
        findings.extend(tpsize.server_hosts(profile, parsed, hosts, node))
        if tp_size is None and profile.tp_flag:
            flag = write = f"the server's {profile.tp_flag}"
            if parsed.value(profile.tp_flag) is None:
                flag = f"the server's default {profile.tp_flag}"
        tp_size = tp
    if tp_size is None or hosts <= 1:
        return tp_size, tp_size, 1
    return tp_size, tpsize.per_host(tp_size, hosts, flag, write), hosts


def _server(o: LaunchOptions, rank_binding: str | None, mesh_layout: str) -> Server | None:
    """(profile, server args, chips, findings) when COMMAND is a server a profile knows."""
    from ttmesh.launcher.serving import args, profiles

    if o.profile_name == "none":
        return None
    parsed = args.parse(list(o.command), o.module)
    if o.profile_name:
        from ttmesh.launcher.planning import programs

        names = tuple(p.name for p in programs.every())
        profile = profiles.named(o.profile_name, names)  # None: a program profile's name
    else:
        profile = profiles.recognise(parsed, dict(os.environ))
    if profile is None:
        return None
    for flag, value in (("--rank-binding", rank_binding), ("--nproc-per-node", o.nproc)):
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
    parsed = profile.read(parsed, paths.cwd())  # as the server's own parser reads it
    if profile.chipless:  # its --tp-size is its own processes; ttmesh's is refused (no chips)
        return profile, parsed, o.tp_size, []
    from ttmesh.launcher.serving import spec

    tp, findings = spec.server_tp(profile, parsed, o.tp_size)
    if tp is None and profile.tp_flag:
        tp = 1  # the server's own default: one chip
    return profile, parsed, tp, findings


def _join(o: LaunchOptions, hosts: str | None) -> Join | None:
    """How this agent joins a job over several hosts; None for one host.

    torchrun's flags win over Slurm's environment (SLURM_NNODES, SLURM_NODEID, the first host
    of SLURM_JOB_NODELIST, at its NodeAddr when DNS does not know its name) and over mpirun's
    (OMPI_COMM_WORLD_RANK, when --hosts started us)."""
    env = os.environ
    count, node_rank = _nnodes(o.nnodes), o.node_rank
    endpoint = None if o.rdzv_endpoint is None else _endpoint(o.rdzv_endpoint)
    local_addr = None
    if o.local_addr is not None:
        local_addr = addresses.host(o.local_addr, "--local-addr", example="--local-addr 10.0.0.2")
    if hosts is not None:
        names = addresses.hosts(hosts, "--hosts", example="--hosts node0,node1")
        if count not in (None, len(names)):
            raise bad_input(
                f"--nnodes {count} but --hosts names {len(names)} hosts", "drop --nnodes"
            )
        count = len(names)
        endpoint = endpoint or _endpoint(names[0])
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
        from ttmesh.launcher.nodes import slurm  # (socket, subprocess): under Slurm only

        endpoint = _endpoint(slurm.first_address(env["SLURM_JOB_NODELIST"]), 29400)
    if node_rank is None and hosts is None:
        raise bad_input(
            f"--nnodes {count}: which host is this?", "give --node-rank 0..N-1 on each host"
        )
    if endpoint is None:
        raise bad_input(
            f"--nnodes {count}: where do the hosts meet?",
            "give --rdzv-endpoint HOST:PORT (node 0's address)",
        )
    from ttmesh.launcher.nodes import rendezvous

    return Join(
        nnodes=count,
        node_rank=node_rank if node_rank is not None else 0,
        endpoint=endpoint,
        token=rendezvous.token_of(o.rdzv_token),
        local_addr=local_addr,
        join_timeout=o.rdzv_timeout,
        heartbeat_timeout=o.heartbeat_timeout,
        job=o.job_id if o.job_id is not None else _job_of(endpoint),
    )


def _endpoint(text: str, port: int | None = None) -> Endpoint:
    """Where the hosts meet: ``HOST[:PORT]`` read (or HOST at ``port``). The rendezvous
    (socket, torch's store) is imported for a job over several hosts only."""
    from ttmesh.launcher.nodes import rendezvous

    return rendezvous.parse_endpoint(text) if port is None else rendezvous.Endpoint(text, port)


def shown(value: str | None) -> str:
    """A value the user gave, as a message may show it (printable, bounded)."""
    text = str(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return text if text.isprintable() else repr(text)


def _job_of(point: Endpoint) -> str:
    """Every host must name the job alike: its id derived from where they meet."""
    env = os.environ
    job_id = (
        env.get("SLURM_JOB_ID") and f"slurm-{env['SLURM_JOB_ID']}"
    ) or f"rdzv-{point.host}-{point.port}"
    job_id = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in job_id)
    return job_id.lstrip("-.")[:64]


def _env_whole(name: str, default: str | None = None, low: int = 0) -> int:
    """A number ttmesh reads from the environment (Slurm's, mpirun's), named as the variable:
    ``SLURM_NNODES=abc`` is one line, not an internal error."""
    return numeric.whole(os.environ.get(name, default), name, low=low, high=numeric.MAX_CHIPS)


def _nnodes(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not text.isprintable():  # said quoted: a terminal must not be sent an escape sequence
        raise bad_input(f"--nnodes {shown(value)}: not a number", "e.g. --nnodes 2")
    if ":" in text:
        low, _, high = text.partition(":")
        if low != high:
            raise bad_input(
                f"--nnodes {shown(value)}: ttmesh runs a fixed number of hosts (no elastic "
                "MIN:MAX)",
                f"e.g. --nnodes {high or low}"
                if numeric.digits(high or low)
                else "e.g. --nnodes 2",
            )
        text = low
    return numeric.whole(
        text, "--nnodes", low=1, high=numeric.MAX_CHIPS, unit="hosts", example="--nnodes 2"
    )
