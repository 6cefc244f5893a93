"""``ttmesh metrics``: the chips, their leases and the jobs' ranks as Prometheus metrics.

A custom collector (:class:`HostCollector`): every scrape reads the host then, nothing runs on a
timer. Chip telemetry comes from a :class:`~ttmesh.recovery.top.Sampler` in driver-only mode:
the driver's files only (hwmon, ``tt_aiclk``, ``tt_heartbeat``), never tt-smi and never a chip
opened (a poller that opens chips breaks resets: tt-smi#172). While a ttmesh reset runs
(:mod:`ttmesh.runtime.resetmark`), or another tool announced one with tt-umd's reset notice
(:class:`ForeignResets`) and has not said it is done, no chip file is read at all and
``ttmesh_reset_in_progress`` is 1. Leases come from the lease directory, rank states from this
user's job records (:mod:`ttmesh.runtime.jobs`).

Needs ``prometheus-client`` (the ``metrics`` extra); the command line checks it is there
before importing this module.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ttmesh import procs
from ttmesh.errors import TTMeshError
from ttmesh.host import umdnotice
from ttmesh.host.base import Host
from ttmesh.recovery.top import Sampler
from ttmesh.render import note
from ttmesh.runtime import jobs, resetmark
from ttmesh.vocab import Heartbeat

CHIP_LABELS = ["bdf", "asic_id", "arch", "board"]
NO_LINKS = (
    "Left out where reading link state would open a chip (on a real host tt-umd reads it from "
    "the firmware; the driver's files do not carry it)."
)

# name -> help; docs/metrics.md ("How it works") lists the same names.
HELP = {
    "ttmesh_reset_in_progress": "1 while a reset runs on the host (ttmesh's, or another tool's "
    "announced by tt-umd's reset notice): no chip is read then.",
    "ttmesh_host_read_ok": "1 when this scrape read the chips; 0 when paused by a reset or "
    "the host's files could not be read (the reason is on ttmesh's stderr).",
    "ttmesh_chips": "Chips the driver shows (and, on a simulated host, their remote chips).",
    "ttmesh_chip_temperature_celsius": "ASIC temperature from the driver's hwmon node.",
    "ttmesh_chip_power_watts": "Power from the driver's hwmon node.",
    "ttmesh_chip_voltage_volts": "Core voltage from the driver's hwmon node.",
    "ttmesh_chip_aiclk_hertz": "AI clock from the driver's tt_aiclk.",
    "ttmesh_chip_heartbeat": "The firmware heartbeat counter the driver shows (tt_heartbeat).",
    "ttmesh_chip_heartbeat_alive": "1 when the heartbeat counter moved since the previous "
    "scrape (or within 1 s), 0 when it did not (frozen firmware); left out when unknown.",
    "ttmesh_chip_links_up": "Expected Ethernet links of the chip that are up. " + NO_LINKS,
    "ttmesh_chip_links_down": "Expected Ethernet links of the chip that are down. " + NO_LINKS,
    "ttmesh_chip_links_expected": "Ethernet links the chip should have. " + NO_LINKS,
    "ttmesh_chip_lease_info": "1 per leased chip: the ttmesh job leasing it and its user "
    "(verified=false: a lock on the lease file that is no verified ttmesh lease).",
    "ttmesh_job_rank_state": "1 per rank of each of this user's running jobs on the host, "
    "labelled with its state: starting (no process yet), running or ended.",
}


def gauge(name: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, HELP[name], labels=labels)


class ForeignResets:
    """Resets other tools announce (tt-umd's notices, :mod:`ttmesh.host.umdnotice`): while one
    runs, a poller reads no chip.

    A PRE_RESET pauses for its sender, the process the kernel says sent it (pid and start
    time): until that same process sends its POST_RESET, or exits (one killed in between sends
    none), and for at most :data:`BOUND` seconds. Several resets pause together. A notice
    from anyone else ends nobody's pause: a POST_RESET from another process, or a PRE_RESET
    from one that exits at once, only ever adds its own. Anyone may send a notice, so a user
    holds at most :data:`PER_USER` pauses (its oldest gives way): a flood is bounded, and no
    user's notices touch another's pause.

    A thread answers the notices as they come, not at the next scrape: tt-umd's notifier
    connects without a timeout, and a listener that left its backlog full would stall it. The
    thread never dies with the socket open: should anything go wrong, it says so and closes
    the socket (a notifier's connect is then refused, never left waiting)."""

    BOUND = 120.0
    PER_USER = 16

    def __init__(self, host: Host) -> None:
        self.pauses: dict[tuple[int, int, int | None], float] = {}  # sender -> monotonic end
        self.heard = 0  # notices handled so far
        self.lock = threading.Lock()
        self.tally = umdnotice.Tally(note)
        self.thread: threading.Thread | None = None
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # close() wakes it
        self.listener, why = umdnotice.try_listen(host.root)
        if self.listener is None:
            note(f"resets by other tools are not seen: {why}")
            return
        self.thread = threading.Thread(
            target=self._run, args=(self.listener,), name="reset-notices", daemon=True
        )
        self.thread.start()

    def _run(self, listener: umdnotice.Listener) -> None:
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(listener.fileno(), selectors.EVENT_READ)
                sel.register(self.wake_r, selectors.EVENT_READ)
                while True:
                    due = listener.due()
                    ready = sel.select(
                        umdnotice.EVERY if due is None else min(due, umdnotice.EVERY)
                    )
                    if any(key.fd == self.wake_r for key, _ in ready):
                        return
                    for notice in listener.read():
                        self._answer(notice)
                    self.tally.dropped(listener.take_dropped())
                    self.tally.tick()
        except Exception as exc:  # a bug: never a thread gone with its socket left open
            first = (str(exc).splitlines() or [""])[0][:200]
            note(f"resets by other tools are no longer seen: {type(exc).__name__}: {first}")
        finally:
            self.tally.dropped(listener.take_dropped())
            listener.close()
            self.tally.flush()

    def _answer(self, notice: umdnotice.Notice) -> None:
        now = time.monotonic()
        key = notice.sender
        with self.lock:
            self.heard += 1
            if notice.kind == "post-reset":
                if self.pauses.pop(key, None) is None:
                    line = (
                        f"ignored a post-reset notice from {notice.who()}: only the process "
                        "that announced a reset ends its pause"
                    )
                else:
                    line = f"chip reads resume for {notice.who()}: its reset is done"
            elif notice.pid > 0 and notice.start is None:
                line = f"ignored a pre-reset notice from {notice.who()}: it has exited"
            elif key in self.pauses:  # announced again: its bound starts again
                self.pauses[key] = now + self.BOUND
                return
            else:
                mine = [k for k in self.pauses if k[0] == notice.uid]
                if len(mine) >= self.PER_USER:
                    del self.pauses[min(mine, key=self.pauses.__getitem__)]
                self.pauses[key] = now + self.BOUND
                line = (
                    f"chip reads paused: {notice.who()} announced a reset (tt-umd's reset "
                    f"notice; at most {self.BOUND:g} s, while it runs)"
                )
        self.tally.line(notice.uid, line)

    def active(self) -> bool:
        now = time.monotonic()
        with self.lock:
            for key, end in list(self.pauses.items()):
                _uid, pid, start = key
                # pid 0: a sender outside this PID namespace, not seen: its bound only.
                if now >= end or (pid > 0 and not procs.alive(pid, start)):
                    del self.pauses[key]
            return bool(self.pauses)

    def close(self) -> None:
        if self.wake_w < 0:
            return
        if self.thread is not None:
            with contextlib.suppress(OSError):
                os.write(self.wake_w, b"x")
            self.thread.join(timeout=5)
            if self.thread.is_alive():
                return  # (its pipe left open: it may still select on it)
        os.close(self.wake_r)
        os.close(self.wake_w)
        self.wake_r = self.wake_w = -1


class HostCollector(Collector):
    """Reads the host at every scrape (one scrape at a time: the heartbeat verdict is judged
    against the previous scrape's counters)."""

    def __init__(self, host: Host, *, heartbeat_wait: float = 1.0) -> None:
        self.host = host
        self.sampler = Sampler(host, first_wait=heartbeat_wait, driver_only=True)
        self.lock = threading.Lock()
        self.foreign = ForeignResets(host)

    def close(self) -> None:
        self.foreign.close()

    def describe(self) -> list[Any]:
        return []  # nothing to read at registration: the first scrape reads the host

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.lock:
            yield from self._collect()

    def _collect(self) -> Iterator[GaugeMetricFamily]:
        resetting = resetmark.running(self.host) or self.foreign.active()
        flag = gauge("ttmesh_reset_in_progress")
        flag.add_metric([], 1 if resetting else 0)
        yield flag
        sample = None
        if not resetting:
            try:
                sample = self.sampler.sample()
            except TTMeshError as exc:
                note(exc.message + (f" ({exc.hint})" if exc.hint else ""))
            except Exception as exc:  # a scrape answers: what went wrong goes to stderr
                first = (str(exc).splitlines() or [""])[0]
                note(f"cannot read the host: {type(exc).__name__}: {first}")
        ok = gauge("ttmesh_host_read_ok")
        ok.add_metric([], 0 if sample is None else 1)
        yield ok
        if sample is not None:
            yield from chip_families(sample)
        yield from job_families(str(self.host.root))


def chip_families(sample: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    """The chip metrics of one ``ttmesh.top/1`` sample."""
    chips = sample["chips"]
    count = gauge("ttmesh_chips")
    count.add_metric([], len(chips))
    yield count
    values = {
        "ttmesh_chip_temperature_celsius": ("temperature_c", 1.0),
        "ttmesh_chip_power_watts": ("power_w", 1.0),
        "ttmesh_chip_voltage_volts": ("voltage_v", 1.0),
        "ttmesh_chip_aiclk_hertz": ("aiclk_mhz", 1e6),
    }
    for name, (key, scale) in values.items():
        family = gauge(name, CHIP_LABELS)
        for c in chips:
            if c.get(key) is not None:
                family.add_metric(chip_labels(c), c[key] * scale)
        yield family
    beat = gauge("ttmesh_chip_heartbeat", CHIP_LABELS)
    alive = gauge("ttmesh_chip_heartbeat_alive", CHIP_LABELS)
    for c in chips:
        hb = c["heartbeat"]
        if hb["count"] is not None:
            beat.add_metric(chip_labels(c), hb["count"])
        if hb["state"] in (Heartbeat.ALIVE, Heartbeat.FROZEN):
            alive.add_metric(chip_labels(c), 1 if hb["state"] == Heartbeat.ALIVE else 0)
    yield beat
    yield alive
    if any(c["links"] is not None for c in chips):
        for state in ("up", "down", "expected"):
            family = gauge(f"ttmesh_chip_links_{state}", CHIP_LABELS)
            for c in chips:
                if c["links"] is not None:
                    family.add_metric(chip_labels(c), c["links"][state])
            yield family
    leases = gauge("ttmesh_chip_lease_info", ["bdf", "asic_id", "job", "user", "verified"])
    for c in chips:
        lease = c["lease"]
        if lease is not None:
            leases.add_metric(
                [
                    c["bdf"] or "",
                    c["asic_id"],
                    lease["job"] or "",
                    lease["user"] or "",
                    "true" if lease["verified"] else "false",
                ],
                1,
            )
    yield leases


def job_families(root: str) -> Iterator[GaugeMetricFamily]:
    """Each of this user's running jobs on host ``root``: its ranks' states."""
    family = gauge("ttmesh_job_rank_state", ["job", "rank", "state"])
    try:
        records = jobs.running(root)
    except (OSError, TTMeshError) as exc:
        note(f"cannot read the job records: {getattr(exc, 'message', exc)}")
        records = []
    for record in records:
        for rank in record.get("ranks") or []:
            if not isinstance(rank, dict) or not isinstance(rank.get("rank"), int):
                continue
            family.add_metric([str(record["job"]), str(rank["rank"]), rank_state(rank)], 1)
    yield family


def rank_state(rank: dict[str, Any]) -> str:
    pid = rank.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return "starting"
    return "running" if procs.alive(pid) else "ended"


def chip_labels(chip: dict[str, Any]) -> list[str]:
    return [chip["bdf"] or "", chip["asic_id"], chip["arch"], chip["board_type"]]
