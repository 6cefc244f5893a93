#!/usr/bin/env python3
"""Benchmarks: ttmesh against torchrun and a bare ``subprocess.Popen`` launcher, in one run.

Every job runs under the three launchers, interleaved run by run on the same machine, and the
median of ``--runs K`` runs is reported with the ratios ttmesh / bare and ttmesh / torchrun.
Each run starts after an untimed pause drawn from 0 to 0.1 s (the simulated chips' 10 Hz
heartbeat period), so no launcher meets the heartbeats at the same phase run after run.

* ``launch N x true``: wall time from starting the launcher until it has exited, for N = 4, 32
  and 128 ranks of ``true`` (which costs ~1 ms per process under every launcher: the rest is the
  launcher's overhead). ttmesh runs on simulated hosts with pre-flight, leases and job records:
  a QuietBox 2 (4 chips), a Wormhole Galaxy (32 chips) and 128 p150 chips in a 8x16 grid (a
  system file this script writes, ``sim create --system FILE``). torchrun: ``--standalone
  --nproc-per-node N --no-python true``.
* ``workers running``: time from starting the launcher until every one of 4 workers has
  started (each writes bash's ``$EPOCHREALTIME``), then sleeps 0.6 s.
* ``pre-flight at 10 Hz``: the same two jobs on a QuietBox 2 whose heartbeats advance at
  Blackhole's firmware rate, 10 Hz (the simulator's default; its firmware reports the 100 ms
  interval), against the same host at 100 Hz (``sim create --heartbeat-hz 100``, the note): a
  liveness check that waits for a heartbeat to move costs up to 0.1 s at 10 Hz. torchrun and
  bare have no pre-flight (their 4-rank numbers).
* ``metal``: what asking tt-metal's mock control plane costs (``TTMESH_TTNN_PYTHON`` set to
  the ttnn Python of ``$TTMESH_TTNN_PYTHON`` or the conformance cache; skipped without one):
  launch 4 x true (4 one-chip ranks, each probed) and one rank driving the 4 chips
  (``--mesh-layout single-process``, one probe); the note is the same ttmesh job without it.
* ``down after a failure``: 4 ranks; rank 2 exits 3 after 1 s (writing the time just before).
  Measured: from that exit until the launcher has exited and every worker is gone. Then the same
  with workers that ignore SIGTERM, under the same grace for all (ttmesh ``--grace``, torchrun
  ``--shutdown-timeout``, bare: SIGKILL after it): the floor is the grace itself.
* ``--help``: ``ttmesh --help`` against ``torchrun --help`` (bare: its own ``--help``).
* ``peak RSS``: the launcher's processes (ttmesh: the front and its guardian; torchrun; bare)
  while 4 ranks of ``sleep 0.5`` run: the highest VmHWM of each process (/proc/PID/status,
  sampled every 5 ms), summed. The guardian is forked from the front and shares most pages
  with it, so the sum counts those twice.
* ``flags``: ttmesh alone, in a fresh process each run: reading a server's flag table (JSON),
  building argparse from it, and reading the seed's command with it
  (``ttmesh.launcher.serving.flags``), for each stock table (the module's import apart); and the
  ``--dry-run`` of a stock SGLang command against the same dry run of ``true``.
* ``fleet`` (not in the default set, ~75 s a run: ``--only fleet``): the SGLang-TorchTPU
  stand-in (tests/fakes) on a simulated QuietBox 2 with the real router (sglang-router).
  Requests/s through H:P from 4 client threads (one request at a time each, a new connection
  per request, each prompt its own) for 5 s: ``--replicas 2 --tp-size 2`` behind the router
  against one server ``--tp-size 2`` at H:P; the stand-in answers at once, so this is the
  router's and HTTP's cost, not the replicas' parallelism. Then the same with a model's time:
  the stand-in's ``FAKE_LATENCY`` (50 ms a request) and the server's own
  ``--max-running-requests 2`` (its batch: 2 requests at once, the rest wait), from 8 client
  threads: one server can answer 40 req/s, two replicas 80. Then, under the first load, the
  seconds from SIGKILL of replica 0's first scheduler until the launcher says "replica 0:
  ready: routed to" again and the router lists both workers, and the requests answered and
  failed meanwhile. Each fleet is stopped with SIGINT and checked: exit 130, no process of its
  tree alive, no port of it still listening.
* ``idle``: the launcher's own CPU while a job idles: 4 ranks of ``sleep`` on a QuietBox 2
  (ttmesh's guardian reads the job's chips every second meanwhile: attempt.chipwatch); after
  2 s, the user and system time of the launcher's processes (ttmesh: the front and its
  guardian; torchrun's agent; bare) over 8 s, as a share of one core (%).
* ``fan-in``: 4 ranks writing 50 MB together (100-byte lines) to the launcher's stdout, a pipe
  this script drains. ttmesh cuts every line and prefixes it with its rank; torchrun and bare
  let the workers write to the pipe directly (a raw pipe); ``/dev/null`` is the same workers
  writing to /dev/null under bare. Throughput in MB/s (1 MB = 10^6 bytes).

* ``torchtpu`` (not in the default set, minutes, one run whatever ``--runs``: ``--only
  torchtpu``): the seed's own stack, real (torch_tpu 0.2.0 and libtt's plugin 0.1.3 in
  ``$TTMESH_TORCHTPU_DIR`` or ``~/.cache/ttmesh-torchtpu``: scripts/torchtpu/setup), on a
  simulated QuietBox 2 in mock mode, with ``LIBTT_TPU_COMPAT=1``: one script that records when
  it started, when torch and torch_tpu were imported and when its first device op ended (or
  failed). A 4-rank job: ``ttmesh --tp-size 4`` against ``torchrun --nproc-per-node 4`` (until
  the launcher exits: ttmesh refuses libtt 0.1.3's 4 processes before any starts, torchrun's
  ranks start and fail at their first op); then what runs on 0.1.3: one process over the 4
  chips (``--mesh-layout single-process``), cold (a fresh tt-metal kernel cache) and warm, and
  one rank of one chip, with the time each phase took.

Usage: python scripts/bench.py [--runs K] [--json FILE] [--only NAME,...] [--compare OLD_TTMESH]...
Targets (docs/performance.md): launch overhead <= 1.5 x bare and <= 0.1 x torchrun; everything
down <= 50 ms after a failure; ``ttmesh --help`` <= 0.15 s; peak RSS <= 40 MB; fan-in >= half a
raw pipe. Python's bytecode cache is used as users have it (PYTHONDONTWRITEBYTECODE is unset).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

BENCHES = (
    "launch", "start", "preflight", "metal", "failure", "help", "rss", "idle", "fanin", "flags",
)  # fmt: skip
SLOW = ("fleet", "torchtpu")  # not in the default set: ~75 s a run, minutes (--only NAME)
LAUNCHERS = ["ttmesh", "torchrun", "bare"]  # + "before", "before2", ... with --compare


def earlier() -> list[str]:
    """The builds compared with (--compare, in order): "before", "before2", ..."""
    return [k for k in LAUNCHERS if k.startswith("before")]


FAN_IN_BYTES = 50_000_000
GRACE = 1  # seconds (torchrun takes whole seconds)

# The reference: N processes, wait, stop all on the first failure (SIGKILL after the grace).
BARE = r'''"""bare N COMMAND...: N copies of COMMAND (RANK set); the first failure stops the rest."""
import os, signal, subprocess, sys, time


def main() -> int:
    if sys.argv[1:2] == ["--help"]:
        print(__doc__)
        return 0
    n, cmd, grace = int(sys.argv[1]), sys.argv[2:], float(os.environ.get("BARE_GRACE", "5"))
    procs = {}
    for rank in range(n):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n)}
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        procs[proc.pid] = proc  # kept: a dropped Popen is reaped by the next one
    code, deadline = 0, None
    while procs:
        pid, status = os.waitpid(-1, os.WNOHANG if deadline else 0)
        if pid == 0:  # stopping: SIGKILL whatever outlives the grace
            if time.monotonic() >= deadline:
                kill(procs, signal.SIGKILL)
            time.sleep(0.002)
            continue
        if procs.pop(pid, None) is not None and status != 0 and deadline is None:
            code = os.waitstatus_to_exitcode(status)
            code = code if code > 0 else 128 - code
            deadline = time.monotonic() + grace
            kill(procs, signal.SIGTERM)
    return code


def kill(pids, sig):
    for pid in pids:
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass


sys.exit(main())
'''

FAILER = r"""
import os, signal, sys, time
rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK"))
out = sys.argv[1]
if len(sys.argv) > 2 and rank != "2":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(out, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
if rank == "2":
    time.sleep(1.0)
    with open(os.path.join(out, "failed_at"), "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
time.sleep(60)
"""

WRITER = r"""
import os, sys, time
left, out_dir = int(sys.argv[1]), sys.argv[2]
block = (b"x" * 99 + b"\n") * 10_000
out = sys.stdout.buffer
start = time.time()
while left > 0:
    out.write(block[:left])
    left -= len(block)
out.flush()
with open(os.path.join(out_dir, "rank" + os.environ["RANK"]), "w") as f:
    f.write(f"{start} {time.time()}")
"""

STARTER = 'printf %s "$EPOCHREALTIME" > "$0/start.$RANK"; sleep "$1"'


def grid_system(rows: int = 8, cols: int = 16) -> str:
    """A system file: rows x cols p150 chips (Blackhole, one chip per board), grid-linked by
    two links per neighbour pair, one PCI domain per 128 buses."""
    lines = [
        f"# {rows * cols} x p150b in a {rows}x{cols} grid: written by scripts/bench.py",
        f"name: p150-grid{rows * cols}",
        f"title: '{rows * cols} x p150b, a {rows}x{cols} mesh (benchmark host)'",
        "chips:",
    ]
    for i in range(rows * cols):
        board = (0x41 << 36) | (0x100000 + i)
        lines += [
            f"- id: {i}",
            f"  unique_id: {0x8200_0000_0000 + i * 0x10}",
            "  arch: blackhole",
            "  card_type: p150b",
            f"  board_id: {board}",
            f"  bdf: '{i // 128:04x}:{i % 128 + 1:02x}:00.0'",
            f"  dev_index: {i}",
            "  dram_mb: 32768",
            "  harvesting: {noc_translation: true, harvest_mask: 128, dram_harvesting_mask: 0,"
            " eth_harvesting_mask: 0, pcie_harvesting_mask: 2, l2cpu_harvesting_mask: 0}",
            f"  bus_id: '0x{i % 128 + 1:02x}'",
            "  asic_location: 0",
        ]
    lines.append("boards:")
    for i in range(rows * cols):
        board = (0x41 << 36) | (0x100000 + i)
        lines += [f"- board_id: {board}", "  board_type: p150", f"  chips: [{i}]"]
    lines.append("links:")
    for r in range(rows):
        for c in range(cols):
            i = r * cols + c
            if c + 1 < cols:  # east: 4<->7, 6<->5
                lines += [f"- [{i}, 4, {i + 1}, 7]", f"- [{i}, 6, {i + 1}, 5]"]
            if r + 1 < rows:  # south: 8<->11, 10<->9
                lines += [f"- [{i}, 8, {i + cols}, 11]", f"- [{i}, 10, {i + cols}, 9]"]
    lines.append("remote_links: []")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- running


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class Bench:
    def __init__(
        self, runs: int, work: Path, ttmesh: str | None = None, before: list[str] | None = None
    ) -> None:
        self.runs = runs
        self.work = work
        self.py = sys.executable
        self.ttmesh_bin = (
            [ttmesh] if ttmesh else self._script("ttmesh") or [self.py, "-m", "ttmesh"]
        )
        # Other ttmesh builds (--compare): "before", "before2", ...
        self.before_bin = {
            label: [path] for label, path in zip(earlier(), before or [], strict=True)
        }
        torchrun = self._script("torchrun")
        if torchrun is None:
            sys.exit("torchrun not found: pip install torch==2.13.0")
        self.torchrun_bin = torchrun
        self.env = {
            **os.environ,
            "XDG_CACHE_HOME": str(work / "cache"),
            "XDG_RUNTIME_DIR": str(work / "run"),
            "OMP_NUM_THREADS": "1",
            "NO_COLOR": "1",
            "BARE_GRACE": str(GRACE),
            # torchrun makes a torchelastic_* log directory in TMPDIR on every run and leaves
            # it: here, inside the bench's own directory, removed with it.
            "TMPDIR": str(work / "tmp"),
        }
        # As users run them: with Python's bytecode cache (torch's wheel ships .pyc files; an
        # editable ttmesh writes its own on the warm-up runs).
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        for name in (
            "TTMESH_ROOT",
            "TTMESH_RUNTIME_DIR",
            "TT_VISIBLE_DEVICES",
            "TTMESH_TTNN_PYTHON",
        ):
            self.env.pop(name, None)
        (work / "run").mkdir(mode=0o700)
        (work / "tmp").mkdir(mode=0o700)
        self.bare_py = work / "bare.py"
        self.bare_py.write_text(BARE)
        self.failer = work / "failer.py"
        self.failer.write_text(FAILER)
        self.writer = work / "writer.py"
        self.writer.write_text(WRITER)
        self.roots: dict[str, Path] = {}
        self.started = 0.0  # time.time() when the last timed run started

    def _script(self, name: str) -> list[str] | None:
        here = Path(self.py).with_name(name)
        found = str(here) if here.exists() else shutil.which(name)
        return [found] if found else None

    def sim(self, key: str, system: str, hz: float | None = None) -> Path:
        root = self.work / "roots" / key
        rate = [] if hz is None else ["--heartbeat-hz", str(hz)]
        proc = subprocess.run(
            [*self.ttmesh_bin, "sim", "create", "--system", system, *rate, "--root", str(root)],
            env=self.env, capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            sys.exit(f"sim create {system}: {proc.stderr.strip()}")
        self.roots[key] = root
        return root

    def env_for(self, argv: list[str]) -> dict[str, str]:
        """The environment to run ``argv`` in: a compared build (--compare) gets a parse cache
        of its own, since builds that share one overwrite each other's entries (their formats
        differ) and each then pays the YAML parse a user's second launch never does."""
        for label, binary in self.before_bin.items():
            if argv[: len(binary)] == binary:
                return {**self.env, "XDG_CACHE_HOME": str(self.work / f"cache-{label}")}
        return self.env

    def ttmesh(self, launcher: str) -> list[str]:
        """The ttmesh command of ``launcher``: this build, or the one compared with."""
        return self.ttmesh_bin if launcher == "ttmesh" else self.before_bin[launcher]

    def argv(self, launcher: str, n: int, cmd: list[str], root: str = "", extra=()) -> list[str]:
        if launcher == "ttmesh" or launcher in earlier():
            return [
                *self.ttmesh(launcher), "launch", "--root", str(self.roots[root]), "--tp-size", str(n),
                *extra, "--", *cmd,
            ]  # fmt: skip
        if launcher == "torchrun":
            python = [] if cmd[0].endswith(".py") else ["--no-python"]
            return [
                *self.torchrun_bin, "--standalone", "--nproc-per-node", str(n), *extra, *python,
                *cmd,
            ]  # fmt: skip
        command = [self.py, *cmd] if cmd[0].endswith(".py") else cmd
        return [self.py, str(self.bare_py), str(n), *command]

    def timed(
        self, argv: list[str], stdout: int = subprocess.DEVNULL, env: dict | None = None
    ) -> tuple[float, int]:
        # Each run starts at a random point of the simulated chips' heartbeat period (10 Hz:
        # 0.1 s), untimed. A pre-flight that waits for a heartbeat to move waits 0 to 0.1 s
        # by where in the period it reads; runs taken back to back, interleaved, repeat
        # nearly the same durations, so without this each launcher kept nearly the same phase
        # run after run and its median carried a bias of its own of up to 0.1 s.
        time.sleep(PHASES.uniform(0.0, HEARTBEAT_PERIOD))
        self.started = time.time()
        t0 = time.perf_counter()
        proc = subprocess.run(
            argv, env=env or self.env_for(argv), stdout=stdout, stderr=subprocess.DEVNULL
        )
        return time.perf_counter() - t0, proc.returncode


HEARTBEAT_PERIOD = 0.1  # seconds: the simulator's default heartbeat, Blackhole's 10 Hz
PHASES = random.Random(0)  # the pauses before runs: the same sequence every bench


def _segments() -> set[str]:
    """Open MPI's shared-memory segments in /dev/shm now."""
    with contextlib.suppress(OSError):
        return {n for n in os.listdir("/dev/shm") if n.startswith("sm_segment.")}
    return set()


def _drop_segments(before: set[str]) -> None:
    """Remove the Open MPI segments made since ``before`` that no live process uses: ttnn's
    bundled Open MPI (the metal bench's probes) leaves them behind, as tests/conftest.py says."""
    from ttmesh.runtime import leftovers  # (the rule ttmesh's own clean-up follows)

    leftovers.remove_unused(os.path.join("/dev/shm", n) for n in _segments() - before)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def interleaved(
    runs: int, jobs: dict[str, Callable[[], float]], check: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Run every job once per round, ``runs`` rounds; the median of each."""
    samples: dict[str, list[float]] = {k: [] for k in jobs}
    for _ in range(runs):
        for key, job in jobs.items():
            samples[key].append(job())
    return {k: median(v) for k, v in samples.items()}


# --------------------------------------------------------------------------- benchmarks


def bench_launch(b: Bench) -> list[dict]:
    rows = []
    for n, root in ((4, "qb2"), (32, "galaxy"), (128, "grid128")):
        for launcher in LAUNCHERS:  # warm-up (bytecode, caches)
            b.timed(b.argv(launcher, n, ["true"], root))

        def job(launcher: str, n: int = n, root: str = root) -> Callable[[], float]:
            def run() -> float:
                seconds, code = b.timed(b.argv(launcher, n, ["true"], root))
                if code != 0:
                    sys.exit(f"{launcher} failed on {n} x true (exit {code})")
                return seconds

            return run

        med = interleaved(b.runs, {k: job(k) for k in LAUNCHERS})
        rows.append(row(f"launch {n} x true", "s", med, lower=True))
    return rows


def _start_latency(b: Bench, launcher: str, root: str, sleep: str = "0.6") -> tuple[float, float]:
    """(seconds until every worker started, seconds until the launcher exited)."""
    out = b.work / "start"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    cmd = ["bash", "-c", STARTER, str(out), sleep]
    argv = b.argv(launcher, 4, cmd, root)
    seconds, code = b.timed(argv)
    t0 = b.started  # the wall clock at the start (after timed's pause)
    if code != 0:
        sys.exit(f"{launcher}: workers failed (exit {code})")
    starts = [float(p.read_text()) for p in out.glob("start.*")]
    if len(starts) != 4:
        sys.exit(f"{launcher}: {len(starts)} of 4 workers started")
    return max(starts) - t0, seconds


def bench_start(b: Bench) -> list[dict]:
    for launcher in LAUNCHERS:
        _start_latency(b, launcher, "qb2", "0")
    med = interleaved(
        b.runs, {k: (lambda k=k: _start_latency(b, k, "qb2", "0")[0]) for k in LAUNCHERS}
    )
    return [row("every worker running (4 ranks)", "s", med, lower=True)]


def bench_preflight(b: Bench) -> list[dict]:
    rows = []
    for launcher in LAUNCHERS:
        b.timed(b.argv(launcher, 4, ["true"], "qb2"))
    jobs: dict[str, Callable[[], float]] = {
        "ttmesh": lambda: b.timed(b.argv("ttmesh", 4, ["true"], "qb2"))[0],
        "ttmesh-100hz": lambda: b.timed(b.argv("ttmesh", 4, ["true"], "qb2hz100"))[0],
        "torchrun": lambda: b.timed(b.argv("torchrun", 4, ["true"]))[0],
        "bare": lambda: b.timed(b.argv("bare", 4, ["true"]))[0],
    }
    for label in earlier():
        jobs[label] = lambda label=label: b.timed(b.argv(label, 4, ["true"], "qb2"))[0]
    med = interleaved(b.runs, jobs)
    note = f"100 Hz: {med['ttmesh-100hz']:.3f}"
    rows.append(row("10 Hz: launch 4 x true", "s", med, lower=True, note=note))
    for i, name in ((0, "10 Hz: every worker running"), (1, "10 Hz: 4 x (start, sleep 0.6 s)")):
        jobs = {
            "ttmesh": lambda i=i: _start_latency(b, "ttmesh", "qb2")[i],
            "ttmesh-100hz": lambda i=i: _start_latency(b, "ttmesh", "qb2hz100")[i],
            "torchrun": lambda i=i: _start_latency(b, "torchrun", "qb2")[i],
            "bare": lambda i=i: _start_latency(b, "bare", "qb2")[i],
        }
        for label in earlier():
            jobs[label] = lambda i=i, label=label: _start_latency(b, label, "qb2")[i]
        med = interleaved(b.runs, jobs)
        rows.append(row(name, "s", med, lower=True, note=f"100 Hz: {med['ttmesh-100hz']:.3f}"))
    return rows


def ttnn_python() -> str | None:
    """A Python with ttnn: $TTMESH_TTNN_PYTHON, else the conformance cache's."""
    cache = os.environ.get("TTMESH_CONFORMANCE_CACHE") or os.path.expanduser(
        "~/.cache/ttmesh-conformance"
    )
    for python in (os.environ.get("TTMESH_TTNN_PYTHON", ""), f"{cache}/ttnn/bin/python"):
        if python and os.access(python, os.X_OK):
            return python
    return None


def bench_metal(b: Bench) -> list[dict]:
    python = ttnn_python()
    if python is None:
        print("metal: skipped (no ttnn Python: set TTMESH_TTNN_PYTHON)", flush=True)
        return []
    env = {**b.env, "TTMESH_TTNN_PYTHON": python}
    one = ["--mesh-layout", "single-process"]
    rows = []
    for extra, name in (((), "tt-metal check: launch 4 x true (4 probes)"),
                        (one, "tt-metal check: launch 1 x true on 4 chips")):  # fmt: skip
        argv = b.argv("ttmesh", 4, ["true"], "qb2", extra)
        b.timed(argv, env=env)

        def checked(argv: list[str] = argv) -> float:
            seconds, code = b.timed(argv, env=env)
            if code != 0:
                sys.exit(f"ttmesh with the tt-metal check failed (exit {code})")
            return seconds

        jobs: dict[str, Callable[[], float]] = {
            "ttmesh": checked,
            "unchecked": lambda argv=argv: b.timed(argv)[0],
            "torchrun": lambda: b.timed(b.argv("torchrun", 4, ["true"]))[0],
            "bare": lambda: b.timed(b.argv("bare", 4, ["true"]))[0],
        }
        med = interleaved(b.runs, jobs)
        rows.append(row(name, "s", med, lower=True, note=f"unchecked: {med['unchecked']:.3f}"))
    return rows


def _failure(b: Bench, launcher: str, ignore_term: bool) -> tuple[float, int]:
    """Seconds from the failing rank's exit until the launcher and every worker are gone."""
    out = b.work / "fail"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    extra = ()
    if ignore_term:
        extra = ("--grace", str(GRACE)) if launcher in ("ttmesh", *earlier()) else extra
        extra = ("--shutdown-timeout", str(GRACE)) if launcher == "torchrun" else extra
    cmd = [str(b.failer), str(out), *(["ignore-term"] if ignore_term else [])]
    argv = b.argv(launcher, 4, cmd, "qb2", extra)
    proc = subprocess.Popen(
        argv, env=b.env_for(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = proc.communicate(timeout=120)
    code = proc.returncode
    launcher_done = time.time()
    pids = [int(p.read_text()) for p in out.glob("pid*")]
    while any(alive(p) for p in pids) and time.time() - launcher_done < 60:
        time.sleep(0.0005)
    all_done = max(launcher_done, time.time())
    if not (out / "failed_at").exists():
        sys.exit(f"{launcher}: no rank failed (exit {code}): {err.decode()[-2000:]}")
    return all_done - float((out / "failed_at").read_text()), code


def bench_failure(b: Bench) -> list[dict]:
    rows = []
    for ignore in (False, True):
        codes: dict[str, set[int]] = {k: set() for k in LAUNCHERS}

        def job(
            launcher: str, ignore: bool = ignore, codes: dict[str, set[int]] = codes
        ) -> Callable[[], float]:
            def run() -> float:
                seconds, code = _failure(b, launcher, ignore)
                codes[launcher].add(code)
                return seconds

            return run

        med = interleaved(max(3, b.runs), {k: job(k) for k in LAUNCHERS})
        what = f"SIGTERM ignored, grace {GRACE:g} s" if ignore else "rank 2 exits 3 after 1 s"
        note = "exit codes " + ", ".join(f"{k} {sorted(v)}" for k, v in codes.items())
        rows.append(row(f"all down after a failure ({what})", "s", med, lower=True, note=note))
    return rows


def bench_help(b: Bench) -> list[dict]:
    argvs = {
        "ttmesh": [*b.ttmesh_bin, "--help"],
        "torchrun": [*b.torchrun_bin, "--help"],
        "bare": [b.py, str(b.bare_py), "--help"],
    }
    for label in earlier():
        argvs[label] = [*b.ttmesh(label), "--help"]
    for argv in argvs.values():
        b.timed(argv)
    med = interleaved(b.runs, {k: (lambda a=a: b.timed(a)[0]) for k, a in argvs.items()})
    return [row("--help", "s", med, lower=True)]


def _rss(b: Bench, launcher: str) -> tuple[float, float]:
    """(peak RSS, peak PSS) in MB of the launcher's own processes (not its workers) while 4
    ranks of ``sleep 0.5`` run: the sum of each process's VmHWM, and the highest sum of their
    Pss (shared pages divided among the processes sharing them, so a forked guardian's pages
    count once), sampled every 5 ms."""
    argv = b.argv(launcher, 4, ["sleep", "0.5"], "qb2")
    proc = subprocess.Popen(
        argv, env=b.env_for(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    python = os.path.realpath(f"/proc/{proc.pid}/exe")
    peak: dict[int, int] = {}
    exe: dict[int, str] = {}  # a worker is a copy of its launcher until it calls exec
    pss_peak = 0
    while proc.poll() is None:
        pss = {}
        for pid in [proc.pid, *_children(proc.pid)]:
            try:
                exe[pid] = os.path.realpath(f"/proc/{pid}/exe")
                peak[pid] = max(peak.get(pid, 0), _kb(f"/proc/{pid}/status", "VmHWM:"))
                pss[pid] = _kb(f"/proc/{pid}/smaps_rollup", "Pss:")
            except (OSError, ValueError):
                continue
        pss_peak = max(pss_peak, sum(kb for pid, kb in pss.items() if exe.get(pid) == python))
        time.sleep(0.005)
    if proc.returncode != 0:
        sys.exit(f"{launcher}: sleep job failed (exit {proc.returncode})")
    rss = sum(kb for pid, kb in peak.items() if exe.get(pid) == python)
    return rss / 1024, pss_peak / 1024


def _kb(path: str, key: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    raise ValueError(f"no {key} in {path}")


def _children(pid: int) -> list[int]:
    """Descendants of ``pid`` (children of each of its threads, recursively)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            continue
    for child in list(out):
        out += _children(child)
    return out


def bench_rss(b: Bench) -> list[dict]:
    pss: dict[str, list[float]] = {k: [] for k in LAUNCHERS}

    def job(launcher: str) -> Callable[[], float]:
        def run() -> float:
            rss, p = _rss(b, launcher)
            pss[launcher].append(p)
            return rss

        return run

    med = interleaved(b.runs, {k: job(k) for k in LAUNCHERS})
    return [
        row("peak RSS of the launcher (VmHWM, summed)", "MB", med, lower=True),
        row("peak PSS of the launcher", "MB", {k: median(v) for k, v in pss.items()}, lower=True),
    ]


IDLE_WARM, IDLE_WINDOW = 2.0, 8.0  # seconds before measuring, and measured


def _cpu_seconds(pid: int) -> float:
    """User plus system time of ``pid`` so far (its own, not its children's)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle(b: Bench, launcher: str) -> float:
    """% of one core the launcher's own processes use while 4 ranks of ``sleep`` idle."""
    seconds = str(IDLE_WARM + IDLE_WINDOW + 2)
    argv = b.argv(launcher, 4, ["sleep", seconds], "qb2")
    proc = subprocess.Popen(
        argv, env=b.env_for(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    python = os.path.realpath(f"/proc/{proc.pid}/exe")
    time.sleep(IDLE_WARM)
    own = [p for p in [proc.pid, *_children(proc.pid)] if _exe(p) == python]
    before = {p: _cpu_seconds(p) for p in own}
    t0 = time.monotonic()
    time.sleep(IDLE_WINDOW)
    used = sum(_cpu_seconds(p) - before[p] for p in own)
    took = time.monotonic() - t0
    if proc.wait() != 0:
        sys.exit(f"{launcher}: sleep job failed (exit {proc.returncode})")
    return 100 * used / took


def _exe(pid: int) -> str:
    try:
        return os.path.realpath(f"/proc/{pid}/exe")
    except OSError:
        return ""


def bench_idle(b: Bench) -> list[dict]:
    med = interleaved(b.runs, {k: (lambda k=k: _idle(b, k)) for k in LAUNCHERS})
    return [row("launcher CPU while 4 ranks idle", "% core", med, lower=True)]


def _fan_in(b: Bench, launcher: str, devnull: bool = False) -> tuple[float, float]:
    """(MB/s while the ranks write, MB/s over the whole run). The first is 50 MB over the time
    from the first rank starting to write to the last one done (each rank records both):
    what fan-in costs, without the launcher's and the workers' start-up."""
    out = b.work / "fanin"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    per_rank = FAN_IN_BYTES // 4
    argv = b.argv(launcher, 4, [str(b.writer), str(per_rank), str(out)], "qb2")
    lines = FAN_IN_BYTES // 100
    t0 = time.perf_counter()
    if devnull:
        proc = subprocess.Popen(
            argv, env=b.env_for(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        proc.wait()
        got = lines
    else:
        proc = subprocess.Popen(
            argv, env=b.env_for(argv), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        got = 0
        while chunk := os.read(fd, 1 << 20):
            got += chunk.count(b"\n")
        proc.wait()
    seconds = time.perf_counter() - t0
    if proc.returncode != 0 or got != lines:
        sys.exit(f"{launcher}: fan-in got {got} of {lines} lines (exit {proc.returncode})")
    spans = [tuple(map(float, p.read_text().split())) for p in out.glob("rank*")]
    writing = max(end for _, end in spans) - min(start for start, _ in spans)
    return FAN_IN_BYTES / 1e6 / writing, FAN_IN_BYTES / 1e6 / seconds


def bench_fanin(b: Bench) -> list[dict]:
    whole: dict[str, list[float]] = {}

    def job(launcher: str, devnull: bool = False) -> Callable[[], float]:
        def run() -> float:
            writing, overall = _fan_in(b, launcher, devnull)
            whole.setdefault("devnull" if devnull else launcher, []).append(overall)
            return writing

        return run

    jobs = {k: job(k) for k in LAUNCHERS}
    jobs["devnull"] = job("bare", devnull=True)
    med = interleaved(b.runs, jobs)
    overall = {k: median(v) for k, v in whole.items()}
    return [
        row(
            "fan-in, 4 ranks x 12.5 MB, while writing", "MB/s", med, lower=False,
            note=f"ranks writing to /dev/null: {med['devnull']:.0f} MB/s",
        ),
        row(
            "fan-in, whole run (start-up included)", "MB/s", overall, lower=False,
            note=f"/dev/null: {overall['devnull']:.0f} MB/s",
        ),
    ]  # fmt: skip


# --------------------------------------------------------------------------- report


FLAGS_TIMED = r"""
import sys, time
from pathlib import Path
t0 = time.perf_counter()
from ttmesh.launcher.serving import flags
t1 = time.perf_counter()
table = flags.load(Path(sys.argv[1]))
t2 = time.perf_counter()
table.parser()
t3 = time.perf_counter()
table.parse(sys.argv[2:])
t4 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
"""
COMMON = ["--model-path", "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", "31000",
          "--tp-size", "1", "--dtype", "bfloat16", "--mem-fraction-static", "0.75", "--max-total-tokens", "16384",
          "--chunked-prefill-size", "64"]  # fmt: skip
COMMANDS = {  # the seed's command, as each table's server takes it
    "sglang": [*COMMON, "--device", "cpu", "--kv-cache-dtype", "bfloat16", "--enable-torch-compile", "--page-size", "64",
               "--torch-compile-max-bs", "4", "--grammar-backend", "none"],
    "sglang-torchtpu": [*COMMON, "--device", "tpu", "--kv-cache-dtype", "bfloat16", "--enable-torch-compile", "--page-size", "64",
                        "--torch-compile-max-bs", "4", "--tpu-compile-bs", "1", "4",
                        "--tpu-compile-tokens", "64", "--grammar-backend", "none"],
    "sglang-jax": [*COMMON, "--device", "tt", "--kv-cache-dtype", "bf16", "--attention-backend", "tt",
                   "--page-size", "32"],  # SGLang-JAX spells it bf16
    "vllm-tt": ["Qwen/Qwen3-8B", "--port", "8000", "-tp", "1", "--max-model-len", "8192"],
}  # fmt: skip


def bench_flags(b: Bench) -> list[dict]:
    tables = Path(__file__).resolve().parent.parent / "ttmesh" / "configs" / "profiles"
    rows = []
    for name, argv in COMMANDS.items():
        parts: list[list[float]] = [[], [], [], []]
        for _ in range(b.runs + 1):  # the first run warms the bytecode cache
            out = subprocess.run(
                [b.py, "-c", FLAGS_TIMED, str(tables / f"{name}.flags.json"), *argv],
                env=b.env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            for i, value in enumerate(out.stdout.split()):
                parts[i].append(float(value) * 1000)
        imp, load, build, parse = (median(p[1:]) for p in parts)
        note = f"import {imp:.1f} ms, read the JSON {load:.1f} ms, build {build:.1f} ms, parse {parse:.1f} ms"
        total = {"ttmesh": load + build + parse}
        rows.append(row(f"flag table {name}: the seed's command read", "ms", total, True, note))
    root = str(b.roots["qb2"])
    server = [*b.ttmesh_bin, "launch", "--root", root, "--dry-run", "--", b.py, "-m",
              "sglang.launch_server", *COMMANDS["sglang"]]  # fmt: skip
    plain = [*b.ttmesh_bin, "launch", "--root", root, "--dry-run", "--", "true"]
    for argv in (server, plain):
        b.timed(argv)
    med = interleaved(
        b.runs, {"ttmesh": lambda: b.timed(server)[0], "plain": lambda: b.timed(plain)[0]}
    )
    note = f"the same dry run of `true`: {med['plain']:.3f} s"
    rows.append(row("--dry-run of a stock SGLang command", "s", med, True, note))
    return rows


# --------------------------------------------------------------------------- fleet

FAKES = Path(__file__).resolve().parent.parent / "tests" / "fakes"
SEED = [
    "--model-path", "Qwen/Qwen3-8B", "--device", "tpu", "--tp-size", "2", "--dtype", "bfloat16",
    "--kv-cache-dtype", "bfloat16", "--mem-fraction-static", "0.75", "--max-total-tokens", "16384",
    "--enable-torch-compile", "--page-size", "64", "--context-length", "2048",
    "--chunked-prefill-size", "64", "--torch-compile-max-bs", "4", "--tpu-compile-bs", "1", "4",
    "--tpu-compile-tokens", "64", "--grammar-backend", "none",
]  # fmt: skip
FLEET_THREADS = 4  # concurrent client threads, each one request at a time
FLEET_SECONDS = 5.0  # how long the load runs per measurement
FLEET_LATENCY = 0.05  # s a request takes in the stand-in (FAKE_LATENCY) for the model's rows
FLEET_SLOTS = 2  # its batch: --max-running-requests, requests served at once per server
LATENCY_THREADS = 8  # clients for the model's rows: more than two servers' slots


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_ASKED = iter(range(1 << 62))  # each prompt its own: the router's cache-aware policy balances


def _ask(url: str) -> bool:
    """One /generate through ``url``; True when the stand-in's answer came back."""
    body = json.dumps({"text": f"{next(_ASKED)}: The capital of the Netherlands is"}).encode()
    req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read()).get("text") == " Amsterdam."
    except (OSError, ValueError):
        return False


def _workers(url: str) -> int:
    """How many workers the router lists (-1: it does not answer)."""
    try:
        with urllib.request.urlopen(url + "/workers", timeout=2) as r:
            return len(json.loads(r.read())["workers"])
    except (OSError, ValueError):
        return -1


class _Load:
    """FLEET_THREADS clients sending requests back to back until stopped; counts each outcome."""

    def __init__(self, url: str, threads: int = FLEET_THREADS) -> None:
        self.url, self.ok, self.failed = url, 0, 0
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def _run(self) -> None:
        while not self.stop.is_set():
            good = _ask(self.url)
            with self.lock:
                if good:
                    self.ok += 1
                else:
                    self.failed += 1

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.ok, self.failed

    def __enter__(self) -> _Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


class _Fleet:
    """``ttmesh launch [--replicas 2] --tp-size 2`` of the stand-in at 127.0.0.1:PORT, its
    stderr read line by line (the launcher's own events), stopped with SIGINT as Ctrl-C does."""

    def __init__(self, b: Bench, replicas: int, latency: float = 0.0) -> None:
        self.port, self.replicas = _free_port(), replicas
        self.url = f"http://127.0.0.1:{self.port}"
        self.job = f"bench-fleet-{os.getpid()}-{replicas}"
        report = b.work / "fleet-report"
        report.mkdir(exist_ok=True)
        env = {**b.env, "PYTHONPATH": str(FAKES), "PYTHONUNBUFFERED": "1",
               "FAKE_REPORT": str(report), "FAKE_LATENCY": str(latency), "FAKE_PACE": "0"}  # fmt: skip
        batch = ["--max-running-requests", str(FLEET_SLOTS)] if latency else []
        many = ["--replicas", str(replicas), "--max-restarts", "100"] if replicas > 1 else []
        self.summary = b.work / f"fleet-{replicas}.json"
        argv = [
            *b.ttmesh_bin, "launch", "--root", str(b.roots["fleet"]), *many, "--tp-size", "2",
            "--job-id", self.job, "--summary-json", str(self.summary), "--",
            b.py, "-m", "sglang.launch_server", *SEED, *batch, "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        self.env = env
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        self.stamps: list[float] = []  # when each line of ``seen`` was read (perf_counter)
        threading.Thread(target=self._read, daemon=True).start()
        self.tree: set[int] = {self.proc.pid}

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put((time.perf_counter(), line))

    def until(self, text: str, count: int = 1, timeout: float = 120) -> None:
        """Wait for the launcher's ``count``-th line with ``text`` (an event, not a sleep)."""
        deadline = time.monotonic() + timeout
        while sum(text in ln for ln in self.seen) < count:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self.lines.empty()):
                sys.exit(f"fleet: no {text!r}: {''.join(self.seen)[-3000:]}")
            try:
                stamp, line = self.lines.get(timeout=min(left, 1))
            except queue.Empty:
                continue
            self.stamps.append(stamp)
            self.seen.append(line)

    def when(self, text: str, after: float) -> float | None:
        """When the first line with ``text`` read after ``after`` was read."""
        return next(
            (t for t, ln in zip(self.stamps, self.seen, strict=True) if t >= after and text in ln),
            None,
        )

    def ready(self) -> None:
        if self.replicas > 1:
            self.until(f"replica {self.replicas - 1}: ready: routed to")
            deadline = time.monotonic() + 60
            while _workers(self.url) != self.replicas:
                if time.monotonic() > deadline:
                    sys.exit(f"fleet: the router never listed {self.replicas} workers")
                time.sleep(0.05)
        else:
            deadline = time.monotonic() + 120
            while not _ask(self.url):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    sys.exit(f"server: never answered: {''.join(self.seen)[-3000:]}")
                time.sleep(0.05)
        self.tree |= set(_children(self.proc.pid))

    def scheduler_of(self, replica: int) -> int:
        """The pid of replica ``replica``'s first scheduler (its rank's child, as in SGLang)."""
        out = subprocess.run(
            [*self.ttmesh_cmd(), "ps", "--json"], env=self.env, capture_output=True, text=True
        ).stdout
        record = next(j for j in json.loads(out)["jobs"] if j["job"] == f"{self.job}-r{replica}")
        for pid in _children(record["ranks"][0]["pid"]):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"sglang::scheduler_TP0"):
                        return pid
            except OSError:
                continue
        sys.exit(f"fleet: no scheduler in replica {replica}")

    def ttmesh_cmd(self) -> list[str]:
        return list(self.proc.args[: self.proc.args.index("launch")])  # type: ignore[union-attr]

    def stop(self) -> None:
        """Ctrl-C, then check that every process and port of it is gone."""
        self.tree |= set(_children(self.proc.pid))
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            sys.exit("fleet: still running 90 s after SIGINT")
        deadline = time.monotonic() + 10
        while any(alive(p) for p in self.tree):
            if time.monotonic() > deadline:
                sys.exit(f"fleet: left {[p for p in self.tree if alive(p)]} after SIGINT")
            time.sleep(0.01)
        ports = [self.port]
        if self.summary.exists():
            ports += [r["port"] for r in json.loads(self.summary.read_text()).get("replicas", [])]
        for p in ports:
            with socket.socket() as s:  # nothing listens any more (closed ones may linger)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    sys.exit(f"fleet: port {p} still taken after SIGINT")
        if code != 130:
            sys.exit(f"fleet: exit {code} after SIGINT: {''.join(self.seen)[-3000:]}")


def _rps(b: Bench, replicas: int, latency: float = 0.0) -> float:
    fleet = _Fleet(b, replicas, latency)
    try:
        fleet.ready()
        with _Load(fleet.url, LATENCY_THREADS if latency else FLEET_THREADS) as load:
            t0 = time.perf_counter()
            time.sleep(FLEET_SECONDS)  # the load's duration (what is measured runs meanwhile)
            ok, failed = load.counts()
            seconds = time.perf_counter() - t0
        if failed:
            sys.exit(f"fleet: {failed} of {ok + failed} requests failed under steady load")
        return ok / seconds
    finally:
        if fleet.proc.poll() is None:
            fleet.stop()


def _recovery(b: Bench) -> tuple[float, int, int]:
    """Seconds from SIGKILL of replica 0's scheduler until the launcher says it is routed to
    again and the router lists both; requests answered and failed meanwhile."""
    fleet = _Fleet(b, 2)
    try:
        fleet.ready()
        victim = fleet.scheduler_of(0)
        with _Load(fleet.url) as load:
            before = load.counts()
            t0 = time.perf_counter()
            os.kill(victim, signal.SIGKILL)
            fleet.until("replica 0: ready: routed to", count=2)
            while _workers(fleet.url) != 2:
                if time.perf_counter() - t0 > 120:
                    sys.exit("fleet: replica 0 never back in the router")
                time.sleep(0.01)
            seconds = time.perf_counter() - t0
            after = load.counts()
        out = fleet.when("replica 0: ", t0)  # its first line after the kill
        taken = fleet.when("taken out of the router", t0)
        first = fleet.when("replica 0: ready: routed to", t0)
        stages = {
            "first line": out - t0 if out else None,
            "taken out": taken - t0 if taken else None,
            "ready again": first - t0 if first else None,
        }
        what = ", ".join(f"{k} {v:.1f} s" for k, v in stages.items() if v is not None)
        why = next((ln.strip() for ln in fleet.seen if "taken out of the router" in ln), "")
        print(f"  fleet recovery: {what}, router lists both {seconds:.1f} s ({why})", flush=True)
        return seconds, after[0] - before[0], after[1] - before[1]
    finally:
        if fleet.proc.poll() is None:
            fleet.stop()


def bench_fleet(b: Bench) -> list[dict]:
    if "fleet" not in b.roots:
        b.sim("fleet", "quietbox2")
    answered: list[int] = []
    failed: list[int] = []

    took: list[float] = []

    def recovery() -> float:
        seconds, ok, bad = _recovery(b)
        took.append(round(seconds, 1))
        answered.append(ok)
        failed.append(bad)
        return seconds

    med = interleaved(
        b.runs,
        {
            "two": lambda: _rps(b, 2), "one": lambda: _rps(b, 1),
            "two_l": lambda: _rps(b, 2, FLEET_LATENCY), "one_l": lambda: _rps(b, 1, FLEET_LATENCY),
            "back": recovery,
        },
    )  # fmt: skip
    load = f"{FLEET_THREADS} client threads for {FLEET_SECONDS:g} s"
    stand_in = "stand-in answers at once: router + HTTP cost"
    model = (f"{FLEET_LATENCY * 1000:g} ms a request, {FLEET_SLOTS} at once per server "
             f"(--max-running-requests {FLEET_SLOTS}), {LATENCY_THREADS} client threads")  # fmt: skip
    bound = FLEET_SLOTS / FLEET_LATENCY
    return [
        row("fleet: 2 replicas x tp 2, router", "req/s", {"ttmesh": med["two"]},
            lower=False, note=f"{load}; {stand_in}"),
        row("fleet: 1 server tp 2, no router", "req/s", {"ttmesh": med["one"]},
            lower=False, note=f"same stand-in, same load ({load}), straight to the server"),
        row("fleet, a model's time: 2 replicas, router", "req/s", {"ttmesh": med["two_l"]},
            lower=False, note=f"{model}; bound {2 * bound:g} req/s"),
        row("fleet, a model's time: 1 server, no router", "req/s", {"ttmesh": med["one_l"]},
            lower=False, note=f"{model}; bound {bound:g} req/s"),
        row("fleet: replica killed -> routed to again", "s", {"ttmesh": med["back"]},
            lower=True,
            note=f"per run: {took} s; requests meanwhile answered {answered}, failed {failed}"),
    ]  # fmt: skip


# --------------------------------------------------------------------------- torch_tpu

TPU_RANK = r"""
import json, os, sys, time
marks = {"start": time.time()}
import torch
marks["torch"] = time.time()
import torch_tpu  # noqa: F401  (libtt's .pth pointed it at libtt.so)
marks["torch_tpu"] = time.time()
try:
    x = torch.ones(4, device="tpu") + torch.ones(4, device="tpu")
    x.cpu()
    ok = "ok"
except Exception as exc:  # noqa: BLE001
    ok = type(exc).__name__ + ": " + str(exc).splitlines()[0][:160]
marks["op"] = time.time()
out = os.path.join(sys.argv[1], "rank" + os.environ.get("RANK", "0") + ".json")
json.dump({"marks": marks, "ok": ok}, open(out, "w"))
sys.exit(0 if ok == "ok" else 1)
"""


def torchtpu_python() -> str | None:
    base = os.environ.get("TTMESH_TORCHTPU_DIR") or os.path.expanduser("~/.cache/ttmesh-torchtpu")
    python = f"{base}/venv/bin/python"
    return python if os.access(python, os.X_OK) else None


TPU_FATAL = ("failed to extract embedded tt-metal runtime archive", "Check failed", "cannot run")


def _tpu_run(b: Bench, argv: list[str], env: dict) -> tuple[float, list[dict], str]:
    """(seconds until the launcher exited, each rank's marks relative to the launch, the first
    line of its output that says why ranks stopped)."""
    out = b.work / "tpu-out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    t0 = time.time()
    proc = subprocess.run([*argv, str(out)], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, errors="replace")  # fmt: skip
    seconds = time.time() - t0
    said = next(
        (ln.strip() for ln in proc.stderr.splitlines() if any(f in ln for f in TPU_FATAL)), ""
    )
    ranks = []
    for path in sorted(out.glob("rank*.json")):
        data = json.loads(path.read_text())
        ranks.append({"ok": data["ok"], **{k: v - t0 for k, v in data["marks"].items()}})
    return seconds, ranks, f"exit {proc.returncode}" + (f": {said[:120]}" if said else "")


def _tpu_note(ranks: list[dict]) -> str:
    if not ranks:
        return "no rank started"
    r = max(ranks, key=lambda r: r["op"])
    said = (
        f"start {r['start']:.1f}, import torch +{r['torch'] - r['start']:.1f}, torch_tpu "
        f"+{r['torch_tpu'] - r['torch']:.1f}, first op +{r['op'] - r['torch_tpu']:.1f} s"
    )
    return said + ("" if r["ok"] == "ok" else f" ({r['ok']})")


def bench_torchtpu(b: Bench) -> list[dict]:
    python = torchtpu_python()
    if python is None:
        print("torchtpu: skipped (no torch_tpu venv: bash scripts/torchtpu/setup DIR)", flush=True)
        return []
    script = b.work / "tpu_rank.py"
    script.write_text(TPU_RANK)
    env = {**b.env, "LIBTT_TPU_COMPAT": "1"}
    cold = {**env, "TT_METAL_CACHE": str(b.work / "tt-metal-cache")}
    ttmesh = [*b.ttmesh("ttmesh"), "launch", "--root", str(b.roots["qb2"])]
    torchrun = [*b.torchrun_bin, "--standalone", "--nproc-per-node", "4", "--no-python", python]
    rows = []
    t_sec, t_ranks, t_said = _tpu_run(
        b, [*ttmesh, "--tp-size", "4", "--", python, str(script)], env
    )
    r_sec, r_ranks, r_said = _tpu_run(b, [*torchrun, str(script)], env)
    rows.append(
        row("torch_tpu 4 ranks: until the launcher exits", "s",
            {"ttmesh": t_sec, "torchrun": r_sec}, lower=True,
            note=f"ttmesh: {len(t_ranks)} ranks ran, {t_said[:60]}...; torchrun: "
            f"{sum(r['ok'] == 'ok' for r in r_ranks)} of 4 ranks' first op ran, {r_said}"),
    )  # fmt: skip
    one = ["--mesh-layout", "single-process"]
    for name, args, run_env in (
        ("torch_tpu 1 process, 4 chips: first op (cold)", ["--tp-size", "4", *one], cold),
        ("torch_tpu 1 process, 4 chips: first op (warm)", ["--tp-size", "4", *one], cold),
        ("torch_tpu 1 rank, 1 chip: first op", ["--tp-size", "1"], cold),
    ):
        seconds, ranks, _said = _tpu_run(b, [*ttmesh, *args, "--", python, str(script)], run_env)
        first = max((r["op"] for r in ranks), default=float("nan"))
        rows.append(row(name, "s", {"ttmesh": first}, lower=True,
                        note=f"exit after {seconds:.1f} s; " + _tpu_note(ranks)))  # fmt: skip
    return rows


def row(name: str, unit: str, med: dict[str, float], lower: bool, note: str = "") -> dict:
    t, tr, bare = med["ttmesh"], med.get("torchrun"), med.get("bare")
    out = {
        "name": name,
        "unit": unit,
        "lower_is_better": lower,
        **{k: med.get(k) for k in LAUNCHERS},
        "ttmesh/bare": t / bare if bare else None,
        "ttmesh/torchrun": t / tr if tr else None,
        "extra": {k: v for k, v in med.items() if k not in LAUNCHERS},
        "note": note,
    }
    for label in earlier():
        if med.get(label):
            out[f"{label}/bare"] = med[label] / bare if bare else None
            out[f"{label}/torchrun"] = med[label] / tr if tr else None
    return out


def show(rows: list[dict]) -> str:
    heads = [*LAUNCHERS, "/bare", "/torchrun"]
    for label in earlier():
        heads += [f"{label}/bare", f"{label}/tr"]
    out = [f"{'benchmark':48} " + " ".join(f"{h:>11}" for h in heads)]
    for r in rows:
        fmt = "{:11.3f}" if r["unit"] == "s" else "{:11.1f}"
        cells = [fmt.format(r[k]) if r.get(k) is not None else f"{'-':>11}" for k in LAUNCHERS]
        ratios = [
            f"{r[k]:11.{d}f}" if r.get(k) is not None else f"{'-':>11}"
            for k, d in (("ttmesh/bare", 2), ("ttmesh/torchrun", 3))
        ]
        for label in earlier():
            ratios += [
                f"{r[k]:11.2f}" if r.get(k) is not None else f"{'-':>11}"
                for k in (f"{label}/bare", f"{label}/torchrun")
            ]
        out.append(f"{r['name'] + ' (' + r['unit'] + ')':48} {' '.join(cells)} {' '.join(ratios)}")
        if r["note"]:
            out.append(f"{'':48}   {r['note']}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, metavar="K", help="runs per job (median)")
    parser.add_argument("--json", metavar="FILE", help="write the results to FILE")
    parser.add_argument(
        "--only",
        metavar="NAME,...",
        help="some of: "
        + ", ".join(BENCHES + SLOW)
        + " (default: all but "
        + ", ".join(SLOW)
        + ", which takes ~60 s a run)",
    )
    parser.add_argument(
        "--ttmesh", metavar="PATH", help="the ttmesh to measure (default: this Python's)"
    )
    parser.add_argument(
        "--compare",
        metavar="PATH",
        action="append",
        help="another ttmesh (e.g. an earlier commit's) measured in the same run: column 'before' "
        "(repeatable: 'before2', ...)",
    )
    args = parser.parse_args()
    for i, _ in enumerate(args.compare or []):
        LAUNCHERS.append("before" if i == 0 else f"before{i + 1}")
    only = args.only.split(",") if args.only else list(BENCHES)
    unknown = [n for n in only if n not in BENCHES + SLOW]
    if unknown or args.runs < 1:
        parser.error(f"unknown benchmark {unknown}" if unknown else "--runs must be positive")
    # In memory, like the test suite's simulated roots: on a real host the driver's files and
    # /run/lock (the leases) are in memory too.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="ttmesh-bench-", dir=shm))
    segments = _segments()
    try:
        b = Bench(args.runs, work, args.ttmesh, args.compare)
        grid = work / "p150-grid128.yaml"
        grid.write_text(grid_system())
        b.sim("qb2", "quietbox2")
        b.sim("galaxy", "galaxy-wh")
        b.sim("grid128", str(grid))
        b.sim("qb2hz100", "quietbox2", hz=100)
        load = os.getloadavg()
        started = time.time()
        rows: list[dict] = []
        for name in only:
            added = globals()[f"bench_{name}"](b)
            rows += added
            print(show(added).split("\n", 1)[1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        _drop_segments(segments)
    print()
    print(show(rows))
    print(
        f"\nmedians of {args.runs} runs; load average before: {load[0]:.2f} (after: {os.getloadavg()[0]:.2f})"
    )
    if args.json:
        doc = {
            "runs": args.runs,
            "cpus": os.cpu_count(),
            "load_before": load,
            "load_after": os.getloadavg(),
            "seconds": time.time() - started,
            "python": sys.version.split()[0],
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
