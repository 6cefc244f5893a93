"""The MPI start mode: every rank of a tt-metal world in one MPMD ``mpirun`` command.

tt-metal forms a mesh over several processes through MPI, so those processes must all be
started by one MPI launcher, one app context per rank with its own environment
(``mpirun -np 1 -x K=V ... prog : -np 1 -x K=V ... prog``). The guardian supervises the
``mpirun`` process like any worker: its output is split back into ranks (``--tag-output``), the
first failing rank and its code are read from mpirun's report, and the whole tree is swept.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable

from ttmesh import numeric, procs
from ttmesh.errors import bad_input
from ttmesh.launcher.planning import rankenv
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.vocab import LAUNCHER

# --tag-output: Open MPI 4 writes ``[1,0]<stdout>:text``, Open MPI 5 ``[1,0]<stdout>: text``.
TAG = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>:")
TAG5 = re.compile(rb"\[\d+,(\d+)\]<(stdout|stderr)>: ")
# The first failing rank: 4.x names it ``[[588,1],1]``, 5.x ``[prterun-vm-11187@1,1]``; 5.x
# breaks its signal line ("exited on\nsignal 11").
FIRST_FAILED = re.compile(
    r"Process name: \[(?:\[[0-9]+,[0-9]+\]|[^\s\[\],]+),([0-9]+)\]\s*\n\s*Exit code:\s*([0-9]+)"
)
SIGNALLED = re.compile(
    r"process rank ([0-9]+) with PID [0-9]+ on node \S+ exited\s+on\s+signal\s+([0-9]+)"
)
# A rank called MPI_Abort (or MPI's fatal error handler did): 4.x gives the rank and the code it
# passed; 5.x names the rank only, and mpirun's own exit code stands for it.
ABORTED4 = re.compile(
    r"MPI_ABORT was invoked on rank ([0-9]+) in communicator [^\n]*?\s+with errorcode (-?[0-9]+)"
)
ABORTED5 = re.compile(
    r"exited due to process rank ([0-9]+) with PID [0-9]+ on node \S+ calling\s+\"abort\""
)
# mpirun's word that its ranks ran (one of them returned non-zero), printed before it names the
# rank; a rank that exits at once can end before ttmesh has seen its PID. (4.x: "returned a
# non-zero exit code", 5.x: "exited with non-zero status")
RANKS_RAN = re.compile(
    r"process(?:es)?\s+(?:returned\s+a\s+non-zero\s+exit\s+code|exited\s+with\s+non-zero\s+status)"
)


# mpirun's own words for a rank whose program never ran: Open MPI 4 (mpirun), 5 (prterun), with
# the rank, the program and (4.x, sometimes 5.x) the node. Matched with RE2 (linear in mpirun's
# text, however long).
_NOT_FOUND = (
    r"(?s)(?:mpirun|mpiexec|prterun|prun)\s+was\s+unable\s+to\s+find\s+the\s+specified\s+"
    r"executable\s+file.*?first\s+reported\s+for\s+process\s+rank\s+([0-9]+).*?"
    r"(?:Node:\s*(\S+)\s*)?Executable:\s*(\S+)"
)
_NOT_RUNNABLE = (
    r"(?s)could\s+not\s+access\s+or\s+execute\s+an\s+executable:\s*Executable:\s*(\S+)"
    r"\s*(?:Node:\s*(\S+))?.*?process\s+rank\s+([0-9]+)"
)
_EXECVE = (
    r"(?s)via\s+the\s+\"execve\"\s+system\s+call\s+but\s+failed.*?Local\s+host:\s*(\S+).*?"
    r"Application\s+name:\s*(\S+)"
)


def not_started(text: str) -> tuple[int, str, str | None, bool] | None:
    """(rank, program, node, found) when mpirun says a rank's program never ran: not found
    (``found`` False, a shell's 127), or found and not runnable (True, 126); else None."""
    from ttmesh.patterns import compile_pattern

    found = compile_pattern(_NOT_FOUND).search(text)
    if found is not None:
        return int(found.group(1)), found.group(3), found.group(2), False
    found = compile_pattern(_NOT_RUNNABLE).search(text)
    if found is not None:
        return int(found.group(3)), found.group(1), found.group(2), True
    found = compile_pattern(_EXECVE).search(text)
    if found is not None:
        rank = compile_pattern(r"start\s+process\s+rank\s+([0-9]+)").search(text)
        return int(rank.group(1)) if rank else 0, found.group(2), found.group(1), True
    return None


def find_mpirun(explicit: str | None = None, prefer_ulfm: bool = False) -> str:
    """The mpirun to use: ``explicit``, ``TTMESH_MPIRUN``, else ``mpirun`` on PATH; across hosts
    ``mpirun-ulfm`` first when it is on PATH (as tt-run does: tt-metal's own Open MPI build)."""
    found = (shutil.which("mpirun-ulfm") if prefer_ulfm else None) or shutil.which("mpirun")
    path = explicit or os.environ.get("TTMESH_MPIRUN") or found
    if not path or not os.access(path, os.X_OK):
        raise bad_input(
            "no mpirun on this machine (tt-metal meshes over several processes need an MPI launcher)",
            "install Open MPI: apt-get install openmpi-bin",
        )
    return path


def mpirun_argv(
    mpirun: str, plan: LaunchPlan, base_env: dict[str, str], attempt: int
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment of mpirun itself): one ``-np 1 -x K=V ... prog`` section per rank.
    A rank gets :func:`rankenv.rank_env`: mpirun's own environment (``base_env`` without the
    rank variables, one OpenMP thread unless set), which its ranks inherit, and, exported with
    ``-x``, the rest of it and every variable the plan sets (on another host, only what is
    exported reaches the rank)."""
    argv = [mpirun, "--tag-output"]
    if not plan.hosts:
        argv += ["--bind-to", "none"]  # (a rankfile places and does not bind: tt-run's rule)
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if len(plan.ranks) > (os.cpu_count() or 1) and "--oversubscribe" not in plan.mpi_args:
        argv.append("--oversubscribe")
    argv += plan.mpi_args
    env = {**rankenv.inherited(base_env), **rankenv.threads(base_env)}
    for i, rank in enumerate(plan.ranks):
        if i:
            argv.append(":")
        argv += ["-np", "1"]
        if rank.workdir and not plan.hosts:
            argv += ["--wdir", rank.workdir]
        full = rankenv.rank_env(plan, rank, base_env, attempt)
        # What mpirun passes through itself is left out: its environment, where the plan does
        # not set the variable.
        rank_env = {k: v for k, v in full.items() if k in rank.env or env.get(k) != v}
        command = list(rank.argv)
        if plan.hosts:
            # On its host, the rank's own ttmesh writes its files, leases its chips and checks
            # them, then runs the command (ttmesh.launcher.nodes.rankshim).
            rank_env["TTMESH_RANK_FILES"] = json.dumps(rank_files(plan, rank.rank))
            rank_env["TTMESH_RANK_HOST"] = plan.hosts[rank.node]
            rank_env["TTMESH_RANK_CHIPS"] = json.dumps([a for u in rank.units for a in u.chips])
            if plan.fabric_at_start:  # the rank brings up the fabric of its host's chips
                rank_env["TTMESH_RANK_FABRIC"] = json.dumps(host_chips(plan, rank.node))
            if rank.workdir:  # made on the rank's host (mpirun's --wdir needs it to exist)
                rank_env["TTMESH_RANK_WORKDIR"] = rank.workdir
            command = [sys.executable, "-m", "ttmesh", "_rank", "--", *command]
        for key, value in rank_env.items():
            argv += ["-x", f"{key}={value}"]
        argv += command
    return argv, env


def host_chips(plan: LaunchPlan, node: int) -> list[str]:
    """The job's chips on host ``node`` of a mesh over several hosts."""
    return [a for r in plan.ranks if r.node == node for u in r.units for a in u.chips]


def rank_files(plan: LaunchPlan, rank: int) -> dict[str, str]:
    """The files a rank of a mesh over several hosts needs on its own host."""
    mine = f"/mock/rank{rank}_cluster_descriptor.yaml"
    return {
        path: text for path, text in plan.files.items() if "/mesh/" in path or path.endswith(mine)
    }


class Demux:
    """Splits mpirun's tagged output back into per-rank streams; untagged text is mpirun's."""

    def __init__(
        self, feed: Callable[[int, str, bytes], None], ver: tuple[int, int] | None = None
    ) -> None:
        self.feed = feed
        self.tag = TAG5 if ver is not None and ver >= (5, 0) else TAG  # mpirun's version()
        self.owner: dict[str, tuple[int, str]] = {}  # mpirun stream -> who the pending text is
        self.at_line_start: dict[str, bool] = {"stdout": True, "stderr": True}
        self.pending: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        self.text: list[str] = []  # mpirun's own messages, for the failure report

    def data(self, stream: str, chunk: bytes) -> None:
        buf = self.pending[stream] + chunk
        # A tag may be cut at the end of a read: keep a short tail that could start one.
        cut = buf.rfind(b"[")
        if cut != -1 and not self.tag.match(buf, cut) and len(buf) - cut < 32:
            buf, self.pending[stream] = buf[:cut], buf[cut:]
        else:
            self.pending[stream] = b""
        pos = 0
        for match in self.tag.finditer(buf):
            self._text(stream, buf[pos : match.start()])
            self.owner[stream] = (int(match.group(1)), match.group(2).decode())
            self.at_line_start[stream] = False
            pos = match.end()
        self._text(stream, buf[pos:])

    def _text(self, stream: str, text: bytes) -> None:
        """``text`` that follows a tag, or untagged. mpirun tags every line a rank writes (and
        each piece of one cut across its reads), so a rank owns text up to the end of its
        line only: an untagged line after it is mpirun's own, however the reads cut them
        (one read may hold a rank's last line and mpirun's report of its exit)."""
        if not text:
            return
        owner = self.owner.get(stream) if not self.at_line_start[stream] else None
        if owner is not None:
            end = text.find(b"\n") + 1
            if not end:  # the rank's line goes on in a later read
                self.feed(owner[0], owner[1], text)
                return
            self.feed(owner[0], owner[1], text[:end])
            self.owner.pop(stream, None)
            self.at_line_start[stream] = True
            text = text[end:]
            if not text:
                return
        self.text.append(text.decode(errors="replace"))
        self.feed(LAUNCHER, stream, text)
        self.at_line_start[stream] = text.endswith(b"\n")
        self.owner.pop(stream, None)

    def flush(self) -> None:
        for stream in ("stdout", "stderr"):
            rest, self.pending[stream] = self.pending[stream], b""
            self._text(stream, rest)

    def first_failure(self, mpirun_code: int = 0) -> tuple[int, int] | None:
        """(rank, exit code) of the first rank mpirun saw fail, from its report (a rank that
        called MPI_Abort: the code it gave, or ``mpirun_code`` when mpirun does not say)."""
        text = "".join(self.text)
        match = FIRST_FAILED.search(text)
        if match:
            return int(match.group(1)), int(match.group(2))
        match = SIGNALLED.search(text)
        if match:
            return int(match.group(1)), 128 + int(match.group(2))
        match = ABORTED4.search(text)
        if match:
            return int(match.group(1)), int(match.group(2)) & 0xFF or 1
        match = ABORTED5.search(text)
        if match:
            return int(match.group(1)), mpirun_code or 1
        return None

    def aborted(self) -> int | None:
        """The rank mpirun's report says called MPI_Abort, else None."""
        text = "".join(self.text)
        match = ABORTED4.search(text) or ABORTED5.search(text)
        return int(match.group(1)) if match else None

    def ranks_ran(self) -> bool:
        """Did mpirun's report say its ranks ran (and one failed)?"""
        return self.first_failure() is not None or bool(RANKS_RAN.search("".join(self.text)))


def rank_pids(mpirun_pid: int, world: int) -> dict[int, int]:
    """The processes mpirun started for each rank (found by their TTMESH_RANK)."""
    found: dict[int, int] = {}
    for pid in procs.descendants(mpirun_pid):
        value = procs.environ_value(pid, "TTMESH_RANK")
        if value is not None and numeric.digits(value):
            rank = int(value)
            if 0 <= rank < world and rank not in found:
                found[rank] = pid
    return found


# --------------------------------------------------------------------------- across hosts

VERSION = re.compile(r"\(Open MPI\)\s+([0-9]+)\.([0-9]+)|Open MPI[^0-9]{0,20}([0-9]+)\.([0-9]+)")
_versions: dict[str, tuple[int, int] | None] = {}


def version(mpirun: str) -> tuple[int, int] | None:
    """Open MPI's (major, minor) from ``mpirun --version`` (None: not Open MPI, or unknown)."""
    if mpirun not in _versions:
        import subprocess

        try:
            out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20)
            text = out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        match = VERSION.search(text)
        groups = [g for g in (match.groups() if match else ()) if g is not None]
        _versions[mpirun] = (int(groups[0]), int(groups[1])) if groups else None
    return _versions[mpirun]


def rankfile_text(hosts_of_ranks: list[str]) -> str:
    """An Open MPI rankfile: rank N on its host (slot 0: ranks are not bound, --bind-to none)."""
    return "".join(f"rank {r}={h} slot=0\n" for r, h in enumerate(hosts_of_ranks))


def rankfile_args(ver: tuple[int, int] | None, path: str) -> list[str]:
    """Open MPI 5 (PRRTE) maps by rankfile with ``--map-by rankfile:file=``; 4.x and unknown
    builds take ``--rankfile`` (tt-run's detect_rankfile_syntax makes the same choice)."""
    if ver is not None and ver >= (5, 0):
        return ["--map-by", f"rankfile:file={path}"]
    return ["--rankfile", path]


def agent_args(ver: tuple[int, int] | None, agent: str) -> list[str]:
    """How mpirun reaches the hosts instead of ssh: Open MPI 4's ``plm_rsh_agent``, PRRTE's
    ``plm_ssh_agent`` in Open MPI 5 (which still maps the old name)."""
    if ver is not None and ver >= (5, 0):
        return ["--prtemca", "plm_ssh_agent", agent]
    return ["--mca", "plm_rsh_agent", agent]


def btl(ver: tuple[int, int] | None) -> str:
    """The transports ranks over several hosts get: TCP between hosts, as tt-run gives, and
    shared memory between ranks of one host, which tt-run's ``self,tcp`` leaves out.

    tt-metal#57284 (tt-run: keep the shared-memory BTL in the default multi-host MPI
    transport): with ``--mca btl self,tcp`` the ranks sharing a host talk over TCP loopback,
    and on a 20-host x 4-rank Blackhole Galaxy pod (Open MPI 5.0.7 ULFM, 80 ranks) the first
    ``MPI_Comm_dup`` (``ttnn.init_distributed_context()``) deadlocked in ``ompi_comm_activate``,
    5 runs of 5; the same command with ``self,sm,tcp`` ran in 4 s. Open MPI 5 names that
    component ``sm``; Open MPI 4 ``vader`` (its ``sm`` is a stub that fails ``MPI_Init`` with
    "As of version 3.0.0, the "sm" BTL is no longer available"), a name Open MPI 5 still takes
    as ``sm``'s alias: unknown builds get ``vader``."""
    shared = "sm" if ver is not None and ver >= (5, 0) else "vader"
    return f"self,{shared},tcp"


PARAM_FILES = "OMPI_MCA_mca_base_param_files"
PARAM_FILE_BYTES = 64 * 1024


def user_btl(environ: dict[str, str]) -> str | None:
    """The transports the user chose for Open MPI, which win over ttmesh's: ``OMPI_MCA_btl``,
    else a ``btl = ...`` line in the user's own parameter files (those named by
    ``OMPI_MCA_mca_base_param_files``, else ``$HOME/.openmpi/mca-params.conf``: Open MPI's
    ``opal/mca/base/mca_base_var.c``). A ``--mca btl`` on mpirun's command line would
    override them, so ttmesh passes none then. The installation's own
    ``openmpi-mca-params.conf`` is the distribution's default (Debian's says
    ``btl = ^uct,openib,ofi``), which tt-run's command line overrides too."""
    if "OMPI_MCA_btl" in environ:
        return environ["OMPI_MCA_btl"]
    listed = environ.get(PARAM_FILES)
    if listed is not None:
        paths = [p for p in listed.split(",") if p]
    elif environ.get("HOME"):
        paths = [os.path.join(environ["HOME"], ".openmpi", "mca-params.conf")]
    else:
        paths = []
    for path in paths:
        value = _param(path, "btl")
        if value is not None:
            return value
    return None


def _param(path: str, name: str) -> str | None:
    """``name``'s value in an Open MPI parameter file (``name = value`` lines; a line starting
    with ``#`` is a comment, a ``#`` after a value is part of it, as Open MPI 4.1 reads it);
    None when the file does not set it or cannot be read."""
    from ttmesh import fileread

    try:
        text = fileread.read_text(path, PARAM_FILE_BYTES, "Open MPI parameter file")
    except (OSError, ValueError):  # none, or not a file Open MPI would read either
        return None
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if eq and key.strip() == name:
            return value.strip()
    return None


def tcp_args(
    interface: str | None, environ: dict[str, str], ver: tuple[int, int] | None = None
) -> list[str]:
    """Open MPI's transports over several hosts: :func:`btl` unless the user chose theirs
    (:func:`user_btl`); TCP on ``interface`` when given, else on every interface but docker0
    and lo (tt-run's defaults); the user's own OMPI_MCA_btl_tcp_if_* are kept."""
    out = []
    if user_btl(environ) is None:
        out += ["--mca", "btl", btl(ver)]
    chosen = {"OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_btl_tcp_if_exclude"} & set(environ)
    if interface:
        out += ["--mca", "btl_tcp_if_include", interface]
    elif not chosen:
        out += ["--mca", "btl_tcp_if_exclude", "docker0,lo"]
    return out


def host_slots(hosts_of_ranks: list[str]) -> str:
    """``--host a:N,b:M``: every host of the rankfile with as many slots as it has ranks."""
    counts: dict[str, int] = {}
    for h in hosts_of_ranks:
        counts[h] = counts.get(h, 0) + 1
    return ",".join(f"{h}:{n}" for h, n in counts.items())
