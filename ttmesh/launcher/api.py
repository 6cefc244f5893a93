"""ttmesh from Python: ``ttmesh.launch(options) -> Result``, the launch ``ttmesh launch`` runs
(docs/api.md), as torch's ``elastic_launch(config, entrypoint)`` is torchrun's.

The options are ``ttmesh launch``'s (:class:`~ttmesh.launcher.planning.options.LaunchOptions`,
by the command's parameter names, with its defaults), checked once; the launch runs in the way
its mode says (:mod:`ttmesh.launcher.modes`) and returns how the job ended (:class:`Result`),
or raises :class:`~ttmesh.errors.LaunchError` when it refuses (nothing started). A launch runs
in the main thread (it handles SIGINT, SIGTERM, SIGHUP and SIGQUIT as ttmesh does); another
thread stops it with :meth:`Control.stop`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from ttmesh import procs
from ttmesh.errors import LaunchError, TTMeshError, bad_input
from ttmesh.launcher.attempt.signals import Stopped, stop_reason
from ttmesh.launcher.modes import MODES, Plain, Result, View
from ttmesh.launcher.planning.options import Launch, LaunchOptions, TorchrunFlags
from ttmesh.render import note

__all__ = [
    "Control",
    "LaunchError",
    "LaunchOptions",
    "Plain",
    "Result",
    "TorchrunFlags",
    "View",
    "launch",
]


class Control:
    """Stops a launch from another thread: :meth:`stop` is what ``ttmesh stop`` sends ttmesh
    (SIGTERM), delivered to the thread running the launch, which handles it as ttmesh handles
    a signal sent to it: before the start nothing starts, during an attempt every rank is
    stopped within ``--grace``, between attempts the job ends there. Its exit code is then
    128 + the signal's number. One control serves one launch at a time, and once stopped stays
    stopped (a cancel token): a launch given it later ends before it is planned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: int | None = None  # the launch's thread, while it runs
        self.asked: int | None = None  # the first stop asked (a signal number)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the launch (any thread; at once, whatever it is doing)."""
        if sig not in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            refusal = bad_input(
                f"Control.stop({sig}): stops with SIGINT, SIGTERM, SIGHUP or SIGQUIT"
            )
            raise LaunchError(refusal.message, refusal.hint, refusal.code)  # the API's one type
        with self._lock:
            if self.asked is None:
                self.asked = sig
            thread = self._thread
        if thread is not None:
            signal.pthread_kill(thread, sig)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The launch's life: a stop asked now reaches its thread as a signal, which raises
        :class:`~ttmesh.launcher.attempt.signals.Stopped` where the job's own handlers (between and
        during attempts) do not take it: while the launch is planned."""

        def stopped(sig: int, _frame: FrameType | None) -> None:
            raise Stopped(sig)

        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
        previous = {sig: signal.signal(sig, stopped) for sig in handled}
        with self._lock:
            self._thread = threading.get_ident()
        try:
            yield
        finally:
            with self._lock:
                self._thread = None
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def launch(
    options: LaunchOptions, view: View | None = None, control: Control | None = None
) -> Result:
    """Run the launch ``options`` describe (``ttmesh launch``'s), to its end.

    ``view``: what is shown while it runs (:class:`~ttmesh.launcher.modes.View`; default:
    plain prefixed lines, as in a pipe). ``control``: stops it from another thread. A dry run
    returns its plan (``Result.plan``) and starts nothing. A refusal (bad input, exit 2; a
    pre-flight refusal, exit 3; ...) raises :class:`LaunchError` with its code and one line;
    a job that ran returns its exit code, its failing worker's when one failed."""
    try:
        if threading.current_thread() is not threading.main_thread() and not options.dry_run:
            raise bad_input(
                "ttmesh.launch runs in the main thread: it handles SIGINT, SIGTERM, SIGHUP and "
                "SIGQUIT as ttmesh does",
                "call it from the main thread, and stop it from another with Control.stop()",
            )
        built = Launch.from_options(options)  # checks only: a stop asked meanwhile waits
        if options.events_fd is not None:
            from ttmesh.launcher.job.feed import open_channel

            open_channel(options.events_fd)  # a pipe of this user's, or one line, exit 2
        was_subreaper = procs.is_subreaper()
        try:
            with control.running() if control is not None else contextlib.nullcontext():
                return _run(built, view or Plain(), control)
        finally:
            # Each attempt makes this process the subreaper of what its ranks leave (and sweeps
            # it); once the launch is over, the program that embeds it is as it was: another
            # process's orphans are not its to inherit.
            if not was_subreaper:
                procs.set_subreaper(False)
    except LaunchError:
        raise
    except TTMeshError as exc:  # every refusal as the one type, where it was raised
        raise LaunchError(exc.message, exc.hint, exc.code).with_traceback(
            exc.__traceback__
        ) from None


def _run(built: Launch, view: View, control: Control | None) -> Result:
    try:
        if control is not None and control.asked is not None:  # asked before it began
            raise Stopped(control.asked)
        return MODES[built.mode](built, view).run()
    except Stopped as exc:  # a Control's stop before the job's own handlers took it
        reason = stop_reason(exc.sig)
        note(f"{reason}: stopping the launch")
        return Result(128 + exc.sig, built.mode, reason=reason, source="ttmesh")
