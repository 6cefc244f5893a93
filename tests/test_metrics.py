"""``ttmesh metrics``: scraped over loopback and parsed with prometheus-client's own parser.

Each test starts the real command on 127.0.0.1 (port 0: a free port, printed on stderr) against
a simulated QuietBox 2 and reads what a Prometheus server would.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import umdclients
from conftest import run_cli, start_launch, users_shell, wait_for, worker
from prometheus_client.parser import text_string_to_metric_families
from users import NEEDS_NOBODY, User, can_switch, users_fixture, world_dir  # noqa: F401

HANG = 60.0  # seconds before a test gives up on an event
Samples = dict[str, list[tuple[dict[str, str], float]]]


@contextlib.contextmanager
def serving(root: Path) -> Iterator[str]:
    """``ttmesh metrics --root ROOT --listen 127.0.0.1:0`` running; its URL. Stopped with
    SIGTERM at the end, which must end it cleanly (exit 0)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ttmesh", "metrics", "--root", str(root), "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=users_shell(),
    )
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:  # the line is written (and flushed) once it listens
            if line.startswith("serving metrics on "):
                url = line.split()[3]
                break
        assert url is not None, f"ttmesh metrics ended: {proc.wait()}"
        yield url
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=HANG) as response:
        text = response.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, [])
        for s in family.samples:
            out[family.name].append((dict(s.labels), s.value))
    return out


def chips_of(root: Path) -> list[dict]:
    result = run_cli("ls", "--root", str(root), "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)["chips"]


def per_chip(samples: Samples, name: str) -> dict[str, float]:
    return {labels["asic_id"]: value for labels, value in samples[name]}


def test_a_quietbox2s_chips(qb2: Path) -> None:
    chips = chips_of(qb2)
    assert len(chips) == 4
    labels = [
        {"bdf": c["bdf"], "asic_id": c["asic_id"], "arch": "blackhole", "board": "p300a"}
        for c in chips
    ]
    with serving(qb2) as url:
        got = scrape(url)
    assert got["ttmesh_reset_in_progress"] == [({}, 0.0)]
    assert got["ttmesh_host_read_ok"] == [({}, 1.0)]
    assert got["ttmesh_chips"] == [({}, 4.0)]
    # The simulated driver's hwmon (45 °C, 35 W, 750 mV) and tt_aiclk (1350 MHz).
    for name, value in (
        ("ttmesh_chip_temperature_celsius", 45.0),
        ("ttmesh_chip_power_watts", 35.0),
        ("ttmesh_chip_voltage_volts", 0.75),
        ("ttmesh_chip_aiclk_hertz", 1.35e9),
        ("ttmesh_chip_heartbeat_alive", 1.0),
        ("ttmesh_chip_links_down", 0.0),
    ):
        assert got[name] == [(lab, value) for lab in labels], name
    assert [lab for lab, _ in got["ttmesh_chip_heartbeat"]] == labels
    assert all(v > 0 for _, v in got["ttmesh_chip_heartbeat"])
    # A QuietBox 2's four p300a: every chip has its expected links, all up.
    expected = per_chip(got, "ttmesh_chip_links_expected")
    assert set(expected) == {c["asic_id"] for c in chips} and all(v > 0 for v in expected.values())
    assert per_chip(got, "ttmesh_chip_links_up") == expected
    assert got["ttmesh_chip_lease_info"] == []
    assert got["ttmesh_job_rank_state"] == []


def test_it_never_runs_tt_smi(qb2: Path, tmp_path: Path) -> None:
    """tt-smi opens every chip; the host's tt-smi here only leaves a trace that it ran."""
    trace = tmp_path / "tt-smi-ran"
    tool = qb2 / "bin" / "tt-smi"
    tool.unlink()
    tool.write_text(f'#!/bin/sh\necho "$@" >> {trace}\nexit 1\n')
    tool.chmod(0o755)
    with serving(qb2) as url:
        got = scrape(url)
        scrape(url)
    assert got["ttmesh_chips"] == [({}, 4.0)]
    assert not trace.exists()


def test_on_a_real_host_nothing_that_opens_a_chip_is_asked(
    qb2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On hardware the topology, Ethernet status and remote heartbeats come through tt-umd,
    which opens every chip: a real host's collector never asks for them, and serves no link
    metrics rather than made-up ones."""
    from ttmesh.host.real import RealHost
    from ttmesh.recovery.metrics import HostCollector

    root = tmp_path / "plain"
    shutil.copytree(qb2, root, symlinks=True)
    (root / ".ttmesh-sim").unlink()

    def opens_a_chip(*_args: object) -> None:
        raise AssertionError("asked for what opens a chip")

    for name in ("topology", "eth_live_status", "remote_heartbeats", "default_tt_smi"):
        monkeypatch.setattr(RealHost, name, opens_a_chip)
    collector = HostCollector(RealHost(root), heartbeat_wait=0.05)
    got = {f.name: [(dict(s.labels), s.value) for s in f.samples] for f in collector.collect()}
    assert got["ttmesh_host_read_ok"] == [({}, 1.0)]
    assert got["ttmesh_chips"] == [({}, 4.0)]
    assert len(got["ttmesh_chip_temperature_celsius"]) == 4
    assert not [name for name in got if name.startswith("ttmesh_chip_links")]


def test_a_frozen_chip_is_not_alive(qb2: Path) -> None:
    chips = chips_of(qb2)
    dead = chips[2]
    assert run_cli("sim", "fault", "--root", str(qb2), "chip-dead", dead["bdf"]).code == 0
    with serving(qb2) as url:
        first, second = scrape(url), scrape(url)  # watched, then judged against the previous
    for got in (first, second):
        alive = per_chip(got, "ttmesh_chip_heartbeat_alive")
        assert alive == {c["asic_id"]: (0.0 if c is dead else 1.0) for c in chips}
        assert got["ttmesh_host_read_ok"] == [({}, 1.0)]


def test_a_link_down_shows_fewer_links_up(qb2: Path) -> None:
    chips = chips_of(qb2)
    a, b = chips[0], chips[1]
    assert run_cli("sim", "fault", "--root", str(qb2), "link-down", a["bdf"], b["bdf"]).code == 0
    links = [
        lk for lk in json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["links"]
        if {lk["a"]["asic_id"], lk["b"]["asic_id"]} == {a["asic_id"], b["asic_id"]}
    ]  # fmt: skip
    assert links
    with serving(qb2) as url:
        got = scrape(url)
    up, down = per_chip(got, "ttmesh_chip_links_up"), per_chip(got, "ttmesh_chip_links_down")
    expected = per_chip(got, "ttmesh_chip_links_expected")
    for c in chips:
        lost = len(links) if c in (a, b) else 0
        assert (up[c["asic_id"]], down[c["asic_id"]]) == (expected[c["asic_id"]] - lost, lost)


def test_a_running_jobs_lease_and_ranks(qb2: Path, runtime: Path, tmp_path: Path) -> None:
    job = f"metrics-{os.getpid()}"
    chip = chips_of(qb2)[0]
    proc = start_launch(
        qb2, "--chips", chip["bdf"], "--tp-size", "1", "--job-id", job,
        *worker(f"pids={tmp_path}"),
    )  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "rank0.pid").exists(), timeout=HANG, what="the worker")
        with serving(qb2) as url:
            got = scrape(url)
        user = json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"][0]["lease"]
        assert got["ttmesh_chip_lease_info"] == [
            (
                {
                    "bdf": chip["bdf"],
                    "asic_id": chip["asic_id"],
                    "job": job,
                    "user": user["user"],
                    "verified": "true",
                },
                1.0,
            )
        ]
        assert got["ttmesh_job_rank_state"] == [
            ({"job": job, "rank": "0", "state": "running"}, 1.0)
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=HANG)


def test_a_reset_in_progress_pauses_chip_reads(qb2: Path) -> None:
    """While ``ttmesh reset`` runs tt-smi (the simulated reset hangs), no chip is read."""
    assert run_cli("sim", "fault", "--root", str(qb2), "reset-hangs", "120").code == 0
    with serving(qb2) as url:
        assert scrape(url)["ttmesh_reset_in_progress"] == [({}, 0.0)]
        reset = subprocess.Popen(
            [sys.executable, "-m", "ttmesh", "reset", "--root", str(qb2), "--force"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            got: Samples = {}

            def paused() -> bool:
                got.clear()
                got.update(scrape(url))
                return got["ttmesh_reset_in_progress"] == [({}, 1.0)]

            wait_for(paused, timeout=HANG, what="the reset's mark")
            assert got["ttmesh_host_read_ok"] == [({}, 0.0)]
            assert not [name for name in got if name.startswith("ttmesh_chip")]
        finally:
            # A stop waits for tt-smi's reset to end; a second cuts a hung one short.
            reset.send_signal(signal.SIGINT)
            assert reset.stderr is not None
            for line in reset.stderr:
                if "SIGINT: stopping once the reset" in line:
                    break
            reset.send_signal(signal.SIGINT)
            reset.communicate(timeout=HANG)
        after = scrape(url)  # the reset is gone: its mark went with it
        assert after["ttmesh_reset_in_progress"] == [({}, 0.0)]
        assert after["ttmesh_chips"] == [({}, 4.0)]


def test_the_mark_is_shared_by_concurrent_resets_and_goes_with_them(qb2: Path) -> None:
    from ttmesh.cli.hosts import open_host
    from ttmesh.runtime import resetmark

    host = open_host(str(qb2))
    assert not resetmark.running(host)
    with resetmark.marked(host), resetmark.marked(host):
        assert resetmark.running(host)
    assert not resetmark.running(host)


@pytest.mark.skipif(not can_switch(), reason=NEEDS_NOBODY)
def test_another_users_locked_mark_pauses_metrics_but_never_stalls_a_reset(
    users: dict[str, User],
) -> None:
    """nobody plants ``resetting.lock`` in the shared lease directory and holds it exclusively:
    root's reset must still run (its mark never waits), and the pause is all it buys."""
    root, nobody = users["root"], users["nobody"]
    shared = world_dir("ttmesh-metrics-leases-", 0o1777)
    env = {"TTMESH_RUNTIME_DIR": str(shared)}
    hold = (
        "import fcntl, os, sys; "
        "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_CREAT, 0o644); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        nobody.argv(nobody.python, "-c", hold, str(shared / "resetting.lock")),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert (shared / "resetting.lock").stat().st_uid == nobody.uid
        mark = (
            "import sys; from ttmesh.cli.hosts import open_host; "
            "from ttmesh.runtime import resetmark; "
            "print(resetmark.running(open_host(sys.argv[1])))"
        )
        seen = subprocess.run(
            [sys.executable, "-c", mark, str(root.sim)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=HANG,
        )
        assert seen.stdout.strip() == "True", seen.stderr
        done = root.run("reset", "--root", str(root.sim), env=env)
        assert done.returncode == 0, done.stderr
        assert "recovered and verified" in done.stdout
    finally:
        holder.kill()
        holder.communicate()
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("9464", "no port (expected HOST:PORT)"),
        (":9464", "no host named"),
        ("127.0.0.1:", "port '': not a number"),
        ("127.0.0.1:65536", "port 65536: too large"),
        ("127.0.0.1:-1", "port -1: digits only"),
        ("127.0.0.1:９４６４", "port ９４６４: not a number"),
        ("127.0.0.1:٩٤٦٤", "port ٩٤٦٤: not a number"),
        ("::1:9464", "an IPv6 address goes in brackets: [::1]:9464"),
        ("[nope]:9464", "no IPv6 address in the brackets"),
        ("no such host.invalid:9464", "it has a space"),
        ("nosuchhost.invalid:9464", "cannot resolve"),
        ("x" * 5000 + ":9464", "longer than the 253 characters of a DNS name"),
        ("a" * 64 + ".invalid:9464", "a label longer than 63 characters"),
        ("192.0.2.1:9464", "is not an address of this machine"),
    ],
)
def test_bad_listen_is_one_line(qb2: Path, listen: str, says: str) -> None:
    result = run_cli("metrics", "--root", str(qb2), "--listen", listen)
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert lines[-1].startswith("ttmesh: --listen ") and says in lines[-1], result.err
    assert "Traceback" not in result.err and len(lines) <= 2  # and "simulated host: ..."


def test_a_port_in_use_is_named(qb2: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("metrics", "--root", str(qb2), "--listen", f"127.0.0.1:{port}")
    assert result.code == 2
    assert result.err.strip().splitlines()[-1] == (
        f"ttmesh: --listen 127.0.0.1:{port}: the port is already in use "
        "(stop what listens there, or choose another port)"
    )


def test_without_prometheus_client_one_line_says_what_to_install(qb2: Path) -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None; "
        "from ttmesh.cli import run; sys.exit(run(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "metrics", "--root", str(qb2), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "ttmesh: ttmesh metrics needs prometheus-client (pip install 'ttmesh[metrics]' "
        "(or: pip install 'prometheus-client>=0.20'))"
    )


def test_ctrl_c_stops_it_with_exit_0(qb2: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ttmesh", "metrics", "--root", str(qb2), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("serving metrics on "):
            break
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=HANG)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_another_tools_reset_notice_pauses_chip_reads_until_it_is_done(qb2: Path) -> None:
    """tt-smi (not ttmesh) resets: its PRE_RESET notice pauses the chip reads, its POST_RESET
    (sent when the reset ends, here when it is interrupted) resumes them."""
    assert run_cli("sim", "fault", "--root", str(qb2), "reset-hangs", "120").code == 0
    with serving(qb2) as url:
        wait_for(lambda: list((qb2 / "tmp" / "tt_umd_listeners").glob("client_*.sock")),
                 what="the metrics' listener")  # fmt: skip
        assert scrape(url)["ttmesh_reset_in_progress"] == [({}, 0.0)]
        tt_smi = subprocess.Popen(
            [str(qb2 / "bin" / "tt-smi"), "-r"], stdout=subprocess.DEVNULL,
            env={**os.environ, "TTMESH_SIM_ROOT": str(qb2)},
        )  # fmt: skip
        try:
            got: Samples = {}

            def paused() -> bool:
                got.clear()
                got.update(scrape(url))
                return got["ttmesh_reset_in_progress"] == [({}, 1.0)]

            wait_for(paused, timeout=HANG, what="the notice's pause")
            assert not [name for name in got if name.startswith("ttmesh_chip")]
        finally:
            tt_smi.send_signal(signal.SIGINT)  # its reset ends: tt-smi says so (POST_RESET)
            tt_smi.wait(timeout=HANG)
        wait_for(lambda: scrape(url)["ttmesh_reset_in_progress"] == [({}, 0.0)],
                 timeout=HANG, what="the end of the pause")  # fmt: skip
        assert scrape(url)["ttmesh_chips"] == [({}, 4.0)]
    assert not list((qb2 / "tmp" / "tt_umd_listeners").glob("client_*.sock"))


# -- hostile clients (issue 33): of the reset-notice listener and of the scrape port


@pytest.mark.skipif(not can_switch(), reason=NEEDS_NOBODY)
def test_only_its_resetter_ends_a_pause_and_floods_leave_the_listener_answering(
    users: dict[str, User], capfd: pytest.CaptureFixture[str]
) -> None:
    """root's resetter announces a reset: the chip reads pause. A POST_RESET from any other
    process, or a PRE_RESET from one that exits at once, by nobody or by root, ends nothing;
    floods of notices, junk, 1 MiB writes, half messages and silent connections by both leave
    the listener's thread alive and a notifier's connect answered; the resetter's own
    POST_RESET ends the pause. What was ignored is said in a few lines."""
    from ttmesh.cli.hosts import open_host
    from ttmesh.host import umdnotice
    from ttmesh.recovery.metrics import ForeignResets

    root, nobody = users["root"], users["nobody"]
    foreign = ForeignResets(open_host(str(root.sim)))
    sock = root.sim / umdnotice.LISTENER_DIR / umdnotice.socket_name(os.getpid())
    resetter = umdclients.Notifier(root, sock, "01", "02")

    def answered(count: int) -> None:
        wait_for(lambda: foreign.heard >= count, timeout=HANG, what=f"{count} notices answered")

    try:
        resetter.send()
        answered(1)
        assert foreign.active()
        count = 1
        for user in (nobody, root):
            for byte in ("02", "01"):
                assert umdclients.flood(user, sock, f"1:{byte}") == "done 1"  # then it exits
                count += 1
                answered(count)
                assert foreign.active(), (user.name, byte)
        for user in (nobody, root):
            specs = ("300:01", "300:02", "50:junk", "5:mib", "30:shut", "30:none")
            assert (
                umdclients.flood(user, sock, *specs) == "done 685"
            )  # the shut ones are not counted
        assert foreign.thread is not None and foreign.thread.is_alive()
        assert foreign.active()
        late = umdclients.Notifier(nobody, sock, "02")  # tt-umd's notifier: connect, write
        late.send()  # read by the listener, not left in a full backlog
        late.close()
        assert foreign.active()
        resetter.send()
        # The flooders' own pauses went with them: only the resetter's was left.
        wait_for(lambda: not foreign.active(), timeout=HANG, what="the end of the pause")
    finally:
        resetter.close()
        foreign.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "no longer seen" not in err, err[-3000:]
    # A few lines per user, then a count per 10 s window (a slow machine: a few windows).
    lines = err.splitlines()
    assert len(lines) <= 2 * (umdnotice.BURST + 4), err
    assert any("from user nobody" in line and "not shown one by one" in line for line in lines)
    assert not (root.sim / umdnotice.LISTENER_DIR / sock.name).exists()


def _exchange(port: int, request: bytes) -> bytes:
    """One request on a connection of its own; all the server sent before it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_half_sent_requests_never_stall_a_scrape(qb2: Path) -> None:
    """Anyone who reaches the port can open a thousand connections that send half a request
    and wait: the next scrape is answered all the same, the server keeps at most
    MAX_CONNECTIONS (the oldest half-requests are closed), and every malformed request gets
    its status and the connection closed."""
    from ttmesh.recovery.exporter import MAX_CONNECTIONS

    with serving(qb2) as url:
        port = int(url.split(":")[2].split("/")[0])
        half: list[socket.socket] = []
        try:
            for _ in range(1000):
                s = socket.create_connection(("127.0.0.1", port), timeout=HANG)
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: tt-host-1\r\n")
                half.append(s)
            assert scrape(url)["ttmesh_chips"] == [({}, 4.0)]
            with selectors.DefaultSelector() as sel:
                for s in half:
                    sel.register(s, selectors.EVENT_READ)
                closed = 0

                def enough_closed() -> bool:
                    nonlocal closed
                    for key, _ in sel.select(0):
                        assert key.fileobj.recv(1) == b""  # type: ignore[union-attr]
                        sel.unregister(key.fileobj)
                        closed += 1
                    return closed >= 1000 - MAX_CONNECTIONS

                wait_for(enough_closed, timeout=HANG, what="the oldest half-requests closed")
        finally:
            for s in half:
                s.close()
        assert scrape(url)["ttmesh_host_read_ok"] == [({}, 1.0)]
        for request, status in [
            (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"405"),
            (b"\x00\xff\x1b[31m garbage\r\n\r\n", b"400"),
            (b"GET /nope HTTP/1.1\r\n\r\n", b"404"),
            (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"431"),
            (b"GET /metrics HTTP/1.1\n\n", b"200"),
        ]:
            answer = _exchange(port, request)
            assert answer.startswith(b"HTTP/1.1 " + status), (request[:40], answer[:200])
        head = _exchange(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
        zipped = _exchange(port, b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n")
        headers, _, body = zipped.partition(b"\r\n\r\n")
        assert b"Content-Encoding: gzip" in headers
        assert b"ttmesh_chips 4.0" in gzip.decompress(body)
        om = _exchange(port, b"GET / HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n")
        assert b"Content-Type: application/openmetrics-text" in om and om.endswith(b"# EOF\n")


def test_a_request_never_finished_is_closed_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process, with short bounds: a connection over the cap closes the oldest at once,
    the others are closed when their deadline passes, and a scrape meanwhile is answered."""
    import threading

    from prometheus_client import CollectorRegistry, Gauge

    from ttmesh.recovery import exporter

    monkeypatch.setattr(exporter, "REQUEST_DEADLINE", 0.3)
    monkeypatch.setattr(exporter, "MAX_CONNECTIONS", 4)
    registry = CollectorRegistry()
    Gauge("answered", "a scrape's answer", registry=registry).set(1)
    server = exporter.Server("127.0.0.1", 0, registry)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    slow = []
    try:
        for _ in range(6):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=HANG)
            s.sendall(b"GET /metrics HT")
            slow.append(s)
        answer = _exchange(server.port, b"GET /metrics HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200") and b"answered 1.0" in answer
        for s in slow:  # closed by the server: the oldest at the cap, the others at the deadline
            assert s.recv(1) == b""
    finally:
        for s in slow:
            s.close()
        server.shutdown()
        thread.join(timeout=HANG)
        server.close()
    assert not thread.is_alive()
