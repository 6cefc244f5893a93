"""Emulated hosts on one machine, for multi-host tests (../shared/reference/multihost.md).

Each host has its own hostname (a UTS namespace), its own /tmp (a mount namespace with a private
directory bound over it: runtime files, mpirun's session directory; the checkout, the venv and
the hosts' common directory bound back in at their own paths when they lie under /tmp), its own
simulated root (TTMESH_ROOT) and its own loopback address (127.0.0.N, routed to ``lo`` already:
no traffic leaves the machine). A process "on" a host is started through ``unshare``
(scripts/emuhosts.py, the one copy of how); mpirun reaches a host through a launch agent that
enters the same namespaces instead of ssh.

Open MPI never uses a loopback address between two nodes, so MPI ranks on different emulated
hosts cannot talk over ``lo``. For tt-metal meshes over hosts (ranks that talk through MPI) the
hosts get a network of their own (:class:`Network`): one network namespace per host, its
``eth0`` cabled by a veth pair into a bridge in a namespace of the launcher (10.77.0.1); host N is
10.77.0.(2+N). Every namespace is the test's own, and removed at the end. ttnn's ranks also
need Open MPI 5's mpirun there (its wheel carries Open MPI 5's library; under 4.1's mpirun ranks
on different hosts never meet): tests/test_conformance_meshhosts.py.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import REPO, SESSION

# The namespace mechanics are the benchmark's (scripts/emuhosts.py): one copy for both.
sys.path.append(str(REPO / "scripts"))
import emuhosts
from emuhosts import Network, can_emulate, can_network  # re-exported for the tests

__all__ = [
    "Host",
    "Network",
    "SlurmCluster",
    "can_emulate",
    "can_network",
    "can_slurm",
    "launch_agent",
    "make_hosts",
    "mpi_env",
]


@dataclass
class Host(emuhosts.Host):
    """An emulated host (scripts/emuhosts.py: what it sees, how a process gets onto it), with
    the test session's environment and ways to start processes there."""

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TTMESH_TEST_SESSION": SESSION,
        }

    def popen(
        self, argv: list[str], env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen:
        return subprocess.Popen(
            self.wrap(argv),
            env={**os.environ, **self.env(), **(env or {})},
            text=True,
            **kw,  # type: ignore[arg-type]
        )

    def ttmesh(
        self, *args: str, env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen:
        return self.popen([sys.executable, "-m", "ttmesh", *args], env, **kw)


def make_hosts(
    base: Path, system: str, count: int | None = None, net: Network | None = None
) -> list[Host]:
    """``count`` hosts of a single-host system, or every host of a system of several hosts
    (host N simulated as its host N: its own chips, its cables to the others). With ``net`` (made
    already) each host is on it, at its own address. Every host sees ``base`` (the hosts'
    common directory: their roots, the launch agent, what a test hands them), this checkout and
    the Python running, wherever they lie (scripts/emuhosts.py)."""
    from ttmesh.sim.create import create
    from ttmesh.sim.system import ClusterModel, load_any

    model = load_any(system)
    models = (
        [model.host(i) for i in range(len(model.hosts))]
        if isinstance(model, ClusterModel)
        else [model] * (count or 1)
    )
    hosts = [Host(**vars(h)) for h in emuhosts.plan_hosts(base, len(models), net)]
    for host, m in zip(hosts, models, strict=True):
        create(m, host.root, config={"reset_seconds": 0.0, **CABLES}, cables=cables_dir(base, m))
    return hosts


# The hosts' cables train in CABLES' time (not a Wormhole's 90 s) when both ends are reset
# within its window: one mpirun's fan-out resets them nearly at once, on a loaded machine
# seconds apart at most.
CABLES = {"cable_train_seconds": 0.3, "cable_window": 20.0}


def cables_dir(base: Path, model: Any) -> Path | None:
    """Where the hosts of a multi-host system share their cables: in ``base``, which every
    host sees (None: a single-host system, no cables)."""
    return base / f"{model.name}.cables" if model.system_cables else None


def launch_agent(base: Path, hosts: list[Host]) -> Path:
    """mpirun's launch agent (instead of ssh): ``AGENT [options] HOST COMMAND...`` runs COMMAND
    on that emulated host, entered as :meth:`Host.wrap` enters it, with its environment. Like
    ssh, it starts COMMAND in a directory of that host (``/``), not in mpirun's: a directory
    under the launcher's /tmp is hidden there by the host's own /tmp, and Open MPI 5's daemon
    dies when its working directory is one it cannot reach ("PRTE has lost communication with a
    remote daemon"); 4.x's did not mind."""
    return emuhosts.write_agent(base / "agent", hosts)


def mpi_env(agent: Path, net: Network | None = None) -> dict[str, str]:
    """mpirun reaches the emulated hosts through ``agent``, over loopback only; on a test
    network its daemons talk over that network, and the ranks' transport is left to the
    launcher (ttmesh's --tcp-interface)."""
    if net is not None:
        return {
            "OMPI_MCA_plm_rsh_agent": str(agent),
            "PRTE_MCA_plm_ssh_agent": str(agent),
            "OMPI_MCA_oob_tcp_if_include": net.cidr,
            "PRTE_MCA_oob_tcp_if_include": net.cidr,
            "PYTHONPATH": str(REPO),
        }
    return {
        "OMPI_MCA_plm_rsh_agent": str(agent),
        "PRTE_MCA_plm_ssh_agent": str(agent),
        "OMPI_MCA_oob_tcp_if_include": "lo",
        "OMPI_MCA_btl_tcp_if_include": "lo",
        "OMPI_MCA_btl": "self,tcp",
        "PYTHONPATH": str(REPO),
    }


SLURM_PROGRAMS = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "srun",
    "sinfo",
    "scontrol",
    "scancel",
)


def can_slurm() -> str | None:
    """None when a throwaway Slurm cluster can be tried here, else why not."""
    why = can_emulate()
    if why is not None:
        return why
    missing = [p for p in SLURM_PROGRAMS if shutil.which(p) is None]
    if missing:
        return f"needs {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


@dataclass
class SlurmCluster:
    """A throwaway Slurm cluster (Debian's slurm-wlm 22.05) over emulated hosts: munged and
    slurmctld on this machine, one slurmd on each host, inside its namespaces (its name, its
    /tmp with the slurmd's spool and log). Every node is reached at its host's loopback address
    (NodeAddr; DNS does not know the names), each slurmd on a port of its own. A TaskProlog gives
    each task its host's environment (TTMESH_ROOT, ...), as the launch agent does for mpirun.
    Everything else lives under ``dir``; ``down`` ends every process the cluster started."""

    dir: Path
    hosts: list[Host]
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)  # by name, in start order

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self) -> dict[str, str]:
        """This process's environment for this cluster's daemons and clients: its SLURM_CONF,
        and none of the SLURM_ variables of a job the tests may run in."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**env, "SLURM_CONF": str(self.conf)}

    def logs(self, lines: int = 6) -> str:
        """The tail of each daemon's log (what it printed, before it had a log file)."""
        logs = {"munged": self.dir / "munged.log", "slurmctld": self.dir / "slurmctld.log"}
        logs |= {f"slurmd-{h.name}": h.dir / "tmp" / "slurmd.log" for h in self.hosts}
        tails = []
        for name, log in logs.items():
            for path in (log, self.dir / f"{name}.out"):
                if path.exists() and path.stat().st_size:
                    tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
                    tails.append(f"{name}: " + " | ".join(tail))
                    break
        return "; ".join(tails) or "no daemon wrote a log"

    def _write_conf(self) -> None:
        prolog = self.dir / "taskprolog"
        cases = "".join(
            f"  {h.name})\n"
            + "".join(f"    echo export {k}={shlex.quote(v)}\n" for k, v in h.env().items())
            + "    ;;\n"
            for h in self.hosts
        )
        prolog.write_text(f'#!/bin/sh\ncase "$(hostname)" in\n{cases}esac\n')
        prolog.chmod(0o755)
        nodes = "".join(
            f"NodeName={h.name} NodeAddr={h.addr} Port={_free_port()} CPUs=2 State=UNKNOWN\n"
            for h in self.hosts
        )
        d = self.dir
        self.conf.write_text(
            f"ClusterName=ttmeshtest\nSlurmctldHost=ttmh-ctl(127.0.0.1)\n"
            f"SlurmctldPort={_free_port()}\nSlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={d}/munge/socket\n"
            f"StateSaveLocation={d}/state\nSlurmctldPidFile={d}/slurmctld.pid\n"
            f"SlurmctldLogFile={d}/slurmctld.log\n"
            # On each host's own /tmp (its slurmd's mount namespace): one spool per node.
            "SlurmdSpoolDir=/tmp/slurmd\nSlurmdPidFile=/tmp/slurmd.pid\n"
            "SlurmdLogFile=/tmp/slurmd.log\n"
            # No cgroups in this container: plain process tracking, no task binding.
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "JobAcctGatherType=jobacct_gather/none\nSelectType=select/linear\nMpiDefault=none\n"
            "MailProg=/bin/true\n"
            f"TaskProlog={prolog}\nReturnToService=2\nSlurmdParameters=config_overrides\n"
            "KillWait=2\n"
            f"{nodes}PartitionName=test Nodes={','.join(h.name for h in self.hosts)} "
            "Default=YES MaxTime=INFINITE State=UP\n"
        )

    def _start(self, name: str, argv: list[str]) -> None:
        with open(self.dir / f"{name}.out", "wb") as log:
            self.daemons[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env()
            )

    def _await(self, what: str, done, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while True:
            dead = [
                f"{n} exited {p.returncode}"
                for n, p in self.daemons.items()
                if p.poll() is not None
            ]
            if dead or time.monotonic() > deadline:
                how = ", ".join(dead) or f"not within {timeout:g} s"
                raise RuntimeError(f"Slurm did not come up ({what}: {how}): {self.logs()}")
            if done():
                return
            time.sleep(0.1)

    def _states(self) -> list[str]:
        try:  # sinfo retries a controller that is not up yet: ask again rather than wait
            res = subprocess.run(
                ["sinfo", "--noheader", "--Node", "--format=%N %T"],
                capture_output=True, text=True, env=self.env(), timeout=2,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return []
        return sorted(res.stdout.split()) if res.returncode == 0 else []

    def up(self, timeout: float = 30) -> None:
        """Every daemon started and every node idle; RuntimeError (with the logs) if not."""
        (self.dir / "munge").mkdir(mode=0o700, parents=True)
        (self.dir / "state").mkdir(mode=0o700)
        key = self.dir / "munge" / "key"
        subprocess.run(
            ["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True
        )
        m = self.dir / "munge"
        self._start(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={m}/socket", f"--key-file={key}",
             f"--pid-file={m}/pid", f"--seed-file={m}/seed", f"--log-file={self.dir}/munged.log"],
        )  # fmt: skip
        self._await("munged's socket", (m / "socket").exists, timeout)
        self._write_conf()
        self._start(
            "slurmctld",
            ["unshare", "--uts", "sh", "-c",
             'hostname ttmh-ctl && exec slurmctld -D -f "$0"', str(self.conf)],
        )  # fmt: skip
        for h in self.hosts:
            self._start(
                f"slurmd-{h.name}",
                h.wrap(["sh", "-c", 'mkdir -p /tmp/slurmd && exec slurmd -D -f "$0" -N "$1"',
                        str(self.conf), h.name]),
            )  # fmt: skip
        want = sorted([*(h.name for h in self.hosts), *["idle"] * len(self.hosts)])
        self._await("every node idle", lambda: self._states() == want, timeout)

    def _left(self) -> list[int]:
        """Processes started through this cluster (they have its SLURM_CONF), but not us."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if mark in environ and int(pid) != os.getpid():
                    found.append(int(pid))
        return found

    def down(self) -> None:
        """Cancel what still runs, stop the daemons, and end anything they left behind."""
        import signal
        import time

        env = self.env()
        ctld = self.daemons.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            subprocess.run(
                ["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=10
            )
        for proc in reversed(self.daemons.values()):  # slurmds, slurmctld, munged last
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # slurmstepd and its tasks outlive a slurmd: ours carry this cluster's SLURM_CONF.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._left():
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while self._left() and time.monotonic() < deadline:
                time.sleep(0.1)
        # A slurmstepd is orphaned by its slurmd; when the test process is a subreaper it
        # becomes ours to reap.
        for pid in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError, ValueError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                comm = stat[stat.index("(") + 1 : stat.rindex(")")]
                ppid = stat[stat.rindex(")") + 1 :].split()[1]
                if comm == "slurmstepd" and int(ppid) == os.getpid():
                    os.waitpid(int(pid), os.WNOHANG)
        self.daemons.clear()
