"""The real SGLang (0.5.23, stock, on this CPU with a tiny model) under ``ttmesh launch``.

It becomes ready, ``/generate`` answers through the URL ttmesh printed, Ctrl-C stops it within
the grace and leaves no process and no ``/dev/shm`` file of its own, a scheduler killed with
SIGKILL ends the job with a clear summary, and ``--tp-size 2`` works too. The server is built
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
    assert "Traceback" not in err


def test_real_sglang_scheduler_killed(qb2: Path, sglang_dir: Path, tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    proc, _ = _serve(qb2, sglang_dir, 1, f"sglang-kill-{os.getpid()}")
    lines: list[str] = []
    try:
        _ready(proc, lines)
        tree = _server_tree(proc)
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
    wait_for(lambda: not any(alive(p) for p in tree), timeout=10, what="every SGLang process gone")
    del summary
