"""The cables between the hosts of one simulated multi-host system: ONE state every host reads.

STANDARD LIBRARY ONLY, importing nothing of ttmesh: copied into every simulated root as
``bin/_ttmesh_simcables.py`` next to ``_ttmesh_simcore.py``, which imports it (tt-smi's
stand-in resets through the core, so it keeps the cables right when the venv is gone).

On hardware a cable has two ends, one on each host, and they change together: resetting one
host's chip takes the Ethernet link down on both sides, and the link trains again only when
both ends come out of reset at about the same time, some tens of seconds later (external links
take 40-180 s after an asymmetric reset and often fail; users' runbooks reset every host of a
cable together, then wait about 90 s: ``ttmesh.host.boards.link_training``). Each host's
simulated root (``sim/state.json``) models its own chips; the cables of the whole system live
in a directory every host reaches (``ttmesh sim create ... --cables DIR``, by default a sibling
of the root named after the system), in ``cables.json``, changed under ``cables.lock`` and
replaced atomically, with the same rules as a root's state: never through a link, only in a
directory of the simulated host's owner (or root) that no one else may write, and only a file
its owner (or root) wrote.

Each cable: both ends (host index, chip unique id, channel, when that end was last reset),
whether it is trained, when a training under way completes, and a ``bad`` flag (a fault: it
never trains). A cable is up when it is trained and not bad; resetting one end downs it; it
trains when both ends were reset within ``cable_window`` seconds of each other, and is up
``cable_train_seconds`` after the later reset. The time is computed from the clock when read
(no daemon).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import math
import os
import stat
import time
from collections.abc import Iterator
from typing import Any

SCHEMA = "ttmesh.simcables/1"
FILE = "cables.json"
LOCK = "cables.lock"
MAX_BYTES = 16 * 1024 * 1024  # a quad Galaxy's cables are tens of KiB
DEFAULT_WINDOW = 5.0  # seconds between the two ends' resets for the cable to train
CONFIG_KEYS = ("cable_window", "cable_train_seconds")
UP, TRAINING, DOWN = "up", "training", "down"
_tmp_names = itertools.count()


class CableError(Exception):
    """The shared cable state cannot be used: one line and its fix (exit 2)."""

    code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check(data: Any) -> str | None:
    """What is wrong with a ``cables.json`` (None: the shape this module writes)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return "is not a cable state ttmesh wrote (schema)"
    if not isinstance(data.get("system"), str):
        return "has no system name"
    config = data.get("config")
    if not isinstance(config, dict) or not all(
        _num(config.get(k)) and config[k] >= 0 for k in CONFIG_KEYS
    ):
        return "config is not cable_window and cable_train_seconds as numbers"
    cables = data.get("cables")
    if not isinstance(cables, list):
        return "cables is not a list"
    for i, c in enumerate(cables):
        ends = c.get("ends") if isinstance(c, dict) else None
        if not (isinstance(ends, list) and len(ends) == 2):
            return f"cables[{i}] has not two ends"
        for e in ends:
            if not (
                isinstance(e, dict)
                and _int(e.get("host"))
                and isinstance(e.get("asic"), str)
                and _int(e.get("chan"))
                and (e.get("reset") is None or _num(e["reset"]))
            ):
                return f"cables[{i}] has a malformed end"
        if not (isinstance(c.get("trained"), bool) and isinstance(c.get("bad"), bool)):
            return f"cables[{i}]: trained and bad are not true or false"
        if c.get("train_at") is not None and not _num(c["train_at"]):
            return f"cables[{i}].train_at is not a time"
    return None


def new_state(system: str, cables: list[tuple[int, str, int, int, str, int]], train: float,
              window: float = DEFAULT_WINDOW) -> dict[str, Any]:  # fmt: skip
    """Every cable of ``system`` trained (``(host, asic, chan, host, asic, chan)`` each)."""
    return {
        "schema": SCHEMA,
        "system": system,
        "config": {"cable_window": float(window), "cable_train_seconds": float(train)},
        "cables": [
            {
                "ends": [
                    {"host": ha, "asic": aa, "chan": ca, "reset": None},
                    {"host": hb, "asic": ab, "chan": cb, "reset": None},
                ],
                "trained": True,
                "train_at": None,
                "bad": False,
                "why": "",
            }
            for ha, aa, ca, hb, ab, cb in cables
        ],
    }


def same_cables(data: dict[str, Any], cables: list[tuple[int, str, int, int, str, int]]) -> bool:
    """Whether ``data`` holds exactly these cables (either end first)."""

    def key(ends: Any) -> frozenset:
        return frozenset((e[0], e[1], e[2]) for e in ends)

    have = {key((e["host"], e["asic"], e["chan"]) for e in c["ends"]) for c in data["cables"]}
    want = {key(((c[0], c[1], c[2]), (c[3], c[4], c[5]))) for c in cables}
    return have == want and len(have) == len(data["cables"])


# --------------------------------------------------------------------------- the rules


def state_of(cable: dict[str, Any], now: float | None = None) -> str:
    """``up``, ``training`` (both ends reset together, not trained yet) or ``down``."""
    if cable["bad"]:
        return DOWN
    if cable["trained"]:
        return UP
    at = cable.get("train_at")
    if at is None:
        return DOWN
    return UP if (time.time() if now is None else now) >= at else TRAINING


def is_up(cable: dict[str, Any], now: float | None = None) -> bool:
    return state_of(cable, now) == UP


def end_of(cable: dict[str, Any], host: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(this host's end, the other end)."""
    a, b = cable["ends"]
    return (a, b) if a["host"] == host else (b, a)


def of_host(data: dict[str, Any], host: int) -> list[dict[str, Any]]:
    return [c for c in data["cables"] if any(e["host"] == host for e in c["ends"])]


def settle(data: dict[str, Any], now: float) -> None:
    """A training whose time has come is done (kept, so a later config change cannot undo
    it)."""
    for c in data["cables"]:
        if not c["trained"] and c.get("train_at") is not None and now >= c["train_at"]:
            c["trained"], c["train_at"] = True, None
            if not c["bad"]:
                c["why"] = ""


def reset_ends(data: dict[str, Any], host: int, asics: set[str], now: float) -> int:
    """Host ``host`` reset chips ``asics``: each cable end on them goes down, and trains when
    the other end was reset within the window (up ``cable_train_seconds`` after this reset).
    Returns how many cable ends were reset."""
    settle(data, now)
    window = float(data["config"]["cable_window"])
    train = float(data["config"]["cable_train_seconds"])
    count = 0
    for c in of_host(data, host):
        mine, other = end_of(c, host)
        if mine["asic"] not in asics:
            continue
        count += 1
        mine["reset"] = now
        c["trained"] = False
        if other["reset"] is not None and abs(now - float(other["reset"])) <= window:
            c["train_at"] = now + train
            why = "training after both ends were reset"
        else:
            c["train_at"] = None
            why = f"host {host}'s end was reset without host {other['host']}'s"
        if not c["bad"]:  # a bad cable stays down for being bad, whatever is reset
            c["why"] = why
    return count


def wedge(data: dict[str, Any], host: int, asics: set[str], why: str) -> int:
    """A job died with the fabric open on host ``host``'s chips ``asics``: their cables are down
    (both sides) until both ends are reset together."""
    settle(data, time.time())
    count = 0
    for c in of_host(data, host):
        mine, _other = end_of(c, host)
        if mine["asic"] in asics and (c["trained"] or c.get("train_at") is not None):
            c["trained"], c["train_at"], c["why"] = False, None, why
            count += 1
    return count


# --------------------------------------------------------------------------- the directory


class Store:
    """The cable state in ``directory``, trusted when it and its files are ``owner``'s (the
    simulated host's owner), root's or this user's, and no one else can write them."""

    def __init__(self, directory: str, owner: int) -> None:
        self.directory = os.path.abspath(directory)
        self.owner = owner
        self._seen: tuple[tuple[int, int, int], dict[str, Any]] | None = None

    def _fail(self, why: str) -> CableError:
        return CableError(
            f"the simulated cables' {os.path.join(self.directory, FILE)} {why}",
            "recreate the hosts: ttmesh sim create --force --system NAME --host N --root DIR "
            f"--cables {self.directory}",
        )

    def _open_dir(self) -> int:
        """An ``O_PATH`` descriptor of the directory, its last step not a link, owned by a
        trusted user and writable by no one else."""
        parent, name = os.path.split(self.directory)
        try:
            pfd = os.open(parent or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise CableError(
                f"the simulated cables' directory {self.directory} cannot be reached "
                f"({exc.strerror})",
                "give every host of the system a --cables DIR they all see",
            ) from None
        try:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
        except FileNotFoundError:
            raise CableError(
                f"the simulated cables' directory {self.directory} is missing",
                "recreate the hosts with ttmesh sim create --force ... --cables DIR",
            ) from None
        finally:
            os.close(pfd)
        st = os.fstat(fd)
        trusted = (0, os.geteuid(), self.owner)
        what = None
        if stat.S_ISLNK(st.st_mode):
            what = "is a symbolic link"
        elif not stat.S_ISDIR(st.st_mode):
            what = "is not a directory"
        elif st.st_uid not in trusted:
            what = f"is a directory of another user's (uid {st.st_uid})"
        elif st.st_mode & 0o022:
            what = "is writable by other users"
        if what is not None:
            os.close(fd)
            raise CableError(
                f"the simulated cables' directory {self.directory} {what}: refusing to use it",
                "give the hosts a --cables DIR of the hosts' owner that only they may write",
            )
        return fd

    def _read(self, directory: int) -> dict[str, Any]:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            fd = os.open(FILE, flags, dir_fd=directory)
        except FileNotFoundError:
            raise self._fail("is missing") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._fail("is a symbolic link") from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                exc.filename = os.path.join(self.directory, FILE)
                raise
            raise self._fail(f"cannot be read ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            dir_owner = os.fstat(directory).st_uid
            if not stat.S_ISREG(st.st_mode):
                raise self._fail("is not a regular file")
            if st.st_uid not in (0, os.geteuid(), dir_owner, self.owner) or st.st_mode & 0o022:
                raise self._fail(f"is another user's (uid {st.st_uid}) or writable by others")
            if st.st_size > MAX_BYTES:
                raise self._fail(f"is larger than the {MAX_BYTES >> 20} MiB a cable state can be")
            raw = os.read(fd, MAX_BYTES + 1)
        finally:
            os.close(fd)
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: nested deep
            raise self._fail("is not valid JSON") from None
        why = check(data)
        if why is not None:
            raise self._fail(why)
        return data

    def read(self) -> dict[str, Any]:
        directory = self._open_dir()
        try:
            return self._read(directory)
        finally:
            os.close(directory)

    def state_now(self) -> dict[str, Any]:
        """The state for reading only (parsed again only when the file was replaced)."""
        try:
            st = os.stat(os.path.join(self.directory, FILE), follow_symlinks=False)
        except OSError:
            return self.read()  # says what is wrong
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._seen is None or self._seen[0] != key:
            self._seen = (key, self.read())
        return self._seen[1]

    @contextlib.contextmanager
    def change(self) -> Iterator[dict[str, Any]]:
        """The state under ``cables.lock`` (mode 0600: only the owner may hold it), written
        back atomically on a normal exit."""
        directory = self._open_dir()
        try:
            fd = _lock(directory, os.fstat(directory).st_uid, self)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                data = self._read(directory)
                yield data
                _write(directory, data)
            finally:
                os.close(fd)
        finally:
            os.close(directory)


def _lock(directory: int, owner: int, store: Store) -> int:
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(LOCK, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=directory)
        if owner != os.geteuid():
            with contextlib.suppress(OSError):
                os.fchown(fd, owner, -1)
    except FileExistsError:
        try:
            fd = os.open(LOCK, flags, dir_fd=directory)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                exc.filename = os.path.join(store.directory, LOCK)
                raise
            raise CableError(
                f"the simulated cables' {os.path.join(store.directory, LOCK)} cannot be opened "
                f"({exc.strerror})",
                "remove it: ttmesh makes its own",
            ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CableError(
            f"the simulated cables' {os.path.join(store.directory, LOCK)} is not a regular file",
            "remove it: ttmesh makes its own",
        )
    return fd


def _write(directory: int, data: dict[str, Any]) -> None:
    """Replace ``cables.json`` with ``data``: a new file of this process's (O_EXCL, never
    through a link), renamed over the old one; owned by the directory's owner."""
    tmp = f".cables.{os.getpid()}.{next(_tmp_names)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o644, dir_fd=directory)
    except FileExistsError:  # left by a killed process with this PID
        os.unlink(tmp, dir_fd=directory)
        fd = os.open(tmp, flags, 0o644, dir_fd=directory)
    try:
        os.fchmod(fd, 0o644)
        owner = os.fstat(directory).st_uid
        if owner != os.geteuid():
            with contextlib.suppress(OSError):
                os.fchown(fd, owner, -1)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, sort_keys=True))
        os.replace(tmp, FILE, src_dir_fd=directory, dst_dir_fd=directory)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=directory)
        raise


def create(directory: str, owner: int, data: dict[str, Any], *, replace: bool = False) -> str:
    """Make ``directory`` (mode 0755) holding ``data`` unless it holds these cables already
    (then keep it: the other hosts share it). ``replace``: write ``data`` over another
    system's. Returns what was done: ``created``, ``kept`` or ``replaced``."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    store = Store(directory, owner)
    fd = store._open_dir()
    try:
        listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            names = set(os.listdir(listing))
        finally:
            os.close(listing)
        if "cables.json" not in names and names - {"cables.lock"}:
            # Never a directory of other files (``--cables /etc``): only a new or empty one,
            # or the cables of these hosts already.
            raise CableError(
                f"{directory} is not empty and holds no cables",
                "give --cables an empty or new directory, or the one the other hosts use",
            )
        lock = _lock(fd, os.fstat(fd).st_uid, store)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                old = store._read(fd)
            except CableError as exc:
                if "is missing" not in exc.message and not replace:
                    raise
                old = None
            wanted = [
                (a["host"], a["asic"], a["chan"], b["host"], b["asic"], b["chan"])
                for a, b in (c["ends"] for c in data["cables"])
            ]
            if old is not None and old["system"] == data["system"] and same_cables(old, wanted):
                return "kept"
            if old is not None and not replace:
                raise CableError(
                    f"{directory} holds the cables of {old['system']}, not of {data['system']}",
                    "give another --cables DIR, or add --force to replace them",
                )
            _write(fd, data)
            return "created" if old is None else "replaced"
        finally:
            os.close(lock)
    finally:
        os.close(fd)
