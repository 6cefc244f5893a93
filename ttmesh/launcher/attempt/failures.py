"""Known Tenstorrent failures: explained from the last lines a failing process printed, and
the ones that cannot wait watched as lines arrive.

The table is data, ``ttmesh/configs/failures.yaml``: per entry a pattern, the cause, a fix a user
can run as printed and the public issue where users met it. The guardian matches it when an
attempt ends badly and sends the entry that matched back with the attempt's result
(:func:`match`); the launcher fills the fix in for the job's host and chips (:func:`explain`).

An entry marked ``live`` is matched as lines arrive (:class:`LiveLines`, with a serving
profile's own ``failures:`` first): ``fatal`` stops the job (a device that threw during its
start leaves the server waiting out its whole ready timeout, tt-studio#1283), ``note`` is said
once. Those are read when the attempt starts; the table is parsed from its cached form (no yaml
import), and matched in whole blocks of output: each entry's ``hint`` words are looked for at C
speed first, and the patterns run only in a block that holds one.
"""

from __future__ import annotations

import re
from _string import formatter_parser  # type: ignore[import-not-found]  # string.Formatter's
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh.dataclass import dataclass
from ttmesh.patterns import Matcher, PatternError, compile_pattern, deferred_pattern
from ttmesh.render import printable

if TYPE_CHECKING:
    from ttmesh.fabric.devices import Inventory

TABLE = Path(__file__).resolve().parents[2] / "configs" / "failures.yaml"
FIELDS = ("id", "pattern", "cause", "fix", "link")
OPTIONAL = ("also", "after_reset", "live", "hint", "source")
LIVE = ("fatal", "note")  # what a line marked live does as it arrives
PLACEHOLDERS = frozenset({"reset", "flag"})  # what a fix may name: see the table's header
MAX_LINE = 300  # a matched line longer than this is cut for the summary
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ANSI_BYTES = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # the same, over a block as it arrives


@dataclass(frozen=True)
class Entry:
    id: str
    regex: Matcher  # RE2: linear in the line, as every pattern ttmesh matches (ttmesh.patterns)
    cause: str
    fix: str  # with placeholders
    link: str
    also: tuple[str, ...] = ()
    after_reset: str | None = None  # the fix once ttmesh reset and verified the chips itself
    live: str | None = None  # fatal | note: matched as lines arrive (None: after the end only)
    hints: tuple[bytes, ...] = ()  # a live entry's words, one of which every line it matches holds
    source: str = ""  # where the line comes from upstream (a fatal line must say)


# When ttmesh reset the job's chips after it ended and verified them, a fix that resets them
# is wrong: the entry's own ``after_reset``, else this.
AFTER_RESET = (
    "nothing to reset now: the job's chips were reset after it ended, and verified "
    "(ttmesh check{flag} shows them); start the job again"
)


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key!r} must be a non-empty string")
    return " ".join(value.split())


def parse(
    data: Any, source: str = "the failure table", deferred: bool = False
) -> tuple[Entry, ...]:
    """The table's entries, checked; ``ValueError`` names the first thing wrong. ``deferred``:
    ttmesh's own table, whose patterns are compiled when first searched (its tests compile them
    all), so a job whose output never holds a live entry's words does not load RE2."""
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
        text = str(item.get("pattern") or "")
        if deferred:
            regex = deferred_pattern(text, ignore_case=True)
        else:
            try:
                regex = compile_pattern(text, ignore_case=True)
            except PatternError as exc:
                raise ValueError(f"{where}: pattern does not compile: {exc}") from None
        if not regex.pattern or (not deferred and regex.search("")):
            raise ValueError(f"{where}: the pattern matches every line")
        fix = _text(item, "fix", where)
        try:
            names = {name for _, name, _, _ in formatter_parser(fix) if name is not None}
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
        after = _text(item, "after_reset", where) if "after_reset" in item else None
        if after is not None and "{reset}" in after:
            raise ValueError(f"{where}: after_reset cannot name {{reset}}: the chips were reset")
        live, hints, source = _live(item, where)
        cause = _text(item, "cause", where)
        out.append(
            Entry(ident, regex, cause, fix, links[0], tuple(links[1:]), after, live, hints,
                  source)
        )  # fmt: skip
    return tuple(out)


MAX_HINT = 200  # characters of one hint word


def _live(item: dict[str, Any], where: str) -> tuple[str | None, tuple[bytes, ...], str]:
    """An entry's ``live`` (fatal | note), its ``hint`` words and its ``source``, checked."""
    live = item.get("live")
    if live is None:
        for key in ("hint",):
            if key in item:
                raise ValueError(f"{where}: {key!r} goes with live: fatal or live: note")
        return None, (), str(item.get("source") or "")
    if live not in LIVE:
        raise ValueError(f"{where}: live must be one of {', '.join(LIVE)}, not {live!r}")
    raw = item.get("hint")
    words = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(words, list)
        or not words
        or not all(isinstance(w, str) and w.strip() and len(w) <= MAX_HINT for w in words)
    ):
        raise ValueError(
            f"{where}: a live entry needs 'hint': a word (or a list of words, each at most "
            f"{MAX_HINT} characters) that every line it matches holds, as the source prints it"
        )
    source = item.get("source")
    if live == "fatal" and not (isinstance(source, str) and source.strip()):
        raise ValueError(
            f"{where}: a fatal line must name its 'source' (the upstream file or issue that "
            "prints it)"
        )
    return str(live), tuple(w.encode() for w in words), " ".join(str(source or "").split())


def _links(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: 'also' must be a list of addresses")
    return list(value)


@cache
def table() -> tuple[Entry, ...]:
    """The packaged table, read and compiled once (on the first failure)."""
    from ttmesh import yamlio

    return parse(yamlio.load_cached(TABLE, "the failure table"), str(TABLE), deferred=True)


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
                return found(entry, line, where)
    return None


def found(entry: Entry, line: str, where: str) -> dict[str, Any]:
    """What a line ``entry`` matches tells (the attempt's diagnosis, before :func:`explain`
    fills in its fix), whether it was matched after the end or as it arrived."""
    return {
        "id": entry.id,
        "cause": entry.cause,
        "fix": entry.fix,
        "link": entry.link,
        "also": list(entry.also),
        "after_reset": entry.after_reset,
        "line": line.strip()[:MAX_LINE],
        "where": where,
    }


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


def explain(
    found: dict[str, Any] | None,
    inv: Inventory,
    chips: Sequence[str],
    reset_done: bool = False,
) -> Diagnosis | None:
    """``found`` (from :func:`match`) with its fix filled in: ``{reset}`` resets ``chips`` and
    what is linked to them, ``{flag}`` names the host as the user did. ``reset_done``: ttmesh
    reset the chips after the job and verified them: a fix that would reset them again is the
    entry's ``after_reset`` instead (:data:`AFTER_RESET` when it has none)."""
    if not found:
        return None
    from ttmesh.fabric import health

    flag = health.root_flag(inv.host)
    values = {"flag": flag, "reset": ""}
    template = str(found["fix"])
    if reset_done and "{reset}" in template:
        template = str(found.get("after_reset") or AFTER_RESET)
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


# --------------------------------------------------------------------------- lines as they arrive


def profile_entries(raw: Any, source: str) -> tuple[Entry, ...]:
    """A serving profile's own ``failures:`` (entries in the table's format), checked; a bad
    one is bad input naming the profile (exit 2, before anything starts)."""
    from ttmesh.errors import bad_input

    if raw is None:
        return ()
    try:
        return parse({"entries": raw}, source)
    except ValueError as exc:
        raise bad_input(str(exc), "write it as configs/failures.yaml's entries are written")


@dataclass(frozen=True)
class Hit:
    """A live line seen: its entry, the line as a user reads it, and whose it was."""

    entry: Entry
    line: str
    where: str

    def found(self) -> dict[str, Any]:
        """As :func:`match` gives an entry (the attempt's diagnosis)."""
        return found(self.entry, self.line, self.where)


class LiveLines:
    """The entries marked ``live`` (a profile's own first, then the table's, in order), matched
    in each block of a process's output as it arrives. A block none of the hint words is in
    costs a few ``bytes.find`` (C speed); one that holds a hint is split into lines and each
    such line matched with the entries' patterns (RE2: linear in the line, and a line is
    bounded: ``logs.MAX_PARTIAL``). Notes are said once per entry."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = [e for e in entries if e.live]
        self.hints = tuple(dict.fromkeys(h for e in self.entries for h in e.hints))
        self.said: set[str] = set()  # the notes said

    def __bool__(self) -> bool:
        return bool(self.entries)

    def scan(self, block: bytes, where: str) -> list[Hit]:
        """The live lines of ``block`` (whole lines): the first entry each matches."""
        if b"\x1b" in block:  # colours may cut a hint's words: look as clean() reads the line
            block = _ANSI_BYTES.sub(b"", block)
        if not any(h in block for h in self.hints):
            return []
        hits = []
        for raw in block.split(b"\n"):
            if not any(h in raw for h in self.hints):
                continue
            line = printable(clean(raw.decode(errors="replace")))  # no escape reaches a terminal
            for entry in self.entries:
                if any(h in raw for h in entry.hints) and entry.regex.search(line):
                    hits.append(Hit(entry, line, where))
                    break
        return hits

    def first_note(self, hit: Hit) -> bool:
        """True the first time ``hit``'s entry (a note) is seen."""
        if hit.entry.id in self.said:
            return False
        self.said.add(hit.entry.id)
        return True


def live_lines(extra: Sequence[Entry] = ()) -> LiveLines:
    """The live entries of ``extra`` (a profile's) and the table's: a profile's entry of the
    same id stands for the table's."""
    own = {e.id for e in extra}
    return LiveLines([*extra, *(e for e in table() if e.id not in own)])
