"""``ttmesh ls``: what a host has."""

from __future__ import annotations

import sys
from typing import Any

import click

from ttmesh.cli.onhosts import hosts_options
from ttmesh.cli.params import CONTEXT, host_options
from ttmesh.errors import TTMeshError


@click.command("ls", context_settings=CONTEXT)
@hosts_options
@host_options
@click.option("--json", "as_json", is_flag=True, help="Print the ttmesh.ls/1 JSON document.")
def ls_cmd(host: Any, as_json: bool) -> int:
    """List the host's chips, who holds or leases them, and their Ethernet links.

    \b
    Chips are named by unique id (ASIC) and PCI address; /dev/tenstorrent/N numbers are shown
    as they are now (they change across resets). Remote chips (the right half of an n300) have
    no PCI address and are reached through their partner. Cables to other hosts are listed by
    this host's end; with --hosts, each cable once with both ends (down from either: down).
    """
    from ttmesh.fabric import listing

    if as_json and host.driver_version() is None:
        from ttmesh.fabric.devices import require_driver
        from ttmesh.render import emit_json

        try:
            require_driver(host)
        except TTMeshError as exc:  # still a valid document: no chips, and why
            emit_json(listing.without_driver(host, str(exc)))
            sys.stderr.write(f"ttmesh: {exc}\n")
            return exc.code
    data = listing.report(host)
    from ttmesh.cli.onhosts import CABLES_META

    click.get_current_context().meta[CABLES_META] = data["cables"]
    if as_json:
        from ttmesh.render import emit_json

        emit_json(data)
        return 0
    from ttmesh.cli.views import ls_text

    click.echo(ls_text(data))
    return 0
