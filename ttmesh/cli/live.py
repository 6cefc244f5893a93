"""Live views on a terminal: a launched job, a reset, the chips' telemetry (``ttmesh top``).

A view is a rich table kept at the bottom of the terminal while text (workers' output,
ttmesh's own messages) scrolls above it. Views are drawn only on a terminal, never with
``--no-live``, ``CI`` set or ``TERM=dumb``; rich is imported here, when one is drawn, and this
module only when one is (``ttmesh --help`` and a piped launch never import rich).

The launcher and the reset know nothing of this: a :class:`JobView` is the launcher's observer
(:mod:`ttmesh.launcher.attempt.events`), a :class:`ResetView` the reset's progress callback.
"""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from ttmesh.cli.streams import live_enabled
from ttmesh.dataclass import dataclass
from ttmesh.launcher.attempt.events import write_all
from ttmesh.render import clock, plural
from ttmesh.states import JobPhase

if TYPE_CHECKING:
    from ttmesh.launcher.planning.plan import LaunchPlan
    from ttmesh.recovery.reset import ChipProgress

CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]")


def plain(text: str) -> str:
    """A line of output as one table cell: no colour codes, no control characters."""
    return CONTROL.sub("", text).strip()


class _Raw:
    """Text written to the terminal as it is (workers' colours and all), never re-wrapped."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        yield Segment(self.text)


class Proxy(io.TextIOBase):
    """sys.stdout or sys.stderr while a view is drawn: whole lines go above the table."""

    def __init__(self, screen: Screen, real: IO[str]) -> None:
        self.screen = screen
        self.real = real
        self.partial = ""

    def write(self, text: str) -> int:
        head, newline, tail = (self.partial + text).rpartition("\n")
        self.partial = tail
        if newline:
            self.screen.write(head + "\n")
            self.screen.flush()
        return len(text)

    def flush(self) -> None:
        if self.partial:
            self.screen.write(self.partial + "\n")
            self.partial = ""
            self.screen.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.real.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.real, "encoding", "utf-8")


class Screen:
    """A rich Live region at the bottom of a terminal, with text scrolling above it.

    Nothing draws by itself (no thread: the launcher forks): the owner calls :meth:`tick`
    often; text is printed at most every FLUSH seconds, the table redrawn when it changed (at
    most every REFRESH seconds) and at least every CLOCK seconds for its clocks."""

    FLUSH = 0.05
    REFRESH = 0.1
    CLOCK = 0.5
    BIG = 1 << 20

    def __init__(
        self,
        stream: IO[str],
        render: Callable[[], Any],
        capture: tuple[str, ...] = ("stdout", "stderr"),
        transient: bool = False,
    ) -> None:
        from rich.console import Console
        from rich.live import Live

        self.stream = stream
        self.console = Console(file=stream, highlight=False, markup=False, emoji=False)
        self.live = Live(
            console=self.console,
            get_renderable=render,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
            transient=transient,
        )
        self.capture = capture
        self.saved: dict[str, IO[str]] = {}
        self.pending: list[str] = []
        self.size = 0
        self.dirty = False
        self.printed = self.refreshed = 0.0
        self.running = False

    def start(self) -> None:
        for name in self.capture:
            real = getattr(sys, name)
            if live_enabled(real):  # a stream that goes elsewhere (a file) keeps its lines
                self.saved[name] = real
                setattr(sys, name, Proxy(self, real))
        self.running = True
        self.live.start(refresh=True)
        self.refreshed = time.monotonic()

    def stop(self) -> None:
        if not self.running:
            return
        try:
            self.flush()
            self.live.refresh()
            self.live.stop()
        finally:
            self.running = False
            for name, real in self.saved.items():
                proxy = getattr(sys, name)
                setattr(sys, name, real)
                if isinstance(proxy, Proxy) and proxy.partial:
                    real.write(proxy.partial)
            self.saved.clear()

    def write(self, text: str) -> None:
        """Text for above the table (whole lines), printed on the next flush."""
        if not self.running:
            self.stream.write(text)
            self.stream.flush()
            return
        self.pending.append(text)
        self.size += len(text)

    def flush(self) -> None:
        """Print what is pending above the table (which is redrawn below it)."""
        if not self.pending or not self.running:
            return
        text = "".join(self.pending)
        self.pending.clear()
        self.size = 0
        self.console.print(_Raw(text), end="", crop=False, soft_wrap=True)
        self.printed = self.refreshed = time.monotonic()
        self.dirty = False

    def changed(self) -> None:
        self.dirty = True

    def tick(self) -> None:
        if not self.running:
            return
        now = time.monotonic()
        if self.pending and (now - self.printed >= self.FLUSH or self.size >= self.BIG):
            self.flush()
        elif (self.dirty and now - self.refreshed >= self.REFRESH) or (
            now - self.refreshed >= self.CLOCK
        ):
            self.redraw()

    def redraw(self) -> None:
        if self.running:
            self.live.refresh()
            self.refreshed = time.monotonic()
            self.dirty = False


# --------------------------------------------------------------------------- ttmesh launch


@dataclass
class _Rank:
    shown: int  # the global rank
    chips: str
    pid: int | None = None
    state: str = "waiting"
    started: float | None = None
    ended: float | None = None
    restarts: int = 0
    last: str = ""


STATE_STYLE = {
    "waiting": "dim",
    "starting": "yellow",
    "running": "green",
    "ready": "bold green",
    "done": "green",
    "stopped": "yellow",
    "failed": "bold red",
}
PHASES_SHOWN = 6  # the last phases in the header


class JobView:
    """``ttmesh launch`` on a terminal: the ranks' table under their scrolling output, and the
    job's phases with their times. The launcher's observer (ttmesh.launcher.attempt.events)."""

    def __init__(self, plan: LaunchPlan, stream: IO[str] | None = None) -> None:
        self.plan = plan
        self.watch_ready = bool(
            plan.policy.ready_timeout is not None
            or plan.policy.ready_pattern
            or plan.serving is not None
        )
        self.ranks = {
            r.rank: _Rank(r.rank + plan.rank_offset, _chips(list(r.bdfs), len(r.chips)))
            for r in plan.ranks
        }
        self.phases: list[list[Any]] = []  # [phase, detail, start]
        self.number = 0  # the attempt
        self.t0 = time.monotonic()
        # A server's start as its checklist (serving.checklist): the rows, the time allowed,
        # and when the attempt began (the rows' times count from there).
        self.steps: list[dict[str, Any]] = []
        self.allowed: float | None = None
        self.attempt_t0 = self.t0
        self.err_tty = live_enabled(sys.stderr)
        self.screen = Screen(stream or sys.stdout, self.render)

    def __enter__(self) -> JobView:
        self.screen.start()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is not None:  # refused or broken before the end: its one line stands alone
            self.screen.live.transient = True
        self.screen.stop()

    # -- the observer

    def phase(self, phase: JobPhase, detail: str = "") -> None:
        self.screen.flush()
        now = time.monotonic()
        if self.phases and self.phases[-1][0] == phase:
            self.phases[-1][1] = detail
        else:
            self.phases.append([phase, detail, now])
        if phase is JobPhase.DONE:
            self.screen.stop()  # the last frame stays, above the summary
        else:
            self.screen.redraw()

    def attempt(self, attempt: int) -> None:
        self.screen.flush()
        self.number = attempt
        self.steps, self.attempt_t0 = [], time.monotonic()
        for row in self.ranks.values():
            row.pid, row.state, row.started, row.ended = None, "waiting", None, None
            row.restarts = attempt
        self.screen.redraw()

    def rank_started(self, rank: int, pid: int) -> None:
        row = self.ranks.get(rank)
        if row is not None:
            row.pid, row.started = pid, time.monotonic()
            row.state = "starting" if self.watch_ready else "running"
            self.screen.changed()

    def rank_ready(self, rank: int) -> None:
        row = self.ranks.get(rank)
        if row is not None and row.ended is None:
            row.state = "ready"
            self.screen.changed()

    def rank_exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        row = self.ranks.get(rank)
        if row is None:
            return
        row.ended = time.monotonic()
        if row.started is None:
            row.started = row.ended
        if code == 0:
            row.state = "done"
        else:
            row.state = f"{'stopped' if stopped else 'failed'}: {how}"
        self.screen.changed()

    def lines(self, last: dict[int, str]) -> None:
        for rank, text in last.items():
            row = self.ranks.get(rank)
            if row is not None:
                row.last = plain(text)
        self.screen.changed()

    def checklist(self, rows: list[dict[str, Any]], timeout: float | None) -> None:
        self.steps, self.allowed = list(rows), timeout
        self.screen.changed()

    def output(self, fd: int, data: bytes) -> None:
        if (fd == 2 and not self.err_tty) or not self.screen.running:
            write_all(fd, data)  # stderr that goes to a file keeps its lines there
            return
        self.screen.write(data.decode(errors="replace"))

    def tick(self) -> None:
        self.screen.tick()

    # -- drawing

    def render(self) -> Any:
        from rich import box
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        plan = self.plan
        head = Text()
        head.append("ttmesh ", style="bold")
        head.append(f"job {plan.job}")
        if plan.policy.max_restarts:
            head.append(f" · attempt {self.number + 1} of {plan.policy.max_restarts + 1}")
        head.append(f" · {clock(now - self.t0)}")
        table = Table(
            box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=True, header_style="bold"
        )
        for name in ("RANK", "CHIP", "PID", "STATE", "UPTIME", "RESTARTS"):
            table.add_column(name, no_wrap=True)
        table.add_column("LAST LINE", no_wrap=True, overflow="ellipsis", ratio=1)
        for _, row in sorted(self.ranks.items()):
            up = "-" if row.started is None else clock((row.ended or now) - row.started)
            kind = row.state.split(":")[0]
            table.add_row(
                Text(str(row.shown)),
                Text(row.chips),
                Text("-" if row.pid is None else str(row.pid)),
                Text(row.state, style=STATE_STYLE.get(kind, "")),
                Text(up),
                Text(str(row.restarts)),
                Text(row.last, style="dim"),
            )
        if self.steps:
            return Group(head, self._phase_line(now), self._checklist(now), table)
        return Group(head, self._phase_line(now), table)

    def _checklist(self, now: float) -> Any:
        """A server's start: ``[k/N · elapsed]`` and the deadline, then a row per step with
        its time (finished rows kept, steps to come dim)."""
        from rich.table import Table
        from rich.text import Text

        elapsed = now - self.attempt_t0
        at = next((i for i, r in enumerate(self.steps) if r["state"] == "active"), None)
        if at is None:
            done = [i for i, r in enumerate(self.steps) if r["state"] == "done"]
            at = done[-1] if done else None
        head = Text()
        head.append(f"[{0 if at is None else at + 1}/{len(self.steps)} · {clock(elapsed)}]")
        if at is not None:
            head.append(f" {self.steps[at]['label']}", style="bold")
        ready = self.steps and all(r["state"] in ("done", "skipped") for r in self.steps)
        if self.allowed and not ready:
            by = time.strftime("%H:%M", time.localtime(time.time() + self.allowed - elapsed))
            head.append(f" · ready within {clock(self.allowed)} (by {by})", style="dim")
        rows = Table.grid(padding=(0, 1))
        for name in ("mark", "label", "time"):
            rows.add_column(name, no_wrap=True, justify="right" if name == "time" else "left")
        for r in self.steps:
            state = r["state"]
            mark, style = {
                "done": ("✓", "green"), "active": ("▸", "bold yellow"), "skipped": ("–", "dim"),
            }.get(state, ("·", "dim"))  # fmt: skip
            label = Text(plain(r["label"]), style="dim" if state in ("planned", "skipped") else "")
            if r.get("detail"):
                label.append(f"  {plain(r['detail'])}", style="dim")
            took = r.get("seconds")
            if state == "active" and r.get("started") is not None:
                took = elapsed - r["started"]
            rows.add_row(
                Text(mark, style=style),
                label,
                Text("" if took is None else clock(took), style="cyan"),
            )
        from rich.console import Group

        return Group(head, rows)

    def _phase_line(self, now: float) -> Any:
        from rich.text import Text

        line = Text()
        shown = self.phases[-PHASES_SHOWN:]
        if len(self.phases) > len(shown):
            line.append("… › ", style="dim")
        for i, (phase, detail, start) in enumerate(shown):
            last = i == len(shown) - 1
            end = now if last else shown[i + 1][2]
            if i:
                line.append(" › ", style="dim")
            line.append(str(phase), style="bold" if last else "")
            if detail and last:
                line.append(f" ({detail})")
            if not (last and phase is JobPhase.DONE):
                line.append(f" {clock(end - start)}", style="cyan" if last else "dim")
        return line


def _chips(bdfs: list[str], count: int) -> str:
    if not count:
        return "-"  # a chipless server (stock SGLang on a CPU)
    if not bdfs:
        return plural(count, "chip")
    more = f" +{len(bdfs) - 1}" if len(bdfs) > 1 else ""
    return bdfs[0] + more


# --------------------------------------------------------------------------- ttmesh reset

STAGE_STYLE = {
    "queued": "dim",
    "stopping holders": "yellow",
    "resetting": "yellow",
    "waiting for PCI": "yellow",
    "waiting for heartbeat": "yellow",
    "waiting for links": "yellow",
    "retrying": "magenta",
    "done": "bold green",
    "failed": "bold red",
}


class ResetView:
    """``ttmesh reset`` on a terminal: each chip's stage (resetting, waiting for PCI, the
    heartbeat, links; done or failed) and how long it has been there. The reset's progress
    callback; its messages scroll above. Erased at the end: the result table says the rest."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.chips: list[ChipProgress] = []
        self.since: dict[str, tuple[str, float]] = {}
        self.t0 = time.monotonic()
        self.screen = Screen(stream or sys.stderr, self.render, ("stderr",), transient=True)

    def __enter__(self) -> ResetView:
        self.screen.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.screen.stop()

    def progress(self, chips: list[ChipProgress]) -> None:
        """Every chip's stage: drawn at once when one changed (a stage may last an instant)."""
        now = time.monotonic()
        changed = [c for c in chips if self.since.get(c.asic, ("", 0.0))[0] != c.stage]
        for c in changed:
            self.since[c.asic] = (c.stage, now)
        self.chips = list(chips)
        if changed:
            self.screen.flush()
            self.screen.redraw()
        else:
            self.screen.tick()

    def render(self) -> Any:
        from rich import box
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        done = sum(1 for c in self.chips if c.stage == "done")
        head = Text()
        head.append("ttmesh reset", style="bold")
        if not self.chips:
            head.append(f" · checking the chips · {clock(now - self.t0)}")
            return head
        head.append(f" · {done} of {plural(len(self.chips), 'chip')} done · {clock(now - self.t0)}")
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold")
        for name in ("CHIP", "STAGE", "ATTEMPT", "FOR", "DETAIL"):
            table.add_column(name, no_wrap=True, overflow="ellipsis")
        for c in self.chips:
            since = self.since.get(c.asic, (c.stage, now))[1]
            table.add_row(
                Text(c.name),
                Text(c.stage, style=STAGE_STYLE.get(c.stage, "")),
                Text(str(c.attempt) if c.attempt else "-"),
                Text(clock(now - since)),
                Text(plain(c.detail), style="dim"),
            )
        return Group(head, table)
