"""``ttmesh _rank -- COMMAND``: one rank of a tt-metal mesh over several hosts, on its host
(internal: the job's mpirun starts it; see ttmesh.launcher.nodes.rankshim). Hidden from ``--help``."""

from __future__ import annotations

from typing import Any

import click

from ttmesh.cli.params import CONTEXT, host_options


@click.command(
    "_rank",
    context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False},
    hidden=True,
)
@host_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def rank_cmd(host: Any, command: tuple[str, ...]) -> int:
    """Do this host's duties for one rank (files, leases, pre-flight), then run COMMAND."""
    from ttmesh.launcher.nodes import rankshim

    return rankshim.run(host, list(command))
