"""Does a reset notice concern a job's chips, and may its sender stop the job?

tt-umd's notices say only "a reset comes" (:mod:`ttmesh.host.umdnotice`), for the whole host.
Two things narrow that down, both read from the kernel, never from the sender's words:

* **Which chips.** When the sender is tt-smi, its command line names the reset's targets
  (``tt-smi -r 0000:03:00.0,0000:04:00.0``, logical ids, or ``/dev/tenstorrent/N``; none or
  ``all``: every chip), parsed as tt-smi 6.x parses them. ttmesh's own resets always name
  their chips by PCI address, so one job's recovery never stops another job. Any other sender
  (a program of its own over tt-umd) resets chips nobody can tell: the job is concerned.
* **Whether it could.** Anyone may connect to a listener's socket (tt-umd makes it 0777), so
  a notice stops a job only when its sender could reset the job's chips itself: root, the
  job's own user, or a user the driver lets open one of the job's device nodes for writing.
  Anyone else's notice is said and otherwise ignored.
"""

from __future__ import annotations

import os
import re
import stat

from ttmesh import procs
from ttmesh.dataclass import dataclass
from ttmesh.host.base import Host
from ttmesh.host.umdnotice import Notice

_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")  # tt-smi's
_DEV = "/dev/tenstorrent/"


@dataclass(frozen=True)
class Target:
    """A chip as a reset names it: its PCI address, ``/dev/tenstorrent`` number and tt-umd's
    logical id (its place among the host's PCI addresses, sorted)."""

    bdf: str
    dev_index: int | None
    pci_index: int | None

    @property
    def label(self) -> str:
        return self.bdf


def targets(host: Host, bdfs: list[str]) -> list[Target]:
    """The job's PCI devices ``bdfs`` as the driver lists them now (sysfs reads only)."""
    devs = _devices(host)
    order = {b: i for i, b in enumerate(sorted(devs))}
    return [Target(b, devs.get(b), order.get(b)) for b in dict.fromkeys(bdfs)]


def _devices(host: Host) -> dict[str, int]:
    """Every PCI device of the host: its address and /dev/tenstorrent number."""
    devs: dict[str, int] = {}
    for dev in host.dev_indexes():
        bdf = host.bdf_of(dev)
        if bdf is not None:
            devs[bdf] = dev
    return devs


@dataclass(frozen=True)
class Verdict:
    """What a notice means for the job: stop it (``heed``), and the words for either."""

    heed: bool
    why: str


# argparse takes an argument that looks like a negative number as a value (tt-smi has no
# option that looks like one): Python 3.11's ``_negative_number_matcher``.
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _is_reset_flag(arg: str) -> bool:
    """``-r``, ``--reset`` or a prefix argparse takes for it (``--res``: tt-smi has no other
    long option starting ``--r``)."""
    name = arg.split("=", 1)[0]
    return arg == "-r" or (len(name) > 2 and "--reset".startswith(name))


def reset_targets(command: tuple[str, ...]) -> list[str] | None:
    """tt-smi's reset targets in ``command`` (``[]``: every chip); None when ``command`` is
    not a tt-smi reset (unknown scope)."""
    if not command:
        return None
    tool = next((i for i, a in enumerate(command[:3]) if os.path.basename(a) == "tt-smi"), None)
    if tool is None:
        return None
    args = list(command[tool + 1 :])
    for i, arg in enumerate(args):
        if _is_reset_flag(arg):
            if "=" in arg:
                values = [arg.split("=", 1)[1]]
            else:
                values = args[i + 1 :]
                ends = (
                    j for j, a in enumerate(values) if a.startswith("-") and not _NEGATIVE.match(a)
                )
                values = values[: next(ends, None)]
            break
    else:
        return None  # tt-smi without -r: not the reset that sent this (-glx_reset: every tray)
    items = [p.strip() for v in values for p in v.split(",") if p.strip()]
    return [] if not items or (len(items) == 1 and items[0].lower() == "all") else items


_C_INT = range(-(2**31), 2**31)  # what tt-umd's binding takes as an id


def _classify(items: list[str]) -> tuple[str, list[int | str]] | None:
    """tt-smi 6.8.0's reading of its targets (``tt_smi/device_input.py``): one kind and its
    values; None when tt-smi would refuse them, or tt-umd's binding would (an id outside a C
    int): then tt-smi resets nothing and tells no one, so whoever sent the notice is not that
    tt-smi and the scope is unknown."""
    kind: str | None = None
    values: list[int | str] = []
    for item in items:
        value: int | str | None
        try:
            if item.lower() == "all":
                return None
            if item.startswith(_DEV):
                suffix = item[len(_DEV) :].strip()
                this, value = "dev", int(suffix) if suffix.isdigit() else None
            elif _BDF.match(item):
                this, value = "bdf", item
            elif item.lstrip("-").isdigit():
                this, value = "umd", int(item)
            else:
                return None
        except ValueError:  # "²" is a digit to str.isdigit, not to int()
            return None
        if value is None or (kind is not None and this != kind):
            return None
        if isinstance(value, int) and value not in _C_INT:
            return None
        kind = this
        values.append(value)
    return (kind, values) if kind is not None else None


def chips_concerned(
    notice: Notice, chips: list[Target], every: list[Target] | None = None
) -> list[Target] | None:
    """The job's chips the notice's reset names; None when the reset's scope is unknown.

    ``every``: all the host's PCI devices (default: the job's): the targets are mapped to
    devices as tt-umd 0.9.12 maps them (``device/warm_reset.cpp``): a UMD logical id is the
    device at that place in PCI order, ids past the end are skipped; PCI addresses match
    exactly; /dev numbers are taken as they are. An EMPTY result is every device ("If
    pci_device_ids is empty, enumerate all devices"): ``tt-smi -r 7`` on four chips, or an
    address no chip has, resets them all."""
    targets = reset_targets(notice.command)
    if targets is None:
        return None
    if not targets:
        return list(chips)
    parsed = _classify(targets)
    if parsed is None:
        return None
    kind, values = parsed
    devices = sorted(every if every is not None else chips, key=lambda t: t.bdf)
    ids: list[int | None]
    if kind == "umd":
        numbers = [v for v in values if isinstance(v, int)]
        if any(v < 0 for v in numbers):
            return None  # indexes before tt-umd's list (undefined in C++): any device
        ids = [devices[v].dev_index for v in numbers if v < len(devices)]
    elif kind == "bdf":
        ids = [t.dev_index for t in devices if t.bdf in values]
    else:
        ids = [v for v in values if isinstance(v, int)]
    if not ids:
        return list(chips)
    return [c for c in chips if c.dev_index is not None and c.dev_index in ids]


def could_reset(host: Host, notice: Notice, chips: list[Target], job_uid: int) -> bool:
    """Could the notice's sender reset the job's chips itself (open a device node to write)?"""
    if notice.uid in (0, job_uid):
        return True
    groups = procs.groups(notice.pid)
    for chip in chips:
        if chip.dev_index is None:
            continue
        try:
            st = os.stat(host.path(f"dev/tenstorrent/{chip.dev_index}"))
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o002:
            return True
        if st.st_uid == notice.uid and mode & 0o200:
            return True
        if st.st_gid in groups and mode & 0o020:
            return True
    return False


def judge(host: Host, notice: Notice, chips: list[Target], job_uid: int) -> Verdict:
    """What a PRE_RESET notice means for a job on ``chips``."""
    who = notice.who()
    if not could_reset(host, notice, chips, job_uid):
        return Verdict(False, f"ignored a reset notice from {who}: that user cannot reset the "
                              "job's chips")  # fmt: skip
    every = [Target(b, d, None) for b, d in _devices(host).items()]
    named = chips_concerned(notice, chips, every)
    if named is None:
        return Verdict(True, f"a reset of this host's chips by {who}")
    if not named:
        return Verdict(False, f"a reset of other chips than the job's: {who}")
    shown = ", ".join(c.label for c in named[:4]) + (" ..." if len(named) > 4 else "")
    return Verdict(True, f"{shown} reset by {who}")
