"""The tables ``tt-smi -ls`` prints, laid out as rich lays them out (standard library only).

tt-smi 6.8.0 prints its board lists with rich (``backend.py``,
``print_all_available_devices_umd``: ``rich.table.Table`` with its defaults, printed on
``rich.get_console()``). With no terminal rich draws no colour, but it still fits the table to
the console's width (``COLUMNS``, else the terminal of stdin, stdout or stderr, else 80
columns): cells that do not fit are cut with ``…``, headers wrap at spaces. So at 80 columns a
real ``tt-smi -ls | cat`` shows ``0000:01:0…`` for a PCI address, and scripts that grep it
break; the stand-in prints the same bytes. This is rich 13-15's layout (``table.py``
``_calculate_column_widths``, ``_collapse_widths``, ``_render``; ``_ratio.py`` ``ratio_reduce``;
``_wrap.py`` ``divide_line``; ``text.py`` ``wrap`` and ``truncate``; ``padding.py``;
``segment.py``; ``cells.py`` ``set_cell_size``) for plain text cells, checked against rich
itself by tests/test_tt_smi_conformance.py. Box characters as ``box.HEAVY_HEAD``; ``box.ASCII``
when the output's encoding is not UTF (rich's ``Box.substitute``).
"""

from __future__ import annotations

import itertools
import os
import re
import sys

HEAVY_HEAD = ("┏━┳┓", "┃ ┃┃", "┡━╇┩", "│ ││", "├─┼┤", "├─┼┤", "│ ││", "└─┴┘")
ASCII = ("+--+", "| ||", "|-+|", "| ||", "|-+|", "|-+|", "| ||", "+--+")
ELLIPSIS = "…"
PAD = 1  # rich's default cell padding (0, 1): one space either side
_WORD = re.compile(r"\s*\S+\s*")
_SINGLE = frozenset(
    chr(c)
    for lo, hi in ((0x20, 0x7E), (0xA0, 0xAC), (0xAE, 0x2FF), (0x370, 0x482), (0x2500, 0x25FC))
    for c in range(lo, hi + 1)
)


def console_width(environ: dict[str, str] | None = None) -> int:
    """The width rich's console takes (``Console.__init__`` and ``size``): ``COLUMNS`` when it
    is digits (0 too: then nothing is printed), but 80 on a dumb terminal unless ``LINES`` is
    digits as well; else the terminal of stdin, stdout or stderr, else 80."""
    env = os.environ if environ is None else environ
    columns, lines = env.get("COLUMNS", ""), env.get("LINES", "")
    fixed = int(columns) if columns.isdigit() else None
    if fixed is not None and lines.isdigit():
        return fixed
    if env.get("TERM", "").lower() in ("dumb", "unknown") and sys.stdout.isatty():
        return 80
    if fixed is not None:
        return fixed
    width = 0
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
        except (OSError, ValueError):
            continue
        break
    return width or 80


def _set_cell_size(text: str, total: int) -> str:
    """cells.set_cell_size for text of single-cell characters (and rich's slice for a
    negative total), else by characters."""
    if _SINGLE.issuperset(text):
        return text + " " * (total - len(text)) if len(text) < total else text[:total]
    if total <= 0:
        return ""
    return text + " " * (total - len(text)) if len(text) < total else text[:total]


def _truncate(line: str, width: int, pad: bool, overflow: str = "ellipsis") -> str:
    """Text.truncate."""
    length = len(line)
    if length > width:
        if overflow == "ellipsis":
            line = _set_cell_size(line, width - 1) + ELLIPSIS
        else:
            line = _set_cell_size(line, width)
    if pad and length < width:
        line = line + " " * (width - length)
    return line


def _divide_line(text: str, width: int, fold: bool) -> list[int]:
    """_wrap.divide_line: where a line of ``text`` breaks to fit ``width``."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group(0)
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width:
            if fold:
                pieces = [word[i : i + width] for i in range(0, len(word), width)] if width else []
                for n, piece in enumerate(pieces):
                    if start:
                        breaks.append(start)
                    if n == len(pieces) - 1:
                        offset = len(piece)
                    else:
                        start += len(piece)
            else:
                if start:
                    breaks.append(start)
                offset = len(word)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return breaks


def _rstrip_end(line: str, size: int) -> str:
    """Text.rstrip_end: trailing whitespace beyond ``size`` removed."""
    if len(line) > size:
        spaces = len(line) - len(line.rstrip())
        if spaces:
            line = line[: len(line) - min(spaces, len(line) - size)]
    return line


def _wrap(text: str, width: int, justify: str, overflow: str) -> list[str]:
    """Text.wrap of a plain text: its lines at ``width``, justified."""
    out: list[str] = []
    for line in text.split("\n"):
        offsets = _divide_line(line, width, fold=overflow == "fold")
        edges = [0, *offsets, len(line)]
        pieces = [_rstrip_end(line[a:b], width) for a, b in itertools.pairwise(edges)]
        if justify == "left":
            pieces = [_truncate(p, width, True, overflow) for p in pieces]
        else:  # center
            centred = []
            for p in pieces:
                p = _truncate(p.rstrip(), width, False, overflow)
                p = " " * ((width - len(p)) // 2) + p
                centred.append(p + " " * (width - len(p)))
            pieces = centred
        out.extend(_truncate(p, width, False, overflow) for p in pieces)
    return out


def _fit(line: str, length: int, pad: bool = True) -> str:
    """Segment.adjust_line_length of a line of plain text."""
    if len(line) < length:
        return line + " " * (length - len(line)) if pad else line
    if len(line) > length:
        return _set_cell_size(line, length)
    return line


def _measure(text: str, max_width: int) -> tuple[int, int]:
    """Measurement.get of a cell, Padding((0, 1)) around the text."""
    if max_width < 1:
        return 0, 0
    if max_width - 2 * PAD < 1:
        lo, hi = max_width, max_width
    else:
        words = text.split()
        longest = max((len(line) for line in text.splitlines()), default=0)
        lo, hi = (max(len(w) for w in words) if words else longest), longest
        lo, hi = _normal(lo, hi, max_width)
        if hi < 1:
            lo, hi = 0, 0
        lo, hi = min(lo + 2 * PAD, max_width), min(hi + 2 * PAD, max_width)
    lo, hi = _normal(lo, hi, max_width)
    if hi < 1:
        return 0, 0
    return _normal(lo, hi, hi)


def _normal(lo: int, hi: int, cap: int) -> tuple[int, int]:
    """Measurement.normalize().with_maximum(cap)."""
    lo = min(max(0, lo), hi)
    lo, hi = max(0, lo), max(0, max(lo, hi))
    return min(lo, cap), min(hi, cap)


def _column(cells: list[str], max_width: int) -> tuple[int, int]:
    """Table._measure_column."""
    if max_width < 1:
        return 0, 0
    sizes = [_measure(c, max_width) for c in cells]
    lo = max(s[0] for s in sizes) if sizes else 1
    hi = max(s[1] for s in sizes) if sizes else max_width
    return min(lo, max_width), min(hi, max_width)


def _ratio_reduce(
    total: int, ratios: list[int], maximums: list[int], values: list[int]
) -> list[int]:
    ratios = [r if m else 0 for r, m in zip(ratios, maximums, strict=True)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return values[:]
    remaining = total
    out = []
    for ratio, maximum, value in zip(ratios, maximums, values, strict=True):
        if ratio and total_ratio > 0:
            taken = min(maximum, round(ratio * remaining / total_ratio))
            out.append(value - taken)
            remaining -= taken
            total_ratio -= ratio
        else:
            out.append(value)
    return out


def _collapse(widths: list[int], max_width: int) -> list[int]:
    """Table._collapse_widths with every column wrapable."""
    total = sum(widths)
    excess = total - max_width
    while total and excess > 0:
        widest = max(widths)
        second = max((w if w != widest else 0) for w in widths)
        difference = widest - second
        ratios = [1 if w == widest else 0 for w in widths]
        if not any(ratios) or not difference:
            break
        widths = _ratio_reduce(excess, ratios, [min(excess, difference)] * len(widths), widths)
        total = sum(widths)
        excess = total - max_width
    return widths


def _widths(columns: list[list[str]], max_width: int) -> list[int]:
    """Table._calculate_column_widths (no expand, no fixed or minimum widths)."""
    widths = [_column(c, max_width)[1] or 1 for c in columns]
    if sum(widths) > max_width:
        widths = _collapse(widths, max_width)
        if sum(widths) > max_width:
            excess = sum(widths) - max_width
            widths = _ratio_reduce(excess, [1] * len(widths), widths, widths)
        widths = [_column(c, w)[1] or 0 for c, w in zip(columns, widths, strict=True)]
    return widths


def _cell(text: str, width: int) -> list[str]:
    """A cell's lines at ``width``: Padding((0, 1)) around the text, left-justified, cut
    with an ellipsis (console.render_lines)."""
    if width < 1:
        return []
    inner = width - 2 * PAD
    lines = _wrap(text, inner, "left", "ellipsis") if inner >= 1 else []
    return [_fit(" " * PAD + line + " " * PAD, width) for line in lines]


def render(
    title: str, header: list[str], rows: list[list[str]], width: int, ascii_only: bool
) -> str:
    """``console.print(Table(title=title))`` of plain-text cells, on a console ``width``
    columns wide: the lines rich writes, each ending in a newline."""
    if width < 1:
        return ""  # console.render renders nothing in no space
    box = ASCII if ascii_only else HEAVY_HEAD
    columns = [[h, *(r[i] for r in rows)] for i, h in enumerate(header)]
    extra = 2 + len(header) - 1  # the edges and the lines between columns
    widths = _widths(columns, width - extra)
    table_width = sum(widths) + extra
    lines: list[str] = []
    if title and table_width >= 1:
        lines += _wrap(title, table_width, "center", "fold")
    top, head, head_row, mid, _row, _foot_row, foot, bottom = box

    def edge(chars: str) -> str:  # Box.get_top, get_row, get_bottom: end, fill, cross, end
        return chars[0] + chars[2].join(chars[1] * w for w in widths) + chars[3]

    lines.append(edge(top))
    for index, row in enumerate([header, *rows]):
        cells = [_cell(text, w) for text, w in zip(row, widths, strict=True)]
        height = max(1, *(len(c) for c in cells))
        shaped = []
        for lines_of, w in zip(cells, widths, strict=True):
            blank = [" " * w] * (height - len(lines_of))
            shaped.append(blank + lines_of if index == 0 else lines_of + blank)
        ends = (
            head if index == 0 else (mid if index < len(rows) else foot)
        )  # left, _, divider, right
        for n in range(height):
            lines.append(ends[0] + ends[2].join(c[n] for c in shaped) + ends[3])
        if index == 0:
            lines.append(edge(head_row))
    lines.append(edge(bottom))
    return "".join(_fit(line, width, pad=False) + "\n" for line in lines)
