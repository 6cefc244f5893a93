"""Which simulated host a job's ranks see at the real paths (pure: the plan's ``host_view``).

A rank of a job on a host read under a root of its own (``--sim``, ``--root``) starts in a mount
namespace where ``/dev/tenstorrent`` and ``/proc/driver/tenstorrent`` hold the job's chips of
that host (:mod:`ttmesh.runtime.hostview` builds it; :mod:`ttmesh.launcher.attempt.hostviews`
puts each rank in it): code that reads the real paths (torch_tpu's device count in libtt's TPU
compatibility mode, tt-umd, tt-smi) sees the chips the job was given.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ttmesh.dataclass import dataclass
from ttmesh.fabric.devices import Inventory

HELPER = str(Path(__file__).resolve().parents[2] / "runtime" / "hostview.py")


@dataclass(frozen=True)
class HostView:
    """The simulated root and the ``/dev/tenstorrent`` indices a job's ranks see there."""

    root: str
    devices: tuple[str, ...]
    python: str = sys.executable  # runs the helper (isolated: it needs the standard library)

    def helper(self) -> list[str]:
        """The helper's command (``runtime.rankview`` adds its mode: ``--hold``, one namespace
        for an attempt's ranks; or ``-- PROGRAM``, one rank's own where there is no nsenter)."""
        return [self.python, "-I", "-S", HELPER, self.root, ",".join(self.devices)]

    def to_json(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "dev": [f"/dev/tenstorrent/{d}" for d in self.devices],
            "proc": [f"/proc/driver/tenstorrent/{d}" for d in self.devices],
        }


def wanted(inv: Inventory, chips: list[str]) -> HostView | None:
    """The view of a job on ``chips`` of ``inv``'s host: None on the machine itself (root /)."""
    root = str(inv.host.root)
    if root == "/" or not Path(root, "dev", "tenstorrent").is_dir():
        return None
    indices = sorted(
        {str(c.dev_index) for c in inv.chips if c.asic_id in chips and c.dev_index is not None},
        key=int,
    )
    return HostView(root, tuple(indices))
