"""The Python side of mgd-check-many (run by ttnn's Python 3.12; see that script's header).

tt-metal reads TT_METAL_MOCK_CLUSTER_DESC_PATH and TT_MESH_GRAPH_DESC_PATH when its control
plane is first built, which ``import ttnn`` does not do: each check therefore runs in a child
forked after the import that sets both, builds the control plane once, reports through a pipe
and leaves with ``os._exit`` (no teardown of tt-metal's singletons).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import sys
import tempfile
import time

TIMEOUT_S = 120.0


def child(cluster: str, mgd: str, work: str, out_fd: int) -> None:
    """In the forked child: one control-plane build, the verdict as JSON on ``out_fd``."""
    try:
        os.chdir(work)  # tt-metal writes generated/fabric/... under the working directory
        os.environ["TT_METAL_MOCK_CLUSTER_DESC_PATH"] = cluster
        os.environ["TT_MESH_GRAPH_DESC_PATH"] = mgd
        import ttnn

        try:
            shapes = ttnn.get_physical_mesh_shapes()
            verdict = {
                "ok": True,
                "shapes": {str(int(k)): list(v) for k, v in dict(shapes).items()},
            }
        except Exception as exc:
            text = str(exc).strip()
            verdict = {"ok": False, "error": text.splitlines()[0] if text else repr(exc)}
        os.write(out_fd, json.dumps(verdict).encode())
    finally:
        os._exit(0)


class Check:
    """One pair being checked by a child."""

    def __init__(self, index: int, request: dict) -> None:
        self.index = index
        self.request = request
        self.work = tempfile.mkdtemp(prefix="mgd-check-many-")
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(read_fd)
            child(request["cluster"], request["mgd"], self.work, write_fd)
        os.close(write_fd)
        self.fd = read_fd
        self.data = b""
        self.started = time.monotonic()
        self.deadline = self.started + TIMEOUT_S

    def finish(self, timed_out: bool = False) -> dict:
        if timed_out:
            os.kill(self.pid, 9)
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        shutil.rmtree(self.work, ignore_errors=True)
        took = {"seconds": round(time.monotonic() - self.started, 3)}
        if timed_out:
            verdict = {"ok": False, "error": f"no verdict within {TIMEOUT_S:.0f} s"}
        elif not self.data:
            verdict = {"ok": False, "error": f"the check died (wait status {status})"}
        else:
            verdict = json.loads(self.data)
        return {**self.request, **verdict, **took}


def read_requests(stream) -> list[dict]:
    requests = []
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            paths = [os.path.realpath(req["cluster"]), os.path.realpath(req["mgd"])]
        except (ValueError, KeyError, TypeError) as exc:
            fail(f"line {number}: not a {{cluster, mgd}} object ({exc})")
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            fail(f"line {number}: no such file {missing[0]}")
        req["cluster"], req["mgd"] = paths
        requests.append(req)
    return requests


def fail(message: str) -> None:
    print(f"mgd-check-many: {message}", file=sys.stderr)
    sys.exit(2)


def run(requests: list[dict], jobs: int, out) -> None:
    """Check every pair, ``jobs`` at a time; print verdicts in input order as they complete."""
    results: dict[int, dict] = {}
    running: list[Check] = []
    pending = list(enumerate(requests))
    printed = 0
    while pending or running:
        while pending and len(running) < jobs:
            running.append(Check(*pending.pop(0)))
        ready, _, _ = select.select([c.fd for c in running], [], [], 1.0)
        now = time.monotonic()
        for check in list(running):
            done = timed_out = False
            if check.fd in ready:
                chunk = os.read(check.fd, 65536)
                check.data += chunk
                done = not chunk
            elif now > check.deadline:
                done = timed_out = True
            if done:
                running.remove(check)
                results[check.index] = check.finish(timed_out)
        while printed in results:
            print(json.dumps(results.pop(printed)), file=out, flush=True)
            printed += 1


def main() -> None:
    parser = argparse.ArgumentParser(prog="mgd-check-many")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("-j must be at least 1")
    requests = read_requests(sys.stdin)
    # Verdicts alone on stdout: whatever ttnn and tt-metal print (they log to stdout) goes to
    # stderr, in this process and in every child.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import ttnn  # noqa: F401  (once, in the parent: the children inherit it)

    run(requests, args.jobs, out)


if __name__ == "__main__":
    main()
