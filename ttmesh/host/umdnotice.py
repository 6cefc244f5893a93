"""tt-umd's reset notices: a process that resets chips tells every listener on the host first.

The protocol, as tt-umd implements it (``device/api/umd/device/warm_reset.hpp``,
``device/warm_reset.cpp``, ``examples/reset_notification_example/README.md``):

* A listener is a Unix stream socket named ``client_<PID>.sock`` in ``/tmp/tt_umd_listeners``.
  tt-umd makes the directory with mode 0777 (not sticky) and its socket 0777, so that any
  user's notifier may connect.
* The notifier (``WarmReset::warm_reset``, which tt-smi's reset runs) connects to every socket
  there but its own pid's and writes one byte: ``0x01`` (PRE_RESET). It then waits its grace
  (2 s) whatever the listeners do, resets, connects again and writes ``0x02`` (POST_RESET),
  with no wait. With no listener connected it does not wait at all.
* The bytes carry no chip identity: a notice is for the whole host.

ttmesh listens while a job's ranks run (``launcher.attempt``). The directory is writable by
every user and by tt-umd's own processes: it is reached without following a link anyone but
root or this user owns (:func:`ttmesh.paths.walk`), nothing in it is read or followed, and
the socket is bound and removed by name relative to the directory's descriptor. A socket
another user removes or replaces only stops this job hearing notices; what a notice may make
ttmesh do is decided from the kernel's word on who sent it (``SO_PEERCRED``), never from
anything the sender says (:mod:`ttmesh.fabric.resetscope`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import stat
import struct
from dataclasses import dataclass, field

from ttmesh import paths, procs
from ttmesh.errors import TTMeshError

LISTENER_DIR = "tmp/tt_umd_listeners"  # under the host's root: /tmp/tt_umd_listeners on /
PRE_RESET = 0x01
POST_RESET = 0x02
KINDS = {PRE_RESET: "pre-reset", POST_RESET: "post-reset"}
GRACE = 2.0  # seconds tt-umd's notifier waits after PRE_RESET (WarmReset::warm_reset)
MAX_OPEN = 16  # connections kept waiting for their byte: a flood of silent ones stays bounded
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def socket_name(pid: int) -> str:
    return f"client_{pid}.sock"


@dataclass(frozen=True)
class Notice:
    """One byte from a notifier, and who the kernel says sent it."""

    kind: str  # "pre-reset" | "post-reset"
    pid: int
    uid: int
    command: tuple[str, ...] = ()  # the sender's command line, when it could be read

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


@dataclass
class Listener:
    """This process's ``client_<PID>.sock``, and the notices it has heard.

    ``fileno()`` is readable when a notifier connected or wrote (an epoll descriptor over the
    socket and the connections waiting for their byte): a supervisor's selector waits on it
    and calls :meth:`read`."""

    directory: int  # O_PATH descriptor of the listener directory
    sock: socket.socket
    name: str
    identity: tuple[int, int]  # (st_dev, st_ino) of the name bound: removed only while it is ours
    selector: selectors.EpollSelector = field(default_factory=selectors.EpollSelector)
    waiting: list[tuple[socket.socket, int, int]] = field(default_factory=list)

    def fileno(self) -> int:
        return self.selector.fileno()

    def read(self) -> list[Notice]:
        """Accept what connected, read the bytes that arrived: the notices, in order."""
        out: list[Notice] = []
        for key, _ in self.selector.select(0):
            if key.fileobj is self.sock:
                self._accept()
                continue
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            entry = next(w for w in self.waiting if w[0] is conn)
            try:
                data = conn.recv(1)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            self._drop(entry)
            if data and data[0] in KINDS:  # tt-umd ignores an unknown byte too
                out.append(Notice(KINDS[data[0]], entry[1], entry[2], procs.argv(entry[1])))
        return out

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            pid, uid, _gid = _CRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
            )
            conn.setblocking(False)
            if len(self.waiting) >= MAX_OPEN:
                self._drop(self.waiting[0])
            self.waiting.append((conn, pid, uid))
            self.selector.register(conn, selectors.EVENT_READ)

    def _drop(self, entry: tuple[socket.socket, int, int]) -> None:
        self.waiting.remove(entry)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(entry[0])
        entry[0].close()

    def close(self) -> None:
        """Stop listening; remove the socket's name only if it is still the one bound here."""
        for entry in list(self.waiting):
            self._drop(entry)
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
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
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
            sock.listen(MAX_OPEN)
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
