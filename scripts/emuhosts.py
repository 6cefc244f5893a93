"""Emulated hosts on one machine, for scripts and the test suite (tests/hosts.py builds on this;
../shared/reference/multihost.md, "Emulating hosts on one machine").

A process "on" an emulated host is started through ``unshare`` (:meth:`Host.wrap`, also what the
tests' mpirun launch agent and Slurm daemons run): its own hostname (a UTS namespace) and its own
mount namespace, where the host's directory is bound over /tmp (runtime files: ttmesh's, mpirun's
session directory, slurmd's spool) and, for hosts made by :func:`make_hosts` here, its own
/etc/hosts and /etc/resolv.conf over the machine's: every emulated host's name resolves to its
address, and name look-ups never leave the machine (the nameserver is the host's own loopback,
where nothing answers). Its simulated root is ``TTMESH_ROOT``.

What the hosts share, as a real cluster's hosts share an NFS home: every path outside the
machine's /tmp, and the directories of :attr:`Host.shares` under it (this checkout, the Python
running, the caches the tests hand to hosts, the hosts' common directory), bound back into the
host's /tmp at the same path. A checkout and its venv in /tmp (where CI runners and people put
clones) are therefore found on every host, while each host's own /tmp stays its own. The other
hosts' /tmp directories are hidden (an empty read-only tmpfs over each), so no host sees another's
runtime files by any path.

Addresses: with a :class:`Network` (preferred) every host has a network namespace of its own,
its ``eth0`` cabled by a veth pair into a bridge in a namespace of the script (10.77.0.1); host
N is 10.77.0.(2+N). Without one, host N is 127.0.0.(2+N) on this machine's loopback. Only
namespaces and links made here are touched, every address and route exists before any traffic,
and :meth:`Network.down` removes it all.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


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
    """None when a network of emulated hosts (network namespaces, veth, a bridge) can be made."""
    why = can_emulate()
    if why is not None:
        return why
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "a network of hosts needs ip (iproute2) and nsenter"
    net = Network(f"ttmbp{os.getpid() % 100000}", 1)
    try:
        net.up()
    except subprocess.CalledProcessError as exc:
        return f"cannot make a network of hosts here: {(exc.stderr or b'').decode().strip()}"
    finally:
        net.down()
    return None


@dataclass
class Network:
    """A bridge in a namespace of the script and one namespace per host cabled to it."""

    tag: str  # every namespace's name starts with it: unique to the caller
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

    def enter(self, ns: str) -> list[str]:
        """A command prefix that runs in namespace ``ns`` of this network."""
        return ["nsenter", f"--net=/run/netns/{ns}"]

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

    def down(self) -> list[str]:
        """Removes every namespace made (their links go with them); returns those that failed."""
        failed = []
        for name in reversed(self.made):
            res = subprocess.run(["ip", "netns", "del", name], capture_output=True)
            if res.returncode != 0 and Path("/run/netns", name).exists():
                failed.append(name)
        self.made.clear()
        return failed


REPO = Path(__file__).resolve().parent.parent


def default_shares() -> list[Path]:
    """What every host must see wherever it lies: this checkout, the Python running (its venv,
    the installation it was made from), and the caches of the real libraries the tests give
    hosts (SGLang's, the conformance cache with ttnn and Open MPI 5), at their own variables or
    their defaults. Those outside the machine's /tmp are seen anyway; missing ones are skipped."""
    home = Path.home()
    paths = [
        REPO,
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(sys.executable).resolve().parent,
        Path(os.environ.get("TTMESH_SGLANG_DIR") or home / ".cache" / "ttmesh-sglang"),
        Path(os.environ.get("TTMESH_CONFORMANCE_CACHE") or home / ".cache" / "ttmesh-conformance"),
    ]
    return paths


def under_tmp(paths: Iterable[Path]) -> list[str]:
    """The real paths among ``paths`` that lie under the machine's /tmp (a host's /tmp hides
    them), outermost only: one bind shows everything below it."""
    tmp = os.path.realpath("/tmp")
    found = sorted(
        {
            real
            for real in (os.path.realpath(p) for p in paths)
            if real != tmp and real.startswith(tmp + os.sep)
        }
    )
    return [p for p in found if not any(p.startswith(q + os.sep) for q in found if q != p)]


@dataclass
class Host:
    name: str
    addr: str
    dir: Path
    netns: str | None = None  # its network namespace, on a Network
    shares: tuple[Path, ...] = ()  # directories it sees though they lie under /tmp
    hidden: tuple[Path, ...] = ()  # the other hosts' /tmp directories
    etc: bool = False  # its own /etc/hosts and /etc/resolv.conf (in dir/etc)

    @property
    def root(self) -> Path:
        return self.dir / "root"

    def env(self) -> dict[str, str]:
        return {"TTMESH_ROOT": str(self.root), "XDG_RUNTIME_DIR": "/tmp/run"}

    def binds(self) -> list[tuple[str, str]]:
        """(shared directory under /tmp, its mount point inside the host's own /tmp dir)."""
        tmp, real_tmp = str(self.dir / "tmp"), os.path.realpath("/tmp")
        return [(path, tmp + path[len(real_tmp) :]) for path in under_tmp(self.shares)]

    def prepare(self) -> None:
        """The mount points of :meth:`binds`, made before any process runs on the host, by
        this process: directories it owns (0755), in a /tmp everyone may write, so no
        process on the host can plant a link where a later bind would follow it."""
        for _, inner in self.binds():
            os.makedirs(inner, mode=0o755, exist_ok=True)

    def enter_script(self) -> str:
        """The shell commands, run in the host's fresh mount namespace, that make its view:
        each shared directory under /tmp is bound onto the same path inside the host's own
        /tmp directory first (on the mount points :meth:`prepare` made), then that directory,
        with those mounts, over /tmp (``--rbind``); the other hosts' /tmp directories under
        empty read-only tmpfs. Binding the machine's whole /tmp through instead would show
        every host every other host's runtime files."""
        q = shlex.quote
        tmp = self.dir / "tmp"
        steps = [f"hostname {q(self.name)}"]
        for path, inner in self.binds():  # a share not made (yet) is left out
            steps.append(f"{{ [ ! -d {q(path)} ] || mount --bind {q(path)} {q(inner)}; }}")
        steps.append(f"mount --rbind {q(str(tmp))} /tmp")
        for other in self.hidden:
            steps.append(f"{{ [ ! -d {q(str(other))} ] || mount -t tmpfs -o ro,size=4k,mode=0"
                         f" ttmesh-other-host {q(str(other))}; }}")  # fmt: skip
        if self.etc:
            steps.append(f"mount --bind {q(str(self.dir / 'etc' / 'hosts'))} /etc/hosts")
            steps.append(
                f"mount --bind {q(str(self.dir / 'etc' / 'resolv.conf'))} /etc/resolv.conf"
            )
        steps.append("mkdir -p -m 700 /tmp/run")
        return " && ".join(steps)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` as a process on this host."""
        enter = ["nsenter", f"--net=/run/netns/{self.netns}"] if self.netns else []
        return [*enter, "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", self.enter_script() + ' && exec "$@"', "sh", *argv]  # fmt: skip


def plan_hosts(
    base: Path, count: int, net: Network | None = None, share: Iterable[Path] = ()
) -> list[Host]:
    """``count`` hosts under ``base`` (each its directory ``base/hostN`` and its /tmp there),
    each seeing :func:`default_shares`, ``base`` and ``share``, none another's /tmp. With
    ``net`` (up already) each host is on it."""
    shares = (*default_shares(), base, *share)
    hosts = []
    for i in range(count):
        host = Host(f"ttmh-{i}", f"127.0.0.{2 + i}", base / f"host{i}", shares=shares)
        if net is not None:
            host.addr, host.netns = net.addr(i), net.host_ns(i)
        hosts.append(host)
    for host in hosts:
        host.hidden = tuple(h.dir / "tmp" for h in hosts if h is not host)
        (host.dir / "tmp").mkdir(parents=True)
        (host.dir / "tmp").chmod(0o1777)
        host.prepare()
    return hosts


def make_hosts(
    base: Path, count: int, net: Network | None = None, share: Iterable[Path] = ()
) -> list[Host]:
    """``count`` hosts under ``base`` (:func:`plan_hosts`), each with its own /etc files (the
    simulated root, ``Host.root``, is the caller's to make)."""
    hosts = plan_hosts(base, count, net, share)
    names = "".join(f"{h.addr} {h.name}\n" for h in hosts)
    for host in hosts:
        host.etc = True
        (host.dir / "etc").mkdir()
        (host.dir / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
        (host.dir / "etc" / "resolv.conf").write_text(
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
        )
    return hosts


def write_agent(agent: Path, hosts: Iterable[Host]) -> Path:
    """mpirun's launch agent (instead of ssh) at ``agent``: ``AGENT [options] HOST COMMAND...``
    runs COMMAND on that emulated host, entered as :meth:`Host.wrap` enters it, with its
    environment (each host's ``env()``). Like ssh, it starts COMMAND in a directory of that host
    (``/``), not in mpirun's (tests/hosts.py ``launch_agent`` says why)."""
    run = 'cd / && exec sh -c "$0"'  # COMMAND, as ssh hands it to the remote shell
    table = "\n".join(
        f"  {shlex.quote(h.name)}) exec env "
        + " ".join(shlex.quote(f"{k}={v}") for k, v in h.env().items())
        + " "
        + shlex.join(h.wrap(["sh", "-c", run]))
        + ' "$*" ;;'
        for h in hosts
    )
    agent.write_text(
        "#!/bin/bash\n"
        'while [[ "$1" == -* ]]; do shift; done\n'
        'host="$1"; shift\n'
        f'case "$host" in\n{table}\n  *) echo "no emulated host $host" >&2; exit 1 ;;\nesac\n'
    )
    agent.chmod(0o755)
    return agent
