"""``ttmesh top``: the chips' telemetry and who has them, refreshed."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from ttmesh.cli.params import CONTEXT, host_options, seconds
from ttmesh.render import plural


@click.command("top", context_settings=CONTEXT)
@host_options
@click.option(
    "--interval",
    type=seconds(zero=False, high=86400, example="2"),
    default=2.0,
    show_default=True,
    metavar="S",
    help="Seconds between samples.",
)
@click.option("--once", is_flag=True, help="Print one sample and exit.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one sample as the ttmesh.top/1 JSON document."
)
@click.option(
    "--tt-smi",
    "tt_smi",
    metavar="PATH",
    help="The tt-smi to read telemetry with (default: $TTMESH_TT_SMI, the simulated host's, "
    "or PATH).",
)
@click.option(
    "--no-live",
    is_flag=True,
    help="On a terminal, print a table per sample instead of redrawing one.",
)
def top_cmd(
    host: Any, interval: float, once: bool, as_json: bool, tt_smi: str | None, no_live: bool
) -> int:
    """Show every chip's telemetry, refreshed: temperature, power, clock (AICLK), heartbeat,
    Ethernet links up, and the job leasing the chip or the processes holding it.

    \b
    Telemetry comes from the host's `tt-smi -s` (a simulated host's tt-smi reports its
    simulated chips); without tt-smi, from the driver's files where it has them, else "-".
    The heartbeat is alive when its counter moved since the previous sample. On a terminal
    the table is redrawn in place until Ctrl-C; in a pipe a table is printed per sample.

    \b
    Examples:
      ttmesh top --sim quietbox2
      ttmesh top --once
      ttmesh top --interval 5
      ttmesh top --json > snapshot.json
    """
    from ttmesh.cli.streams import live_enabled as enabled
    from ttmesh.recovery.top import Sampler

    sampler = Sampler(host, tt_smi)
    if as_json:
        from ttmesh.render import emit_json

        emit_json(sampler.sample())
        return 0
    from ttmesh.cli.views import top_text

    if once:
        click.echo(top_text(sampler.sample()))
        return 0
    try:
        if enabled(sys.stdout, no_live):
            _live(sampler, interval)
        else:
            while True:
                started = time.monotonic()
                click.echo(top_text(sampler.sample()) + "\n")
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass  # the way to leave top
    return 0


def _live(sampler: Any, interval: float) -> None:
    """One table redrawn in place, each sample."""
    from ttmesh.cli.live import Screen
    from ttmesh.cli.views import TOP_HEADERS, top_rows

    frame: dict[str, Any] = {}

    def render() -> Any:
        from rich import box
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        when = time.strftime("%H:%M:%S", time.localtime(frame["time"]))
        head = Text()
        head.append("ttmesh top", style="bold")
        head.append(
            f" · {frame['host']['root']} · {plural(len(frame['chips']), 'chip')} · telemetry from "
            f"{frame['source']} · every {interval:g}s · {when} (Ctrl-C to leave)"
        )
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
        for name in TOP_HEADERS:
            table.add_column(name, no_wrap=True, overflow="ellipsis")
        for row in top_rows(frame):
            style = {"frozen": "bold red", "alive": "green"}.get(row[6], "")
            table.add_row(
                *(Text(cell, style=style if i == 6 else "") for i, cell in enumerate(row))
            )
        notes = [Text(f"note: {n}", style="dim") for n in frame["notes"]]
        return Group(head, table, *notes)

    frame.update(sampler.sample())
    screen = Screen(sys.stdout, render, ("stderr",))
    screen.start()
    try:
        while True:
            time.sleep(max(0.0, interval - (time.time() - frame["time"])))
            frame.update(sampler.sample())
            screen.redraw()
    finally:
        screen.stop()
