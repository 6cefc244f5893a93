"""The stand-in server shipped with the simulator (issue 36): ``ttmesh sim standin`` names its
directory; with it on PYTHONPATH the stacks' own commands run it; it prints its start as the
stack's log does, serves the health, SGLang and OpenAI routes, and misbehaves when asked."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, run_cli, wait_for

STANDIN = REPO / "ttmesh" / "sim" / "standin"


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(module: str, *argv: str, **env: str) -> tuple[subprocess.Popen[str], int]:
    port = _port()
    full = {**os.environ, "PYTHONPATH": str(STANDIN), "FAKE_PACE": "0", "LIBTT_TPU_COMPAT": "1",
            **env}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), *argv],
        env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    return proc, port


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _ready(port: int, proc: subprocess.Popen[str]) -> None:
    def up() -> bool:
        assert proc.poll() is None, proc.communicate()
        try:
            return _get(f"http://127.0.0.1:{port}/health")[0] == 200
        except OSError:
            return False

    wait_for(up, timeout=30, what="the stand-in ready")


def _end(proc: subprocess.Popen[str]) -> tuple[str, str]:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_sim_standin_names_the_directory_the_stacks_commands_run_from() -> None:
    res = run_cli("sim", "standin")
    assert res.code == 0, res.err
    where = Path(res.out.strip())
    assert where == STANDIN.resolve()
    for module in ("sglang/launch_server.py", "sgl_jax/launch_server.py",
                   "vllm/entrypoints/openai/api_server.py"):  # fmt: skip
        assert (where / module).is_file(), module
    assert "FAKE_MODE" in run_cli("sim", "standin", "--help").out


@pytest.mark.parametrize(
    ("module", "argv", "lines"),
    [
        ("sglang.launch_server", ["--device", "tpu", "--tp-size", "2", "--tpu-compile-tokens",
                                  "64", "256", "--max-total-tokens", "4096"],
         ["server_args=", "Init torch distributed begin.", "multidevice with 2 devices",
          "Load weight begin.", "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 4096",
          "Capture target prefill TPU graph begin. backend=full, num_tokens=[64, 256]",
          "Capture target decode TPU graph end. bs=[1, 4]", "Started server process",
          "The server is fired up and ready to roll!"]),
        ("sgl_jax.launch_server", ["--tp-size", "4"],
         ["server_args=", "Memory pool initialized.", "[EXTEND] Begin to precompile",
          "[DECODE] Precompile finished in", "Uvicorn running on"]),
        ("vllm.entrypoints.openai.api_server", ["--model", "m"],
         ["vLLM API server version", "Opening user mode device driver", "KV cache size: 16,384 tokens",
          "Warming up prefill for sequence length: 64", "init engine (profile, create kv cache, "
          "warmup model) took", "Starting vLLM API server 0 on"]),
    ],
)  # fmt: skip
def test_each_stack_prints_its_start_and_serves_every_route(
    module: str, argv: list[str], lines: list[str], tmp_path: Path
) -> None:
    proc, port = _start(module, *argv, FAKE_REPORT=str(tmp_path))
    url = f"http://127.0.0.1:{port}"
    try:
        _ready(port, proc)
        assert _get(f"{url}/health_generate")[0] == 200
        assert _get(f"{url}/v1/models")[1]["data"][0]["object"] == "model"
        assert _post(f"{url}/generate", b'{"text": "x"}')[1]["text"] == " Amsterdam."
        completion = _post(f"{url}/v1/completions", b'{"prompt": "x", "max_tokens": 1}')[1]
        assert completion["choices"][0]["text"] == " Amsterdam."
        chat = _post(f"{url}/v1/chat/completions", b'{"messages": []}')[1]
        assert chat["choices"][0]["message"]["role"] == "assistant"
        # Hostile requests: not JSON, not an object, a body too large, an unknown route.
        assert _post(f"{url}/generate", b"{not json")[0] == 400
        assert _post(f"{url}/generate", b"[1, 2]")[0] == 400
        assert _get(f"{url}/../../etc/passwd")[0] == 404
        big = urllib.request.Request(f"{url}/generate", b"x", {"Content-Length": str(1 << 30)})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(big, timeout=10)
        assert refused.value.code == 413
    finally:
        out, err = _end(proc)
    assert "fake server: drained and stopped" in out
    at = -1
    for line in lines:  # in this order
        found = err.find(line, at + 1)
        assert found > at, f"{line!r} not after the line before it:\n{err}"
        at = found
    assert json.loads((tmp_path / "server.json").read_text())["argv"][-len(argv) :] == argv


def test_the_fault_modes_stop_the_start_where_they_say(tmp_path: Path) -> None:
    """fatal: tt-metal's TT_THROW while it opens the chips, and it sits there (never listens);
    FAKE_HANG_AT: the start stops in that phase; slow-compile: the compile does not end."""
    procs = {
        "fatal": _start("sglang.launch_server", "--device", "tpu", FAKE_MODE="fatal"),
        "hang-at": _start("sglang.launch_server", "--device", "tpu", FAKE_HANG_AT="weights"),
        "slow": _start("sglang.launch_server", "--device", "tpu", FAKE_MODE="slow-compile"),
    }
    try:
        wait_for(lambda: all(_said(p, key) for key, (p, _port) in procs.items()),
                 timeout=30, what="each stand-in at its stop")  # fmt: skip
        for _proc, port in procs.values():
            with pytest.raises(OSError):
                _get(f"http://127.0.0.1:{port}/health")  # nothing listens: the start is stuck
    finally:
        texts = {key: _SEEN.get(p.pid, "") + _end(p)[1] for key, (p, _port) in procs.items()}
    assert "Timed out while waiting for active ethernet core" in texts["fatal"]
    assert "Load weight begin." in texts["hang-at"] and "Load weight end" not in texts["hang-at"]
    assert "Capture target prefill TPU graph begin" in texts["slow"]
    assert "Capture target prefill TPU graph end" not in texts["slow"]


SAID = {
    "fatal": "Try resetting the board",
    "hang-at": "Load weight begin.",
    "slow": "graph begin",
}
_SEEN: dict[int, str] = {}


def _said(proc: subprocess.Popen[str], key: str) -> bool:
    """Has ``proc`` printed its mode's line yet (its stderr read so far, without blocking)?"""
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    try:
        chunk = os.read(proc.stderr.fileno(), 65536).decode(errors="replace")
    except BlockingIOError:
        chunk = ""
    _SEEN[proc.pid] = _SEEN.get(proc.pid, "") + chunk
    return SAID[key] in _SEEN[proc.pid]
