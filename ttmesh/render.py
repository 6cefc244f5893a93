"""Output shared by every layer: tables, JSON documents, ttmesh's own one-line messages.

Tables are drawn with rich on a terminal and as plain aligned columns when piped (the same
cells either way); rich is imported only to draw. ``NO_COLOR`` or ``TERM=dumb`` keep them plain.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import IO, Any


def table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], stream: IO[str] | None = None
) -> str:
    """``rows`` under ``headers``, for printing to ``stream`` (stdout by default)."""
    cells = [["-" if v is None else str(v) for v in r] for r in rows]
    if _drawing(stream or sys.stdout):
        return _rich_table([str(h) for h in headers], cells)
    lines = [[str(h) for h in headers], *cells]
    widths = [max(len(row[i]) for row in lines) for i in range(len(headers))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in lines
    )


def _drawing(stream: IO[str]) -> bool:
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _rich_table(headers: list[str], cells: list[list[str]]) -> str:
    import io
    import shutil

    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    for h in headers:
        t.add_column(h, overflow="fold")
    for row in cells:
        t.add_row(*row)
    buffer = io.StringIO()
    width = shutil.get_terminal_size((120, 24)).columns
    Console(file=buffer, force_terminal=True, width=width, highlight=False).print(t)
    return buffer.getvalue().rstrip("\n")


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def note(message: str) -> None:
    """One of ttmesh's own messages: stderr, prefixed. A closed stderr (the reader of a pipe
    is gone, e.g. after ttmesh itself was killed) silences further messages, never raises."""
    try:
        sys.stderr.write(f"ttmesh: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        silence_stderr()


def silence_stderr() -> None:
    """Point stderr (fd 2 and sys.stderr) at /dev/null."""
    import os

    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    except OSError:
        pass
