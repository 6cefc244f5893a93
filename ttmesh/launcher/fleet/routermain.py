"""The fleet's router started with its admin key on a pipe, never in its command line.

sglang-router 0.3.2 closes its admin routes (``/workers``, ``/workers/{id}``, ``/flush_cache``,
``/get_loads``) only with ``--control-plane-api-keys 'id:name:role:key'`` (``router_args.py``,
``_parse_control_plane_api_keys``; ``router.py``, ``build_control_plane_auth_config``): a flag,
so a key would be in ``/proc/PID/cmdline``, which every local user reads. Its ``--api-key``
would close every route, the data routes clients use included. It reads no key from its
environment or a file.

So ttmesh runs this instead of ``python -m sglang_router.launch_router``: the first line of
standard input is the key (the fleet writes it into a pipe and closes it), the words are the
router's own, and the key is added to them here, in memory, before the router's own parser
(``launch_router.parse_router_args``) and launch function (``launch_router.launch_router``) run
them. Its process then names itself ``sglang::router`` (setproctitle) as the router always does.

Nothing of ttmesh is imported: this runs in the router's process, with the router's Python.
"""

from __future__ import annotations

import os
import sys

KEY_ID = "ttmesh"  # the key's id and name, as the router's audit log shows them
KEY_MAX = 256  # bytes of the key line read at most (ttmesh writes 43 characters)


def read_key(fd: int = 0) -> str:
    """The key on ``fd`` (the first line; the writer has closed the pipe), then ``fd`` is
    /dev/null, as a router's standard input is."""
    data = b""
    while len(data) <= KEY_MAX and b"\n" not in data:
        chunk = os.read(fd, KEY_MAX + 1 - len(data))
        if not chunk:
            break
        data += chunk
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    key = data.split(b"\n", 1)[0].decode("ascii", errors="replace")
    if not key or len(key) > KEY_MAX - 1 or not key.isascii() or not key.isprintable():
        raise SystemExit("ttmesh's router entry: no admin key on standard input")
    return key


def main(argv: list[str]) -> None:
    from sglang_router.launch_router import launch_router, parse_router_args

    key = read_key()
    args = parse_router_args([*argv, "--control-plane-api-keys", f"{KEY_ID}:{KEY_ID}:admin:{key}"])
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
