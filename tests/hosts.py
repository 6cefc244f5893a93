"""Emulated hosts on one machine, for multi-host tests (../shared/reference/multihost.md).

Each host has its own hostname (a UTS namespace), its own /tmp (a mount namespace with a private
directory bound over it: runtime files, mpirun's session directory), its own simulated root
(TTMESH_ROOT) and its own loopback address (127.0.0.N, routed to ``lo`` already: no traffic
leaves the machine). A process "on" a host is started through ``unshare``; mpirun reaches a host
through a launch agent that enters the same namespaces instead of ssh.

Open MPI never uses a loopback address between two nodes, so MPI ranks on different emulated
hosts cannot talk over ``lo``. For tt-metal meshes over hosts (ranks that talk through MPI) the
hosts get a network of their own (:class:`Network`): one network namespace per host, its
``eth0`` cabled by a veth pair into a bridge in a namespace of the launcher (10.77.0.1); host N is
10.77.0.(2+N). Every namespace is the test's own, and removed at the end. ttnn's ranks also
need Open MPI 5's mpirun there (its wheel carries Open MPI 5's library; under 4.1's mpirun ranks
on different hosts never meet): tests/test_conformance_meshhosts.py.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from conftest import REPO, SESSION


def can_emulate() -> str | None:
    """None when hosts can be emulated here, else why not."""
    if os.geteuid() != 0:
        return "emulating hosts needs root (namespaces)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    probe = subprocess.run(
        ["unshare", "--uts", "--mount", "--propagation", "private", "true"], capture_output=True
    )
    if probe.returncode != 0:
        return f"unshare is not allowed here: {probe.stderr.decode().strip()}"
    return None


def can_network() -> str | None:
    """None when test networks (network namespaces, veth, bridges) can be made here."""
    why = can_emulate()
    if why is not None:
        return why
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "a test network needs ip (iproute2) and nsenter"
    net = Network(f"ttmprobe{os.getpid()}", 1)
    try:
        net.up()
    except subprocess.CalledProcessError as exc:
        return f"cannot make a test network here: {(exc.stderr or b'').decode().strip()}"
    finally:
        net.down()
    return None


@dataclass
class Network:
    """A bridge in a launcher namespace and one namespace per host cabled to it."""

    tag: str
    count: int
    subnet: str = "10.77.0"
    made: list[str] = field(default_factory=list)

    @property
    def launcher(self) -> str:
        return f"{self.tag}-l"

    def host_ns(self, i: int) -> str:
        return f"{self.tag}-h{i}"

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{2 + i}"

    @property
    def cidr(self) -> str:
        return f"{self.subnet}.0/24"

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def up(self) -> None:
        """Every namespace and link exists, with its address and routes, before any traffic."""
        c = self.launcher
        self._ip("netns", "add", c)
        self.made.append(c)
        self._ip("-n", c, "link", "set", "lo", "up")
        self._ip("-n", c, "link", "add", "br0", "type", "bridge")
        self._ip("-n", c, "addr", "add", f"{self.subnet}.1/24", "dev", "br0")
        self._ip("-n", c, "link", "set", "br0", "up")
        for i in range(self.count):
            h = self.host_ns(i)
            self._ip("netns", "add", h)
            self.made.append(h)
            self._ip("-n", h, "link", "set", "lo", "up")
            self._ip("-n", c, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0",
                     "netns", h)  # fmt: skip
            self._ip("-n", c, "link", "set", f"v{i}", "master", "br0")
            self._ip("-n", c, "link", "set", f"v{i}", "up")
            self._ip("-n", h, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            self._ip("-n", h, "link", "set", "eth0", "up")

    def down(self) -> None:
        for name in reversed(self.made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self.made.clear()

    def enter(self, ns: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{ns}"]


@dataclass
class Host:
    name: str
    addr: str
    dir: Path
    netns: str | None = None  # its network namespace, on a test network

    @property
    def root(self) -> Path:
        return self.dir / "root"

    def env(self) -> dict[str, str]:
        return {
            "TTMESH_ROOT": str(self.root),
            "XDG_RUNTIME_DIR": "/tmp/run",
            "GLOO_SOCKET_IFNAME": "lo",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TTMESH_TEST_SESSION": SESSION,
        }

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` as a process on this host."""
        script = (
            f"hostname {shlex.quote(self.name)} && mount --bind {shlex.quote(str(self.dir / 'tmp'))} /tmp "
            '&& mkdir -p -m 700 /tmp/run && exec "$@"'
        )
        enter = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        return [
            *enter,
            "unshare",
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            *argv,
        ]

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
    already) each host is on it, at its own address."""
    from ttmesh.sim.create import create
    from ttmesh.sim.system import ClusterModel, load_any

    model = load_any(system)
    models = (
        [model.host(i) for i in range(len(model.hosts))]
        if isinstance(model, ClusterModel)
        else [model] * (count or 1)
    )
    hosts = []
    for i, m in enumerate(models):
        host = Host(f"ttmh-{i}", f"127.0.0.{2 + i}", base / f"host{i}")
        if net is not None:
            host.addr, host.netns = net.addr(i), net.host_ns(i)
        (host.dir / "tmp").mkdir(parents=True)
        (host.dir / "tmp").chmod(0o1777)
        create(m, host.root, config={"reset_seconds": 0.0})
        hosts.append(host)
    return hosts


def launch_agent(base: Path, hosts: list[Host]) -> Path:
    """mpirun's launch agent (instead of ssh): ``AGENT [options] HOST COMMAND...`` runs COMMAND
    on that emulated host. Like ssh, it starts COMMAND in a directory of that host (``/``), not
    in mpirun's: a directory under the launcher's /tmp is hidden there by the host's own /tmp,
    and Open MPI 5's daemon dies when its working directory is one it cannot reach ("PRTE has
    lost communication with a remote daemon"); 4.x's did not mind."""
    table = "\n".join(
        f"  {h.name}) dir={shlex.quote(str(h.dir))}; enter="
        + (shlex.quote(f"nsenter --net=/run/netns/{h.netns}") if h.netns else "''")
        + " ;;"
        for h in hosts
    )
    agent = base / "agent"
    agent.write_text(
        "#!/bin/bash\n"
        'while [[ "$1" == -* ]]; do shift; done\n'
        'host="$1"; shift\n'
        f'case "$host" in\n{table}\n  *) echo "no emulated host $host" >&2; exit 1 ;;\nesac\n'
        'export TTMESH_ROOT="$dir/root" XDG_RUNTIME_DIR=/tmp/run GLOO_SOCKET_IFNAME=lo\n'
        "exec $enter unshare --uts --mount --propagation private sh -c "
        '"hostname $host && mount --bind $dir/tmp /tmp && mkdir -p -m 700 /tmp/run && cd / '
        '&& exec sh -c \\"\\$0\\"" "$*"\n'
    )
    agent.chmod(0o755)
    return agent


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
