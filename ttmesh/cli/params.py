"""What every command shares: context settings, the host options, parsed option values."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from ttmesh import numeric
from ttmesh.errors import bad_input

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def host_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--sim / --root, resolved into a ``host`` keyword argument."""

    @click.option(
        "--sim",
        "sim_name",
        metavar="NAME",
        help="Use a simulated host of stock system NAME (created once under ~/.cache/ttmesh/sim); "
        "see `ttmesh sim systems`.",
    )
    @click.option(
        "--root",
        "root",
        metavar="DIR",
        envvar="TTMESH_ROOT",
        help="Read the host under DIR (a simulated root, or / for this machine). Env: TTMESH_ROOT.",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, sim_name: str | None, root: str | None, **kwargs: Any) -> Any:
        return fn(*args, host=resolve_host(sim_name, root), **kwargs)

    return wrapper


def resolve_host(sim_name: str | None, root: str | None) -> Any:
    """The host ``--sim NAME`` or ``--root DIR`` names (``/`` when neither is given)."""
    from ttmesh.cli.hosts import cached_sim, open_host

    if sim_name is not None and root is not None and os.environ.get("TTMESH_ROOT") != root:
        raise bad_input("--sim and --root both given", "use one: --sim NAME or --root DIR")
    if sim_name is not None and not sim_name.strip():
        raise bad_input(
            "--sim '': no system named", "e.g. --sim quietbox2 (see ttmesh sim systems)"
        )
    if root is not None and not root.strip():
        raise bad_input("--root '': no directory named", "e.g. --root /tmp/qb2, or omit it for /")
    host = cached_sim(sim_name) if sim_name else open_host(root or "/")
    if host.simulated:
        sys.stderr.write(f"simulated host: {host.root}\n")
    return host


# --------------------------------------------------------------------------- numbers


def spelling(param: click.Parameter, ctx: click.Context | None) -> str:
    """How the user named ``param``: the option spelling they typed (``--shutdown-timeout``,
    not the first alias), the environment variable it came from, or an argument's name."""
    if ctx is not None and ctx.get_parameter_source(param.name or "") is (
        click.core.ParameterSource.ENVIRONMENT
    ):
        envvar = getattr(param, "envvar", None)
        names = [envvar] if isinstance(envvar, str) else list(envvar or [])
        found = [n for n in names if n in os.environ]
        if found:
            return found[0]
    if not isinstance(param, click.Option):  # an argument: named by its command
        return (ctx.info_name if ctx is not None else None) or param.human_readable_name
    argv = ((ctx.find_root().obj if ctx is not None else None) or {}).get("argv") or sys.argv
    words = argv[: argv.index("--")] if "--" in argv else argv
    typed = [w.split("=", 1)[0] for w in words if w.split("=", 1)[0] in param.opts]
    return typed[0] if typed else param.opts[0]


class Number(click.ParamType):
    """A number option or argument read by :func:`ttmesh.numeric.number`: finite, in range,
    plain decimal. A bad value is ttmesh's one line (exit 2) naming the flag as typed, raised
    while click parses, before a host is opened or anything is changed."""

    def __init__(
        self,
        *,
        whole: bool = False,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
        unit: str = "",
        example: str | None = None,
    ) -> None:
        self.whole, self.low, self.high, self.low_open = whole, low, high, low_open
        self.unit, self.example = unit, example
        self.name = "integer" if whole else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        where = spelling(param, ctx) if param is not None else "value"
        example = f"{where} {self.example}" if self.example and where.startswith("-") else None
        return numeric.number(
            value, where, whole=self.whole, low=self.low, high=self.high,
            low_open=self.low_open, unit=self.unit, example=example,
        )  # fmt: skip


def bounded(name: str) -> Number:
    """The type of ``ttmesh launch``'s number option ``name`` (a LaunchOptions field), bounded
    as ``launcher.limits`` says: the one place its range and example are written."""
    from ttmesh.launcher.limits import NUMBERS

    _flag, example, bounds = NUMBERS[name]
    return Number(**bounds, example=example)


def seconds(
    *, zero: bool = True, high: float = numeric.MAX_SECONDS, example: str | None = None
) -> Number:
    """A duration option: ``zero`` False when 0 s makes no sense (a timeout, an interval)."""
    return Number(low=0, low_open=not zero, high=high, unit="seconds", example=example)


def whole(
    *,
    low: int = 0,
    high: int = numeric.MAX_COUNT,
    unit: str = "",
    example: str | None = None,
) -> Number:
    """A count option (chips, restarts, a port): an integer in ``low..high``."""
    return Number(whole=True, low=low, high=high, unit=unit, example=example)
