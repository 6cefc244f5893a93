"""The ports a launch uses: the rendezvous port of the ranks, a server's port, checked free
before anything starts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ttmesh.errors import BAD_INPUT, TTMeshError, bad_input

if TYPE_CHECKING:
    from ttmesh.launcher.serving.spec import ServingSpec


def _tcp_socket(family: int | None = None) -> Any:
    # The socket module's C core: the module itself builds its enums on import (milliseconds
    # on every launch, for one bind).
    import _socket

    return _socket.socket(_socket.AF_INET if family is None else family, _socket.SOCK_STREAM)


def _family(addr: str) -> int:
    """The address family of a numeric address (an IPv6 one has a ':'; a name is IPv4's, as
    before: ranks meet at 127.0.0.1 or node 0's IPv4 address unless told an IPv6 one)."""
    import _socket

    return _socket.AF_INET6 if ":" in addr else _socket.AF_INET


def free_port(addr: str = "127.0.0.1") -> int:
    s = _tcp_socket(_family(addr))
    try:
        s.bind((addr, 0))
        return int(s.getsockname()[1])
    finally:
        s.close()


# Ports a launch chose and holds (bound, not listening) until its ranks start: a port the kernel
# hands out for "any free port" meanwhile is never one of these (release_held).
_HELD: list[Any] = []


def hold_free(count: int, addr: str = "127.0.0.1") -> list[int]:
    """``count`` different free TCP ports of ``addr``, each bound here and held until
    :func:`release_held` (called as the job's first attempt starts its ranks): one chosen now
    is free now, and nothing asking for a free port meanwhile is given it."""
    ports: list[int] = []
    for _ in range(count):
        s = _tcp_socket()
        try:
            s.bind((addr, 0))
        except OSError as exc:
            s.close()
            release_held()
            raise bad_input(
                f"no free TCP port on {addr} for the ranks ({exc.strerror or exc})",
                "free some ports, or run fewer ranks",
            ) from None
        _HELD.append(s)
        ports.append(int(s.getsockname()[1]))
    return ports


def release_held() -> None:
    """Let go of the ports :func:`hold_free` holds, for the ranks to bind them."""
    while _HELD:
        _HELD.pop().close()


def check_port(port: int, addr: str = "127.0.0.1") -> None:
    """torch.distributed's --master-port is free on ``addr`` (nothing has bound it)."""
    if not 0 < port < 65536:
        raise bad_input(f"--master-port {port}: not a TCP port", "use 1..65535, or omit it")
    s = _tcp_socket(_family(addr))
    try:
        s.bind((addr, port))
    except OSError:
        raise bad_input(
            f"--master-port {port} is already in use on {addr}",
            "pick another port, or omit --master-port to get a free one",
        )
    finally:
        s.close()


class PortTaken(TTMeshError):
    """A server's port is taken now (it may be free when the server starts: a dry run notes it)."""


def check_server_port(host: str, port: int) -> None:
    """The server can listen on ``host``:``port`` (its ``--host`` and ``--port``): bound here
    as the server will (SO_REUSEADDR, as uvicorn and asyncio do, so a closing connection of a
    server just stopped does not count), on every address ``host`` names. Taken, it is refused
    before the start, naming who listens there: otherwise whatever answers on it would look
    ready while the server fails, minutes later, with "address already in use"."""
    import _socket
    import errno

    try:
        found = _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM)
    except OSError as exc:
        raise bad_input(
            f"--host {host}: not an address of this host ({exc})",
            "give an address or name of this host, e.g. --host 127.0.0.1",
        ) from None
    unusable: list[tuple[str, str]] = []  # (address, why): a name's other family may be absent
    for family, _kind, _proto, _name, sockaddr in found:
        addr = str(sockaddr[0])
        s = _tcp_socket(family)
        try:
            s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            s.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortTaken(
                    f"--port {port} is already in use on {addr}{_listener_of(addr, port)}",
                    "stop what listens there, or give the server another --port",
                    BAD_INPUT,
                ) from None
            if exc.errno == errno.EACCES:
                raise bad_input(
                    f"--port {port}: only root may listen on a port below 1024",
                    "give the server a --port from 1024 to 65535",
                ) from None
            unusable.append((addr, exc.strerror or str(exc)))
        finally:
            s.close()
    if unusable and len(unusable) == len(found):  # "localhost" without IPv6 still has 127.0.0.1
        addr, why = unusable[0]
        raise bad_input(
            f"--host {host}: the server cannot listen on {addr} ({why})",
            "give an address of this host, e.g. --host 127.0.0.1",
        )


def server_port_free(serving: ServingSpec, dry_run: bool) -> ServingSpec:
    """The server's port is free (:func:`check_server_port`); in a dry run, a port taken now
    is a note of the plan (it may be free when the server starts, and a plan is not a start):
    the spec with that note. A --host that is no address of this host, or a port it may not
    use, is refused in both."""
    try:
        check_server_port(serving.bind_host, serving.port)
    except PortTaken as exc:
        if not dry_run:
            raise
        return replace(serving, notes=(*serving.notes, f"{exc.message} (a launch now is refused)"))
    return serving


def _listener_of(addr: str, port: int) -> str:
    """``: pid P (user: cmd) listens there`` for a taken port, as far as ttmesh can see."""
    from ttmesh.launcher.serving import listeners

    for lst in listeners.listening(port):
        if listeners.reaches(lst, addr) or listeners.reaches(
            listeners.Listener(addr, port, 0, 0), lst.addr
        ):
            return f": {listeners.describe(lst)}"
    return ""
