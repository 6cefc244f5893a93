"""What every command shares: context settings, the host options, parsed option values."""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import click

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


def shape(value: str | None) -> tuple[int, int] | None:
    """``--mesh-shape RxC``."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", value)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise bad_input(f"--mesh-shape {value!r}: expected ROWSxCOLS", "e.g. --mesh-shape 2x2")
    return int(match.group(1)), int(match.group(2))
