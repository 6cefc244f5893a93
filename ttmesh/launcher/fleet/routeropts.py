"""The router's options: the profile's ``router.args``, then ``--router-arg`` (so the user's
word wins: argparse keeps the last), read once when the fleet is planned.

They are read with sglang-router's own parser (``RouterArgs.add_cli_args``, as its
``launch_router`` builds it), so a prefix, ``--flag=value`` and a refused value are the
router's own, before anything starts. The router's ``--host``, ``--port`` and
``--worker-urls`` are ttmesh's (the server's ``--host:--port``, and the replicas that serve):
refused. Its Prometheus metrics listen on ``--prometheus-host:--prometheus-port`` (0.0.0.0:29000
by default in 0.3.2: two fleets would both bind 29000): unless the user gives a port, each
fleet's router is given a free one, none that another fleet of this user's records uses.
"""

from __future__ import annotations

import argparse
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input

OURS = {"host": "--host", "port": "--port", "worker_urls": "--worker-urls"}
METRICS_HOST = "0.0.0.0"  # sglang-router 0.3.2's --prometheus-host default


@dataclass
class RouterOptions:
    """What the router is given beyond its host, port and workers."""

    args: list[str] = field(default_factory=list)
    metrics_host: str = METRICS_HOST
    metrics_port: int = 0
    metrics_given: bool = False  # the user (or the profile) named the port
    read_by: str | None = None  # the parser that read them; None: sglang-router is missing

    @property
    def metrics_url(self) -> str:
        host = "127.0.0.1" if self.metrics_host in ("0.0.0.0", "::", "") else self.metrics_host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.metrics_port}/metrics"

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.metrics_host, "port": self.metrics_port, "url": self.metrics_url,
            "given": self.metrics_given,
        }  # fmt: skip


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # never print usage and exit: one line of ours
        raise _Refused(message)


def _router_parser() -> argparse.ArgumentParser | None:
    """sglang-router's own parser, every default suppressed (what is given is what was
    typed), or None when the router is not installed (a dry run may plan without it)."""
    try:
        from sglang_router.router_args import RouterArgs
    except ImportError:
        return None
    parser = _Parser(prog="sglang_router.launch_router", add_help=False)
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return parser


def _given(parser: argparse.ArgumentParser | None, words: list[str], where: str) -> dict:
    """The router's settings ``words`` give, by its own parser (without it: exact names)."""
    if parser is None:
        out: dict[str, Any] = {}
        for i, word in enumerate(words):
            name, eq, value = word.partition("=")
            dest = name.lstrip("-").replace("-", "_")
            if word.startswith("--") and dest in (*OURS, "prometheus_port", "prometheus_host"):
                out[dest] = value if eq else (words[i + 1] if i + 1 < len(words) else "")
        return out
    try:
        return vars(parser.parse_args(words))
    except _Refused as exc:
        raise bad_input(
            f"{where}: the router refuses {' '.join(words)!r}: {exc}",
            "fix it: python -m sglang_router.launch_router --help lists its flags",
        ) from None


def read(profile: Any, user: tuple[str, ...], router_port: int, taken: set[int]) -> RouterOptions:
    """The profile's words then the user's, checked; a free metrics port unless one is given."""
    parser = _router_parser()
    sources = []
    section = (profile.extra.get("router") or {}).get("args") or []
    if section:
        sources.append((f"profile {profile.path or profile.name}: router.args", list(section)))
    if user:
        sources.append(("--router-arg", list(user)))
    given: dict[str, Any] = {}
    for where, words in sources:
        mine = _given(parser, words, where)
        for dest, flag in OURS.items():
            if dest in mine:
                raise bad_input(
                    f"{where} sets the router's {flag}, which ttmesh sets (the router listens at "
                    "the server's --host:--port and routes to the replicas that serve)",
                    f"drop {flag}: give the server's --host and --port instead"
                    if flag != "--worker-urls" else "drop --worker-urls",
                )  # fmt: skip
        given.update(mine)
    words = [w for _, ws in sources for w in ws]
    ro = RouterOptions(words, read_by="sglang-router" if parser is not None else None)
    ro.metrics_host = str(given.get("prometheus_host") or METRICS_HOST)
    if "prometheus_port" in given:
        port = given["prometheus_port"]
        if not isinstance(port, int):
            try:
                port = int(str(port))
            except ValueError:
                port = -1
        if not 0 < port < 65536:
            raise bad_input(f"the router's --prometheus-port {given['prometheus_port']}: not a "
                            "TCP port", "give 1..65535, or drop it: a free one is picked")  # fmt: skip
        if port == router_port:
            raise bad_input(
                f"the router's --prometheus-port {port} is the fleet's --port",
                "give the metrics another port, or drop --prometheus-port: a free one is picked",
            )
        ro.metrics_port, ro.metrics_given = port, True
    else:
        ro.metrics_port = _free_metrics_port(ro.metrics_host, taken)
        ro.args += ["--prometheus-port", str(ro.metrics_port)]
    taken.add(ro.metrics_port)
    return ro


def check_free(ro: RouterOptions) -> None:
    """A metrics port the user gave is free now (before the start: a router that cannot bind it
    would die at each start, minutes later, once the first replica is ready)."""
    from ttmesh.launcher.planning import ports

    if not ro.metrics_given:
        return
    try:
        ports.check_server_port(ro.metrics_host, ro.metrics_port)
    except ports.PortTaken as exc:
        taken = exc.message.split(" is already in use on ", 1)[-1]
        raise bad_input(
            f"the router's --prometheus-port {ro.metrics_port} is already in use on {taken}",
            "give the metrics another --prometheus-port, or drop it: a free one is picked",
        ) from None


def fleets_metrics_ports() -> set[int]:
    """The metrics ports the fleets of this user that run now were given (their records)."""
    from ttmesh.errors import TTMeshError
    from ttmesh.runtime import jobs

    out: set[int] = set()
    try:
        records = jobs.running()
    except (OSError, TTMeshError):
        return out
    for record in records:
        fleet = record.get("fleet")
        metrics = (fleet.get("router") or {}).get("metrics") if isinstance(fleet, dict) else None
        if isinstance(metrics, dict) and isinstance(metrics.get("port"), int):
            out.add(metrics["port"])
    return out


def _free_metrics_port(host: str, taken: set[int]) -> int:
    """A port free on ``host`` now that no running fleet's router was given (its router
    starts only when its first replica is ready, minutes after it chose it)."""
    from ttmesh.launcher.planning import ports

    avoid = taken | fleets_metrics_ports()
    for _ in range(100):
        try:
            port = ports.free_port(host or METRICS_HOST)  # free on every address it binds
        except OSError:  # a name, or an IPv6 address: free on every IPv4 one at least
            port = ports.free_port(METRICS_HOST)
        if port not in avoid:
            return port
    raise bad_input(
        "no free port for the router's metrics", "give --router-arg=--prometheus-port=P"
    )
