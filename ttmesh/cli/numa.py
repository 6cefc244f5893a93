"""torchrun's ``--numa-binding node`` on a ttmesh host: each rank runs on the CPUs of the NUMA
node of its chip's PCI device, as torch binds a worker to its GPU's node.

The node is the kernel's ``numa_node`` of the chip's PCI device and its CPUs the node's
``cpulist``, both read under the root the host reader uses (a simulated root provides them), so
a dry run shows the binding a launch makes: the rank's command runs under ``taskset -c CPUS``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from typing import Any

from ttmesh.errors import bad_input
from ttmesh.render import note, noun

_CPULIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")


def bind(plan: Any, host: Any) -> None:
    """Prefix every rank's command with ``taskset -c`` its chips' NUMA node CPUs (in place)."""
    if len(getattr(plan, "hosts", None) or []) > 1:
        raise bad_input(
            "--numa-binding with a job planned over several hosts",
            "drop it, or run one ttmesh per host (--nnodes)",
        )
    taskset = shutil.which("taskset")
    if taskset is None:
        raise bad_input(
            "--numa-binding node: taskset is not on PATH", "install util-linux, or drop the flag"
        )
    unbound: list[int] = []
    for i, rank in enumerate(plan.ranks):
        if not rank.bdfs or rank.argv[:1] == (taskset,):
            continue  # a chipless server has no chip to be near; bound already
        nodes = sorted({_node(host, bdf) for bdf in rank.bdfs} - {-1})
        if not nodes:
            unbound.append(rank.rank)
            continue
        cpus = ",".join(_cpus(host, n) for n in nodes)
        plan.ranks[i] = dataclasses.replace(rank, argv=(taskset, "-c", cpus, *rank.argv))
    if unbound:
        note(
            f"note: --numa-binding node: the chips of {noun(len(unbound), 'rank')} "
            f"{', '.join(map(str, unbound))} have no NUMA node (numa_node -1): not bound"
        )


def _node(host: Any, bdf: str) -> int:
    text = host.pci_attr(bdf, "numa_node")
    where = host.path(f"sys/bus/pci/devices/{bdf}/numa_node")
    if text is None:
        raise bad_input(f"--numa-binding node: {where} does not exist", host.repair_hint())
    try:
        return int(text)
    except ValueError:
        raise bad_input(f"--numa-binding node: {where} holds {text[:40]!r}, not a node number",
                        host.repair_hint()) from None  # fmt: skip


def _cpus(host: Any, node: int) -> str:
    rel = f"sys/devices/system/node/node{node}/cpulist"
    text = host.read_text(rel)
    value = (text or "").strip()
    if not _CPULIST.fullmatch(value):
        what = "does not exist" if text is None else "holds no CPU list"
        raise bad_input(f"--numa-binding node: {host.path(rel)} {what}", host.repair_hint())
    return value
