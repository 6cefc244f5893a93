"""The job's chips watched while it runs (issue 36): a frozen heartbeat, a chip gone from the
bus, links between the job's chips down, each stops the job at once with the chip and what
was seen; the chips are recovered and verified, the job restarted when allowed. In-process for
the watch's rules (a clock of the test's own), end to end with a fault injected mid-run for a
plain job, a server and one replica of a fleet."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, Lines, alive, run_cli, start_launch, wait_for

from ttmesh import procs
from ttmesh.cli.hosts import open_host
from ttmesh.fabric.chipwatch import ChipWatch, frozen_after
from ttmesh.fabric.devices import discover
from ttmesh.sim import faults

C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"
TW = str(REPO / "tests" / "workers" / "tw.py")
STANDIN = str(REPO / "ttmesh" / "sim" / "standin")
SGLANG = [sys.executable, "-m", "sglang.launch_server"]
ENV = {"PYTHONPATH": STANDIN, "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def fast(make_sim: Callable[..., Path]) -> Path:
    """A QuietBox 2 whose live heartbeats move between any two reads (1 MHz): the watch's
    clock is the test's own, so only a frozen chip stands still."""
    return make_sim("quietbox2", heartbeat_hz=1e6)


def _watch(root: Path, bdfs: list[str], ended: Callable[[], str | None] | None = None) -> ChipWatch:
    inv = discover(open_host(root))
    return ChipWatch(inv, [inv.by_bdf()[b].asic_id for b in bdfs], now=0.0, ended=ended)


def test_a_frozen_heartbeat_is_seen_after_two_reads_and_named(fast: Path) -> None:
    watch = _watch(fast, [C01, C03, C05, C07])
    assert watch.every == 1.0 and watch.frozen == 2.0
    assert watch.step(0.0) is None  # the first read
    assert watch.step(0.5) is None and watch.due() == 1.0  # not due: nothing read
    faults.chip_dead(open_host(fast), C03)
    assert watch.step(1.0) is None  # its last value differs from the first read's
    assert watch.step(2.0) is None  # unmoved for 1 s: one read is not enough
    found = watch.step(3.0)
    assert found is not None and (found.kind, found.chip) == ("frozen", C03), found
    assert re.fullmatch(r"its heartbeat stopped \(at \d+, unmoved for 2\.0 s; its firmware hangs\)",
                        found.what), found.what  # fmt: skip
    assert found.line.startswith(f"chip {C03} failed under the job: its heartbeat stopped")


def test_a_chip_gone_from_the_bus_is_seen_at_the_next_read(fast: Path) -> None:
    watch = _watch(fast, [C05, C07])
    assert watch.step(0.0) is None
    faults.chip_gone(open_host(fast), C07)
    found = watch.step(1.0)
    assert found is not None and (found.kind, found.chip) == ("gone", C07), found
    assert "gone from the PCI bus" in found.what


def test_links_down_between_live_chips_are_said_once_both_ends_tick(fast: Path) -> None:
    watch = _watch(fast, [C01, C03, C05, C07])
    assert watch.step(0.0) is None
    faults.link_down(open_host(fast), C01, C03)
    assert watch.step(1.0) is None  # first seen down: are both ends alive?
    found = watch.step(2.0)
    assert found is not None and found.kind == "links", found
    assert found.what == f"2 links to {C03} went down (ch9<->ch2, ch8<->ch3)"
    assert found.chip == C01


def test_a_frozen_chip_is_named_for_its_heartbeat_not_for_the_links_it_took_down(
    fast: Path,
) -> None:
    watch = _watch(fast, [C01, C03, C05, C07])
    assert watch.step(0.0) is None
    faults.chip_dead(open_host(fast), C01)  # its links read down at once
    seen = [watch.step(t) for t in (1.0, 2.0, 3.0)]
    assert seen[:2] == [None, None]
    assert seen[2] is not None and (seen[2].kind, seen[2].chip) == ("frozen", C01), seen


def test_other_jobs_chips_and_their_links_are_not_the_jobs(fast: Path) -> None:
    """A replica on 05/07: chip 03 (another replica's) dies, taking the 03-07 links with it;
    this job's chips and the links between them are fine."""
    watch = _watch(fast, [C05, C07])
    assert watch.step(0.0) is None
    faults.chip_dead(open_host(fast), C03)
    assert [watch.step(t) for t in (1.0, 2.0, 3.0, 4.0)] == [None] * 4


def test_the_watch_never_reads_faster_than_the_firmware_updates(
    make_sim: Callable[..., Path],
) -> None:
    """Telemetry every 2.5 s (0.4 Hz, reported as Blackhole's UPDATE_TELEM_SPEED): read every
    2.5 s, frozen after two of those intervals (5 s), as pre-flight judges."""
    slow = make_sim("quietbox2", heartbeat_hz=0.4)
    watch = _watch(slow, [C01])
    assert (watch.every, watch.frozen) == (2.5, 5.0)
    assert frozen_after(None) == 2.0 and frozen_after(0.1) == 2.0


def test_a_chip_that_freezes_mid_run_stops_a_plain_job_and_is_recovered(
    qb2: Path, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    summary = tmp_path / "s.json"
    proc = start_launch(qb2, "--tp-size", "4", "--summary-json", str(summary), "--",
                        sys.executable, TW, "ttmesh-test-worker", f"pids={pids}", "fabric")  # fmt: skip
    try:
        wait_for(lambda: len(list(pids.glob("rank*.pid"))) == 4, timeout=30, what="4 ranks up")
        workers = [int(p.read_text()) for p in pids.glob("rank*.pid")]
        assert run_cli("sim", "fault", "--root", str(qb2), "chip-dead", C03).code == 0
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 1, err
    line = f"ttmesh: chip {C03} failed under the job: its heartbeat stopped"
    assert re.search(rf"^{re.escape(line)} \(at \d+, unmoved for [\d.]+ s; its firmware hangs\): "
                     "stopping every worker$", err, re.M), err  # fmt: skip
    assert "chips recovered and verified" in err  # whatever the job brought up: checked
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"ttmesh: exit 1: chip {C03} failed under the job"), last
    assert not any(alive(p) for p in workers)
    assert run_cli("check", "--root", str(qb2)).code == 0
    data = json.loads(summary.read_text())
    assert (data["source"], data["code"]) == ("ttmesh", 1)


def test_a_chip_gone_mid_run_is_not_restarted_on_a_host_that_lost_it(
    qb2: Path, tmp_path: Path
) -> None:
    """The recovery cannot bring back a device the driver lost: it says so, and no restart."""
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = start_launch(qb2, "--tp-size", "4", "--max-restarts", "2", "--",
                        sys.executable, TW, "ttmesh-test-worker", f"pids={pids}")  # fmt: skip
    try:
        wait_for(lambda: len(list(pids.glob("rank*.pid"))) == 4, timeout=30, what="4 ranks up")
        assert run_cli("sim", "fault", "--root", str(qb2), "chip-gone", C05).code == 0
        _out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 1, err
    assert f"ttmesh: chip {C05} failed under the job: it is gone from the PCI bus" in err, err
    assert "not restarting" in err, err
    assert len(re.findall("^ttmesh: chip .* failed under the job", err, re.M)) == 1, err
    assert "power-cycle the host" in err


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SEED = ["--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--device", "tpu",
        "--kv-cache-dtype", "bfloat16", "--grammar-backend", "none"]  # fmt: skip


def test_links_down_mid_serve_stop_the_server_recover_and_restart_it(
    qb2: Path, tmp_path: Path
) -> None:
    port = _port()
    proc = start_launch(qb2, "--max-restarts", "1", "--job-id", f"cw-{os.getpid()}", "--",
                        *SGLANG, *SEED, "--tp-size", "4", "--port", str(port),
                        env=ENV)  # fmt: skip
    lines = Lines(proc)
    try:
        lines.until("ready after")
        assert run_cli("sim", "fault", "--root", str(qb2), "link-down", C05, C07).code == 0
        lines.until("ready after", 2)  # stopped, recovered, restarted, ready again
        proc.send_signal(signal.SIGINT)
        text = lines.rest()
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert re.search(rf"chip {C05} failed under the job: 2 links to {C07} went down "
                     r"\(ch\d+<->ch\d+, ch\d+<->ch\d+\): stopping every worker", text), text  # fmt: skip
    assert "chips recovered and verified" in text
    assert "restarting every rank" in text
    assert proc.returncode == 130, text
    assert run_cli("check", "--root", str(qb2)).code == 0


def test_a_chip_that_freezes_under_one_replica_leaves_the_other_serving(
    qb2: Path, tmp_path: Path
) -> None:
    """Two replicas of two chips: replica 0's chip freezes; its job stops it, recovers its own
    chips and restarts it, while replica 1 keeps its server (same pid) and keeps answering."""
    port = _port()
    proc = start_launch(qb2, "--replicas", "2", "--replicas-parallel", "--tp-size", "2",
                        "--max-restarts", "1", "--job-id", f"cwf-{os.getpid()}", "--",
                        *SGLANG, *SEED, "--tp-size", "2", "--port", str(port),
                        env={**ENV, "FAKE_REPORT": str(tmp_path)})  # fmt: skip
    lines = Lines(proc)
    try:
        lines.until("ready: routed to", 2)
        other = _servers(proc.pid)[1]
        victim = C01  # replica 0 has 01 and 03, replica 1 05 and 07 (--dry-run says so)
        assert run_cli("sim", "fault", "--root", str(qb2), "chip-dead", victim).code == 0
        lines.until("ready: routed to", 3)
        assert _servers(proc.pid)[1] == other and alive(other)  # replica 1 never stopped
        proc.send_signal(signal.SIGINT)
        text = lines.rest()
        proc.wait(timeout=90)
    finally:
        proc.kill()
        proc.wait()
    assert f"[replica0] ttmesh: chip {victim} failed under the job: its heartbeat stopped" in text
    assert "[replica1] ttmesh: chip" not in text, text
    assert proc.returncode == 130, text


def _servers(fleet: int) -> dict[int, int]:
    """Each replica's server pid: the grandchild of its job (``--job-id FLEET-rK``). A replica
    between attempts (its guardian or server not started yet, or gone) has none."""
    out = {}
    for pid in procs.descendants(fleet):
        cmd = procs.command_line(pid) or ""
        match = re.search(r"--job-id \S+-r([0-9]+)", cmd)
        if match and "--fleet-of" in cmd:
            guardian = next((p for p in procs.descendants(pid) if procs.parent(p) == pid), None)
            server = next(
                (p for p in procs.descendants(guardian) if procs.parent(p) == guardian), None
            ) if guardian is not None else None  # fmt: skip
            if server is not None:
                out[int(match.group(1))] = server
    return out


def _health(status: int) -> http.server.ThreadingHTTPServer:
    """A server's /health on loopback answering ``status`` (200: the serving watch's ready,
    503: listening, still starting), served by a thread."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("ready", [True, False], ids=["ready", "starting"])
def test_links_that_fell_as_a_scheduler_died_between_two_reads_are_its_end(
    fast: Path, ready: bool
) -> None:
    """The race of a dead scheduler (test_serving): a scheduler that opened the fabric after
    the watch's last read and was killed before its next (the stand-in's, 0.8 s after it was
    up) is in no holder list the watch read, yet the links it took down are its end once the
    server is ready: the server's watch, which followed it from its start, says it died. A
    chip that freezes meanwhile is still said. Before ready that watch decides nothing (the
    ready timeout would, minutes later): the links are the chip watch's to say."""
    from ttmesh.launcher.serving.watch import LISTENING, READY, Watch
    from ttmesh.sim.standin.ttmesh_standin import CHILD

    host = open_host(fast)
    health = _health(200 if ready else 503)
    wake_r, wake_w = os.pipe()
    # This test's process is the server: the scheduler is its child, as SGLang's are.
    serving = Watch(f"http://127.0.0.1:{health.server_address[1]}/health", os.getpid(), wake_w,
                    critical=("sglang::scheduler",))  # fmt: skip
    watch = _watch(fast, [C01, C03], ended=serving.ended)
    up_r, up_w = os.pipe()
    scheduler = None
    try:
        assert watch.step(0.0) is None  # the last read before the scheduler exists
        asics = [watch.inv.by_bdf()[b].asic_id for b in (C01, C03)]
        scheduler = subprocess.Popen(
            ["sglang::scheduler_TP0", "-c", CHILD, json.dumps(asics), str(up_w)],
            executable=sys.executable, pass_fds=(up_w,),
            env={**os.environ, "TTMESH_SIM_ROOT": str(fast)},
        )  # fmt: skip
        os.close(up_w)
        up_w = -1
        assert os.read(up_r, 2) == b"up"  # it holds 01 and brought the fabric 01-03 up
        serving.start()
        said = READY if ready else LISTENING
        wait_for(lambda: any(e.kind == said for e in serving.events), what=f"the server {said}")
        wait_for(lambda: scheduler.pid in serving.watched and serving.serving == ready,
                 what="its scheduler followed")  # fmt: skip
        assert serving.ended() is None
        scheduler.kill()
        scheduler.wait()
        if not ready:
            assert serving.ended() is None
            assert watch.step(1.0) is None
            found = watch.step(2.0)
            assert found is not None and (found.kind, found.chip) == ("links", C01), found
            return
        assert serving.ended() == f"sglang::scheduler_TP0 (pid {scheduler.pid})"
        assert [watch.step(t) for t in (1.0, 2.0, 3.0)] == [None] * 3  # down: its end
        faults.chip_dead(host, C03)
        seen = [watch.step(t) for t in (4.0, 5.0, 6.0)]
        assert seen[:2] == [None, None]
        assert seen[2] is not None and (seen[2].kind, seen[2].chip) == ("frozen", C03), seen
    finally:
        serving.stop()
        if serving.is_alive():
            serving.join(30)  # before its wake pipe closes (it may be probing: health answers)
        health.shutdown()
        health.server_close()
        if scheduler is not None:
            scheduler.kill()
            scheduler.wait()
        for fd in (up_r, up_w, wake_r, wake_w):
            if fd >= 0:
                os.close(fd)


def test_links_that_fell_as_another_holder_ended_are_said(fast: Path) -> None:
    """A link that fails while a process holding the job's chips ends, one whose end no
    watch of the job decides on (a helper, here a holder the job never followed): the chip
    watch says it, else nothing would stop the job."""
    host = open_host(fast)
    holder = faults.hold(host, C01)
    watch = _watch(fast, [C01, C03], ended=lambda: None)
    assert watch.step(0.0) is None
    os.kill(holder, signal.SIGKILL)
    wait_for(lambda: not alive(holder), what="the holder gone")
    faults.link_down(host, C01, C03)
    assert watch.step(1.0) is None  # first seen down: are both ends alive?
    found = watch.step(2.0)
    assert found is not None and (found.kind, found.chip) == ("links", C01), found
