"""The live view of a serving fleet (issue 25), and ``ttmesh ps`` of one: each replica (chips,
port, state, restarts, last line) and the router. The view is drawn from a given state in
process; one short fleet (two one-chip replicas of the stand-in that crash once ready) runs on
a pseudo-terminal with a view, with ``--no-live``, and with stdout in a pipe."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from test_live import Terminal, ttmesh
from test_serving import ENV, SGLANG, _free_port, seed

HOSTILE = (
    "\x1b[31mred\x1b[0m \x1b]0;pwned\x07\x1b]52;c;Zm9v\x07\x1b[2J\x1b[5A\x9b2J\x07\x08\r\u202eend"
)
SHOWN = r"red \x07\x08 \x202eend"  # what a cell shows of it: its controls spelled out
RAW = ("\x1b]", "\x1b[2J", "\x1b[5A", "\x9b", "\x07", "\x08", "\r", "\u202e")  # none may show


METRICS = _free_port()


def _replica(k: int, state: str = "serving", last: str = "", **more: Any) -> dict[str, Any]:
    return {
        "replica": k, "job": f"fl-r{k}", "chips": [f"0000:0{2 * k + 1}:00.0", f"0000:0{2 * k + 3}:00.0"],
        "url": f"http://127.0.0.1:{41000 + k}", "port": 41000 + k, "state": state,
        "restarts": 0, "pid": 5000 + k, "code": None, "last_line": last or f"line of r{k}", **more,
    }  # fmt: skip


def _state(replicas: list[dict[str, Any]], **router: Any) -> dict[str, Any]:
    base = {"url": "http://127.0.0.1:31000", "pid": 4242, "running": True, "state": "running",
            "restarts": 1, "metrics_url": "http://127.0.0.1:29555/metrics"}  # fmt: skip
    return {"router": {**base, **router}, "replicas": replicas}


def _drawn(state: dict[str, Any], width: int = 160, height: int = 50) -> str:
    from rich.console import Console

    from ttmesh.cli.fleetview import render

    console = Console(
        file=io.StringIO(), record=True, width=width, height=height, force_terminal=True
    )
    console.print(render(state, "fl", width, height, 83.0))
    raw = console.export_text(styles=True, clear=False)  # what the terminal gets, escapes and all
    for bad in RAW:
        assert bad not in raw, (bad, raw)
    return console.export_text()


def test_the_view_shows_each_replica_and_the_router() -> None:
    state = _state(
        [
            _replica(0),
            _replica(1, "down", HOSTILE, restarts=2),
            _replica(2, "exited", "ttmesh: exit 3: the server failed", code=3),
        ]
    )
    text = _drawn(state)
    lines = text.splitlines()
    assert lines[0] == "ttmesh fleet fl · 1 of 3 serving · 1:23"
    assert lines[1] == (
        "router http://127.0.0.1:31000 · running · pid 4242 · 1 restart · "
        "metrics http://127.0.0.1:29555/metrics"
    )
    rows = {
        int(c[0]): c for c in (re.split(r"\s{2,}", ln.strip()) for ln in lines) if c[0].isdigit()
    }
    assert rows[0] == ["0", "fl-r0", "0000:01:00.0 +1", "http://127.0.0.1:41000", "serving", "0",
                       "line of r0"]  # fmt: skip
    assert rows[1][4:6] == ["down", "2"]
    assert rows[1][6] == SHOWN  # its colours and escapes dropped, nothing raw
    assert rows[2][4:] == ["exited 3", "0", "ttmesh: exit 3: the server failed"]
    waiting = _drawn(_state([_replica(0, "starting")], pid=None, running=False, state="waiting"))
    assert (
        "router http://127.0.0.1:31000 · waiting for a replica to be ready · 1 restart" in waiting
    )
    old = _drawn(_state([_replica(0)], state=None, running=False, metrics_url=None))
    assert "router http://127.0.0.1:31000 · down · pid 4242 · 1 restart\n" in old  # no state said


def test_the_view_of_a_long_line_64_replicas_and_a_narrow_terminal() -> None:
    long = "x" * 5000
    text = _drawn(_state([_replica(0, last=long)]), width=120)
    assert all(len(ln) <= 120 for ln in text.splitlines())
    assert len(text.splitlines()) == 5  # header, router, table head and rule, one row
    many = [_replica(k) for k in range(64)]
    many[40] = _replica(40, "down", "boom")
    many[63] = _replica(63, "starting")
    text = _drawn(_state(many), width=100, height=30)
    lines = text.splitlines()
    assert len(lines) <= 30 - 5  # room left for the lines that scroll above
    shown = [int(c[0]) for c in (ln.split() for ln in lines) if c and c[0].isdigit()]
    assert 40 in shown and 63 in shown and shown == sorted(shown)  # what is not serving, first
    assert lines[-1] == f"… {64 - len(shown)} more replicas ({64 - len(shown)} serving)"
    narrow = _drawn(_state([_replica(0, last=HOSTILE), _replica(1, "down", long)]), width=40)
    assert all(len(ln) <= 40 for ln in narrow.splitlines()), narrow
    assert "0 :41000 serving · 0 restarts" in narrow and "1 :41001 down · 0 restarts" in narrow
    assert "  " + SHOWN in narrow and "metrics" in narrow  # the router's line wraps, whole


def _fleet(root: Path, term: Callable[..., Terminal], *flags: str) -> tuple[int, str, Terminal]:
    """Two one-chip replicas that crash once ready (no restarts): the fleet ends by itself.
    The router's metrics on a port of its own (SGLang's default, 29000, may be another's)."""
    env = {**ENV, "FAKE_MODE": "crash", "FAKE_SAY": HOSTILE, "COLUMNS": "160",
           "FAKE_READY_AFTER": "0", "FAKE_FAIL_AFTER": "0"}  # fmt: skip
    env.pop("PYTHONUNBUFFERED")  # users' shells do not set it (nor does this environment now)
    argv = ttmesh("launch", "--root", str(root), "--replicas", "2", "--tp-size", "1",
                  "--replicas-parallel", "--job-id", f"fv-{os.getpid()}",
                  f"--router-arg=--prometheus-port={METRICS}", *flags, "--", *SGLANG,
                  *seed(1, port=str(_free_port())))  # fmt: skip
    t = term(argv, env)
    code = t.finish(timeout=90)
    return code, t.text(), t


def test_a_terminal_gets_the_view_and_no_live_or_a_pipe_the_plain_lines(
    qb2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    code, text, term = _fleet(qb2, Terminal)
    # Each replica's server crashed (exit 3); two resets at once on the simulated host may end
    # a replica's job with another failure code: what counts here is what the terminal shows.
    assert code not in (0, 2), text[-3000:]
    assert "ttmesh fleet fv-" in text and "REPLICA" in text  # the view, at the bottom
    final = text.rsplit("ttmesh fleet fv-", 1)[1]
    assert re.search(rf"\n0 .*exited {code} +0 ", final), final
    assert re.search(r"\n1 .*exited [1-9]\d* +0 ", final), final
    assert f"metrics http://127.0.0.1:{METRICS}/metrics" in final  # the router's line
    assert "[replica0] " in text.split(final)[0]  # the replicas' lines still shown above it
    for bad in ("\x1b]0;pwned", "\x1b]52", "\x1b[2J", "\x1b[5A", "\x9b", "\x08", "\u202e"):
        assert bad.encode() not in term.raw  # not in a cell, nor in the lines above
    code, text, term = _fleet(qb2, Terminal, "--no-live")
    assert code not in (0, 2) and "ttmesh fleet fv-" not in text and "REPLICA" not in text, text
    assert b"\x1b[?25l" not in term.raw  # rich never hid the cursor: no live region
    assert "[replica0] " in text and "[replica1] " in text
    # A replica not started again is said so, with how many still serve.
    assert re.search(r"replica \d: its job ended \(exit [1-9]\d*\); not restarted \(its "
                     r"--max-restarts 0 used: raise it to restart a replica\): [01] of 2 "
                     r"replicas serve", text), text  # fmt: skip
    out = tmp_path / "stdout"
    with out.open("w") as f:
        code, text, term = _fleet(qb2, lambda argv, env: Terminal(argv, env, f.fileno()))
    assert code not in (0, 2) and "ttmesh fleet fv-" not in text + out.read_text()
    assert "[replica0] " in out.read_text() + text


def test_ps_shows_a_fleet_its_router_and_each_replica(runtime: Path) -> None:
    from ttmesh.runtime import jobs

    state = _state(
        [_replica(0, restarts=1), _replica(1, "exited", "[/x] " + HOSTILE, code=3, pid=None)]
    )
    jobs.write({"job": "fl", "pid": os.getpid(), "guardian": None, "root": "/", "layout": "fleet",
                "attempt": 0, "started": 0.0, "command": ["python", "-m", "sglang.launch_server"],
                "ranks": [], "fleet": state})  # fmt: skip
    res = run_cli("ps", env={"COLUMNS": "200"})
    assert res.code == 0, res.err
    rows = {ln.split()[0]: ln for ln in res.out.splitlines()[1:]}
    assert re.match(r"fl +running +\d+ +2 +0000:01:00\.0 \+3 ", rows["fl"])
    assert re.match(
        r"fl/router +running +4242 .* http://127\.0\.0\.1:31000 · 1 restart · "
        r"metrics http://127\.0\.0\.1:29555/metrics$", rows["fl/router"]
    )  # fmt: skip
    assert re.match(
        r"fl/r0 +serving +5000 +1 +0000:01:00\.0 \+1 .* http://127\.0\.0\.1:41000 · "
        r"1 restart · last: line of r0$", rows["fl/r0"]
    )  # fmt: skip
    assert re.match(
        r"fl/r1 +exited 3 +- +1 +0000:03:00\.0 \+1 .* 0 restarts · last: \[/x\] "
        + re.escape(SHOWN)
        + "$",
        rows["fl/r1"],
    )
    for bad in RAW:
        assert bad not in res.out
    listed = json.loads(run_cli("ps", "--json").out)
    fleet = next(j for j in listed["jobs"] if j["job"] == "fl")["fleet"]
    assert fleet["router"]["metrics_url"] == "http://127.0.0.1:29555/metrics"
    assert [r["last_line"] for r in fleet["replicas"]] == ["line of r0", "[/x] " + HOSTILE]
    # On a terminal the table is rich's: a "[/x]" in a line is text, not markup (no traceback).
    term = Terminal(ttmesh("ps"), env={"XDG_RUNTIME_DIR": str(runtime), "COLUMNS": "300"})
    assert term.finish() == 0, term.text()
    assert (
        "last: [/x] r" in term.text()
    )  # as text (cut to the terminal's width) and "Traceback" not in term.text()
    assert not any(bad.encode() in term.raw for bad in ("\x1b]0;pwned", "\x9b", "\x1b[2J"))


def test_a_view_that_raises_turns_the_fleet_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Watcher.show must not raise: a bug in drawing stops the view, not the fleet."""
    from ttmesh.cli import fleetview

    out = io.StringIO()
    out.isatty = lambda: True  # type: ignore[method-assign]
    view = fleetview.FleetView("fl", out)
    with view:
        view.screen.refreshed = -1e9  # each show below redraws at once
        view.show(_state([_replica(0)]))
        assert "fleet fl · 1 of 1 serving" in out.getvalue()

        def broken(*args: object) -> object:
            raise ValueError("a bug")

        monkeypatch.setattr(fleetview, "render", broken)
        view.screen.refreshed = -1e9  # its next show redraws at once
        view.show(_state([_replica(0, "down")]))  # does not raise
        assert not view.screen.running
        view.screen.write("[replica0] plain again\n")
    assert out.getvalue().endswith("[replica0] plain again\n")
