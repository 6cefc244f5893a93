"""A server's start as a checklist, classified from the server's own log lines.

A first start takes minutes. The socket says little (nothing listens, then 503); the server's
log says which step it is in. Each profile declares its steps (``checklist:``), in order: a
label while the step runs and one once it is done, the lines (RE2) that start it and, if the
log says, end it, and facts to capture on the way (the chips and their mesh, the KV cache's
tokens, what was compiled). The log's order is the truth, as in tt-cli's ``tt serve``
(tenstorrent/tt-cli ``backends/serving/progress/tracker.py``): a line that starts a later step
finishes the current one, so a reworded end line never leaves a step hanging, and the scan only
moves forward. Steps a start may skip are ``planned: false``: shown only once they begin.

:class:`Checklist` is pure (lines and times in, rows out): the guardian feeds it the server's
output until the server is ready, says each finished step in a pipe, hands the rows to a live
view on a terminal, names the step a ready timeout stuck in, and puts each step's time in
``--summary-json``.
"""

from __future__ import annotations

import string
from typing import Any

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.patterns import Matcher, PatternError, compile_pattern
from ttmesh.render import clock, noun, printable

MAX_STEPS = 24  # steps a profile may declare
MAX_PATTERNS = 16  # patterns per list
MAX_PATTERN = 500  # characters of a pattern
MAX_TEXT = 120  # characters of a label or a detail template
MAX_DETAIL = 160  # characters of a step's detail as shown
KEYS = {"key", "label", "done", "start", "end", "detail", "planned"}

PLANNED, ACTIVE, DONE, SKIPPED = "planned", "active", "done", "skipped"


@dataclass(frozen=True)
class Detail:
    """A fact a line gives: a pattern with named groups, and the text made of them."""

    match: Matcher
    say: str


@dataclass(frozen=True)
class Step:
    """One row of the checklist, as a profile declares it."""

    key: str
    label: str  # while it runs: "opening the chips"
    done: str  # once finished: "chips opened"
    start: tuple[Matcher, ...]
    end: tuple[Matcher, ...] = ()
    details: tuple[Detail, ...] = ()
    planned: bool = True


def load(raw: Any, where: str) -> tuple[Step, ...]:
    """A profile's ``checklist:``, checked: bad input names the profile and the step."""
    if raw is None:
        return ()
    hint = "see a stock profile's checklist: (ttmesh/configs/profiles/sglang-torchtpu.yaml)"
    if not isinstance(raw, list) or len(raw) > MAX_STEPS:
        raise bad_input(f"{where}: checklist must be a list of at most {MAX_STEPS} steps", hint)
    steps: list[Step] = []
    for i, item in enumerate(raw):
        at = f"{where}: checklist[{i}]"
        if not isinstance(item, dict):
            raise bad_input(f"{at}: a step is a map ({', '.join(sorted(KEYS))})", hint)
        unknown = sorted(set(item) - KEYS)
        if unknown:
            raise bad_input(f"{at}: unknown key {', '.join(map(str, unknown))}", hint)
        key = _text(item.get("key"), f"{at}: key", hint)
        if not key.replace("-", "").replace("_", "").isalnum():
            raise bad_input(f"{at}: key {key!r} is not a word (letters, digits, - and _)", hint)
        if any(s.key == key for s in steps):
            raise bad_input(f"{at}: key {key!r} is used twice", hint)
        at = f"{where}: checklist step {key}"
        planned = item.get("planned", True)
        if not isinstance(planned, bool):
            raise bad_input(f"{at}: planned must be true or false", hint)
        steps.append(
            Step(
                key=key,
                label=_text(item.get("label"), f"{at}: label", hint),
                done=_text(item.get("done"), f"{at}: done", hint),
                start=_patterns(item.get("start"), f"{at}: start", hint, required=True),
                end=_patterns(item.get("end"), f"{at}: end", hint),
                details=_details(item.get("detail"), f"{at}: detail", hint),
                planned=planned,
            )
        )
    return tuple(steps)


def _text(value: Any, where: str, hint: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
        raise bad_input(f"{where} must be text of 1 to {MAX_TEXT} characters", hint)
    return " ".join(value.split())


def _pattern(value: Any, where: str, hint: str) -> Matcher:
    if not isinstance(value, str) or not value or len(value) > MAX_PATTERN:
        raise bad_input(f"{where}: a pattern is text of 1 to {MAX_PATTERN} characters", hint)
    try:
        found = compile_pattern(value)
    except PatternError as exc:
        raise bad_input(f"{where}: {value!r}: {exc}", exc.hint) from None
    if found.search(""):
        raise bad_input(f"{where}: {value!r} matches every line", hint)
    return found


def _patterns(value: Any, where: str, hint: str, required: bool = False) -> tuple[Matcher, ...]:
    if value is None and not required:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or len(items) > MAX_PATTERNS:
        raise bad_input(f"{where} must be a pattern or a list of 1 to {MAX_PATTERNS}", hint)
    return tuple(_pattern(v, where, hint) for v in items)


def _details(value: Any, where: str, hint: str) -> tuple[Detail, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or len(items) > MAX_PATTERNS:
        raise bad_input(f"{where} must be a list of {{match, say}} maps", hint)
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"match", "say"}:
            raise bad_input(f"{where}: each is a map of match (a pattern) and say (text)", hint)
        match = _pattern(item["match"], where, hint)
        say = _text(item["say"], f"{where}: say", hint)
        try:
            fields = [(n, spec) for _, n, spec, _ in string.Formatter().parse(say) if n is not None]
        except ValueError as exc:
            raise bad_input(f"{where}: say {say!r}: {exc}", "write a literal brace twice")
        names = {n for n, _ in fields}
        for name, spec in fields:
            if spec and not spec.isalpha():
                raise bad_input(
                    f"{where}: say {{{name}:{spec}}}: after the colon comes a noun, counted "
                    "with the number captured ({n:chip}: 1 chip, 4 chips)",
                    hint,
                )
        groups = set(getattr(match, "groupindex", {}) or {})
        if names - groups:
            raise bad_input(
                f"{where}: say names {', '.join(sorted(names - groups))}, which its pattern "
                "does not capture",
                "name the group in the pattern: (?P<tokens>[0-9]+) for {tokens}",
            )
        out.append(Detail(match, say))
    return tuple(out)


class _Say(string.Formatter):
    """A detail's text: ``{n:chip}`` is the count with its noun, agreeing (``1 chip``)."""

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec:
            text = str(value)
            count = int(text.replace(",", "")) if numeric.digits(text.replace(",", "")) else 2
            return f"{text} {noun(count, format_spec)}"
        return str(value)


SAY = _Say()


@dataclass
class Row:
    """A step as it went: its state, when it began and ended (monotonic), what it said."""

    step: Step
    state: str = PLANNED
    began: float | None = None
    ended: float | None = None
    details: dict[int, str] = field(default_factory=dict)  # each detail's first capture

    @property
    def detail(self) -> str:
        return " · ".join(self.details[i] for i in sorted(self.details))[:MAX_DETAIL]

    @property
    def text(self) -> str:
        """Its label now: what it does while it runs, what it did once done."""
        return self.step.done if self.state == DONE else self.step.label

    def to_json(self, t0: float) -> dict[str, Any]:
        """For --summary-json and the view: times in seconds from ``t0``."""
        took = None
        if self.began is not None and self.ended is not None:
            took = round(self.ended - self.began, 3)
        return {
            "key": self.step.key,
            "label": self.text,
            "state": self.state,
            "started": None if self.began is None else round(self.began - t0, 3),
            "seconds": took,
            "detail": self.detail,
        }


class Checklist:
    """The rows of a start, moved on by the server's lines (in order, never back)."""

    def __init__(self, steps: tuple[Step, ...], t0: float) -> None:
        self.rows = [Row(s) for s in steps]
        self.t0 = t0
        self.index = -1  # the row the log is in (or was last in)
        self.changed = False

    def __bool__(self) -> bool:
        return bool(self.rows)

    @property
    def shown(self) -> list[Row]:
        """The rows a person sees: the planned ones, and any other the log entered."""
        return [r for r in self.rows if r.step.planned or r.state != PLANNED]

    @property
    def current(self) -> Row | None:
        row = self.rows[self.index] if self.index >= 0 else None
        return row if row is not None and row.state == ACTIVE else None

    def position(self) -> tuple[int, int]:
        """(k, N): the row the start is at among the rows shown (k 0 before any)."""
        shown = self.shown
        if self.index < 0:
            return 0, len(shown)
        return shown.index(self.rows[self.index]) + 1, len(shown)

    def feed(self, line: str, now: float) -> list[Row]:
        """One line of the server's output: the rows it finished (in order)."""
        finished: list[Row] = []
        active = self.current
        # A line that starts the active row again continues it rather than jumping ahead.
        again = active is not None and any(p.search(line) for p in active.step.start)
        if not again:
            for i in range(self.index + 1, len(self.rows)):
                if any(p.search(line) for p in self.rows[i].step.start):
                    finished += self._finish(now)
                    for skipped in self.rows[self.index + 1 : i]:
                        if skipped.step.planned:  # one a start may skip stays unshown
                            skipped.state = SKIPPED
                    self.index = i
                    self.rows[i].state, self.rows[i].began = ACTIVE, now
                    self.changed = True
                    break
        row = self.current
        if row is None:
            return finished
        for i, d in enumerate(row.step.details):
            if i in row.details:
                continue  # a fact once captured stays (a later line may say less)
            found = d.match.search(line)
            if found is not None:
                text = SAY.format(d.say, **{k: (v or "") for k, v in found.groupdict().items()})
                text = printable(
                    " ".join(text.split())
                )  # a server's text: no escape reaches a terminal
                if text:
                    row.details[i] = text
                    self.changed = True
        if any(p.search(line) for p in row.step.end):
            finished += self._finish(now)
        return finished

    def _finish(self, now: float) -> list[Row]:
        row = self.current
        if row is None:
            return []
        row.state, row.ended = DONE, now
        self.changed = True
        return [row]

    def ready(self, now: float) -> list[Row]:
        """The server answers: the row it was in is done (nothing after it ran)."""
        return self._finish(now)

    def said(self, row: Row) -> str:
        """A finished row as one plain line: ``[2/6 · 41.0 s] chips opened in 12.0 s (4 chips ·
        mesh (1, 4))``."""
        k = self.shown.index(row) + 1 if row in self.shown else 0
        at = clock((row.ended or self.t0) - self.t0)
        took = clock((row.ended or 0.0) - (row.began or 0.0))
        detail = f" ({row.detail})" if row.detail else ""
        return f"[{k}/{len(self.shown)} · {at}] {row.text} in {took}{detail}"

    def where(self, now: float) -> str:
        """The row the start is in and for how long: ``compiling programs for 25:13``."""
        row = self.current
        if row is None:
            return ""
        return f"{row.step.label} for {clock(now - (row.began or now))}"

    def to_json(self) -> list[dict[str, Any]]:
        return [r.to_json(self.t0) for r in self.shown]
