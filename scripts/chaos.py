#!/usr/bin/env python3
"""Chaos: ttmesh's fault matrix on simulated hosts, every fault at a random moment.

Each case runs ``--repeat K`` times; every run gets a fresh simulated host (what ``ttmesh sim
create`` builds, on tmpfs under /dev/shm when there is one), its own ``XDG_RUNTIME_DIR`` (so the
job records and run directories are its own), unique ``--job-id``s and its own marker. Every
worker ttmesh starts carries ``TTMESH_JOB_ID`` in its environment; the harness also puts
``TTMESH_CHAOS=<run>`` in the environment of every ttmesh it starts, which the guardian, the
workers, their grandchildren, mpirun and tt-smi inherit. Leftovers are found by reading
``/proc/*/environ`` for either.

A run's timing comes from ``random.Random("<seed>:<case>:<index>")``: the same ``--seed``
replays the same delays, ranks, exit codes and layouts (the machine's own timing still
varies). A fault aimed at a moment waits for an observable event and then a random delay:

* pre-flight: the job record exists, no guardian yet (half the runs start on a host with a
  link down and ``--auto-reset``, so pre-flight runs tt-smi for ``--reset-seconds``);
* start-up: the guardian exists, not every worker yet;
* running: every worker has started (and opened the fabric);
* teardown: a rank has failed, the others ignore SIGTERM until ``--grace`` ends;
* end: every rank of a failed attempt has ended, the guardian makes its verdict;
* recovery: tt-smi is resetting the chips of a crashed fabric job (resets made slow).

The cases over hosts (group ``hosts``, as root: scripts/emuhosts.py) run one tt-metal mesh over
two emulated T3Ks whose 8 cables are one shared state (a cable trains only when both its ends
are reset together); either host's ``ttmesh _rank`` or rank is SIGKILLed at start-up or while
running. The job must restart and end 0, and afterwards every cable must be up from both ends
(``ttmesh check --hosts``, given the cables' training time).

Expected outcomes follow docs/conventions.md: a rank's code; 130/143 for SIGINT/SIGTERM to
ttmesh at any moment (no restart after either); 137 and "launcher killed" when ttmesh is
SIGKILLed while its guardian lives (the guardian finishes), "ttmesh killed (its processes are
gone)" when no guardian was left to (the next ``ps`` closes the record); 137 and "supervisor
killed" for the guardian; 124 for a hang; one 0 and one 3 for two jobs racing; 3 for a refused
pre-flight. A reset is allowed (by design) only where ttmesh was stopped or killed while it
reset chips itself, where every reset tt-smi made failed, and where a foreign process held a
chip (ttmesh never stops one; the harness does, then resets).

After each run: no process left (by marker), no lease left, no run directory left (after a
``ttmesh ps``, which sweeps stale ones: the table says how many were swept rather than removed
by the job), the expected exit code and job record, no traceback, and a healthy host
(``ttmesh check``), after a ``ttmesh reset`` only where the case is one ttmesh cannot recover by
design (the table says which and how often).

Usage (with the Python ttmesh is installed in, e.g. .venv-ci/bin/python):
  python scripts/chaos.py --quick            # every case twice: about 2-3 minutes on 2 cores
  python scripts/chaos.py [--repeat K] [--seed S] [--jobs N] [--cases PATTERN ...] [-v]
  python scripts/chaos.py --list
Exit 0 when no run violated anything, 1 otherwise (2: bad usage).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO / "scripts"))  # emuhosts: the emulated hosts' namespaces
TW = REPO / "tests" / "workers" / "tw.py"
TAG = "ttmesh-test-worker"
SYSTEM = "quietbox2"  # 4 Blackhole chips in a ring: every link is between the job's chips
HOSTS_SYSTEM = "dual-t3k"  # the cases over hosts: two T3Ks and the 8 cables between them
SESSION = f"{os.getpid()}-{os.urandom(3).hex()}"
LAUNCH_TIMEOUT = 90.0  # a ttmesh that has not exited by then is a violation
SETTLE = 30.0  # after ttmesh exits: until a finishing guardian (or orphaned tt-smi) is gone
CABLES_SETTLE = 15.0  # beyond their training time: until the hosts' cables must be up again

# A worker for what tw.py can't do per rank: readiness by rank, a failure on the first
# attempts only, a crash when the harness says so. Argv: TAG key=value ...
INLINE = r"""
import os, sys, time
rank = int(os.environ.get("RANK", "0"))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
opts = dict(a.split("=", 1) for a in sys.argv[2:])
out = opts["out"]
with open(os.path.join(out, f"rank{rank}.pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(out, f"rank{rank}.pid.tmp"), os.path.join(out, f"rank{rank}.pid"))
if opts.get("fabric") == "1":
    open(os.environ["TTMESH_FABRIC_FILE"], "a").close()
if str(rank) in opts.get("ready", "").split(","):
    open(os.environ["TTMESH_READY_FILE"], "a").close()
while "wait-file" in opts and not os.path.exists(opts["wait-file"]):
    time.sleep(0.01)
if "crash-file" in opts and str(rank) == opts.get("crash-rank"):
    while not os.path.exists(opts["crash-file"]):
        time.sleep(0.01)
    sys.stderr.write(f"rank {rank} failing on purpose\n")
    sys.exit(int(opts["code"]))
if attempt < int(opts.get("fail-attempts", "0")) and str(rank) == opts.get("fail-rank", "0"):
    time.sleep(float(opts.get("after", "0.2")))
    sys.stderr.write(f"rank {rank} failing on purpose (attempt {attempt})\n")
    sys.exit(int(opts["code"]))
time.sleep(float(opts.get(f"sleep{attempt}", opts.get("sleep", "3600"))))
"""

# Job records: how ttmesh says a job ended (ttmesh/launcher/job/run.py, attempt/guardian.py, runtime/jobs.py).
LAUNCHER_KILLED = "launcher killed"
SUPERVISOR_KILLED = "supervisor killed"
PS_KILLED = "ttmesh killed (its processes are gone)"
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
STOP_STATUS = {"INT": "interrupted (SIGINT)", "TERM": "terminated (SIGTERM)"}


class Missed(Exception):
    """The moment a fault was aimed at never came (the run is not counted as a fault)."""


# =========================================================================== processes


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent, state) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[0]
    except (OSError, IndexError, ValueError):
        return None


def _leads_group_in(pid: int, front: int) -> bool:
    """``pid`` leads its process group, in the session of ``front``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            mine = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{front}/stat") as f:
            theirs = f.read().rsplit(")", 1)[1].split()
        return int(mine[2]) == pid and mine[3] == theirs[3]
    except (OSError, IndexError, ValueError):
        return False


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def environ(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def children(parent: int, newer: bool = False) -> list[int]:
    """Live children of ``parent`` (``newer``: only those with higher PIDs, a faster look for
    a child just forked, as PIDs are handed out in increasing order until they wrap)."""
    out = []
    for pid in pids():
        if newer and pid <= parent:
            continue
        st = _stat(pid)
        if st is not None and st[0] == parent and st[1] not in ("Z", "X"):
            out.append(pid)
    return out


def marked(needles: list[str]) -> dict[int, str]:
    """Live processes (not zombies, not this one) whose environment holds one of ``needles``
    (``KEY=VALUE``): pid -> command line."""
    wanted = {n.encode() for n in needles}
    found = {}
    for pid in pids():
        if pid == os.getpid():
            continue
        if wanted & set(environ(pid)) and alive(pid):
            found[pid] = cmdline(pid)
    return found


def shell_code(returncode: int) -> int:
    """As a shell reports it: 128 + signal for a process killed by one."""
    return 128 - returncode if returncode < 0 else returncode


def kill(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


# =========================================================================== one run


@dataclass
class Expect:
    """What one launch must end with."""

    codes: set[int]
    status: tuple[str, ...] | None = None  # the job record's status starts with one of these
    record: bool = True  # False: refused before any record (the loser of a race may be)


@dataclass
class Launch:
    trial: Trial
    job: str
    proc: subprocess.Popen
    err: Path
    n: int  # workers it starts
    line: str  # its command line, which the guardian (forked) shares
    expect: Expect | None = None
    code: int | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def guardian(self) -> int | None:
        """The front's guardian, if alive: its forked child (the front's command line) that
        leads a process group of its own in the front's session (its first act). A child the
        front forks to run a program (``mpirun --version`` while it prepares, tt-smi) has the
        front's command line too until it execs, but stays in the front's group or leads a
        session of its own; under load that moment lasts long enough to be caught, and a
        harness that took it for the guardian found "the guardian gone" a moment later."""
        newer = children(self.pid, newer=True)
        for found in (newer, [c for c in children(self.pid) if c not in newer]):  # PIDs wrap
            for child in found:
                if cmdline(child) == self.line and _leads_group_in(child, self.pid):
                    return child
        return None

    def orphans(self) -> list[int]:
        """Guardians alive without their front (re-parented when it died)."""
        found = marked([f"TTMESH_CHAOS={self.trial.tag}"])
        return [pid for pid, cmd in found.items() if cmd == self.line and pid != self.pid]

    def workers(self) -> dict[int, int]:
        """rank -> pid of the workers running now (tagged argv, this job's TTMESH_JOB_ID)."""
        found = {}
        for pid, cmd in marked([f"TTMESH_JOB_ID={self.job}"]).items():
            if TAG not in cmd or "grandchild" in cmd:
                continue
            env = dict(e.split(b"=", 1) for e in environ(pid) if b"=" in e)
            rank = env.get(b"TTMESH_RANK", env.get(b"RANK", b"-1"))
            with contextlib.suppress(ValueError):
                found[int(rank)] = pid
        return found

    def started_workers(self) -> int:
        """Workers that have written their pid file (they run Python code by then)."""
        return len(list(self.trial.out.glob(f"{self.job}.r*/rank*.pid")))

    def record_exists(self) -> bool:
        return (self.trial.xdg / "ttmesh" / "jobs" / f"{self.job}.json").exists()

    def wait(self, timeout: float = LAUNCH_TIMEOUT) -> int:
        if self.code is None:
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.trial.violation(f"{self.job}: ttmesh did not exit within {timeout:g} s")
                kill(self.pid, signal.SIGKILL)
                rc = self.proc.wait()
            self.code = shell_code(rc)
        return self.code


@dataclass
class Running:
    proc: subprocess.Popen

    def result(self, timeout: float = 120) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            return 124, out, f"timed out after {timeout:g} s: {err}"
        return self.proc.returncode, out, err


class Trial:
    """One run of a case: its host, runtime directory, marker, launches and findings."""

    def __init__(self, case: Case, index: int, seed: str, base: Path) -> None:
        self.case = case
        self.index = index
        self.seed = seed
        self.rng = random.Random(f"{seed}:{case.name}:{index}")
        self.tag = f"{case.name}.{index}.{os.urandom(2).hex()}"
        self.dir = base / self.tag
        self.root = self.dir / "root"
        self.xdg = self.dir / "xdg"
        self.out = self.dir / "out"
        self.launches: list[Launch] = []
        self.violations: list[str] = []
        self.notes: list[str] = []
        self.faults = 0
        self.phase: str | None = None  # the moment the fault actually hit
        self.reset_ok: str | None = None  # why a `ttmesh reset` may be needed (by design)
        self.holds: list[int] = []  # holder processes injected (killed by design before reset)
        self.reset_seconds = 0.0
        self.hosts: list = []  # emulated hosts of a case over hosts (create_hosts)
        self.train = 0.0  # their cables' training time
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TTMESH_", "TT_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))
            and k not in ("XDG_RUNTIME_DIR", "OMPI_COMM_WORLD_RANK")
        }
        if "TTMESH_TEST_SESSION" in os.environ:  # the test suite's own leak check
            env["TTMESH_TEST_SESSION"] = os.environ["TTMESH_TEST_SESSION"]
        env.update(
            XDG_RUNTIME_DIR=str(self.xdg),
            TTMESH_CHAOS=self.tag,
            TTMESH_CHAOS_SESSION=SESSION,
        )
        self.env = env

    # -- findings

    def violation(self, what: str) -> None:
        self.violations.append(what)

    def note(self, what: str) -> None:
        self.notes.append(what)

    def hit(self, phase: str) -> None:
        self.phase = phase

    # -- the host

    def create(self, reset_seconds: float = 0.0, system: str = SYSTEM) -> None:
        """A fresh simulated host (as `ttmesh sim create` + `sim config --reset-seconds`)."""
        from ttmesh.sim.create import create
        from ttmesh.sim.system import load

        self.dir.mkdir(parents=True)
        self.xdg.mkdir(mode=0o700)
        self.out.mkdir()
        create(load(system), self.root, config={"reset_seconds": reset_seconds})
        self.reset_seconds = reset_seconds
        self.bdfs = sorted(
            p.name for p in (self.root / "sys" / "bus" / "pci" / "devices").iterdir()
        )

    def create_hosts(self, system: str = HOSTS_SYSTEM) -> None:
        """Every host of ``system`` emulated (scripts/emuhosts.py: its own hostname, /tmp and
        simulated root), their cables one shared state in the run's directory (training in
        0.2-1 s, resets within 20 s of each other train it), mpirun reaching them through a
        launch agent that enters a host's namespaces instead of ssh."""
        import emuhosts

        from ttmesh.sim.create import create
        from ttmesh.sim.system import ClusterModel, load_any

        self.dir.mkdir(parents=True)
        self.xdg.mkdir(mode=0o700)
        self.out.mkdir()
        model = load_any(system)
        assert isinstance(model, ClusterModel)
        self.hosts = emuhosts.make_hosts(self.dir, len(model.hosts))
        self.train = round(self.rng.uniform(0.2, 1.0), 2)
        config = {"reset_seconds": 0.0, "cable_train_seconds": self.train, "cable_window": 20.0}
        for i, host in enumerate(self.hosts):
            create(model.host(i), host.root, config=config, cables=self.dir / f"{system}.cables")
        agent = emuhosts.write_agent(self.dir / "agent", self.hosts)
        self.env.update(
            OMPI_MCA_plm_rsh_agent=str(agent),
            PRTE_MCA_plm_ssh_agent=str(agent),
            OMPI_MCA_oob_tcp_if_include="lo",
            OMPI_MCA_btl_tcp_if_include="lo",
            OMPI_MCA_btl="self,tcp",
            PYTHONPATH=str(REPO),
        )

    def names(self) -> str:
        return ",".join(h.name for h in self.hosts)

    def cli(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
        return self.cli_start(*args, env=env).result(timeout)

    def cli_start(self, *args: str, env: dict[str, str] | None = None) -> Running:
        """Start a ttmesh command; ``.result()`` is (exit code, stdout, stderr)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "ttmesh", *args],
            env=env or self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.dir,
        )
        return Running(proc)

    def fault(self, *args: str) -> None:
        """`ttmesh sim fault ...` on this run's host (a holder gets its own marker)."""
        env = dict(self.env)
        if args[0] == "hold":
            del env["TTMESH_CHAOS"]
            env["TTMESH_CHAOS_HOLD"] = self.tag
        code, _out, err = self.cli("sim", "fault", "--root", str(self.root), *args, env=env)
        if code != 0:
            raise RuntimeError(f"sim fault {' '.join(args)}: exit {code}: {err.strip()}")
        if args[0] == "hold":
            self.holds = list(marked([f"TTMESH_CHAOS_HOLD={self.tag}"]))

    # -- launches

    def launch(
        self,
        *options: str,
        worker: list[str] | None = None,
        inline: dict[str, str] | None = None,
        n: int = 4,
        name: str = "",
    ) -> Launch:
        """Start `ttmesh launch` in the background on this run's host."""
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in self.tag)
        job = f"c{SESSION.split('-')[1]}-{safe}{name}"[:64]
        pid_dir = self.out / f"{job}.r"
        pid_dir.mkdir()
        if inline is not None:
            command = [sys.executable, "-c", INLINE, TAG, f"out={pid_dir}"]
            command += [f"{k}={v}" for k, v in inline.items()]
        else:
            command = [sys.executable, str(TW), TAG, f"pids={pid_dir}", *(worker or [])]
        err = self.out / f"{job}.err"
        where = ["--hosts", self.names()] if self.hosts else ["--root", str(self.root)]
        argv = [
            sys.executable, "-m", "ttmesh", "launch", *where, "--job-id", job,
            "--summary-json", str(self.out / f"{job}.summary.json"), *options, "--", *command,
        ]  # fmt: skip
        with err.open("w") as f:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=f,
                cwd=self.dir,
                start_new_session=True,
            )
        launch = Launch(self, job, proc, err, n, " ".join(argv))
        self.launches.append(launch)
        return launch

    def summary(self, launch: Launch) -> dict | None:
        try:
            return json.loads((self.out / f"{launch.job}.summary.json").read_text())
        except (OSError, ValueError):
            return None

    def until(
        self, what: str, cond: Callable[[], object], timeout: float = 20.0, poll: float = 0.005
    ) -> object:
        """Poll ``cond`` until it holds; Missed when it never does (or every launch ended)."""
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise Missed(f"never saw {what} within {timeout:g} s")
            if all(la.proc.poll() is not None for la in self.launches):
                value = cond()
                if value:
                    return value
                last = [
                    la.err.read_text(errors="replace").strip().splitlines()[-1:]
                    for la in self.launches
                ]
                said = "; ".join(
                    f"exit {shell_code(la.proc.returncode)}: {ln[0] if ln else ''}"
                    for la, ln in zip(self.launches, last, strict=True)
                )
                raise Missed(f"every ttmesh ended before {what} ({said})")
            time.sleep(poll)

    def sleep(self, low: float, high: float) -> float:
        delay = self.rng.uniform(low, high)
        time.sleep(delay)
        return delay

    # -- after the run

    def check(self) -> None:
        """Everything a finished run must leave (see the module's docstring)."""
        for la in self.launches:
            la.wait()
        needles = [f"TTMESH_CHAOS={self.tag}"] + [f"TTMESH_JOB_ID={la.job}" for la in self.launches]
        deadline = time.monotonic() + SETTLE + 3 * self.reset_seconds
        left = marked(needles)
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = marked(needles)
        for pid, cmd in left.items():
            self.violation(f"process left: {pid} {cmd[:100]}")
            kill(pid, signal.SIGKILL)
        # Run directories: removed by the job, or swept by the next command that looks (ps).
        runs = self.xdg / "ttmesh" / "runs"
        before = {la.job for la in self.launches if (runs / la.job).exists()}
        for pid in self.holds:  # by design: a foreign holder is stopped by its owner
            kill(pid, signal.SIGKILL)
        health = None if self.hosts else self.cli_start("check", "--root", str(self.root), "--json")
        code, out, err = self.cli("ps", "--all", "--json")
        records = {}
        if code == 0:
            records = {j["job"]: j for j in json.loads(out)["jobs"]}
        else:
            self.violation(f"ttmesh ps --all --json: exit {code}: {err.strip()[:200]}")
        for la in self.launches:
            if (runs / la.job).exists():
                self.violation(f"{la.job}: run directory left after ttmesh ps")
            elif la.job in before:
                self.note("run dir swept by ps")
        # Leases: none may survive the job (a lease is a flock held by the job's processes).
        from ttmesh.host.base import Host
        from ttmesh.runtime import leases

        for root in [h.root for h in self.hosts] or [self.root]:
            lock_dir = root / "run" / "lock" / "ttmesh"
            asics = [p.stem for p in lock_dir.glob("*.lock")]
            for asic, holder in leases.probe(Host(root), asics).items():
                self.violation(f"lease left on {asic}: job {holder.job} pid {holder.pid}")
        # Exit codes, job records, tracebacks.
        for la in self.launches:
            text = la.err.read_text(errors="replace")
            # ttmesh's own lines only: a rank's output is prefixed ([rN]), and a Python rank
            # that gets the SIGINT sent to ttmesh (as under torchrun) prints its
            # KeyboardInterrupt traceback there.
            own = [ln for ln in text.splitlines() if not ln.startswith("[r")]
            for bad in ("Traceback", "supervisor error", "internal error"):
                line = next((ln for ln in own if bad in ln), None)
                if line is not None:
                    self.violation(f"{la.job}: {line.strip()[:160]}")
            exp = la.expect
            if exp is None:
                continue
            if la.code not in exp.codes:
                last = text.strip().splitlines()[-1:] or [""]
                self.violation(
                    f"exit {la.code}, expected {'/'.join(map(str, sorted(exp.codes)))}"
                    f" ({last[0][:120]})"
                )
            rec = records.get(la.job)
            if rec is None:
                if exp.record:
                    self.violation("no job record")
                continue
            if rec.get("state") != "ended":
                self.violation(f"job record still says {rec.get('state')}")
            status = str(rec.get("status"))
            if exp.status is not None and not status.startswith(exp.status):
                self.violation(f"record says {status!r}, expected {' or '.join(exp.status)!r}")
        if health is None:
            self.check_hosts()
            return
        # The host: healthy, after a reset only where the case can't be recovered by design.
        code, out, err = health.result()
        if code != 0:
            problem = _first_problem(out) or err.strip()[:160]
            if self.reset_ok is None:
                self.violation(f"host unhealthy after the job: {problem}")
            else:
                rc, _o, rerr = self.cli("reset", "--root", str(self.root))
                again, out2, _ = self.cli("check", "--root", str(self.root), "--json")
                if again != 0:
                    self.violation(
                        f"host unhealthy even after ttmesh reset (exit {rc}): "
                        f"{_first_problem(out2) or rerr.strip()[:160]}"
                    )
                else:
                    self.note(f"reset needed ({self.reset_ok})")

    def check_hosts(self) -> None:
        """Every host healthy and every cable between them up, from both ends (ttmesh check
        --hosts), once the cables had the time to train; else the first line of why."""
        deadline = time.monotonic() + 10 * self.train + CABLES_SETTLE
        while True:
            code, _out, err = self.cli("check", "--hosts", self.names(), timeout=180)
            if code == 0:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(self.train)
        lines = [ln for ln in err.splitlines() if ln.startswith("ttmesh: ")]
        self.violation(f"hosts unhealthy after the job (check --hosts exit {code}): "
                       f"{(lines[-1] if lines else err.strip())[:400]}")  # fmt: skip

    def cleanup(self) -> None:
        for la in self.launches:
            if la.proc.poll() is None:
                kill(la.pid, signal.SIGKILL)
                la.proc.wait()
        needles = [f"TTMESH_CHAOS={self.tag}", f"TTMESH_CHAOS_HOLD={self.tag}"]
        needles += [f"TTMESH_JOB_ID={la.job}" for la in self.launches]
        for pid in marked(needles):
            kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def _first_problem(check_json: str) -> str | None:
    try:
        problems = json.loads(check_json)["problems"]
    except (ValueError, KeyError, TypeError):
        return None
    errors = [p for p in problems if p.get("severity") == "error"] or problems
    return errors[0]["what"] if errors else None


# =========================================================================== the cases


@dataclass
class Case:
    name: str
    group: str
    run: Callable[[Trial], None]
    doc: str
    needs: str | None = None  # an executable the case needs (skipped with a reason if absent)


CASES: list[Case] = []


def case(name: str, group: str, needs: str | None = None):
    def register(fn: Callable[[Trial], None]) -> Callable[[Trial], None]:
        CASES.append(Case(name, group, fn, (fn.__doc__ or "").strip().splitlines()[0], needs))
        return fn

    return register


def fabric_shape(t: Trial, ranks: int | None = None) -> tuple[list[str], list[str], int]:
    """(launch options, worker actions, workers) of a job on all 4 chips that opens the
    fabric: 4 isolated ranks that each bring it up, or one process driving every chip.
    ``ranks``: at least this many workers (isolated then)."""
    if ranks is None and t.rng.random() < 0.3:
        return ["--tp-size", "4", "--mesh-layout", "single-process"], [], 1
    return ["--tp-size", "4"], ["fabric"], 4


def any_shape(t: Trial) -> tuple[list[str], list[str], int]:
    """Isolated ranks with or without the fabric, or one process on every chip."""
    if t.rng.random() < 0.25:
        return ["--tp-size", "4"], [], 4
    return fabric_shape(t)


def rank_code(t: Trial) -> int:
    return t.rng.choice([1, 2, 3, 7, 42, 99, 127])


# -- faults in the ranks ------------------------------------------------------------------


@case("rank-crash", "ranks")
def _rank_crash(t: Trial) -> None:
    """A rank exits with an error code at a random moment: its code, every rank stopped."""
    t.create()
    opts, acts, n = any_shape(t)
    rank, code = t.rng.randrange(n), rank_code(t)
    la = t.launch("--grace", "1", *opts, worker=[*acts, f"fail-after={rank}:{t.rng.uniform(0, 1):.3f}:{code}"], n=n)  # fmt: skip
    la.expect = Expect({code}, (f"rank {rank} exited with code {code}",))
    t.faults += 1


@case("rank-sigkill", "ranks")
def _rank_sigkill(t: Trial) -> None:
    """A rank is SIGKILLed at a random moment after start-up: 137."""
    t.create()
    opts, acts, n = any_shape(t)
    la = t.launch("--grace", "1", *opts, worker=acts, n=n)
    t.until("every worker", lambda: la.started_workers() == n)
    t.sleep(0, 0.8)
    rank, pid = t.rng.choice(sorted(la.workers().items()))
    kill(pid, signal.SIGKILL)
    t.hit("running")
    la.expect = Expect({137}, (f"rank {rank} killed by SIGKILL",))
    t.faults += 1


def _grandchild(t: Trial, how: str) -> None:
    t.create()
    opts, acts, n = any_shape(t)
    if n == 1:
        opts, acts, n = ["--tp-size", "4"], ["fabric"], 4
    rank, code = t.rng.randrange(n), rank_code(t)
    pid_dir = t.out / "grandchildren"
    pid_dir.mkdir()
    after = f"{t.rng.uniform(0.2, 0.8):.3f}"
    la = t.launch("--grace", "1", *opts, worker=[*acts, f"{how}={pid_dir}", f"fail-after={rank}:{after}:{code}"], n=n)  # fmt: skip
    la.expect = Expect({code}, (f"rank {rank} exited with code {code}",))
    t.faults += 1


@case("grandchild", "ranks")
def _grandchild_same_group(t: Trial) -> None:
    """Every rank forks a sleeping grandchild, then one rank dies: no grandchild survives."""
    _grandchild(t, "child")


@case("grandchild-setsid", "ranks")
def _grandchild_setsid(t: Trial) -> None:
    """Every rank forks a grandchild that calls setsid, then one rank dies: none survives."""
    _grandchild(t, "setsid")


@case("ignore-sigterm", "ranks")
def _ignore_sigterm(t: Trial) -> None:
    """One rank fails, the others ignore SIGTERM: SIGKILL at the end of --grace, its code."""
    t.create()
    opts, acts, _n = fabric_shape(t, ranks=2)
    rank, code = t.rng.randrange(4), rank_code(t)
    grace = f"{t.rng.uniform(0.2, 1.5):.2f}"
    after = f"{t.rng.uniform(0.1, 0.6):.3f}"
    la = t.launch("--grace", grace, *opts, worker=[*acts, "ignore-term", f"fail-after={rank}:{after}:{code}"])  # fmt: skip
    la.expect = Expect({code}, (f"rank {rank} exited with code {code}",))
    t.faults += 1


@case("bring-up-hang", "ranks")
def _hang(t: Trial) -> None:
    """Some ranks never become ready: --ready-timeout catches it, 124."""
    t.create()
    ready = [r for r in range(4) if t.rng.random() < 0.5][:3]  # never all four
    fabric = t.rng.choice(["0", "1"])
    timeout = f"{t.rng.uniform(0.5, 1.5):.2f}"
    la = t.launch("--grace", "1", "--tp-size", "4", "--ready-timeout", timeout,
                  inline={"ready": ",".join(map(str, ready)), "fabric": fabric})  # fmt: skip
    la.expect = Expect({124}, ("hung in bring-up",))
    t.faults += 1


@case("restarts", "ranks")
def _restarts(t: Trial) -> None:
    """Rank 0 fails on the first F attempts under --max-restarts M: 0 when F <= M."""
    t.create()
    restarts = t.rng.choice([1, 2])
    fails = t.rng.randint(1, restarts + 1)
    code = rank_code(t)
    fabric = t.rng.choice(["0", "1"])
    la = t.launch("--grace", "1", "--tp-size", "4", "--max-restarts", str(restarts),
                  inline={"fail-attempts": str(fails), "code": str(code), "fabric": fabric,
                          "sleep": "0.3", "after": f"{t.rng.uniform(0.05, 0.4):.3f}"})  # fmt: skip
    if fails <= restarts:
        la.expect = Expect({0}, ("every rank succeeded",))
    else:
        la.expect = Expect({code}, (f"rank 0 exited with code {code}",))
    t.faults += fails
    la.wait()
    summary = t.summary(la) or {}
    attempts = len(summary.get("attempts", []))
    if attempts != min(fails, restarts) + 1:
        t.violation(f"{attempts} attempt(s), expected {min(fails, restarts) + 1}")


# -- ttmesh and its guardian signalled at a moment -----------------------------------------


def _aim(
    t: Trial, la: Launch, moment: str, n: int, teardown: tuple[int, float] | None
) -> int | None:
    """Wait for ``moment``'s event, then a random delay inside it; record what was hit.
    Returns the guardian to signal: the first attempt's, once a rank of it has failed (a
    late harness must not take the guardian of a restart for it)."""
    if moment == "preflight":
        t.until("the job record", la.record_exists)
        if t.reset_seconds:
            t.until("tt-smi in pre-flight", lambda: _tt_smi(t))
            t.sleep(0, t.reset_seconds)
        else:
            t.sleep(0, 0.01)
        t.hit("preflight" if la.guardian() is None else "startup")
    elif moment == "startup":
        g = t.until("the guardian", la.guardian, poll=0.0005)
        if t.rng.random() < 0.7:  # else at once: the guardian has just been forked
            t.sleep(0, 0.02)
        t.hit("startup" if len(children(int(g))) < n else "running")  # type: ignore[arg-type]
    elif moment == "running":
        t.until("every worker", lambda: la.started_workers() == n)
        t.sleep(0, 1.0)
        t.hit("running")
    elif moment == "teardown":
        assert teardown is not None
        rank, grace = teardown
        pid_file = t.out / f"{la.job}.r" / f"rank{rank}.pid"
        t.until("every worker", lambda: la.started_workers() == n)
        first = la.guardian()
        pid = int(pid_file.read_text())
        t.until("the rank's failure", lambda: not alive(pid))
        t.sleep(0, grace * 1.3)  # to the end of the grace, and a little after
        up = first is not None and alive(first)
        t.hit("teardown" if up else "after teardown")
        return first if up else None
    elif moment == "end":  # every rank has ended: the guardian makes the attempt's verdict
        t.until("every worker", lambda: la.started_workers() == n)
        first = la.guardian()
        ranks = [int(p.read_text()) for p in (t.out / f"{la.job}.r").glob("rank*.pid")]
        t.until("the ranks' end", lambda: not any(alive(p) for p in ranks))
        if t.rng.random() < 0.5:  # else at once: the verdict takes a few tens of ms
            t.sleep(0, 0.05)
        up = first is not None and alive(first)
        t.hit("end" if up else "after the end")
        return first if up else None
    elif moment == "recovery":
        t.until("tt-smi", lambda: _tt_smi(t))
        t.sleep(0, t.reset_seconds)
        t.hit("recovery" if _tt_smi(t) else "after recovery")
    return la.guardian()


def _tt_smi(t: Trial) -> bool:
    return any("tt-smi" in cmd for cmd in marked([f"TTMESH_CHAOS={t.tag}"]).values())


def _signal_case(t: Trial, target: str, sig: str, moment: str) -> None:
    preflight_reset = moment == "preflight" and t.rng.random() < 0.5
    slow = moment == "recovery" or preflight_reset
    t.create(reset_seconds=t.rng.uniform(0.6, 1.2) if slow else 0.0)
    opts, acts, n = fabric_shape(t, ranks=2 if moment == "teardown" else None)
    teardown = None
    extra: list[str] = []
    if preflight_reset:  # pre-flight finds a link down and resets the chips first
        t.fault("link-down", t.bdfs[0], t.bdfs[1])
        extra.append("--auto-reset")
        t.reset_ok = "the injected link-down's recovery was interrupted"
        t.faults += 1
    grace = "1"
    rank, code = t.rng.randrange(n), rank_code(t)
    fail = f"fail-after={rank}:{t.rng.uniform(0.1, 0.5):.3f}:{code}"
    if moment in ("teardown", "end", "recovery"):  # a rank fails first
        acts = [*acts, fail]
        t.reset_ok = "ttmesh was stopped after its guardian ended, as its recovery ran"
    if moment == "teardown":  # the others ignore SIGTERM: the teardown lasts the grace
        g = t.rng.uniform(0.8, 2.0)
        grace = f"{g:.2f}"
        acts.append("ignore-term")
        teardown = (rank, g)
    if moment in ("teardown", "end"):
        extra += ["--max-restarts", "1"]  # a stop (or a dead guardian) must not restart
    la = t.launch("--grace", grace, *opts, *extra, worker=acts, n=n)
    guardian = _aim(t, la, moment, n, teardown)
    _send(t, la, target, sig, guardian)
    if target == "guardian" and moment == "end":  # it may have handed its verdict over already
        la.expect = Expect({137, code}, (SUPERVISOR_KILLED, f"rank {rank} exited"))
    t.faults += 1
    la.wait()
    summary = t.summary(la) or {}
    stopped = la.code in (137, 128 + SIGNALS[sig])
    if t.phase in ("teardown", "end") and stopped and len(summary.get("attempts", [])) > 1:
        t.violation(f"restarted after {target} SIG{sig} during {t.phase}")


def _send(t: Trial, la: Launch, target: str, sig: str, guardian: int | None) -> None:
    """Signal ttmesh (SIG``sig``) or SIGKILL its ``guardian``; what the launch must end with."""
    if target == "guardian":
        if guardian is None or not kill(guardian, signal.SIGKILL):
            raise Missed("the guardian was gone")
        la.expect = Expect({137}, (SUPERVISOR_KILLED,))
        return
    kill(la.pid, SIGNALS[sig])
    if sig != "KILL":
        la.expect = Expect({128 + SIGNALS[sig]}, (STOP_STATUS[sig],))
        return
    la.wait()
    # Alive once ttmesh is gone: it can't hand its verdict over, it finishes the job. (One
    # that had just handed it over ends at once, the job unfinished: nobody is left, as when
    # ttmesh is killed in its own recovery.)
    if la.orphans():
        la.expect = Expect({137}, (LAUNCHER_KILLED,))
    else:  # nobody left to finish: the next ps closes the record
        la.expect = Expect({137}, (PS_KILLED,))
        if t.reset_ok is None:
            t.reset_ok = "ttmesh SIGKILLed while no guardian ran: nobody left to recover"


for _target, _sigs, _moments in (
    (
        "ttmesh",
        ("INT", "TERM", "KILL"),
        ("preflight", "startup", "running", "teardown", "end", "recovery"),
    ),
    ("guardian", ("KILL",), ("startup", "running", "teardown", "end")),
):
    for _sig in _sigs:
        for _moment in _moments:

            def _run(
                t: Trial, target: str = _target, sig: str = _sig, moment: str = _moment
            ) -> None:
                _signal_case(t, target, sig, moment)

            _run.__doc__ = f"SIG{_sig} to {_target} during {_moment}"
            case(f"{_target}-{_sig.lower()}@{_moment}", _target)(_run)


# -- the host ------------------------------------------------------------------------------


@case("reset-fails", "host")
def _reset_fails(t: Trial) -> None:
    """A fabric job crashes and the next N resets fail: retried (N <= 2), else given up."""
    t.create()
    times = t.rng.randint(1, 3)
    t.fault("reset-fails", "--times", str(times))
    opts, acts, n = fabric_shape(t)
    rank, code = t.rng.randrange(n), rank_code(t)
    la = t.launch("--grace", "1", *opts, worker=[*acts, f"fail-after={rank}:{t.rng.uniform(0.1, 0.5):.3f}:{code}"], n=n)  # fmt: skip
    la.expect = Expect({code}, (f"rank {rank} exited with code {code}",))
    if times > 2:  # ttmesh tries 3 times (--retries 2): all failed, by design left to the user
        t.reset_ok = "every reset ttmesh tried failed"
    t.faults += 2


@case("reset-fails-preflight", "host")
def _reset_fails_preflight(t: Trial) -> None:
    """Links down before the start, --auto-reset, the next N resets fail: runs, or refused 3."""
    t.create()
    times = t.rng.randint(1, 3)
    t.fault("link-down", t.bdfs[0], t.bdfs[1])
    t.fault("reset-fails", "--times", str(times))
    la = t.launch("--tp-size", "4", "--auto-reset", worker=["exit=0"])
    if times <= 2:
        la.expect = Expect({0}, ("every rank succeeded",))
    else:
        la.expect = Expect({3}, ("refused: pre-flight",))
        t.reset_ok = "the links were down before the job and every reset failed"
    t.faults += 2


@case("reset-renumbers", "host")
def _renumbers(t: Trial) -> None:
    """A fabric job crashes, the reset renumbers /dev/tenstorrent; a restart runs on them."""
    t.create()
    t.fault("reset-renumbers")
    before = _devs(t)
    code = rank_code(t)
    restart = t.rng.random() < 0.5
    la = t.launch("--grace", "1", "--tp-size", "4", "--max-restarts", "1" if restart else "0",
                  inline={"fail-attempts": "1", "code": str(code), "fabric": "1", "sleep": "0.3",
                          "fail-rank": str(t.rng.randrange(4))})  # fmt: skip
    la.expect = Expect({0}, ("every rank succeeded",)) if restart else Expect({code}, None)
    la.wait()
    if _devs(t) == before:
        t.violation("the reset did not renumber the chips (fault not hit)")
    t.faults += 2


def _devs(t: Trial) -> dict[str, str]:
    out = {}
    for link in (t.root / "sys" / "class" / "tenstorrent").iterdir():
        with contextlib.suppress(OSError):
            out[link.name] = os.readlink(link)
    return out


@case("race", "host")
def _race(t: Trial) -> None:
    """Two jobs race for the same 4 chips: one runs (0), the other is refused (3)."""
    t.create()
    go = t.out / "go"  # the winner's workers wait for it: the loser can't find the chips free
    a = t.launch("--tp-size", "4", inline={"wait-file": str(go), "sleep": "0"}, name="a")
    t.sleep(0, 0.3)
    b = t.launch("--tp-size", "4", inline={"wait-file": str(go), "sleep": "0"}, name="b")
    for la in (a, b):
        la.expect = Expect({0, 3}, ("every rank succeeded", "refused"), record=False)
    t.faults += 1
    try:
        t.until("one job to end", lambda: a.proc.poll() is not None or b.proc.poll() is not None)
    except Missed:
        t.violation("both jobs run on the same chips")
    go.write_text("go")
    codes = sorted(la.wait() for la in (a, b))
    if codes != [0, 3]:
        t.violation(f"exit codes {codes}, expected one 0 and one 3")
    for la in (a, b):
        if la.code == 0 and not la.record_exists():
            t.violation(f"{la.job} ran without a job record")


@case("held-at-reset", "host")
def _held(t: Trial) -> None:
    """A process holds a chip of a fabric job when it crashes: the reset refuses, code kept."""
    t.create()
    code = rank_code(t)
    crash = t.out / "crash"
    n = 4
    fabric = {"fabric": "1"}
    opts = ["--tp-size", "4"]
    if t.rng.random() < 0.3:
        opts += ["--mesh-layout", "single-process"]
        n, fabric = 1, {}
    rank = t.rng.randrange(n)
    la = t.launch("--grace", "1", *opts, n=n,
                  inline={**fabric, "crash-file": str(crash), "crash-rank": str(rank),
                          "code": str(code)})  # fmt: skip
    t.until("every worker", lambda: la.started_workers() == n)
    t.fault("hold", t.rng.choice(t.bdfs))
    t.sleep(0, 0.3)
    crash.write_text("now")
    la.expect = Expect({code}, (f"rank {rank} exited with code {code}",))
    t.reset_ok = "a foreign process held a chip, which ttmesh never stops: stopped by hand"
    t.faults += 2
    la.wait()
    if "reset refused" not in la.err.read_text():
        t.violation("the reset was not refused although a foreign process held a chip")
    if not all(alive(pid) for pid in t.holds):
        t.violation("ttmesh stopped a foreign process that held a chip")


# -- MPI-started ranks ---------------------------------------------------------------------


def _mpi(t: Trial) -> tuple[list[str], int]:
    t.create()
    return ["--grace", "1", "--tp-size", "4", "--mesh-layout", "mesh"], 4


@case("mpi-rank-crash", "mpi", needs="mpirun")
def _mpi_crash(t: Trial) -> None:
    """--mesh-layout mesh under mpirun: a rank exits with an error code: that code."""
    opts, n = _mpi(t)
    rank, code = t.rng.randrange(n), rank_code(t)
    la = t.launch(*opts, worker=[f"fail-after={rank}:{t.rng.uniform(0.1, 1.0):.3f}:{code}"])
    la.expect = Expect({code}, None)
    t.faults += 1


@case("mpi-rank-sigkill", "mpi", needs="mpirun")
def _mpi_sigkill(t: Trial) -> None:
    """--mesh-layout mesh under mpirun: a rank is SIGKILLed: 137."""
    opts, n = _mpi(t)
    la = t.launch(*opts)
    t.until("every worker", lambda: la.started_workers() == n)
    t.sleep(0, 0.5)
    _rank, pid = t.rng.choice(sorted(la.workers().items()))
    kill(pid, signal.SIGKILL)
    t.hit("running")
    la.expect = Expect({137}, None)
    t.faults += 1


def _mpi_signal(t: Trial, target: str, sig: str) -> None:
    opts, n = _mpi(t)
    la = t.launch(*opts)
    moment = t.rng.choice(["startup", "running"])
    if moment == "startup":  # mpirun takes a while to start its ranks
        t.until("the guardian", la.guardian)
        t.sleep(0, 0.6)
        t.hit("startup" if la.started_workers() < n else "running")
    else:
        _aim(t, la, "running", n, None)
    _send(t, la, target, sig, la.guardian())
    t.faults += 1


for _target, _sig in (
    ("ttmesh", "INT"),
    ("ttmesh", "TERM"),
    ("ttmesh", "KILL"),
    ("guardian", "KILL"),
):

    def _mpi_run(t: Trial, target: str = _target, sig: str = _sig) -> None:
        _mpi_signal(t, target, sig)

    _mpi_run.__doc__ = f"--mesh-layout mesh under mpirun: SIG{_sig} to {_target}"
    case(f"mpi-{_target}-{_sig.lower()}", "mpi", needs="mpirun")(_mpi_run)


# -- over emulated hosts: one mesh over two T3Ks ------------------------------------------


def emuhosts_why() -> str | None:
    """Why hosts cannot be emulated here (None: they can)."""
    import emuhosts

    return emuhosts.can_emulate() or (None if shutil.which("mpirun") else "needs mpirun")


def _host_of(pid: int, t: Trial) -> int | None:
    """The index of the emulated host ``pid`` runs on (its TTMESH_ROOT), None: this machine."""
    for entry in environ(pid):
        if entry.startswith(b"TTMESH_ROOT="):
            root = entry.split(b"=", 1)[1].decode(errors="replace")
            for i, h in enumerate(t.hosts):
                if root == str(h.root):
                    return i
    return None


def _agents(la: Launch) -> dict[int, int]:
    """host index -> pid of the job's ttmesh there (``ttmesh _rank``, the rank's parent)."""
    found = {}
    for pid, cmd in marked([f"TTMESH_JOB_ID={la.job}"]).items():
        if " -m ttmesh _rank" in f" {cmd}":
            host = _host_of(pid, la.trial)
            if host is not None:
                found[host] = pid
    return found


def _hosts_kill(t: Trial, target: str) -> None:
    """A mesh over two emulated T3Ks (one rank per host, all 16 chips, the fabric open on
    every host): SIGKILL of ``target`` (``agent`` or ``rank``) on a random host at a random
    moment of the first attempt. The job must restart and end 0 (attempt 2 exits at once);
    after it every cable is up from both ends, and nothing of it is left."""
    t.create_hosts()
    host = t.rng.randrange(len(t.hosts))
    moment = t.rng.choice(["startup", "running"])
    la = t.launch("--grace", "1", "--mesh-layout", "mesh", "--nproc-per-node", "1",
                  "--tp-size", "16", "--max-restarts", "1",
                  inline={"sleep0": "60", "sleep": "0.2"}, n=2)  # fmt: skip

    def pid_of() -> int | None:
        if target == "agent":
            return _agents(la).get(host)
        pids = {r: p for r, p in la.workers().items() if _host_of(p, t) == host}
        return next(iter(pids.values()), None)

    if moment == "startup":  # as soon as it is there: the agent still does its host's duties
        pid = t.until(f"the {target} on host {host}", pid_of, timeout=60, poll=0.002)
        t.sleep(0, 0.05)
        t.hit("startup" if la.started_workers() < la.n else "running")
    else:
        t.until("every worker", lambda: la.started_workers() == la.n, timeout=60)
        t.sleep(0, 1.0)
        pid = pid_of()
        if pid is None:
            raise Missed(f"the {target} on host {host} was gone")
        t.hit("running")
    if not kill(int(pid), signal.SIGKILL):  # type: ignore[arg-type]
        raise Missed(f"the {target} on host {host} was gone")
    la.expect = Expect({0}, None)
    t.faults += 1
    t.note(f"on host {host}")
    la.wait(LAUNCH_TIMEOUT + 60)


for _target in ("agent", "rank"):

    def _hosts_run(t: Trial, target: str = _target) -> None:
        _hosts_kill(t, target)

    _hosts_run.__doc__ = f"over two emulated T3Ks: SIGKILL of the {_target} on either host"
    case(f"hosts-{_target}-sigkill", "hosts", needs="mpirun")(_hosts_run)


# =========================================================================== the matrix


@dataclass
class Outcome:
    case: str
    index: int
    ok: bool
    violations: list[str]
    notes: list[str]
    phase: str | None
    faults: int
    seconds: float
    missed: str | None = None
    skipped: str | None = None
    logs: list[str] = field(default_factory=list)  # ttmesh's stderr, for a violation


def run_one(c: Case, index: int, seed: str, base: Path) -> Outcome:
    t0 = time.monotonic()
    if c.needs and shutil.which(c.needs) is None:
        return Outcome(c.name, index, True, [], [], None, 0, 0.0, skipped=f"{c.needs} not found")
    if c.group == "hosts":
        why = emuhosts_why()
        if why is not None:
            return Outcome(c.name, index, True, [], [], None, 0, 0.0, skipped=why)
    t = Trial(c, index, seed, base)
    missed = None
    try:
        try:
            c.run(t)
        except Missed as exc:
            missed = str(exc)
            t.phase = None
            for la in t.launches:
                la.expect = None
                # No fault reached it: a job whose workers wait for one would run until the
                # launch timeout. Stop it as a user does; the checks below still hold.
                if la.proc.poll() is None:
                    kill(la.pid, signal.SIGTERM)
        t.check()
    except Exception as exc:  # the harness itself failed: say so, as a violation
        t.violation(f"harness error: {type(exc).__name__}: {exc}")
    logs = []
    if t.violations:
        for la in t.launches:
            with contextlib.suppress(OSError):
                logs.append(f"--- {la.job} (exit {la.code}):")
                logs.extend(la.err.read_text(errors="replace").splitlines()[-40:])
    t.cleanup()
    faults = 0 if missed else t.faults
    return Outcome(
        c.name, index, not t.violations, t.violations, t.notes, t.phase, faults,
        time.monotonic() - t0, missed, logs=logs,
    )  # fmt: skip


def table(outcomes: list[Outcome], cases: list[Case]) -> str:
    head = ["case", "runs", "ok", "violations", "missed", "faults", "moment hit", "notes"]
    rows = []
    for c in cases:
        mine = [o for o in outcomes if o.case == c.name]
        if not mine:
            continue
        if mine[0].skipped:
            rows.append([c.name, "0", "-", "-", "-", "0", "-", f"skipped: {mine[0].skipped}"])
            continue
        hits: dict[str, int] = {}
        notes: dict[str, int] = {}
        for o in mine:
            if o.phase:
                hits[o.phase] = hits.get(o.phase, 0) + 1
            for n in set(o.notes):
                notes[n] = notes.get(n, 0) + 1
        rows.append(
            [
                c.name,
                str(len(mine)),
                str(sum(o.ok for o in mine)),
                str(sum(not o.ok for o in mine)),
                str(sum(o.missed is not None for o in mine)),
                str(sum(o.faults for o in mine)),
                ", ".join(f"{k} {v}" for k, v in sorted(hits.items())) or "-",
                "; ".join(f"{k} x{v}" for k, v in sorted(notes.items())) or "-",
            ]
        )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def scratch_base() -> Path:
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return Path(tempfile.mkdtemp(prefix="ttmesh-chaos-", dir=parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )  # fmt: skip
    parser.add_argument("--repeat", type=int, metavar="K", help="runs per case (default 10)")
    parser.add_argument("--quick", action="store_true", help="the short matrix: --repeat 2")
    parser.add_argument("--seed", help="replay the same random timing (default: a new seed)")
    parser.add_argument("--jobs", type=int, default=3, metavar="N", help="runs at once (3)")
    parser.add_argument("--cases", nargs="+", metavar="PATTERN", help="only these (fnmatch)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--json", metavar="FILE", help="write every outcome to FILE")
    parser.add_argument("-q", "--quiet", action="store_true", help="no line per run")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show ttmesh's stderr of a violation"
    )
    args = parser.parse_args(argv)
    cases = [
        c for c in CASES if not args.cases or any(fnmatch.fnmatch(c.name, p) for p in args.cases)
    ]
    if args.list:
        for c in cases:
            print(f"{c.name:24} {c.group:9} {c.doc}")
        return 0
    if not cases:
        parser.error("no case matches --cases")
    repeat = args.repeat if args.repeat is not None else 2 if args.quick else 10
    if repeat < 1 or args.jobs < 1:
        parser.error("--repeat and --jobs must be positive")
    seed = args.seed if args.seed is not None else str(random.SystemRandom().randrange(10**6))
    try:
        import ttmesh  # noqa: F401
    except ImportError:
        parser.error("ttmesh is not importable by this Python: run it with the venv's python")
    # Started in the background (nohup, `&` in a script) SIGINT is ignored, and an ignored
    # signal stays ignored across exec: ttmesh would inherit that and never see our SIGINTs.
    # A handled signal is reset to its default in a child.
    for sig in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler)
    base = scratch_base()
    work = [(c, i) for i in range(repeat) for c in cases]
    print(f"chaos: {len(cases)} case(s) x {repeat}, seed {seed}, {args.jobs} at once, in {base}",
          file=sys.stderr, flush=True)  # fmt: skip
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    t0 = time.monotonic()

    def one(item: tuple[Case, int]) -> Outcome:
        o = run_one(item[0], item[1], seed, base)
        with lock:
            outcomes.append(o)
            if not args.quiet:
                what = (
                    "skipped" if o.skipped else "missed: " + o.missed if o.missed
                    else "ok" if o.ok else "VIOLATION: " + "; ".join(o.violations)
                )  # fmt: skip
                where = f" [{o.phase}]" if o.phase else ""
                print(f"[{len(outcomes)}/{len(work)}] {o.case} #{o.index}{where} {o.seconds:.1f}s: {what}",
                      file=sys.stderr, flush=True)  # fmt: skip
        return o

    pool = ThreadPoolExecutor(args.jobs)
    try:
        for future in [pool.submit(one, item) for item in work]:
            future.result()
    except KeyboardInterrupt:
        print("chaos: interrupted; stopping what it started", file=sys.stderr)
        pool.shutdown(wait=False, cancel_futures=True)
        for pid in marked([f"TTMESH_CHAOS_SESSION={SESSION}"]):
            kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
        return 130
    pool.shutdown()
    shutil.rmtree(base, ignore_errors=True)
    elapsed = time.monotonic() - t0
    bad = [o for o in outcomes if not o.ok]
    faults = sum(o.faults for o in outcomes)
    print(table(outcomes, cases))
    print(
        f"\n{len(outcomes)} run(s), {faults} fault(s), {len(bad)} violation(s), "
        f"{sum(o.missed is not None for o in outcomes)} missed, seed {seed}, {elapsed:.0f} s"
    )
    for o in sorted(bad, key=lambda o: (o.case, o.index)):
        print(f"VIOLATION {o.case} #{o.index} [{o.phase or '-'}]: " + "; ".join(o.violations))
        print(f"  replay: scripts/chaos.py --seed {seed} --cases '{o.case}' --repeat {o.index + 1}")
        if args.verbose:
            print("\n".join("    " + line for line in o.logs))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"seed": seed, "repeat": repeat, "seconds": elapsed,
                        "outcomes": [o.__dict__ for o in outcomes]}, indent=1) + "\n"
        )  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
