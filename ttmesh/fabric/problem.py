"""What every check of a host reports: a :class:`Problem` with its fix, and how it names a chip.

``ttmesh check`` (:mod:`ttmesh.fabric.health`) gathers problems from its parts (the system's
driver and firmware, a container's limits, tt-umd's locks) and ``ttmesh reset`` reads them: each
part builds its problems from this module, so none of them has to import the check that runs it.
"""

from __future__ import annotations

from ttmesh.dataclass import dataclass
from ttmesh.fabric.devices import Inventory
from ttmesh.vocab import ChipProcess, Severity

ERROR, WARNING = Severity.ERROR, Severity.WARNING


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a host, and the one fix a user can run for it."""

    severity: str  # "error" | "warning"
    what: str
    fix: str
    kind: str = ""  # missing, driver-node, heartbeat, holder, lease, link-down, link-unknown, ...
    chips: tuple[str, ...] = ()  # asic ids involved

    def to_json(self) -> dict[str, str]:
        return {"severity": self.severity, "what": self.what, "fix": self.fix}


def chip_name(inv: Inventory, asic: str, names: dict[str, str] | None = None) -> str:
    """A PCI address; ``remote <asic> via <bdf>``; or a lost chip's address or unique id."""
    for c in inv.chips:
        if c.asic_id == asic:
            if c.bdf:
                return c.bdf
            partner = inv.lead(c)
            return f"remote {asic}" + (f" via {partner.bdf}" if partner and partner.bdf else "")
    bdf = (names or {}).get(asic)
    return f"{bdf} ({asic})" if bdf else asic


def kill_fix(h: ChipProcess) -> str:
    """A fix a user can run as printed: end the process that holds a chip."""
    return f"kill {h.pid} ({h.user}: {h.cmd})"
