"""A rank of a tt-metal mesh over several hosts, on its own host: ``ttmesh _rank -- COMMAND``.

The one MPMD mpirun of the job starts every rank as ``ttmesh _rank`` on the rank's host, which
does that host's duties for the rank before the command runs, and stays its parent:

1. **Is this the host the plan put the rank on?** Every chip the plan gave the rank must be
   here (asic ids are unique): a rank on another machine (hosts swapped in a rankfile or
   ``--hosts``) stops with one line naming both hosts (exit 3).
2. **Files**: the rank's plan files (the mesh graph descriptor every host gets identically, the
   physical grouping descriptor, its mock cluster) are written under the same paths here.
3. **Leases** on this host's lease directory for the rank's chips, held until the command ends
   (another job on this host sees them leased).
4. **Pre-flight** of the rank's chips here (driver nodes, heartbeats, links between them, holders
   outside the job): a problem stops the rank with its one line (exit 3). Whatever stops a
   rank before its command runs ends it with one last line ``ttmesh: not started on HOST: ...``
   (exit 2, 3, or 127 when the command is missing there).
5. **The fabric**: in one tt-metal world the rank brings up the links between the job's chips
   on this host (``TTMESH_RANK_FABRIC``); the host hears it, as on one host, so a crash leaves
   them down on a simulated host as on hardware (the launching ttmesh then recovers them on
   every host: ttmesh.launcher.nodes.hostrecovery).
6. The command runs as a child with the rank's environment (MPI's included: the child is the MPI
   process); SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are passed on, and the child gets SIGTERM should this
   process die; the exit code is the command's (128 + signal when a signal ended it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from ttmesh import procs
from ttmesh.errors import TTMeshError, bad_input, refused
from ttmesh.host.base import Host

# As the guardian sends them: a stop as the user sent it (torchrun passes it on), SIGUSR1/2.
FORWARDED = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip
# Every way a rank's ttmesh ends before its command runs (the wrong host, pre-flight, a lease,
# its files, the command missing) is one last stderr line ``ttmesh: not started on HOST: ...``:
# the launching ttmesh tells it from a crash by that (nothing ran: nothing to restart).
NOT_STARTED = "not started on "
NOT_STARTED_CODES = (2, 3, 127)


def refused_before_start(code: int, stderr_tail: list[str]) -> str | None:
    """The line (without ``ttmesh: ``) of a rank that exited ``code`` in its ttmesh before its
    command ran; None when the command ran."""
    lines = [line.strip() for line in stderr_tail if line.strip()]
    if code in NOT_STARTED_CODES and lines and lines[-1].startswith("ttmesh: " + NOT_STARTED):
        return lines[-1].removeprefix("ttmesh: ")
    return None


def _say(line: str) -> None:
    sys.stderr.write(f"ttmesh: {line}\n")
    sys.stderr.flush()


def write_files(files: dict[str, str]) -> None:
    """Each file at its path, unless it is already there with this content (the launching host
    wrote its own; ranks of one host share the mesh descriptor)."""
    for path, text in files.items():
        target = Path(path)
        try:
            if target.is_file() and target.read_text() == text:
                continue
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, target)
        except OSError as exc:
            raise bad_input(
                f"cannot write {path}: {exc.strerror}",
                "the job's run directory must be writable on every host",
            )


def check_here(host: Host, chips: list[str], rank: str, planned: str) -> None:
    """Refuse (exit 3) when the rank's chips are not this host's: the rank landed elsewhere."""
    from ttmesh.fabric.devices import discover

    here = {c.asic_id for c in discover(host).chips}
    missing = [a for a in chips if a not in here]
    if not missing:
        return
    me = socket.gethostname()
    what = "none of" if len(missing) == len(chips) else f"{len(missing)} of"
    raise refused(
        f"rank {rank} was planned on host {planned} but runs on {me}, which has {what} its chips "
        f"(first: {missing[0]}): the hosts are swapped",
        "start ranks where the plan put them (the rankfile and --hosts in the plan's order)",
    )


def run(host: Host, command: list[str]) -> int:
    env = dict(os.environ)
    if not command:
        raise bad_input("_rank: no command", "ttmesh _rank -- COMMAND (started by ttmesh launch)")
    chips = json.loads(env.pop("TTMESH_RANK_CHIPS", "[]"))
    fabric = json.loads(env.pop("TTMESH_RANK_FABRIC", "[]"))
    job = env.get("TTMESH_JOB_ID", "?")
    here = socket.gethostname()
    try:
        held, workdir = _before(host, env, chips, job, command)
    except TTMeshError as exc:
        raise TTMeshError(f"{NOT_STARTED}{here}: {exc.message}", exc.hint, exc.code) from None
    try:
        try:
            # SIGTERM if this ttmesh is killed (an mpirun abort SIGKILLs what it started): the
            # rank never outlives the process that holds its leases.
            child = subprocess.Popen(
                command,
                env=env,
                cwd=workdir or None,
                preexec_fn=procs.pdeathsig_preexec(os.getpid(), signal.SIGTERM),
            )
        except OSError as exc:
            _say(f"{NOT_STARTED}{here}: cannot run {command[0]}: {exc.strerror}")
            return 127

        def forward(signum: int, _frame: object) -> None:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

        for sig in FORWARDED:
            signal.signal(sig, forward)
        host.workers_started([(list(chips), child.pid)])
        if fabric:
            # One tt-metal world: the rank brings up the links between the job's chips here
            # (the driver and firmware see it; on a simulated host, a crash leaves them down).
            host.fabric_opened([(fabric, child.pid)], owner=job, supervisor=os.getpid())
        code = child.wait()
        host.worker_ended(child.pid, code == 0)
        return code if code >= 0 else 128 - code
    finally:
        held.release()


def _before(
    host: Host, env: dict[str, str], chips: list[str], job: str, command: list[str]
) -> tuple[Any, str | None]:
    """This host's duties before the command: (the chips' leases, the working directory).
    Raises TTMeshError, holding nothing, when the rank cannot start here."""
    from ttmesh.fabric import health
    from ttmesh.fabric.devices import discover
    from ttmesh.runtime import leases

    check_here(host, chips, env.get("TTMESH_RANK", "?"), env.get("TTMESH_RANK_HOST", "?"))
    write_files(json.loads(env.pop("TTMESH_RANK_FILES", "{}")))
    held = leases.acquire(host, chips, job, cmd=" ".join(command))
    try:
        problems = [
            p
            for p in health.preflight(discover(host), chips, (os.getpid(),))
            if p.severity == "error"
        ]
        if problems:
            first = problems[0]
            fix = first.fix or "see ttmesh check on that host"
            if first.kind in health.RESETTABLE:
                fix += ", or launch with --auto-reset to recover the chips first"
            raise refused(f"pre-flight: {first.what}", fix)
        workdir = env.pop("TTMESH_RANK_WORKDIR", None)
        if workdir:
            try:
                os.makedirs(workdir, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise bad_input(f"cannot make {workdir}: {exc.strerror}") from None
    except BaseException:
        held.release()
        raise
    return held, workdir


__all__ = ["TTMeshError", "check_here", "refused_before_start", "run", "write_files"]
