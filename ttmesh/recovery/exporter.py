"""The HTTP server ``ttmesh metrics`` answers scrapes on, bounded whatever connects to it.

prometheus-client's own server (``start_http_server``) runs a thread per connection with no
timeout and a listen backlog of 5: anyone who can connect stalls it. Each half-sent request
holds a thread for ever (747 threads seen), and a burst overflows the backlog, so the next
scrape waits out TCP's SYN retries (76 s behind 300 half-requests, closed, measured). This
server is one thread over a selector:

* it accepts at once, a batch per turn (backlog ``SOMAXCONN``), and keeps at most
  :data:`MAX_CONNECTIONS` open: at the cap the oldest one still sending its request is closed;
* a request must be whole within :data:`REQUEST_DEADLINE` seconds and :data:`MAX_REQUEST`
  bytes, its answer taken within :data:`ANSWER_DEADLINE` seconds; ``Connection: close``;
* requests already read are answered before new connections are accepted, so a scrape that
  got in is never pushed out by the ones after it.

The answer is prometheus-client's exposition (``choose_encoder``: text or OpenMetrics as the
``Accept`` header asks, gzip when ``Accept-Encoding`` allows). Scrapes are answered one at a
time in the loop's thread (the collector reads the host once per scrape anyway); everything
else waits in the kernel's queues meanwhile.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import os
import selectors
import socket
import time
from typing import Any

from prometheus_client.exposition import choose_encoder, gzip_accepted

from ttmesh.dataclass import dataclass, field
from ttmesh.render import note

MAX_CONNECTIONS = 128
BATCH = 64  # connections accepted per turn
MAX_REQUEST = 8192  # bytes of request line and headers
REQUEST_DEADLINE = 10.0  # seconds from the connection to its whole request
ANSWER_DEADLINE = 10.0  # seconds for the client to take the answer
DRAIN = 1 << 20  # bytes past its request read from a connection before it is closed
PATHS = ("/metrics", "/")


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    order: int
    request: bytearray = field(default_factory=bytearray)
    answer: memoryview | None = None  # set once the request is read: what is left to send


class Server:
    """An HTTP server for one registry on ``(addr, port)`` (port 0: any free one, then
    :attr:`port`). Raises what ``getaddrinfo`` and ``bind`` raise (``socket.gaierror``,
    ``UnicodeError`` for a name IDNA refuses, ``OSError``)."""

    def __init__(self, addr: str, port: int, registry: Any) -> None:
        self.registry = registry
        family, kind, proto, _name, where = socket.getaddrinfo(
            addr, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        )[0]
        self.sock = socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(where)
            self.sock.listen(socket.SOMAXCONN)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.port: int = self.sock.getsockname()[1]
        self.conns: dict[int, _Conn] = {}
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.sock, selectors.EVENT_READ, "accept")
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self._order = itertools.count()

    # -- the loop

    def serve_forever(self) -> None:
        """Answer until :meth:`shutdown`."""
        while True:
            wait = None
            if self.conns:
                wait = max(0.0, min(c.deadline for c in self.conns.values()) - time.monotonic())
            accept = False
            for key, mask in self.selector.select(wait):
                if key.data == "wake":
                    return
                if key.data == "accept":
                    accept = True
                    continue
                conn = self.conns.get(key.fd)
                if conn is None or conn.sock is not key.fileobj:
                    continue  # closed in this turn
                if mask & selectors.EVENT_READ and conn.answer is None:
                    self._read(conn)
                elif mask & selectors.EVENT_WRITE:
                    self._send(conn)
            if accept:
                self._accept()
            now = time.monotonic()
            for conn in [c for c in self.conns.values() if c.deadline <= now]:
                self._close(conn)

    def shutdown(self) -> None:
        """Make :meth:`serve_forever` return (from another thread)."""
        with contextlib.suppress(OSError):
            os.write(self.wake_w, b"x")

    def close(self) -> None:
        for conn in list(self.conns.values()):
            self._close(conn)
        self.selector.close()
        self.sock.close()
        os.close(self.wake_r)
        os.close(self.wake_w)

    # -- connections

    def _accept(self) -> None:
        for _ in range(BATCH):
            try:
                sock, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, or gone before its accept
                return
            sock.setblocking(False)
            if len(self.conns) >= MAX_CONNECTIONS:
                self._make_room()
            conn = _Conn(sock, time.monotonic() + REQUEST_DEADLINE, next(self._order))
            self.conns[sock.fileno()] = conn
            self.selector.register(sock, selectors.EVENT_READ)
            self._read(conn)  # the request is often there already

    def _make_room(self) -> None:
        """Close the oldest connection still sending its request (else the oldest)."""
        pending = [c for c in self.conns.values() if c.answer is None] or list(self.conns.values())
        self._close(min(pending, key=lambda c: c.order))

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(MAX_REQUEST + 1 - len(conn.request))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.request += data
        end = conn.request.find(b"\r\n\r\n")
        if end < 0:
            end = conn.request.find(b"\n\n")
        if end >= 0:
            self._answer(conn, _request(bytes(conn.request[:end])))
        elif len(conn.request) > MAX_REQUEST:
            self._answer(conn, (431, {}, "the request's headers are larger than 8 KiB"))

    def _answer(self, conn: _Conn, request: tuple[int, dict[str, str], str]) -> None:
        status, headers, text = request
        head = status == 200 and headers.get(":method") == "HEAD"
        if status == 200:
            status, content_type, body, extra = self._metrics(headers)
        else:
            content_type, body = "text/plain; charset=utf-8", (text + "\n").encode()
            extra = {"Allow": "GET, HEAD"} if status == 405 else {}
        lines = [
            f"HTTP/1.1 {status} {_REASONS[status]}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in extra.items()),
            "Connection: close",
            "",
            "",
        ]
        data = "\r\n".join(lines).encode("latin-1") + (b"" if head else body)
        conn.answer = memoryview(data)
        conn.deadline = time.monotonic() + ANSWER_DEADLINE
        self.selector.modify(conn.sock, selectors.EVENT_WRITE)
        self._send(conn)

    def _metrics(self, headers: dict[str, str]) -> tuple[int, str, bytes, dict[str, str]]:
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        try:
            body = encoder(self.registry)
        except Exception as exc:  # a scrape answers; what went wrong goes to stderr too
            first = (str(exc).splitlines() or [""])[0][:200]
            note(f"cannot answer a scrape: {type(exc).__name__}: {first}")
            return 500, "text/plain; charset=utf-8", b"cannot read the metrics\n", {}
        if gzip_accepted(headers.get("accept-encoding", "")):
            return 200, content_type, gzip.compress(body), {"Content-Encoding": "gzip"}
        return 200, content_type, body, {}

    def _send(self, conn: _Conn) -> None:
        assert conn.answer is not None
        try:
            sent = conn.sock.send(conn.answer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.answer = conn.answer[sent:]
        if not len(conn.answer):
            self._close(conn, answered=True)

    def _close(self, conn: _Conn, answered: bool = False) -> None:
        fd = conn.sock.fileno()
        if self.conns.get(fd) is conn:
            del self.conns[fd]
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn.sock)
        if answered:
            # Unread bytes at close make the kernel reset the connection, which can cost the
            # client the answer still in flight: take what is there (bounded) first.
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
                for _ in range(DRAIN // 65536):
                    if not conn.sock.recv(65536):
                        break
        conn.sock.close()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


def _request(raw: bytes) -> tuple[int, dict[str, str], str]:
    """(status, headers by lower-case name and ``:method``, the reason when not 200) of a
    request's line and headers."""
    text = raw.decode("latin-1")
    first, *rest = text.replace("\r\n", "\n").split("\n")
    words = first.split(" ")
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        return 400, {}, "not an HTTP request line: METHOD PATH HTTP/1.1"
    method, target, _version = words
    if method not in ("GET", "HEAD"):
        return 405, {}, f"only GET and HEAD here, not {method[:20]!a}"
    path = target.split("?", 1)[0]
    if path not in PATHS:
        return 404, {}, "the metrics are at /metrics"
    headers = {":method": method}
    for line in rest:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return 200, headers, ""
