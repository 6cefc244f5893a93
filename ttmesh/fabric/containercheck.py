"""``ttmesh check`` in a container: the usual mistakes of running beside chips in Docker or
Kubernetes, each named with its fix (docs/containers.md).

* the chips' device nodes: a reset re-creates ``/dev/tenstorrent/N`` on the host, and a
  container started with ``--device`` sees only the nodes it started with (the node problem,
  :func:`node_fix`, names the container's fix instead of reloading the driver);
* a node this user cannot open (run as root or in the node's group);
* ``/sys/bus/pci/devices/BDF`` hidden (tt-umd reads the device's PCI attributes there);
* ``/dev/shm``: private (tt-umd's chip locks and ttmesh's job records are then not shared with
  the host or other containers, so two of them can open one chip) or small (Docker's default
  64 MiB: Open MPI maps a 16 MiB segment per process, SGLang more);
* tt-umd's reset-notice directory and ``/dev/hugepages-1G`` not shared (notes: they matter only
  for resets made outside the container, and without an IOMMU that translates).
"""

from __future__ import annotations

import os

from ttmesh import numeric
from ttmesh.fabric.devices import Chip, Inventory
from ttmesh.fabric.problem import WARNING, Problem, chip_name
from ttmesh.fileread import GiB, MiB, size_text
from ttmesh.host import container
from ttmesh.host.container import Container

MIN_SHM = 1 * GiB  # Open MPI: 16 MiB per process (btl/sm); SGLang's examples: --shm-size 32g
SHM_FIX = (
    "start the container with --ipc=host (or -v /dev/shm:/dev/shm) so /dev/shm is the host's; "
    "Kubernetes: hostIPC: true, or a hostPath volume of /dev/shm mounted at /dev/shm"
)
SMALL_FIX = (
    "start the container with --shm-size 16g (or --ipc=host); Kubernetes: an emptyDir with "
    "medium: Memory and sizeLimit: 16Gi mounted at /dev/shm"
)


def detect(inv: Inventory) -> Container | None:
    return container.detect(inv.host)


def node_fix(inv: Inventory, chip: Chip | None, box: Container) -> str:
    """The fix for a chip whose /dev/tenstorrent node is missing inside a container."""
    dev = None
    if chip is not None and chip.dev_index is not None:
        dev = inv.host.attr(chip.dev_index, "dev")  # "MAJOR:MINOR" (the class device's)
    major = dev.split(":", 1)[0] if dev and numeric.digits(dev.split(":", 1)[0]) else "MAJOR"
    return (
        "the host's driver made this node after the container started (a reset re-creates "
        "them) and a container sees only the nodes it started with: restart the container, "
        "or start it with -v /dev/tenstorrent:/dev/tenstorrent --device-cgroup-rule "
        f"'c {major}:* rwm' so the nodes a reset makes appear in it"
    )


def problems(inv: Inventory, selected: set[str] | None) -> tuple[list[Problem], list[str]]:
    """(problems, notes) of running in a container; nothing outside one."""
    box = detect(inv)
    if box is None:
        return [], []
    host = inv.host
    notes = [
        f"running in a container ({'; '.join(box.signs)}): docs/containers.md says what "
        "ttmesh needs in one"
    ]
    found: list[Problem] = []
    chips = [c for c in inv.chips if c.bdf and (selected is None or c.asic_id in selected)]
    for c in chips:
        node = host.dev_node(c.dev_index) if c.dev_index is not None else None
        if node is not None and node.exists() and not os.access(node, os.R_OK | os.W_OK):
            st = node.stat()
            found.append(
                Problem(
                    WARNING,
                    f"{chip_name(inv, c.asic_id)}: {node} cannot be opened by uid {os.geteuid()}",
                    f"run as root, or in the node's group (docker run --group-add {st.st_gid})",
                    "container-node-access",
                    (c.asic_id,),
                )
            )
        if c.bdf and not os.path.isdir(host.path(f"sys/bus/pci/devices/{c.bdf}")):
            found.append(
                Problem(
                    WARNING,
                    f"{chip_name(inv, c.asic_id)}: /sys/bus/pci/devices/{c.bdf} is not visible "
                    "in the container (tt-umd reads the device's PCI attributes there)",
                    "start the container with -v /sys:/sys (or without a masked /sys)",
                    "container-sysfs",
                    (c.asic_id,),
                )
            )
    shm = box.mount("/dev/shm")
    if shm is not None and shm.source == "shm":
        found.append(
            Problem(
                WARNING,
                "/dev/shm is the container's own (Docker's private tmpfs): tt-umd's chip locks "
                "(TT_UMD_LOCK.*) and ttmesh's job records there are not seen by the host or "
                "other containers, so a process there can open a chip a job here uses",
                SHM_FIX,
                "container-shm-private",
            )
        )
    size = container.shm_size(host, shm)
    if size is not None and size < MIN_SHM:
        found.append(
            Problem(
                WARNING,
                f"/dev/shm holds {size_text(size)}"
                + (" (Docker's default --shm-size)" if size == 64 * MiB else "")
                + ": Open MPI maps "
                f"a {16 * MiB // MiB} MiB segment per process, so a few ranks fill it, and "
                f"SGLang needs more; ttmesh wants at least {size_text(MIN_SHM)}",
                SMALL_FIX,
                "container-shm-small",
            )
        )
    if box.covers(container.LISTENERS) is None:
        notes.append(
            f"{container.LISTENERS} is the container's own: a tt-smi reset on the host does not "
            f"notify processes here (tt-umd's reset notices); share it: -v "
            f"{container.LISTENERS}:{container.LISTENERS}"
        )
    pages = box.mount(container.HUGEPAGES)
    if pages is None or pages.fstype != "hugetlbfs":
        notes.append(
            f"{container.HUGEPAGES} is not mounted in the container: tt-umd opens its 1 GiB "
            "hugepages there (none are needed behind an IOMMU that translates); share it: -v "
            f"{container.HUGEPAGES}:{container.HUGEPAGES}"
        )
    return found, notes
