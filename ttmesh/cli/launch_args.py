"""``ttmesh launch`` takes its options, then the command: where one ends and the other begins.

The command's own arguments are passed through untouched, so the launcher cannot let click guess:
an option-looking word before the command is one of ttmesh's options or a mistake. A mistake is
said plainly (exit 2), with the nearest option ttmesh has, and torchrun's flags that ttmesh does
not take say what to do instead.
"""

from __future__ import annotations

import click

from ttmesh.errors import bad_input

# torchrun's flags that ttmesh does not take, and what to do instead.
_RDZV_CONF = "use --rdzv-timeout (joining) and --heartbeat-timeout (a host gone) instead"
TORCHRUN = {
    "--standalone": "ttmesh always runs one host's job with its own free port and store: drop it",
    "--rdzv-conf": _RDZV_CONF,
    "--rdzv_conf": _RDZV_CONF,
    "--master-addr": "ranks on one host meet at 127.0.0.1: drop it (--master-port picks the port)",
    "--master_addr": "ranks on one host meet at 127.0.0.1: drop it (--master-port picks the port)",
    "--logs-specs": "use --log-dir DIR",
    "--logs_specs": "use --log-dir DIR",
    "--role": "drop it: every rank's ROLE_NAME is 'default'",
    "--monitor-interval": "ttmesh sees a rank's exit the moment it happens: drop it",
    "--monitor_interval": "ttmesh sees a rank's exit the moment it happens: drop it",
    "--start-method": "each rank is a new process: drop it",
    "--start_method": "each rank is a new process: drop it",
    "--max-nodes": "ttmesh runs a fixed number of hosts (--nnodes N): drop it",
    "--signals-to-handle": "ttmesh stops the job on SIGINT, SIGTERM and SIGHUP and passes "
    "SIGUSR1/SIGUSR2 to the ranks: drop it",
    "--signals_to_handle": "ttmesh stops the job on SIGINT, SIGTERM and SIGHUP and passes "
    "SIGUSR1/SIGUSR2 to the ranks: drop it",
    "--run-path": "give the script as the command: a .py runs with this Python",
    "--run_path": "give the script as the command: a .py runs with this Python",
    "--numa-binding": "drop it: ttmesh does not bind ranks to NUMA nodes",
    "--numa_binding": "drop it: ttmesh does not bind ranks to NUMA nodes",
}


def _options(params: list[click.Parameter]) -> dict[str, bool]:
    """Every option name among ``params`` -> whether it takes a value."""
    out: dict[str, bool] = {}
    for param in params:
        if not isinstance(param, click.Option):
            continue
        takes_value = not (param.is_flag or param.count)
        for name in (*param.opts, *param.secondary_opts):
            out[name] = takes_value
    return out


def command_start(params: list[click.Parameter], args: list[str]) -> tuple[int, int]:
    """(end of ttmesh's options, start of the launched command) in ``args``: equal, or one
    apart when ``--`` separates them. An option-looking word before the command that is not
    among ``params`` is bad input."""
    known = _options(params)
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return i, i + 1
        if not token.startswith("-") or token == "-":
            return i, i
        name, eq, _ = token.partition("=")
        if name in known:
            i += 2 if known[name] and not eq else 1
            continue
        _unknown(name, known)
    return len(args), len(args)


class LaunchCommand(click.Command):
    """A click command whose trailing argument is a command line passed through untouched."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        end, start = command_start(self.get_params(ctx), args)
        return super().parse_args(ctx, [*args[:end], "--", *args[start:]])


def _unknown(name: str, known: dict[str, bool]) -> None:
    import difflib

    if name in TORCHRUN:
        raise bad_input(f"{name} is torchrun's option, not ttmesh's", TORCHRUN[name])
    longs = [k for k in known if k.startswith("--")]
    close = difflib.get_close_matches(name, longs, n=1, cutoff=0.8)
    if close:
        hint = f"did you mean {close[0]}? See ttmesh launch --help"
    else:
        hint = "ttmesh's options are in ttmesh launch --help; a command that starts with '-' goes after --"
    raise bad_input(f"no such option: {name}", hint)
