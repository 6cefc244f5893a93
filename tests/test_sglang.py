"""The real SGLang (0.5.23, stock, on this CPU with a tiny model) under ``ttmesh launch``.

It becomes ready, ``/generate`` answers through the URL ttmesh printed, Ctrl-C stops it within
the grace and leaves no process and no ``/dev/shm`` file of its own, a scheduler killed with
SIGKILL ends the job with a clear summary and nothing of the server's left in ``/dev/shm``
(its semaphores included), and ``--tp-size 2`` works too. Stock SGLang drives no Tenstorrent
chip: the simulated host given is not read. The server is built
by scripts/sglang-cpu/setup (``.ci/run`` does it; ``TTMESH_SGLANG_DIR``).
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
from conftest import REPO, alive, start_launch, wait_for

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
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(root: Path, sglang_dir: Path, tp: int, job: str) -> tuple[subprocess.Popen, int]:
    port = _port()
    argv = [
        str(sglang_dir / "venv" / "bin" / "python"), "-m", "sglang.launch_server",
        "--model-path", str(sglang_dir / "tiny"), "--device", "cpu", "--host", "127.0.0.1",
        "--port", str(port), "--attention-backend", "torch_native", "--disable-cuda-graph",
        "--max-total-tokens", "2048", "--skip-server-warmup", "--sleep-on-idle", "--tp-size", str(tp),
    ]  # fmt: skip
    env = {"SGLANG_USE_CPU_ENGINE": "1"}
    if tp == 2:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
    proc = start_launch(root, "--job-id", job, "--grace", str(GRACE), "--", *argv, env=env)
    return proc, port


def _ready(proc: subprocess.Popen, lines: list[str], timeout: float = 600) -> str:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        lines.append(line)
        match = re.search(r"ready after [\d.]+ s at (http://\S+)", line)
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


def _server_tree(proc: subprocess.Popen) -> list[int]:
    """The server (the guardian's child) and everything under it."""
    guardian = next(p for p in procs.descendants(proc.pid) if procs.parent(p) == proc.pid)
    server = next(p for p in procs.descendants(guardian) if procs.parent(p) == guardian)
    return [server, *procs.descendants(server)]


def _shm() -> set[str]:
    return {p for pattern in SHM for p in glob.glob(pattern)}


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
    the asserts having run) is removed after it, so no run leaves it for the next."""
    before = _shm()
    yield
    for path in _shm() - before:
        with contextlib.suppress(OSError):
            os.unlink(path)


@pytest.mark.parametrize("tp", [1, 2])
def test_real_sglang_ready_generate_and_ctrl_c(qb2: Path, sglang_dir: Path, tp: int) -> None:
    before = _shm()
    proc, port = _serve(qb2, sglang_dir, tp, f"sglang-{os.getpid()}-{tp}")
    lines: list[str] = []
    try:
        url = _ready(proc, lines)
        assert url == f"http://127.0.0.1:{port}"
        curl = proc.stderr.readline()  # type: ignore[union-attr]
        assert curl.startswith(f"ttmesh: try: curl -sS {url}/generate"), curl
        assert len(_generate(url)["output_ids"]) == 4
        tree = _server_tree(proc)
        names = [(procs.command_line(p) or "") for p in tree]
        assert sum(n.startswith("sglang::scheduler") for n in names) == tp, names
        files = _tree_shm(tree)
        assert sum("/sem.mp-" in p for p, _ in files) == tp, files  # one per scheduler
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
    assert _shm() - before == set(), "SGLang files left in /dev/shm"
    left = _left(files)
    _remove(left)
    assert left == [], "the server's files left in /dev/shm"
    assert "Traceback" not in err


def test_real_sglang_scheduler_killed(qb2: Path, sglang_dir: Path, tmp_path: Path) -> None:
    """A scheduler killed: SGLang SIGKILLs its own tree, itself and multiprocessing's resource
    tracker included, so nothing of SGLang's unlinks the scheduler's semaphore; ttmesh ends the
    job with the server's code (stock SGLang has no torchrun error file) and leaves nothing of
    the server's in /dev/shm."""
    summary = tmp_path / "summary.json"
    proc, _ = _serve(qb2, sglang_dir, 1, f"sglang-kill-{os.getpid()}")
    lines: list[str] = []
    try:
        _ready(proc, lines)
        tree = _server_tree(proc)
        files = _tree_shm(tree)
        assert any("/sem.mp-" in p for p, _ in files), files
        scheduler = next(
            p for p in tree if (procs.command_line(p) or "").startswith("sglang::scheduler")
        )
        os.kill(scheduler, signal.SIGKILL)
        _out, err = proc.communicate(timeout=GRACE + 60)
    finally:
        proc.kill()
        proc.communicate()
    text = "".join(lines) + err
    assert proc.returncode != 0, text
    last = err.strip().splitlines()[-1]
    assert re.search(rf"sglang::scheduler \(pid {scheduler}\) died|rank 0 (exited|killed)", text), (
        text
    )
    assert last.startswith("ttmesh: exit "), last
    assert "supervisor error" not in text, text
    wait_for(lambda: not any(alive(p) for p in tree), timeout=10, what="every SGLang process gone")
    left = _left(files)
    _remove(left)
    assert left == [], "the server's files left in /dev/shm"
    del summary


@pytest.mark.skipif(
    not os.environ.get("TTMESH_FLEET_RIG"),
    reason="two real SGLang starts behind the real router take ~150 s on 2 cores, over the CI "
    "budget: set TTMESH_FLEET_RIG=1 to run it (test_fleet covers the fleet with the stand-in)",
)
def test_real_sglang_fleet_behind_the_real_router(qb2: Path, sglang_dir: Path) -> None:
    """Two replicas of the real SGLang (one process each) behind sglang-router at the user's
    --host:--port: /generate and /v1/chat/completions answered there; Ctrl-C leaves nothing."""
    before = _shm()
    port = _port()
    argv = [
        str(sglang_dir / "venv" / "bin" / "python"), "-m", "sglang.launch_server",
        "--model-path", str(sglang_dir / "tiny"), "--device", "cpu", "--host", "127.0.0.1",
        "--port", str(port), "--attention-backend", "torch_native", "--disable-cuda-graph",
        "--max-total-tokens", "2048", "--skip-server-warmup", "--sleep-on-idle",
    ]  # fmt: skip
    proc = start_launch(qb2, "--replicas", "2", "--replicas-parallel", "--job-id",
                        f"fleet-rig-{os.getpid()}", "--grace", str(GRACE), "--", *argv,
                        env={"SGLANG_USE_CPU_ENGINE": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    tree: list[int] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if sum("ready: routed to" in ln for ln in lines) == 2:
                break
        wait_for(lambda: _workers(url) == 2, timeout=60, what="both replicas in the router")
        assert len(_generate(url)["output_ids"]) == 4
        chat = json.dumps({"model": "tiny", "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
        req = urllib.request.Request(f"{url}/v1/chat/completions", chat,
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.loads(r.read())["choices"][0]["message"]["role"] == "assistant"
        tree = [proc.pid, *procs.descendants(proc.pid)]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=GRACE + 90)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130, "".join(lines)
    wait_for(lambda: not any(alive(p) for p in tree), timeout=10, what="every process gone")
    assert _shm() - before == set(), "SGLang files left in /dev/shm"
    assert "Traceback" not in err


def _workers(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/workers", timeout=2) as r:
            return len(json.loads(r.read())["workers"])
    except (OSError, ValueError):
        return -1
