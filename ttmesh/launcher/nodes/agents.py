"""``ttmesh launch --hosts a,b,...``: start one ttmesh agent per host, through mpirun.

ttmesh never opens a connection to another host itself: Open MPI's ``mpirun`` starts the agents
(its ssh launch agent, or the allocation's own launcher inside Slurm), one per host
(``--map-by ppr:1:node``), each running the same ``ttmesh launch`` with ``--nnodes`` and the
rendezvous endpoint; each learns its node rank from ``OMPI_COMM_WORLD_RANK``. The job's token
travels in the environment (``-x TTMESH_RDZV_TOKEN``), never on a command line.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from typing import TYPE_CHECKING

from ttmesh import addresses, paths
from ttmesh.errors import bad_input
from ttmesh.launcher.nodes import mpi

if TYPE_CHECKING:
    from ttmesh.launcher.nodes.multihost import MultiHost

# ttmesh launch's options that --hosts replaces for the agents
DROPPED = {"--hosts": True, "--nnodes": True, "--node-rank": True, "--node_rank": True}


def agent_argv(argv: list[str], nnodes: int, endpoint: str, job: str) -> list[str]:
    """The agents' ``ttmesh launch`` command line: the user's, without --hosts and node flags."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            out += argv[i:]
            break
        name = word.split("=", 1)[0]
        if name in DROPPED:
            i += 1 if "=" in word else 2
            continue
        if name in ("--rdzv-endpoint", "--rdzv_endpoint", "--job-id", "--run-id", "--rdzv-id"):
            i += 1 if "=" in word else 2
            continue
        out.append(word)
        i += 1
    launch = out.index("launch") if "launch" in out else -1
    extra = ["--nnodes", str(nnodes), "--rdzv-endpoint", endpoint, "--job-id", job]
    return [*out[: launch + 1], *extra, *out[launch + 1 :]]


def start(hosts: str, mh: MultiHost, job: str, argv: list[str], *, dry_run: bool = False) -> int:
    """Run the agents on ``hosts`` under mpirun (``mh``: how they join, ``job``: the id every
    agent shares); mpirun's exit code (the first failing agent's)."""
    names = addresses.hosts(hosts, "--hosts", example="--hosts node0,node1")
    mpirun = mpi.find_mpirun()
    token = mh.token or secrets.token_hex(16)
    agent = [sys.executable, "-m", "ttmesh", *agent_argv(argv, len(names), str(mh.endpoint), job)]
    command = [mpirun, "--host", ",".join(f"{h}:1" for h in names), "-np", str(len(names)),
               "--map-by", "ppr:1:node", "--bind-to", "none", "--tag-output"]  # fmt: skip
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    for name in ("TTMESH_RDZV_TOKEN", "TTMESH_AGENT", "PATH", "PYTHONPATH", "XDG_CACHE_HOME"):
        command += ["-x", name]
    command += agent
    if dry_run:
        sys.stdout.write(" ".join(command) + "\n")
        from ttmesh.render import note

        note(
            "a dry run of --hosts starts no agent, so no host's plan or pre-flight was checked "
            "(run the command above: each agent's --dry-run plans and checks its host)"
        )
        return 0
    env = {**os.environ, "TTMESH_RDZV_TOKEN": token, "TTMESH_AGENT": "1"}
    env.setdefault("PYTHONPATH", "")
    env["XDG_CACHE_HOME"] = paths.xdg_dir("XDG_CACHE_HOME", ".cache") or ""  # absolute (XDG)
    try:
        return subprocess.call(command, env=env)
    except OSError as exc:
        raise bad_input(f"cannot run mpirun ({mpirun}): {exc.strerror}")
