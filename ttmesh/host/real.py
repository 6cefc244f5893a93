"""This machine: the kernel driver's files under ``/``, firmware telemetry through tt-umd.

The driver shows PCI devices only; remote chips, Ethernet links and their live status come from
the chips' firmware through tt-umd (the ``hw`` extra, :mod:`ttmesh.host.telemetry`), and are
"unknown" without it, never "down". Holders come from the driver's pid lists, or from scanning
``/proc/*/fd`` on drivers older than 2.5 ("unknown" where permissions hide processes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ttmesh import numeric
from ttmesh.errors import bad_input
from ttmesh.host.base import Host

if TYPE_CHECKING:
    from ttmesh.host.clusterdesc import ClusterDescriptor


class RealHost(Host):
    records_known_good = True
    firmware_opens_chips = True  # tt-umd's topology discovery and telemetry open every chip

    def _scan_holders(self, dev: int) -> list[int] | None:
        return _scan_proc_fds(str(self.dev_node(dev)))

    def eth_live_status(self, asics: list[str]) -> dict[str, int | None]:
        from ttmesh.host import telemetry

        return telemetry.eth_live_status(self, asics)

    def remote_heartbeats(self, asics: list[str]) -> dict[str, int | None]:
        from ttmesh.host import telemetry

        return telemetry.remote_heartbeats(self, asics)

    def heartbeat_intervals(self, chips: list[tuple[str, int | None]]) -> dict[str, float | None]:
        from ttmesh.host import telemetry

        return telemetry.update_intervals(self, chips)

    def topology(self) -> tuple[ClusterDescriptor | None, str, list[str]]:
        from ttmesh.host import telemetry

        return telemetry.umd_topology(self)

    def default_tt_smi(self) -> str:
        if self.root != Path("/"):
            return super().default_tt_smi()
        import shutil

        found = shutil.which("tt-smi")
        if found:
            return found
        raise bad_input(
            "tt-smi not found on PATH", "install it: pip install tt-smi (or give --tt-smi PATH)"
        )

    def tt_smi_env(self) -> dict[str, str | None]:
        return {"TTMESH_SIM_ROOT": None}  # a real tt-smi resets real chips


def _scan_proc_fds(node: str) -> list[int] | None:
    """What fuser does: every process with an open fd on ``node``. None if any was hidden."""
    pids: set[int] = set()
    hidden = False
    for name in os.listdir("/proc"):
        if not numeric.digits(name):
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            hidden = True
            continue
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == node:
                    pids.add(int(name))
                    break
            except OSError:
                continue
    if hidden and not pids:
        return None
    return sorted(pids)
