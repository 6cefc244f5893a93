"""System pre-flight: what tt-umd needs of the host besides healthy chips.

Jobs on real hosts fail minutes in for reasons that are neither links nor heartbeats: no 1 GiB
hugepages on a chip's NUMA node, firmware that differs between the chips of a job, a driver
older than tt-umd accepts. ``ttmesh check``, launch pre-flight and ``ttmesh doctor`` ask the
same questions here, of the files :mod:`ttmesh.host.system` reads, each problem with its fix.

What is asked (a profile may ask more: ``system:`` in its YAML, :func:`requirements`):

* the driver is at least tt-umd's ``KMD_MINIMUM_VERSION`` (2.0.0, ``utils/kmd_versions.hpp``),
  or the profile's ``min_kmd``: an error below;
* every chip of the job runs the same firmware bundle (``tt_fw_bundle_ver``): a warning when
  they differ; an error below the profile's ``min_fw_bundle``;
* each PCI device not behind a translating IOMMU has 1 GiB hugepages on its NUMA node: none is
  an error (tt-umd's sysmem cannot map); fewer than ``hugepages_per_chip`` for the node's chips
  (4, what tt-system-tools' ``hugepages-setup.sh`` sets up per device) a warning, an error when
  a profile names the number.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ttmesh import numeric
from ttmesh.dataclass import dataclass
from ttmesh.fabric.devices import Chip, Inventory
from ttmesh.fabric.problem import ERROR, WARNING, Problem, chip_name
from ttmesh.host import system
from ttmesh.render import plural

UMD_MIN_KMD = "2.0.0"  # tt-umd's KMD_MINIMUM_VERSION (device/api/umd/device/utils/kmd_versions.hpp)
SETUP_PAGES = 4  # tt-system-tools' hugepages-setup.sh: 4 per Wormhole or Blackhole device
KINDS = ("kmd-old", "fw-differs", "fw-old", "fw-unknown", "hugepages")  # no reset fixes them
KEYS = ("min_kmd", "min_fw_bundle", "hugepages_per_chip")

KMD_FIX = (
    "install tt-kmd {want} or later from https://github.com/tenstorrent/tt-kmd, then reload it: "
    "sudo modprobe -r tenstorrent && sudo modprobe tenstorrent"
)
FW_FIX = (
    "flash every chip with one firmware bundle of at least {want}: tt-flash --fw-tar "
    "fw_pack-VERSION.tar.gz, then ttmesh reset{flag}"
)
SAME_FW_FIX = (
    "flash every chip with the same firmware bundle: tt-flash --fw-tar fw_pack-VERSION.tar.gz, "
    "then ttmesh reset{flag}"
)
PAGES_FIX = (
    "set up {want} hugepages of 1 GiB on node {node}: echo {want} | sudo tee "
    "/sys/devices/system/node/node{node}/hugepages/hugepages-1048576kB/nr_hugepages; "
    "tt-system-tools' tenstorrent-hugepages.service does it at every boot; or boot with the "
    "IOMMU translating DMA (iommu.passthrough=0), in which tt-umd needs none"
)
PAGES_FIX_FLAT = (
    "set up {want} hugepages of 1 GiB: echo {want} | sudo tee "
    "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages; tt-system-tools' "
    "tenstorrent-hugepages.service does it at every boot; or boot with the IOMMU translating "
    "DMA (iommu.passthrough=0), in which tt-umd needs none"
)


@dataclass(frozen=True)
class Requirements:
    """What a job needs of the host's system software (a profile's ``system:``)."""

    min_kmd: str = UMD_MIN_KMD
    min_fw_bundle: str | None = None
    hugepages_per_chip: int = SETUP_PAGES
    named: tuple[str, ...] = ()  # the keys a profile set: those are errors, not warnings
    source: str = ""  # the profile that asked ("profile vllm-tt")

    def to_json(self) -> dict[str, Any]:
        return {
            "min_kmd": self.min_kmd,
            "min_fw_bundle": self.min_fw_bundle,
            "hugepages_per_chip": self.hugepages_per_chip,
            "source": self.source or "ttmesh's defaults",
        }


DEFAULT = Requirements()


def requirements(raw: Any, where: str, source: str) -> Requirements:
    """A profile's ``system:`` map (``where``: how to name it in an error): every key known,
    every version dotted numbers, the page count a count."""
    if raw is None:
        return DEFAULT
    if not isinstance(raw, dict) or set(raw) - set(KEYS):
        raise ValueError(f"system: a map of {', '.join(KEYS)}")
    out: dict[str, Any] = {}
    for key in ("min_kmd", "min_fw_bundle"):
        if key in raw:
            value = str(raw[key])
            if not system._VERSION.fullmatch(value) and not system._KMD.fullmatch(value):
                raise ValueError(f"system.{key}: {value!r} is not a version such as 2.0.0")
            out[key] = value
    if "hugepages_per_chip" in raw:
        out["hugepages_per_chip"] = numeric.whole(
            raw["hugepages_per_chip"], f"{where} system.hugepages_per_chip", low=0, high=64
        )
    return Requirements(**out, named=tuple(sorted(out)), source=source)


@dataclass
class SystemReport:
    """What was read, for ``check --json`` and ``doctor``."""

    driver: str | None
    devices: list[system.DeviceFacts]
    pages: system.HugePages
    requires: Requirements

    def to_json(self) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "devices": [d.to_json() for d in self.devices],
            "hugepages": self.pages.to_json(),
            "requires": self.requires.to_json(),
        }


def _devices(inv: Inventory, asics: Iterable[str] | None) -> list[Chip]:
    """The PCI devices of ``asics`` (a remote chip: its partner), each once, in order."""
    wanted = None if asics is None else set(asics)
    out: dict[str, Chip] = {}  # by asic id: a list's `in` compares every chip field by field
    for c in inv.chips:
        if wanted is not None and c.asic_id not in wanted:
            continue
        lead = inv.lead(c)
        if lead is not None and lead.dev_index is not None:
            out.setdefault(lead.asic_id, lead)
    return list(out.values())


def read(inv: Inventory, asics: Iterable[str] | None, requires: Requirements) -> SystemReport:
    host = inv.host
    leads = _devices(inv, asics)
    facts = [system.device(host, c.dev_index, c.bdf) for c in leads if c.dev_index is not None]
    return SystemReport(system.driver_version(host), facts, system.hugepages(host), requires)


def _level(requires: Requirements, key: str) -> str:
    return ERROR if key in requires.named else WARNING


def problems(
    inv: Inventory, asics: Iterable[str] | None, requires: Requirements = DEFAULT
) -> tuple[list[Problem], list[str], SystemReport]:
    """(problems, notes, what was read) of the system software for the chips ``asics`` (None:
    every chip of the host)."""
    report = read(inv, asics, requires)
    flag = f" {inv.host.flag}" if inv.host.flag else ""
    found: list[Problem] = []
    notes: list[str] = []
    if not report.devices:
        return found, notes, report
    by_dev = {c.dev_index: c for c in inv.chips if c.dev_index is not None}

    def name(f: system.DeviceFacts) -> str:
        chip = by_dev.get(f.dev)
        return chip_name(inv, chip.asic_id) if chip else f"/dev/tenstorrent/{f.dev}"

    every = tuple(by_dev[f.dev].asic_id for f in report.devices if f.dev in by_dev)
    kmd = report.driver
    if kmd is not None and system.version_tuple(kmd) < system.version_tuple(requires.min_kmd):
        who = requires.source or "tt-umd"
        found.append(
            Problem(
                ERROR,
                f"the tenstorrent driver is {kmd}, older than the {requires.min_kmd} {who} needs",
                KMD_FIX.format(want=requires.min_kmd),
                "kmd-old",
                every,
            )
        )
    bundles = {f.dev: f.firmware.get("tt_fw_bundle_ver") for f in report.devices}
    known = {d: v for d, v in bundles.items() if v is not None}
    if len(set(known.values())) > 1:
        groups: dict[str, list[str]] = {}
        for f in report.devices:
            if f.dev in known:
                groups.setdefault(known[f.dev], []).append(name(f))
        said = "; ".join(
            f"{v} on {', '.join(names)}"
            for v, names in sorted(groups.items(), key=lambda kv: system.version_tuple(kv[0]))
        )
        found.append(
            Problem(
                WARNING,
                f"the chips run different firmware bundles ({said})",
                SAME_FW_FIX.format(flag=flag),
                "fw-differs",
                every,
            )
        )
    if requires.min_fw_bundle is not None:
        want = system.version_tuple(requires.min_fw_bundle)
        old = [
            f
            for f in report.devices
            if f.dev in known and system.version_tuple(known[f.dev]) < want
        ]
        if old:
            listed = ", ".join(f"{name(f)} ({known[f.dev]})" for f in old)
            found.append(
                Problem(
                    ERROR,
                    f"firmware bundle older than the {requires.min_fw_bundle} "
                    f"{requires.source or 'required'} needs: {listed}",
                    FW_FIX.format(want=requires.min_fw_bundle, flag=flag),
                    "fw-old",
                    tuple(by_dev[f.dev].asic_id for f in old if f.dev in by_dev),
                )
            )
        unknown = [f for f in report.devices if f.dev not in known]
        if unknown:
            found.append(
                Problem(
                    WARNING,
                    f"{', '.join(name(f) for f in unknown)}: the firmware reports no bundle "
                    f"version (tt_fw_bundle_ver), so {requires.min_fw_bundle} cannot be checked",
                    FW_FIX.format(want=requires.min_fw_bundle, flag=flag),
                    "fw-unknown",
                )
            )
    found.extend(_page_problems(report, requires, name, by_dev, notes))
    return found, notes, report


def _page_problems(
    report: SystemReport,
    requires: Requirements,
    name: Any,
    by_dev: dict[int, Chip],
    notes: list[str],
) -> list[Problem]:
    translated = [f for f in report.devices if f.translated]
    if translated:
        types = ", ".join(sorted({f.iommu or "" for f in translated}))
        notes.append(
            f"{plural(len(translated), 'chip')} ({', '.join(name(f) for f in translated)}) "
            f"behind an IOMMU in DMA translation mode ({types}): tt-umd maps their host memory "
            "through it and needs no hugepages for them"
        )
    if not report.pages.known:
        notes.append(
            "hugepages not checked: the host has no kernel hugepage files "
            "(sys/kernel/mm/hugepages, proc/meminfo)"
        )
        return []
    need: dict[int, list[system.DeviceFacts]] = {}
    for f in report.devices:
        if not f.translated:
            node = f.numa_node if f.numa_node is not None and f.numa_node >= 0 else -1
            if node >= 0 and node not in report.pages.nodes:
                node = -1 if not report.pages.nodes else node
            need.setdefault(node, []).append(f)
    out = []
    for node, devs in sorted(need.items()):
        have = report.pages.on_node(None if node < 0 else node)
        want = requires.hugepages_per_chip * len(devs)
        where = "" if node < 0 else f" on NUMA node {node}"
        fix = (PAGES_FIX_FLAT if node < 0 else PAGES_FIX).format(want=max(want, 1), node=node)
        chips = tuple(by_dev[f.dev].asic_id for f in devs if f.dev in by_dev)
        names = ", ".join(name(f) for f in devs)
        if not have:
            out.append(
                Problem(
                    ERROR,
                    f"no 1 GiB hugepages{where} for {names}, and no IOMMU translates for them "
                    f"(iommu_group type {devs[0].iommu or 'none'}): tt-umd cannot map the chips' "
                    "host memory",
                    fix,
                    "hugepages",
                    chips,
                )
            )
        elif have < want:
            out.append(
                Problem(
                    _level(requires, "hugepages_per_chip"),
                    f"{plural(have, '1 GiB hugepage')}{where} for {plural(len(devs), 'chip')} "
                    f"({names}): {requires.hugepages_per_chip} per chip "
                    f"({requires.source or 'hugepages-setup.sh sets up 4 per device'}) is {want}",
                    fix,
                    "hugepages",
                    chips,
                )
            )
    return out
