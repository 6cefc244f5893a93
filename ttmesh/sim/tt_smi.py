#!/usr/bin/env python3
"""tt-smi stand-in for a ttmesh simulated host (behaves as tt-smi 6.8.0 does; standard library only).

Installed as ``<root>/bin/tt-smi`` next to ``_ttmesh_simcore.py``; it serves the simulated host
whose root is the parent of its ``bin/``. Options, messages, exit codes, target grammar, the
``-ls`` tables and the snapshot's shape follow the real tool, including its traps: ``-r`` exits
0 whatever the reset did, UMD logical ids or PCI addresses that match nothing reset every
device, PCI addresses are matched case-sensitively, a chip may come back under another
``/dev/tenstorrent`` number, and ``-ls`` cuts what does not fit the console's width.

Chips are numbered as tt-umd numbers them, which is how tt-smi names them (``-ls``'s UMD Chip ID,
``-s``'s order, ``-r N``): the PCI devices in PCI-address order, then the remote chips in the
order discovery reaches them (:meth:`Host.umd_chips`). tests/test_tt_smi_conformance.py runs
tt-smi 6.8.0's own code against this stand-in.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import pwd
import re
import socket
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
try:  # inside a simulated root
    import _ttmesh_simcore as core
    import _ttmesh_smitable as smitable
except ImportError:  # run from the ttmesh package itself
    from ttmesh.sim import core, smitable

VERSION = "6.8.0"
SW_VERSIONS = {"tt_smi": VERSION, "pyluwen": "0.10.0", "tt_umd": "0.9.12"}
RED, PURPLE, BLUE, GREEN, YELLOW, ENDC = (
    "\033[91m",
    "\033[95m",
    "\033[94m",
    "\033[92m",
    "\033[93m",
    "\033[0m",
)
DESCRIPTION = (
    "Tenstorrent System Management Interface (TT-SMI) is a command line utility to interact "
    "with all Tenstorrent devices on host. The main objective of TT-SMI is to provide a simple "
    "and easy-to-use interface to display devices, device telemetry, and system information. "
    "TT-SMI is also used to issue board-level resets."
)
NO_DRIVER = (
    "No Tenstorrent driver detected! Please install driver using tt-kmd: "
    "https://github.com/tenstorrent/tt-kmd "
)
NO_DEVICES = "No Tenstorrent devices detected! Please check your hardware and try again. Exiting..."
GALAXY_UPI = (0x35, 0x47, 0x202)
BDF_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")

WH_TAGS = [
    "ENUM_VERSION",
    "DEVICE_ID",
    "ASIC_RO",
    "ASIC_IDD",
    "BOARD_ID_HIGH",
    "BOARD_ID_LOW",
    "ARC0_FW_VERSION",
    "ARC1_FW_VERSION",
    "ARC2_FW_VERSION",
    "ARC3_FW_VERSION",
    "SPIBOOTROM_FW_VERSION",
    "ETH_FW_VERSION",
    "DM_BL_FW_VERSION",
    "DM_APP_FW_VERSION",
    "DDR_STATUS",
    "ETH_STATUS0",
    "ETH_STATUS1",
    "PCIE_STATUS",
    "FAULTS",
    "ARC0_HEALTH",
    "ARC1_HEALTH",
    "ARC2_HEALTH",
    "ARC3_HEALTH",
    "FAN_SPEED",
    "AICLK",
    "AXICLK",
    "ARCCLK",
    "THROTTLER",
    "VCORE",
    "ASIC_TEMPERATURE",
    "VREG_TEMPERATURE",
    "BOARD_TEMPERATURE",
    "TDP",
    "TDC",
    "VDD_LIMITS",
    "THM_LIMITS",
    "WH_FW_DATE",
    "ASIC_TMON0",
    "ASIC_TMON1",
    "MVDDQ_POWER",
    "GDDR_TRAIN_TEMP0",
    "GDDR_TRAIN_TEMP1",
    "BOOT_DATE",
    "RT_SECONDS",
    "ETH_DEBUG_STATUS0",
    "ETH_DEBUG_STATUS1",
    "TT_FLASH_VERSION",
    "ETH_LOOPBACK_STATUS",
    "ETH_LIVE_STATUS",
    "FW_BUNDLE_VERSION",
    "NUMBER_OF_TAGS",
    "INPUT_POWER",
]
BH_TAGS = [
    "BOARD_ID_HIGH",
    "BOARD_ID_LOW",
    "ASIC_ID",
    "HARVESTING_STATE",
    "UPDATE_TELEM_SPEED",
    "VCORE",
    "TDP",
    "TDC",
    "VDD_LIMITS",
    "THM_LIMIT_SHUTDOWN",
    "ASIC_TEMPERATURE",
    "VREG_TEMPERATURE",
    "BOARD_TEMPERATURE",
    "AICLK",
    "AXICLK",
    "ARCCLK",
    "L2CPUCLK0",
    "L2CPUCLK1",
    "L2CPUCLK2",
    "L2CPUCLK3",
    "ETH_LIVE_STATUS",
    "DDR_STATUS",
    "DDR_SPEED",
    "ETH_FW_VERSION",
    "GDDR_FW_VERSION",
    "DM_APP_FW_VERSION",
    "DM_BL_FW_VERSION",
    "FLASH_BUNDLE_VERSION",
    "CM_FW_VERSION",
    "L2CPU_FW_VERSION",
    "FAN_SPEED",
    "TIMER_HEARTBEAT",
    "TELEMETRY_ENUM_COUNT",
    "ENABLED_TENSIX_COL",
    "ENABLED_ETH",
    "ENABLED_GDDR",
    "ENABLED_L2CPU",
    "PCIE_USAGE",
    "NOC_TRANSLATION",
    "FAN_RPM",
    "GDDR_0_1_TEMP",
    "GDDR_2_3_TEMP",
    "GDDR_4_5_TEMP",
    "GDDR_6_7_TEMP",
    "GDDR_0_1_CORR_ERRS",
    "GDDR_2_3_CORR_ERRS",
    "GDDR_4_5_CORR_ERRS",
    "GDDR_6_7_CORR_ERRS",
    "GDDR_UNCORR_ERRS",
    "MAX_GDDR_TEMP",
    "ASIC_LOCATION",
    "BOARD_POWER_LIMIT",
    "TDC_LIMIT_MAX",
    "THM_LIMIT_THROTTLE",
    "TT_FLASH_VERSION",
    "THERM_TRIP_COUNT",
    "ASIC_ID_HIGH",
    "ASIC_ID_LOW",
    "AICLK_LIMIT_MAX",
    "TDP_LIMIT_MAX",
    "AICLK_ARB_MIN",
    "AICLK_ARB_MAX",
    "ENABLED_MIN_ARB",
    "ENABLED_MAX_ARB",
    "NUMBER_OF_TAGS",
    "INPUT_POWER",
]
SMI_BOARD_TYPE = {  # tt-smi's utils.get_board_type, by the board id's UPI
    0x3: "e150",
    0xA: "e300",
    0x7: "e75",
    0x8: "nb_cb",
    0xB: "wh_4u",
    0x36: "bh-scrappy",
    0x202: "tt-galaxy-bh",
    0x18: "n150",
    0x14: "n300",
    0x35: "tt-galaxy-wh",
    0x43: "p100a",
    0x40: "p150a",
    0x41: "p150b",
    0x42: "p150c",
    0x44: "p300b",
    0x45: "p300a",
    0x46: "p300c",
    0x47: "tt-galaxy-bh",
}


def say(color: str, text: str) -> None:
    print(color, text, ENDC)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=DESCRIPTION)
    p.add_argument(
        "-l",
        "--local",
        action="store_true",
        default=False,
        help="Run on local chips (Wormhole only)",
    )
    p.add_argument("-v", "--version", action="version", version=VERSION)
    p.add_argument(
        "-s",
        "--snapshot",
        action="store_true",
        default=False,
        help="Dump snapshot of current tt-smi information to STDOUT",
    )
    p.add_argument(
        "-ls",
        "--list",
        action="store_true",
        default=False,
        help="List boards on the host and quit. With UMD (default), tables include UMD "
        "Chip ID, PCI BDF, PCI Dev ID (/dev/tenstorrent/<n>), board type, series, and "
        "board number.",
    )
    p.add_argument(
        "-f",
        "--filename",
        metavar="snapshot filename",
        nargs="?",
        default=False,
        const=None,
        help="Write snapshot to a file. Default: ~/tt_smi/<timestamp>_snapshot.json",
    )
    p.add_argument(
        "-c",
        "--compact",
        action="store_true",
        default=False,
        help="Run in compact mode, hiding the sidebar and other static elements",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        default=False,
        help="Do not access the network; hides the Versions box",
    )
    p.add_argument(
        "-r",
        "--reset",
        nargs="*",
        default=None,
        metavar="TARGETS",
        help="Reset targets: UMD logical IDs, PCI BDFs (e.g. 0000:0a:00.0), or "
        "/dev/tenstorrent/<id>. Use -ls to list devices. Omit targets or use 'all' to "
        "reset all devices. Do not mix types in one command. With --use_luwen, use BDF "
        "or /dev/tenstorrent/<id> (not bare integers).",
    )
    p.add_argument(
        "--snapshot_no_tty",
        action="store_true",
        default=False,
        help="Force no-tty behavior in the snapshot to stdout",
    )
    p.add_argument(
        "-glx_reset",
        "--galaxy_6u_trays_reset",
        dest="glx_reset",
        action="store_true",
        default=False,
        help="Reset all the ASICs on the galaxy host; prefers no PCIe retimer reset "
        "(BMC v0.05.22+), falls back to legacy retimer reset",
    )
    p.add_argument(
        "-glx_reset_auto",
        "--galaxy_6u_trays_reset_auto",
        dest="glx_reset_auto",
        action="store_true",
        default=False,
        help="Reset all ASICs on the galaxy host, but do auto retries up to 3 times if reset fails",
    )
    p.add_argument(
        "-glx_list_tray_to_device",
        "--galaxy_6u_list_tray_to_device",
        dest="glx_list_tray_to_device",
        action="store_true",
        default=False,
        help="List the mapping of devices to trays on the galaxy",
    )
    p.add_argument(
        "--no_reinit", action="store_true", default=False, help="Don't detect devices post reset"
    )
    p.add_argument(
        "--use_luwen",
        action="store_true",
        default=False,
        help="Use deprecated Luwen driver instead of UMD (default).",
    )
    p.add_argument(
        "--eth_train_skip",
        action="store_true",
        default=False,
        help="Skip waiting for Ethernet training post reset.",
    )
    return p


class Host:
    """The simulated host this tt-smi serves (``bin/..``, or ``TTMESH_SIM_ROOT``)."""

    def __init__(self) -> None:
        root = os.environ.get("TTMESH_SIM_ROOT") or os.path.dirname(HERE)
        self.sim = core.SimRoot(root)

    def driver_version(self) -> str | None:
        path = self.sim.path("sys/module/tenstorrent/version")
        try:
            real = os.path.realpath(self.sim.root)
            text = core.fileread.read_text(path, core.MAX_SMALL, "driver version", real)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # fileread.Refused is a ValueError
            raise core.SimCorrupt(self.sim.root, path, getattr(exc, "why", str(exc))) from None
        return text.split("\n", 1)[0].strip()

    def pci_devices(self, state: dict) -> list[tuple[str, int, str]]:
        """(bdf, /dev number, asic) of present PCI devices, sorted by PCI address."""
        out = []
        for chip in self.sim.chips():
            asic = core.asic_hex(chip["unique_id"])
            dev = self.sim.dev_of(state, asic)
            if chip.get("bdf") and dev is not None:
                out.append((chip["bdf"], dev, asic))
        out.sort()
        visible = os.environ.get("TT_VISIBLE_DEVICES")
        if visible is None:
            return out
        keep = []
        for i, item in enumerate(out):
            for entry in (e.strip() for e in visible.split(",") if e.strip()):
                if (entry.isdigit() and int(entry) == i) or (
                    not entry.isdigit() and entry in item[0]
                ):
                    keep.append(item)
                    break
        return keep

    def umd_chips(self, state: dict) -> list[dict]:
        """The chips tt-umd's discovery finds, in the order of their UMD logical ids (tt-smi's
        UMD Chip ID and device order).

        tt-umd (``device/topology/topology_discovery.cpp``): ``get_connected_devices`` gives
        the PCI devices the first ids in ``PCIDevice::enumerate_devices`` order, which is PCI
        address order (``pci_device.cpp`` ``sort_ids_based_on_bdf``, tt-umd #2255; the
        logical ids of #1915). ``discover_remote_devices`` then takes the chips to explore from
        a ``std::map`` keyed by ASIC id (smallest first), and over each trained Ethernet link,
        in channel order, gives the next id to a chip not seen yet whose board is one of the
        PCI devices' boards (``is_board_id_included``). Blackhole discovers no remote chip.
        A chip that is a PCI device of its own is never reached as a remote one here."""
        mmio = [self.sim.chip_by_asic(asic) for _, _, asic in self.pci_devices(state)]
        found = list(mmio)
        boards = {c["board_id"] for c in mmio}
        ends: dict[str, list[tuple[int, str]]] = {}
        for a, ca, b, cb in self.sim.links():
            ends.setdefault(a, []).append((ca, b))
            ends.setdefault(b, []).append((cb, a))
        live = self.sim.eth_live_statuses(state, sorted(ends))
        seen = {core.asic_hex(c["unique_id"]) for c in mmio}
        pending = {c["unique_id"]: c for c in mmio}
        while pending:
            chip = pending.pop(min(pending))
            if chip["arch"] == "blackhole":
                continue
            asic = core.asic_hex(chip["unique_id"])
            for chan, other in sorted(ends.get(asic, ())):
                if not live.get(asic, 0) >> (16 + chan) & 1 or other in seen:
                    continue
                far = self.sim.chip_by_asic(other)
                if far.get("bdf") or far["board_id"] not in boards:
                    continue
                if not state["chips"][other]["present"] or not state["chips"][other]["alive"]:
                    continue
                seen.add(other)
                found.append(far)
                pending[far["unique_id"]] = far
        return found

    def is_galaxy(self) -> bool:
        return any((c["board_id"] >> 36) & 0xFFFFF in GALAXY_UPI for c in self.sim.chips())


# --------------------------------------------------------------------------- reset


class TargetError(Exception):
    pass


def parse_targets(raw: list[str]) -> tuple[str, list]:
    """tt-smi's ``parse_smi_device_input`` (``tt_smi/device_input.py``): (kind, values)."""
    items: list[str] = []
    for arg in raw:
        items += [p.strip() for p in arg.split(",") if p.strip()]
    if not items or (len(items) == 1 and items[0].lower() == "all"):
        return "ALL", []
    kind = None
    values: list = []
    for t in items:
        this, value = classify(t)
        if kind is not None and this != kind:
            raise TargetError(
                f"Mixed device target kinds are not allowed. Got '{t}' which is a {this}, but "
                f"earlier inputs were {kind}. Use only one kind per invocation."
            )
        kind = this
        if value not in values:
            values.append(value)
    if kind != "PCI_BDF":
        values.sort()
    return kind or "ALL", values


def classify(t: str) -> tuple[str, int | str]:
    """tt-smi's ``classify_single_input``, checked in its order. Its digit tests are Python's
    ``str.isdigit`` and ``int``: ``٣`` is the id 3, and ``²`` passes ``isdigit`` but not
    ``int``, whose ValueError tt-smi prints as the reason."""
    if t.lower() == "all":
        raise TargetError("Use 'all' as the only argument to select all devices")
    if t.startswith(DEV_PREFIX):
        suffix = t[len(DEV_PREFIX) :].strip()
        if not suffix.isdigit():
            raise TargetError(f"Invalid path: {t} (expected /dev/tenstorrent/<integer>)")
        return "DEV_TENSTORRENT_ID", _int(suffix)
    if BDF_RE.match(t):
        return "PCI_BDF", t
    if t.lstrip("-").isdigit():
        return "UMD_LOGICAL_ID", _int(t)
    raise TargetError(
        f"Invalid device target: '{t}'. Use UMD logical ID (integer), PCI BDF (e.g. "
        "0000:0a:00.0), or /dev/tenstorrent/<integer>."
    )


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise TargetError(str(exc)) from None


# tt-umd's Python binding (nanobind) takes each id as a C int: a Python int outside it fails the
# call's argument check, before any reset (checked against tt-umd 0.9.12's wheel).
C_INT = range(-(2**31), 2**31)
BINDING = {
    "UMD_LOGICAL_ID": "warm_reset_chip_id",
    "DEV_TENSTORRENT_ID": "warm_reset",
    "ALL": "warm_reset",
}


def binding_refusal(kind: str, values: list) -> str | None:
    """The TypeError tt-umd's binding raises for ids outside a C int, as Python prints it."""
    if kind not in BINDING or all(v in C_INT for v in values):
        return None
    name = BINDING[kind]
    first = "chip_ids" if name == "warm_reset_chip_id" else "pci_device_ids"
    return (
        f"TypeError: {name}(): incompatible function arguments. The following argument types "
        f"are supported:\n    1. {name}({first}: collections.abc.Sequence[int] = [], "
        "reset_m3: bool = False, secondary_bus_reset: bool = True, m3_delay_s: "
        "datetime.timedelta | float = 20.0) -> bool\n\nInvoked with types: list, kwargs = { "
        "secondary_bus_reset: bool }"
    )


def chosen_devices(
    kind: str, values: list, devices: list[tuple[str, int, str]]
) -> tuple[bool, list[str]]:
    """Whether tt-umd 0.9.12 goes on to reset (and so tells the listeners), and the asics it
    resets, for tt-smi's targets (``device/warm_reset.cpp``).

    ``devices`` are ``PCIDevice::enumerate_devices()``: (bdf, /dev number, asic) in PCI order.
    ``warm_reset_chip_id`` maps each UMD id below the device count to that device and skips
    the others ("Provided UMD ID {} is out of range. Skipping."); a negative id passes that
    check and indexes before the list (undefined in C++; here it names no device).
    ``warm_reset_pci_bdfs`` keeps the devices whose address is one of the targets, exactly as
    written. ``warm_reset`` is given /dev numbers as they are, and its ioctls reach only
    enumerated devices among them (``PCIDevice::send_reset_ioctl_to_devices``). Whichever way,
    an EMPTY list means every device ("If pci_device_ids is empty, enumerate all devices"),
    and with none at all it returns before telling anyone ("No PCI devices found.")."""
    every = [asic for _, _, asic in devices]
    ids: list[int | None]
    if kind == "ALL":
        ids = []
    elif kind == "UMD_LOGICAL_ID":
        ids = [(devices[i][1] if i >= 0 else None) for i in values if i < len(devices)]
    elif kind == "PCI_BDF":
        ids = [dev for bdf, dev, _ in devices if bdf in values]
    else:
        ids = list(values)
    if not ids:
        return bool(every), every
    return True, [asic for _, dev, asic in devices if dev in ids]


def do_reset(host: Host, args: argparse.Namespace) -> int:
    try:
        kind, values = parse_targets(args.reset)
    except TargetError as exc:
        say(RED, str(exc))
        return 1
    state = host.sim.read_state()
    devices = host.pci_devices(state)
    if host.is_galaxy():
        say(
            YELLOW,
            "CPLD FW v1.16 or higher is required to use tt-smi -r on Galaxy systems. If "
            "tt-smi -r fails, please continue to use tt-smi -glx_reset instead and contact your "
            "system administrator to request a CPLD update.",
        )
    if kind == "ALL":
        values = sorted(dev for _, dev, _ in devices)  # enumerate_devices_info's keys
        print(f"Resetting all PCI devices: {values}")
    else:
        print(f"{RESETTING[kind]}: {values}")
    sys.stdout.flush()
    refusal = binding_refusal(kind, values)
    if refusal is not None:  # tt-smi does not catch it: Python's traceback, exit 1
        sys.stderr.write(
            "Traceback (most recent call last):\n"
            f'  File "{sys.argv[0]}", line 8, in <module>\n'
            "    sys.exit(main())\n"
            f"  (tt_smi/reset.py, umd_pci_warm_reset: WarmReset.{BINDING[kind]}(...))\n"
            f"{refusal}\n"
        )
        return 1
    goes_on, chosen = chosen_devices(kind, values, devices)
    if goes_on:
        notify_listeners(host.sim.root, PRE_RESET)
        try:
            if chosen:
                host.sim.reset(chosen)
        finally:
            notify_listeners(host.sim.root, POST_RESET)
    if not args.no_reinit:
        say(PURPLE, "Re-initializing boards after reset....")
    return 0


DEV_PREFIX = "/dev/tenstorrent/"
RESETTING = {
    "UMD_LOGICAL_ID": "Resetting UMD logical IDs",
    "PCI_BDF": "Resetting PCI BDFs",
    "DEV_TENSTORRENT_ID": "Resetting /dev/tenstorrent IDs",
}


# tt-umd's reset notices (device/warm_reset.cpp, WarmResetCommunication): one byte to every
# client_<PID>.sock in /tmp/tt_umd_listeners, 2 s of grace after PRE_RESET when one listened.
LISTENERS = "tmp/tt_umd_listeners"
PRE_RESET, POST_RESET = 0x01, 0x02
NOTICE_GRACE = 2.0


def notify_listeners(root: str, kind: int) -> int:
    """Tell every listener under the simulated root, as tt-umd's notifier does; how many
    were reached. A PRE_RESET that reached one waits tt-umd's grace before the reset."""
    import time

    try:
        fd = os.open(os.path.join(root, LISTENERS), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        names = sorted(os.listdir(f"/proc/self/fd/{fd}"))
        reached = _send_each(fd, names, kind)
    finally:
        os.close(fd)
    if reached and kind == PRE_RESET:
        time.sleep(NOTICE_GRACE)
    return reached


def _send_each(fd: int, names: list[str], kind: int) -> int:
    """One byte to each listener socket in the directory ``fd`` (short names: a deep root's
    path would pass the 108 bytes a socket address holds)."""
    reached = 0
    for name in names:
        if not (name.startswith("client_") and name.endswith(".sock")):
            continue
        if name == f"client_{os.getpid()}.sock":
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(f"/proc/self/fd/{fd}/{name}")
                s.sendall(bytes([kind]))
            except OSError:
                continue
            reached += 1
    return reached


def do_glx_reset(host: Host, args: argparse.Namespace) -> int:
    state = host.sim.read_state()
    devices = host.pci_devices(state)
    say(PURPLE, "Resetting WH Galaxy trays with reset command...")
    say(BLUE, f"Issuing RESET_PCIE_LINK on {len(devices)} devices before IPMI reset...")
    say(BLUE, f"Issuing USER_RESET on {len(devices)} devices before IPMI reset...")
    print("Executing command: sudo ipmitool raw 0x30 0x8B 0xF 0xFF 0x3 0xF")
    sys.stdout.flush()
    host.sim.reset([asic for _, _, asic in devices], command="-glx_reset")
    # tt-smi's timed_wait(30): "...: 0", then a "\r" rewrite per second up to 30, then a newline
    print(f"{YELLOW}Waiting for 30 seconds: 0{ENDC}", end="")
    for i in range(1, 31):
        print(f"\r{YELLOW}Waiting for 30 seconds: {i}{ENDC}", end="")
    print()
    state = host.sim.read_state()
    devices = host.pci_devices(state)
    say(BLUE, f"Issuing POST_RESET on {len(devices)} devices after IPMI reset...")
    say(PURPLE, "Re-initializing boards after reset....")
    if args.no_reinit:
        say(GREEN, "Exiting after galaxy reset without re-initializing chips.")
        return 0
    say(GREEN, f"Re-initialized {len(devices)} boards after reset. Exiting...")
    return 0


# --------------------------------------------------------------------------- snapshot


def _ver(value: int) -> str:
    return ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))


def _ver_int(text: str) -> int:
    parts = [int(p) for p in (text.split(".") + ["0"] * 4)[:4]]
    return (parts[0] << 24) | (parts[1] << 16) | (parts[2] << 8) | parts[3]


def device_entry(host: Host, state: dict, chip: dict) -> dict:
    sim = host.sim
    asic = core.asic_hex(chip["unique_id"])
    wormhole = chip["arch"] == "wormhole_b0"
    remote = not chip.get("bdf")
    raw_hb = sim.heartbeat(state, asic)
    eth = sim.eth_live_status(state, asic)
    fw = _ver_int(sim.system.get("fw_bundle_version", "19.10.0.0"))
    board_id = chip["board_id"]
    alive = state["chips"][asic]["alive"]
    values = {
        "BOARD_ID_HIGH": board_id >> 32,
        "BOARD_ID_LOW": board_id & 0xFFFFFFFF,
        "ETH_LIVE_STATUS": eth,
        "AICLK": (1000 if wormhole else 1350) if alive else 0,
        "VCORE": 750,
        "TDP": 35,
        "TDC": 32,
        "ASIC_TEMPERATURE": (45 << 4) if wormhole else (45 << 16),
        "FAN_SPEED": 0,
        "FAN_RPM": 2400,
        "INPUT_POWER": 60,
        "TT_FLASH_VERSION": 0x03030000,
        "ETH_FW_VERSION": 0x070000 if wormhole else 0x010400,  # 7.0.0 (8.4.12 bits), 1.4.0
        "DM_APP_FW_VERSION": 0x0E000000,
        "DM_BL_FW_VERSION": 0x81020000,
        "THERM_TRIP_COUNT": 0,
    }
    if wormhole:
        values.update(
            {
                "ARC3_HEALTH": raw_hb,
                "FW_BUNDLE_VERSION": fw,
                "ARC0_FW_VERSION": 0x02230000,
                "DDR_STATUS": 0x02222222,  # bits 24+: speed code 2 = "12G"; low 24: trained
                "WH_FW_DATE": 0x510C0000,  # 0xYMDDHHMM: 2025-01-12, as cm_fw_date says
                "VDD_LIMITS": (950 << 16) | 700,
                "THM_LIMITS": (90 << 16) | 75,
            }
        )
    else:
        interval = sim.update_interval_ms(state, asic)
        if interval is not None:
            values["UPDATE_TELEM_SPEED"] = interval
        values.update(
            {
                "TIMER_HEARTBEAT": raw_hb,
                "FLASH_BUNDLE_VERSION": fw,
                "CM_FW_VERSION": 0x00400000,
                "ASIC_ID": chip["unique_id"] & 0xFFFFFFFF,
                "ASIC_ID_HIGH": chip["unique_id"] >> 32,
                "ASIC_ID_LOW": chip["unique_id"] & 0xFFFFFFFF,
                "DDR_STATUS": 0x55555555,
                "DDR_SPEED": 16000,
                "GDDR_FW_VERSION": 0x0002000F,
                "ENABLED_GDDR": 0xFF,
                "ASIC_LOCATION": chip.get("asic_location") or 0,
                "TDP_LIMIT_MAX": 300,
                "TDC_LIMIT_MAX": 350,
                "AICLK_LIMIT_MAX": 1350,
                "THM_LIMIT_THROTTLE": 90,
                "THM_LIMIT_SHUTDOWN": 110,
                "BOARD_POWER_LIMIT": 300,
                "MAX_GDDR_TEMP": 50,
            }
        )
    tags = WH_TAGS if wormhole else BH_TAGS
    smbus = {t: (hex(values[t]) if t in values else None) for t in tags}
    smi_type = SMI_BOARD_TYPE.get((board_id >> 36) & 0xFFFFF, "N/A")
    if wormhole:
        smi_type += " R" if remote else " L"
    bdf = chip.get("bdf")
    speed: int | str = "N/A"
    width = "N/A"
    if bdf:
        real = os.path.realpath(sim.root)

        def read(rel: str) -> str:
            return core.fileread.read_text(sim.path(rel), core.MAX_SMALL, "PCI attribute", real)

        try:
            text = read(f"sys/bus/pci/devices/{bdf}/current_link_speed")
            gts = float(text.split()[0])
            speed = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5}.get(gts, "N/A")
            width = read(f"sys/bus/pci/devices/{bdf}/current_link_width")
            width = width.strip()
        except (OSError, ValueError, IndexError):  # fileread.Refused is a ValueError
            pass
    coords = chip.get("coords")
    return {
        "smbus_telem": smbus,
        "board_info": {
            "bus_id": "N/A" if remote else bdf,
            "board_type": smi_type,
            "board_id": format(board_id, "016x"),
            "coords": f"({', '.join(str(v) for v in coords)})"
            if wormhole and coords
            else ("(0, 0, 0, 0)" if wormhole else "N/A"),
            "dram_status": True,
            "dram_speed": "16G" if not wormhole else "12G",
            "pcie_speed": "N/A" if remote else speed,
            "pcie_width": "N/A" if remote else width,
        },
        "telemetry": {
            "voltage": f"{values['VCORE'] / 1000:4.2f}",
            "current": f"{values['TDC'] & 0xFFFF:5.1f}",
            "power": f"{values['TDP'] & 0xFFFF:5.1f}",
            "board_power": f"{values['INPUT_POWER']:5.1f}",
            "aiclk": f"{values['AICLK'] & 0xFFFF:4.0f}",
            "asic_temperature": f"{45.0:4.1f}",
            "fan_speed": f"{values['FAN_RPM'] if not wormhole else 0}",
            # tt-smi divides the raw counter (what sysfs tt_heartbeat shows) by 5 or 6.
            "heartbeat": str(raw_hb // (5 if wormhole else 6)),
        },
        "gddr_telemetry": {
            "speed": "16G" if not wormhole else "12G",
            "max_temp": "50" if not wormhole else "N/A",
            "enabled_mask": "0xff" if not wormhole else "N/A",
            "channels": [
                {
                    "channel": i,
                    "harvested": False,
                    "enabled": True,
                    "training": "pass",
                    "bist": "pass" if not wormhole else "n/a",
                    "temp_top": "N/A",
                    "temp_bottom": "N/A",
                    "corr_rd": "N/A",
                    "corr_wr": "N/A",
                    "uncorr_rd": "N/A",
                    "uncorr_wr": "N/A",
                }
                for i in range(6 if wormhole else 8)
            ],
        },
        "firmwares": {
            "fw_bundle_version": _ver(fw),
            "tt_flash_version": _ver(values["TT_FLASH_VERSION"]),
            "cm_fw": _ver(values["ARC0_FW_VERSION" if wormhole else "CM_FW_VERSION"]),
            "cm_fw_date": "2025-01-12" if wormhole else "2020-00-64",
            "eth_fw": "7.0.0" if wormhole else "1.4.0",
            "dm_bl_fw": _ver(values["DM_BL_FW_VERSION"]),
            "dm_app_fw": _ver(values["DM_APP_FW_VERSION"]),
            "gddr_fw": "N/A" if wormhole else "2.15",
        },
        "limits": chip_limits(values, wormhole),
    }


def chip_limits(values: dict, wormhole: bool) -> dict:
    """tt-smi's ``get_wh_chip_limits`` / ``get_bh_chip_limits`` (``backend.py``) of the raw
    telemetry: a field whose tag is absent (or 0) is the number 0, the others formatted text."""

    def tag(name: str) -> int:
        return values.get(name) or 0

    vdd = tag("VDD_LIMITS")
    if wormhole:
        tdp, tdc, aiclk, thm = (
            tag("TDP") >> 16,
            tag("TDC") >> 16,
            tag("AICLK") >> 16,
            tag("THM_LIMITS"),
        )
        fields = [
            ("tdp_limit", tag("TDP"), f"{tdp:3.0f}"),
            ("tdc_limit", tag("TDC"), f"{tdc:3.0f}"),
            ("asic_fmax", tag("AICLK"), f"{aiclk:4.0f}"),
            ("therm_trip_l1_limit", thm, f"{thm >> 16:2.0f}"),
            ("thm_limit", thm, f"{thm & 0xFFFF:2.0f}"),
        ]
    else:
        shutdown = tag("THM_LIMIT_SHUTDOWN")
        fields = [
            ("tdp_limit", tag("TDP_LIMIT_MAX"), f"{tag('TDP_LIMIT_MAX'):3.0f}"),
            ("tdc_limit", tag("TDC_LIMIT_MAX"), f"{tag('TDC_LIMIT_MAX'):3.0f}"),
            ("asic_fmax", tag("AICLK_LIMIT_MAX"), f"{tag('AICLK_LIMIT_MAX'):4.0f}"),
            ("therm_trip_l1_limit", tag("THM_LIMIT_THROTTLE"), f"{tag('THM_LIMIT_THROTTLE'):2.0f}"),
            ("thm_limit", shutdown, f"{shutdown:2.0f}"),
        ]
    board = tag("BOARD_POWER_LIMIT")
    known = {
        "vdd_min": (vdd, f"{(vdd & 0xFFFF) / 1000:4.2f}"),
        "vdd_max": (vdd, f"{(vdd >> 16) / 1000:4.2f}"),
        **{name: (raw, text) for name, raw, text in fields},
        "board_power_limit": (board, f"{board:3.0f}"),
    }
    order = [
        "vdd_min", "vdd_max", "tdp_limit", "tdc_limit", "asic_fmax", "therm_trip_l1_limit",
        "thm_limit", "bus_peak_limit", "fan_rpm_limit", "board_power_limit",
    ]  # fmt: skip
    return {f: (known[f][1] if f in known and known[f][0] else 0) for f in order}


def host_info(driver: str) -> dict:
    distro = "Linux"
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    distro = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f"{pages / 1024**3:.2f} GB"
    except (ValueError, OSError):
        memory = "N/A"
    uname = platform.uname()
    return {
        "OS": uname.system,
        "Distro": distro,
        "Kernel": uname.release,
        "Hostname": socket.gethostname(),
        "Platform": uname.machine,
        "Python": platform.python_version(),
        "Memory": memory,
        "Driver": f"TT-KMD {driver}",
    }


def processes(host: Host, state: dict) -> list[dict]:
    out = []
    # Every /proc/driver/tenstorrent/<N>: procfs is not filtered by TT_VISIBLE_DEVICES.
    for chip in host.sim.chips():
        asic = core.asic_hex(chip["unique_id"])
        dev = host.sim.dev_of(state, asic)
        if not chip.get("bdf") or dev is None:
            continue
        for pid in host.sim.holders(state, asic):
            try:
                user = pwd.getpwuid(os.stat(f"/proc/{pid}").st_uid).pw_name
            except (OSError, KeyError):
                user = "?"
            out.append({"pid": pid, "user": user, "device": dev, "cmdline": _cmdline(pid)})
    return sorted(out, key=lambda p: (p["device"], p["pid"]))


def _cmdline(pid: int) -> str:
    """/proc/<pid>/cmdline with NUL and LF as spaces, non-printables as \\xNN, stripped."""
    for name in ("cmdline", "comm"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                raw = f.read().replace(b"\0", b" ").replace(b"\n", b" ")
        except OSError:
            continue
        text = raw.decode(errors="replace")
        text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text).strip()
        if text:
            return text
    return "?"


def snapshot(host: Host, state: dict, chips: list[dict], driver: str) -> str:
    doc = {
        "time": datetime.datetime.now().isoformat(),
        "host_info": host_info(driver),
        "host_sw_vers": dict(SW_VERSIONS),
        "device_info": [device_entry(host, state, c) for c in chips],
        "processes": processes(host, state),
    }
    return json.dumps(doc, indent=4)


def board_rows(host: Host, state: dict, chips: list[dict]) -> list[tuple[list[str], bool]]:
    """Each chip's row of ``-ls`` (UMD id order), and whether it is in the second table.

    tt-smi's ``print_all_available_devices_umd`` (``backend.py``): UMD Chip ID, PCI BDF (N/A
    for a remote chip), PCI Dev ID as ``/dev/tenstorrent/<n>`` (a remote chip's is
    ``/dev/tenstorrent/N/A``: ``get_pci_device_id`` gives "N/A" and the f-string keeps it),
    Board Type the chip's family (``get_device_name``), Device Series the board type with
    Wormhole's L/R, Board Number the board id. "Boards that can be reset" are the chips that
    are not remote, whose board is not a ``wh_4u``."""
    by_asic = {asic: (bdf, dev) for bdf, dev, asic in host.pci_devices(state)}
    rows = []
    for umd_id, chip in enumerate(chips):
        bdf, dev = by_asic.get(core.asic_hex(chip["unique_id"]), ("N/A", "N/A"))
        series = SMI_BOARD_TYPE.get((chip["board_id"] >> 36) & 0xFFFFF, "N/A")
        wormhole = chip["arch"] == "wormhole_b0"
        remote = not chip.get("bdf")
        row = [
            str(umd_id),
            bdf,
            f"/dev/tenstorrent/{dev}",
            "Wormhole" if wormhole else "Blackhole",
            series + ((" R" if remote else " L") if wormhole else ""),
            format(chip["board_id"], "016x"),
        ]
        rows.append((row, not remote and series != "wh_4u"))
    return rows


LIST_HEADER = [
    "UMD Chip ID",
    "PCI BDF",
    "PCI Dev ID",
    "Board Type",
    "Device Series",
    "Board Number",
]


def list_boards(host: Host, state: dict, chips: list[dict]) -> str:
    """Both tables of ``tt-smi -ls`` as rich prints them on this console (smitable)."""
    rows = board_rows(host, state, chips)
    width = smitable.console_width()
    ascii_only = not (getattr(sys.stdout, "encoding", None) or "utf-8").lower().startswith("utf")
    return smitable.render(
        "All available boards on host (UMD):", LIST_HEADER, [r for r, _ in rows], width, ascii_only
    ) + smitable.render(
        "Boards that can be reset (UMD):", LIST_HEADER, [r for r, ok in rows if ok], width,
        ascii_only,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    host = Host()
    driver = host.driver_version()
    if driver is None:
        say(RED, NO_DRIVER)
        return 1
    if args.reset is not None:
        return do_reset(host, args)
    if args.glx_reset or args.glx_reset_auto:
        if args.glx_reset_auto:
            say(
                YELLOW,
                "This option will auto retry resetting galaxy 6u trays up to 3 times if it fails.",
            )
            say(YELLOW, "Trying reset (1/3)...")
            args.no_reinit = False
        return do_glx_reset(host, args)
    state = host.sim.read_state()
    chips = host.umd_chips(state)
    if not chips:
        say(RED, NO_DEVICES)
        return 1
    if args.list:
        sys.stdout.write(list_boards(host, state, chips))
        return 0
    if args.glx_list_tray_to_device:
        for umd_id, chip in enumerate(chips):
            print(f"Device {umd_id}: tray {(chip.get('asic_location') or 0) // 8 + 1}")
        return 0
    if args.snapshot or args.filename == "-":
        print(snapshot(host, state, chips, driver))
        return 0
    if args.filename is not False:
        if args.filename in (None, ""):
            directory = os.path.expanduser("~/tt_smi_logs/")
            os.makedirs(directory, exist_ok=True)
            path = (
                directory
                + datetime.datetime.now().strftime("%m-%d-%Y_%H:%M:%S")
                + ("_results.json")
            )
        else:
            path = args.filename
            os.makedirs(os.path.dirname(os.path.realpath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(snapshot(host, state, chips, driver))
        say(PURPLE, f"Saved tt-smi log to: {path}")
        return 0
    if not sys.stdin.isatty():
        print(
            f"{RED}No TTY detected! Interactive shell required.\nUse tt-smi -s for snapshot "
            f"output.{ENDC}"
        )
        return 1
    print("tt-smi stand-in: the interactive view is not simulated; use tt-smi -s or tt-smi -ls")
    return 1


if __name__ == "__main__":
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # `tt-smi -s | head`: the reader left; end quietly as tt-smi does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    except core.SimError as exc:  # a corrupted root: one line naming the file and the fix
        sys.stderr.write(f"tt-smi: {exc}\n")
        code = 1
    except OSError as exc:
        sys.stderr.write(f"tt-smi: {exc.filename or ''}: {exc.strerror}\n")
        code = 1
    sys.exit(code)
