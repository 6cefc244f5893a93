"""Plain-text output helpers shared by the commands (no third-party imports)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


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
