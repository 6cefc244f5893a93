"""The router's options: the profile's ``router.args``, then ``--router-arg`` (so the user's
word wins: argparse keeps the last), read once when the fleet is planned.

They are read with sglang-router's own parser (``RouterArgs.add_cli_args``, as its
``launch_router`` builds it), so a prefix, ``--flag=value`` and a refused value are the
router's own, before anything starts. The router's ``--host``, ``--port`` and
``--worker-urls`` are ttmesh's (the server's ``--host:--port``, and the replicas that serve):
refused. Its Prometheus metrics listen on ``--prometheus-host:--prometheus-port`` (0.0.0.0:29000
by default in 0.3.2: every address, and two fleets would both bind 29000): unless the user gives
them, each fleet's router listens for metrics on 127.0.0.1 (where ttmesh says they are) and on a
free port, none that another fleet of this user's records uses.

ttmesh closes the router's admin routes itself (``fleet.router``: a key of its own, given to the
router through a pipe, never its command line). A flag whose value is a secret is refused: every
local user reads the router's command line (``ps``, ``/proc/PID/cmdline``): ``--api-key`` and
``--control-plane-api-keys`` (ttmesh's), and the history stores' password and URLs, which the
router reads from its environment instead (``router_args.py``: ``default=os.getenv(...)``).
``--mini-lb`` (SGLang's Python debugging balancer) has no ``/workers`` routes and no
authentication: refused.
"""

from __future__ import annotations

import argparse
from typing import Any

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.render import clip, printable

OURS = {"host": "--host", "port": "--port", "worker_urls": "--worker-urls"}
METRICS_HOST = "127.0.0.1"  # where ttmesh has the router serve its metrics (0.3.2's: 0.0.0.0)
WHAT_MAX = 200  # characters of the words and the parser's complaint shown in a refusal

# Flags whose value is a secret (dest -> the flag, where it goes instead): a command line is
# every local user's to read. The history stores' are read from the router's environment when
# not given (sglang-router 0.3.2, router_args.py: ``default=os.getenv("ATP_PASSWORD")``, ...).
SECRETS = {
    "api_key": ("--api-key", "drop it: ttmesh keeps the router's admin routes closed with a key "
                "of its own for each start, which no command line shows (the router's "
                "--api-key would also close its data routes to every client without the key)"),
    "control_plane_api_keys": ("--control-plane-api-keys", "drop it: ttmesh keeps the router's "
                               "admin routes closed with a key of its own, given on a pipe"),
    "oracle_password": ("--oracle-password", "set ATP_PASSWORD in ttmesh's environment instead "
                        "(the router reads it there)"),
    "postgres_db_url": ("--postgres-db-url", "set POSTGRES_DB_URL in ttmesh's environment "
                        "instead (the router reads it there)"),
    "redis_url": ("--redis-url", "set REDIS_URL in ttmesh's environment instead (the router "
                  "reads it there)"),
}  # fmt: skip


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

    @property
    def announced(self) -> str:
        """Where the metrics are, as ttmesh says it: their URL, and every address when so."""
        if self.metrics_host in ("0.0.0.0", "::"):
            return (f"{self.metrics_url} (and every address of this host: --prometheus-host "
                    f"{self.metrics_host})")  # fmt: skip
        return self.metrics_url

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
        if action.dest == "prometheus_port":
            action.type = None  # its text, read by ttmesh's digit rule (int() takes '٢٩٠٠٠')
    return parser


def _given(parser: argparse.ArgumentParser | None, words: list[str], where: str) -> dict:
    """The router's settings ``words`` give, by its own parser (without it: exact names)."""
    if parser is None:
        out: dict[str, Any] = {}
        for i, word in enumerate(words):
            name, eq, value = word.partition("=")
            dest = name.lstrip("-").replace("-", "_")
            if word.startswith("--") and dest in (*OURS, *SECRETS, *EXACT):
                out[dest] = value if eq else (words[i + 1] if i + 1 < len(words) else "")
        return out
    try:
        return vars(parser.parse_args(words))
    except _Refused as exc:  # the user's words, escaped: a newline must not start a line
        raise bad_input(
            f"{where}: the router refuses {clip(printable(repr(' '.join(words))), WHAT_MAX)}: "
            f"{clip(printable(str(exc)), WHAT_MAX)}",
            "fix it: python -m sglang_router.launch_router --help lists its flags",
        ) from None


EXACT = ("prometheus_port", "prometheus_host", "mini_lb")  # read without the router's parser


def _refuse_secrets(mine: dict[str, Any], where: str) -> None:
    """A secret in the router's command line, or a balancer ttmesh cannot close: one line."""
    for dest, (flag, fix) in SECRETS.items():
        if dest in mine:
            raise bad_input(
                f"{where} sets the router's {flag}, a secret every local user would read in "
                "the router's command line (ps, /proc/PID/cmdline)",
                fix,
            )
    if mine.get("mini_lb"):
        raise bad_input(
            f"{where} sets the router's --mini-lb: SGLang's Python debugging balancer has no "
            "/workers routes (ttmesh adds and removes replicas through them) and no "
            "authentication (any local user could use its admin routes)",
            "drop --mini-lb",
        )


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
        _refuse_secrets(mine, where)
        given.update(mine)
    words = [w for _, ws in sources for w in ws]
    ro = RouterOptions(words, read_by="sglang-router" if parser is not None else None)
    if given.get("prometheus_host") is not None:
        ro.metrics_host = _metrics_host(str(given["prometheus_host"]))
    else:  # 0.3.2's default is every address: ttmesh says 127.0.0.1, so it listens there
        ro.args += ["--prometheus-host", METRICS_HOST]
    if "prometheus_port" in given:
        port = numeric.whole(
            str(given["prometheus_port"]), "the router's --prometheus-port", low=1, high=65535,
            example="--router-arg=--prometheus-port=29001 (or drop it: a free one is picked)",
        )  # fmt: skip
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


def router_host(text: str) -> str:
    """The server's --host, where the router listens: an IP address (0.3.2 dies at each start,
    "Invalid address: invalid socket address syntax", on a name such as ``localhost``)."""
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise bad_input(
            f"--host {clip(printable(repr(text)), WHAT_MAX)}: with --replicas SGLang's router "
            "listens there, and sglang-router 0.3.2 takes only an IP address, not a name",
            "give an address: --host 127.0.0.1 (this host only), or 0.0.0.0 (every address)",
        ) from None
    return text


def _metrics_host(text: str) -> str:
    """The address the user gave the router's metrics: an IP address, as the router binds it
    (0.3.2 binds 0.0.0.0, every address, for a name such as ``localhost``, without a word)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise bad_input(
            f"the router's --prometheus-host {clip(printable(repr(text)), WHAT_MAX)}: not an IP "
            "address (sglang-router 0.3.2 listens on every address for a name it cannot bind)",
            "give an address: 127.0.0.1 (this host only), ::1, or 0.0.0.0 (every address)",
        ) from None


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
        except OSError:  # an IPv6 address: free on every IPv4 one at least
            port = ports.free_port("0.0.0.0")
        if port not in avoid:
            return port
    raise bad_input(
        "no free port for the router's metrics", "give --router-arg=--prometheus-port=P"
    )
