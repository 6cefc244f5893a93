"""What this user was already told about a host, so a note about the host as a whole (its
device nodes every user can open, stale Open MPI segments) is said once while the host stays
as it is, not on every ``check``.

A small map in the user's private runtime directory (``said.json``, beside the job records):
for each note's key (what it is about, e.g. ``device-nodes /``) the state it was said in. A
note whose state differs from the one remembered is said again. Cleared with the runtime
directory (a reboot): said once more then. A file that cannot be read or written means every
note is said, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping

from ttmesh import fileread

NAME = "said.json"
LIMIT = 64 * 1024  # bytes read of the file
KEEP = 256  # keys remembered (the oldest go first)


def fresh(states: Mapping[str, str]) -> set[str]:
    """The keys of ``states`` (key -> the host's state now) not yet said in that state; all
    of them are remembered as said from now on. A state "" (nothing to say now) forgets the
    key: once the host changes back, it is said again."""
    if not states:
        return set()
    from ttmesh.runtime import jobs

    path = jobs.base_dir() / NAME
    try:
        directory = jobs.base_dir()
        from ttmesh.paths import private_dir

        if private_dir(directory, jobs.HINT, create=False) is None:
            return set(states)
        known = json.loads(fileread.read_text(str(path), LIMIT, "said notes"))
    except FileNotFoundError:
        known = {}
    except Exception:  # unreadable, garbled, refused: say everything
        known = {}
    if not isinstance(known, dict):
        known = {}
    gone = {k for k, state in states.items() if not state and k in known}
    said = {k for k, state in states.items() if state and not _same(known.get(k), state)}
    now = time.time()
    for key in gone:
        del known[key]
    for key in said:
        known[key] = [states[key], now]
    if said or gone:
        kept = sorted(known.items(), key=lambda kv: _when(kv[1]))[-KEEP:]
        _write(path, dict(kept))
    return said


def _same(entry: object, state: str) -> bool:
    return isinstance(entry, list) and len(entry) == 2 and entry[0] == state


def _when(entry: object) -> float:
    if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], (int, float)):
        return float(entry[1])
    return 0.0


def _write(path: os.PathLike[str], data: dict) -> None:
    """Replace the file (a new name of this process's own, renamed; never through a link)."""
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        fd = os.open(tmp, flags, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
