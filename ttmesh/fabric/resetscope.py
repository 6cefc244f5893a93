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

from ttmesh import numeric, procs
from ttmesh.dataclass import dataclass
from ttmesh.host.base import Host
from ttmesh.host.umdnotice import Notice

_BDF = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_DEV = "/dev/tenstorrent/"
MAX_CHIPS = numeric.MAX_CHIPS


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
    devs: dict[str, int] = {}
    for dev in host.dev_indexes():
        bdf = host.bdf_of(dev)
        if bdf is not None:
            devs[bdf] = dev
    order = {b: i for i, b in enumerate(sorted(devs))}
    return [Target(b, devs.get(b), order.get(b)) for b in dict.fromkeys(bdfs)]


@dataclass(frozen=True)
class Verdict:
    """What a notice means for the job: stop it (``heed``), and the words for either."""

    heed: bool
    why: str


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
        if arg in ("-r", "--reset"):
            values = args[i + 1 :]
            values = values[: next((j for j, a in enumerate(values) if a.startswith("-")), None)]
            break
        if arg.startswith("--reset="):
            values = [arg.split("=", 1)[1]]
            break
    else:
        return None  # tt-smi without -r: not the reset that sent this (-glx_reset: every tray)
    items = [p.strip() for v in values for p in v.split(",") if p.strip()]
    return [] if not items or items == ["all"] else items


def _named(target: str, chip: Target) -> bool:
    """Does the reset target ``target`` (a word of the sender's command line) name ``chip``?
    Numbers are plain ASCII digits (:func:`ttmesh.numeric.digits`): ``²`` or ``٣`` is a word
    nobody can say tt-smi's reading of, so it may name any chip."""
    if _BDF.fullmatch(target):
        return chip.bdf == target  # tt-smi matches the address exactly, as written
    node = numeric.digits(target[len(_DEV) :], MAX_CHIPS) if target.startswith(_DEV) else None
    if node is not None:
        return chip.dev_index == node
    logical = numeric.digits(target, MAX_CHIPS)
    if logical is not None:
        return chip.pci_index == logical  # tt-umd's logical id: the PCI-sorted position
    return True  # a word tt-smi would refuse, or read its own way: assume ours


def chips_concerned(notice: Notice, chips: list[Target]) -> list[Target] | None:
    """The job's chips the notice's reset names; None when the reset's scope is unknown."""
    targets = reset_targets(notice.command)
    if targets is None:
        return None
    if not targets:
        return list(chips)
    return [c for c in chips if any(_named(t, c) for t in targets)]


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
    named = chips_concerned(notice, chips)
    if named is None:
        return Verdict(True, f"a reset of this host's chips by {who}")
    if not named:
        return Verdict(False, f"a reset of other chips than the job's: {who}")
    shown = ", ".join(c.label for c in named[:4]) + (" ..." if len(named) > 4 else "")
    return Verdict(True, f"{shown} reset by {who}")
