"""The front of one attempt: the ``ttmesh`` process that forks the guardian and waits for it.

The front forks the guardian (:class:`ttmesh.launcher.attempt.guardian.Guardian`), forwards
the signals ttmesh gets to it (:func:`ttmesh.launcher.attempt.signals.forward`), relays its
events to the job's view, and reads its verdict (an AttemptResult, as JSON) from a pipe. It is
a child subreaper: if the guardian dies, everything orphaned comes to it and is killed, and
the attempt ends GUARDIAN_LOST. The guardian, for its part, stays until the front says it took
the verdict (a byte on a pipe of their own), and finishes the job in its place when the front
is gone.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import selectors
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ttmesh import procs
from ttmesh.dataclass import dataclass
from ttmesh.fabric.devices import Inventory
from ttmesh.host.base import Host
from ttmesh.launcher.attempt.events import EventReader, EventWriter, Observer
from ttmesh.launcher.attempt.guardian import Guardian, Options
from ttmesh.launcher.attempt.record import AttemptResult
from ttmesh.launcher.attempt.signals import FORWARDED, forward, stop_reason
from ttmesh.launcher.planning import ports
from ttmesh.launcher.planning.liveness import Liveness
from ttmesh.launcher.planning.plan import LaunchPlan
from ttmesh.render import note
from ttmesh.states import AttemptEnd, JobPhase
from ttmesh.vocab import Source

TICK = 0.05  # the front's observer hears at least this often while an attempt runs

__all__ = ["run_attempt"]


def run_attempt(
    plan: LaunchPlan,
    attempt: int,
    options: Options,
    base_env: dict[str, str],
    orphaned: Callable[[AttemptResult], int] | None = None,
    host: Host | None = None,
    on_start: Callable[[int], None] | None = None,
    liveness: Liveness | None = None,
    inv: Inventory | None = None,
) -> AttemptResult:
    """Run one attempt of the job (every rank once) and return how it ended.

    ``orphaned``: what the guardian does with the attempt's result when the launcher was
    killed while it ran (finish the job in its place); its return value is the exit code.
    ``host`` hears the job's events (workers holding chips, fabric opened and ended).
    ``liveness``: the chips' heartbeats, still being read: the guardian completes the check
    while the ranks run (:class:`ttmesh.launcher.planning.liveness.Liveness`). ``inv``: the
    host's chips as the job found them (the guardian watches the job's while they run)."""
    observer = options.observer
    events: tuple[int, int] | None = None
    if observer is not None:
        observer.attempt(attempt)
        events = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    # If the guardian itself dies, what it left is re-parented here and swept below.
    procs.set_subreaper()
    # alive: the front holds it (its end: the front is gone); result: the verdict; taken: the
    # front says it has the result (a byte); until then the guardian stays, so a front killed
    # between the verdict and taking it over is still a front gone: the guardian finishes the
    # job in its place.
    pipes = _Pipes(os.pipe(), os.pipe(), os.pipe(), events)
    # A signal for ttmesh that arrives around the fork waits (blocked, pending) until someone
    # handles it: the front's forwarders below, the guardian's handlers (signals.Wakeups).
    # Unblocked, it would end the front before its forwarders exist, or the guardian before
    # its own, with the front's handlers (a SIGTERM meant to stop the job gracefully).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    ports.release_held()  # the ranks bind the ports the plan chose (a torch-tpu job's slice)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid == 0:
        _guardian_child(plan, attempt, options, base_env, pipes, orphaned, host, liveness, inv)
    pipes.close_guardian_ends()
    previous = {}
    stops: list[int] = []  # stop signals forwarded (the guardian may be past acting on them)
    continued: list[int] = []  # the front was stopped (SIGSTOP) and continued meanwhile
    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, functools.partial(forward, pid, stops))
    previous[signal.SIGCONT] = signal.signal(signal.SIGCONT, lambda *_: continued.append(1))
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        if on_start is not None:
            on_start(pid)
        if observer is not None and events is not None:
            try:
                _relay(events[0], observer)
            finally:
                os.close(events[0])
        data = _read_all(pipes.result[0])  # until the guardian has written it all, or died
        if data:
            with contextlib.suppress(OSError):
                os.write(pipes.taken[1], b"k")
        status = _wait(pid)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for fd in (pipes.result[0], pipes.taken[1], pipes.alive[1]):
            os.close(fd)
    _kill_tree(os.getpid())  # whatever reached the front after the guardian ended
    if data:
        return _late_stop(AttemptResult.from_json(json.loads(data)), stops, bool(continued))
    how = procs.describe_status(status)
    return AttemptResult(
        attempt,
        procs.exit_code(status) or 1,
        Source.TTMESH,
        None,
        f"the supervisor {how}",
        AttemptEnd.GUARDIAN_LOST,
    )


@dataclass
class _Pipes:
    """The pipes between the front and its guardian: (read end, write end) each."""

    alive: tuple[int, int]  # the guardian reads: its end means the front is gone
    result: tuple[int, int]  # the guardian writes the verdict
    taken: tuple[int, int]  # the front writes a byte once it has the verdict
    events: tuple[int, int] | None  # the guardian's events for the front's observer

    def close_guardian_ends(self) -> None:
        """In the front: the guardian's ends."""
        for fd in (self.alive[0], self.result[1], self.taken[0]):
            os.close(fd)
        if self.events is not None:
            os.close(self.events[1])


def _guardian_child(
    plan: LaunchPlan,
    attempt: int,
    options: Options,
    base_env: dict[str, str],
    pipes: _Pipes,
    orphaned: Callable[[AttemptResult], int] | None,
    host: Host | None,
    liveness: Liveness | None,
    inv: Inventory | None = None,
) -> None:
    """The forked guardian: run the attempt, hand the verdict to the front (or, the front
    gone, finish the job in its place), and exit; never returns."""
    code = 1
    try:
        for fd in (pipes.alive[1], pipes.result[0], pipes.taken[1]):
            os.close(fd)
        writer = None
        if pipes.events is not None:
            os.close(pipes.events[0])
            writer = EventWriter(pipes.events[1])
            # The guardian reports through the pipe; stream wrappers a view installed in
            # the front (to print above its table) are the front's.
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        guardian = Guardian(
            plan, attempt, options, base_env, pipes.alive[0], host or Host(plan.root), writer,
            liveness, inv,
        )  # fmt: skip
        result = guardian.run()
        code = result.code
        if guardian.front_gone and orphaned is not None:
            code = orphaned(result)
        else:
            try:
                _write_all(pipes.result[1], json.dumps(result.to_json()).encode())
                os.close(pipes.result[1])
                if writer is not None:
                    writer.close()
                taken = _taken(pipes.taken[0])
            except BrokenPipeError:
                taken = False
            if not taken:
                # The front died after the ranks had ended (while the verdict was made, or
                # before it took the verdict over): finish the job in its place.
                if orphaned is None:
                    raise BrokenPipeError("the launcher is gone")
                guardian.front_gone = True
                code = orphaned(result)
    except BaseException as exc:
        if not isinstance(exc, BrokenPipeError | SystemExit):
            _report_crash(exc)
        with contextlib.suppress(Exception):
            _kill_tree(os.getpid())  # a broken guardian still leaves nothing behind
    finally:
        os._exit(code)


def _late_stop(result: AttemptResult, stops: list[int], continued: bool) -> AttemptResult:
    """The verdict, given the stop signals the front forwarded while the attempt ran."""
    if stops and result.code == 0 and not result.end.interrupted:
        # Every rank had succeeded before the stop could be acted on (typically: it was
        # sent while ttmesh itself was stopped, SIGSTOP, and every rank ended meanwhile).
        # Nothing was left to stop: say so, rather than drop it silently.
        why = " (sent while ttmesh was stopped)" if continued else ""
        note(
            f"{procs.signal_name(stops[0])}{why} came after every rank had ended: "
            "nothing was left to stop"
        )
    if stops and result.code != 0 and not result.end.interrupted:
        # A stop the guardian did not act on: it came as a failed attempt ended (the
        # verdict was being made), or while a restartable stop (a hang) was under way.
        # It is still the user's stop: the job ends as stopped, never restarted.
        result = replace(
            result, code=128 + stops[0], source=Source.TTMESH, rank=None,
            reason=stop_reason(stops[0]), end=AttemptEnd.STOPPED, asked=True,
        )  # fmt: skip
    return result


def _relay(fd: int, observer: Observer) -> None:
    """The guardian's events to ``observer``, until the guardian closes the pipe (it ended,
    or was killed). A view that fails leaves the console plain for the rest of the attempt."""
    reader = EventReader(observer)
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            ready = selector.select(TICK)
            try:
                if ready:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    reader.feed(data)
                reader.observer.tick()
            except Exception as exc:
                if isinstance(reader.observer, _Plain):
                    raise
                reader.observer = _Plain()
                _report_crash(exc, "the live view")


class _Plain:
    """An observer that only writes the console's bytes, as if there were no view."""

    def phase(self, phase: JobPhase, detail: str = "") -> None:
        pass

    def attempt(self, attempt: int) -> None:
        pass

    def rank_started(self, rank: int, pid: int) -> None:
        pass

    def rank_ready(self, rank: int) -> None:
        pass

    def rank_exited(self, rank: int, code: int, how: str, stopped: bool) -> None:
        pass

    def lines(self, last: dict[int, str]) -> None:
        pass

    def checklist(self, rows: list[dict[str, Any]], timeout: float | None) -> None:
        pass

    def output(self, fd: int, data: bytes) -> None:
        with contextlib.suppress(OSError):
            _write_all(fd, data)

    def tick(self) -> None:
        pass


def _report_crash(exc: BaseException, what: str = "supervisor") -> None:
    """A bug in the guardian (or a view): one line (the traceback with TTMESH_DEBUG=1)."""
    if os.environ.get("TTMESH_DEBUG"):
        import traceback

        text = f"ttmesh: {what} error:\n" + traceback.format_exc()
    else:
        text = f"ttmesh: {what} error: {type(exc).__name__}: {exc} (TTMESH_DEBUG=1 shows more)\n"
    with contextlib.suppress(Exception):
        os.write(2, text.encode())


def _wait(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _taken(fd: int) -> bool:
    """Did the front take the result over (a byte), rather than die (the pipe's end)?"""
    try:
        return os.read(fd, 1) == b"k"
    except OSError:
        return False


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _kill_tree(root: int) -> None:
    """SIGKILL every descendant of ``root`` (this process, a subreaper) until none is left.

    Orphans re-parent to it: a walk of the tree can read a dying child (mpirun once the
    guardian is killed) as a zombie just as its children are handed over, and see nothing
    alive. So an empty walk ends the sweep only when no child is left to reap either: a child
    is reapable only once its exit, the hand-over of its children included, is complete."""
    for _ in range(200):
        left = procs.live_descendants(root)
        if left:
            procs.signal_pids(left, signal.SIGKILL)
        procs.reap_all()
        if not left and not procs.has_children():
            break
        time.sleep(0.01)
    procs.reap_all()
