"""A server's start as a checklist (issue 36): each stock profile's steps, classified from the
server's own lines; one plain line per step in a pipe, rows on a terminal, the step a ready
timeout stuck in, each step's time in --summary-json; one time format everywhere."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from ttmesh.errors import TTMeshError
from ttmesh.launcher.serving import checklist, profiles
from ttmesh.render import clock

STANDIN = str(REPO / "ttmesh" / "sim" / "standin")
ENV = {"PYTHONPATH": STANDIN, "PYTHONUNBUFFERED": "1"}


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_time_format() -> None:
    assert [clock(s) for s in (0, 0.64, 40.5, 59.94, 60, 187, 3599, 3723)] == [
        "0.0 s", "0.6 s", "40.5 s", "59.9 s", "1:00", "3:07", "59:59", "1:02:03",
    ]  # fmt: skip


STEPS = [
    {"key": "engine", "label": "starting the engine", "done": "engine started",
     "start": "server_args="},
    {"key": "device", "label": "opening the chips", "done": "chips opened",
     "start": ["Opening user mode device driver"], "end": "Init torch distributed ends",
     "detail": [{"match": r"with (?P<n>\d+) devices? and grid \((?P<mesh>[^)]*)\)",
                 "say": "{n} chips · mesh ({mesh})"}]},
    {"key": "fetch", "label": "fetching", "done": "fetched", "start": "Fetching", "planned": False},
    {"key": "weights", "label": "loading the weights", "done": "weights loaded",
     "start": "Load weight begin"},
    {"key": "kv", "label": "allocating the KV cache", "done": "KV cache allocated",
     "start": "KV Cache is allocated", "detail": {"match": r"#tokens: (?P<t>\d+)",
                                                  "say": "{t} tokens"}},
]  # fmt: skip


def test_the_log_moves_the_checklist_forward_only() -> None:
    steps = checklist.load(STEPS, "profile p")
    c = checklist.Checklist(steps, t0=100.0)
    assert [r.step.key for r in c.shown] == [
        "engine",
        "device",
        "weights",
        "kv",
    ]  # fetch: unplanned
    assert c.position() == (0, 4) and c.feed("noise", 100.5) == []
    assert c.feed("[x] server_args=ServerArgs(...)", 101.0) == []
    assert c.position() == (1, 4) and c.where(103.0) == "starting the engine for 2.0 s"
    done = c.feed("Opening user mode device driver", 102.0)  # the next step ends the last
    assert [(r.step.key, r.state) for r in done] == [("engine", "done")]
    c.feed("multidevice with 4 devices and grid (1, 4) is created", 103.0)
    done = c.feed("Init torch distributed ends", 104.0)  # its own end
    assert [r.step.key for r in done] == ["device"]
    assert c.said(done[0]) == "[2/4 · 4.0 s] chips opened in 2.0 s (4 chips · mesh (1, 4))"
    assert c.feed("server_args= again", 105.0) == []  # never back
    c.feed("KV Cache is allocated. dtype: x, #tokens: 2048, K", 106.0)  # weights skipped
    assert [r.state for r in c.shown] == ["done", "done", "skipped", "active"]
    assert c.rows[2].state == "planned"  # the unplanned fetch stays unshown
    assert c.shown[3].detail == "2048 tokens" and c.position() == (4, 4)
    [last] = c.ready(110.0)
    assert last.step.key == "kv" and c.current is None
    data = c.to_json()
    assert data[3] == {"key": "kv", "label": "KV cache allocated", "state": "done",
                       "started": 6.0, "seconds": 4.0, "detail": "2048 tokens"}  # fmt: skip


def test_an_unplanned_step_shows_once_the_log_enters_it() -> None:
    c = checklist.Checklist(checklist.load(STEPS, "p"), t0=0.0)
    c.feed("Fetching 4 files", 1.0)
    assert [r.step.key for r in c.shown] == ["engine", "device", "fetch", "weights", "kv"]
    assert [r.state for r in c.shown][:3] == ["skipped", "skipped", "active"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"start": "("}, "not a regular expression RE2 can run"),
        ({"start": "(a+)+\\1"}, "backreference"),
        ({"start": "x|"}, "matches every line"),
        ({"start": []}, "must be a pattern or a list"),
        ({"start": "x" * 501}, "a pattern is text of 1 to 500 characters"),
        ({"oops": 1}, "unknown key oops"),
        ({"key": "a b"}, "is not a word"),
        ({"label": ""}, "label must be text"),
        ({"planned": "yes"}, "planned must be true or false"),
        ({"detail": {"match": "(?P<n>x)", "say": "{m}"}}, "say names m, which its pattern"),
        ({"detail": {"match": "x", "say": "{"}}, "write a literal brace twice"),
        ({"detail": [{"match": "x"}]}, "each is a map of match"),
    ],
)
def test_a_broken_step_is_refused_naming_the_profile(change: dict, message: str) -> None:
    step = {**STEPS[0], **change}
    with pytest.raises(TTMeshError) as info:
        checklist.load([step], "profile /p.yaml")
    said = f"{info.value.message} ({info.value.hint})"
    assert said.startswith("profile /p.yaml: checklist") and message in said, said
    assert info.value.code == 2


def test_too_many_steps_or_not_a_list_is_refused() -> None:
    for raw in ({"key": "x"}, [STEPS[0]] * 25, "x"):
        with pytest.raises(TTMeshError, match="checklist must be a list"):
            checklist.load(raw, "profile p")
    with pytest.raises(TTMeshError, match="key 'engine' is used twice"):
        checklist.load([STEPS[0], STEPS[0]], "profile p")


def test_every_stock_profile_declares_its_start() -> None:
    keys = {p.name: [s.key for s in p.steps() if s.planned] for p in profiles.every()}
    assert keys == {
        "sglang-torchtpu": ["engine", "device", "weights", "kv", "compile", "server"],
        "sglang-jax": ["engine", "device", "weights", "kv", "compile", "server"],
        "vllm-tt": ["engine", "device", "weights", "kv", "warmup", "server"],
        "sglang": ["engine", "ranks", "weights", "kv", "server"],
    }


PIPE = re.compile(
    r"^ttmesh: (\S+): \[(\d+)/(\d+) · ([\d.:]+(?: s)?)\] (.+) in ([\d.:]+(?: s)?)(?: \((.*)\))?$"
)


@pytest.mark.parametrize(
    ("module", "argv", "rows"),
    [
        ("sglang.launch_server",
         ["--model-path", "Qwen/Qwen3-8B", "--device", "tpu", "--tp-size", "4", "--tpu-compile-tokens", "64", "256",
          "--chunked-prefill-size", "256", "--max-total-tokens", "8192",
          "--kv-cache-dtype", "bfloat16", "--grammar-backend", "none"],
         [("engine started", ""), ("chips opened", "4 chips · mesh (1, 4)"),
          ("weights loaded", "Qwen3ForCausalLM · 16.38 GB"), ("KV cache allocated", "8192 tokens"),
          ("programs compiled", "prefill lengths [64, 256] · batch sizes [1, 4]"),
          ("API server up", "")]),
        ("sgl_jax.launch_server", ["--model-path", "Qwen/Qwen3-8B", "--tp-size", "2"],
         [("engine started", ""), ("chips opened", "2 chips · mesh (1, 2)"),
          ("weights loaded", ""), ("KV cache allocated", "16384 tokens"),
          ("programs compiled", "prefill lengths [64] · batch sizes [1, 4]"),
          ("API server up", "")]),
        ("vllm.entrypoints.openai.api_server", ["--model", "m"],
         [("engine started", "vLLM 0.10.1.dev0+tt"), ("chips opened", "4 chips · mesh (1, 4)"),
          ("weights loaded", ""), ("KV cache allocated", "16,384 tokens"),
          ("warmed up", "prefill 64"), ("API server up", "")]),
    ],
)  # fmt: skip
def test_each_stacks_start_is_one_line_per_step_in_a_pipe_and_in_the_summary(
    module: str, argv: list[str], rows: list[tuple[str, str]], qb2: Path, tmp_path: Path
) -> None:
    out = tmp_path / "s.json"
    port = _port()
    cmd = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *argv]
    res = run_cli("launch", "--root", str(qb2), "--summary-json", str(out), "--", *cmd,
                  env={**ENV, "FAKE_MODE": "crash"}, timeout=120)  # fmt: skip
    assert res.code == 3, res.err  # it crashes once ready: the job ends with its code
    said = [PIPE.match(ln) for ln in res.err.splitlines()]
    got = [(m.group(5), m.group(7) or "") for m in said if m]
    assert got == rows, res.err
    assert [int(m.group(2)) for m in said if m] == list(range(1, len(rows) + 1))
    assert {int(m.group(3)) for m in said if m} == {len(rows)}
    assert res.err.index(f"[{len(rows)}/{len(rows)}") < res.err.index("ready after")
    phases = json.loads(out.read_text())["phases"]
    assert [(p["label"], p["detail"]) for p in phases] == rows
    assert all(p["state"] == "done" and p["seconds"] >= 0 and p["started"] >= 0 for p in phases)
    assert json.loads(out.read_text())["attempts"][0]["phases"] == phases


def test_a_ready_timeout_names_the_step_it_stuck_in(qb2: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", "M", "--device", "tpu", "--host",
           "127.0.0.1", "--port", str(_port())]  # fmt: skip
    out = tmp_path / "s.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--ready-timeout", "2",
                  "--summary-json", str(out), "--", *cmd,
                  env={**ENV, "FAKE_MODE": "slow-compile"}, timeout=120)  # fmt: skip
    assert res.code == 124, res.err
    assert re.search(r"rank 0 not ready after 2 s \(stuck in compiling the programs for "
                     r"[\d.]+ s; http://\S+ never answered\): treating the job as hung",
                     res.err), res.err  # fmt: skip
    phases = json.loads(out.read_text())["phases"]
    assert [p["state"] for p in phases] == ["done", "done", "done", "done", "active", "planned"]
    assert phases[4]["seconds"] is None and phases[5]["started"] is None


def test_the_live_view_draws_the_rows_the_deadline_and_each_time() -> None:
    from rich.console import Console

    from ttmesh.cli.live import JobView
    from ttmesh.launcher.planning.request import Policy

    class Plan:
        job, rank_offset, policy = "j", 0, Policy(max_restarts=0, ready_timeout=1800.0)
        serving = object()
        ranks: tuple = ()

    buffer = io.StringIO()
    view = JobView(Plan(), stream=buffer)  # type: ignore[arg-type]
    view.attempt(0)
    view.attempt_t0 -= 41.0  # the attempt began 41 s ago
    view.checklist([
        {"key": "engine", "label": "engine started", "state": "done", "started": 0.2,
         "seconds": 0.6, "detail": ""},
        {"key": "device", "label": "chips opened", "state": "done", "started": 0.8,
         "seconds": 12.1, "detail": "4 chips · mesh (1, 4)"},
        {"key": "weights", "label": "loading the weights", "state": "active", "started": 12.9,
         "seconds": None, "detail": ""},
        {"key": "kv", "label": "allocating the KV cache", "state": "planned", "started": None,
         "seconds": None, "detail": "\x1b[2Jx"},
    ], 1800.0)  # fmt: skip
    console = Console(file=buffer, width=100, color_system=None)
    console.print(view.render())
    text = buffer.getvalue()
    assert re.search(
        r"\[3/4 · 41\.\d s\] loading the weights · ready within 30:00 \(by \d\d:\d\d\)", text
    ), text
    assert (
        re.search(r"✓ engine started\s+0\.6 s", text)
        and "✓ chips opened  4 chips · mesh (1, 4)" in text
    )
    assert re.search(r"▸ loading the weights\s+28\.\d s", text), text  # its time so far
    assert "· allocating the KV cache" in text and "\x1b[2J" not in text


def test_a_servers_hostile_text_reaches_no_terminal_and_is_bounded() -> None:
    steps = checklist.load(STEPS, "p")
    c = checklist.Checklist(steps, t0=0.0)
    c.feed("server_args=", 1.0)
    c.feed("KV Cache is allocated. #tokens: 12\x1b[2J\x07", 2.0)  # \d+ stops at the escape
    c.feed("Opening user mode device driver", 3.0)
    c.feed("with 4 devices and grid (\x1b]0;pwned\x07" + "x" * 5000 + ")", 4.0)
    detail = c.rows[1].detail
    assert "\x1b" not in detail and "pwned" not in detail and len(detail) <= checklist.MAX_DETAIL
    one = checklist.load([{**STEPS[1], "detail": {"match": r"with (?P<n>\d+) devices?",
                                                 "say": "{n:chip}"}}], "p")  # fmt: skip
    c = checklist.Checklist(one, t0=0.0)
    c.feed("Opening user mode device driver with 1 devices", 1.0)
    assert c.rows[0].detail == "1 chip"
