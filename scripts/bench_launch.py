#!/usr/bin/env python3
"""Launch overhead and failure teardown: ttmesh against torchrun, on the same jobs, in one run.

Jobs (each launcher runs them the same number of times, interleaved, on the same machine):

1. ``4 x true``: wall time from starting the launcher to its exit. Everything beyond running
   ``true`` four times is the launcher's overhead.
2. ``a rank failing after 1 s``: 4 ranks that sleep, rank 2 exits 3 after 1 s. Measured: the
   launcher's exit code, and the time from the failure (the failing rank writes a timestamp just
   before exiting) until the launcher has exited and every worker is gone.

ttmesh runs on a simulated QuietBox 2 (its pre-flight and leases included). torchrun must be
importable (``pip install torch==2.13.0``).

Usage: python scripts/bench_launch.py [--runs N] [--json]
Targets (README): ttmesh's launch overhead <= 0.1 x torchrun's; everything down <= 50 ms after
a failure (no SIGTERM-ignoring workers in this job).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAILER = r"""
import os, sys, time
rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK"))
out = sys.argv[1]
with open(os.path.join(out, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
if rank == "2":
    time.sleep(1.0)
    with open(os.path.join(out, "failed_at"), "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, proc.returncode


def failure_run(argv: list[str], env: dict[str, str], out: Path) -> tuple[float, int]:
    """Seconds from the failing rank's exit to: launcher gone and every worker gone."""
    for p in out.iterdir():
        p.unlink()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code = proc.wait(timeout=120)
    launcher_done = time.time()
    pids = [int(p.read_text()) for p in out.glob("pid*")]
    while any(alive(p) for p in pids):
        time.sleep(0.001)
        if time.time() - launcher_done > 60:
            break
    all_done = max(launcher_done, time.time())
    failed_at = float((out / "failed_at").read_text())
    return all_done - failed_at, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    if not os.path.exists(torchrun):
        print("torchrun not found: pip install torch==2.13.0", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ttmesh-bench-"))
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    # Both launchers run as users run them: with Python's bytecode cache (torch's wheel ships
    # .pyc files; an editable ttmesh writes its own on the warm-up run below).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    ttmesh = [sys.executable, "-m", "ttmesh", "launch", "--sim", "quietbox2", "--tp-size", "4"]
    torch = [torchrun, "--standalone", "--nproc-per-node", "4"]
    subprocess.run([*ttmesh, "--", "true"], env=env, capture_output=True)  # build the cached root
    script = work / "failer.py"
    script.write_text(FAILER)
    out = work / "out"
    out.mkdir()
    baseline = [timed(["true"], env)[0] * 4 for _ in range(args.runs)]
    launch = {"ttmesh": [], "torchrun": []}
    down = {"ttmesh": [], "torchrun": []}
    codes = {"ttmesh": set(), "torchrun": set()}
    for _ in range(args.runs):
        launch["ttmesh"].append(timed([*ttmesh, "--", "true"], env)[0])
        launch["torchrun"].append(timed([*torch, "--no-python", "true"], env)[0])
    for _ in range(max(3, args.runs // 3)):
        for name, argv in (
            ("ttmesh", [*ttmesh, str(script), str(out)]),
            ("torchrun", [*torch, str(script), str(out)]),
        ):
            seconds, code = failure_run(argv, env, out)
            down[name].append(seconds)
            codes[name].add(code)
    shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(baseline)
    med = {k: statistics.median(v) for k, v in launch.items()}
    overhead = {k: max(v - base, 1e-6) for k, v in med.items()}
    result = {
        "runs": args.runs,
        "four_true_seconds": med,
        "overhead_seconds": overhead,
        "overhead_ratio_ttmesh_over_torchrun": overhead["ttmesh"] / overhead["torchrun"],
        "down_after_failure_seconds": {k: statistics.median(v) for k, v in down.items()},
        "exit_codes_on_failure": {k: sorted(v) for k, v in codes.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"4 x true (median of {args.runs}): ttmesh {med['ttmesh'] * 1000:.0f} ms, "
        f"torchrun {med['torchrun'] * 1000:.0f} ms"
    )
    print(
        f"launch overhead: ttmesh {overhead['ttmesh'] * 1000:.0f} ms, torchrun "
        f"{overhead['torchrun'] * 1000:.0f} ms, ratio {result['overhead_ratio_ttmesh_over_torchrun']:.3f}"
        " (target <= 0.1)"
    )
    d = result["down_after_failure_seconds"]
    print(
        f"everything down after a rank fails: ttmesh {d['ttmesh'] * 1000:.0f} ms, torchrun "
        f"{d['torchrun'] * 1000:.0f} ms (target <= 50 ms)"
    )
    print(
        f"exit code when rank 2 exits 3: ttmesh {result['exit_codes_on_failure']['ttmesh']}, "
        f"torchrun {result['exit_codes_on_failure']['torchrun']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
