"""Reset domains: which chips one reset takes, which links it downs, and where a reset may stop.

What one reset takes is the tools' own unit (read from their code):

* tt-smi's ``-r`` hands tt-umd PCI devices (``WarmReset::warm_reset(pci_device_ids)`` in
  tt-umd's ``device/warm_reset.cpp``; tt-tools-common's ``reset_common``), each reset through
  tt-kmd's ``TENSTORRENT_IOCTL_RESET_DEVICE`` on its own ``/dev/tenstorrent/N`` (tt-kmd's
  ``tools/reset.c``). One PCI device's reset takes the chips behind it: an n300's remote
  (right-hand) chip is reached only through its left chip's device. A p300's two chips are two
  PCI devices: two domains.
* a Galaxy's reset is the UBB's (``tt-smi -glx_reset``, tt-umd's ``ubb_warm_reset``: an IPMI
  reset of every tray, then a 30 s ``UBB_POST_RESET_WAIT``): the whole host, one domain.
* a reset downs every Ethernet link with one end inside its domain. Links with both ends
  reset train again; a link with one end reset and the other running does not train until
  both ends are reset together (tt-system-firmware#1271: an asymmetric reset of an n300 leaves
  its external links 40-180 s untrained, often for good), while the running peer itself keeps
  working: only that link is lost. So a link between two jobs' chips that neither job's mesh
  uses may be left down by a reset of one side without harming either job; the next job whose
  mesh needs it resets both ends (:mod:`ttmesh.runtime.leftdown` records it).

:func:`expand` is the reset's planning rule: the asked chips, their domains, and transitively
every chip Ethernet-linked to the set (free chips, the resetting job's own), stopping only at a
link :func:`may_leave_down` allows. It is pure (plain data in and out), so a caller that
recovers one replica's chips alone (a serving fleet) plans with it and :class:`Usage`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.fabric.devices import Inventory, LinkSpec
from ttmesh.fabric.problem import chip_name
from ttmesh.vocab import ChipProcess, Role

GLX_RESET = "tt-smi -glx_reset"


def is_galaxy(inv: Inventory) -> bool:
    """A Galaxy's reset is the UBB's: every chip of the host at once."""
    return any(c.board_type.startswith("galaxy") for c in inv.chips)


@dataclass(frozen=True)
class Domain:
    """The chips one reset takes (``pci``: the PCI devices tt-smi names), and the links it
    downs: every link with one end inside (``inside``: both ends; the rest border it)."""

    chips: tuple[str, ...]
    pci: tuple[str, ...]
    command: str
    why: str
    inside: tuple[LinkSpec, ...]
    border: tuple[LinkSpec, ...]

    def to_json(self) -> dict[str, Any]:
        def link(s: LinkSpec, inside: bool) -> dict[str, Any]:
            return {
                "a": {"asic_id": s.a, "chan": s.chan_a},
                "b": {"asic_id": s.b, "chan": s.chan_b},
                "inside": inside,
            }

        return {
            "chips": list(self.chips),
            "pci": list(self.pci),
            "command": self.command,
            "why": self.why,
            "links": [link(s, True) for s in self.inside] + [link(s, False) for s in self.border],
        }


def domains(inv: Inventory, specs: Sequence[LinkSpec] | None = None) -> list[Domain]:
    """Every reset domain of ``inv``'s host, in the host's order of chips."""
    links = list(inv.links if specs is None else specs)
    groups: list[tuple[list[str], str]] = []
    if is_galaxy(inv):
        groups.append(
            ([c.asic_id for c in inv.chips], "Galaxy: the UBB reset takes every chip of the host")
        )
    else:
        seen: set[str] = set()
        for c in inv.chips:
            if c.asic_id in seen:
                continue
            peers = [p.asic_id for p in inv.board_peers(c)] or [c.asic_id]
            seen.update(peers)
            why = (
                "one PCI device and the remote chip behind it"
                if len(peers) > 1
                else "one PCI device"
            )
            groups.append((peers, why))
    out = []
    for chips, why in groups:
        inside = set(chips)
        pci = tuple(
            dict.fromkeys(
                lead.bdf
                for c in inv.chips
                if c.asic_id in inside and (lead := inv.lead(c)) is not None and lead.bdf
            )
        )
        command = GLX_RESET if is_galaxy(inv) else "tt-smi -r " + ",".join(pci)
        out.append(
            Domain(
                tuple(chips),
                pci,
                command,
                why,
                tuple(s for s in links if s.a in inside and s.b in inside),
                tuple(s for s in links if (s.a in inside) != (s.b in inside)),
            )
        )
    return out


# --------------------------------------------------------------------------- who uses what


@dataclass(frozen=True)
class Usage:
    """Who uses the host's chips now, as the planner needs it (plain data).

    ``jobs``: chip -> the other live job leasing it ("job J of user U"; the resetting job's
    own chips are not here). ``uses``: chip -> the chips its job's mesh reaches over Ethernet
    from it, for every leased chip (the resetting job's too); a leased chip not in ``uses``
    (a lease whose record does not say: an older ttmesh, a rank of a mesh over hosts) uses
    every link it has."""

    jobs: dict[str, str] = field(default_factory=dict)
    uses: dict[str, frozenset[str]] = field(default_factory=dict)
    leased: frozenset[str] = frozenset()

    def used(self, a: str, b: str) -> bool:
        """Does a job's mesh use the links between ``a`` and ``b``?"""
        for end, other in ((a, b), (b, a)):
            if end in self.leased and (end not in self.uses or other in self.uses[end]):
                return True
        return False


def usage_from(leases: dict[str, ChipProcess], own_pids: Iterable[int]) -> Usage:
    """:class:`Usage` from the host's leases (``leases.probe``): only verified leases count as
    jobs; a lock on a lease file that is no lease is no job (the reset goes through it, and
    is refused or ``--force``d there as before)."""
    own = set(own_pids)
    jobs: dict[str, str] = {}
    uses: dict[str, frozenset[str]] = {}
    leased: set[str] = set()
    for asic, info in leases.items():
        if info.role != Role.LEASE or not info.verified or info.job is None:
            continue
        leased.add(asic)
        if info.uses is not None:
            uses[asic] = frozenset(info.uses)
        if not own & {info.pid, *info.related}:
            jobs[asic] = f"job {info.job} of user {info.user}"
    return Usage(jobs, uses, frozenset(leased))


def may_leave_down(usage: Usage, inside: str, outside: str) -> bool:
    """May a reset of ``inside`` leave its links to ``outside`` down? Only when ``outside``
    is another live job's chip and neither job's mesh uses those links: then neither job is
    harmed, and the next job that needs them resets both ends."""
    return outside in usage.jobs and not usage.used(inside, outside)


def mesh_peers(inv: Inventory, chips: Iterable[str]) -> dict[str, list[str]]:
    """Chip -> the job's other chips it has Ethernet links to: the links a job's mesh over
    ``chips`` can use (never one to a chip outside the job), kept in its lease records."""
    mine = set(chips)
    out: dict[str, set[str]] = {a: set() for a in mine}
    for s in inv.links:
        if s.a in mine and s.b in mine and s.a != s.b:
            out[s.a].add(s.b)
            out[s.b].add(s.a)
    return {a: sorted(peers) for a, peers in out.items()}


# --------------------------------------------------------------------------- the rule


def expand(
    inv: Inventory,
    asics: Iterable[str],
    link_specs: Sequence[LinkSpec],
    *,
    follow_links: bool = True,
    usage: Usage | None = None,
) -> tuple[dict[str, str], list[LinkSpec]]:
    """(asic -> why it is reset, in the inventory's order; the links left down).

    ``asics`` plus their domains and, with ``follow_links``, transitively every chip linked
    to the set, except across a link :func:`may_leave_down` allows (``usage`` None: none, as
    before there were records of who uses which link). On a Galaxy the domain is the host.
    """
    order = {c.asic_id: i for i, c in enumerate(inv.chips)}
    adjacent: dict[str, list[str]] = {}
    for lk in link_specs:
        if lk.a in order and lk.b in order and lk.a != lk.b:
            adjacent.setdefault(lk.a, []).append(lk.b)
            adjacent.setdefault(lk.b, []).append(lk.a)
    why: dict[str, str] = {}
    queue: list[str] = []
    for asic in asics:
        if asic in order and asic not in why:
            why[asic] = "asked"
            queue.append(asic)
    stopped: set[frozenset[str]] = set()
    while queue:
        asic = queue.pop(0)
        name = chip_name(inv, asic)
        for peer in inv.board_peers(inv.chip(asic)):
            if peer.asic_id not in why:
                why[peer.asic_id] = f"same board as {name}"
                queue.append(peer.asic_id)
        if not follow_links:
            continue
        for other in adjacent.get(asic, []):
            if other in why:
                continue
            if usage is not None and not is_galaxy(inv) and may_leave_down(usage, asic, other):
                stopped.add(frozenset((asic, other)))
                continue
            why[other] = f"Ethernet-linked to {name}"
            queue.append(other)
    if is_galaxy(inv) and why:
        stopped.clear()
    left = [
        lk
        for lk in link_specs
        if frozenset((lk.a, lk.b)) in stopped and ((lk.a in why) != (lk.b in why))
    ]
    return dict(sorted(why.items(), key=lambda kv: order[kv[0]])), left
