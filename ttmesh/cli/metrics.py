"""``ttmesh metrics``: serve the host's chips, leases and jobs to Prometheus."""

from __future__ import annotations

import errno
import signal
import socket
import sys
import threading
from typing import Any

import click

from ttmesh import addresses
from ttmesh.cli.params import CONTEXT, host_options
from ttmesh.errors import bad_input, from_os_error

LISTEN_FIX = "give --listen HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464 (port 0: any free one)"
MISSING = "ttmesh metrics needs prometheus-client"
MISSING_FIX = "pip install 'ttmesh[metrics]' (or: pip install 'prometheus-client>=0.20')"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 address in brackets; port 0: any free one) as (host, port), read
    by the rule of every host and port ttmesh is given (:func:`ttmesh.addresses.endpoint`)."""
    return addresses.endpoint(
        text, "--listen", None, zero=True,
        example="--listen 127.0.0.1:9464 or [::1]:9464; port 0 is any free one",
    )  # fmt: skip


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    return parse_listen(value)


@click.command("metrics", context_settings=CONTEXT)
@host_options
@click.option(
    "--listen",
    required=True,
    metavar="HOST:PORT",
    callback=_listen,
    help="Where to serve /metrics, e.g. 127.0.0.1:9464 (0.0.0.0:9464: every interface; "
    "port 0: any free one, printed).",
)
def metrics_cmd(host: Any, listen: tuple[str, int]) -> int:
    """Serve the host's chips, their leases and the jobs' ranks as Prometheus metrics.

    \b
    Every scrape of http://HOST:PORT/metrics reads the host then: each chip's temperature,
    power, voltage, AI clock, heartbeat (counter, alive or frozen) and Ethernet links up,
    down and expected (labels bdf, asic_id, arch, board); which job leases which chip; and
    the rank states of your running jobs on the host. Only the driver's files are read
    (hwmon, tt_aiclk, tt_heartbeat): tt-smi is never run and no chip is opened, since a
    poller that opens chips breaks resets. On a real host, link states (and n300s' remote
    chips) are left out: only tt-umd can read them, and it opens the chips. While a reset
    runs (ttmesh's, or another tool's announced by tt-umd's reset notice) no chip is read
    and ttmesh_reset_in_progress is 1. Whatever connects, the server stays bounded (128
    connections, 10 s and 8 KiB per request).
    Ctrl-C or SIGTERM stops it (exit 0). Needs the metrics extra:
    pip install 'ttmesh[metrics]'. Metric names: docs/metrics.md.

    \b
    Examples:
      ttmesh metrics --listen 127.0.0.1:9464
      ttmesh metrics --sim quietbox2 --listen 127.0.0.1:0
    """
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        raise bad_input(MISSING, MISSING_FIX) from None
    from ttmesh.fabric.devices import require_driver
    from ttmesh.recovery.metrics import HostCollector

    require_driver(host)
    registry = CollectorRegistry(auto_describe=False)
    collector = HostCollector(host)
    registry.register(collector)
    addr, port = listen
    shown = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
    try:
        server, thread = _serve(port, addr, registry, collector)
    except socket.gaierror as exc:
        raise bad_input(f"--listen {shown}: cannot resolve {addr!r} ({exc.strerror})", LISTEN_FIX)
    except UnicodeError:  # a label the IDNA codec refuses (longer than 63 characters)
        raise bad_input(f"--listen {shown[:80]}: {addr[:60]!a} is not a host name", LISTEN_FIX)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise bad_input(
                f"--listen {shown}: the port is already in use",
                "stop what listens there, or choose another port",
            )
        if exc.errno == errno.EADDRNOTAVAIL:
            raise bad_input(
                f"--listen {shown}: {addr} is not an address of this machine", LISTEN_FIX
            )
        if exc.errno == errno.EACCES:
            raise bad_input(
                f"--listen {shown}: not allowed to listen on port {port}",
                "choose a port above 1023, or run as root",
            )
        raise from_os_error(exc, f"listen on {shown}") from None
    bound = server.port
    where = f"[{addr}]:{bound}" if ":" in addr else f"{addr}:{bound}"
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: stop.set())
    try:  # (before the line that says it serves: a Ctrl-C right after it is a stop too)
        sys.stderr.write(f"serving metrics on http://{where}/metrics (Ctrl-C or SIGTERM to stop)\n")
        if host.firmware_opens_chips:
            sys.stderr.write(
                "note: Ethernet link states and remote chips are left out: on this host only "
                "tt-umd reads them, and it opens the chips\n"
            )
        sys.stderr.flush()
        while not stop.wait(3600):
            pass
    except KeyboardInterrupt:
        pass  # the way to stop it
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.shutdown()
        thread.join(timeout=5)
        server.close()
        collector.close()
    return 0


def _serve(port: int, addr: str, registry: Any, collector: Any) -> tuple[Any, Any]:
    """The bounded scrape server (:mod:`ttmesh.recovery.exporter`) answering in a thread of
    its own; the collector's reset listener closed if it cannot start."""
    from ttmesh.recovery.exporter import Server

    try:
        server = Server(addr, port, registry)
    except BaseException:
        collector.close()
        raise
    thread = threading.Thread(target=server.serve_forever, name="scrapes", daemon=True)
    thread.start()
    return server, thread
