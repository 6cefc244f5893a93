"""Hung but healthy is caught (issue 36): with --probe-interval a server is asked for a
one-token generation every S seconds; no answer within --probe-timeout (its /health may go on
answering: tt-xla#5828) dumps its stacks, stops it, recovers its chips and says so; a fleet
takes the replica out first, the others serve on."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, run_cli, start_launch
from test_chipwatch import Lines

STANDIN = str(REPO / "ttmesh" / "sim" / "standin")
ENV = {"PYTHONPATH": STANDIN, "PYTHONUNBUFFERED": "1"}
SEED = ["--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--device", "tpu",
        "--kv-cache-dtype", "bfloat16", "--grammar-backend", "none"]  # fmt: skip
SGLANG = [sys.executable, "-m", "sglang.launch_server"]


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_hung_behind_a_healthy_health_endpoint_is_dumped_stopped_and_recovered(
    qb2: Path, tmp_path: Path, runtime: Path
) -> None:
    out = tmp_path / "s.json"
    port = _port()
    res = run_cli("launch", "--root", str(qb2), "--probe-interval", "0.5", "--probe-timeout", "1",
                  "--summary-json", str(out), "--", *SGLANG, *SEED, "--tp-size", "4", "--port",
                  str(port), env={**ENV, "FAKE_MODE": "hung-healthy", "FAKE_FAIL_AFTER": "0"},
                  timeout=180)  # fmt: skip
    assert res.code == 124, res.err
    line = (f"ttmesh: sglang-torchtpu: a one-token generation (http://127.0.0.1:{port}/generate) "
            "got no answer in 1 s")  # fmt: skip
    assert line in res.err, res.err
    assert (
        "though it may still answer /health: it is hung: dumping its stacks, then stopping it"
        in res.err
    )
    assert res.err.index(line) < res.err.index("ttmesh: stacks of 1 rank before killing them: ")
    summary = json.loads(out.read_text())
    assert summary["dumps"] and all(Path(f).name == "rank0.txt" for f in summary["dumps"])
    assert all(f.startswith(str(runtime)) for f in summary["dumps"])  # the test's own directory
    assert "chips recovered and verified" in res.err  # a server's chips: checked
    assert res.err.strip().splitlines()[-1].startswith("ttmesh: exit 124: hung: a one-token")


def test_a_server_that_answers_is_never_taken_for_hung(qb2: Path) -> None:
    """A server that answers its probe (slowly, an error even) runs on until stopped."""
    port = _port()
    proc = start_launch(qb2, "--probe-interval", "0.2", "--probe-timeout", "5", "--", *SGLANG,
                        *SEED, "--tp-size", "1", "--port", str(port),
                        env={**ENV, "FAKE_LATENCY": "0.3"})  # fmt: skip
    lines = Lines(proc)
    try:
        lines.until("ready after")
        for _ in range(3):  # three of its probes' worth of time, by requests of ours
            body = json.dumps({"text": "x"}).encode()
            with urllib.request.urlopen(
                urllib.request.Request(f"http://127.0.0.1:{port}/generate", body), timeout=30
            ) as r:
                assert r.status == 200
        proc.send_signal(signal.SIGINT)
        text = lines.rest()
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, text
    assert "hung" not in text, text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--probe-interval", "5"], "--probe-interval goes with a server"),
        (["--probe-timeout", "5"], "--probe-timeout goes with a server"),
        (["--probe-interval", "0"], "--probe-interval 0"),
        (["--probe-interval", "nan"], "--probe-interval nan: not a number"),
    ],
)
def test_probe_flags_are_checked(args: list[str], message: str, qb2: Path) -> None:
    res = run_cli("launch", "--root", str(qb2), "--dry-run", *args, "--", "true")
    assert res.code == 2 and message in res.err, res.err


def test_probe_timeout_needs_an_interval_and_a_profile_needs_a_probe(
    qb2: Path, tmp_path: Path
) -> None:
    argv = ["--", *SGLANG, *SEED, "--tp-size", "1", "--port", str(_port())]
    res = run_cli("launch", "--root", str(qb2), "--dry-run", "--probe-timeout", "3", *argv, env=ENV)
    assert res.code == 2 and "--probe-timeout goes with --probe-interval" in res.err, res.err
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    stock = (REPO / "ttmesh" / "configs" / "profiles" / "sglang-torchtpu.yaml").read_text()
    mine = stock.replace("name: sglang-torchtpu", "name: mine").replace(
        "priority: 20", "priority: 30"
    )
    mine = re.sub(r"\nprobe:\n(  .*\n)+", "\n", mine) + "\nflags: sglang-torchtpu\n"
    (profiles / "mine.yaml").write_text(mine)
    env = {**ENV, "TTMESH_PROFILES": str(profiles)}
    res = run_cli(
        "launch", "--root", str(qb2), "--dry-run", "--probe-interval", "3", *argv, env=env
    )
    assert res.code == 2 and "profile mine has no probe" in res.err, res.err
    for bad, said in (("{path: generate, body: '{}'}", "probe.path must be"),
                      ("{path: /generate, body: '[1]'}", "probe.body must be a JSON object"),
                      ("{path: /generate, body: '{}', timeout: -1}", "probe.timeout"),
                      ("{path: /generate, body: '{}', extra: 1}", "must be a map of")):  # fmt: skip
        (profiles / "mine.yaml").write_text(mine + f"probe: {bad}\n")
        res = run_cli("launch", "--root", str(qb2), "--dry-run", *argv, env=env)
        assert res.code == 2 and said in res.err, (bad, res.err)


def test_a_hung_replica_is_taken_out_of_the_router_and_dumped(
    qb2: Path, tmp_path: Path, runtime: Path
) -> None:
    """Each replica's server hangs once ready behind a /health that answers (hung-healthy):
    each replica's job says it is down before its stacks are dumped, the fleet takes it out of
    the router, and with --max-restarts 0 the fleet ends hung (124)."""
    port = _port()
    proc = start_launch(qb2, "--replicas", "2", "--replicas-parallel", "--tp-size", "2",
                        "--max-restarts", "0", "--probe-interval", "0.5", "--probe-timeout", "1",
                        "--job-id", f"probe-{os.getpid()}", "--", *SGLANG, *SEED, "--tp-size", "2",
                        "--port", str(port),
                        env={**ENV, "FAKE_MODE": "hung-healthy", "FAKE_FAIL_AFTER": "0"})  # fmt: skip
    lines = Lines(proc)
    try:
        lines.until("taken out of the router", 2, timeout=180)
        text = lines.rest()
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert re.search(r"ttmesh: replica 0: its job says it is down \(hung: a one-token generation "
                     r"\(http://127\.0\.0\.1:\d+/generate\) got no answer in 1 s\): taken out of "
                     r"the router", text), text  # fmt: skip
    assert "[replica0] ttmesh: stacks of 1 rank before killing them" in text, text
    assert proc.returncode == 124, text


def test_a_server_that_drips_its_answer_is_hung_at_the_deadline(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A socket's timeout is per read: a server that sends its answer a byte at a time, each
    byte inside --probe-timeout, would never have timed out. The probe's deadline is for the
    whole answer; an answer that comes whole is one, a refused connection is not a hang, and
    the environment's proxy is never asked."""
    import socket
    import threading

    from ttmesh.launcher.serving.watch import generate

    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    stop = threading.Event()
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    def serve(listener: socket.socket, drip: bool) -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in answer if drip else [answer]:
                if stop.wait(0.2 if drip else 0):
                    return
                try:
                    conn.sendall(bytes([byte]) if drip else byte)  # type: ignore[arg-type]
                except OSError:
                    return  # the probe cut the connection: done

    for drip, expected in ((True, "timeout"), (False, "answered")):
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            server = threading.Thread(target=serve, args=(listener, drip), daemon=True)
            server.start()
            url = f"http://127.0.0.1:{listener.getsockname()[1]}/generate"
            assert generate(url, b"{}", 1.0) == expected  # 41 bytes dripped take 8 s
            stop.set()
            server.join(10)
            stop.clear()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused
        assert generate(f"http://127.0.0.1:{port}/generate", b"{}", 1.0) == "refused"
