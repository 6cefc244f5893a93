"""The stacks of a hung job, taken before it is killed: every rank's Python stacks
(``py-spy dump --pid PID``) and, where it is installed, tt-metal's ``tt-triage``.

Users ask for "the stack before you kill it" (pytorch#122694): a job that never got ready
(``--ready-timeout``) or that ``ttmesh stop --dump`` stops has each running rank dumped, all
at once, each bounded in time (:data:`PY_SPY_SECONDS`), into a directory of the job's that
outlives it (``runtime.jobs.dumps_dir``: the run directory goes with the job). The summary
and ``--summary-json`` name the files.

* py-spy (the ``debug`` extra: ``pip install 'ttmesh[debug]'``) is looked for beside this
  Python first (a virtual environment's ``bin``, on PATH or not), then on PATH. Missing, one
  line says the dumps were skipped and how to install it; never another tool in its place.
  It reads another process's memory (``process_vm_readv``): the kernel allows that to root, or
  to the process's own user unless ``kernel.yama.ptrace_scope`` is 1 or more (then only its
  ancestors may, and py-spy is not the rank's), or a container dropped ``CAP_SYS_PTRACE``. A
  refusal is in the rank's file and said in one line.
* ``tt-triage`` is the console script of tt-metal's ``tools/triage/triage.py`` (its
  ``setup.py``: ``tt-triage = triage.triage:main``). It reads the chips' cores through
  tt-exalens (the Inspector's logs under ``TT_METAL_HOME``), takes no job argument, and is run
  once, as ``tt-triage --disable-progress --disable-colors``, with this environment and
  ``TT_VISIBLE_DEVICES`` set to the job's chips (an assumption: triage looks at every chip it
  is shown), bounded by :data:`TRIAGE_SECONDS`. Not on a simulated host (its chips are not the
  machine's) nor over several hosts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ttmesh.errors import TTMeshError
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.render import plural
from ttmesh.runtime import jobs

PY_SPY_SECONDS = 10.0  # each rank's dump; py-spy pauses the rank while it reads it
TRIAGE_SECONDS = 60.0  # tt-triage reads every core of every chip
INSTALL = "install it: pip install 'ttmesh[debug]' (or pip install py-spy==0.4.3)"


def asked(plan: LaunchPlan) -> bool:
    """``ttmesh stop --dump`` asked this job for its stacks."""
    return bool(plan.run_dir) and os.path.exists(os.path.join(plan.run_dir, jobs.DUMP_REQUEST))


def py_spy() -> str | None:
    """py-spy beside this Python (its wheel installs it there), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def take(
    plan: LaunchPlan, pids: dict[int, int], attempt: int, emit: Callable[[str], None]
) -> list[str]:
    """Dump every rank of ``pids`` (rank -> PID, running on this host) and run tt-triage; the
    files written. What could not be done is one line each, never an error of the job."""
    if not pids:
        return []
    tool = py_spy()
    if plan.hosts:
        emit("stack dumps: not taken for a job over several hosts (its ranks are not all here)")
        return []
    import tempfile  # (random, hashlib): a hung job's, not every guardian's

    try:
        where = Path(tempfile.mkdtemp(prefix=f"attempt{attempt}-", dir=jobs.dumps_dir(plan.job)))
    except (OSError, TTMeshError) as exc:
        emit(f"stack dumps: no directory for them ({exc})")
        return []
    files: list[str] = []
    if tool is None:
        emit(f"py-spy not found: the ranks' Python stacks were not dumped ({INSTALL})")
    else:
        files += _py_spy(tool, pids, where, plan.rank_offset, emit)
    files += _triage(plan, where, emit)
    if files:
        emit(f"stacks of {plural(len(pids), 'rank')} before killing them: {where}")
    return files


def _py_spy(
    tool: str, pids: dict[int, int], where: Path, offset: int, emit: Callable[[str], None]
) -> list[str]:
    """``py-spy dump --pid PID`` for every rank at once, each file ``rank<R>.txt`` holding
    what py-spy printed (its complaint, when it could not)."""
    running: list[tuple[int, int, Path, subprocess.Popen[bytes]]] = []
    for rank, pid in sorted(pids.items()):
        path = where / f"rank{rank + offset}.txt"
        with _new(path) as out:
            try:
                proc = subprocess.Popen(
                    [tool, "dump", "--pid", str(pid)],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
            except OSError as exc:
                emit(f"py-spy could not run ({tool}: {exc.strerror or exc}): no stacks dumped")
                return [str(p) for _, _, p, _ in running]
        running.append((rank + offset, pid, path, proc))
    deadline = time.monotonic() + PY_SPY_SECONDS
    for rank, pid, path, proc in running:
        try:
            code = proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            emit(f"py-spy: rank {rank} (pid {pid}) not dumped in {PY_SPY_SECONDS:g} s")
            continue
        if code != 0:
            emit(f"py-spy could not dump rank {rank} (pid {pid}): {_first_line(path)}")
    return [str(p) for _, _, p, _ in running]


def _triage(plan: LaunchPlan, where: Path, emit: Callable[[str], None]) -> list[str]:
    """tt-metal's tt-triage, when on PATH, on a real host: its output in ``tt-triage.txt``."""
    tool = shutil.which("tt-triage")
    if tool is None:
        return []
    if plan.simulated:
        emit("tt-triage: not run (a simulated host: its chips are not this machine's)")
        return []
    path = where / "tt-triage.txt"
    env = dict(os.environ)
    bdfs = [b for r in plan.ranks for b in r.bdfs]
    if bdfs:
        env["TT_VISIBLE_DEVICES"] = ",".join(dict.fromkeys(bdfs))
    with _new(path) as out:
        try:
            proc = subprocess.Popen(
                [tool, "--disable-progress", "--disable-colors"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            emit(f"tt-triage could not run ({tool}: {exc.strerror or exc})")
            return []
    try:
        code = proc.wait(TRIAGE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        emit(f"tt-triage: stopped after {TRIAGE_SECONDS:g} s (what it printed is in {path})")
        return [str(path)]
    if code != 0:
        emit(f"tt-triage exited with code {code}: {_first_line(path)}")
    return [str(path)]


@contextlib.contextmanager
def _new(path: Path) -> Iterator[BinaryIO]:
    """A new file in the job's private dump directory (never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        yield out


def _first_line(path: Path) -> str:
    """What py-spy or tt-triage said first (its complaint), from the file it wrote."""
    from ttmesh import fileread

    with contextlib.suppress(OSError, ValueError):  # fileread.Refused is a ValueError
        text = fileread.read_bytes(str(path), fileread.MiB, "dump").decode(errors="replace")
        if text.strip():
            return text.strip().splitlines()[0][:200]
    return "no output"
