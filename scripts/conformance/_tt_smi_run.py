"""Run tt-smi 6.8.0's own code on a simulated host, without hardware (used by ``tt-smi-run``).

Reads a JSON list of cases on stdin; each is ``{"root": ROOT, "argv": [...], "env": {...},
"snapshot": DOC}`` and runs ``tt_smi.tt_smi.main()`` itself: tt-smi's argument parser, its
``-r`` target parsing and dispatch (``device_input.py``, ``reset.py``), its ``-ls`` tables and
``-s`` document (``backend.py``), with only what touches hardware replaced:

* the driver's version is read from ``ROOT/sys/module/tenstorrent/version``;
* ``PCIDevice.enumerate_devices_info`` lists the root's ``/dev/tenstorrent`` devices;
* ``WarmReset`` records the call tt-smi makes (which function, which ids) instead of resetting;
  ids outside a C int are handed to tt-umd's real binding, whose argument check refuses them
  before anything runs (a TypeError, as on hardware);
* ``TopologyDiscovery.discover`` returns devices that answer telemetry reads with the raw values
  of ``snapshot`` (the stand-in's own ``-s``, in its order), and a cluster descriptor with their
  PCI addresses and tt-umd's own reading of the root's ``cluster_descriptor.yaml`` for
  coordinates; sysfs reads under ``/sys/bus/pci/devices`` go to the root.

Prints a JSON list of ``{"code", "out", "err", "call"}``, one per case.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import types

os.environ.setdefault("TT_LOGGER_LEVEL", "error")

import rich
import tt_smi.backend as backend
import tt_smi.reset as reset
import tt_smi.tt_smi as cli
import tt_umd
from tt_smi import constants
from tt_tools_common.utils_common import system_utils

C_INT = range(-(2**31), 2**31)


def driver(root: str) -> str | None:
    try:
        with open(os.path.join(root, "sys/module/tenstorrent/version")) as f:
            return f.read().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return None


def devices_of(root: str) -> dict[int, str]:
    """/dev/tenstorrent/N -> its PCI address, from the root's driver files."""
    out = {}
    for name in os.listdir(os.path.join(root, "dev/tenstorrent")):
        if name.isdigit():
            # .../devices/pci0000:00/<BDF>/tenstorrent/tenstorrent!N, as the driver links it
            link = os.readlink(os.path.join(root, f"sys/class/tenstorrent/tenstorrent!{name}"))
            out[int(name)] = link.split("/")[-3]
    return dict(sorted(out.items()))


class Info:
    def __init__(self, bdf: str, subsystem: int) -> None:
        self.pci_bdf = bdf
        self.subsystem_id = subsystem


class Recorder:
    """tt-umd's WarmReset, recording instead of resetting."""

    calls: list[list] = []  # noqa: RUF012 (the class is the recorder; reset for each case)

    @classmethod
    def _record(cls, name: str, ids: list, **kwargs: object) -> bool:
        if any(isinstance(i, int) and i not in C_INT for i in ids):
            getattr(tt_umd.WarmReset, name)(ids, **kwargs)  # refused by its argument check
            raise AssertionError("tt-umd's binding took an id outside a C int")
        cls.calls.append([name, list(ids)])
        return True

    @classmethod
    def warm_reset(cls, ids: list = (), **kw: object) -> bool:
        return cls._record("warm_reset", list(ids), **kw)

    @classmethod
    def warm_reset_chip_id(cls, ids: list = (), **kw: object) -> bool:
        return cls._record("warm_reset_chip_id", list(ids), **kw)

    @classmethod
    def warm_reset_pci_bdfs(cls, bdfs: list = (), **kw: object) -> bool:
        return cls._record("warm_reset_pci_bdfs", list(bdfs), **kw)


class Reader:
    """A chip's telemetry: the raw values of the snapshot, by tt-umd's tag numbers."""

    def __init__(self, smbus: dict, tags: type) -> None:
        self.values = {}
        names = {t.name: t.value for t in tags}
        names["INPUT_POWER"] = constants.TAG_INPUT_POWER
        for name, value in smbus.items():
            if value is not None:
                self.values[names[name]] = int(value, 16)

    def is_entry_available(self, tag: int) -> bool:
        return tag in self.values

    def read_entry(self, tag: int) -> int:
        return self.values[tag]


class Device:
    """What tt-smi asks of a UMD TTDevice."""

    def __init__(self, entry: dict, dev: int | None) -> None:
        self.wormhole = "ARC3_HEALTH" in entry["smbus_telem"]
        self.remote = entry["board_info"]["bus_id"] == "N/A"
        self.dev = dev
        tags = tt_umd.wormhole.TelemetryTag if self.wormhole else tt_umd.TelemetryTag
        self.reader = Reader(entry["smbus_telem"], tags)

    def get_arch(self) -> object:
        return tt_umd.ARCH.WORMHOLE_B0 if self.wormhole else tt_umd.ARCH.BLACKHOLE

    def is_remote(self) -> bool:
        return self.remote

    def get_communication_device_id(self) -> int | None:
        return self.dev

    def get_arc_telemetry_reader(self) -> Reader:
        return self.reader


class Coord:
    def __init__(self, c: object) -> None:
        self.x, self.y, self.rack, self.shelf = c.x, c.y, c.rack, c.shelf  # type: ignore[attr-defined]


class Descriptor:
    """tt-smi's reads of the cluster descriptor, by UMD id."""

    def __init__(self, bdfs: dict[int, str], locations: dict[int, Coord]) -> None:
        self.bdfs, self.locations = bdfs, locations

    def get_chip_pci_bdfs(self) -> dict[int, str]:
        return dict(self.bdfs)

    def get_chip_locations(self) -> dict[int, Coord]:
        return dict(self.locations)


def discovered(root: str, snapshot: dict) -> tuple[Descriptor, dict[int, Device]]:
    by_bdf = {b: n for n, b in devices_of(root).items()}
    with open(os.path.join(root, "cluster_descriptor.yaml")) as f:
        real = tt_umd.ClusterDescriptor.create_from_yaml_content(f.read())
    with open(os.path.join(root, "sim/system.json")) as f:
        chips = json.load(f)["chips"]
    unique_of = {u: c for c, u in real.get_chip_unique_ids().items()}
    where = real.get_chip_locations()
    devices, bdfs, locations = {}, {}, {}
    remote_seen: dict[str, int] = {}
    for i, entry in enumerate(snapshot["device_info"]):
        bdf = entry["board_info"]["bus_id"]
        board = int(entry["board_info"]["board_id"], 16)
        if bdf != "N/A":
            chip = next(c for c in chips if c["bdf"] == bdf)
            bdfs[i] = bdf
        else:  # the remote chips of a board, in the order the snapshot lists them
            remotes = [c for c in chips if not c["bdf"] and c["board_id"] == board]
            chip = remotes[remote_seen.get(str(board), 0)]
            remote_seen[str(board)] = remote_seen.get(str(board), 0) + 1
        devices[i] = Device(entry, by_bdf.get(bdf))
        cid = unique_of.get(chip["unique_id"])
        if cid is not None and cid in where:
            locations[i] = Coord(where[cid])
    return Descriptor(bdfs, locations), devices


def patch(case: dict) -> None:
    root = case["root"]
    version = driver(root)
    cli.get_driver_version = lambda: version
    reset.get_driver_version = lambda: version
    system_utils.get_driver_version = lambda: version
    subsystem = int(case.get("subsystem", 0))
    reset.PCIDevice = types.SimpleNamespace(
        enumerate_devices_info=lambda: {n: Info(b, subsystem) for n, b in devices_of(root).items()},
        enumerate_devices=lambda: list(devices_of(root)),
    )
    reset.WarmReset = Recorder
    Recorder.calls = []
    none = types.SimpleNamespace(discover=lambda options=None: ({}, {}))
    reset.TopologyDiscovery = none
    snapshot = case.get("snapshot")
    cli.TopologyDiscovery = types.SimpleNamespace(
        discover=lambda options=None: discovered(root, snapshot) if snapshot else ({}, {})
    )
    backend.SmBusArcTelemetryReader = lambda device: device.reader
    real = os.path.realpath

    def realpath(path: str, *a: object, **k: object) -> str:
        if str(path).startswith("/sys/bus/pci/devices/"):
            return real(os.path.join(root, str(path).lstrip("/")))
        return real(path, *a, **k)

    backend.os = types.SimpleNamespace(**{**vars(os), "path": types.SimpleNamespace(
        **{**vars(os.path), "realpath": realpath})})  # fmt: skip
    rich._console = None  # a console of this case's width (rich reads COLUMNS when it is made)


def run(case: dict) -> dict:
    saved = dict(os.environ)
    os.environ.update(case.get("env", {}))
    for key in case.get("unset", []):
        os.environ.pop(key, None)
    patch(case)
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["tt-smi", *case["argv"]]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # uncaught in tt-smi: Python prints it and exits 1
        err.write(f"{type(exc).__name__}: {exc}\n")
        code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"code": code, "out": out.getvalue(), "err": err.getvalue(), "calls": Recorder.calls}


def main() -> None:
    cases = json.load(sys.stdin)
    json.dump([run(c) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
