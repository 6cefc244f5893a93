"""A server that fails, and a port that is not its own (issue 20), with the stand-in server in
tests/fakes: a stock server's failure is its exit code and last lines; a taken port is refused
before the start; only the server's own process tree makes it ready; stock SGLang on a CPU needs
no Tenstorrent chip; what the server leaves in /dev/shm is removed."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import REPO, run_cli, start_launch, wait_for
from users import NEEDS_NOBODY, User, users_fixture, world_dir  # noqa: F401  ("users")

FAKES = str(REPO / "tests" / "fakes")
SGLANG = [sys.executable, "-m", "sglang.launch_server", "--model-path", "m"]
CPU = [*SGLANG, "--device", "cpu"]
TPU = ["--device", "tpu", "--tp-size", "1", "--kv-cache-dtype", "bfloat16",
       "--grammar-backend", "none", "--chunked-prefill-size", "64", "--tpu-compile-tokens", "64"]  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _listening(port: int) -> Iterator[socket.socket]:
    """A socket of this test process listening on 127.0.0.1:``port`` (it answers nothing)."""
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    try:
        yield s
    finally:
        s.close()


class _Ok(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextlib.contextmanager
def _answering(port: int) -> Iterator[None]:
    """An HTTP server of this test process answering 200 to everything on ``port``."""
    server = ThreadingHTTPServer(("127.0.0.1", port), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": FAKES, "FAKE_REPORT": str(tmp_path), "PYTHONUNBUFFERED": "", **extra}


def _last(err: str) -> str:
    return err.strip().splitlines()[-1]


# --------------------------------------------------------------------------- a server that fails


def test_a_stock_server_that_fails_gives_its_code_and_last_lines(qb2: Path, tmp_path: Path) -> None:
    """Stock SGLang keeps no torchrun variable (no TORCHELASTIC_ERROR_FILE): its failure (here
    its port, taken after ttmesh's check) is its exit code and last stderr lines, as for every
    other server, never "supervisor error: KeyError"."""
    taken = _port()
    with _listening(taken):
        proc = start_launch(qb2, "--", *CPU, "--port", str(_port()),
                            env=_env(tmp_path, FAKE_LISTEN_PORT=str(taken)))  # fmt: skip
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "supervisor error" not in err and "KeyError" not in err, err
    lines = err.splitlines()
    assert "ttmesh: rank 0 exited with code 1" in lines, err
    tail = lines[lines.index("ttmesh: last lines of rank 0's stderr:") + 1 :]
    assert any("Address already in use" in line for line in tail), err
    assert _last(err) == "ttmesh: exit 1: rank 0's exit code"


# --------------------------------------------------------------------------- a port not its own


def test_a_taken_port_is_refused_before_the_start(qb2: Path, tmp_path: Path) -> None:
    """The server's --port taken at the start: one line naming who listens there, exit 2,
    nothing started and no chip leased (for a server with chips and one without); a dry run
    says it in the plan's notes."""
    port = _port()
    env = _env(tmp_path)
    mine = f"pid {os.getpid()} (root: "
    with _listening(port):
        for argv in ([*CPU, "--port", str(port)], [*SGLANG, *TPU, "--port", str(port)],
                     [*CPU, "--port", str(port), "--host", "0.0.0.0"]):  # fmt: skip
            res = run_cli("launch", "--root", str(qb2), "--", *argv, env=env)
            assert res.code == 2, res.err
            line = _last(res.err)
            addr = "0.0.0.0" if "0.0.0.0" in argv else "127.0.0.1"
            assert line.startswith(f"ttmesh: --port {port} is already in use on {addr}: "), line
            assert mine in line and f"listens on 127.0.0.1:{port} (" in line, line
            assert "give the server another --port" in line and "Traceback" not in res.err
        assert not (tmp_path / "server.json").exists()  # nothing started
        leases = json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"]
        assert all(c["lease"] is None for c in leases)
        res = run_cli("launch", "--root", str(qb2), "--dry-run", "--json", "--", *CPU,
                      "--port", str(port), env=env)  # fmt: skip
        assert res.code == 0, res.err
        notes = json.loads(res.out)["serving"]["notes"]
        assert any(f"--port {port} is already in use" in n and "(a launch now is refused)" in n
                   for n in notes), notes  # fmt: skip


def test_an_answer_from_another_process_is_not_ready(qb2: Path, tmp_path: Path) -> None:
    """Something else answers 200 on the server's port after the check (the server itself
    listens elsewhere): ttmesh names it, never says ready, and gives up on the server after
    --ready-timeout saying why."""
    port = _port()
    env = _env(tmp_path, FAKE_LISTEN_PORT=str(_port()))
    proc = start_launch(qb2, "--ready-timeout", "8", "--", *CPU, "--port", str(port), env=env)
    try:
        wait_for(lambda: (tmp_path / "server.json").exists(), timeout=60, what="the server")
        with _answering(port):
            _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 124, err
    assert " ready after " not in err.replace("not ready after", ""), err
    other = f"pid {os.getpid()} (root: "
    said = f"http://127.0.0.1:{port}/health answers (HTTP 200), but {other}"
    assert any(ln.startswith(f"ttmesh: sglang: {said}") and ln.endswith(
        f"listens on 127.0.0.1:{port}, not the server: not ready until the server answers"
    ) for ln in err.splitlines()), err  # fmt: skip
    last = _last(err)
    assert last.startswith("ttmesh: exit 124: hung in bring-up: rank 0 not ready after 8 s ("), last
    assert other in last and "not the server)" in last, last


def test_a_server_on_another_port_says_where_it_listens(qb2: Path, tmp_path: Path) -> None:
    """A server that listens on another port than its --port is not ready, and the line that
    gives up on it says where it listens."""
    port, elsewhere = _port(), _port()
    env = _env(tmp_path, FAKE_LISTEN_PORT=str(elsewhere))
    proc = start_launch(qb2, "--ready-timeout", "8", "--", *CPU, "--port", str(port), env=env)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 124, err
    want = (f"rank 0 not ready after 8 s (http://127.0.0.1:{port}/health never answered; the "
            f"server's processes listen on 127.0.0.1:{elsewhere}, not on port {port})")  # fmt: skip
    assert f"ttmesh: {want}: treating the job as hung in bring-up" in err, err
    assert _last(err) == f"ttmesh: exit 124: hung in bring-up: {want}"


def test_a_server_that_listens_on_its_port_and_never_answers_says_so(
    qb2: Path, tmp_path: Path
) -> None:
    """A server whose port takes connections that no answer comes to: the line that gives up
    on it says it listens there, not that it listens somewhere else than its port."""
    port = _port()
    env = _env(tmp_path, FAKE_MODE="mute")
    proc = start_launch(qb2, "--ready-timeout", "8", "--", *CPU, "--port", str(port), env=env)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 124, err
    want = (f"rank 0 not ready after 8 s (http://127.0.0.1:{port}/health never answered; the "
            f"server listens on 127.0.0.1:{port} but no request there got an answer)")  # fmt: skip
    assert _last(err) == f"ttmesh: exit 124: hung in bring-up: {want}", err
    assert "not on port" not in err, err


def test_listeners_are_attributed_to_their_process_tree() -> None:
    from ttmesh.launcher.serving import listeners

    port = _port()
    with _listening(port):
        (found,) = listeners.listening(port)
        assert (found.addr, found.port, found.uid) == ("127.0.0.1", port, os.getuid())
        assert listeners.whose(["127.0.0.1"], port, [os.getpid()]).ours
        other = listeners.whose(["127.0.0.1"], port, [os.getppid()])
        assert not other.ours and f"pid {os.getpid()} (" in other.why
        assert listeners.tree_ports([os.getpid()]) == [f"127.0.0.1:{port}"]
    nobody = listeners.whose(["127.0.0.1"], port, [os.getpid()])
    assert not nobody.ours and "no socket listening on 127.0.0.1:" in nobody.why
    wild = listeners.Listener("0.0.0.0", 1, 0, 0)
    six = listeners.Listener("::", 1, 0, 0)
    assert listeners.reaches(wild, "127.0.0.1") and not listeners.reaches(wild, "::1")
    assert listeners.reaches(six, "127.0.0.1") and listeners.reaches(six, "::1")
    assert listeners.reaches(listeners.Listener("::ffff:127.0.0.1", 1, 0, 0), "127.0.0.1")
    assert not listeners.reaches(listeners.Listener("10.0.0.1", 1, 0, 0), "127.0.0.1")


LISTEN = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "print('listening', flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def nobody(users: dict[str, User]) -> User:
    if "nobody" not in users:
        pytest.skip(NEEDS_NOBODY)
    return users["nobody"]


def test_another_users_listener_is_named_or_never_believed(
    nobody: User, qb2: Path, tmp_path: Path
) -> None:
    """Root's ttmesh names nobody's process on the port; nobody's ttmesh cannot see root's, and
    says so: refused before the start, and never ready when it appears later."""
    port = _port()
    held = nobody.popen(nobody.argv(nobody.python, "-c", LISTEN, str(port)), stdout=subprocess.PIPE)
    try:
        assert held.stdout is not None and held.stdout.readline() == "listening\n"
        res = run_cli(
            "launch", "--root", str(qb2), "--", *CPU, "--port", str(port), env=_env(tmp_path)
        )
        assert res.code == 2 and f"pid {held.pid} (nobody: " in _last(res.err), res.err
    finally:
        held.kill()
        held.wait()
    fakes = world_dir("ttmesh-fakes-", 0o755)
    try:
        shutil.copytree(FAKES, fakes / "fakes", ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["chmod", "-R", "a+rX", str(fakes)], check=True)
        report = world_dir("ttmesh-report-")
        with _listening(port):
            res = nobody.run("launch", "--", nobody.python, "-m", "sglang.launch_server",
                             "--model-path", "m", "--device", "cpu", "--port", str(port))  # fmt: skip
            assert res.returncode == 2, res.stderr
            line = _last(res.stderr)
            assert (
                f"a process of user root that ttmesh cannot see listens on 127.0.0.1:{port}" in line
            )
        elsewhere = _port()
        path = f"{fakes / 'fakes'}:{nobody.env['PYTHONPATH']}"  # the fake, and ttmesh itself
        env = {"PYTHONPATH": path, "FAKE_REPORT": str(report),
               "FAKE_LISTEN_PORT": str(elsewhere)}  # fmt: skip
        argv = nobody.ttmesh("launch", "--ready-timeout", "8", "--", nobody.python, "-m",
                             "sglang.launch_server", "--model-path", "m", "--device", "cpu",
                             "--port", str(port), env=env)  # fmt: skip
        proc = nobody.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(
                lambda: (report / "server.json").exists() or proc.poll() is not None,
                timeout=60,
                what="the server",
            )
            with _answering(port):
                _out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.communicate()
        assert proc.returncode == 124, err
        assert " ready after " not in err.replace("not ready after", ""), err
        assert (f"a process of user root that ttmesh cannot see listens on 127.0.0.1:{port}, "
                "not the server: not ready until the server answers") in err, err  # fmt: skip
    finally:
        shutil.rmtree(fakes, ignore_errors=True)
        shutil.rmtree(report, ignore_errors=True)


# --------------------------------------------------------------------------- no chip at all


def test_stock_sglang_needs_no_chip(qb2: Path, tmp_path: Path) -> None:
    """Stock SGLang on a CPU: a chipless plan (no chips, leases, descriptors, master or host),
    on a host without the Tenstorrent driver too; flags that choose or recover chips are
    refused; the server's own --tp-size is its ranks."""
    bare = tmp_path / "bare"  # a root without the driver
    bare.mkdir()
    env = _env(tmp_path)
    res = run_cli("launch", "--root", str(bare), "--dry-run", "--json", "--", *CPU, "--tp-size",
                  "2", env=env)  # fmt: skip
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert data["chipless"] is True
    for key in ("mesh_shape", "dim_types", "host_topology", "symmetric_dram_mb", "host", "master"):
        assert data[key] is None, key
    (rank,) = data["ranks"]
    assert (rank["chips"], rank["bdfs"], rank["coord"]) == ([], [], None)
    assert set(rank["env"]) == {"TTMESH_JOB_ID", "TTMESH_RANK", "TTMESH_READY_FILE"}
    assert data["descriptors"] == {} and data["serving"]["chips"] == "none"
    assert data["serving"]["tp_size"] == 2
    text = run_cli("launch", "--root", str(bare), "--dry-run", "--", *CPU, env=env)
    assert text.code == 0 and "chipless (the server drives no Tenstorrent chip)" in text.out
    assert "drives no Tenstorrent chip: none is chosen, leased, checked or recovered" in text.err
    for flags in (["--tp-size", "2"], ["--chips", "0000:01:00.0"], ["--exclude", "0000:01:00.0"],
                  ["--auto-reset"], ["--mesh-shape", "1x2"], ["--reset-on-failure"],
                  ["--tt-smi", "/bin/true"]):  # fmt: skip
        res = run_cli("launch", "--root", str(qb2), "--dry-run", *flags, "--", *CPU, env=env)
        assert res.code == 2, res.err
        assert _last(res.err).startswith(
            f"ttmesh: {flags[0]}: sglang on --device cpu drives no Tenstorrent chip (drop it"
        ), res.err
    res = run_cli("launch", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                  f"127.0.0.1:{_port()}", "--dry-run", "--", *CPU, env=env)  # fmt: skip
    assert res.code == 2 and "ttmesh runs it on one host (give --nnodes 1" in _last(res.err)
    # It runs: on the host without the driver, and on one with chips, leasing none of them.
    for root in (bare, qb2):
        proc = start_launch(root, "--", *CPU, "--port", str(_port()), env=env)
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                if "ready after" in line:
                    break
            else:
                raise AssertionError("never ready")
            chips = json.loads(run_cli("ls", "--root", str(qb2), "--json").out)["chips"]
            assert all(c["lease"] is None for c in chips)
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.communicate()
        assert proc.returncode == 130, err


# --------------------------------------------------------------------------- what it leaves


def test_what_a_killed_server_leaves_in_dev_shm_is_removed(qb2: Path, tmp_path: Path) -> None:
    """A server whose tree is SIGKILLed whole (as SGLang does when a scheduler dies) leaves its
    schedulers' semaphores (/dev/shm/sem.mp-*): ttmesh removes them, and never one that a live
    process of this user still uses."""
    import multiprocessing

    env = _env(tmp_path, FAKE_MODE="crash-tree", FAKE_SEMAPHORE="1", FAKE_FAIL_AFTER="2")
    proc = start_launch(qb2, "--", *SGLANG, *TPU, "--port", str(_port()), env=env)
    try:
        wait_for(
            lambda: glob.glob(str(tmp_path / "sem-*")) or proc.poll() is not None,
            timeout=60,
            what="the semaphore",
        )
        assert proc.poll() is None, proc.communicate()[1]
        theirs = Path(next(tmp_path.glob("sem-*")).read_text())
        assert theirs.exists()
        mine = multiprocessing.get_context("spawn").Lock()  # in use by this process meanwhile
        kept = Path("/dev/shm/sem." + mine._semlock.name.lstrip("/"))  # type: ignore[attr-defined]
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    left = theirs.exists()
    with contextlib.suppress(OSError):
        theirs.unlink()  # a failing run must not leave it for the next
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert f"ttmesh: removed {theirs}, left behind by the server" in err, err
    assert not left
    assert kept.exists() and f"removed {kept}" not in err
    del mine
