"""``ttmesh launch`` takes its options, then the command: where one ends and the other begins.

The command's own arguments are passed through untouched, so the launcher cannot let click guess:
an option-looking word before the command is one of ttmesh's options or a mistake. A mistake is
said plainly (exit 2), with the nearest option ttmesh has, and torchrun's flags that ttmesh does
not take say what to do instead.
"""

from __future__ import annotations

import click

from ttmesh.cli.helpsections import SectionedCommand
from ttmesh.errors import bad_input

# torchrun's flags that ttmesh does not take (yet), and what to do instead. Every other flag of
# torchrun 2.13 is taken: ttmesh.cli.torchrun.
TORCHRUN = {
    "--max-nodes": "ttmesh runs a fixed number of hosts (--nnodes N): drop it",
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


class LaunchCommand(SectionedCommand):
    """A click command whose trailing argument is a command line passed through untouched
    (its --help in sections)."""

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
