"""The ``ttmesh`` command line: parse, call one function, render its result.

A package with one module per command (``ls``, ``launch``, ``ps``, ``check``, ``reset``,
``descriptor``, ``doctor``, ``sim``), the options they share (:mod:`~ttmesh.cli.options`), the one place
that opens a host (:mod:`~ttmesh.cli.hosts`, the only importer of the simulator) and the text
views (:mod:`~ttmesh.cli.views`). Kept light: importing it pulls in click and nothing heavy
(no torch, yaml, rich or psutil), so ``ttmesh --help`` is instant.
"""

from __future__ import annotations

import os
import sys

import click

from ttmesh import __version__
from ttmesh.cli.check import check_cmd
from ttmesh.cli.descriptor import descriptor_cmd
from ttmesh.cli.doctor import doctor_cmd
from ttmesh.cli.hostreport import host_report_cmd
from ttmesh.cli.launch import launch_cmd
from ttmesh.cli.ls import ls_cmd
from ttmesh.cli.options import CONTEXT
from ttmesh.cli.ps import ps_cmd
from ttmesh.cli.rank import rank_cmd
from ttmesh.cli.reset import reset_cmd
from ttmesh.cli.serving import profiles_cmd, stop_cmd
from ttmesh.cli.sim import sim_group
from ttmesh.errors import BAD_INPUT, TTMeshError


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="ttmesh")
def main() -> None:
    """Launch and supervise multi-chip Tenstorrent jobs: one worker per chip.

    \b
    Try it without hardware, on a simulated QuietBox 2:
      ttmesh ls --sim quietbox2
    """


for command in (
    ls_cmd, launch_cmd, ps_cmd, stop_cmd, profiles_cmd, descriptor_cmd, check_cmd, reset_cmd,
    doctor_cmd, sim_group, host_report_cmd, rank_cmd,
):  # fmt: skip
    main.add_command(command)


# --------------------------------------------------------------------------- entry point


def run(args: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code instead of raising SystemExit.

    Every failure is one line on stderr (``ttmesh: what (how to fix it)``) and an exit code;
    with ``--json`` a ``ttmesh.error/1`` document on stdout too. No traceback reaches a user:
    an OSError is the machine's state (a path, a permission), anything else is a bug, said in
    one line (``TTMESH_DEBUG=1`` shows the traceback).
    """
    argv = list(sys.argv[1:] if args is None else args)
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
    except BrokenPipeError:
        return 1
    except OSError as exc:
        from ttmesh.errors import from_os_error

        err = from_os_error(exc)
        return _fail(argv, err.code, err.message, err.hint)
    except Exception as exc:
        if os.environ.get("TTMESH_DEBUG"):
            raise
        what = f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
        return _fail(argv, 1, what, "a bug in ttmesh: rerun with TTMESH_DEBUG=1 and report it")
    return code if isinstance(code, int) else 0


def _fail(argv: list[str], code: int, message: str, hint: str | None) -> int:
    line = f"ttmesh: {message}" + (f" ({hint})" if hint else "")
    try:
        if _json_requested(argv):
            import json

            doc = {"schema": "ttmesh.error/1", "code": code, "message": message, "hint": hint}
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            sys.stdout.flush()
        sys.stderr.write(line + "\n")
    except (OSError, ValueError):
        pass
    return code


def _json_requested(argv: list[str]) -> bool:
    """Did the user ask for --json (among ttmesh's own options, not a launched command's)?"""
    words = argv[: argv.index("--")] if "--" in argv else argv
    if "launch" in words:
        from ttmesh.cli.launch_args import command_start

        at = words.index("launch") + 1
        try:
            end, _ = command_start(launch_cmd.get_params(click.Context(launch_cmd)), argv[at:])
        except TTMeshError:
            end = len(argv) - at
        words = argv[at : at + end]
    return "--json" in words


def entry() -> None:
    code = run()
    # Leave without the interpreter's teardown (tens of milliseconds of module cleanup that
    # delays a launcher's exit): everything ttmesh writes is flushed or closed by now.
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    os._exit(code)
