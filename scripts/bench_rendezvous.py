#!/usr/bin/env python3
"""Multi-host start: ttmesh's agents against torchrun's, joined through the same c10d rendezvous.

For N = 2, 4 and 8 hosts, N agents start at once, one per host and one rank per host, and meet
through torch's c10d rendezvous with node 0's store on host 0's address: ttmesh with ``--nnodes N
--node-rank R --rdzv-endpoint``, torchrun with ``--nnodes N --rdzv-backend c10d
--rdzv-endpoint``. Measured, median of ``--runs`` interleaved runs:

* ``running``: from starting the agents until every rank of the job has started (each rank
  writes bash's ``$EPOCHREALTIME``);
* ``done``: until every agent has exited (the ranks exit at once).

Where are the hosts? All on this machine, emulated as the test suite emulates them
(scripts/emuhosts.py; ../shared/reference/multihost.md, "Emulating hosts on one machine"). Each
agent, ttmesh's and torchrun's alike, runs on a host of its own: its own hostname and /tmp (UTS
and mount namespaces), its own simulated QuietBox 2 (``TTMESH_ROOT``, made by ``ttmesh sim
create``) and its own address:

* ``netns`` (the default when this machine can: root, unshare, ip): a network namespace per
  host on a bridge the script makes, host N at 10.77.0.(2+N);
* ``loopback`` (the fall-back, or ``--loopback``): host N at 127.0.0.(2+N) on this machine's
  loopback;
* ``plain`` (``--plain``, or when hosts cannot be emulated): no namespaces, every agent a plain
  process of this machine with its own simulated root, the store on 127.0.0.1.

Everything the script makes (namespaces, bridge, veths, directories) is removed at the end, also
on failure, Ctrl-C or SIGTERM. Traffic stays on loopback or on the script's own namespaces.

The agents share this machine's cores (2 here), so both launchers pay N Python start-ups with
torch imported (the rendezvous is torch's) on the same CPUs: the ratio is the comparison, the
absolute times are not a cluster's. ttmesh also runs its per-host duties (inventory,
pre-flight, leases, job record) and agrees on the job's start with the other hosts.

Usage: python scripts/bench_rendezvous.py [--runs K] [--hosts 2,4,8] [--plain | --loopback]
[--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emuhosts import Host, Network, can_emulate, can_network, make_hosts

RANK_CMD = ["bash", "-c", 'echo "$EPOCHREALTIME" > "$BENCH_OUT/$RANK"']
MODES = {
    "netns": "emulated hosts, each its own network namespace on a bridge (10.77.0.2, ...)",
    "loopback": "emulated hosts, each its own loopback address (127.0.0.2, ...)",
    "plain": "every agent a plain process on this machine, store on 127.0.0.1",
}


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def tool(name: str) -> list[str]:
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        sys.exit(f"{name} not found next to {sys.executable} or on PATH")
    return [found]


def stop(procs: list[subprocess.Popen]) -> None:
    """Every agent still running is asked to stop, then killed."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Rendezvous:
    def __init__(self, work: Path, hosts: list[Host] | None, netns: bool) -> None:
        self.work = work
        self.hosts = hosts  # None: plain processes
        self.netns = netns
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
        self.port = 29400  # netns: host 0's namespace is the script's, every port of it free

    def sim_create(self, root: Path) -> None:
        subprocess.run(
            [*self.ttmesh, "sim", "create", "--system", "quietbox2", "--root", str(root)],
            env=self.env, check=True, capture_output=True,
        )  # fmt: skip

    def roots_for(self, n: int) -> list[Path]:
        if self.hosts is not None:
            return [h.root for h in self.hosts[:n]]
        while len(self.roots) < n:
            self.roots.append(self.work / f"host{len(self.roots)}")
            self.sim_create(self.roots[-1])
        return self.roots[:n]

    def endpoint(self) -> str:
        if self.hosts is None:
            return f"127.0.0.1:{free_port('127.0.0.1')}"
        if not self.netns:
            return f"{self.hosts[0].addr}:{free_port(self.hosts[0].addr)}"
        self.port += 1
        return f"{self.hosts[0].addr}:{self.port}"

    def argvs(self, launcher: str, n: int) -> list[tuple[list[str], dict[str, str]]]:
        """Each agent's command line and the environment it adds, on its host."""
        endpoint = self.endpoint()
        roots = self.roots_for(n)
        out: list[tuple[list[str], dict[str, str]]] = []
        for i in range(n):
            if launcher == "ttmesh":
                where = ["--root", str(roots[i])] if self.hosts is None else []
                argv = [*self.ttmesh, "launch", *where, "--nnodes", str(n), "--node-rank", str(i),
                        "--rdzv-endpoint", endpoint, "--nproc-per-node", "1", "--no-live", "--",
                        *RANK_CMD]  # fmt: skip
            else:
                argv = [*self.torchrun, "--nnodes", str(n), "--nproc-per-node", "1",
                        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                        f"bench-{endpoint.rsplit(':', 1)[1]}", "--no-python", *RANK_CMD]  # fmt: skip
            if self.hosts is None:
                out.append((argv, {}))
            else:
                host = self.hosts[i]
                out.append((host.wrap(argv), host.env()))
        return out

    def once(self, launcher: str, n: int) -> tuple[float, float]:
        out = Path(tempfile.mkdtemp(dir=self.work))
        out.chmod(0o777)
        argvs = self.argvs(launcher, n)
        procs: list[subprocess.Popen] = []
        try:
            t0 = time.time()
            for argv, env in argvs:
                procs.append(
                    subprocess.Popen(
                        argv, env={**self.env, **env, "BENCH_OUT": str(out)},
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    )
                )  # fmt: skip
            errs = [p.communicate(timeout=600)[1] for p in procs]
            done = time.time() - t0
        finally:
            stop(procs)
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


def choose_mode(args: argparse.Namespace) -> str:
    if args.plain:
        return "plain"
    why = can_emulate()
    if why is not None:
        if args.loopback:
            sys.exit(f"--loopback: cannot emulate hosts here: {why}")
        print(f"cannot emulate hosts here ({why}): every agent a plain process", file=sys.stderr)
        return "plain"
    if args.loopback:
        return "loopback"
    why = can_network()
    if why is not None:
        print(f"no network of hosts ({why}): each host on a loopback address", file=sys.stderr)
        return "loopback"
    return "netns"


def _terminated(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)  # unwinds through the finally blocks: everything made is removed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, metavar="K")
    parser.add_argument("--hosts", default="2,4,8", metavar="N,...")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--plain", action="store_true",
                       help="no emulated hosts: every agent a plain process on this machine")  # fmt: skip
    where.add_argument("--loopback", action="store_true",
                       help="emulated hosts on loopback addresses, no network namespaces")  # fmt: skip
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    try:
        counts = [int(x) for x in args.hosts.split(",")]
    except ValueError:
        parser.error("--hosts takes numbers, e.g. 2,4,8")
    if args.runs < 1 or any(n < 2 for n in counts):
        parser.error("--runs >= 1 and every --hosts count >= 2")
    if max(counts) > 250:
        parser.error("at most 250 hosts (one /24 of addresses)")
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGHUP, _terminated)
    mode = choose_mode(args)
    load = [os.getloadavg()]
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = Path(tempfile.mkdtemp(prefix="ttmesh-bench-rdzv-", dir=shm))
    work.chmod(0o755)
    net = Network(f"ttmb{os.getpid() % 100000}", max(counts)) if mode == "netns" else None
    rows = []
    left: list[str] = []
    try:
        hosts = None
        if net is not None:
            net.up()
        if mode != "plain":
            hosts = make_hosts(work / "hosts", max(counts), net, share=[work])
        bench = Rendezvous(work, hosts, mode == "netns")
        for host in hosts or []:
            bench.sim_create(host.root)
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
                row[f"{launcher}_runs"] = [list(s) for s in got]  # (running, done), run by run
            rows.append(row)
    finally:
        if net is not None:
            left = net.down()
        shutil.rmtree(work, ignore_errors=True)
        if left:
            print(f"could not remove network namespaces: {', '.join(left)}", file=sys.stderr)
    load.append(os.getloadavg())
    print(f"{'hosts':>5} {'ttmesh running':>15} {'torchrun running':>17} {'ratio':>6}"
          f" {'ttmesh done':>12} {'torchrun done':>14} {'ratio':>6}")  # fmt: skip
    for r in rows:
        tr, trr = r["ttmesh_running"], r["torchrun_running"]
        td, trd = r["ttmesh_done"], r["torchrun_done"]
        print(f"{r['hosts']:>5} {tr:>14.2f}s {trr:>16.2f}s {tr / trr:>6.2f}"  # type: ignore[operator]
              f" {td:>11.2f}s {trd:>13.2f}s {td / trd:>6.2f}")  # type: ignore[operator]  # fmt: skip
    print(f"mode {mode}: {MODES[mode]}")
    print(f"medians of {args.runs} run(s); {os.cpu_count()} CPUs; load average (1, 5, 15 min) "
          f"{' '.join(f'{x:.2f}' for x in load[0])} before, "
          f"{' '.join(f'{x:.2f}' for x in load[1])} after")  # fmt: skip
    if args.json:
        doc = {"mode": mode, "where": MODES[mode], "runs": args.runs, "cpus": os.cpu_count(),
               "load_before": load[0], "load_after": load[1], "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 1 if left else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("interrupted: everything the benchmark made is removed")
