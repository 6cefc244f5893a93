"""What a real host's chips report beyond sysfs: topology, Ethernet status, remote heartbeats;
and every host's chip telemetry (temperature, power, clock) from tt-smi or the driver's files.

The kernel driver shows PCI devices only. Remote chips (behind an n300's PCI chip), Ethernet
links and their live status come from the chips' firmware, read through tt-umd (the ``hw``
extra): ``TopologyDiscovery`` for the cluster descriptor, each device's firmware info provider
for ``ETH_LIVE_STATUS`` bits and heartbeats. Without tt-umd these are unknown, and said so:
never reported as "no links" or "down".

tt-umd reads the machine it runs on, so only the root ``/`` is read this way; any other
non-simulated root answers unknown.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from ttmesh.dataclass import dataclass
from ttmesh.host import clusterdesc
from ttmesh.host.base import Host

NO_UMD = "remote chips and Ethernet links are not visible without tt-umd: pip install 'ttmesh[hw]'"


def _umd() -> Any | None:
    try:
        import tt_umd
    except ImportError:
        return None
    return tt_umd


def _options(umd: Any, remote: bool = True) -> Any:
    opts = umd.TopologyDiscoveryOptions()
    ignore = umd.TopologyDiscoveryOptions.Action.IGNORE
    # As tt-smi does: a firmware mismatch or a dead Ethernet core must not abort discovery.
    for name in (
        "eth_fw_mismatch_action",
        "eth_fw_heartbeat_failure",
        "cmfw_mismatch_action",
        "unexpected_routing_firmware_config",
    ):
        with contextlib.suppress(AttributeError):
            setattr(opts, name, ignore)
    with contextlib.suppress(AttributeError):
        opts.discover_remote_devices = remote
    return opts


def umd_topology(host: Host) -> tuple[clusterdesc.ClusterDescriptor | None, str, list[str]]:
    """The host's cluster descriptor from tt-umd's topology discovery (real hosts only)."""
    if str(host.root) != "/":
        return None, "none", [f"{host.root} is not this machine's root: no topology to discover"]
    umd = _umd()
    if umd is None:
        return None, "none", [NO_UMD]
    os.environ.setdefault("TT_LOGGER_LEVEL", "error")
    try:
        cd = umd.TopologyDiscovery.create_cluster_descriptor(_options(umd))
        with tempfile.TemporaryDirectory(prefix="ttmesh-umd-") as tmp:
            path = cd.serialize_to_file(os.path.join(tmp, "cluster_descriptor.yaml"))
            return clusterdesc.load(path), "tt_umd", []
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, "none", [f"tt-umd topology discovery failed: {first}"]


def _devices(umd: Any) -> dict[str, Any]:
    """asic id -> tt-umd device, for every chip tt-umd can reach."""
    cd, devices = umd.TopologyDiscovery.discover(_options(umd))
    ids = cd.get_chip_unique_ids()
    return {format(ids[chip], "016x"): dev for chip, dev in devices.items() if chip in ids}


def _per_chip(
    host: Host, asics: list[str], read: Callable[[Any], int | None]
) -> dict[str, int | None]:
    """``read(firmware info provider)`` for each chip tt-umd reaches; None where it can't tell."""
    out: dict[str, int | None] = {a: None for a in asics}
    umd = _umd()
    if umd is None or str(host.root) != "/":
        return out
    try:
        devices = _devices(umd)
    except Exception:
        return out
    for asic in asics:
        dev = devices.get(asic)
        if dev is not None:
            with contextlib.suppress(Exception):
                out[asic] = read(dev.get_firmware_info_provider())
    return out


def eth_live_status(host: Host, asics: list[str]) -> dict[str, int | None]:
    """ETH_LIVE_STATUS-shaped bits per chip (bit 16+c: channel c up), None when unknown."""
    return _per_chip(host, asics, status_bits)


def status_bits(provider: Any) -> int | None:
    """Fold the provider's per-channel lists (index = channel) into ETH_LIVE_STATUS bits."""
    links = provider.get_eth_link_status_per_core()
    if links is None:
        return None  # firmware older than 19.9 cannot tell
    beats = provider.get_eth_heartbeat_status_per_core() or []
    value = 0
    for chan, (_core, up) in enumerate(links):
        if up:
            value |= 1 << (16 + chan)
    for chan, (_core, alive) in enumerate(beats):
        if alive:
            value |= 1 << chan
    return value


def remote_heartbeats(host: Host, asics: list[str]) -> dict[str, int | None]:
    """Firmware heartbeat counters of chips without a driver node of their own."""
    return _per_chip(host, asics, lambda provider: provider.get_heartbeat())


def update_intervals(host: Host, chips: list[tuple[str, int | None]]) -> dict[str, float | None]:
    """Seconds between telemetry updates (the heartbeat advances once per update), as each PCI
    chip's firmware reports them: Blackhole's ``UPDATE_TELEM_SPEED`` tag, in ms
    (tt-zephyr-platforms ``telemetry.c``; 100 ms). Read through tt-umd's ARC telemetry reader on
    the PCI device directly (no topology discovery); None where tt-umd is missing, the chip is
    remote, or its firmware has no such tag (Wormhole)."""
    out: dict[str, float | None] = {a: None for a, _ in chips}
    umd = _umd()
    if umd is None or str(host.root) != "/":
        return out
    tag = getattr(getattr(umd, "TelemetryTag", None), "UPDATE_TELEM_SPEED", None)
    if tag is None:
        return out
    for asic, dev in chips:
        if dev is None:
            continue
        with contextlib.suppress(Exception):
            device = umd.TTDevice.create(dev)
            with contextlib.suppress(AttributeError):
                device.init_tt_device()
            reader = device.get_arc_telemetry_reader()
            if reader.is_entry_available(tag):
                ms = int(reader.read_entry(tag))
                out[asic] = ms / 1000.0 if 0 < ms <= 60_000 else None
    return out


# --------------------------------------------------------------------------- chip telemetry
# Temperature, power, clock and voltage, for ``ttmesh top``. Two sources, read the same way on
# every host: the host's tt-smi snapshot (``tt-smi -s``; on a simulated host its tt-smi
# stand-in, which reports the simulated chips), parsed here, and the driver's own files (the
# hwmon node tt-kmd registers for each PCI device, ``tt_aiclk``), read through the host reader.


@dataclass(frozen=True)
class Reading:
    """One chip's telemetry; None where the source does not say."""

    temperature_c: float | None = None
    power_w: float | None = None
    aiclk_mhz: float | None = None
    voltage_v: float | None = None

    def known(self) -> bool:
        return any(v is not None for v in asdict(self).values())


@dataclass(frozen=True)
class SmiDevice:
    """A device of a tt-smi snapshot: how to find its chip, and its reading."""

    bdf: str | None  # None: a remote chip (tt-smi says "N/A")
    board_id: str | None
    asic_id: str | None  # Blackhole telemetry carries the unique id; Wormhole's does not
    reading: Reading


def _number(value: Any) -> float | None:
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_snapshot(doc: Any) -> list[SmiDevice]:
    """The devices of a ``tt-smi -s`` document (what cannot be read is left out)."""
    devices = doc.get("device_info") if isinstance(doc, dict) else None
    out: list[SmiDevice] = []
    for entry in devices if isinstance(devices, list) else []:
        if not isinstance(entry, dict):
            continue
        board = entry.get("board_info") or {}
        telem = entry.get("telemetry") or {}
        smbus = entry.get("smbus_telem") or {}
        if not isinstance(board, dict) or not isinstance(telem, dict):
            continue
        bus = str(board.get("bus_id") or "").strip().lower()
        board_id = str(board.get("board_id") or "").strip().lower() or None
        asic = None
        if isinstance(smbus, dict) and smbus.get("ASIC_ID_HIGH") and smbus.get("ASIC_ID_LOW"):
            with contextlib.suppress(ValueError, TypeError):
                high = int(str(smbus["ASIC_ID_HIGH"]), 0)
                low = int(str(smbus["ASIC_ID_LOW"]), 0)
                asic = format((high << 32) | low, "016x")
        reading = Reading(
            temperature_c=_number(telem.get("asic_temperature")),
            power_w=_number(telem.get("power")),
            aiclk_mhz=_number(telem.get("aiclk")),
            voltage_v=_number(telem.get("voltage")),
        )
        bdf = bus if bus and bus != "n/a" else None
        out.append(SmiDevice(bdf, board_id, asic, reading))
    return out


HWMON = "sys/class/tenstorrent/tenstorrent!{dev}/device/hwmon"


def sysfs_reading(host: Host, dev: int) -> Reading:
    """What the driver shows of PCI device ``dev``: its hwmon node (tt-kmd 1.29 and later:
    ``temp1_input`` in m°C, ``power1_input`` in µW, ``in0_input`` in mV) and ``tt_aiclk``."""
    values: dict[str, float | None] = {}
    base = HWMON.format(dev=dev)
    try:
        nodes = sorted(os.listdir(host.path(base)))
    except OSError:
        nodes = []
    for node in nodes[:1]:
        for key, name, scale in (
            ("temperature_c", "temp1_input", 1e-3),
            ("power_w", "power1_input", 1e-6),
            ("voltage_v", "in0_input", 1e-3),
        ):
            number = _number(host.read_text(f"{base}/{node}/{name}"))
            values[key] = None if number is None else number * scale
    values["aiclk_mhz"] = _number(host.attr(dev, "tt_aiclk"))
    return Reading(**values)
