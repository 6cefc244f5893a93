"""Known Tenstorrent failures, explained from the last lines a failing process printed.

The table is data, ``ttmesh/configs/failures.yaml``: per entry a pattern, the cause, a fix a user
can run as printed and the public issue where users met it. Only a failure pays for it: the
guardian reads and compiles the table (once) when an attempt ends badly and sends the entry that
matched back with the attempt's result (:func:`match`); the launcher fills the fix in for the
job's host and chips (:func:`explain`). A job that succeeds never reads it, nor imports yaml.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh.dataclass import dataclass
from ttmesh.patterns import Matcher, PatternError, compile_pattern

if TYPE_CHECKING:
    from ttmesh.fabric.devices import Inventory

TABLE = Path(__file__).resolve().parents[2] / "configs" / "failures.yaml"
FIELDS = ("id", "pattern", "cause", "fix", "link")
OPTIONAL = ("also",)
PLACEHOLDERS = frozenset({"reset", "flag"})  # what a fix may name: see the table's header
MAX_LINE = 300  # a matched line longer than this is cut for the summary
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass(frozen=True)
class Entry:
    id: str
    regex: Matcher  # RE2: linear in the line, as every pattern ttmesh matches (ttmesh.patterns)
    cause: str
    fix: str  # with placeholders
    link: str
    also: tuple[str, ...] = ()


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key!r} must be a non-empty string")
    return " ".join(value.split())


def parse(data: Any, source: str = "the failure table") -> tuple[Entry, ...]:
    """The table's entries, checked; ``ValueError`` names the first thing wrong."""
    items = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{source}: expected 'entries:', a list of failures")
    out: list[Entry] = []
    for i, item in enumerate(items):
        where = f"{source}, entry {i + 1}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a mapping")
        unknown = sorted(set(item) - set(FIELDS) - set(OPTIONAL))
        if unknown:
            raise ValueError(
                f"{where}: unknown {'key' if len(unknown) == 1 else 'keys'} {', '.join(unknown)}"
            )
        ident = _text(item, "id", where)
        where = f"{source}, {ident}"
        if any(e.id == ident for e in out):
            raise ValueError(f"{where}: the id is used twice")
        try:
            regex = compile_pattern(str(item.get("pattern") or ""), ignore_case=True)
        except PatternError as exc:
            raise ValueError(f"{where}: pattern does not compile: {exc}") from None
        if not regex.pattern or regex.search(""):
            raise ValueError(f"{where}: the pattern matches every line")
        fix = _text(item, "fix", where)
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(fix) if name is not None}
        except ValueError as exc:
            raise ValueError(f"{where}: fix: {exc} (write a literal brace twice)") from None
        if names - PLACEHOLDERS:
            raise ValueError(
                f"{where}: fix names {', '.join(sorted(names - PLACEHOLDERS))}; "
                f"placeholders are {', '.join(sorted(PLACEHOLDERS))}"
            )
        links = [_text(item, "link", where), *_links(item.get("also", []), where)]
        for link in links:
            if not link.startswith("https://github.com/"):
                raise ValueError(f"{where}: {link!r} is not a GitHub address")
        out.append(
            Entry(ident, regex, _text(item, "cause", where), fix, links[0], tuple(links[1:]))
        )
    return tuple(out)


def _links(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: 'also' must be a list of addresses")
    return list(value)


@cache
def table() -> tuple[Entry, ...]:
    """The packaged table, read and compiled once (on the first failure)."""
    from ttmesh import yamlio

    return parse(yamlio.load_cached(TABLE, "the failure table"), str(TABLE))


def clean(line: str) -> str:
    """A line as a user reads it: no terminal colours, no trailing blanks."""
    return _ANSI.sub("", line).rstrip()


def match(streams: Iterable[tuple[str, Sequence[str]]]) -> dict[str, Any] | None:
    """The first entry, in the table's order, that a line of ``streams`` (``(where, lines)``,
    most telling first) matches: ``{id, cause, fix, link, also, line, where}``, the fix with its
    placeholders; None when no line is known."""
    lines = [(where, clean(line)) for where, seq in streams for line in seq]
    if not lines:
        return None
    for entry in table():
        for where, line in lines:
            if entry.regex.search(line):
                return {
                    "id": entry.id,
                    "cause": entry.cause,
                    "fix": entry.fix,
                    "link": entry.link,
                    "also": list(entry.also),
                    "line": line.strip()[:MAX_LINE],
                    "where": where,
                }
    return None


@dataclass(frozen=True)
class Diagnosis:
    """A known failure, its fix filled in for the job's host and chips."""

    id: str
    cause: str
    fix: str
    link: str
    line: str
    where: str
    also: tuple[str, ...] = ()

    def to_json(self) -> dict[str, str]:
        """The ``diagnosis`` of ``--summary-json``."""
        return {
            "id": self.id,
            "cause": self.cause,
            "fix": self.fix,
            "link": self.link,
            "line": self.line,
        }

    def lines(self) -> list[str]:
        """What the failure summary says about it."""
        see = self.link + "".join(f", {a}" for a in self.also)
        return [
            f"known failure ({self.id}): {self.cause}",
            f"  seen in {self.where}: {self.line}",
            f"  fix: {self.fix}",
            f"  see {see}",
        ]


def explain(found: dict[str, Any] | None, inv: Inventory, chips: Sequence[str]) -> Diagnosis | None:
    """``found`` (from :func:`match`) with its fix filled in: ``{reset}`` resets ``chips`` and
    what is linked to them, ``{flag}`` names the host as the user did."""
    if not found:
        return None
    from ttmesh.fabric import health

    flag = health.root_flag(inv.host)
    values = {"flag": flag, "reset": ""}
    template = str(found["fix"])
    if "{reset}" in template:
        values["reset"] = health.reset_fix(inv, chips, inv.links) or f"ttmesh reset{flag}"
    return Diagnosis(
        id=str(found["id"]),
        cause=str(found["cause"]),
        fix=template.format(**values),
        link=str(found["link"]),
        line=str(found["line"]),
        where=str(found["where"]),
        also=tuple(found.get("also") or ()),
    )


def where(owner: int, stream: str, server: str | None = None) -> str:
    """``rank 2's stderr``, ``mpirun's stdout``, ``the sglang server's stderr``."""
    if owner < 0:
        return f"mpirun's {stream}"
    if server is not None:
        return f"the {server} server's {stream}"
    return f"rank {owner}'s {stream}"


def tails(
    owners: Iterable[int], tail: Callable[[int, str], list[str]], server: str | None = None
) -> list[tuple[str, list[str]]]:
    """``(where, lines)`` for each owner's stderr then stdout, as :func:`match` takes them;
    ``tail(owner, stream)`` gives the lines."""
    return [
        (where(owner, name, server), tail(owner, name))
        for owner in owners
        for name in ("stderr", "stdout")
    ]
