"""ttmesh's stand-in server: SGLang-TorchTPU, SGLang-JAX, stock SGLang and vLLM as a simulated
host needs them, so serving can be tried, and tested, without a serving stack or a chip.

Standard library only. Put this directory on ``PYTHONPATH`` (``ttmesh sim standin`` prints it)
and run the stack's own command: ``python -m sglang.launch_server ...`` (SGLang-TorchTPU with
``--device tpu``, stock SGLang otherwise), ``python -m sgl_jax.launch_server ...`` or ``python
-m vllm.entrypoints.openai.api_server ...``. What it does, as the real servers do (measured with
the real SGLang on a CPU, tests/test_sglang.py, and the seeds):

* parses the seeds' flags and reports what it was given (argv and the environment it checks)
  to ``$FAKE_REPORT/server.json`` when that is set;
* prints its start the way the stack's own log does, phase by phase, with the stack's own
  lines (SGLang's ``server_args=``, ``Load weight begin``, ``KV Cache is allocated``, ``Capture
  ... graph begin``, uvicorn's ``Started server process``, vLLM's as tt-cli reads them), paced
  by ``$FAKE_PACE`` (a scale: 1, the default, takes about 15 s; 10 about two and a half
  minutes, closer to a first start on chips; 0 at once);
* SGLang-TorchTPU with ``--tp-size N`` starts one child process per chip (titled
  ``sglang::scheduler_TP<i>``, dying with its parent); SGLang-JAX and vLLM drive every chip from
  the one process. On a simulated host each chip's process opens it: it holds the chip and
  brings the fabric up (a mark the simulator drops only on a clean close), as libtt would;
* listens on ``--host:--port`` once its engine is up, as uvicorn does, and serves ``/health``
  and ``/health_generate`` (503 until ready, then 200), SGLang's ``/generate`` and the OpenAI
  routes (``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``);
* on SIGTERM drains (``$FAKE_DRAIN`` seconds), then SIGKILLs its children (they never close the
  chips, as SGLang's schedulers don't) and exits 0.

``$FAKE_MODE`` makes it misbehave: ``crash`` (exit 3 after ready), ``crash-tree`` (after ready,
SIGKILL to its whole process group, itself included, as SGLang's SIGQUIT handler does when a
scheduler dies), ``hang`` (never ready: listens, answers 503), ``mute`` (listens on its port,
never takes a connection: every probe times out), ``unhealthy`` (``/health`` 503 after ready),
``child-dies`` (a child exits after ready), ``ignore-term`` (ignores SIGTERM), ``fatal`` (while
it opens the chips, prints tt-metal's ``TT_THROW`` for a wedged Ethernet core, ``$FAKE_FATAL``
to print another line, then sits there, as tt-studio#1283's server did), ``slow-compile`` (its
compile takes ``$FAKE_COMPILE`` seconds, an hour by default), ``fatal-late`` (the same line
once ready: it serves on), ``hung-healthy`` (after ready, ``/health`` still answers while every
generation hangs, tt-xla#5828). ``$FAKE_HANG_AT`` (a phase:
engine, device, weights, kv, compile, server) stops the start in that phase for good.
``$FAKE_FAIL_AFTER`` seconds after its ``/health`` first answered 200 (its supervisor saw it
ready) a failure comes (0.5). ``$FAKE_READY_AFTER`` seconds
from listening to ready (0.3). ``$FAKE_SAY``: a line it prints on stderr once it has started
(what a failing libtt or tt-metal would say). ``$FAKE_LISTEN_PORT``: the port it really
listens on (a server that ignores its ``--port``). ``$FAKE_SEMAPHORE``: each child holds a
multiprocessing lock (``/dev/shm/sem.mp-*``, its path in ``$FAKE_REPORT/sem-PID``), as SGLang's
schedulers do. ``$FAKE_LATENCY``: seconds each generation takes (0: it answers at once),
requests served concurrently up to the command's ``--max-running-requests`` (SGLang's own
bound; none given: all at once), the rest waiting their turn, as a real server's batch does.

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
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PHASES = ("engine", "device", "weights", "kv", "compile", "server")
MAX_BODY = 1 << 20  # a request body is read up to this (a client sending more is refused)
ANSWER = " Amsterdam."
# tt-metal's TT_THROW for an Ethernet core left wedged by a killed job (tt_metal/llrt/llrt.cpp,
# the wait for an active Ethernet core's heartbeat; tt-inference-server#4923).
FATAL = (
    "TT_THROW @ tt_metal/llrt/llrt.cpp:581: tt::exception: Device 0: Timed out while waiting for "
    "active ethernet core (x=20,y=25) to become active again. Try resetting the board. Is the "
    "firmware updated? Minimum tt-firmware version is 18.8.0"
)

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


def number(name: str, default: float) -> float:
    """A number from the environment; a value that is none is the default (said once)."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value >= 0 and value < 1e7):  # also nan
        sys.stderr.write(f"stand-in: {name}={raw!r} is not a number of seconds: using {default}\n")
        return default
    return value


class Log:
    """The stack's log lines, on stderr as SGLang and vLLM write them."""

    def __init__(self, stack: str) -> None:
        self.stack = stack

    def __call__(self, message: str) -> None:
        now = time.time()
        if self.stack == "vllm":
            stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(now))
            line = f"INFO {stamp} [api_server.py:1] {message}\n"
        else:
            line = f"[{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))}] {message}\n"
        sys.stderr.write(line)
        sys.stderr.flush()


class Start:
    """The start, phase by phase: each phase's lines, its time (paced) and what it does."""

    def __init__(self, stack: str, tpu: bool, f: dict[str, list[str]], mode: str) -> None:
        self.stack = stack
        self.tpu = tpu
        self.f = f
        self.mode = mode
        self.say = Log(stack)
        self.pace = number("FAKE_PACE", 1.0)
        self.hang_at = os.environ.get("FAKE_HANG_AT", "")
        # Its chips: --tp-size, else every chip it was given (vLLM: the whole mesh).
        chips = json.loads(os.environ.get("TTMESH_JOB_CHIPS") or "[]")
        self.tp = int(one(f, "--tp-size", str(len(chips) or 1)) or 1)
        self.device = one(f, "--device", "tpu" if stack == "sgl_jax" else "")
        model = one(f, "--model-path", one(f, "--model", "Qwen/Qwen3-8B"))
        self.model = model

    def wait(self, seconds: float) -> None:
        time.sleep(seconds * self.pace)

    def phase(self, key: str) -> None:
        """Stop here for good when asked to (FAKE_HANG_AT)."""
        if self.hang_at == key:
            while True:
                time.sleep(60)

    def engine(self) -> None:
        if self.stack == "vllm":
            self.say("vLLM API server version 0.10.1.dev0+tt")
            self.say(f"Initializing a V1 LLM engine (v0.10.1) with config: model='{self.model}'")
        else:
            args = f"model_path='{self.model}', tp_size={self.tp}, device='{self.device}'"
            self.say(f"server_args=ServerArgs({args}, ...)")
        self.phase("engine")
        self.wait(1.0)

    def device_open(self, start_children: Callable[[], None]) -> None:
        """Open the chips: the children (each holds its chips), then the mesh."""
        cpu = self.device == "cpu"
        if self.stack == "sglang":
            self.say("Init parallel begin." if cpu else "Init torch distributed begin.")
        if not cpu:
            self.say("Opening user mode device driver")
        start_children()
        if self.mode == "fatal":
            for line in (os.environ.get("FAKE_FATAL") or FATAL).splitlines():
                self.say(line)
            while True:  # it sits there, holding its chips (tt-studio#1283)
                time.sleep(60)
        self.phase("device")
        self.wait(2.0)
        if not cpu:
            self.say(f"multidevice with {self.tp} devices and grid (1, {self.tp}) is created")
        if self.stack == "sglang":
            self.say(
                "Init parallel ends. elapsed=0.05 s"
                if cpu
                else "Init torch distributed ends. mem usage=0.00 GB"
            )

    def weights(self) -> None:
        if self.stack == "vllm":
            self.say(f"Loading safetensors checkpoint shards: 0% Completed | 0/4 ({self.model})")
            self.phase("weights")
            self.wait(3.0)
            self.say("Loading safetensors checkpoint shards: 100% Completed | 4/4")
            return
        self.say("Load weight begin. avail mem=31.21 GB")
        self.phase("weights")
        self.wait(3.0)
        self.say(
            f"Load weight end. elapsed={3.0 * self.pace:.2f} s, type=Qwen3ForCausalLM, "
            "avail mem=14.83 GB, mem usage=16.38 GB."
        )

    def kv(self) -> None:
        tokens = int(one(self.f, "--max-total-tokens", "16384") or 16384)
        if self.stack == "vllm":
            self.say("Allocating TT kv caches")
            self.say(f"KV cache size: {tokens:,} tokens")
        elif self.stack == "sgl_jax":
            self.say(
                "Memory pool initialized. Total KV cache size: 2.42 GB, "
                f"Max tokens: {tokens}, Max requests: 64"
            )
        else:
            self.say(
                f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, "
                "K size: 1.21 GB, V size: 1.21 GB"
            )
        self.phase("kv")
        self.wait(0.5)
        if self.stack == "sglang":
            self.say("Memory pool end. avail mem=12.41 GB")

    def compile(self) -> None:
        if self.device == "cpu":
            return  # stock SGLang on a CPU captures no graph (--disable-cuda-graph)
        slow = number("FAKE_COMPILE", 3600.0) if self.mode == "slow-compile" else None
        tokens = [int(t) for t in self.f.get("--tpu-compile-tokens") or ["64"] if t.isdigit()]
        sizes = [int(b) for b in self.f.get("--tpu-compile-bs") or ["1", "4"] if b.isdigit()]
        each = 1.5
        if self.stack == "vllm":
            for length in tokens:
                self.say(f"Warming up prefill for sequence length: {length}")
                self.wait(each)
            self.phase("compile")
            if slow is not None:
                time.sleep(slow)
            self.say("Starting decode warmup")
            self.wait(each * len(sizes))
            took = each * (len(tokens) + len(sizes)) * self.pace
            self.say(
                f"init engine (profile, create kv cache, warmup model) took {took:.2f} seconds"
            )
            return
        if self.stack == "sgl_jax":
            self.say(
                f"[EXTEND] Begin to precompile bs_paddings=[{max(sizes)}] token_paddings={tokens}"
            )
            self.phase("compile")
            if slow is not None:
                time.sleep(slow)
            self.wait(each * len(tokens))
            self.say(f"[EXTEND] Precompile finished in {each * len(tokens) * self.pace:.0f} secs")
            self.say(f"[DECODE] Begin to precompile bs_paddings={sizes}")
            self.wait(each * len(sizes))
            self.say(f"[DECODE] Precompile finished in {each * len(sizes) * self.pace:.0f} secs")
            return
        graph = "TPU graph" if self.tpu else "CUDA graph"
        self.say(
            f"Capture target prefill {graph} begin. backend=full, num_tokens={tokens}, "
            "avail mem=12.41 GB"
        )
        self.phase("compile")
        if slow is not None:
            time.sleep(slow)
        self.wait(each * len(tokens))
        self.say(
            f"Capture target prefill {graph} end. elapsed={each * len(tokens) * self.pace:.2f} s, "
            "mem usage=0.20 GB, avail mem=12.21 GB."
        )
        self.say(
            f"Capture target decode {graph} begin. backend=full, num_tokens_per_req=1, "
            "avail mem=12.21 GB"
        )
        self.wait(each * len(sizes))
        self.say(
            f"Capture target decode {graph} end. bs={sizes}, "
            f"elapsed={each * len(sizes) * self.pace:.2f} s, mem usage=0.15 GB, avail mem=12.06 GB."
        )

    def server(self, host: str, port: int) -> None:
        if self.stack == "vllm":
            self.say(f"Starting vLLM API server 0 on http://{host}:{port}")
        self.say(f"INFO:     Started server process [{os.getpid()}]")
        self.say("INFO:     Waiting for application startup.")
        self.say("INFO:     Application startup complete.")
        self.say(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)")
        self.phase("server")


def main(stack: str) -> None:
    f = flags(sys.argv[1:])
    mode = os.environ.get("FAKE_MODE", "")
    tp = int(one(f, "--tp-size", "1") or 1)
    tpu = one(f, "--device", "") == "tpu"
    checked = {
        k: os.environ.get(k)
        for k in (
            "TT_VISIBLE_DEVICES", "TT_MESH_GRAPH_DESC_PATH", "LIBTT_TPU_COMPAT", "SGLANG_PLATFORM",
            "TORCH_TPU_INTERNAL_XLA_OPTIONS", "LIBTT_SYMMETRIC_DRAM_MB", "JAX_PLATFORMS", "RANK",
            "WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS", "TTMESH_JOB_ID", "MESH_DEVICE",
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
    children: list[subprocess.Popen[bytes]] = []
    up_r, up_w = os.pipe()  # each child says "up" once it holds its chips, as SGLang's
    # schedulers finish initialising before the server reports ready
    state: dict[str, Any] = {"ready": False, "draining": False, "wedged": False}
    stop_lock = threading.Lock()

    def start_children() -> None:
        if stack == "sglang" and tpu and tp > 1:  # one process per chip, libtt assigns them
            titles = [(f"sglang::scheduler_TP{i}", chips[i:] + chips[:i]) for i in range(tp)]
        else:
            titles = [("sglang::scheduler", chips)]
        for title, mine in titles:
            children.append(
                subprocess.Popen(
                    [title, "-c", CHILD, json.dumps(mine), str(up_w)],
                    executable=sys.executable,
                    pass_fds=(up_w,),
                )
            )
        os.close(up_w)
        heard = b""
        while len(heard) < 2 * len(children):
            got = os.read(up_r, 64)
            if not got:
                break  # a child died before it was up
            heard += got

    def stop(*_: object) -> None:
        if not stop_lock.acquire(blocking=False):
            return
        state["draining"] = True
        time.sleep(number("FAKE_DRAIN", 0.2))
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
    default_port = "8000" if stack == "vllm" else "30000"
    sys.stdout.write(f"fake {stack} server on port {one(f, '--port', default_port)}\n")
    sys.stdout.flush()
    if os.environ.get("FAKE_SAY"):
        sys.stderr.write(os.environ["FAKE_SAY"] + "\n")
        sys.stderr.flush()
    start = Start(stack, tpu, f, mode)
    start.engine()
    start.device_open(start_children)
    start.weights()
    start.kv()
    start.compile()
    host = one(f, "--host", "127.0.0.1")
    port = int(os.environ.get("FAKE_LISTEN_PORT") or one(f, "--port", default_port))
    server = ThreadingHTTPServer((host, port), _handler(state, f, mode))
    # Threads inherit the mask they are started with: the server's, and each request's, block
    # SIGTERM, so the kernel hands it to the main thread, whose sleep it interrupts.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if mode != "mute":  # mute: it listens on its port and never takes a connection
        threading.Thread(target=server.serve_forever, daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    start.server(host, port)
    if mode != "hang":
        time.sleep(number("FAKE_READY_AFTER", 0.3))
        state["ready"] = True
        if stack != "vllm":  # SGLang's (entrypoints/http_server.py, after its warmup)
            start.say("The server is fired up and ready to roll!")
    _after_ready(mode, state, children)
    while True:
        time.sleep(60)


def _after_ready(mode: str, state: dict[str, Any], children: list[subprocess.Popen[bytes]]) -> None:
    """The failure ``mode`` brings once the server is ready (none for most)."""
    if mode not in ("crash", "crash-tree", "unhealthy", "child-dies", "hung-healthy", "fatal-late"):
        return
    # Once its supervisor has seen it ready (its /health answered 200: an event, not a time;
    # under load the first probe may come later than FAKE_FAIL_AFTER), then that long.
    state["answered"].wait(120)
    time.sleep(number("FAKE_FAIL_AFTER", 0.5))
    if mode == "fatal-late":  # its device throws while it serves; the server answers on
        for line in (os.environ.get("FAKE_FATAL") or FATAL).splitlines():
            Log("sglang")(line)
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
        time.sleep(number("FAKE_CRASH_LINGER", 0))
        os._exit(3)
    if mode == "unhealthy":
        state["unhealthy"] = True
    if mode == "hung-healthy":  # its device hangs; /health is a thread of its own, still 200
        state["wedged"] = True
    if mode == "child-dies":
        children[0].kill()


def _handler(state: dict[str, Any], f: dict[str, list[str]], mode: str) -> type:
    """The HTTP routes: health, SGLang's /generate and the OpenAI ones."""
    latency = number("FAKE_LATENCY", 0)
    slots = int(one(f, "--max-running-requests", "0") or 0)
    batch = threading.BoundedSemaphore(slots) if slots > 0 else None
    state["answered"] = threading.Event()  # /health said 200 once: the watcher saw it ready
    model = one(f, "--served-model-name", one(f, "--model-path", one(f, "--model", "model")))

    def generate() -> None:
        """The model's time: in the batch, at most its slots at once; forever when wedged."""
        while state["wedged"]:
            time.sleep(60)
        if latency > 0:
            if batch is not None:
                with batch:
                    time.sleep(latency)
            else:
                time.sleep(latency)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/health", "/health_generate"):
                ok = state["ready"] and not state["draining"] and not state.get("unhealthy")
                self._send(200 if ok else 503, {})
                if ok:
                    state["answered"].set()
            elif self.path == "/v1/models" and state["ready"]:
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self._send(413, {"error": f"a body of at most {MAX_BODY} bytes"})
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = None
            if not isinstance(body, dict):
                self._send(400, {"error": "the body is not a JSON object"})
                return
            routes = ("/generate", "/v1/completions", "/v1/chat/completions")
            if self.path not in routes:
                self._send(404, {"error": "not found"})
                return
            if not state["ready"] or state["draining"]:
                self._send(503, {"error": "not ready"})
                return
            generate()
            if self.path == "/generate":
                self._send(200, {"text": ANSWER, "prompt": body.get("text"),
                                 "meta_info": {"completion_tokens": 2}})  # fmt: skip
            elif self.path == "/v1/completions":
                self._send(200, {"object": "text_completion", "model": model, "text": ANSWER,
                                 "prompt": body.get("prompt"),
                                 "choices": [{"index": 0, "text": ANSWER,
                                              "finish_reason": "length"}]})  # fmt: skip
            else:
                message = {"role": "assistant", "content": ANSWER}
                self._send(200, {"object": "chat.completion", "model": model,
                                 "choices": [{"index": 0, "message": message,
                                              "finish_reason": "length"}]})  # fmt: skip

    return Handler


if __name__ == "__main__":
    main("sglang")
