"""How the guardian hears signals, and what each one does to the attempt.

The front forwards the signals ttmesh gets to the guardian (:func:`forward`); the guardian
hears them, with its children's exits (SIGCHLD), as bytes on a wakeup fd (:class:`Wakeups`), so
its one loop learns of them at once, never inside a handler. :func:`react` is what a signal
means, given how the attempt stands: a pure decision the guardian carries out.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from ttmesh import procs
from ttmesh.dataclass import dataclass
from ttmesh.states import AttemptEnd

FORWARDED = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip
# Signals sent to ttmesh that stop the job gracefully (exit 128 + signal): as torchrun's agent
# does, the ranks get the signal that was sent (a rank's KeyboardInterrupt handler runs on
# Ctrl-C), then SIGKILL when the grace ends. SIGUSR1/2 are passed on to the workers; SIGINT is
# Ctrl-C (a second one kills at once).
STOPPING: dict[int, str] = {
    signal.SIGTERM: "terminated", signal.SIGHUP: "hangup", signal.SIGQUIT: "quit",
}  # fmt: skip
# From the launcher only: another host of the job failed, stop this host's ranks (gracefully).
PEER_STOP = signal.SIGRTMIN + 1


class Stopped(BaseException):
    """SIGTERM or SIGHUP reached the launcher outside an attempt (pre-flight, recovery after
    a crash, a restart's wait), where no guardian is there to handle it (``job.run``, and
    ``ttmesh.launch``'s ``Control`` while the launch is planned)."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


def stop_reason(sig: int) -> str:
    """How a job stopped by a signal to ttmesh ends: "interrupted (SIGINT)", "terminated
    (SIGTERM)", "hangup (SIGHUP)"."""
    what = "interrupted" if sig == signal.SIGINT else STOPPING[sig]
    return f"{what} ({procs.signal_name(sig)})"


@dataclass
class Stop:
    """Why ttmesh (not a failing rank) stops the attempt, the code it ends with, and how it
    ends: whether a restart may help is its end's (AttemptEnd.restartable: a hang, an
    unhealthy server), and so is a refusal's quiet."""

    reason: str
    code: int
    end: AttemptEnd = AttemptEnd.STOPPED
    user: bool = False  # the user stopped the job (a signal to ttmesh): it ends STOPPED
    # What the ranks are sent first: the user's own signal (torchrun's agent passes it on), or
    # SIGTERM when ttmesh stops them (a failure, a hang, another host).
    sends: int = signal.SIGTERM

    @property
    def quiet(self) -> bool:
        """A refusal: its one line is all that is said (no drain lines)."""
        return self.end is AttemptEnd.REFUSED


@dataclass(frozen=True)
class Reaction:
    """What one signal does: say ``say`` (if any); then begin ``stop`` (a graceful stop, if
    any, as the attempt's stop when it has none yet), or ``kill`` every worker at once, or pass
    the signal on to the ranks (``forward``). Nothing of it: the signal changes nothing."""

    say: str = ""
    stop: Stop | None = None
    kill: bool = False
    forward: bool = False


def react(
    sig: int, stop: Stop | None, failing: bool, whom: str = "every worker", how: str = ""
) -> Reaction:
    """What ``sig`` does to an attempt whose stop is ``stop`` (None: not stopping) and whose
    first failing rank is being stopped after (``failing``); ``whom`` is what a graceful stop
    stops and ``how``, as said ("the server", "SIGTERM: its own drain, up to 30 s")."""
    if sig == signal.SIGINT:
        if stop is not None or failing:
            if stop is None:  # a failing rank's teardown: the user's stop wins, as SIGTERM's does
                return Reaction(
                    "interrupted while stopping: killing every worker now",
                    Stop(stop_reason(sig), 130, user=True),
                    kill=True,
                )
            return Reaction("second interrupt: killing every worker now", kill=True)
        return Reaction(
            f"interrupted: stopping {whom} ({how + '; ' if how else ''}Ctrl-C again to kill at once)",
            Stop(stop_reason(sig), 130, user=True, sends=sig),
        )
    if sig in STOPPING and stop is None:
        why = stop_reason(sig)
        said = f"{why}: stopping {whom}" + (f" ({how})" if how else "")
        return Reaction(said, Stop(why, 128 + sig, user=True, sends=sig))
    if sig == PEER_STOP and stop is None and not failing:
        return Reaction(stop=Stop("stopped: another host of the job failed", 128 + signal.SIGTERM))
    if sig in (signal.SIGUSR1, signal.SIGUSR2):
        return Reaction(forward=True)
    return Reaction()


class Wakeups:
    """The guardian's signals and its children's exits, as bytes on a non-blocking pipe.

    :meth:`install` makes every forwarded signal, SIGCHLD and PEER_STOP write its number
    there (no handler runs any of the guardian's code) and delivers what was held blocked
    since the fork; :meth:`restore` undoes it all (for a guardian run inside another program:
    the tests)."""

    HEARD = (*FORWARDED, signal.SIGCHLD, PEER_STOP)

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)
        os.set_blocking(self.read_fd, False)
        self.previous: dict[int, Any] = {}
        self.previous_fd: int | None = None
        self.previous_mask: Any = None

    def install(self) -> None:
        for sig in self.HEARD:
            self.previous[sig] = signal.signal(sig, lambda *_: None)
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        # Blocked since the fork (run_attempt): what arrived meanwhile is delivered now, here.
        # Before the first worker starts: a child inherits the mask, even across exec.
        self.previous_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)

    def heard(self) -> list[int]:
        """The signals heard since the last call (SIGCHLD among them), in order."""
        try:
            return list(os.read(self.read_fd, 1024))
        except BlockingIOError:
            return []

    def restore(self) -> None:
        if self.previous_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.previous_mask)
        if self.previous_fd is not None:
            signal.set_wakeup_fd(self.previous_fd)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


# --------------------------------------------------------------------------- the front


def forward(pid: int, stops: list[int], sig: int, _frame: object = None) -> None:
    """The front's handler: ``sig`` on to the guardian ``pid`` (a stop noted in ``stops``)."""
    stop = sig == signal.SIGINT or sig in STOPPING
    if stop:
        stops.append(sig)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    if not stop:
        return
    # A stopped guardian (SIGSTOP) would hold the stop, pending, as long as it stays stopped:
    # continue it, so the job stops (as systemd does after its SIGTERM, systemd.kill(5)).
    state = procs.state(pid)
    if state == "T":  # said first: once continued, the guardian's own lines follow at once
        say(f"the supervisor (pid {pid}) was stopped (SIGSTOP): continued it, to stop the job")
        procs.continue_stopped(pid)
    elif state == "t":
        say(f"the supervisor (pid {pid}) is held by a debugger: the stop waits for it")


def say(message: str) -> None:
    """A line from a signal handler: straight to fd 2 (no stream buffer in between)."""
    with contextlib.suppress(OSError):
        os.write(2, f"ttmesh: {message}\n".encode())
