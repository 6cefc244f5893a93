"""Emulated hosts on one machine, for multi-host tests (../shared/reference/multihost.md).

Each host has its own hostname (a UTS namespace), its own /tmp (a mount namespace with a private
directory bound over it: runtime files, mpirun's session directory), its own simulated root
(TTMESH_ROOT) and its own loopback address (127.0.0.N, routed to ``lo`` already: no traffic
leaves the machine). A process "on" a host is started through ``unshare``; mpirun reaches a host
through a launch agent that enters the same namespaces instead of ssh.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
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


@dataclass
class Host:
    name: str
    addr: str
    dir: Path

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
        return [
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


def make_hosts(base: Path, system: str, count: int) -> list[Host]:
    from ttmesh.sim.create import create
    from ttmesh.sim.system import load

    hosts = []
    for i in range(count):
        host = Host(f"ttmh-{i}", f"127.0.0.{2 + i}", base / f"host{i}")
        (host.dir / "tmp").mkdir(parents=True)
        (host.dir / "tmp").chmod(0o1777)
        create(load(system), host.root, config={"reset_seconds": 0.0})
        hosts.append(host)
    return hosts


def launch_agent(base: Path, hosts: list[Host]) -> Path:
    """mpirun's launch agent (instead of ssh): ``AGENT [options] HOST COMMAND...`` runs COMMAND
    on that emulated host."""
    table = "\n".join(f"  {h.name}) dir={shlex.quote(str(h.dir))} ;;" for h in hosts)
    agent = base / "agent"
    agent.write_text(
        "#!/bin/bash\n"
        'while [[ "$1" == -* ]]; do shift; done\n'
        'host="$1"; shift\n'
        f'case "$host" in\n{table}\n  *) echo "no emulated host $host" >&2; exit 1 ;;\nesac\n'
        'export TTMESH_ROOT="$dir/root" XDG_RUNTIME_DIR=/tmp/run GLOO_SOCKET_IFNAME=lo\n'
        "exec unshare --uts --mount --propagation private sh -c "
        '"hostname $host && mount --bind $dir/tmp /tmp && mkdir -p -m 700 /tmp/run && exec sh -c \\"\\$0\\"" "$*"\n'
    )
    agent.chmod(0o755)
    return agent


def mpi_env(agent: Path) -> dict[str, str]:
    """mpirun reaches the emulated hosts through ``agent``, over loopback only."""
    return {
        "OMPI_MCA_plm_rsh_agent": str(agent),
        "PRTE_MCA_plm_ssh_agent": str(agent),
        "OMPI_MCA_oob_tcp_if_include": "lo",
        "OMPI_MCA_btl_tcp_if_include": "lo",
        "OMPI_MCA_btl": "self,tcp",
        "PYTHONPATH": str(REPO),
    }
