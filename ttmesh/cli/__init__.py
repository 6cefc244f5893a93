"""The ``ttmesh`` command line: parse, call one function, render its result.

A package with one module per command (``ls``, ``launch``, ``ps``, ``check``, ``reset``,
``top``, ``metrics``, ``descriptor``, ``doctor``, ``sim``), the options they share (:mod:`~ttmesh.cli.params`), the one place
that opens a host (:mod:`~ttmesh.cli.hosts`, the only importer of the simulator) and the text
views (:mod:`~ttmesh.cli.views`). Kept light: importing it pulls in click and nothing heavy
(no torch, yaml, rich or psutil), so ``ttmesh --help`` is instant; a command's module (its
options, dozens for ``launch``) is imported only when that command runs (:data:`COMMANDS`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from ttmesh.cli.params import CONTEXT
from ttmesh.errors import BAD_INPUT, TTMeshError
from ttmesh.version import __version__

# name -> (module, attribute, the first paragraph of its help, for the list in ttmesh --help).
# tests/test_ls.py checks each against the command itself.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "check": (
        "ttmesh.cli.check", "check_cmd",
        "Is the host fit to run a job? Exit 0 healthy, 1 unhealthy, 2 bad input.",
    ),
    "descriptor": (
        "ttmesh.cli.descriptor", "descriptor_cmd",
        "Write tt-metal mesh graph descriptors for a set of chips, as ttmesh launch would.",
    ),
    "doctor": (
        "ttmesh.cli.doctor", "doctor_cmd",
        "Capture a host's state into one archive: the driver's files, the cluster descriptor, "
        "`tt-smi -s`, kernel messages about the chips, and `ttmesh ls` / `check` as JSON.",
    ),
    "launch": (
        "ttmesh.cli.launch", "launch_cmd",
        "Run COMMAND once per chip, supervised: the torchrun contract plus chips and fabric.",
    ),
    "logs": (
        "ttmesh.cli.logs", "logs_cmd",
        "Print a job's output (its ranks', or its server's), running or ended.",
    ),
    "ls": (
        "ttmesh.cli.ls", "ls_cmd",
        "List the host's chips, who holds or leases them, and their Ethernet links.",
    ),
    "metrics": (
        "ttmesh.cli.metrics", "metrics_cmd",
        "Serve the host's chips, their leases and the jobs' ranks as Prometheus metrics.",
    ),
    "profiles": (
        "ttmesh.cli.serving", "profiles_cmd",
        "List the serving stacks ttmesh recognises, and how it runs each.",
    ),
    "ps": (
        "ttmesh.cli.ps", "ps_cmd",
        "List your ttmesh jobs on every host (real or simulated): id, state, root, chips, ranks.",
    ),
    "reset": (
        "ttmesh.cli.reset", "reset_cmd",
        "Reset chips safely with tt-smi, then verify they recovered.",
    ),
    "sim": (
        "ttmesh.cli.sim", "sim_group",
        "Simulated hosts: the same files and tt-smi as a real machine, with fault injection.",
    ),
    "stop": (
        "ttmesh.cli.serving", "stop_cmd",
        "Stop a running job gracefully, from another terminal (as Ctrl-C would).",
    ),
    "top": (
        "ttmesh.cli.top", "top_cmd",
        "Show every chip's telemetry, refreshed: temperature, power, clock (AICLK), heartbeat, "
        "Ethernet links up, and the job leasing the chip or the processes holding it.",
    ),
}  # fmt: skip

# Commands ttmesh runs itself (never listed in --help): a fleet's guard; and through mpirun on
# other hosts: each host's report of itself, one rank of a mesh over several hosts, and a
# host's part in recovering the chips of such a mesh.
HIDDEN: dict[str, tuple[str, str]] = {
    "_fleet-guard": ("ttmesh.cli.fleetguard", "fleet_guard_cmd"),
    "_host-report": ("ttmesh.cli.hostreport", "host_report_cmd"),
    "_rank": ("ttmesh.cli.rank", "rank_cmd"),
    "_recover": ("ttmesh.cli.recover", "recover_cmd"),
}


class Commands(click.Group):
    """A group whose commands are imported when one is run (or asked for its help)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, attribute, _ = COMMANDS[cmd_name]
        elif cmd_name in HIDDEN:
            module, attribute = HIDDEN[cmd_name]
        else:
            return None
        import importlib

        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            # click >= 8.4 suggests a close name from the commands it holds: ours are lazy.
            name = getattr(exc, "command_name", None)
            if name is None or getattr(exc, "possibilities", None):
                raise
            raise type(exc)(name, possibilities=list(COMMANDS), ctx=ctx) from None  # type: ignore[call-arg]

    def format_commands(self, ctx: click.Context, formatter: Any) -> None:
        """The list of commands, from :data:`COMMANDS`: no command's module is imported."""
        stubs = {name: click.Command(name, help=text) for name, (_, _, text) in COMMANDS.items()}
        limit = formatter.width - 6 - max(len(name) for name in stubs)
        rows = [(name, stubs[name].get_short_help_str(limit)) for name in sorted(stubs)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=Commands, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="ttmesh")
def main() -> None:
    """Launch and supervise multi-chip Tenstorrent jobs: one worker per chip.

    \b
    Try it without hardware, on a simulated QuietBox 2:
      ttmesh ls --sim quietbox2
    """


# --------------------------------------------------------------------------- entry point


def run(args: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of raising SystemExit.

    Every failure is one line on stderr (``ttmesh: what (how to fix it)``) and an exit code;
    with ``--json`` a ``ttmesh.error/1`` document on stdout too. No traceback reaches a user:
    an OSError is the machine's state (a path, a permission), anything else is a bug, said in
    one line (``TTMESH_DEBUG=1`` shows the traceback). Output that could not be written
    (:mod:`~ttmesh.cli.streams`) is said too, and ends a command that succeeded with 74 (141
    when the reader of stdout went away).
    """
    from ttmesh.cli import streams

    argv = list(sys.argv[1:] if args is None else args)
    return streams.settle(_invoke(argv))


def _invoke(argv: list[str]) -> int:
    from ttmesh.cli import streams

    try:
        code = main.main(args=argv, prog_name="ttmesh", standalone_mode=False, obj={"argv": argv})
    except TTMeshError as exc:
        return _fail(argv, exc.code, exc.message, exc.hint)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
        return BAD_INPUT
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "ttmesh"
        return _fail(argv, BAD_INPUT, exc.format_message(), f"see: {cmd} --help")
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        return _fail(argv, 130, "interrupted", None)
    except streams.StreamError as exc:  # said once, by streams.settle
        return streams.PIPE_GONE if streams.pipe_gone(exc) else streams.OUTPUT_FAILED
    except SystemExit:  # click ends a command whose stdout reader is gone this way
        if streams.pipe_gone(streams.failures.get("stdout") or OSError()):
            return streams.PIPE_GONE
        raise
    except BrokenPipeError:
        return 1
    except OSError as exc:
        import errno

        from ttmesh import paths
        from ttmesh.errors import from_os_error

        # A path relative to a working directory that was deleted fails naming no path.
        gone = exc.errno == errno.ENOENT and not exc.filename and paths.cwd_gone()
        err = paths.gone_cwd() if gone else from_os_error(exc)
        return _fail(argv, err.code, err.message, err.hint)
    except Exception as exc:
        sim = sys.modules.get("ttmesh.sim.core")  # loaded only when a simulated host was used
        if sim is not None and isinstance(exc, sim.SimError):
            # A simulated host's own complaint (a corrupted file, a chip it has not): one line.
            return _fail(argv, exc.code, exc.message, exc.hint)
        if os.environ.get("TTMESH_DEBUG"):
            raise
        what = f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
        return _fail(argv, 1, what, "a bug in ttmesh: rerun with TTMESH_DEBUG=1 and report it")
    return code if isinstance(code, int) else 0


def _fail(argv: list[str], code: int, message: str, hint: str | None) -> int:
    from ttmesh.render import escaped

    # One line whatever the message quotes (a path, a file's field): escaped, never raw.
    line = escaped(f"ttmesh: {message}" + (f" ({hint})" if hint else ""))
    if _json_requested(argv):
        from ttmesh.render import json_text

        doc = {"schema": "ttmesh.error/1", "code": code, "message": message, "hint": hint}
        try:
            sys.stdout.write(json_text(doc, indent=2) + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass  # the line below still says what failed; streams.settle says the rest
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return code


def _json_requested(argv: list[str]) -> bool:
    """Did the user ask for --json (among ttmesh's own options, not a launched command's)?"""
    words = argv[: argv.index("--")] if "--" in argv else argv
    if "launch" in words:
        from ttmesh.cli.launch import launch_cmd
        from ttmesh.cli.launch_args import command_start

        at = words.index("launch") + 1
        try:
            end, _ = command_start(launch_cmd.get_params(click.Context(launch_cmd)), argv[at:])
        except TTMeshError:
            end = len(argv) - at
        words = argv[at : at + end]
    return "--json" in words


def entry() -> None:
    from ttmesh.cli import streams

    streams.install()
    code = run()
    # Leave without the interpreter's teardown (tens of milliseconds of module cleanup that
    # delays a launcher's exit): run flushed everything ttmesh writes.
    os._exit(code)
