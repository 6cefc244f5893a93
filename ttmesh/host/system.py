"""The host as tt-umd needs it: firmware and driver versions, 1 GiB hugepages, NUMA, IOMMU.

Read from the driver's and the kernel's own files through the host's one reader
(:meth:`ttmesh.host.base.Host.read_text`: bounded, regular files only, inside the root), so a
simulated root is read exactly as ``/`` is. Every value is checked against the format its
source writes; anything else is :meth:`Host.corrupt` (one line naming the file). The formats
and their sources (docs/simulator.md, "System files"):

* tt-kmd's telemetry attributes (``docs/sysfs-attributes.md``; ``tt_sysfs_show_u32_ver`` in
  ``telemetry.c``): ``tt_fw_bundle_ver``, ``tt_arc_fw_ver``, ``tt_m3app_fw_ver`` are
  ``A.B.C.D\\n``; ``tt_eth_fw_ver`` is ``A.B.C\\n``. An attribute the firmware does not report
  is absent. The driver's version is the module's ``sys/module/tenstorrent/version``
  (``MODULE_VERSION``: ``2.10.1`` or ``2.10.1-pre``).
* the kernel's hugetlb pages (``Documentation/admin-guide/mm/hugetlbpage.rst``):
  ``sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages`` (and ``free_hugepages``), per
  NUMA node under ``sys/devices/system/node/nodeN/hugepages/hugepages-1048576kB/``; and
  ``proc/meminfo``, whose ``HugePages_*`` lines count the default size only (``Hugepagesize``).
* the PCI device's ``numa_node`` (``Documentation/ABI/testing/sysfs-bus-pci``: ``-1`` when the
  machine has no NUMA) and ``iommu_group`` (a link to ``sys/kernel/iommu_groups/N``, whose
  ``type`` is ``identity``, ``DMA``, ``DMA-FQ``, ``blocked`` or ``unmanaged``:
  ``Documentation/ABI/testing/sysfs-kernel-iommu_groups``). tt-umd treats a device as behind
  an IOMMU when that type starts with ``DMA`` (``detect_iommu`` in ``pci_device.cpp``), and then
  maps host memory through it with no hugepages (``SiliconSysmemManager::init_iommu``).
"""

from __future__ import annotations

import re
from typing import Any

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.host.base import CLASS_DIR, DRIVER_VERSION, Host

PAGE_DIR = "hugepages-1048576kB"  # 1 GiB pages, as tt-umd opens them (hugepage.cpp)
GLOBAL_PAGES = f"sys/kernel/mm/hugepages/{PAGE_DIR}"
NODE_DIR = "sys/devices/system/node"
MEMINFO = "proc/meminfo"
FW_ATTRS = ("tt_fw_bundle_ver", "tt_arc_fw_ver", "tt_eth_fw_ver")
IOMMU_TYPES = ("identity", "DMA", "DMA-FQ", "blocked", "unmanaged")

_VERSION = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9}){2,3}")
_KMD = re.compile(
    r"([0-9]{1,9})\.([0-9]{1,9})\.([0-9]{1,9})(?:\.[0-9]{1,9})?(?:-[0-9A-Za-z.]{1,32})?"
)
_COUNT = re.compile(r"[0-9]{1,12}")
_MEMINFO_LINE = re.compile(r"([A-Za-z0-9_()]+):\s+([0-9]{1,20})(?: kB)?")


def version_tuple(text: str) -> tuple[int, ...]:
    """``19.10.0.0`` -> (19, 10, 0, 0); a driver's ``2.10.1-pre`` -> (2, 10, 1)."""
    return tuple(int(x) for x in re.split(r"[.-]", text) if numeric.digits(x))


@dataclass
class DeviceFacts:
    """One PCI device's firmware, NUMA node and IOMMU mode."""

    dev: int
    bdf: str | None
    firmware: dict[str, str]  # attribute -> version, the ones the firmware reports
    numa_node: int | None  # None: the file is absent; -1: no NUMA
    iommu: str | None  # the IOMMU group's type; None: the device is in no group

    @property
    def translated(self) -> bool:
        """tt-umd maps host memory through the IOMMU (no hugepages needed)."""
        return (self.iommu or "").startswith("DMA")

    def to_json(self) -> dict[str, Any]:
        return {
            "dev_index": self.dev,
            "bdf": self.bdf,
            "firmware": {
                k.removeprefix("tt_").removesuffix("_ver"): v for k, v in self.firmware.items()
            },
            "numa_node": self.numa_node,
            "iommu": self.iommu,
        }


@dataclass
class HugePages:
    """1 GiB hugepages the kernel has set aside: in all, and per NUMA node."""

    total: int | None  # None: the kernel offers no 1 GiB pages (or says nothing of them)
    free: int | None
    nodes: dict[int, int] = field(default_factory=dict)  # node -> nr_hugepages
    source: str = ""
    known: bool = True  # False: the root has no kernel hugepage files at all (not a kernel's)

    def on_node(self, node: int | None) -> int | None:
        """Pages a device on ``node`` can use: its node's, or all of them without NUMA."""
        if node is not None and node >= 0 and node in self.nodes:
            return self.nodes[node]
        if not self.nodes or node is None or node < 0:
            return self.total
        return 0  # a node the kernel lists no pages for

    def to_json(self) -> dict[str, Any]:
        return {
            "page_kb": 1048576,
            "total": self.total,
            "free": self.free,
            "nodes": {str(n): c for n, c in sorted(self.nodes.items())},
            "source": self.source or None,
        }


def _value(host: Host, rel: str, pattern: re.Pattern[str], what: str) -> str | None:
    text = host.read_text(rel)
    if text is None:
        return None
    value = text.strip()
    if not pattern.fullmatch(value):
        raise host.corrupt(str(host.path(rel)), f"is not {what} (it holds {value[:40]!r})")
    return value


def driver_version(host: Host) -> str | None:
    """The tenstorrent module's version (None: not loaded)."""
    return _value(host, DRIVER_VERSION, _KMD, "a driver version such as 2.10.1")


def device(host: Host, dev: int, bdf: str | None) -> DeviceFacts:
    """What tt-kmd and the kernel say of /dev/tenstorrent/<dev>."""
    firmware = {}
    for name in FW_ATTRS:
        value = _value(
            host, f"{CLASS_DIR}/tenstorrent!{dev}/{name}", _VERSION, "a firmware version"
        )
        if value is not None:
            firmware[name] = value
    numa = iommu = None
    if bdf:
        pci = f"sys/bus/pci/devices/{bdf}"
        node = _value(host, f"{pci}/numa_node", re.compile(r"-1|[0-9]{1,4}"), "a NUMA node number")
        numa = None if node is None else int(node)
        iommu = _value(
            host,
            f"{pci}/iommu_group/type",
            re.compile("|".join(IOMMU_TYPES)),
            "an IOMMU group type",
        )
    return DeviceFacts(dev, bdf, firmware, numa, iommu)


def _count(host: Host, rel: str) -> int | None:
    value = _value(host, rel, _COUNT, "a count of pages")
    return None if value is None else int(value)


def node_ids(host: Host) -> list[int]:
    """The NUMA nodes the kernel lists (``nodeN`` under sys/devices/system/node)."""
    import os

    try:
        names = os.listdir(host.path(NODE_DIR))
    except OSError:
        return []
    return sorted(int(n[4:]) for n in names if re.fullmatch(r"node[0-9]{1,4}", n))


def hugepages(host: Host) -> HugePages:
    """1 GiB hugepages: per size in sysfs, per node; else ``/proc/meminfo`` when 1 GiB is the
    default size (``default_hugepagesz=1G``)."""
    total = _count(host, f"{GLOBAL_PAGES}/nr_hugepages")
    nodes = {}
    for n in node_ids(host):
        count = _count(host, f"{NODE_DIR}/node{n}/hugepages/{PAGE_DIR}/nr_hugepages")
        if count is not None:
            nodes[n] = count
    if total is not None:
        free = _count(host, f"{GLOBAL_PAGES}/free_hugepages")
        return HugePages(total, free, nodes, str(host.path(GLOBAL_PAGES)))
    info = meminfo(host)
    if info.get("Hugepagesize") == 1048576 and "HugePages_Total" in info:
        return HugePages(
            info["HugePages_Total"], info.get("HugePages_Free"), nodes, str(host.path(MEMINFO))
        )
    import os

    known = os.path.isdir(host.path("sys/kernel/mm/hugepages")) or bool(info)
    return HugePages(None, None, nodes, "", known)


def meminfo(host: Host) -> dict[str, int]:
    """``/proc/meminfo`` as numbers (kB where the kernel says kB); a line that is not
    ``Name:  value [kB]`` makes the file corrupt."""
    text = host.read_text(MEMINFO)
    if text is None:
        return {}
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _MEMINFO_LINE.fullmatch(line.strip())
        if not match:
            shown = line[:40].encode("unicode_escape").decode()
            raise host.corrupt(
                str(host.path(MEMINFO)), f"has a line that is not meminfo's ({shown!r})"
            )
        out[match.group(1)] = int(match.group(2))
    return out
