"""The links between a fleet's replicas, once no replica runs: checked together, reset together.

Each replica's job recovers only its own chips (``fabric.domains``): a link between two
replicas' chips is in no replica's mesh, so it may be left down. Once every replica has stopped,
whoever ends the fleet (its ttmesh, or its guard when ttmesh was killed: ``fleet.guard``) checks
the fleet's chips together, and resets them together where something is wrong. A chip the host
has lost (no PCI device: a reset cannot reach it) is never verified: it is named as not
recovered, never counted among the recovered chips, and the fleet's exit code says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.render import plural

LOST_FIX = "missing from the host: a reset cannot reach it; power-cycle the host"


@dataclass
class Between:
    """What the fleet's last check found: the chips it could not recover, and why."""

    reset: bool = False  # a reset ran
    lost: list[str] = field(default_factory=list)  # the chips not recovered, by name
    why: str = ""  # one clause: what is wrong with them

    @property
    def healthy(self) -> bool:
        return not self.lost

    def clause(self) -> str:
        """``chips not recovered: 0000:07:00.0 (...) (why)`` for the fleet's last line."""
        if not self.lost:
            return ""
        return (
            f"{plural(len(self.lost), 'chip')} not recovered: {', '.join(self.lost)} ({self.why})"
        )

    def to_json(self) -> dict[str, Any]:
        return {"reset": self.reset, "not_recovered": list(self.lost), "why": self.why}


def check(
    host: Any,
    asics: Sequence[str],
    names: dict[str, str],
    *,
    tt_smi: str | None,
    train_timeout: float | None,
    own_pids: Iterable[int] = (),
    say: Callable[[str], None],
) -> Between:
    """The fleet's chips ``asics`` (``names``: asic -> its PCI address, as the plan had it)
    checked together and, where something is wrong, reset together and verified. Raises
    OSError or TTMeshError when the host cannot be read."""
    from ttmesh.errors import TTMeshError
    from ttmesh.fabric import health
    from ttmesh.fabric.devices import discover
    from ttmesh.fabric.problem import chip_name
    from ttmesh.recovery import reset

    own = tuple(own_pids)
    inv = discover(host)
    down = [p for p in health.preflight(inv, asics, own, system=False) if p.severity == "error"]
    if not down:
        return Between()
    say(f"the fleet's chips: {down[0].what}: resetting them together")

    def named(chips: Iterable[str]) -> list[str]:
        out: list[str] = []
        for a in chips:
            name = chip_name(inv, a, names)
            if a in asics and name not in out:
                out.append(name)
        return out

    try:
        outcome = reset.recover(
            host, list(asics), tt_smi=tt_smi, settle=train_timeout, own_pids=own, inv=inv,
            log=lambda m: say(f"reset: {m}"),
        )  # fmt: skip
    except TTMeshError as exc:
        say(f"reset refused: {exc}")
        lost = named(a for p in down for a in p.chips) or named(asics)
        return Between(False, lost, f"the reset was refused: {exc.message}")
    unreached = named(outcome.unreached)
    if not outcome.recovered:
        for p in outcome.problems[:3]:
            say(f"reset: still wrong: {p.what}")
        lost = named(a for p in outcome.problems for a in p.chips) or named(outcome.plan.chips)
        lost += [n for n in unreached if n not in lost]
        what = outcome.problems[0].what if outcome.problems else "not verified after the reset"
        return Between(True, lost, what)
    reached = plural(len(outcome.plan.chips), "chip")
    if unreached:
        say(f"reset: {reached} recovered and verified ({outcome.seconds:.1f} s); not recovered: "
            f"{', '.join(unreached)} ({LOST_FIX})")  # fmt: skip
        return Between(True, unreached, LOST_FIX)
    say(f"reset: chips recovered and verified ({outcome.seconds:.1f} s)")
    return Between(True)
