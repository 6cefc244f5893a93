"""Which ranks are bringing up the fabric now: killed then, a rank wedges the Ethernet cores.

A rank is in fabric bring-up from the line tt-metal logs as it starts it until it marks the
fabric open. The lines, from tt-metal's source (tenstorrent/tt-metal):

* the start, ``log_info(tt::LogMetal, "Initializing Fabric")``: before the routing tables are
  written and the routers launched, in ``FabricFirmwareInitializer::init``
  (``tt_metal/impl/device/firmware/fabric_firmware_initializer.cpp``; before it
  ``DeviceManager::initialize_active_devices``, ``tt_metal/impl/device/device_manager.cpp``, and
  ``DevicePool::initialize_active_devices``, ``tt_metal/impl/device/device_pool.cpp``). On a
  Galaxy, ``"Initializing Fabric and Dispatch Firmware for Galaxy cluster (this may take a few
  minutes)"`` (``initialize_fabric_and_dispatch_fw``) comes first: it starts it too.
* the end: the routers' handshake (``wait_for_fabric_router_sync``, whose failure is "Fabric
  Router Sync: Timeout after N ms") is what a kill must not cut. ``"Fabric Initialized with
  config {}"`` is logged *before* that sync, so it is not the end. After it,
  ``DevicePool::initialize_fabric_and_dispatch_fw`` logs ``"Devices initialized"``
  (``log_info``); newer versions log ``"Fabric and Dispatch Firmware initialized"`` at trace
  level only (``device_manager.cpp``), so a rank of such a version is open when it creates its
  ``TTMESH_FABRIC_FILE`` (``ttmesh.worker.fabric_up()``), or when it ends.

A rank without chips (a plain torch rank, a chipless server) is never in bring-up. The lines
are looked for in whole blocks of output, at C speed: a block is searched for ``nitializ``
(every line above holds it) and only one that holds it is matched, with one pattern.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

HINT = b"nitializ"  # in every line below: a block without it cannot matter
LINES = re.compile(
    rb"(Initializing Fabric)|Devices initialized|Fabric and Dispatch Firmware initialized"
)


class BringUp:
    """The ranks bringing up the fabric now (of ``watched``: the ranks with chips)."""

    def __init__(self, watched: Iterable[int], fabric_files: dict[int, str]) -> None:
        self.watched = set(watched)
        self.files = fabric_files  # rank -> its TTMESH_FABRIC_FILE
        self.active: set[int] = set()

    def scan(self, rank: int, block: bytes) -> None:
        """A block of whole lines of ``rank``'s output: the last fabric line in it decides."""
        if rank not in self.watched or HINT not in block:
            return
        for found in LINES.finditer(block):
            if found.group(1):
                self.active.add(rank)
            else:
                self.active.discard(rank)

    def marks(self) -> None:
        """A rank that created its TTMESH_FABRIC_FILE has the fabric open (only the ranks in
        bring-up are looked at: none, most of the time)."""
        for rank in list(self.active):
            path = self.files.get(rank)
            if path and os.path.exists(path):
                self.active.discard(rank)

    def ranks(self, running: set[int]) -> list[int]:
        """The running ranks in bring-up now, their fabric files read first."""
        self.marks()
        return sorted(self.active & running)
