"""A stop signal that arrives while tt-smi resets chips waits for the reset's attempt to end.

tt-smi's reset takes the chips off the bus and brings them back (``tt-smi -r``: reset, then
re-initialise; a Galaxy's ``-glx_reset`` all 32 chips at once). Killed between the two, it
leaves the chips lost to the host until a reboot or another reset (the simulator models this:
a chip whose reset was cut short is missing). So while one attempt runs (tt-smi, then reading
the chips back), SIGINT, SIGTERM and SIGHUP are held: the first is acknowledged on stderr at once
and delivered to the handler that was there before (KeyboardInterrupt for Ctrl-C, a job's stop)
when the attempt ends; a second is delivered at once (the user means it: a hung tt-smi), as a
second Ctrl-C kills a job's ranks at once. SIGKILL cannot be held; tt-smi runs in a session of its
own with its output in a file, so it finishes its reset even then.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from ttmesh.dataclass import dataclass

STOPS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class Held:
    """The first stop signal that came while held (None: none came)."""

    sig: int | None = None
    delivered: bool = False  # passed on (at the end, or at once by a second stop)


@contextlib.contextmanager
def held(what: str) -> Iterator[Held]:
    """Hold stop signals while ``what`` (e.g. "the reset of 0000:01:00.0") runs. Outside the
    main thread nothing can be held (Python runs handlers there only): nothing is changed."""
    got = Held()
    if threading.current_thread() is not threading.main_thread():
        yield got
        return

    def hold(sig: int, _frame: object) -> None:
        if got.sig is not None:  # the second: the user means it (a hung tt-smi, say)
            got.delivered = True
            for s, handler in previous.items():
                signal.signal(s, handler)
            _deliver(sig, previous.get(sig))
            return
        got.sig = sig
        with contextlib.suppress(OSError):  # os.write: no lock a handler could deadlock on
            os.write(
                2,
                f"ttmesh: {signal.Signals(sig).name}: stopping once {what} has ended (a reset "
                "cut short leaves the chips lost to the host; a second stop cuts it short, "
                "kill -9 leaves tt-smi to finish on its own)\n".encode(),
            )

    previous: dict[int, Any] = {}
    try:
        for sig in STOPS:
            previous[sig] = signal.signal(sig, hold)
        yield got
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if got.sig is not None and not got.delivered:
            got.delivered = True
            _deliver(got.sig, previous.get(got.sig))


def _deliver(sig: int, handler: Any) -> None:
    """The held signal, to the handler it would have reached."""
    if callable(handler):
        handler(sig, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), sig)
    # SIG_IGN (or a handler set outside Python): it would have been ignored
