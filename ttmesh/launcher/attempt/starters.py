"""How the ranks of one attempt start: one small interface, one class per start mode.

The guardian (:mod:`ttmesh.launcher.attempt.guardian`) supervises any starter the same way, as torch's
elastic agent does its ``PContext``: it asks the starter to start the ranks, reads the output
streams it exposes, signals the process groups it names, and hands it every process it reaps
to learn which ranks ended and how. Two modes:

* :class:`DirectStarter` - one process per rank, each in its own session, started by the guardian
  with a parent-death signal;
* :class:`MpiStarter` - every rank in one MPMD ``mpirun`` (tt-metal forms a world over several
  processes through MPI): its tagged output is split back into ranks, rank PIDs are found among
  its descendants, and the ranks' exits are read from its report.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable

from ttmesh import procs
from ttmesh.dataclass import dataclass
from ttmesh.launcher.attempt.logs import Console
from ttmesh.launcher.planning.plan import LaunchPlan, RankPlan
from ttmesh.launcher.planning.rankenv import rank_env
from ttmesh.runtime.rankview import Views
from ttmesh.vocab import LAUNCHER, StartMode

Drain = Callable[[int], None]  # read what a stream owner (a rank, or LAUNCHER) still has to say


@dataclass
class RankExit:
    """How one rank ended."""

    rank: int
    pid: int
    code: int  # as a shell reports it: exit code, or 128 + signal
    how: str  # "exited with code 3", "killed by SIGTERM"
    stopped: bool  # ttmesh signalled it before it ended
    # False: its program never ran (not found, not executable, a directory): 127 or 126 as a
    # shell says, ``how`` names the program and ``hint`` says how to fix it. Nothing ran, so
    # the job ends at once and is not restarted.
    started: bool = True
    hint: str | None = None


@dataclass
class Stream:
    """An output pipe the guardian reads: whose it is and which stream."""

    fd: int
    owner: int  # a rank, or LAUNCHER (mpirun's own pipes)
    name: str  # "stdout" | "stderr"


class Starter:
    """Starts the ranks of one attempt and explains their exits."""

    has_launcher = False  # output comes through an external launcher (mpirun), not per rank

    def __init__(
        self, plan: LaunchPlan, attempt: int, base_env: dict[str, str], guardian: int
    ) -> None:
        self.plan = plan
        self.attempt = attempt
        self.base_env = base_env
        self.guardian = guardian
        self.pids: dict[int, int] = {}  # rank -> pid, as far as known
        self.streams: list[Stream] = []
        self.console: Console | None = None
        self.launcher_error: str | None = None  # the launcher failed before any rank ran
        self.notice: str | None = None  # one line for the job's output (the guardian says it)
        self.views: Views | None = None  # a simulated host's view, open while the attempt runs

    def start(self) -> list[RankExit]:
        """Start every rank; the ranks that could not start (exit 127)."""
        raise NotImplementedError

    def known(self) -> bool:
        """Every rank's PID is known (look again if not: ``discover``)."""
        return len(self.pids) == len(self.plan.ranks)

    def discover(self) -> None:
        """Find rank PIDs not known yet."""

    def close(self) -> None:
        """The attempt has ended: let go of what its start kept."""

    def groups(self) -> list[int]:
        """Process groups a stop signals."""
        return list(self.pids.values())

    def signal_targets(self, running: set[int]) -> list[int]:
        """Process groups a forwarded signal (SIGUSR1/2) reaches."""
        return [self.pids[r] for r in running if r in self.pids]

    def feed(self, owner: int, name: str, data: bytes) -> None:
        assert self.console is not None
        self.console.feed(owner, name, data)

    def closed(self, owner: int, name: str) -> None:
        assert self.console is not None
        self.console.close(owner, name)

    def reaped(
        self, pid: int, status: int, running: set[int], stopping: bool, drain: Drain
    ) -> list[RankExit]:
        """The ranks whose end the exit of child ``pid`` means (none: not a rank's)."""
        raise NotImplementedError

    # -- shared by the modes

    def _popen(
        self, argv: list[str], env: dict[str, str], cwd: str | None, wrap: bool = False
    ) -> subprocess.Popen:
        """Start ``argv`` in its own session, SIGKILLed if the guardian dies. ``wrap``: through
        setpriv's parent-death signal when the system has it (Python then spawns with vfork:
        no copy of the guardian, no Python code before exec); else a ``preexec_fn`` sets it.
        A process whose guardian dies before setpriv sets the signal is re-parented to the
        launcher, which sweeps what its guardian left."""
        prefix = procs.pdeathsig_wrapper() if wrap else None
        proc = subprocess.Popen(
            [*prefix, *argv] if prefix else argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=None if prefix else procs.pdeathsig_preexec(self.guardian),
            close_fds=True,
        )
        proc.returncode = 0  # reaped by the guardian's own waitpid, never by Popen
        return proc

    def _watch(self, proc: subprocess.Popen, owner: int) -> None:
        size = _pipe_size(2 * max(len(self.plan.ranks), 1))
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert stream is not None
            fd = os.dup(stream.fileno())
            stream.close()
            os.set_blocking(fd, False)
            if size:
                with contextlib.suppress(OSError):
                    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
            self.streams.append(Stream(fd, owner, name))

    def _workdirs(self) -> None:
        for rank in self.plan.ranks:
            if rank.workdir:
                os.makedirs(rank.workdir, exist_ok=True)


class DirectStarter(Starter):
    """One process per rank, started by the guardian itself."""

    def known(self) -> bool:
        return True  # every rank it started, it started itself

    def start(self) -> list[RankExit]:
        ranks = [
            (rank, rank_env(self.plan, rank, self.base_env, self.attempt))
            for rank in self.plan.ranks
        ]
        # Every rank's program first (a rank's PATH may not be ttmesh's): one that cannot run
        # ends the attempt before any rank starts, rather than after the others were stopped.
        checked: set[tuple[str, str | None, str | None]] = set()
        for rank, env in ranks:
            cwd = rank.workdir or self.plan.cwd or None
            program = (rank.argv[0], env.get("PATH"), cwd)
            if program in checked:  # 128 ranks of one command: one PATH search
                continue
            try:
                _check_program(rank.argv[0], env, cwd)
            except OSError as exc:
                return [never_started(rank.rank, rank.argv[0], exc, env, cwd)]
            checked.add(program)
        self.views = self._views()
        if self.views is not None:  # a simulated host's chips at the real paths
            return self.views.within(lambda: self._start(ranks))
        return self._start(ranks)

    def _start(self, ranks: list[tuple[RankPlan, dict[str, str]]]) -> list[RankExit]:
        for rank, env in ranks:
            cwd = rank.workdir or self.plan.cwd or None
            try:
                for own in (rank.workdir, rank.tmpdir):  # a program profile's, in the run dir
                    if own:
                        os.makedirs(own, mode=0o700, exist_ok=True)
                argv = list(rank.argv)
                if self.views is not None:
                    argv = [*self.views.prefix(os.path.abspath(cwd or ".")), *argv]
                proc = self._popen(argv, env, cwd, wrap=True)
            except OSError as exc:
                # The ranks already started are stopped; the rest never start.
                return [never_started(rank.rank, rank.argv[0], exc, env, cwd)]
            self.pids[rank.rank] = proc.pid
            self._watch(proc, rank.rank)
        return []

    def close(self) -> None:
        if self.views is not None:
            self.views.close()

    def _views(self) -> Views | None:
        """The simulated host's view for this attempt's ranks (``plan.host_view``), made once."""
        view = self.plan.host_view
        if view is None:
            return None
        views = Views(view.helper(), view.root, list(view.devices), self.plan.open_files())
        views.open()
        if views.notice is not None:
            self.notice = (
                "the ranks see this machine's own /dev/tenstorrent and /proc/driver/tenstorrent, "
                f"not the simulated host's: {views.notice}"
            )
        return views

    def reaped(
        self, pid: int, status: int, running: set[int], stopping: bool, drain: Drain
    ) -> list[RankExit]:
        rank = next((r for r, p in self.pids.items() if p == pid), None)
        if rank is None or rank not in running:
            return []  # an orphaned descendant re-parented to the guardian
        return [
            RankExit(rank, pid, procs.exit_code(status), procs.describe_status(status), stopping)
        ]


PIPE_BUDGET = 16 << 20  # bytes of pipe buffers a job's output may take in all


def _pipe_size(pipes: int) -> int:
    """A bigger pipe per stream while the job's pipes stay within PIPE_BUDGET (0: the kernel's
    64 KiB). A rank that prints fast fills a 64 KiB pipe in microseconds and then waits for the
    guardian to be scheduled, read and write it on: a few big pipes make that round trip rare.
    Within budget, far below the kernel's per-user limit (pipe-user-pages-soft, 64 MiB), past
    which new pipes would shrink to a page."""
    size = 1 << 20
    while size > 64 << 10 and pipes * size > PIPE_BUDGET:
        size >>= 1
    return size if size > 64 << 10 else 0


def _check_program(program: str, env: dict[str, str], cwd: str | None) -> None:
    """Raise the OSError exec would for ``program`` (not found, not executable, a directory),
    searching the rank's PATH as execvp does (a name found there but not executable is
    EACCES, as a shell's 126); found ones are executed by name, as before."""
    import errno

    if "/" in program:
        path = program if os.path.isabs(program) else os.path.join(cwd or ".", program)
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if os.path.isdir(path):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), program)
        if not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
        return
    if shutil.which(program, path=env.get("PATH", os.defpath)) is not None:
        return
    for directory in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or ".", program)
        if os.path.exists(candidate):  # there, but a directory or not executable
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


SHOWN_PATH = 160  # characters of a rank's PATH a "not found" line shows


def never_started(
    rank: int, program: str, exc: OSError, env: dict[str, str], cwd: str | None
) -> RankExit:
    """How a rank whose program could not run ends: as a shell says it (127 not found, 126
    found but not runnable), naming the program, with how to fix it."""
    import errno

    if exc.errno == errno.ENOENT and "/" not in program:
        path = env.get("PATH", os.defpath)
        shown = path if len(path) <= SHOWN_PATH else path[:SHOWN_PATH] + "..."
        how = f"{program}: command not found on the rank's PATH ({shown})"
        hint = "give its full path, or set the rank's PATH with --env PATH=..."
        code = 127
    elif exc.errno == errno.ENOENT:
        where = f" (from {cwd})" if cwd and not os.path.isabs(program) else ""
        how, hint, code = f"{program}: no such file{where}", "check the path", 127
    elif exc.errno == errno.EISDIR:
        how, hint, code = f"{program}: is a directory", "give a program to run", 126
    elif exc.errno in (errno.EACCES, errno.EPERM):
        how = f"{program}: not executable"
        hint, code = f"chmod +x {program}, or run it through its interpreter", 126
    else:
        how = f"{program}: {exc.strerror or exc}"
        hint, code = "run it by hand to see why", 126
    return RankExit(rank, -1, code, f"could not start {how}", False, started=False, hint=hint)


class MpiStarter(Starter):
    """Every rank in one MPMD ``mpirun``; the ranks' exits come from its report."""

    has_launcher = True

    def __init__(
        self, plan: LaunchPlan, attempt: int, base_env: dict[str, str], guardian: int
    ) -> None:
        super().__init__(plan, attempt, base_env, guardian)
        self.mpirun: int | None = None
        self.demux: object | None = None

    def start(self) -> list[RankExit]:
        from ttmesh.launcher.nodes import mpi

        assert self.console is not None
        self.demux = mpi.Demux(self.console.feed, mpi.version(self.plan.mpirun))
        self._workdirs()
        argv, env = mpi.mpirun_argv(self.plan.mpirun, self.plan, self.base_env, self.attempt)
        if not self.plan.hosts:  # on other hosts each rank's ttmesh checks it there (rankshim)
            unstartable = self._unstartable(env)
            if unstartable is not None:
                return [unstartable]
        # Over several hosts the rankfile is named relative to the run directory (PRRTE misreads
        # absolute paths in --map-by rankfile:file=, tt-run notes).
        cwd = self.plan.run_dir if self.plan.hosts else self.plan.cwd
        try:
            proc = self._popen(argv, env, cwd or None)
        except OSError as exc:
            return [RankExit(0, -1, 127, f"mpirun could not start ({exc.strerror})", False)]
        self.mpirun = proc.pid
        self._watch(proc, LAUNCHER)
        return []

    def _unstartable(self, mpirun_env: dict[str, str]) -> RankExit | None:
        """The first rank whose program mpirun could not run here (it would say so in a dozen
        lines of its own, then exit): the rank's PATH is its ``-x PATH``, else mpirun's."""
        checked: set[tuple[str, str | None, str | None]] = set()
        for rank in self.plan.ranks:
            env = rank_env(self.plan, rank, self.base_env, self.attempt)
            cwd = rank.workdir or self.plan.cwd or None
            program = (rank.argv[0], env.get("PATH"), cwd)
            if program in checked:
                continue
            try:
                _check_program(rank.argv[0], env, cwd)
            except OSError as exc:
                return never_started(rank.rank, rank.argv[0], exc, env, cwd)
            checked.add(program)
        return None

    def discover(self) -> None:
        from ttmesh.launcher.nodes import mpi

        if self.mpirun is not None and not self.known():
            self.pids.update(mpi.rank_pids(self.mpirun, len(self.plan.ranks)))

    def groups(self) -> list[int]:
        return [*self.pids.values(), *([self.mpirun] if self.mpirun else [])]

    def signal_targets(self, running: set[int]) -> list[int]:
        # The rank PIDs may not all be known yet: mpirun forwards the signal to the rest.
        return [*super().signal_targets(running), *([self.mpirun] if self.mpirun else [])]

    def feed(self, owner: int, name: str, data: bytes) -> None:
        self.demux.data(name, data)  # type: ignore[union-attr]

    def closed(self, owner: int, name: str) -> None:
        assert self.console is not None
        self.demux.flush()  # type: ignore[union-attr]
        for rank in self.plan.ranks:
            self.console.close(rank.rank, name)
        self.console.close(LAUNCHER, name)

    def reaped(
        self, pid: int, status: int, running: set[int], stopping: bool, drain: Drain
    ) -> list[RankExit]:
        """mpirun is gone, so every rank is: its report names the first rank that failed."""
        from ttmesh.launcher.nodes import mpi

        if pid != self.mpirun:
            return []
        drain(LAUNCHER)  # its report may still sit in the pipes
        demux = self.demux
        demux.flush()  # type: ignore[union-attr]
        code = procs.exit_code(status)
        if code != 0 and not self.pids and not stopping and not demux.ranks_ran():  # type: ignore[union-attr]
            # Not one rank was seen, and mpirun does not say one ran: it failed to start them.
            text = "".join(demux.text)  # type: ignore[union-attr]
            missing = mpi.not_started(text)
            if missing is not None:  # a rank's program: not found, or not runnable, there
                first, program, node, runnable = missing
                on = f" on {node}" if node else ""
                if runnable:
                    how = f"could not start {program}{on}: mpirun could not execute it"
                    hint, value = "check it is an executable file there (chmod +x)", 126
                else:
                    how = f"could not start {program}{on}: mpirun found no such program"
                    hint, value = "give its full path, or install it on that host", 127
                if first < 0 or first >= len(self.plan.ranks):
                    first = 0
                # mpirun launched none of them: every rank ends here, that one the cause.
                return [
                    RankExit(r.rank, -1, value, how, False, started=False, hint=hint)
                    if r.rank == first
                    else RankExit(r.rank, -1, value, "not started: mpirun launched no rank", True)
                    for r in self.plan.ranks
                    if r.rank in running
                ]
            said = text.strip().splitlines()
            self.launcher_error = said[-1] if said else procs.describe_status(status)
        failed = demux.first_failure(code)  # type: ignore[union-attr]
        if code != 0 and failed is None and len(self.plan.ranks) == 1:
            failed = (0, code)
        exits = []
        for rank in self.plan.ranks:
            if rank.rank not in running:
                continue
            rank_pid = self.pids.get(rank.rank, -1)
            if failed is not None and rank.rank == failed[0]:
                value = failed[1]
                how = procs.describe_status((value - 128) if value > 128 else (value << 8))
                if demux.aborted() == failed[0]:  # type: ignore[union-attr]
                    how = f"called MPI_Abort ({how})"
                exits.append(RankExit(rank.rank, rank_pid, value, how, False))
            elif code == 0:
                exits.append(RankExit(rank.rank, rank_pid, 0, "exited with code 0", False))
            else:
                exits.append(RankExit(rank.rank, rank_pid, 143, "stopped by mpirun", True))
        if code != 0 and failed is None and not self.launcher_error and not stopping:
            # No rank is named: mpirun itself failed; it stands for the job.
            exits.append(RankExit(-1, pid, code, f"mpirun {procs.describe_status(status)}", False))
        return exits


def starter_for(plan: LaunchPlan) -> type[Starter]:
    return MpiStarter if plan.launcher == StartMode.MPI else DirectStarter
