"""A stand-in for SGLang-TorchTPU and SGLang-JAX servers, faithful to their process model.

Standard library only; run as ``python -m sglang.launch_server`` or ``python -m
sgl_jax.launch_server`` with ``tests/fakes`` on PYTHONPATH. What it does, as the real servers do
(measured with the real SGLang in ../shared/sglang-cpu/README.md, and the seeds):

* parses the seeds' flags and reports what it was given (argv and the environment it checks)
  to ``$FAKE_REPORT/server.json``;
* SGLang-TorchTPU (``--device tpu``) with ``--tp-size N`` starts one child process per chip
  (titled ``sglang::scheduler_TP<i>``, dying with its parent); SGLang-JAX drives every chip from
  the one process. On a simulated host each chip's process opens it: it holds the chip and
  brings the fabric up (a mark the simulator drops only on a clean close), as libtt would;
* serves ``/health`` (503 until ready, then 200) and ``/generate`` on ``--host:--port``;
* on SIGTERM drains (``$FAKE_DRAIN`` seconds), then SIGKILLs its children (they never close the
  chips, as SGLang's schedulers don't) and exits 0.

``$FAKE_MODE`` makes it misbehave: ``crash`` (exit 3 after ready), ``crash-tree`` (after ready,
SIGKILL to its whole process group, itself included, as SGLang's SIGQUIT handler does when a
scheduler dies), ``hang`` (never ready),
``unhealthy`` (``/health`` 503 after ready), ``child-dies`` (a child exits after ready),
``ignore-term`` (ignores SIGTERM). ``$FAKE_READY_AFTER`` seconds to ready (0.3). ``$FAKE_SAY``: a
line it prints on stderr once it has started (what a failing libtt or tt-metal would say).
``$FAKE_LISTEN_PORT``: the port it really listens on (a server that ignores its ``--port``).
``$FAKE_SEMAPHORE``: each child holds a multiprocessing lock (``/dev/shm/sem.mp-*``, its path in
``$FAKE_REPORT/sem-PID``), as SGLang's schedulers do. ``$FAKE_LATENCY``: seconds each
``/generate`` takes (0: it answers at once), requests served concurrently up to the command's
``--max-running-requests`` (SGLang's own bound; none given: all at once), the rest waiting
their turn, as a real server's batch does; so a fleet of replicas serves more than one server.

SIGTERM is handled by the main thread only (every other thread blocks it): delivered to a
thread serving a request, it would wake nothing, and the main thread, asleep, would start its
drain only when its sleep ends (a minute), long after ttmesh's grace. SGLang's uvicorn loop
wakes on any thread's signal (its wakeup fd), so it drains at once; so does the stand-in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHILD = r"""
import ctypes, json, os, signal, sys, time
ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # die with the server, as SGLang's do
chips = json.loads(sys.argv[1])
root = os.environ.get("TTMESH_SIM_ROOT")
if root and chips:
    sys.path.insert(0, os.path.join(root, "bin"))
    import _ttmesh_simcore as core
    sim = core.SimRoot(root)
    sim.add_holder(chips[:1], os.getpid(), kind="fake-scheduler")
    sim.mark_fabric(chips, os.getpid(), owner="fake-scheduler")
if os.environ.get("FAKE_SEMAPHORE"):  # a lock of its own, as each SGLang scheduler holds one
    import multiprocessing
    # Titled sglang::scheduler, this Python does not know its own executable, which
    # multiprocessing needs to start its resource tracker.
    multiprocessing.set_executable(os.readlink("/proc/self/exe"))
    lock = multiprocessing.get_context("spawn").Lock()
    with open(os.path.join(os.environ["FAKE_REPORT"], f"sem-{os.getpid()}"), "w") as out:
        out.write("/dev/shm/sem." + lock._semlock.name.lstrip("/"))
os.write(int(sys.argv[2]), b"up")  # initialised: the server may say it is ready
while True:
    time.sleep(60)
"""


def flags(argv: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for word in argv:
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            current = name
            out.setdefault(name, [])
            if eq:
                out[name].append(value)
                current = None
        elif current is not None:
            out[current].append(word)
    return out


def one(f: dict[str, list[str]], name: str, default: str) -> str:
    return (f.get(name) or [default])[0]


def main(stack: str) -> None:
    f = flags(sys.argv[1:])
    mode = os.environ.get("FAKE_MODE", "")
    tp = int(one(f, "--tp-size", "1"))
    tpu = one(f, "--device", "") == "tpu"
    checked = {
        k: os.environ.get(k)
        for k in (
            "TT_VISIBLE_DEVICES", "TT_MESH_GRAPH_DESC_PATH", "LIBTT_TPU_COMPAT", "SGLANG_PLATFORM",
            "TORCH_TPU_INTERNAL_XLA_OPTIONS", "LIBTT_SYMMETRIC_DRAM_MB", "JAX_PLATFORMS", "RANK",
            "WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS", "TTMESH_JOB_ID",
        )
    }  # fmt: skip
    report = os.environ.get("FAKE_REPORT")
    if report:
        with open(os.path.join(report, "server.json"), "w") as out:
            json.dump(
                {"stack": stack, "argv": sys.argv[1:], "env": checked, "pid": os.getpid()}, out
            )
    if stack == "sglang" and tpu and os.environ.get("LIBTT_TPU_COMPAT") != "1":
        sys.stderr.write("RuntimeError: TPU platform not found (is LIBTT_TPU_COMPAT=1 set?)\n")
        sys.exit(1)
    chips = json.loads(os.environ.get("TTMESH_JOB_CHIPS") or "[]")
    children: list[subprocess.Popen] = []
    up_r, up_w = os.pipe()  # each child says "up" once it holds its chips, as SGLang's
    # schedulers finish initialising before the server reports ready
    if stack == "sglang" and tpu and tp > 1:  # one process per chip, libtt assigns them
        for i in range(tp):
            mine = chips[i:] + chips[:i]
            children.append(
                subprocess.Popen(
                    [f"sglang::scheduler_TP{i}", "-c", CHILD, json.dumps(mine), str(up_w)],
                    executable=sys.executable,
                    pass_fds=(up_w,),
                )
            )
    else:
        children.append(
            subprocess.Popen(
                ["sglang::scheduler", "-c", CHILD, json.dumps(chips), str(up_w)],
                executable=sys.executable,
                pass_fds=(up_w,),
            )
        )
    state = {"ready": False, "draining": False}
    latency = float(os.environ.get("FAKE_LATENCY") or 0)
    slots = int(one(f, "--max-running-requests", "0"))
    batch = threading.BoundedSemaphore(slots) if slots > 0 else None
    answered = threading.Event()  # /health has said 200 once: the watcher has seen it ready

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                ok = state["ready"] and not state["draining"] and mode != "unhealthy-now"
                self._send(200 if ok else 503, {})
                if ok:
                    answered.set()
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path in ("/generate", "/v1/completions") and state["ready"]:
                if latency > 0:  # the model's time: in the batch, at most its slots at once
                    if batch is not None:
                        with batch:
                            time.sleep(latency)
                    else:
                        time.sleep(latency)
                self._send(
                    200, {"text": " Amsterdam.", "prompt": body.get("text", body.get("prompt"))}
                )
            else:
                self._send(503 if self.path == "/generate" else 404, {})

    port = int(os.environ.get("FAKE_LISTEN_PORT") or one(f, "--port", "30000"))
    server = ThreadingHTTPServer((one(f, "--host", "127.0.0.1"), port), Handler)
    # Threads inherit the mask they are started with: the server's, and each request's, block
    # SIGTERM, so the kernel hands it to the main thread, whose sleep it interrupts.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})

    def stop(*_: object) -> None:
        state["draining"] = True
        time.sleep(float(os.environ.get("FAKE_DRAIN", "0.2")))
        for child in children:  # as SGLang: SIGKILL, so they never close the chips
            child.kill()
        for child in children:
            child.wait()
        sys.stdout.write("fake server: drained and stopped\n")
        sys.stdout.flush()
        os._exit(0)

    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, stop)
    sys.stdout.write(f"fake {stack} server on port {one(f, '--port', '30000')}\n")
    sys.stdout.flush()
    if os.environ.get("FAKE_SAY"):
        sys.stderr.write(os.environ["FAKE_SAY"] + "\n")
        sys.stderr.flush()
    os.close(up_w)
    heard = b""
    while len(heard) < 2 * len(children):
        got = os.read(up_r, 64)
        if not got:
            break  # a child died before it was up
        heard += got
    if mode != "hang":
        time.sleep(float(os.environ.get("FAKE_READY_AFTER", "0.3")))
        state["ready"] = True
        sys.stdout.write("The server is fired up and ready to roll!\n")
        sys.stdout.flush()
    if mode in ("crash", "crash-tree", "unhealthy", "child-dies"):
        time.sleep(float(os.environ.get("FAKE_FAIL_AFTER", "0.5")))
        if mode == "crash-tree":
            sys.stderr.write("fake server: a child failed, killing the whole tree\n")
            sys.stderr.flush()
            os.killpg(0, signal.SIGKILL)
        if mode == "crash":
            sys.stderr.write("fake server: crashing on purpose\n")
            sys.stderr.flush()
            for child in children:
                child.kill()
            # A real server takes a moment between its schedulers' end and its own (it reaps
            # them, logs, tears down): FAKE_CRASH_LINGER widens that moment.
            time.sleep(float(os.environ.get("FAKE_CRASH_LINGER", "0")))
            os._exit(3)
        if mode == "unhealthy":
            # Unhealthy once ttmesh has seen it ready (an event, not a time: under load its
            # first probe may come later than FAKE_FAIL_AFTER).
            answered.wait(120)
            mode = "unhealthy-now"
        if mode == "child-dies":
            children[0].kill()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main("sglang")
