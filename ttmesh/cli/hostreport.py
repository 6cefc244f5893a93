"""``ttmesh _host-report``: this host's chips, links and cables as one line of JSON (internal).

Started on every host of a tt-metal mesh over several hosts, through mpirun, by the launching
ttmesh (ttmesh.launcher.nodes.meshhosts); not a command for users, so hidden from ``--help``.
"""

from __future__ import annotations

from typing import Any

import click

from ttmesh.cli.params import CONTEXT, host_options


@click.command("_host-report", context_settings=CONTEXT, hidden=True)
@host_options
def host_report_cmd(host: Any) -> None:
    """Print this host's report for a job over several hosts (TTMESH-HOST-REPORT {json})."""
    from ttmesh.launcher.nodes import hostreport

    click.echo(hostreport.line(host))
