"""``ttmesh _fleet-guard``: a fleet's guard (internal; ``launcher.fleet.guard``).

Started by a fleet's ttmesh with a pipe on standard input; it ends the fleet in ttmesh's place
if ttmesh is killed. Here only because the CLI alone opens a host (a simulated one included).
Not a command for users, so hidden from ``--help``.
"""

from __future__ import annotations

import click

from ttmesh.cli.params import CONTEXT


@click.command("_fleet-guard", context_settings=CONTEXT, hidden=True)
def fleet_guard_cmd() -> int:
    """Guard a fleet: read its pipe on standard input; end the fleet if its ttmesh dies."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.launcher.fleet import guard

    return guard.main(lambda root: open_host(root))
