"""What every host of a job resets, decided once from every host's check (pure: data in, data
out), and the verdict on the job's cables from both their ends after the reset.

A cable between two hosts has an end on each; resetting one end alone leaves it down (the
other end fails to train), and it trains back only when both ends are reset together. So when
either end of a cable of the job is down, both hosts reset the chips at its ends; and a host's
reset takes more than the chips asked (its reset domain: whole boards, chips linked to them,
a Galaxy's every chip), so a cable whose end a domain takes gets its other end reset too, and so
on until nothing more is added. The MPMD launcher decides this from the hosts' reports
(``launcher.nodes.hostrecovery``); c10d agents each decide it alike from the same records in
their rendezvous store (``launcher.nodes.multihost``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.recovery.afterjob import FAILED
from ttmesh.render import plural
from ttmesh.vocab import LinkState

End = tuple[str, int]  # (chip unique id, channel)


@dataclass(frozen=True)
class Side:
    """One end of a cable as the host that has it named it."""

    host: str
    chip: str
    name: str  # PCI address (or how the host names a chip without one)
    chan: int
    state: str

    def label(self) -> str:
        return f"{self.host} {self.name} ch{self.chan}"


@dataclass(frozen=True)
class Cable:
    """A cable of the job: its two ends (``b`` None when the peer host did not report it)."""

    a: Side
    b: Side | None
    peer: End  # the other end's chip and channel, as ``a``'s host reads it

    @property
    def down(self) -> bool:
        return LinkState.DOWN in (self.a.state, self.b.state if self.b else LinkState.UNKNOWN)

    def label(self) -> str:
        other = self.b.label() if self.b else f"chip {self.peer[0]} ch{self.peer[1]}"
        return f"{self.a.label()} <-> {other}"


@dataclass
class Decision:
    """The chips each host resets (asked: its reset domains take the rest), and why."""

    resets: dict[str, list[str]] = field(default_factory=dict)  # host -> chips to ask for
    why: dict[str, str] = field(default_factory=dict)  # host -> why it resets
    together: list[Cable] = field(default_factory=list)  # cables whose both ends are reset

    @property
    def needed(self) -> bool:
        return any(self.resets.values())


def cables(ends: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Cable]:
    """Every cable of the job once, from each host's ends (``host -> [CableEnd as JSON]``),
    its ends joined by chip and channel, in the order the hosts are given."""
    sides: dict[End, Side] = {}
    peer_of: dict[End, End] = {}
    order: list[End] = []
    for host, found in ends.items():
        for e in found:
            me = (str(e["chip"]), int(e["chan"]))
            sides[me] = Side(host, me[0], str(e["name"]), me[1], str(e["state"]))
            peer_of[me] = (str(e["peer"]), int(e["peer_chan"]))
            order.append(me)
    out: list[Cable] = []
    seen: set[frozenset[End]] = set()
    for me in order:
        key = frozenset({me, peer_of[me]})
        if key not in seen:
            seen.add(key)
            out.append(Cable(sides[me], sides.get(peer_of[me]), peer_of[me]))
    return out


def decide(checks: Mapping[str, Any], always: bool = False) -> Decision:
    """Each host's reset from every host's check (``host -> afterjob.HostCheck``): its chips
    when its check failed (or ``always``), both ends of every cable down, then, until nothing
    changes, the far end of every cable a host's reset domains take."""
    host_of = {a: h for h, c in checks.items() for a in c.chips}
    need: dict[str, set[str]] = {h: set() for h in checks}
    why: dict[str, str] = {}
    for h, c in checks.items():
        if c.chips and (always or c.state == FAILED):
            need[h] |= set(c.chips)
            why[h] = c.problem or "--reset-on-failure"
    found = cables({h: c.ends for h, c in checks.items()})
    down_here: dict[str, int] = {}
    for cable in found:
        if cable.down:
            for end in (cable.a.chip, cable.peer[0]):
                if end in host_of:
                    need[host_of[end]].add(end)
            for side in (cable.a, cable.b):
                if side is not None and side.state == LinkState.DOWN:
                    down_here[side.host] = down_here.get(side.host, 0) + 1
    changed = True
    while changed:
        changed = False
        taken = _taken(checks, need)
        for cable in found:
            ends = [(a, host_of.get(a)) for a in (cable.a.chip, cable.peer[0])]
            if any(owner is not None and a in taken[owner] for a, owner in ends):
                for a, owner in ends:
                    if owner is not None and a not in need[owner]:
                        need[owner].add(a)
                        changed = True
    taken = _taken(checks, need)
    together = [
        c
        for c in found
        if c.a.chip in taken.get(c.a.host, set())
        and c.b is not None
        and c.b.chip in taken.get(c.b.host, set())
    ]
    for h in checks:
        if need[h] and h not in why:
            n = down_here.get(h, 0)
            far = sorted({c.b.host if c.a.host == h else c.a.host for c in together if c.b
                          and h in (c.a.host, c.b.host)} - {h})  # fmt: skip
            why[h] = (
                f"{plural(n, 'cable end')} down"
                if n
                else f"its cables to {', '.join(far) or 'the other hosts'} are reset at both ends"
            )
    resets = {h: [a for a in checks[h].chips if a in need[h]] for h in checks}
    return Decision(resets, why, together)


def _taken(checks: Mapping[str, Any], need: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Every chip each host's reset of ``need`` takes (its reset domains)."""
    return {
        h: {t for a in need[h] for t in checks[h].domains.get(a, [a])} | need[h] for h in checks
    }


def verdict(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Cable]:
    """The job's cables that are down after the reset, read from both ends (``host ->
    [CableEnd as JSON]``, every host's ends after its wait): a cable is up only when both are.
    A cable whose far host did not answer is named only when its near end is down (that
    host's own line says it did not answer)."""
    return [c for c in cables(results) if c.down]


def pairs(found: Sequence[Cable]) -> str:
    """``8 between ttmh-0 and ttmh-1``: cables counted per pair of hosts."""
    counts: dict[tuple[str, str], int] = {}
    for c in found:
        if c.b is not None:
            key = (c.a.host, c.b.host) if c.a.host <= c.b.host else (c.b.host, c.a.host)
            counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} between {a} and {b}" for (a, b), n in counts.items())


def bad_cable_line(cable: Cable, waited: float) -> str:
    """One cable that did not come back, by host, chip and channel on both sides, and the fix."""
    hosts = ",".join(dict.fromkeys([cable.a.host] + ([cable.b.host] if cable.b else [])))
    return (
        f"cable {cable.label()} is still down after both ends were reset together and "
        f"{waited:.0f} s of training: reseat or replace that cable, then "
        f"ttmesh reset --hosts {hosts}"
    )
