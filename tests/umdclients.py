"""Clients of a tt-umd reset-notice listener for tests, run as any user (``users`` fixture).

Each is a ``python -c`` program (the other user's Python cannot import the tests), connecting
as tt-umd's notifier does: a blocking ``connect`` with no timeout
(tt-umd ``device/warm_reset.cpp``, ``get_connected_listeners``), guarded here by an alarm so
that a listener that stalls it fails the test instead of hanging it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from users import User

HANG = 60  # seconds a client may take before it gives up (an alarm kills it)

# sys.argv: socket path, then SPEC...: COUNT:PAYLOAD, PAYLOAD one of
#   01 / 02 (a byte, hex) | junk (random bytes) | mib (1 MiB of 0xff) | none (silent, kept)
#   | shut (connect and close at once); a SPEC without ":" is skipped (a command line's words),
#   "hold": once done, keep the silent connections until a line comes on stdin.
# Connects COUNT connections per SPEC, writes each payload, then waits until the listener has
# closed every connection that wrote (it read its byte) and prints "done N".
FLOOD = r"""
import os, selectors, signal, socket, sys
signal.alarm(ALARM)
where, specs = sys.argv[1], sys.argv[2:]
d, name = os.path.split(where)
fd = os.open(d, os.O_PATH)
wrote, silent = [], []
for spec in specs:
    if ":" not in spec:
        continue
    count, payload = spec.split(":")
    for i in range(int(count)):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(f"/proc/self/fd/{fd}/{name}")
        if payload == "shut":
            s.close()
            continue
        if payload == "none":
            silent.append(s)
            continue
        data = {"junk": os.urandom(1 + i % 64), "mib": b"\xff" * (1 << 20)}.get(payload)
        s.setblocking(False)
        try:
            s.send(data if data is not None else bytes.fromhex(payload))
        except OSError:
            pass
        wrote.append(s)
sel = selectors.DefaultSelector()
for s in wrote:
    sel.register(s, selectors.EVENT_READ)
left = len(wrote)
while left:
    for key, _ in sel.select():
        try:
            more = key.fileobj.recv(65536)
        except OSError:
            more = b""
        if not more:
            sel.unregister(key.fileobj)
            left -= 1
print("done", len(wrote) + len(silent), flush=True)
if "hold" in specs:
    sys.stdin.readline()
""".replace("ALARM", str(HANG))

# sys.argv: socket path, then a byte (hex) per line read from stdin: connects (printing
# "connected"), and on each line of stdin writes the next byte on a connection of its own
# (the first on the one already open) and waits until the listener closed it ("sent").
NOTIFIER = r"""
import os, signal, socket, sys
signal.alarm(ALARM)
d, name = os.path.split(sys.argv[1])
fd = os.open(d, os.O_PATH)

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(f"/proc/self/fd/{fd}/{name}")
    return s

s = connect()
print("connected", flush=True)
for byte in sys.argv[2:]:
    sys.stdin.readline()
    s = s or connect()
    s.sendall(bytes.fromhex(byte))
    while s.recv(1):
        pass
    s.close()
    s = None
    print("sent", flush=True)
sys.stdin.readline()
""".replace("ALARM", str(HANG))


def flood_argv(user: User, sock: Path, *specs: str) -> list[str]:
    return user.argv(user.python, "-c", FLOOD, str(sock), *specs)


def flood(user: User, sock: Path, *specs: str) -> str:
    """Run :data:`FLOOD` as ``user`` to its end (a listener in another process); its line."""
    done = subprocess.run(
        flood_argv(user, sock, *specs),
        capture_output=True,
        text=True,
        timeout=HANG + 10,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Notifier:
    """:data:`NOTIFIER` running as ``user``: connected once started; :meth:`send` writes the
    next byte and returns once the listener has read it (closed the connection)."""

    def __init__(self, user: User, sock: Path, *hex_bytes: str) -> None:
        self.proc = subprocess.Popen(
            user.argv(user.python, "-c", NOTIFIER, str(sock), *hex_bytes),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._line() == "connected"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def notify(self) -> None:
        """Write the next byte (without waiting for the listener: it may be this process)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def sent(self) -> None:
        """Wait until the listener has read it."""
        assert self._line() == "sent"

    def send(self) -> None:
        self.notify()
        self.sent()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
