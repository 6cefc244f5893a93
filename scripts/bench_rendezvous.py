#!/usr/bin/env python3
"""Multi-host start: ttmesh's agents against torchrun's, joined through the same c10d rendezvous.

For N = 2, 4 and 8 hosts, N agents start at once on this machine, each as a host of its own (ttmesh:
its own simulated QuietBox 2 root; both: node 0's store on a loopback port), one rank per host,
and meet through torch's c10d rendezvous: ttmesh with ``--nnodes N --node-rank R
--rdzv-endpoint``, torchrun with ``--nnodes N --rdzv-backend c10d --rdzv-endpoint``. Measured,
median of ``--runs`` interleaved runs:

* ``running``: from starting the agents until every rank of the job has started (each rank
  writes bash's ``$EPOCHREALTIME``);
* ``done``: until every agent has exited (the ranks exit at once).

The agents share this machine's cores (2 here), so both launchers pay N Python start-ups with
torch imported (the rendezvous is torch's) on the same CPUs: the ratio is the comparison, the
absolute times are not a cluster's. ttmesh also runs its per-host duties (inventory,
pre-flight, leases, job record) and agrees on the job's start with the other hosts.

Only loopback addresses are used. Usage: python scripts/bench_rendezvous.py [--runs K]
[--hosts 2,4,8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANK_CMD = ["bash", "-c", 'echo "$EPOCHREALTIME" > "$BENCH_OUT/$RANK"']


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tool(name: str) -> list[str]:
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        sys.exit(f"{name} not found next to {sys.executable} or on PATH")
    return [found]


class Rendezvous:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.ttmesh = tool("ttmesh")
        self.torchrun = tool("torchrun")
        self.env = {
            **os.environ,
            "XDG_CACHE_HOME": str(work / "cache"),
            "XDG_RUNTIME_DIR": str(work / "run"),
            "OMP_NUM_THREADS": "1",
            "NO_COLOR": "1",
            "TTMESH_RDZV_TOKEN": "bench",
        }
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        for name in ("TTMESH_ROOT", "TT_VISIBLE_DEVICES"):
            self.env.pop(name, None)
        (work / "run").mkdir(mode=0o700)
        self.roots: list[Path] = []

    def roots_for(self, n: int) -> list[Path]:
        while len(self.roots) < n:
            root = self.work / f"host{len(self.roots)}"
            subprocess.run(
                [*self.ttmesh, "sim", "create", "--system", "quietbox2", "--root", str(root)],
                env=self.env, check=True, capture_output=True,
            )  # fmt: skip
            self.roots.append(root)
        return self.roots[:n]

    def argvs(self, launcher: str, n: int, port: int) -> list[list[str]]:
        endpoint = f"127.0.0.1:{port}"
        if launcher == "ttmesh":
            return [
                [*self.ttmesh, "launch", "--root", str(root), "--nnodes", str(n),
                 "--node-rank", str(i), "--rdzv-endpoint", endpoint, "--tp-size", "1",
                 "--no-live", "--", *RANK_CMD]
                for i, root in enumerate(self.roots_for(n))
            ]  # fmt: skip
        return [
            [*self.torchrun, "--nnodes", str(n), "--nproc-per-node", "1", "--rdzv-backend",
             "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", f"bench-{port}",
             "--no-python", *RANK_CMD]
            for _ in range(n)
        ]  # fmt: skip

    def once(self, launcher: str, n: int) -> tuple[float, float]:
        out = Path(tempfile.mkdtemp(dir=self.work))
        env = {**self.env, "BENCH_OUT": str(out)}
        argvs = self.argvs(launcher, n, free_port())
        t0 = time.time()
        procs = [
            subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for a in argvs
        ]
        errs = [p.communicate(timeout=600)[1] for p in procs]
        done = time.time() - t0
        bad = [
            (p.returncode, e.decode(errors="replace")[-400:])
            for p, e in zip(procs, errs, strict=True)
            if p.returncode != 0
        ]
        if bad:
            sys.exit(f"{launcher} over {n} hosts failed: exit {bad[0][0]}: {bad[0][1]}")
        stamps = [float(f.read_text()) for f in out.iterdir()]
        if len(stamps) != n:
            sys.exit(f"{launcher} over {n} hosts: {len(stamps)} of {n} ranks ran")
        return max(stamps) - t0, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, metavar="K")
    parser.add_argument("--hosts", default="2,4,8", metavar="N,...")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    try:
        counts = [int(x) for x in args.hosts.split(",")]
    except ValueError:
        parser.error("--hosts takes numbers, e.g. 2,4,8")
    if args.runs < 1 or any(n < 2 for n in counts):
        parser.error("--runs >= 1 and every --hosts count >= 2")
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="ttmesh-bench-rdzv-", dir=shm))
    rows = []
    try:
        bench = Rendezvous(work)
        bench.once("ttmesh", 2)  # warm the caches both read (bytecode, the simulated roots)
        bench.once("torchrun", 2)
        for n in counts:
            samples: dict[str, list[tuple[float, float]]] = {"ttmesh": [], "torchrun": []}
            for _ in range(args.runs):
                for launcher in samples:
                    samples[launcher].append(bench.once(launcher, n))
            row: dict[str, object] = {"hosts": n}
            for launcher, got in samples.items():
                row[f"{launcher}_running"] = statistics.median(s[0] for s in got)
                row[f"{launcher}_done"] = statistics.median(s[1] for s in got)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'hosts':>5} {'ttmesh running':>15} {'torchrun running':>17} {'ratio':>6}"
          f" {'ttmesh done':>12} {'torchrun done':>14} {'ratio':>6}")  # fmt: skip
    for r in rows:
        tr, trr = r["ttmesh_running"], r["torchrun_running"]
        td, trd = r["ttmesh_done"], r["torchrun_done"]
        print(f"{r['hosts']:>5} {tr:>14.2f}s {trr:>16.2f}s {tr / trr:>6.2f}"  # type: ignore[operator]
              f" {td:>11.2f}s {trd:>13.2f}s {td / trd:>6.2f}")  # type: ignore[operator]  # fmt: skip
    print(f"medians of {args.runs} run(s); {os.cpu_count()} CPUs; every agent on this machine")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": args.runs, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
