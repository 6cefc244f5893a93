"""The real SGLang (0.5.23, stock, on this CPU with a tiny model) under ``ttmesh launch``.

It becomes ready, ``/generate`` answers through the URL ttmesh printed, Ctrl-C stops it within
the grace and leaves no process and no ``/dev/shm`` file of its own, a scheduler killed with
SIGKILL ends the job with a clear summary and nothing of the server's left in ``/dev/shm``
(its semaphores included), ``--tp-size 2`` works too, and ``--replicas 2`` serves behind the
real sglang-router at the user's ``--host:--port``. Stock SGLang drives no Tenstorrent chip: the
simulated host given is not read. The server is built by scripts/sglang-cpu/setup (``.ci/run``
does it; ``TTMESH_SGLANG_DIR``). A start is most of each test's time (the server's three
processes each import SGLang: ~35 s of CPU), so each test starts as few servers as it can.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, Lines, alive, start_launch, wait_for

from ttmesh import procs

pytestmark = pytest.mark.sglang
GRACE = 30
SHM = ("/dev/shm/sglang_loads_*", "/dev/shm/sgl_shm_mq_*")


@pytest.fixture(scope="session")
def sglang_dir() -> Path:
    path = Path(os.environ.get("TTMESH_SGLANG_DIR") or Path.home() / ".cache" / "ttmesh-sglang")
    if not (path / ".complete").exists():
        proc = subprocess.run(
            ["bash", str(REPO / "scripts" / "sglang-cpu" / "setup"), str(path)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        if proc.returncode != 0:
            pytest.skip(f"SGLang could not be built here: {proc.stderr.strip()[-300:]}")
    return path


def _port() -> int:
    """A free port below the kernel's ephemeral range. The server binds its port only once it
    has loaded (20-40 s here), and an ephemeral port chosen now may meanwhile be handed to any
    process that binds port 0 (in CI, once, another test's: "address already in use"); the
    kernel never hands out a port below the range."""
    import random
    import socket

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    top = min(low, 32768) - 1100  # SGLang also binds some ports above its own (port + N)
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def _sockets(root: Path) -> str:
    """A temporary directory beside the test's simulated host, removed with it: SGLang names
    its ZMQ IPC sockets with tempfile and never removes them (a killed server could not)."""
    where = root.parent / "tmp"
    where.mkdir(mode=0o700, exist_ok=True)
    return str(where)


def _serve(
    root: Path, sglang_dir: Path, tp: int, job: str, *extra: str
) -> tuple[subprocess.Popen, int]:
    port = _port()
    argv = [
        str(sglang_dir / "venv" / "bin" / "python"), "-m", "sglang.launch_server",
        "--model-path", str(sglang_dir / "tiny"), "--device", "cpu", "--host", "127.0.0.1",
        "--port", str(port), "--attention-backend", "torch_native", "--disable-cuda-graph",
        "--max-total-tokens", "2048", "--skip-server-warmup", "--sleep-on-idle", "--tp-size", str(tp),
    ]  # fmt: skip
    env = {"SGLANG_USE_CPU_ENGINE": "1", "TMPDIR": _sockets(root)}
    if tp == 2:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
    proc = start_launch(root, "--job-id", job, "--grace", str(GRACE), *extra, "--", *argv, env=env)
    return proc, port


def _ready(proc: subprocess.Popen, lines: list[str], timeout: float = 600) -> str:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        lines.append(line)
        match = re.search(r"ready after [\d.:]+(?: s)? at (http://\S+)", line)
        if match:
            return match.group(1)
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError("the server never became ready:\n" + "".join(lines))


def _generate(url: str) -> dict:
    body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 4}}).encode()
    request = urllib.request.Request(f"{url}/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200
        return json.loads(response.read())


def _server_tree(launch: int) -> list[int]:
    """The server (the guardian's child, under the ``ttmesh launch`` ``launch``) and everything
    under it."""
    guardian = next(p for p in procs.descendants(launch) if procs.parent(p) == launch)
    server = next(p for p in procs.descendants(guardian) if procs.parent(p) == guardian)
    return [server, *procs.descendants(server)]


def _shm() -> set[str]:
    return {p for pattern in SHM for p in glob.glob(pattern)}


def _unused(paths: set[str]) -> set[str]:
    """Those of ``paths`` that no live process maps or holds open. A server maps its own files
    while it lives (SGLang's load snapshot, its semaphores), so once a test's servers are gone
    what is unused is what they left; a file another SGLang on this machine uses (a concurrent
    run's) is neither this test's leftover nor its to remove."""
    inodes: dict[int, str] = {}
    for path in paths:
        with contextlib.suppress(OSError):
            inodes[os.stat(path).st_ino] = path
    used: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6 and int(fields[4]) in inodes:
                    used.add(inodes[int(fields[4])])
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in paths:
                        used.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return set(inodes.values()) - used


def _tree_shm(tree: list[int]) -> set[tuple[str, int]]:
    """The /dev/shm files the server's processes map now, as (path, inode): their semaphores
    (``sem.mp-*``, one per scheduler; a map names the file it was created as, so files are
    matched by inode) and shared memory. What another program of this user holds is not in it,
    so a concurrent run cannot fail the test."""
    inodes = set()
    for pid in tree:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                    inodes.add(int(fields[4]))
    out = set()
    for path in glob.glob("/dev/shm/*"):
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino in inodes:
                out.add((path, os.stat(path).st_ino))
    return out


def _left(files: set[tuple[str, int]]) -> list[str]:
    """Which of the server's /dev/shm files are still there (the same file, by inode)."""
    left = []
    for path, inode in files:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                left.append(path)
    return sorted(left)


def _remove(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


@pytest.fixture(autouse=True)
def _no_shm_left() -> Iterator[None]:
    """Whatever a test's SGLang left in /dev/shm (a test that failed before ttmesh cleaned up,
    the asserts having run) is removed after it, so no run leaves it for the next; what a live
    process still uses (another run's server) is left alone."""
    before = _shm()
    yield
    for path in _unused(_shm() - before):
        with contextlib.suppress(OSError):
            os.unlink(path)


def _started(proc: subprocess.Popen, port: int, tp: int, lines: list[str]):
    """Ready at the URL asked for, the curl hint after it, ``/generate`` answered there, ``tp``
    schedulers and one semaphore each: the server's tree and its /dev/shm files."""
    url = _ready(proc, lines)
    assert url == f"http://127.0.0.1:{port}"
    curl = proc.stderr.readline()  # type: ignore[union-attr]
    assert curl.startswith(f"ttmesh: try: curl -sS {url}/generate"), curl
    assert len(_generate(url)["output_ids"]) == 4
    tree = _server_tree(proc.pid)
    names = [(procs.command_line(p) or "") for p in tree]
    assert sum(n.startswith("sglang::scheduler") for n in names) == tp, names
    files = _tree_shm(tree)
    assert sum("/sem.mp-" in p for p, _ in files) == tp, files  # one per scheduler
    return tree, files


def test_real_sglang_ready_generate_and_ctrl_c(qb2: Path, sglang_dir: Path) -> None:
    """``--tp-size 2``: ready, answers, Ctrl-C stops it within the grace, nothing left. (One
    process per server, Ctrl-C'd, is the fleet test's; one killed, the test after this.)"""
    before = _shm()
    proc, port = _serve(qb2, sglang_dir, 2, f"sglang-{os.getpid()}-2")
    lines: list[str] = []
    try:
        tree, files = _started(proc, port, 2, lines)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=GRACE + 60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.communicate()
    text = "".join(lines) + err
    assert proc.returncode == 130, text
    assert took < GRACE + 15, text  # within the grace (and the check after it)
    wait_for(lambda: not any(alive(p) for p in tree), timeout=5, what="every SGLang process gone")
    assert _unused(_shm() - before) == set(), "SGLang files left in /dev/shm"
    left = _left(files)
    _remove(left)
    assert left == [], "the server's files left in /dev/shm"
    assert "Traceback" not in err


def test_real_sglang_ready_generate_then_scheduler_killed(
    qb2: Path, sglang_dir: Path, tmp_path: Path
) -> None:
    """One process: ready, answers; then its scheduler killed. SGLang SIGKILLs its own tree,
    itself and multiprocessing's resource tracker included, so nothing of SGLang's unlinks the
    scheduler's semaphore; ttmesh ends the job with the server's code (stock SGLang has no
    torchrun error file) and leaves nothing of the server's in /dev/shm. One start serves both
    (a start is most of a real SGLang test's time)."""
    before = _shm()
    summary = tmp_path / "s.json"
    proc, port = _serve(qb2, sglang_dir, 1, f"sglang-kill-{os.getpid()}", "--summary-json",
                        str(summary))  # fmt: skip
    lines: list[str] = []
    try:
        tree, files = _started(proc, port, 1, lines)
        _checklist_said(lines)
        scheduler = next(
            p for p in tree if (procs.command_line(p) or "").startswith("sglang::scheduler")
        )
        os.kill(scheduler, signal.SIGKILL)
        _out, err = proc.communicate(timeout=GRACE + 60)
    finally:
        proc.kill()
        proc.communicate()
    text = "".join(lines) + err
    assert proc.returncode not in (0, 130), text
    last = err.strip().splitlines()[-1]
    assert re.search(rf"sglang::scheduler \(pid {scheduler}\) died|rank 0 (exited|killed)", text), (
        text
    )
    assert last.startswith("ttmesh: exit "), last
    assert "supervisor error" not in text, text
    wait_for(lambda: not any(alive(p) for p in tree), timeout=10, what="every SGLang process gone")
    assert _unused(_shm() - before) == set(), "SGLang files left in /dev/shm"
    left = _left(files)
    _remove(left)
    assert left == [], "the server's files left in /dev/shm"
    # Its start, step by step, in --summary-json (issue 36): the profile's patterns, read from
    # the real SGLang's own log.
    phases = json.loads(summary.read_text())["phases"]
    assert [(p["key"], p["state"]) for p in phases] == [
        (key, "done") for key in ("engine", "ranks", "weights", "kv", "server")
    ], phases
    assert phases[3]["detail"] == "2048 tokens" and phases[2]["detail"].startswith("Qwen2")


def _checklist_said(lines: list[str]) -> None:
    """The stock SGLang profile's checklist, one plain line per step (ttmesh's stderr is a
    pipe here), from the real server's own log, before its ready line (issue 36)."""
    said = re.compile(
        r"ttmesh: sglang: \[(\d)/5 · [\d.:]+(?: s)?\] (.+?) in [\d.:]+(?: s)?(?: \((.*)\))?$"
    )
    steps = [m.groups() for m in (said.match(ln.rstrip("\n")) for ln in lines) if m]
    assert [(k, label) for k, label, _ in steps] == [
        ("1", "engine started"), ("2", "ranks set up"), ("3", "weights loaded"),
        ("4", "KV cache allocated"), ("5", "API server up"),
    ], "".join(lines)  # fmt: skip
    assert steps[3][2] == "2048 tokens" and steps[1][2] == "world size 1", steps


def test_real_sglang_fleet_behind_the_real_router(qb2: Path, sglang_dir: Path) -> None:
    """Two replicas of the real SGLang (one process each, started together) behind
    sglang-router at the user's --host:--port: /generate and /v1/chat/completions answered
    there; Ctrl-C drains each replica's job (exit 130) and leaves nothing: no process, no
    /dev/shm file of SGLang's or of either server's (their semaphores included)."""
    before = _shm()
    port = _port()
    argv = [
        str(sglang_dir / "venv" / "bin" / "python"), "-m", "sglang.launch_server",
        "--model-path", str(sglang_dir / "tiny"), "--device", "cpu", "--host", "127.0.0.1",
        "--port", str(port), "--attention-backend", "torch_native", "--disable-cuda-graph",
        "--max-total-tokens", "2048", "--skip-server-warmup", "--sleep-on-idle",
    ]  # fmt: skip
    # The servers' own output (one line per request) is not read here: not a pipe that fills.
    proc = start_launch(qb2, "--replicas", "2", "--replicas-parallel", "--job-id",
                        f"fleet-rig-{os.getpid()}", "--grace", str(GRACE), "--", *argv,
                        stdout=subprocess.DEVNULL,
                        env={"SGLANG_USE_CPU_ENGINE": "1", "TMPDIR": _sockets(qb2)})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # Read with deadlines: a replica that fails to start leaves the fleet serving on the other
    # one (and the fleet's stderr open), so a plain read would wait for ever.
    lines = Lines(proc)
    tree: list[int] = []
    files: set[tuple[str, int]] = set()
    try:
        lines.until("ready: routed to", 2, timeout=600)
        wait_for(lambda: _workers(url) == 2, timeout=180, what="both replicas in the router")
        assert len(_generate(url)["output_ids"]) == 4
        chat = json.dumps({"model": "tiny", "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
        req = urllib.request.Request(f"{url}/v1/chat/completions", chat,
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.loads(r.read())["choices"][0]["message"]["role"] == "assistant"
        tree = [proc.pid, *procs.descendants(proc.pid)]
        jobs = [p for p in tree if procs.parent(p) == proc.pid and "--fleet-of" in _cmd(p)]
        servers = [_server_tree(job) for job in jobs]
        assert len(servers) == 2, [_cmd(p) for p in tree]
        for server in servers:
            names = [_cmd(p) for p in server]
            assert sum(n.startswith("sglang::scheduler") for n in names) == 1, names
            mine = _tree_shm(server)
            assert sum("/sem.mp-" in p for p, _ in mine) == 1, mine
            files |= mine
        said = len(lines.seen)
        proc.send_signal(signal.SIGINT)
        lines.rest(timeout=GRACE + 90)
        proc.wait(timeout=GRACE + 90)
    finally:
        proc.kill()
        proc.wait()
    text = "".join(lines.seen)
    err = "".join(lines.seen[said:])  # after the Ctrl-C
    assert proc.returncode == 130, text
    for k in (0, 1):  # each replica's job drained its server, as a job of its own does
        assert f"[replica{k}] ttmesh: exit 130: interrupted" in err, text
    wait_for(lambda: not any(alive(p) for p in tree), timeout=10, what="every process gone")
    assert _unused(_shm() - before) == set(), "SGLang files left in /dev/shm"
    left = _left(files)
    _remove(left)
    assert left == [], "the servers' files left in /dev/shm"
    assert "Traceback" not in err


def _cmd(pid: int) -> str:
    return procs.command_line(pid) or ""


def _workers(url: str) -> int:
    """The router's workers (its open /get_server_info: /workers takes the fleet's key only)."""
    try:
        with urllib.request.urlopen(url + "/get_server_info", timeout=2) as r:
            return int(json.loads(r.read())["workers_count"])
    except (OSError, ValueError, KeyError):
        return -1
