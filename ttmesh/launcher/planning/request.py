"""What the user asked for: the request a launch is planned from (with its Policy: how the job
is watched and ended), and the command it runs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ttmesh.addresses import shown
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.launcher.planning.rankenv import ENV_KEY, owner_flag
from ttmesh.vocab import Layout, StartMode

if TYPE_CHECKING:
    from ttmesh.launcher.adapters.ttrun import BindingFile
    from ttmesh.launcher.planning.programs import ProgramSpec
    from ttmesh.launcher.serving.args import ServerArgs
    from ttmesh.launcher.serving.profiles import Profile
    from ttmesh.launcher.serving.rules import Finding
    from ttmesh.launcher.serving.spec import ServingSpec
    from ttmesh.mesh.cluster import Cluster
    from ttmesh.mesh.select import Unit


DEFAULT_GRACE = 5.0  # seconds between SIGTERM and SIGKILL (a server's: its profile's stop.grace)


@dataclass(frozen=True)
class Policy:
    """How the job is watched (a rank's readiness, its silence, a server's health and probe)
    and ended (the restarts it may take, the grace before a kill, another tool's reset
    notice). Checked when made, whoever makes it: the rules of these settings live here."""

    max_restarts: int = 0
    grace: float = DEFAULT_GRACE
    # Beyond the grace, for a rank still bringing up the fabric when it ends (0: none).
    fabric_grace: float = 20.0
    op_timeout: float | None = None  # TT_METAL_OPERATION_TIMEOUT_SECONDS for the ranks
    on_reset_notice: str = "stop"  # another tool's reset notice: "stop" the ranks, or "pass"
    ready_timeout: float | None = None  # every rank ready within this, or the job is hung
    hang_timeout: float | None = None  # no rank's output for this long: the job is hung
    ready_pattern: str | None = None  # a line of output that means "ready"
    health_interval: float | None = None  # a server after ready: check /health every S seconds
    health_failures: int = 3  # that many failures in a row fail the job
    probe_interval: float | None = None  # a server after ready: a one-token generation every S
    probe_timeout: float | None = None  # the seconds it may take (None: the profile's)

    def __post_init__(self) -> None:
        if self.on_reset_notice not in ("stop", "pass"):
            raise bad_input(f"--on-reset-notice {self.on_reset_notice!r}: use stop or pass")
        if self.probe_timeout is not None and self.probe_interval is None:
            raise bad_input("--probe-timeout goes with --probe-interval", "add --probe-interval S")
        if self.ready_pattern is not None:
            _check_pattern(self.ready_pattern)


@dataclass(frozen=True)
class LaunchRequest:
    """What the user asked for (the CLI's parsed options), checked once when made and never
    changed after (torch's ``WorkerSpec``): each stage that resolves part of it (the chips'
    count, the start mode, the job's identity, the server's spec, ...) hands the next stage a
    new request (``dataclasses.replace``), so what the user asked stays what it was."""

    command: list[str]
    tp_size: int
    module: bool = False
    no_python: bool = False
    layout: str = Layout.ISOLATED
    mesh_shape: tuple[int, int] | None = None
    symmetric_dram_mb: int = 2048
    env: list[tuple[str, str]] = field(default_factory=list)
    master_addr: str = "127.0.0.1"
    role: str | None = None  # torchrun's --role: every rank's ROLE_NAME (None: "default")
    virtual_local_rank: bool = False  # torchrun's --virtual-local-rank: LOCAL_RANK 0 in every rank
    numa_binding: bool = False  # --numa-binding node: each rank on its chips' NUMA node's CPUs
    master_port: int = 0
    policy: Policy = Policy()  # how the job is watched and ended
    job: str = ""
    run_dir: str = ""
    # Where the ranks' Open MPI keeps its shared-memory segments: a directory of the job's, so
    # they go with it (runtime.jobs.segment_dir; "" leaves Open MPI's default, /dev/shm).
    segment_dir: str = ""
    strict_links: bool = False
    nproc: int | None = None  # workers; default one per unit (chip, or n300 board)
    launcher: str = StartMode.DIRECT
    mpirun: str = ""
    workdir: str = ""  # ranks' working directory; "" = the user's (per-job under MPI)
    mocks: dict[int, str] = field(default_factory=dict)  # rank -> mock cluster (simulated host)
    binding: BindingFile | None = None  # a tt-run rank-binding file
    binding_units: list[tuple[Unit, ...]] = field(default_factory=list)  # each binding rank's
    # The environment the request was made in (the ranks inherit it; ${VAR}, TT_METAL_HOME).
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    python: str = sys.executable
    cwd: str = ""
    serving: ServingSpec | None = None  # when the command is a server a profile knows
    profile: Profile | None = None  # the server's profile
    server_args: ServerArgs | None = None  # its parsed command line
    server_findings: list[Finding] = field(default_factory=list)  # found before selection
    program: ProgramSpec | None = None  # a program profile's job (torch_tpu on libtt, ...)
    strict: bool = False  # rule warnings are errors
    cluster: Cluster | None = None  # a tt-metal mesh over several hosts
    mpi_args: list[str] = field(default_factory=list)  # mpirun's options to reach those hosts
    tp_hosts: int = 1  # hosts sharing the tensor-parallel degree (--tp-size is over all of them)
    nnodes: int = 1  # the job's hosts (a torch-tpu job's world is over all of them)

    def __post_init__(self) -> None:
        """The checks a request needs whoever makes it (the launch, ``descriptor``, ``check
        --active``): made once, here."""
        if self.launcher not in tuple(StartMode):
            raise bad_input(f"--launcher {self.launcher!r}: use direct or mpi")


# --------------------------------------------------------------------------- the command


def resolve_command(req: LaunchRequest) -> list[str]:
    """torchrun's habits: a ``.py`` first word runs with this Python, ``-m`` runs a module,
    ``--no-python`` runs the command as is. Checks that what will be run exists."""
    if not req.command:
        raise bad_input("no command given", "e.g. ttmesh launch --tp-size 4 train.py")
    first, rest = req.command[0], list(req.command[1:])
    if req.module:
        if req.no_python:
            raise bad_input("-m and --no-python together", "use one")
        return [req.python, "-m", first, *rest]
    if not req.no_python and first.endswith(".py"):
        path = Path(req.cwd or ".") / first
        if path.is_dir():
            raise bad_input(f"script {first} is a directory", "give the script file")
        if path.exists() and not path.is_file():
            from ttmesh.fileread import kind_of

            kind = kind_of(path.stat().st_mode) or "not a file"
            raise bad_input(f"script {first} is {kind}, not a regular file", "give the script file")
        if not path.is_file():
            raise bad_input(f"script {first} does not exist", "check the path")
        if not os.access(path, os.R_OK):
            raise bad_input(f"script {first} cannot be read (permission denied)")
        # Absolute, so a rank started in another working directory (MPI) still finds it.
        return [req.python, str(path.resolve()), *rest]
    if "/" in first:
        path = Path(req.cwd or ".") / first
        if path.is_dir():
            raise bad_input(f"command {first} is a directory", "give a program to run")
        if not path.exists():
            raise bad_input(f"command {first} does not exist", "check the path")
        if not path.is_file() or not os.access(path, os.X_OK):
            raise bad_input(
                f"command {first} is not executable",
                f"chmod +x {first}, or run it through its interpreter",
            )
        return [first, *rest]
    if shutil.which(first) is None:
        raise bad_input(f"command {first!r} not found on PATH", "give a path, or a .py script")
    return [first, *rest]


def parse_env(items: list[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not ENV_KEY.match(key):
            raise bad_input(f"--env {item!r}: expected KEY=VALUE", "e.g. --env LOGLEVEL=debug")
        flag = owner_flag(key)
        if flag is not None:
            hint = f"use {flag} instead" if flag.startswith("--") else f"drop it: {flag}"
            raise bad_input(f"--env {key}: ttmesh sets {key} for every rank", hint)
        out.append((key, value))
    return out


def parse_shape(value: str | None) -> tuple[int, int] | None:
    """``--mesh-shape RxC``."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*([0-9]{1,5})\s*[xX]\s*([0-9]{1,5})\s*", value, re.ASCII)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise bad_input(f"--mesh-shape {shown(value)}: expected ROWSxCOLS", "e.g. --mesh-shape 2x2")
    return int(match.group(1)), int(match.group(2))


def _check_pattern(pattern: str) -> None:
    from ttmesh.patterns import PatternError, compile_pattern

    try:
        compile_pattern(pattern)  # matched in linear time by the guardian
    except PatternError as exc:
        shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
        # As the user would type it again (the shell's quoting), unless it holds what a
        # terminal must not be sent as it is.
        quoted = shlex.quote(shown) if shown.isprintable() else repr(shown)
        raise bad_input(f"--ready-pattern {quoted}: {exc}", exc.hint) from None
