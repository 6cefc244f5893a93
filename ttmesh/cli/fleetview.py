"""The live view of a serving fleet (``ttmesh launch --replicas N`` on a terminal).

A table of the replicas (index, job, chips, port or URL, state, restarts, last line) and a
line for SGLang's router (URL, state, PID, restarts, metrics URL), kept at the bottom of the
terminal by :class:`ttmesh.cli.live.Screen` while the replicas' ``[replicaK]`` lines and
ttmesh's own messages scroll above it, as they would without a view. Drawn under the same
rule as a single job's view (:func:`ttmesh.cli.streams.live_enabled`: a terminal, not ``--no-live``,
no ``CI``, not ``TERM=dumb``); otherwise no view is made and the lines are plain.

The fleet (:class:`ttmesh.launcher.fleet.run.Fleet`) knows nothing of the drawing: it hands
its state, the same JSON its job record carries for ``ttmesh ps``, to :meth:`FleetView.show`;
the view's ticker prints the lines held and redraws. What another program wrote (a server's
last line, the router's log) goes into a cell only through :func:`ttmesh.render.printable`,
and into the lines above only through :func:`above`: its escapes never reach the terminal. A
fleet taller than the terminal shows the replicas worth a look (not serving) first and counts
the rest; a narrow terminal gets each replica on two lines instead of a row.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import IO, Any

from ttmesh.cli.live import Proxy, Screen, clock
from ttmesh.cli.streams import live_enabled
from ttmesh.render import plural, printable

STATE_STYLE = {
    "waiting": "dim",
    "starting": "yellow",
    "serving": "bold green",
    "down": "bold red",
    "exited": "dim",
}
ROUTER_STYLE = {"running": "bold green", "down": "bold red", "waiting": "dim", "stopped": "yellow"}
WIDE = 110  # columns from which the table shows each replica's job and URL
NARROW = 60  # columns below which a replica is two lines, not a row of the table
KEEP_FREE = 5  # terminal lines left for the output that scrolls above the table
LEAST_ROWS = 3  # replicas shown however short the terminal


def render(
    state: dict[str, Any], job: str, width: int, height: int, elapsed: float | None = None
) -> Any:
    """The view's frame for ``state`` (``Fleet.state()``) on a terminal of ``width`` x
    ``height``: a header, the router's line, the replicas (what fits). From :data:`WIDE`
    columns each replica's job and URL, below it its port; below :data:`NARROW` a replica
    takes two lines (its port, state and restarts, then its last line) instead of a row."""
    from rich.console import Group
    from rich.text import Text

    replicas = [r for r in state.get("replicas") or [] if isinstance(r, dict)]
    counts = Counter(str(r.get("state")) for r in replicas)
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append("ttmesh ", style="bold")
    head.append(f"fleet {printable(job)} · {counts['serving']} of {len(replicas)} serving")
    if elapsed is not None:
        head.append(f" · {clock(elapsed)}")
    narrow = width < NARROW
    lines = max(LEAST_ROWS, height - KEEP_FREE - 5)  # header, router, table head + rule, more
    shown = _shown(replicas, lines // 2 if narrow else lines)
    parts: list[Any] = [head, _router_line(state.get("router") or {})]
    parts += _pairs(shown) if narrow else [_table(shown, width >= WIDE)]
    if len(shown) < len(replicas):
        kept = {id(r) for r in shown}
        by_state = Counter(str(r.get("state")) for r in replicas if id(r) not in kept)
        more = ", ".join(f"{n} {printable(st)}" for st, n in sorted(by_state.items()))
        hidden = len(replicas) - len(shown)
        parts.append(
            Text(
                f"… {plural(hidden, 'more replica')} ({more})",
                style="dim",
                no_wrap=True,
                overflow="ellipsis",
            )
        )
    return Group(*parts)


def _cells(r: dict[str, Any]) -> tuple[str, str, str]:
    """A replica's state as said (an exit code with it), its style, its last line: printable."""
    kind = str(r.get("state") or "?")
    failed = kind == "exited" and bool(r.get("code"))
    said = f"exited {r.get('code')}" if failed else kind
    style = "bold red" if failed else STATE_STYLE.get(kind, "")
    return printable(said), style, printable(str(r.get("last_line") or ""))


def _table(shown: list[dict[str, Any]], wide: bool) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(
        box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=True, header_style="bold"
    )
    columns = ["REPLICA", *(["JOB"] if wide else []), "CHIPS", "URL" if wide else "PORT"]
    for name in [*columns, "STATE", "RESTARTS"]:
        table.add_column(name, no_wrap=True, overflow="ellipsis")
    table.add_column("LAST LINE", no_wrap=True, overflow="ellipsis", ratio=1, min_width=8)
    for r in shown:
        said, style, last = _cells(r)
        cells = [Text(str(r.get("replica", "?")))]
        if wide:
            cells.append(Text(printable(str(r.get("job") or "-"))))
        cells.append(Text(_chips(r.get("chips"))))
        cells.append(Text(printable(str((r.get("url") if wide else r.get("port")) or "-"))))
        cells += [Text(said, style=style), Text(str(r.get("restarts") or 0)), Text(last, "dim")]
        table.add_row(*cells)
    return table


def _pairs(shown: list[dict[str, Any]]) -> list[Any]:
    """A narrow terminal's replicas: ``K :PORT state · N restarts`` over its last line."""
    from rich.text import Text

    out: list[Any] = []
    for r in shown:
        said, style, last = _cells(r)
        top = Text(no_wrap=True, overflow="ellipsis")
        top.append(f"{r.get('replica', '?')} ", style="bold")
        top.append(f":{printable(str(r.get('port') or '-'))} ")
        top.append(said, style=style)
        top.append(f" · {plural(int(r.get('restarts') or 0), 'restart')}")
        out += [top, Text(f"  {last}", style="dim", no_wrap=True, overflow="ellipsis")]
    return out


def _shown(replicas: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The replicas that fit in ``budget`` rows, in their order: every one when they fit, else
    those not serving first (what a person looks for), then the serving ones."""
    if len(replicas) <= budget:
        return replicas
    ranked = sorted(range(len(replicas)), key=lambda i: (replicas[i].get("state") == "serving", i))
    keep = set(ranked[: max(budget - 1, 1)])  # one row for the line that counts the rest
    return [r for i, r in enumerate(replicas) if i in keep]


def _router_line(router: dict[str, Any]) -> Any:
    from rich.text import Text

    line = Text(overflow="fold")  # wrapped on a narrow terminal: nothing of it lost
    line.append("router ", style="bold")
    line.append(printable(str(router.get("url") or "-")))
    state = router_state(router)
    said = "waiting for a replica to be ready" if state == "waiting" else printable(state)
    line.append(f" · {said}", style=ROUTER_STYLE.get(state, ""))
    if router.get("pid"):
        line.append(f" · pid {router.get('pid')}")
    line.append(f" · {plural(int(router.get('restarts') or 0), 'restart')}")
    if router.get("metrics_url"):
        line.append(f" · metrics {printable(str(router['metrics_url']))}")
    return line


def router_state(router: dict[str, Any]) -> str:
    """The router's state in a fleet's record; a record written before it said one: from
    whether it runs and was started."""
    if router.get("state"):
        return str(router["state"])
    return "running" if router.get("running") else "down" if router.get("pid") else "waiting"


def _chips(chips: object) -> str:
    if not isinstance(chips, list) or not chips:
        return "-"  # a chipless server (stock SGLang on a CPU)
    more = f" +{len(chips) - 1}" if len(chips) > 1 else ""
    return printable(str(chips[0])) + more


_SEQUENCE = re.compile(
    r"\x1b\[[0-9;?<=>]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"  # and bidi overrides
)
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def above(text: str) -> str:
    """Relayed lines as they go above the table: their colours kept (as without a view), any
    other escape, control character or bidi override dropped. The view owns the cursor: a
    line that moved it, cleared the screen or retitled the window would break the table, or
    worse (OSC 52 writes the clipboard)."""
    return _SEQUENCE.sub(lambda m: m.group() if _COLOUR.fullmatch(m.group()) else "", text)


class _Lines(Proxy):
    """sys.stdout or sys.stderr while the view is drawn: whole lines are held for above the
    table and printed by the view's ticker, at most every ``Screen.FLUSH`` seconds (a busy
    fleet's lines must not redraw its table once each, nor wait for the next one)."""

    def __init__(self, view: FleetView, real: IO[str]) -> None:
        super().__init__(view.screen, real)
        self.view = view

    def write(self, text: str) -> int:
        head, newline, tail = (self.partial + text).rpartition("\n")
        self.partial = tail
        if newline:
            with self.view.lock:
                self.view.screen.write(above(head) + "\n")
        return len(text)

    def flush(self) -> None:
        pass  # a line goes out whole, on the screen's own time


class FleetView:
    """``ttmesh launch --replicas N`` on a terminal: the fleet's watcher
    (:class:`ttmesh.launcher.fleet.run.Watcher`).

    Unlike a single job's view it has a thread of its own, the ticker: the fleet's main thread
    blocks while its replicas drain, and their lines must still go out (and the clock move).
    The fleet forks only to exec (``subprocess``), so a lock the ticker holds at a fork is never
    needed in the child. One lock orders everything that draws: the ticker, ``show`` and the
    lines written by the fleet's relays."""

    def __init__(self, job: str, stream: IO[str] | None = None) -> None:
        self.job = job
        self.state: dict[str, Any] = {"router": {}, "replicas": []}
        self.t0 = time.monotonic()
        self.lock = threading.RLock()
        self.done = threading.Event()
        self.ticker = threading.Thread(target=self._tick, name="fleet-view", daemon=True)
        self.screen = Screen(stream or sys.stdout, self.render, capture=())
        self.saved: dict[str, IO[str]] = {}

    def __enter__(self) -> FleetView:
        for name in ("stdout", "stderr"):
            real = getattr(sys, name)
            if live_enabled(real):  # a stream that goes elsewhere (a file) keeps its lines
                self.saved[name] = real
                setattr(sys, name, _Lines(self, real))
        self.screen.start()
        self.ticker.start()
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.done.set()
        self.ticker.join()
        if kind is not None:  # refused or broken before the end: its one line stands alone
            self.screen.live.transient = True
        try:  # what is held printed, the last frame left below it; a bug of the view's
            with self.lock, contextlib.suppress(Exception):  # must not replace the exit code
                self.screen.stop()
        finally:
            for name, real in self.saved.items():
                lines = getattr(sys, name)
                setattr(sys, name, real)
                if isinstance(lines, _Lines) and lines.partial:
                    real.write(lines.partial)
            self.saved.clear()

    def _tick(self) -> None:
        while not self.done.wait(Screen.FLUSH):
            with self.lock:
                self._guarded(self.screen.tick)

    def _guarded(self, step: Callable[[], None]) -> None:
        """``step`` of the drawing; one that raises stops the view, and the rest of the fleet's
        lines are plain (a bug of the view must not stop the replicas)."""
        if not self.screen.running:
            return
        try:
            step()
        except Exception:
            self.screen.live.transient = True  # no half-drawn frame left behind
            with contextlib.suppress(Exception):
                self.screen.stop()
            self.screen.running = False

    # -- the watcher

    def show(self, state: dict[str, Any]) -> None:
        """The fleet's state now: drawn by the ticker when it changed (at most every
        ``Screen.REFRESH`` seconds)."""

        def step() -> None:
            if state != self.state:
                self.state = state
                self.screen.changed()
            self.screen.tick()

        with self.lock:
            self._guarded(step)

    # -- drawing

    def render(self) -> Any:
        screen = getattr(self, "screen", None)  # rich draws a first frame as it is built
        if screen is not None:
            width, height = screen.console.size
        else:
            width, height = shutil.get_terminal_size()
        return render(self.state, self.job, width, height, time.monotonic() - self.t0)
