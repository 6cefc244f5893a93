"""tt-umd's reset notices: a process that resets chips tells every listener on the host first.

The protocol, as tt-umd implements it (``device/api/umd/device/warm_reset.hpp``,
``device/warm_reset.cpp``, ``examples/reset_notification_example/README.md``):

* A listener is a Unix stream socket named ``client_<PID>.sock`` in ``/tmp/tt_umd_listeners``.
  tt-umd makes the directory with mode 0777 (not sticky) and its socket 0777, so that any
  user's notifier may connect.
* The notifier (``WarmReset::warm_reset``, which tt-smi's reset runs) connects to every socket
  there but its own pid's, with a blocking ``connect`` and no timeout (``get_connected_listeners``,
  warm_reset.cpp:507-514), and then writes one byte to each: ``0x01`` (PRE_RESET)
  (``notify_all_listeners``, warm_reset.cpp:680-684). It then waits its grace (2 s) whatever
  the listeners do, resets, connects again and writes ``0x02`` (POST_RESET), with no wait. With
  no listener connected it does not wait at all.
* The bytes carry no chip identity: a notice is for the whole host.

So a listener must never leave its accept queue full: the notifier's ``connect`` would block
until it is not, and with it the reset (``tt-smi -r``). Anyone may connect, so what a listener
keeps is bounded whatever arrives: :class:`Listener` accepts at once (a batch per call, so a
flood never holds its caller's loop), reads one byte per connection, keeps at most
:data:`MAX_OPEN` connections waiting for their byte (when full, the user holding the most loses
its oldest: a flood by one user never pushes out another's notifier) and each for at most
:data:`DEADLINE` seconds. What it drops is counted per user, and :class:`Tally` says what a
listener let pass in a bounded number of lines: never a line per notice.

ttmesh listens while a job's ranks run (``launcher.attempt``) and while ``ttmesh metrics``
serves. The directory is writable by every user and by tt-umd's own processes: it is reached
without following a link anyone but root or this user owns (:func:`ttmesh.paths.walk`),
nothing in it is read or followed, and the socket is bound and removed by name relative to the
directory's descriptor. A socket another user removes or replaces only stops this process
hearing notices; what a notice may make ttmesh do is decided from the kernel's word on who
sent it (``SO_PEERCRED``), never from anything the sender says
(:mod:`ttmesh.fabric.resetscope`).
"""

from __future__ import annotations

import _socket  # the socket module's C part: socket's enums cost a guardian 3 ms to import
import contextlib
import errno
import itertools
import os
import selectors
import stat
import struct
import time
from collections import Counter
from collections.abc import Callable

from ttmesh import paths, procs
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError
from ttmesh.render import plural

LISTENER_DIR = "tmp/tt_umd_listeners"  # under the host's root: /tmp/tt_umd_listeners on /
PRE_RESET = 0x01
POST_RESET = 0x02
KINDS = {PRE_RESET: "pre-reset", POST_RESET: "post-reset"}
GRACE = 2.0  # seconds tt-umd's notifier waits after PRE_RESET (WarmReset::warm_reset)
MAX_OPEN = 64  # connections kept waiting for their byte, all senders together
BATCH = 128  # connections accepted per read(): the caller's loop goes on between batches
# Seconds a connection may wait for its byte. tt-umd's notifier writes once it has connected
# to every listener on the host: at once, unless another listener there stalls its connect.
DEADLINE = 10.0
BACKLOG = _socket.SOMAXCONN  # connects the kernel queues before accept: a burst never blocks one
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def socket_name(pid: int) -> str:
    return f"client_{pid}.sock"


@dataclass(frozen=True)
class Notice:
    """One byte from a notifier, and who the kernel says sent it."""

    kind: str  # "pre-reset" | "post-reset"
    pid: int  # 0: a process outside this PID namespace (a container's, or the host's)
    uid: int
    command: tuple[str, ...] = ()  # the sender's command line, when it could be read
    start: int | None = None  # the sender's start time when the byte was read (None: gone)

    def who(self) -> str:
        """``tt-smi -r 0000:03:00.0 (pid 412, user bob)``: the sender in a few words."""
        words = list(self.command)
        if (
            len(words) > 1
            and os.path.basename(words[0]).startswith("python")
            and not words[1].startswith("-")
        ):
            words = words[1:]  # a Python tool's own name (tt-smi), not its interpreter's
        if words:
            words[0] = os.path.basename(words[0])
        # The sender chose its command line: one printable line, bounded, whatever it holds.
        shown = procs.one_line(" ".join(words))[:120] or "a process"
        return f"{shown} (pid {self.pid}, user {procs.user_name(self.uid)})"

    @property
    def sender(self) -> tuple[int, int, int | None]:
        """(uid, pid, start time): the process that sent it, never another of the same pid."""
        return (self.uid, self.pid, self.start)


@dataclass
class _Waiting:
    """An accepted connection whose byte has not come yet."""

    sock: _socket.socket
    pid: int
    uid: int
    deadline: float  # monotonic
    order: int  # accept order: the oldest of a user is dropped first


@dataclass
class Listener:
    """This process's ``client_<PID>.sock``, and the notices it has heard.

    ``fileno()`` is readable when a notifier connected or wrote (an epoll descriptor over the
    socket and the connections waiting for their byte): a caller's selector waits on it, with
    :meth:`due` as its longest wait, and calls :meth:`read`."""

    directory: int  # O_PATH descriptor of the listener directory
    sock: _socket.socket
    name: str
    identity: tuple[int, int]  # (st_dev, st_ino) of the name bound: removed only while it is ours
    selector: selectors.EpollSelector = field(default_factory=selectors.EpollSelector)
    waiting: dict[int, _Waiting] = field(default_factory=dict)  # by descriptor
    # Connections closed without a notice (silent too long, an unknown byte, none, or pushed
    # out by the cap), per sender's user, since the last take_dropped().
    dropped: Counter[int] = field(default_factory=Counter)
    clock: Callable[[], float] = time.monotonic
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def fileno(self) -> int:
        return self.selector.fileno()

    def read(self) -> list[Notice]:
        """Read the bytes that arrived, accept what connected (one batch), close what waited
        too long: the notices, in order. Never blocks."""
        out: list[Notice] = []
        accept = False
        for key, _ in self.selector.select(0):
            if key.fileobj is self.sock:
                accept = True
                continue
            entry = self.waiting.get(key.fd)
            if entry is None or entry.sock is not key.fileobj:
                continue  # closed in this round (its descriptor may be reused)
            self._take(entry, out)
        if accept:
            self._accept(out)
        self.expire()
        return out

    def due(self) -> float | None:
        """Seconds until a waiting connection's deadline (None: none waits)."""
        if not self.waiting:
            return None
        first = min(w.deadline for w in self.waiting.values())
        return max(0.0, first - self.clock())

    def expire(self) -> None:
        """Close the connections that waited longer than :data:`DEADLINE` for their byte."""
        now = self.clock()
        for entry in [w for w in self.waiting.values() if w.deadline <= now]:
            self._drop(entry, counted=True)

    def take_dropped(self) -> Counter[int]:
        """Connections closed without a notice since the last call, per sender's user."""
        out, self.dropped = self.dropped, Counter()
        return out

    def _take(self, entry: _Waiting, out: list[Notice]) -> None:
        """Read the connection's one byte when it is there (tt-umd's listener reads one
        too); a sender's further bytes are never read."""
        try:
            data = entry.sock.recv(1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        notice = None
        if data and data[0] in KINDS:  # tt-umd ignores an unknown byte too
            notice = Notice(
                KINDS[data[0]],
                entry.pid,
                entry.uid,
                procs.argv(entry.pid) if entry.pid > 0 else (),
                procs.start_time(entry.pid) if entry.pid > 0 else None,
            )
            out.append(notice)
        self._drop(entry, counted=notice is None)

    def _accept(self, out: list[Notice]) -> None:
        for _ in range(BATCH):
            try:
                fd, _ = self.sock._accept()  # type: ignore[attr-defined]  # socket.accept's own
                conn = _socket.socket(fileno=fd)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or a connection gone before its accept
                return
            try:
                pid, uid, _gid = _CRED.unpack(
                    conn.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _CRED.size)
                )
                conn.setblocking(False)
            except OSError:
                conn.close()
                continue
            entry = _Waiting(conn, pid, uid, self.clock() + DEADLINE, next(self._order))
            self._take(entry, out)  # its byte is often there already: nothing kept
            if entry.sock.fileno() < 0:
                continue
            self._make_room()
            self.waiting[conn.fileno()] = entry
            self.selector.register(conn, selectors.EVENT_READ)

    def _make_room(self) -> None:
        """At the cap, the user holding the most waiting connections loses its oldest."""
        while len(self.waiting) >= MAX_OPEN:
            held = Counter(w.uid for w in self.waiting.values())
            most = max(held.values())
            victim = min(
                (w for w in self.waiting.values() if held[w.uid] == most), key=lambda w: w.order
            )
            self._drop(victim, counted=True)

    def _drop(self, entry: _Waiting, *, counted: bool) -> None:
        """Close a connection (taken or not yet registered ones too); ``counted``: it ends
        without a notice."""
        fd = entry.sock.fileno()
        if fd >= 0 and self.waiting.get(fd) is entry:
            del self.waiting[fd]
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(entry.sock)
        entry.sock.close()
        if counted:
            self.dropped[entry.uid] += 1

    def close(self) -> None:
        """Stop listening; remove the socket's name only if it is still the one bound here."""
        for entry in list(self.waiting.values()):
            self._drop(entry, counted=False)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.sock)
        self.selector.close()
        self.sock.close()
        if self.directory >= 0:
            with contextlib.suppress(OSError):
                st = os.stat(self.name, dir_fd=self.directory, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == self.identity and stat.S_ISSOCK(st.st_mode):
                    os.unlink(self.name, dir_fd=self.directory)
            with contextlib.suppress(OSError):
                os.close(self.directory)
            self.directory = -1


def listen(root: str | os.PathLike[str], pid: int | None = None) -> Listener:
    """Listen for reset notices on the host at ``root`` as tt-umd's listeners do.

    The directory is made (mode 1777: tt-umd's 0777, plus the sticky bit so no user removes
    another's socket) when missing. Raises OSError or TTMeshError (a link another user
    planted on the way, a file in the directory's place) for the caller to say."""
    pid = os.getpid() if pid is None else pid
    where = os.path.join(os.fspath(root), LISTENER_DIR)
    fd, created = paths.walk(where, what="tt-umd's listener directory", create=True)
    try:
        if created:
            with contextlib.suppress(OSError):
                os.chmod(f"/proc/self/fd/{fd}", 0o1777)
        name = socket_name(pid)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)  # a socket left by a process of this pid (tt-umd does so)
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            # Made 0666 as it is bound (no chmod by name afterwards, which a link swapped in
            # meanwhile would redirect): notifiers of every user may connect, as to tt-umd's.
            old = os.umask(0o111)
            try:
                sock.bind(f"/proc/self/fd/{fd}/{name}")
            finally:
                os.umask(old)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISSOCK(st.st_mode):
                raise OSError(errno.EEXIST, "replaced while it was made", name)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
    except BaseException:
        os.close(fd)
        raise
    listener = Listener(fd, sock, name, (st.st_dev, st.st_ino))
    listener.selector.register(sock, selectors.EVENT_READ)
    return listener


def try_listen(root: str | os.PathLike[str]) -> tuple[Listener | None, str]:
    """:func:`listen`, or None and the one line saying why not (a job runs either way)."""
    try:
        return listen(root), ""
    except TTMeshError as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"cannot listen in {os.path.join(os.fspath(root), LISTENER_DIR)}: " + (
            exc.strerror or str(exc)
        )


EVERY = 10.0  # seconds: a user's lines are summed up once per this, past a few
BURST = 4  # lines a user's notices get said one by one in EVERY seconds (a reset is 2)


@dataclass
class _Window:
    start: float
    said: int = 0
    notices: int = 0  # not said one by one
    dropped: int = 0  # connections closed without a notice


class Tally:
    """What a listener says about the notices it goes on after, bounded whatever a flood
    sends: per sender's user, the first :data:`BURST` lines in :data:`EVERY` seconds are said,
    the rest counted, and the count said in one line once the window has passed
    (``tick``, ``flush``). One user's flood never hides another's lines; a user gets at most
    ``BURST + 1`` lines per window, and one line per window while its flood goes on."""

    def __init__(self, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.say = say
        self.clock = clock
        self.windows: dict[int, _Window] = {}

    def line(self, uid: int, text: str) -> None:
        """Say ``text`` about a notice from user ``uid``, or count it."""
        window = self._window(uid)
        if window.said < BURST:
            window.said += 1
            self.say(text)
        else:
            window.notices += 1

    def dropped(self, counts: Counter[int]) -> None:
        """Count connections closed without a notice (:meth:`Listener.take_dropped`)."""
        for uid, n in counts.items():
            self._window(uid).dropped += n

    def tick(self) -> None:
        """Say the counts of the windows that have passed."""
        now = self.clock()
        for uid, window in list(self.windows.items()):
            if now - window.start < EVERY:
                continue
            if window.notices or window.dropped:
                self._summary(uid, window, now)
                # The flood may go on: the next window starts counting at once.
                self.windows[uid] = _Window(now, said=BURST)
            else:
                del self.windows[uid]

    def flush(self) -> None:
        """Say every count not said yet (the listener closes)."""
        now = self.clock()
        for uid, window in self.windows.items():
            if window.notices or window.dropped:
                self._summary(uid, window, now)
        self.windows.clear()

    def _window(self, uid: int) -> _Window:
        window = self.windows.get(uid)
        if window is None:
            window = self.windows[uid] = _Window(self.clock())
        return window

    def _summary(self, uid: int, window: _Window, now: float) -> None:
        parts = []
        if window.notices:
            parts.append(f"{plural(window.notices, 'more notice')} not shown one by one")
        if window.dropped:
            parts.append(f"{plural(window.dropped, 'connection')} closed without a notice")
        took = max(1, round(now - window.start))
        self.say(
            f"tt-umd reset notices from user {procs.user_name(uid)} in the last "
            f"{plural(took, 'second')}: " + ", ".join(parts)
        )
