"""``ttmesh launch`` takes its options, then the command: where one ends and the other begins.

The command's own arguments are passed through untouched, so the launcher cannot let click guess:
an option-looking word before the command is one of ttmesh's options or a mistake. A mistake is
said plainly (exit 2), with the nearest option ttmesh has, and torchrun's flags that ttmesh does
not take say what to do instead.
"""

from __future__ import annotations

from typing import NoReturn

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
    among ``params`` (nor a prefix of one of torchrun's flags) is bad input."""
    end, start, _ = _walk(params, args)
    return end, start


def spelled_out(params: list[click.Parameter], args: list[str]) -> list[str]:
    """``args`` (ttmesh's options) as click takes them: each abbreviated torchrun flag written
    in full (``--redirect=3`` -> ``--redirects=3``), and a short option's ``=`` dropped
    (``-r=3`` -> ``-r3``: argparse reads 3, click would read "=3")."""
    _, _, rewritten = _walk(params, args)
    return [rewritten.get(i, token) for i, token in enumerate(args)]


def _walk(params: list[click.Parameter], args: list[str]) -> tuple[int, int, dict[int, str]]:
    """command_start's (end, start), and the words click must read otherwise (index -> word)."""
    known = _options(params)
    rewritten: dict[int, str] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return i, i + 1, rewritten
        if not token.startswith("-") or token == "-":
            return i, i, rewritten
        name, eq, value = token.partition("=")
        if not token.startswith("--") and len(token) > 2 and known.get(token[:2]):
            # a short option and its value in one word (-r3, -r=3), as argparse takes it
            if token[2] == "=":
                rewritten[i] = token[:2] + token[3:]
            i += 1
            continue
        full = _resolve(name, known)
        if full != name:
            rewritten[i] = full + eq + value
        i += 2 if known[full] and not eq else 1
    return len(args), len(args), rewritten


def _resolve(name: str, known: dict[str, bool]) -> str:
    """``name`` as one of ``known``: itself, or the torchrun flag it abbreviates.

    torchrun's argparse takes any prefix of a long option that no other long option of its
    has (``--redirect 3``, ``--nproc_per 2``; Python's ``ArgumentParser(allow_abbrev=True)``),
    and refuses one that several have, naming them, both spellings of one flag included
    (``--nproc``: ``--nproc-per-node, --nproc_per_node``). ttmesh takes the prefixes of
    torchrun's flags the same way, judged over every long option of ``ttmesh launch`` (so
    ``--t``, torchrun's ``--tee``, is ambiguous here with ``--tp-size``); its own options are
    spelled out."""
    if name in known:
        return name
    if name.startswith("--") and len(name) > 2:
        from ttmesh.cli.torchrun import FLAGS, underscore

        matches = [k for k in known if k.startswith(name)]
        torchrun = {*FLAGS, *(underscore(f) for f in FLAGS)}
        if any(m in torchrun for m in matches):
            if len(matches) > 1:
                raise bad_input(
                    f"ambiguous option: {name} could match {', '.join(matches)}",
                    "spell the option out: a prefix is taken only when one option starts with it",
                )
            return matches[0]
    _unknown(name, known)


class LaunchCommand(SectionedCommand):
    """A click command whose trailing argument is a command line passed through untouched
    (its --help in sections)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        params = self.get_params(ctx)
        end, start = command_start(params, args)
        mine = spelled_out(params, args[:end])
        return super().parse_args(ctx, [*mine, "--", *args[start:]])


def _unknown(name: str, known: dict[str, bool]) -> NoReturn:
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
