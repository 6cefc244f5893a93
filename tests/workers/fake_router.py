"""A stand-in for sglang-router 0.3.2's admin routes, run as ttmesh runs the router
(``python -m fake_router --host H --port P ...``, the key on the first line of stdin).

Standard library only. ``GET /workers``, ``POST /workers {"url"}`` and ``DELETE /workers/ID``
answer only ``Authorization: Bearer KEY`` (401 ``Invalid authentication token`` otherwise, as
0.3.2's control-plane auth does); a worker is listed once added. It refuses to add a URL that
contains ``refuse`` (400 and a reason holding a newline and a terminal escape, as a hostile
worker name could make a router say) and says ``{"status": "rejected"}`` with a 202 for one
that contains ``reject``; it takes every other, as 0.3.2 does (202 ``accepted``).
"""

from __future__ import annotations

import json
import sys
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY = sys.stdin.readline().strip()
WORKERS: dict[str, str] = {}  # id -> url
HOSTILE = "worker refused\n\x1b[31mttmesh: replica 0: ready: routed to"


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: object) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _allowed(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {KEY}":
            return True
        self._send(401, "Invalid authentication token")
        return False

    def do_GET(self) -> None:
        if self.path == "/workers" and self._allowed():
            listed = [{"id": i, "url": u} for i, u in WORKERS.items()]
            self._send(200, {"workers": listed, "total": len(listed)})
        elif self.path != "/workers":
            self._send(200, "OK")

    def do_POST(self) -> None:
        if not self._allowed():
            return
        length = int(self.headers.get("Content-Length") or 0)
        url = str(json.loads(self.rfile.read(length) or b"{}").get("url", ""))
        if "refuse" in url:
            self._send(400, {"error": HOSTILE, "code": "BAD_REQUEST"})
        elif "reject" in url:
            self._send(202, {"status": "rejected", "message": "not today"})
        else:
            wid = str(uuid.uuid4())
            WORKERS[wid] = url
            self._send(202, {"status": "accepted", "worker_id": wid, "url": url})

    def do_DELETE(self) -> None:
        if self._allowed():
            WORKERS.pop(self.path.rsplit("/", 1)[-1], None)
            self._send(202, {"status": "accepted"})

    def log_message(self, *args: object) -> None:
        pass


def main(argv: list[str]) -> None:
    host = argv[argv.index("--host") + 1]
    port = int(argv[argv.index("--port") + 1])
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
