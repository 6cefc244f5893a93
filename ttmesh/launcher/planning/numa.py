"""torchrun's ``--numa-binding node`` on a ttmesh host: each rank runs on the CPUs of the NUMA
node of its chip's PCI device, as torch binds a worker to its GPU's node.

The node is the kernel's ``numa_node`` of the chip's PCI device and its CPUs the node's
``cpulist``, both read under the root the host reader uses (a simulated root provides them),
while the launch is planned: the plan's argv of each rank holds ``taskset -c CPUS``, so a dry
run shows the binding a launch makes.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable

from ttmesh.errors import bad_input
from ttmesh.host.base import Host
from ttmesh.render import note, noun

_CPULIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")


def prefixes(
    host: Host, ranks: Iterable[tuple[int, tuple[str, ...]]]
) -> dict[int, tuple[str, ...]]:
    """Each rank's command prefix (rank -> ``taskset -c CPUS``) from its chips' PCI addresses
    (``ranks``: (rank, bdfs)); a rank without chips (a chipless server) has none, and one whose
    chips have no NUMA node is said, unbound."""
    taskset = shutil.which("taskset")
    if taskset is None:
        raise bad_input(
            "--numa-binding node: taskset is not on PATH", "install util-linux, or drop the flag"
        )
    out: dict[int, tuple[str, ...]] = {}
    unbound: list[int] = []
    for rank, bdfs in ranks:
        if not bdfs:
            continue  # a chipless server has no chip to be near
        nodes = sorted({_node(host, bdf) for bdf in bdfs} - {-1})
        if not nodes:
            unbound.append(rank)
            continue
        out[rank] = (taskset, "-c", ",".join(_cpus(host, n) for n in nodes))
    if unbound:
        note(
            f"note: --numa-binding node: the chips of {noun(len(unbound), 'rank')} "
            f"{', '.join(map(str, unbound))} have no NUMA node (numa_node -1): not bound"
        )
    return out


def _node(host: Host, bdf: str) -> int:
    text = host.pci_attr(bdf, "numa_node")
    where = host.path(f"sys/bus/pci/devices/{bdf}/numa_node")
    if text is None:
        raise bad_input(f"--numa-binding node: {where} does not exist", host.repair_hint())
    try:
        return int(text)
    except ValueError:
        raise bad_input(f"--numa-binding node: {where} holds {text[:40]!r}, not a node number",
                        host.repair_hint()) from None  # fmt: skip


def _cpus(host: Host, node: int) -> str:
    rel = f"sys/devices/system/node/node{node}/cpulist"
    text = host.read_text(rel)
    value = (text or "").strip()
    if not _CPULIST.fullmatch(value):
        what = "does not exist" if text is None else "holds no CPU list"
        raise bad_input(f"--numa-binding node: {host.path(rel)} {what}", host.repair_hint())
    return value
