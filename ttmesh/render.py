"""Output shared by every layer: tables, JSON documents, ttmesh's own one-line messages.

Tables are drawn with rich on a terminal and as plain aligned columns when piped (the same
cells either way); rich is imported only to draw. ``NO_COLOR`` or ``TERM=dumb`` keep them plain.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

PIPE_WIDTH = 160  # the width a fitted table takes in a pipe (when COLUMNS does not say)


def plural(n: int, word: str, many: str | None = None) -> str:
    """A count and its noun, agreeing: ``1 chip``, ``4 chips``, ``0 chips`` (``many``: an
    irregular plural). Every count ttmesh prints goes through here: no "1 chips", and no
    "(s)" after a noun."""
    return f"{n} {noun(n, word, many)}"


def noun(n: int, word: str, many: str | None = None) -> str:
    """The noun alone for ``n`` things (``ranks 0, 1``, ``rank 3``)."""
    return word if n == 1 else (many or word + "s")


# A terminal's escape sequences (CSI with its parameters, OSC up to its terminator, the
# two-character ones) and then every other character that is not printable.
_ESCAPES = re.compile(
    r"\x1b\[[0-9;?<=>]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?|\x9b[0-9;?]*[ -/]*[@-~]?"
)


def clock(seconds: float) -> str:
    """A duration or a time since, in the one format ttmesh uses everywhere (lines, live views,
    the checklist): ``0.6 s``, ``40.5 s``, ``3:07``, ``1:02:03``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}:{secs:02d}"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def printable(text: str) -> str:
    """A line another program wrote (a server's last line, a router's log) as one table cell:
    its colours and other escape sequences dropped, tabs and newlines a space, any other
    control or invisible character ``\\xNN``. Such a line must never reach a terminal raw: it
    could move the cursor, retitle the window, or hide what follows."""
    text = _ESCAPES.sub("", text).replace("\t", " ").replace("\n", " ").replace("\r", " ")
    return "".join(c if c.isprintable() or c == " " else _code(c, "x") for c in text).strip()


def escaped(text: str) -> str:
    """A value someone else wrote (a capture's host name, a file's field) as one line showing
    what it holds: every control or invisible character as its code (a newline ``\\x0a``,
    so no second line can pose as one of ttmesh's; an escape ``\\x1b``, which the terminal
    then does not act on), a byte that was not UTF-8 (decoded with ``surrogateescape``, as
    Python decodes argv, the environment and file names) as ``\\xNN`` of that byte."""
    return "".join(c if c.isprintable() else _code(c, "u") for c in text)


def _code(c: str, wide: str) -> str:
    """``c`` spelled out: ``\\xNN``; above U+00FF ``\\uNNNN`` (``wide`` "u") or ``\\xNNNN``."""
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # surrogateescape's stand-in for the byte n - 0xDC00
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\{wide}{n:04x}"


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, with an ellipsis when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def fit(
    lines: list[list[str]],
    width: int,
    keep: Sequence[int] = (),
    gap: int = 2,
    least: int = 8,
    floors: Mapping[int, int] | None = None,
    left: Sequence[int] = (),
) -> list[list[str]]:
    """Rows (the first is the header) cut to ``width`` columns: the widest cells shrink
    first, no column below its header or ``least`` characters (or its ``floors`` entry: the
    start of a cell that must stay whole, like a URL), and the columns in ``keep`` (a name
    the user types again, like a job id) never; a column in ``left`` loses its start, not
    its end (a path: its last names tell it apart). One long value (a state, a command) must
    not make every row of a listing hundreds of columns wide."""
    if not lines:
        return lines
    n = len(lines[0])
    widths = [max(len(row[i]) for row in lines) for i in range(n)]
    floor = [
        widths[i]
        if i in keep
        else min(widths[i], max(len(lines[0][i]), least, (floors or {}).get(i, 0)))
        for i in range(n)
    ]
    excess = sum(widths) + gap * (n - 1) - width
    while excess > 0:
        i = max(range(n), key=lambda k: widths[k] - floor[k])
        room = widths[i] - floor[i]
        if room <= 0:
            break
        others = sorted((widths[k] - floor[k] for k in range(n) if k != i), reverse=True)
        step = min(room, excess, max(room - (others[0] if others else 0), 1))
        widths[i] -= step
        excess -= step
    return [
        [
            clip_left(cell, widths[i]) if i in left else clip(cell, widths[i])
            for i, cell in enumerate(row)
        ]
        for row in lines
    ]


def clip_left(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters from the left, with an ellipsis when cut."""
    return text if len(text) <= width else "…" + text[len(text) - max(width - 1, 0) :]


def width() -> int:
    """The columns a table may take: the terminal's, else ``COLUMNS``, else :data:`PIPE_WIDTH`."""
    import shutil

    return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    stream: IO[str] | None = None,
    fitted: bool = False,
    keep: Sequence[int] = (),
    floors: Mapping[int, int] | None = None,
    left: Sequence[int] = (),
) -> str:
    """``rows`` under ``headers``, for printing to ``stream`` (stdout by default); ``fitted``:
    cut to the terminal's width (:func:`fit`, ``keep``: columns never cut), for listings
    whose cells can be long."""
    cells = [["-" if v is None else str(v) for v in r] for r in rows]
    drawing = _drawing(stream or sys.stdout)
    if fitted:  # rich puts 3 columns between cells (its padding and the box's separator)
        lines = fit(
            [[str(h) for h in headers], *cells], width(), keep, 3 if drawing else 2,
            floors=floors, left=left,
        )  # fmt: skip
        headers, cells = lines[0], lines[1:]
    if drawing:
        return _rich_table([str(h) for h in headers], cells, fitted, keep)
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


def _rich_table(
    headers: list[str], cells: list[list[str]], fitted: bool = False, keep: Sequence[int] = ()
) -> str:
    import io
    import shutil

    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    for i, h in enumerate(headers):
        if fitted:
            whole = max([len(h)] + [len(row[i]) for row in cells]) if i in keep else None
            t.add_column(h, overflow="ellipsis", no_wrap=True, min_width=whole)
        else:
            t.add_column(h, overflow="fold")
    for row in cells:
        t.add_row(*row)
    buffer = io.StringIO()
    width = shutil.get_terminal_size((120, 24)).columns
    # Cells are text, never rich markup or emoji codes: a "[/x]" in a job's command or a
    # server's last line would otherwise raise, or turn into colours.
    Console(
        file=buffer, force_terminal=True, width=width, highlight=False, markup=False, emoji=False
    ).print(t)
    return buffer.getvalue().rstrip("\n")


def emit_json(data: Any) -> None:
    sys.stdout.write(json_text(data, indent=2) + "\n")


def json_text(data: Any, **options: Any) -> str:
    """``data`` as JSON (``json.dumps`` with ``options``) that every reader decodes, for every
    JSON document ttmesh writes for others. Python decodes argv, the environment and file
    names with ``surrogateescape``: a byte that is not UTF-8 (0xff in a command line) becomes
    a lone surrogate (U+DCFF), which ``json.dumps`` writes as ``\\udcff``, and which UTF-8 and
    strict JSON readers refuse. Each such character is written as U+FFFD (the replacement
    character, as a UTF-8 decoder shows a bad byte) instead."""
    text = json.dumps(data, **options)
    if "\\ud" not in text:  # no surrogate written (the common case: no second pass)
        return text
    return json.dumps(_without_surrogates(data), **options)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_surrogates(data: Any) -> Any:
    if isinstance(data, str):
        return _SURROGATE.sub("\ufffd", data)
    if isinstance(data, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_without_surrogates(v) for v in data]
    return data


def note(message: str) -> None:
    """One of ttmesh's own messages: stderr, prefixed, one line (what it quotes of others, a
    file's field or a server's complaint, :func:`escaped`: no second line posing as ttmesh's).
    A closed stderr (the reader of a pipe is gone, e.g. after ttmesh itself was killed)
    silences further messages, never raises."""
    try:
        sys.stderr.write(f"ttmesh: {escaped(message)}\n")
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
