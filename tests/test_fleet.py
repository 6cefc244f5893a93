"""A serving fleet (issue 25): ``--replicas N`` runs N servers on disjoint chips behind SGLang's
router, each recovered alone. The SGLang-TorchTPU stand-in (tests/fakes) on a simulated
QuietBox 2, and the real router (sglang-router, the ``router`` extra)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import alive, run_cli, start_launch, wait_for
from test_serving import ENV, SGLANG, _free_port, seed
from users import NEEDS_NOBODY, User, users_fixture  # noqa: F401

from ttmesh import procs


def _fleet_plan(root: Path, *args: str, tp: int = 2) -> dict:
    res = run_cli("launch", "--root", str(root), "--replicas", "2", "--tp-size", str(tp),
                  "--dry-run", "--json", *args, "--", *SGLANG,
                  *seed(tp, host="0.0.0.0", port="31000"), env=ENV)  # fmt: skip
    assert res.code == 0, res.err
    return json.loads(res.out)


def test_two_replicas_are_disjoint_pairs_with_their_own_descriptors_and_ports(qb2: Path) -> None:
    data = _fleet_plan(qb2)
    assert data["recovery"] == "per-replica"
    router = {k: data["router"][k] for k in ("host", "port", "url")}
    assert router == {"host": "0.0.0.0", "port": 31000, "url": "http://0.0.0.0:31000"}
    r0, r1 = data["replicas"]
    assert len(r0["chips"]) == len(r1["chips"]) == 2
    assert not set(r0["chips"]) & set(r1["chips"])
    ports = set()
    for r in (r0, r1):
        argv = r["argv"]
        # The user's --host and --port are the router's; each replica listens on its own.
        assert argv[-4:] == ["--host", "127.0.0.1", "--port", str(r["port"])]
        assert "0.0.0.0" not in argv and "31000" not in argv
        ports.add(r["port"])
        env = r["plan"]["ranks"][0]["env"]
        assert env["TT_VISIBLE_DEVICES"] == ",".join(r["chips"])
        assert env["TT_MESH_GRAPH_DESC_PATH"] == r["descriptors"]["mesh"]
    assert len(ports) == 2 and 31000 not in ports
    assert r0["descriptors"]["mesh"] != r1["descriptors"]["mesh"]


def test_one_chip_replicas_on_n300_cards_each_start_on_one_chip_of_their_card(
    make_sim: Callable[..., Path],
) -> None:
    """A T3K's card (n300) is two chips behind one PCI address: a replica of one chip is given
    its card by that address (``--chips BDF --tp-size 1``), and its job runs on one chip of it,
    not refused for naming two."""
    t3k = make_sim("t3k")
    res = run_cli("launch", "--root", str(t3k), "--replicas", "4", "--tp-size", "1",
                  "--dry-run", "--json", "--no-memory-check", "--", *SGLANG, *seed(1), env=ENV)  # fmt: skip
    assert res.code == 0, res.err
    seen: set[str] = set()
    for r in json.loads(res.out)["replicas"]:
        (bdf,) = r["chips"]
        child = run_cli("launch", "--root", str(t3k), "--chips", bdf, "--tp-size", "1",
                        "--dry-run", "--json", "--", *r["argv"], env=ENV)  # fmt: skip
        assert child.code == 0, child.err
        (rank,) = json.loads(child.out)["ranks"]
        assert len(rank["chips"]) == 1 and rank["env"]["TT_VISIBLE_DEVICES"] == bdf
        assert not seen & set(rank["chips"])
        seen |= set(rank["chips"])
    # More chips than the cards named have is still one line.
    res = run_cli("launch", "--root", str(t3k), "--chips", "0000:01:00.0", "--tp-size", "3",
                  "--dry-run", "--", "true")  # fmt: skip
    assert res.code == 2 and "--chips names 2 chips but --tp-size is 3" in res.err, res.err


def test_one_replica_is_one_server_as_without_it(qb2: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--replicas", "1", "--dry-run", "--json", "--",
                  *SGLANG, *seed(2, port="31000"), env=ENV)  # fmt: skip
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert data["schema"] == "ttmesh.plan/1"
    assert data["serving"]["url"] == "http://127.0.0.1:31000"


def test_a_galaxy_says_its_reset_is_the_whole_host_before_the_start(
    make_sim: Callable[..., Path],
) -> None:
    data = _fleet_plan(make_sim("galaxy-bh"), tp=4)
    assert data["whole_host_reset"] is True
    assert data["recovery"] == "drain-all"  # every replica drained, one reset, all restarted
    assert "this host's reset is the whole host" in data["notes"][0]
    assert "recovered by draining every replica" in data["notes"][0]
    r0, r1 = data["replicas"]
    assert len(r0["chips"]) == 4 and not set(r0["chips"]) & set(r1["chips"])


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--replicas", "3", "--tp-size", "2"],
         "--replicas 3 of 2 chips: this host gives 2 replicas"),
        (["--replicas", "0"], "--replicas 0: too small"),
        (["--replicas", "-1"], "--replicas -1: too small"),
        (["--replicas", "nan"], "--replicas nan: not a number"),
        (["--replicas", "99999999999999"], "--replicas 99999999999999: too large"),
        (["--router-arg", "--policy"], "--router-arg goes with --replicas N"),
        (["--replicas", "2", "--master-port", "29500"], "--replicas with --master-port"),
    ],
)  # fmt: skip
def test_what_a_fleet_refuses_is_one_line(qb2: Path, args: list[str], said: str) -> None:
    res = run_cli("launch", "--root", str(qb2), "--dry-run", *args, "--", *SGLANG, *seed(2),
                  env=ENV)  # fmt: skip
    assert res.code == 2, res.err
    lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host:")]
    assert len(lines) == 1 and lines[0].startswith(f"ttmesh: {said}"), res.err


def test_vllm_refuses_replicas_with_the_reason(qb2: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--replicas", "2", "--dry-run", "--",
                  "vllm", "serve", "m", env=ENV)  # fmt: skip
    assert res.code == 2
    assert "assigns chips to its own data-parallel ranks (tenstorrent/vllm PR #430)" in res.err


def test_a_missing_router_is_one_line_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from ttmesh.errors import TTMeshError
    from ttmesh.launcher.fleet import router

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TTMeshError) as caught:
        router.check_installed()
    assert caught.value.hint == "pip install 'ttmesh[router]'"


# --------------------------------------------------------------------------- running


def _ask(url: str, path: str = "/generate") -> str | None:
    body = json.dumps({"text": "The capital of the Netherlands is"}).encode()
    req = urllib.request.Request(url + path, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read()).get("text")
    except (OSError, ValueError):
        return None


def _lines(proc: subprocess.Popen) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _until(lines: queue.Queue[str], seen: list[str], text: str, timeout: float = 60) -> None:
    while not any(text in ln for ln in seen):
        seen.append(lines.get(timeout=timeout))


def _serving(router: str) -> int:
    """How many workers the router has (its open /get_server_info: /workers takes the fleet's
    key only)."""
    try:
        with urllib.request.urlopen(router + "/get_server_info", timeout=2) as r:
            return int(json.loads(r.read())["workers_count"])
    except (OSError, ValueError, KeyError):
        return -1


def _scheduler_of(job: str) -> int:
    listed = json.loads(run_cli("ps", "--json").out)
    record = next(j for j in listed["jobs"] if j["job"] == job)
    rank = record["ranks"][0]["pid"]
    return next(p for p in procs.descendants(rank)
                if (procs.command_line(p) or "").startswith("sglang::scheduler_TP0"))  # fmt: skip


def _resets(root: Path) -> list[set[str]]:
    state = json.loads((root / "sim" / "state.json").read_text())
    return [set(r["targets"]) for r in state["resets"]]


def test_one_replica_fails_the_other_serves_then_ctrl_c_leaves_nothing_but_a_lost_chip(
    qb2: Path, tmp_path: Path
) -> None:
    port, metrics = _free_port(), _free_port()
    job = f"fleet-{os.getpid()}"
    summary = tmp_path / "fleet.json"
    proc = start_launch(
        qb2, "--replicas", "2", "--tp-size", "2", "--max-restarts", "1", "--job-id", job,
        "--quiet", "--summary-json", str(summary), f"--router-arg=--prometheus-port={metrics}",
        "--", *SGLANG, *seed(2, port=str(port)), env={**ENV, "FAKE_REPORT": str(tmp_path)},
    )  # fmt: skip
    router = f"http://127.0.0.1:{port}"
    lines, seen = _lines(proc), []
    tree: list[int] = []
    try:
        _until(lines, seen, "replica 1: ready: routed to")
        wait_for(lambda: _serving(router) == 2, timeout=30, what="both replicas in the router")
        assert _ask(router) == " Amsterdam."
        shown = run_cli("ps").out  # the fleet, its router and each replica
        assert f"{job}/router" in shown and f"{job}/r0" in shown and f"{job}/r1" in shown
        fleet = next(j for j in json.loads(run_cli("ps", "--json").out)["jobs"] if j["job"] == job)
        assert [r["state"] for r in fleet["fleet"]["replicas"]] == ["serving", "serving"]
        # The metrics port the user gave is kept, shown, and the router serves it there.
        assert fleet["fleet"]["router"]["metrics"]["port"] == metrics
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as r:
            assert r.status == 200
        tree = [proc.pid, *procs.descendants(proc.pid)]
        plan = json.loads(run_cli("sim", "show", "--root", str(qb2), "--json").out)
        asic = {c["bdf"]: c["asic_id"] for c in plan["chips"]}
        before = len(_resets(qb2))
        os.kill(_scheduler_of(f"{job}-r0"), signal.SIGKILL)
        answered = failed = 0
        deadline = time.monotonic() + 60
        while not sum("replica 0: ready: routed to" in ln for ln in seen) >= 2:
            assert time.monotonic() < deadline, "".join(seen)
            if _ask(router) == " Amsterdam.":
                answered += 1
            else:
                failed += 1
            while not lines.empty():
                seen.append(lines.get_nowait())
        assert answered > 0 and failed <= 3, (answered, failed)
        text = "".join(seen)
        # Out of the router at once, on its job's word (its event), not its /health's failures.
        assert re.search(
            r"replica 0: its job says it is down \(died: sglang::scheduler_TP0 \(pid \d+\) died "
            r"while the server ran\): taken out of the router",
            text,
        ), text
        resets = _resets(qb2)[before:]
        mine = json.loads(run_cli("ps", "--json").out)
        chips = {j["job"]: j["ranks"][0]["bdfs"] for j in mine["jobs"] if j.get("ranks")}
        r0 = {asic[b] for b in chips[f"{job}-r0"]}
        r1 = {asic[b] for b in chips[f"{job}-r1"]}
        assert resets and all(targets <= r0 for targets in resets), resets
        assert not any(targets & r1 for targets in resets)
        wait_for(lambda: _serving(router) == 2, timeout=30, what="replica 0 back in the router")
        # The router holds no chip: one that dies is started again with the serving replicas.
        fleet = next(j for j in json.loads(run_cli("ps", "--json").out)["jobs"] if j["job"] == job)
        os.kill(fleet["fleet"]["router"]["pid"], signal.SIGKILL)
        _until(lines, seen, "router: died")
        wait_for(lambda: _serving(router) == 2, timeout=30, what="the router back with both")
        assert _ask(router) == " Amsterdam."
        tree = sorted({*tree, *procs.descendants(proc.pid)})
        # A chip of replica 1's dies for good: the reset at the stop loses it from the host.
        lost = chips[f"{job}-r1"][-1]
        run_cli("sim", "fault", "--root", str(qb2), "chip-dead", lost, "--permanent")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    while not lines.empty():
        seen.append(lines.get_nowait())
    text = "".join(seen)
    # Its last word names the chip it could not verify; the others were reset and verified.
    assert proc.returncode == 1, text
    said = re.search(rf"ttmesh: fleet {job}: exit 1: stopped \(SIGINT\); 1 chip not recovered: "
                     rf"{lost} \({asic[lost]}\) \((.*)\)\n", text)  # fmt: skip
    assert said and "power-cycle the host" in said.group(1), text
    last = text.split("the fleet's chips:")[-1]  # what its last check said
    assert "reset: 3 chips recovered and verified" in last, text
    assert "reset: chips recovered and verified" not in last, text
    wait_for(lambda: not any(alive(p) for p in tree), timeout=10, what="every process gone")
    for p in (port, metrics, *(r["port"] for r in json.loads(summary.read_text())["replicas"])):
        with socket.socket() as s:  # nothing listens there any more (closed ones may linger)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
    data = json.loads(summary.read_text())
    assert data["code"] == 1 and data["reason"].startswith("stopped (SIGINT); 1 chip not")
    assert data["chips"]["not_recovered"] == [f"{lost} ({asic[lost]})"]
    assert [r["restarts"] for r in data["replicas"]] == [1, 0]
    assert data["router"]["restarts"] == 1
    assert data["router"]["metrics"]["url"] == f"http://127.0.0.1:{metrics}/metrics"
    assert not [p for p in Path("/dev/shm").glob(f"ttmesh-*/runs/{job}*")]
    # The host's one problem is that chip: every link between the others was reset together.
    check = run_cli("check", "--root", str(qb2))
    errors = [ln for ln in check.out.splitlines() if ln.startswith("error:")]
    assert check.code == 1 and errors and all(lost in ln for ln in errors), check.out


# --------------------------------------------------------------------------- events


def test_a_server_that_prints_the_ready_line_is_not_routed_to_until_its_job_says_ready(
    qb2: Path, tmp_path: Path
) -> None:
    """The fleet follows its replicas' events (launcher.job.feed), not their output: both
    servers print ttmesh's own ready line at their start and never answer /health; neither is
    routed to, and each job's end (hung in bring-up) ends the fleet."""
    early = "ttmesh: sglang-torchtpu: ready after 0.1 s at http://127.0.0.1:1"
    summary = tmp_path / "fleet.json"
    res = run_cli(
        "launch", "--root", str(qb2), "--replicas", "2", "--replicas-parallel", "--tp-size", "2",
        "--ready-timeout", "2", "--max-restarts", "0", "--grace", "2", "--summary-json",
        str(summary), "--", *SGLANG, *seed(2, port=str(_free_port())),
        env={**ENV, "FAKE_MODE": "hang", "FAKE_SAY": early}, timeout=90,
    )  # fmt: skip
    assert f"[replica0] [r0] {early}" in res.err and f"[replica1] [r0] {early}" in res.err
    assert "routed to" not in res.err and "router: started" not in res.err, res.err
    assert res.code == 124, res.err
    data = json.loads(summary.read_text())
    assert [r["state"] for r in data["replicas"]] == ["exited", "exited"]


def test_the_event_channel_takes_only_events_and_says_each_junk_line(tmp_path: Path) -> None:
    from ttmesh.launcher.job import feed

    good = {"schema": feed.SCHEMA, "event": "ready", "attempt": 0, "url": "http://x:1", "after": 1}
    lines = [
        json.dumps(good).encode(),
        b"ttmesh: sglang-torchtpu: ready after 0.1 s at http://127.0.0.1:1",  # text, not JSON
        b"[1, 2]",
        json.dumps({**good, "schema": "ttmesh.other/1"}).encode(),
        json.dumps({**good, "event": "rm -rf"}).encode(),
        json.dumps({**good, "attempt": "0"}).encode(),
        json.dumps({**good, "attempt": True}).encode(),
        json.dumps({k: v for k, v in good.items() if k != "url"}).encode(),
        b"[" * 100_000,  # over the bound: skipped whole, never parsed
        b"\xff\xfe not utf-8",
        json.dumps({"schema": feed.SCHEMA, "event": "ended", "code": 3}).encode(),
    ]
    read, write = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(write, b"\n".join(lines) + b"\n"),
                                              os.close(write)))  # fmt: skip
    writer.start()
    events: list[dict] = []
    junk: list[str] = []
    feed.read_events(read, events.append, junk.append)
    writer.join()
    assert events == [good, {"schema": feed.SCHEMA, "event": "ended", "code": 3}]
    assert len(junk) == len(lines) - 2, junk
    assert junk[0].startswith("not JSON: 'ttmesh: sglang-torchtpu: ready after"), junk
    assert f"a line over {feed.MAX_LINE} bytes" in junk
    assert all(len(why) < 200 for why in junk)  # said in a line, never the whole junk


def test_the_events_fd_is_a_writable_pipe_of_this_users_or_one_line(tmp_path: Path) -> None:
    from ttmesh.errors import TTMeshError
    from ttmesh.launcher.job import feed

    read, write = os.pipe()
    os.set_inheritable(write, True)
    with open(tmp_path / "f", "w") as plain:
        for fd, said in ((plain.fileno(), "not a pipe of this user's"),
                         (read, "not open for writing"), (9999, "no such open file")):  # fmt: skip
            with pytest.raises(TTMeshError) as caught:
                feed.open_channel(fd)
            assert caught.value.code == 2 and said in caught.value.message
    assert feed.open_channel(write) == write and not os.get_inheritable(write)  # not for workers
    os.close(read)
    os.close(write)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--events-fd", "1"], "--events-fd goes with --fleet-of"),
        (["--fleet-of", "f", "--events-fd", "9999"], "--events-fd 9999: no such open file"),
        (["--replicas", "2", "--events-fd", "1"], "--replicas with --events-fd"),
    ],
)
def test_events_fd_is_only_the_fleets(qb2: Path, args: list[str], said: str) -> None:
    res = run_cli("launch", "--root", str(qb2), *args, "--", *SGLANG, *seed(2), env=ENV)
    assert res.code == 2, res.err
    lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host:")]
    assert len(lines) == 1 and lines[0].startswith(f"ttmesh: {said}"), res.err


def _reset_log(root: Path) -> list[dict]:
    return json.loads((root / "sim" / "state.json").read_text())["resets"]


def _fleet_record(job: str) -> dict:
    return next(j for j in json.loads(run_cli("ps", "--json").out)["jobs"] if j["job"] == job)


def test_on_a_galaxy_one_replica_failing_drains_every_replica_for_one_whole_host_reset(
    make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    """A Galaxy's reset is the whole host (-glx_reset): a replica whose chips need a reset
    never resets them itself (that would take the other's chips); the fleet drains every
    replica, resets the host once, and restarts both."""
    root = make_sim("galaxy-bh")
    port, metrics = _free_port(), _free_port()  # the router's own: not its default, 29000
    job = f"glx-{os.getpid()}"
    summary = tmp_path / "fleet.json"
    proc = start_launch(
        root, "--replicas", "2", "--tp-size", "4", "--max-restarts", "1", "--job-id", job,
        "--summary-json", str(summary), f"--router-arg=--prometheus-port={metrics}",
        "--", *SGLANG, *seed(4, port=str(port)), env=ENV,
    )  # fmt: skip
    router = f"http://127.0.0.1:{port}"
    lines, seen = _lines(proc), []
    tree: list[int] = []
    try:
        _until(lines, seen, "replica 1: ready: routed to")
        wait_for(lambda: _serving(router) == 2, timeout=30, what="both replicas in the router")
        tree = [proc.pid, *procs.descendants(proc.pid)]
        before = len(_reset_log(root))
        os.kill(_scheduler_of(f"{job}-r0"), signal.SIGKILL)
        _until(lines, seen, "this host's reset is the whole host: draining every replica")
        _until(lines, seen, "every replica restarting")
        while (
            sum("replica 1: ready: routed to" in ln for ln in seen) < 2
            or sum("replica 0: ready: routed to" in ln for ln in seen) < 2
        ):
            seen.append(lines.get(timeout=60))
        wait_for(lambda: _serving(router) == 2, timeout=30, what="both replicas back in the router")
        assert _ask(router) == " Amsterdam."
        text = "".join(seen)
        # Every replica drained: the healthy one was stopped by the fleet, not by a failure.
        assert re.search(r"\[replica1\] ttmesh: terminated \(SIGTERM\)", text), text
        # Neither child reset by itself: one whole-host reset, by the fleet.
        resets = _reset_log(root)[before:]
        assert [r["command"] for r in resets] == ["-glx_reset"], resets
        assert len(resets[0]["targets"]) == 32
        fleet = _fleet_record(job)["fleet"]
        assert fleet["recovery"] == "drain-all"
        assert len(fleet["host_resets"]) == 1 and fleet["host_resets"][0]["replica"] == 0
        assert [r["state"] for r in fleet["replicas"]] == ["serving", "serving"]
        tree = sorted({*tree, *procs.descendants(proc.pid)})
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, "".join(seen)
    wait_for(lambda: not any(alive(p) for p in tree), timeout=10, what="every process gone")
    data = json.loads(summary.read_text())
    assert [r["restarts"] for r in data["replicas"]] == [1, 0]
    assert [r["drains"] for r in data["replicas"]] == [0, 1]
    assert data["recovery"] == "drain-all" and len(data["host_resets"]) >= 1
    assert all(r["command"] == "-glx_reset" for r in _reset_log(root)[before:])
    assert not [p for p in Path("/dev/shm").glob(f"ttmesh-*/runs/{job}*")]
    assert run_cli("check", "--root", str(root)).code == 0


def test_a_replica_on_a_galaxy_leaves_its_reset_to_the_fleet_and_says_what_it_needs(
    make_sim: Callable[..., Path],
) -> None:
    """In-process: a fleet's replica (--fleet-of) resets nothing itself where one reset is the
    whole host; it records the chips that need it, for its --summary-json. Elsewhere, and
    outside a fleet, its chips are its own to reset."""

    from ttmesh.cli.hosts import open_host
    from ttmesh.fabric.devices import discover
    from ttmesh.launcher.job.jobstate import JobState
    from ttmesh.launcher.job.repair import Recovery, defers_reset, reset_chips

    galaxy = make_sim("galaxy-bh")
    inv = discover(open_host(galaxy))
    assert defers_reset("f", inv) and not defers_reset(None, inv)
    assert not defers_reset("f", discover(open_host(make_sim("quietbox2"))))
    chips = [c.asic_id for c in inv.chips if c.bdf][:2]
    recovery = Recovery(fleet_of="fleet-a")
    state = JobState(inv)  # the job's own: what it needs of its fleet is kept there
    assert reset_chips(state, recovery, chips, why="2 links down") is None
    assert state.deferred == {
        "what": "whole-host-reset", "fleet": "fleet-a", "why": "2 links down",
        "chips": [c.bdf for c in inv.chips if c.bdf][:2],
    }  # fmt: skip
    assert _reset_log(galaxy) == []  # nothing reset: not even tt-smi run


def test_a_drain_all_counts_a_restart_for_the_failed_replica_only() -> None:
    """In-process: the replica whose chips needed the whole-host reset counts a restart under
    --max-restarts; the ones drained beside it do not; one over its max ends the fleet."""
    from ttmesh.launcher.fleet import drain

    assert drain.recovery_mode(True) == "drain-all"
    assert drain.recovery_mode(False) == "per-replica"
    counted = drain.after_drain([0, 0, 1], [0], max_restarts=2)
    assert counted == drain.Restarts(None, [1, 0, 1], [1, 2, 1])
    assert drain.after_drain([1, 0], [0], max_restarts=1).over == 0
    assert drain.after_drain([1, 3], [0, 1], max_restarts=2).over == 1
    needs = {"what": "whole-host-reset", "chips": ["0000:01:00.0"]}
    assert drain.needs_whole_host({"code": 1, "needs": needs}) == needs
    # A replica the fleet drained asks only when it had failed by itself first.
    failed = {"source": "ttmesh", "code": 1, "needs": needs}  # its server died (the guardian saw)
    assert drain.needs_whole_host(failed, stopped=True) == needs
    assert drain.needs_whole_host({**failed, "code": 143}, stopped=True) is None  # our SIGTERM
    for outcome in (None, [], "x", {"code": 1}, {"needs": "whole-host-reset"},
                    {"needs": {"what": "other"}}):  # fmt: skip
        assert drain.needs_whole_host(outcome) is None


# --------------------------------------------------------------------------- the router's doors


class _Worker:
    """A server the real router takes as a worker: /health, /model_info and /server_info
    answer 200 (what 0.3.2 asks of a worker it adds), on a loopback port of its own."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b'{"model_path": "m"}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _listening(pid: int) -> set[tuple[str, int]]:
    import psutil

    conns = psutil.Process(pid).net_connections(kind="tcp")
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}


def test_the_routers_admin_key_is_in_no_command_line_and_its_ports_are_where_said(
    tmp_path: Path,
) -> None:
    """The real router (sglang-router 0.3.2), started as a fleet starts it: its admin key
    (one per start) is on its stdin only, never in any of its processes' command lines or
    environments; ttmesh's own requests carry it (a worker added is listed, then removed); one
    without it is refused; it listens where ttmesh says: the fleet's --host:--port and its
    metrics on 127.0.0.1 (0.3.2 alone would take every address, 0.0.0.0)."""
    from types import SimpleNamespace

    from ttmesh.launcher.fleet import routeropts
    from ttmesh.launcher.fleet.router import Router

    port = _free_port()
    opts = routeropts.read(SimpleNamespace(extra={}, path="", name="p"), (), port, {port})
    said: list[str] = []
    router = Router("127.0.0.1", port, opts.args, str(tmp_path / "router.log"), said.append)
    worker = _Worker()
    try:
        router.start([])
        first = router.key
        wait_for(lambda: router.reconcile([worker.url]) and worker.url in router.listed,
                 timeout=60, what="the worker added and listed")  # fmt: skip
        for pid in (router.pid, *procs.descendants(router.pid)):
            for part in ("cmdline", "environ"):
                shown = Path(f"/proc/{pid}/{part}").read_bytes()
                assert first.encode() not in shown and b"api-key" not in shown, (pid, part)
        assert _listening(router.pid) == {("127.0.0.1", port), ("127.0.0.1", opts.metrics_port)}
        for method, path in (
            ("GET", "/workers"),
            ("DELETE", f"/workers/{'0' * 8}-0000-4000-8000-{'0' * 12}"),
        ):
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=10)
            assert refused.value.code == 401
        router.reconcile([])  # ttmesh's DELETE, with the key: taken
        wait_for(lambda: router.workers() == {}, timeout=30, what="the worker removed")
        assert not [s for s in said if "refuses" in s], said
        router.stop(5.0)
        router.start([])
        assert router.key and router.key != first  # each start its own
    finally:
        router.stop(5.0)
        worker.close()


def test_routed_to_is_said_of_a_replica_only_once_the_router_lists_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replica's job says it is ready: the fleet asks the router to add it, and says
    "routed to" only when the router lists it; a refusal (its status and reason, escaped, on
    one line) is said instead, once, and nothing is said to be routed to. In-process, with a
    stand-in router (tests/workers/fake_router.py) started as the fleet starts the real one."""
    from types import SimpleNamespace

    from ttmesh.launcher.fleet.router import Router
    from ttmesh.launcher.fleet.run import Fleet, Member

    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent / "workers"))
    urls = ["http://127.0.0.1:1/refuse", "http://127.0.0.1:2/reject", "http://127.0.0.1:3"]
    fleet: Any = Fleet.__new__(Fleet)
    fleet.members = [
        Member(SimpleNamespace(index=k, url=u, job=f"f-r{k}", bdfs=[]), "")  # type: ignore[arg-type]
        for k, u in enumerate(urls)
    ]
    fleet.lock, fleet.view, fleet.failed, fleet.guard_pipe = threading.Lock(), None, None, -1
    fleet.record = lambda: None
    port = _free_port()
    fleet.router = Router("127.0.0.1", port, [], str(tmp_path / "router.log"), fleet.say,
                          module="fake_router")  # fmt: skip
    try:
        fleet.router.start([])
        wait_for(lambda: fleet.router.workers() is not None, timeout=30, what="the router")
        for k, m in enumerate(fleet.members):
            m.state = "starting"
            fleet._event(k, {"event": "ready", "url": m.replica.url})
        wait_for(lambda: (fleet._route(), fleet.members[2].routed)[1], timeout=30,
                 what="the third replica routed to")  # fmt: skip
        fleet._route()
        err = capsys.readouterr().err
    finally:
        fleet.router.stop(5.0)
    routed = [ln for ln in err.splitlines() if re.match(r"ttmesh: replica \d: ready: routed", ln)]
    assert routed == ["ttmesh: replica 2: ready: routed to at http://127.0.0.1:3"], err
    (refusal,) = [ln for ln in err.splitlines() if ln.startswith("ttmesh: replica 0:")]
    assert refusal == (
        "ttmesh: replica 0: ready, but the router refuses to route to it (HTTP 400: worker "
        "refused ttmesh: replica 0: ready: routed to): asking again every 10 s"
    ), err
    assert (
        "ttmesh: replica 1: ready, but the router refuses to route to it (HTTP 202: not today): "
        "asking again every 10 s"
    ) in err, err
    assert "\x1b" not in err, err
    assert [m.routed for m in fleet.members] == [False, False, True]


# Another user's requests to the router's admin routes (standard library only: nobody's Python).
NOBODY_ASKS = r"""
import json, sys, urllib.error, urllib.request
port, theirs = sys.argv[1], sys.argv[2]
for method, path, body in (
    ("GET", "/workers", None), ("POST", "/workers", {"url": theirs}),
    ("DELETE", "/workers/00000000-0000-4000-8000-000000000000", None),
    ("POST", "/flush_cache", None), ("GET", "/get_loads", None),
):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            print(method, path, r.status)
    except urllib.error.HTTPError as e:
        print(method, path, e.code)
"""


def test_another_user_cannot_use_the_routers_admin_routes_and_a_sigkilled_fleet_is_ended(
    qb2: Path, users: dict[str, User], tmp_path: Path
) -> None:
    """Root's fleet: nobody's requests to the router's admin routes (list, add a worker of its
    own, remove one, flush, loads) are refused (401) and the fleet serves on with its two
    replicas; no process of the fleet has a key in its command line; the router listens where
    ttmesh said (the fleet's port, its metrics on 127.0.0.1). Then the fleet's ttmesh is
    SIGKILLed: the replicas stop themselves, and its guard stops the router, resets the links
    between the replicas' chips (each replica reset only its own), removes the fleet's /tmp
    directory, writes its summary and closes its record. The host is healthy and the whole
    host starts a job."""
    if "nobody" not in users:
        pytest.skip(NEEDS_NOBODY)
    port, metrics = _free_port(), _free_port()
    job = f"fleetk-{os.getpid()}"
    summary = tmp_path / "fleet.json"
    proc = start_launch(
        qb2, "--replicas", "2", "--tp-size", "2", "--job-id", job, "--summary-json", str(summary),
        f"--router-arg=--prometheus-port={metrics}", "--", *SGLANG, *seed(2, port=str(port)),
        env=ENV,
    )  # fmt: skip
    router = f"http://127.0.0.1:{port}"
    lines, seen = _lines(proc), []
    try:
        _until(lines, seen, "replica 1: ready: routed to")
        wait_for(lambda: _serving(router) == 2, timeout=30, what="both replicas in the router")
        record = _fleet_record(job)
        rpid, guard = record["fleet"]["router"]["pid"], record["guardian"]
        assert _listening(rpid) == {("127.0.0.1", port), ("127.0.0.1", metrics)}
        for pid in (proc.pid, *procs.descendants(proc.pid), rpid, guard):
            assert not [w for w in procs.argv(pid) if "api-key" in w or "api_key" in w], pid
        asked = users["nobody"].py(NOBODY_ASKS, str(port), "http://127.0.0.1:9/theirs")
        assert asked.returncode == 0, asked.stderr
        codes = [ln.rsplit(" ", 1)[1] for ln in asked.stdout.splitlines()]
        assert codes == ["401"] * 5, asked.stdout
        assert _serving(router) == 2 and _ask(router) == " Amsterdam."
        dirs = list(Path(tempfile.gettempdir()).glob(f"ttmesh-fleet-{job}-*"))
        assert len(dirs) == 1
        os.kill(proc.pid, signal.SIGKILL)
        _until(lines, seen, f"fleet {job}: exit 137: launcher killed", timeout=120)
        wait_for(lambda: not alive(guard), timeout=10, what="the guard gone")
    finally:
        proc.kill()
        proc.wait()
    text = "".join(seen)
    assert f"ttmesh: fleet {job}: ttmesh was killed: ending the fleet in its place" in text, text
    assert "the fleet's chips: " in text and "reset: chips recovered and verified" in text, text
    assert not alive(rpid) and not dirs[0].exists()
    ended = {j["job"]: j for j in json.loads(run_cli("ps", "--all", "--json").out)["jobs"]}
    assert ended[job]["status"].startswith("launcher killed") and ended[job]["code"] == 137
    data = json.loads(summary.read_text())
    assert data["code"] == 137 and data["chips"] == {"reset": True, "not_recovered": [], "why": ""}
    assert [r["outcome"]["code"] for r in data["replicas"]] == [143, 143]  # each its own stop
    assert all(ended[f"{job}-r{k}"].get("ended") for k in (0, 1))
    assert run_cli("check", "--root", str(qb2)).code == 0
    whole = run_cli("launch", "--root", str(qb2), "--tp-size", "4", "--", sys.executable, "-c",
                    "pass")  # fmt: skip
    assert whole.code == 0, whole.err


def test_a_fleet_directory_is_swept_only_when_its_fleet_and_guard_are_gone(tmp_path: Path) -> None:
    """What a fleet whose ttmesh and guard were both killed left in /tmp goes at the next
    fleet's start: only this user's directories whose lock nobody holds; never one a fleet
    or its guard still holds, one without the lock (a ttmesh without it: unknown), another
    user's, or a link."""
    import fcntl

    from ttmesh import paths
    from ttmesh.launcher.fleet import run

    base = Path(tempfile.gettempdir())
    made = {name: Path(tempfile.mkdtemp(prefix=f"ttmesh-fleet-sweep{name}-")) for name in
            ("gone", "held", "nolock", "theirs")}  # fmt: skip
    link = base / f"ttmesh-fleet-sweeplink-{os.getpid()}"
    try:
        for name in ("gone", "held", "theirs"):
            (made[name] / paths.LOCK).touch()
        if os.geteuid() == 0:  # another user's (only root can give it away)
            os.chown(made["theirs"], 65534, 65534)
        else:
            made.pop("theirs")
        link.symlink_to(made["gone"])
        with open(made["held"] / paths.LOCK) as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            removed = run.sweep_dirs()
        assert str(made["gone"]) in removed and not made["gone"].exists()
        assert all(made[n].exists() for n in made if n != "gone"), removed
        assert link.is_symlink() and str(link) not in removed
    finally:
        link.unlink(missing_ok=True)
        for path in made.values():
            subprocess.run(["rm", "-rf", str(path)], check=False)


def test_a_reset_never_calls_a_chip_the_host_lost_recovered(
    make_sim: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process: a job's (or a fleet's) chips reset while one of them is gone from the host
    (a chip that died for good, lost at an earlier reset): the others are reset and verified,
    and the line says so of them only, naming the lost one as not recovered; the fleet's check
    (fleet.between) keeps it for the fleet's last line and exit code (issue 38)."""

    from ttmesh.cli.hosts import open_host
    from ttmesh.fabric.devices import discover
    from ttmesh.launcher.fleet import between
    from ttmesh.launcher.job.jobstate import JobState
    from ttmesh.launcher.job.repair import Recovery, reset_chips
    from ttmesh.recovery import reset
    from ttmesh.sim import faults

    host = open_host(make_sim("quietbox2"))
    lost = "0000:07:00.0"
    asics = [c.asic_id for c in discover(host).chips]
    gone = faults.chip_dead(host, lost, permanent=True)
    reset.recover(host, [gone], retries=0, expand_set=False)  # the driver lists it no more
    faults.link_down(host, "0000:01:00.0", "0000:03:00.0")
    capsys.readouterr()
    outcome = reset_chips(JobState(discover(host)), Recovery(), asics)
    said = capsys.readouterr().err
    assert outcome is not None and outcome.unreached == (gone,)
    assert (
        f"ttmesh: reset: 3 chips recovered and verified ({outcome.seconds:.1f} s); not recovered: "
        f"{lost} ({gone}) (missing from the host: a reset cannot reach it; power-cycle the host)"
    ) in said, said
    assert "reset: chips recovered and verified" not in said, said
    faults.link_down(host, "0000:01:00.0", "0000:03:00.0")
    lines: list[str] = []
    found = between.check(host, asics, {gone: lost}, tt_smi=None, train_timeout=None,
                          say=lines.append)  # fmt: skip
    assert found.lost == [f"{lost} ({gone})"] and not found.healthy, lines
    assert found.clause().startswith(f"1 chip not recovered: {lost} ({gone}) (missing from")
    assert not [ln for ln in lines if ln.startswith("reset: chips recovered and verified")], lines
