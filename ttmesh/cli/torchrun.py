"""torchrun's flags on ``ttmesh launch``: every flag of torch 2.13's ``torchrun --help``, in
both spellings (``--rdzv-id`` and ``--rdzv_id``, as pytorch/examples' ``run_example.sh`` types
it), with ``PET_*`` environment defaults as torchrun reads them, and torchrun's meaning where it
has one here.

A user switching from torchrun changes one word, so a torchrun command line must start. Where a
flag means something on a ttmesh host it does that (``--standalone``, ``--master-addr``,
``--rdzv-endpoint``'s port on one host, ``--role``, ``--virtual-local-rank``, ``--numa-binding
node``); where it means nothing here (``--start-method``, ``--monitor-interval``, ...) it is
accepted and ttmesh says once, on stderr, what it does instead. Kept apart from the launch
command so the command's module only hands this the values it parses.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ttmesh import addresses, numeric
from ttmesh.errors import bad_input
from ttmesh.render import note

if TYPE_CHECKING:
    from ttmesh.launcher.planning.options import TorchrunFlags

# Every long flag of torch 2.13's `torchrun --help` -> its argparse dest (PET_<DEST> is its
# environment default: torch/distributed/argparse_util.py, env and check_env).
FLAGS: dict[str, str] = {
    "--nnodes": "nnodes",
    "--nproc-per-node": "nproc_per_node",
    "--rdzv-backend": "rdzv_backend",
    "--rdzv-endpoint": "rdzv_endpoint",
    "--rdzv-id": "rdzv_id",
    "--rdzv-conf": "rdzv_conf",
    "--standalone": "standalone",
    "--max-restarts": "max_restarts",
    "--monitor-interval": "monitor_interval",
    "--start-method": "start_method",
    "--event-log-handler": "event_log_handler",
    "--role": "role",
    "--module": "module",
    "--no-python": "no_python",
    "--run-path": "run_path",
    "--log-dir": "log_dir",
    "--redirects": "redirects",
    "--tee": "tee",
    "--local-ranks-filter": "local_ranks_filter",
    "--duplicate-stdout-filters": "duplicate_stdout_filters",
    "--duplicate-stderr-filters": "duplicate_stderr_filters",
    "--node-rank": "node_rank",
    "--master-addr": "master_addr",
    "--master-port": "master_port",
    "--local-addr": "local_addr",
    "--logs-specs": "logs_specs",
    "--numa-binding": "numa_binding",
    "--signals-to-handle": "signals_to_handle",
    "--shutdown-timeout": "shutdown_timeout",
    "--virtual-local-rank": "virtual_local_rank",
}
# Read after PET_<DEST> when the flag is not given, as torchrun reads them.
ALSO_ENV: dict[str, tuple[str, ...]] = {"shutdown_timeout": ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT",)}
# torch 2.13's --numa-binding choices (torch/numa/binding.py AffinityMode).
NUMA_MODES = ("node", "socket", "exclusive", "core-complex")
START_METHODS = ("spawn", "fork", "forkserver")
# The signals ttmesh handles, whatever --signals-to-handle says (torchrun's default list is
# SIGTERM,SIGINT,SIGHUP,SIGQUIT; SIGUSR1/2 are Slurm's).
HANDLED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
# What ttmesh does instead of a flag that has no meaning here (said once, on stderr).
INSTEAD: dict[str, str] = {
    "monitor_interval": "ttmesh sees a rank's exit the moment it happens (SIGCHLD), no polling",
    "start_method": "each rank is a new process (a fresh exec, as spawn)",
    "event_log_handler": "ttmesh keeps its own record of the job (ttmesh ps, --summary-json)",
    "logs_specs": "ttmesh writes the ranks' logs itself (--log-dir DIR)",
    "duplicate_stdout_filters": "no filtered copy is written: --log-dir DIR keeps every line",
    "duplicate_stderr_filters": "no filtered copy is written: --log-dir DIR keeps every line",
    "run_path": "each rank runs the script in a Python of its own (python SCRIPT), the Python "
    "that runs ttmesh",
    "signals_to_handle": "ttmesh always passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on to the "
    "ranks as sent and stops the job, and passes SIGUSR1 and SIGUSR2 on",
}


def underscore(flag: str) -> str:
    """``--rdzv-id`` -> ``--rdzv_id`` (torchrun takes both)."""
    return "--" + flag[2:].replace("-", "_")


def _dest_of(param: click.Parameter) -> str | None:
    for name in param.opts:
        if name in FLAGS:
            return FLAGS[name]
    return None


def adopt(command: click.Command) -> click.Command:
    """Give every option of ``command`` that is a torchrun flag torchrun's other spelling and
    its ``PET_*`` environment default (unless it has an environment variable of its own)."""
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        dest = _dest_of(param)
        if dest is None:
            continue
        for name in list(param.opts):
            if name in FLAGS and underscore(name) not in param.opts:
                param.opts.append(underscore(name))
        if not param.envvar:
            param.envvar = [f"PET_{dest.upper()}", *ALSO_ENV.get(dest, ())]
    return command


def _opt(flag: str, dest: str, **kwargs: Any) -> Callable[..., Any]:
    names = [flag] if underscore(flag) == flag else [flag, underscore(flag)]
    return click.option(*names, dest, envvar=f"PET_{FLAGS[flag].upper()}", **kwargs)


def options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """torchrun's flags ``ttmesh launch`` has no option of its own for, resolved into the
    launch command's own values (``rdzv_endpoint``, ``master_port``, ...) and a
    ``torchrun_flags`` keyword argument (``planning.options.TorchrunFlags``, planned with the
    job: ``planning.rankenv`` and ``planning.numa`` write their effects into each rank)."""

    @_opt(
        "--standalone",
        "tr_standalone",
        is_flag=True,
        help="torchrun's: one host, a free port and store (what ttmesh does for one host).",
    )
    @_opt(
        "--master-addr",
        "tr_master_addr",
        metavar="ADDR",
        help="torchrun's: rank 0's address (MASTER_ADDR): on one host an address of this host; over "
        "several, where they meet.",
    )
    @_opt(
        "--rdzv-conf",
        "tr_rdzv_conf",
        metavar="K=V,...",
        help="torchrun's: join_timeout is --rdzv-timeout; the other keys are said and ignored.",
    )
    @_opt("--role", "tr_role", metavar="ROLE", help="torchrun's: every rank's ROLE_NAME.")
    @_opt(
        "--virtual-local-rank",
        "tr_virtual_local_rank",
        is_flag=True,
        help="torchrun's: LOCAL_RANK is 0 in every rank (each rank sees only its own chips).",
    )
    @_opt(
        "--numa-binding",
        "tr_numa_binding",
        metavar="MODE",
        help="torchrun's: node runs each rank on the CPUs of its chip's NUMA node; socket, "
        "exclusive, core-complex are refused.",
    )
    @_opt(
        "--signals-to-handle",
        "tr_signals",
        metavar="SIG,...",
        help="torchrun's: ttmesh handles " + ", ".join(HANDLED) + " always.",
    )
    # Accepted for torchrun's command lines with nothing to do here: out of --help, said once
    # when given (docs/torchrun.md lists every flag).
    @_opt(
        "--monitor-interval",
        "tr_monitor_interval",
        hidden=True,
        metavar="S",
        help="torchrun's: accepted, not needed (exits are seen at once).",
    )
    @_opt(
        "--start-method",
        "tr_start_method",
        hidden=True,
        metavar="METHOD",
        help="torchrun's: accepted (each rank is a new process).",
    )
    @_opt(
        "--run-path",
        "tr_run_path",
        hidden=True,
        is_flag=True,
        help="torchrun's: accepted (a script runs with this Python).",
    )
    @_opt(
        "--event-log-handler",
        "tr_event_log_handler",
        hidden=True,
        metavar="NAME",
        help="torchrun's: accepted, not used.",
    )
    @_opt(
        "--logs-specs",
        "tr_logs_specs",
        hidden=True,
        metavar="NAME",
        help="torchrun's: accepted, not used (--log-dir).",
    )
    @_opt(
        "--duplicate-stdout-filters",
        "tr_dup_out",
        hidden=True,
        metavar="F,...",
        help="torchrun's: accepted, not used.",
    )
    @_opt(
        "--duplicate-stderr-filters",
        "tr_dup_err",
        hidden=True,
        metavar="F,...",
        help="torchrun's: accepted, not used.",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags = resolve(kwargs)
        return fn(*args, torchrun_flags=flags, **kwargs)

    return wrapper


def _said(dest: str, flag: str) -> None:
    note(f"note: {flag} is torchrun's: {INSTEAD[dest]}")


def _named(ctx: click.Context, dest: str) -> str:
    """How the user gave the option ``dest``: its spelling, or its PET_* variable."""
    from ttmesh.cli.params import spelling

    for param in ctx.command.params:
        if param.name == dest:
            return spelling(param, ctx)
    return dest


def resolve(kwargs: dict[str, Any]) -> TorchrunFlags:
    """Pop torchrun's values from ``kwargs`` and turn them into the launch command's own."""
    from ttmesh.launcher.planning.options import TorchrunFlags

    ctx = click.get_current_context()
    standalone = kwargs.pop("tr_standalone")
    master_addr = kwargs.pop("tr_master_addr")
    rdzv_conf = kwargs.pop("tr_rdzv_conf")
    role = kwargs.pop("tr_role")
    virtual = kwargs.pop("tr_virtual_local_rank")
    numa = kwargs.pop("tr_numa_binding")
    signals = kwargs.pop("tr_signals")
    start_method = kwargs.pop("tr_start_method")
    unused = {
        "monitor_interval": kwargs.pop("tr_monitor_interval"),
        "start_method": start_method,
        "run_path": kwargs.pop("tr_run_path") or None,
        "event_log_handler": kwargs.pop("tr_event_log_handler"),
        "logs_specs": kwargs.pop("tr_logs_specs"),
        "duplicate_stdout_filters": kwargs.pop("tr_dup_out"),
        "duplicate_stderr_filters": kwargs.pop("tr_dup_err"),
    }
    if unused["logs_specs"] is not None:
        _logs_specs(unused["logs_specs"], _named(ctx, "tr_logs_specs"))
    if unused["monitor_interval"] is not None:
        where = _named(ctx, "tr_monitor_interval")
        numeric.number(unused["monitor_interval"], where, low=0, unit="seconds")
    if start_method is not None and start_method not in START_METHODS:
        raise bad_input(
            f"{_named(ctx, 'tr_start_method')} {start_method!r}: torchrun takes {', '.join(START_METHODS)}",
            "drop it: each rank is a new process",
        )
    if numa is not None and numa not in NUMA_MODES:
        raise bad_input(
            f"{_named(ctx, 'tr_numa_binding')} {numa!r}: torchrun takes {', '.join(NUMA_MODES)}",
            "--numa-binding node binds each rank to its chip's NUMA node",
        )
    if numa is not None and numa != "node":
        raise bad_input(
            f"{_named(ctx, 'tr_numa_binding')} {numa}: ttmesh binds ranks by NUMA node only",
            "use --numa-binding node (each rank on the CPUs of its chip's NUMA node)",
        )
    if signals is not None:
        _signals(signals, _named(ctx, "tr_signals"))
        unused["signals_to_handle"] = signals
    for dest, value in unused.items():
        if value is not None:
            _said(dest, "--" + dest.replace("_", "-"))
    if rdzv_conf is not None:
        kwargs["rdzv_timeout"] = _rdzv_conf(rdzv_conf, kwargs["rdzv_timeout"], ctx)
    if kwargs.get("nproc") == "auto":
        kwargs["nproc"] = None  # ttmesh's default: one worker per chip
    hosts = _hosts(kwargs.get("nnodes"))
    if standalone:
        if kwargs.get("hosts") is not None:
            raise bad_input("--standalone with --hosts: --standalone is one host", "drop one")
        if hosts is not None and hosts > 1:
            raise bad_input(
                f"--standalone with --nnodes {shown(kwargs['nnodes'])}: --standalone is one host",
                "drop --standalone for a job over several hosts",
            )
        for key, flag in (("rdzv_endpoint", "--rdzv-endpoint"), ("rdzv_backend", "--rdzv-backend")):
            if kwargs.get(key) is not None:
                note(
                    f"note: --standalone: {flag} ignored, as torchrun does (one host, a free port)"
                )
                kwargs[key] = None
    # An --nnodes ttmesh cannot read is refused by the launch command: nothing is said first.
    readable = hosts is not None or kwargs.get("nnodes") is None
    if readable and _one_host(hosts) and kwargs.get("hosts") is None:
        if kwargs.get("nnodes") is None and kwargs.get("node_rank") == 0:
            kwargs["node_rank"] = None  # torchrun's --nnodes defaults to 1: node 0 is this host
        endpoint = kwargs.get("rdzv_endpoint")
        if endpoint is not None:
            # torchrun on one host serves its agents' c10d store there; its ranks still get a
            # free MASTER_PORT. ttmesh needs no store of its own on one host.
            _endpoint(endpoint)  # a malformed one is still refused
            kwargs["rdzv_endpoint"] = None
            note(
                f"note: --rdzv-endpoint {shown(endpoint)} on one host: ranks meet at 127.0.0.1 on a "
                "free port, as under torchrun (ttmesh needs no rendezvous store here)"
            )
        if master_addr is not None and kwargs["master_port"] == 0:
            note(
                "note: --master-addr without --master-port is ignored, as torchrun does (ranks "
                "meet at 127.0.0.1 on a free port)"
            )
            master_addr = None
    elif master_addr is not None and kwargs.get("rdzv_endpoint") is None:
        # static rendezvous: rank 0's host is where they meet (an IPv6 address in brackets)
        host = addresses.host(
            master_addr, _named(ctx, "tr_master_addr"), example="--master-addr 10.0.0.1"
        )
        kwargs["rdzv_endpoint"] = f"[{host}]" if ":" in host else host
        master_addr = None
    if master_addr is not None and readable and not _one_host(hosts):
        note("note: --master-addr: over several hosts MASTER_ADDR is node 0's address")
        master_addr = None
    if master_addr is not None:
        master_addr = _local_addr(master_addr)
    return TorchrunFlags(master_addr, role, virtual, numa)


def _one_host(hosts: int | None) -> bool:
    """One host: --nnodes 1, or no --nnodes outside a Slurm step over several nodes."""
    if hosts is not None:
        return hosts == 1
    env = os.environ
    in_slurm = "SLURM_JOB_NODELIST" in env and "SLURM_NODEID" in env and "SLURM_STEP_ID" in env
    return not (in_slurm and env.get("SLURM_NNODES", "1").strip() not in ("", "1"))


def _hosts(nnodes: str | None) -> int | None:
    if nnodes is None:
        return None
    low, _, high = nnodes.strip().partition(":")
    count = high or low
    return int(count) if numeric.digits(count) else None  # else the launch command says why


def _endpoint(value: str) -> None:
    """A malformed endpoint is refused as over several hosts (rendezvous.parse_endpoint)."""
    from ttmesh.launcher.nodes import rendezvous

    rendezvous.parse_endpoint(value.strip())


def shown(value: str) -> str:
    """A value the user gave, as a line may show it: quoted when it holds what a terminal must
    not be sent (an escape sequence, a newline)."""
    return value if value.isprintable() else repr(value)


def _local_addr(addr: str) -> str:
    """``--master-addr`` on one host: rank 0 listens there, so it must be this host's."""
    import socket

    host = addresses.host(addr, "--master-addr", example="--master-addr 127.0.0.1")
    if host == "localhost":
        return "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        raise bad_input(
            f"--master-addr {shown(addr)}: no such address",
            "give an address of this host, or drop it",
        ) from None
    for family, _, _, _, sockaddr in infos:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((sockaddr[0], 0))
            except OSError:
                continue
            return str(sockaddr[0])
    raise bad_input(
        f"--master-addr {shown(addr)}: not an address of this host (rank 0 listens there)",
        "give an address of this host, or drop it (ranks meet at 127.0.0.1)",
    )


def _signals(value: str, where: str) -> None:
    names = [n.strip() for n in value.split(",") if n.strip()]
    for name in names:
        full = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        if full not in HANDLED:
            known = hasattr(signal, full)
            raise bad_input(
                f"{where} {shown(name)}: "
                + ("ttmesh does not pass it on" if known else "no such signal"),
                "ttmesh handles " + ", ".join(HANDLED) + ": drop it",
            )


# torch's own entry under torchrun.logs_specs (torch-2.13.0.dist-info/entry_points.txt), there
# whether or not torch is installed beside ttmesh.
TORCH_LOGS_SPECS = ("default",)


def _logs_specs(name: str, where: str) -> None:
    """torchrun's ``--logs-specs NAME`` names an entry point of the ``torchrun.logs_specs``
    group, and torchrun refuses a name no installed package registers (torch 2.13's
    ``torch/distributed/run.py`` ``_get_logs_specs_class``, L810-837: "Could not find
    entrypoint under 'torchrun.logs_specs[NAME]' key"); ttmesh refuses it too, and writes the
    ranks' logs itself whatever it names."""
    from importlib import metadata

    names = {
        *TORCH_LOGS_SPECS,
        *(e.name for e in metadata.entry_points(group="torchrun.logs_specs")),
    }
    if name not in names:
        raise bad_input(
            f"{where} {shown(name)}: torchrun finds no entry point torchrun.logs_specs[{shown(name)}] "
            f"(installed: {', '.join(sorted(names))})",
            "drop it: ttmesh writes the ranks' logs itself (--log-dir DIR)",
        )


def _rdzv_conf(value: str, current: float, ctx: click.Context) -> float:
    """torchrun's ``--rdzv-conf k=v,...``: join_timeout is ttmesh's --rdzv-timeout."""
    out = current
    for item in (i.strip() for i in value.split(",")):
        if not item:
            continue
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise bad_input(
                f"--rdzv-conf {value!r}: expected KEY=VALUE,...", "e.g. join_timeout=600"
            )
        key = key.strip()
        if key == "join_timeout":
            out = numeric.number(val, "--rdzv-conf join_timeout", low=0, low_open=True,
                                 unit="seconds")  # fmt: skip
        elif key.strip("'\"") == "join_timeout":
            # torchrun reads keys as written: quotes typed into one word (pytorch's own launcher
            # tests pass "--rdzv-conf='join_timeout=5,...'") are part of the key, not join_timeout
            note(f"note: --rdzv-conf key {key!r} is not join_timeout (its quotes are part of it, "
                 "as torchrun reads it; drop them to set the join timeout): not used")  # fmt: skip
        else:
            note(f"note: --rdzv-conf key {_key(key)}: not used by ttmesh's rendezvous "
                 "(--rdzv-timeout, --heartbeat-timeout)")  # fmt: skip
    return out


def _key(key: str) -> str:
    """A --rdzv-conf key as a note shows it: quoted when it holds a quote or a character a
    terminal must not be sent, so no quote of the user's looks like the note's own."""
    return key if key.isprintable() and not set("'\"") & set(key) else repr(key)


class Nproc(click.ParamType):
    """``--nproc-per-node N`` or ``auto`` (one worker per chip, ttmesh's default); torchrun's
    ``gpu``, ``cpu`` and ``xpu`` count devices this host has none of."""

    name = "integer"

    def __init__(self, number: click.ParamType) -> None:
        self.number = number

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value).strip().lower()
        if text == "auto":
            return "auto"
        if text in ("gpu", "cpu", "xpu", "cuda"):
            raise bad_input(
                f"--nproc-per-node {shown(str(value))}: ttmesh starts workers for chips, not {text}s",
                "use --nproc-per-node auto (one per chip) or a number",
            )
        return self.number.convert(value, param, ctx)
