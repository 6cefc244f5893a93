"""Healthy first: a mesh of chips pre-flight will accept, when the host has one.

Pre-flight (``fabric.health.preflight``) refuses a job holding both chips of a pair whose links
are down, and a chip whose heartbeat is frozen. Choosing chips without looking would pick such
a pair whenever it comes first in PCI order, though healthy chips are free. So the chips are
chosen in this order (:func:`select`), each step only when the one before finds no mesh:

1. chips none of whose links is down (a broken pair is left whole, for its reset);
2. sets holding one chip of each broken pair at most (a chip whose link to a chip outside the
   job is down does not stop the job: pre-flight checks the links between the job's chips),
   the fewest chips left out first, then as :func:`ttmesh.mesh.select.select` ranks meshes;
3. none: :class:`Unhealthy` carries the mesh chosen as if every link were up (the one a reset
   of its broken pairs makes healthy), for the caller to refuse with that reset, or to reset
   with ``--auto-reset``.

Frozen chips are unavailable before this is asked (the caller's ``unavailable``).
:func:`passed_over` says which chips a choice left out and why (``--dry-run`` prints it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ttmesh.dataclass import dataclass
from ttmesh.errors import BAD_INPUT, TTMeshError
from ttmesh.fabric.devices import Inventory
from ttmesh.mesh import select as meshselect
from ttmesh.mesh.embed import Shape

COVERS = 32  # ways of keeping one chip of each broken pair tried (each one a selection)


@dataclass(frozen=True)
class Broken:
    """Two chips a job may not hold together: links between them are down."""

    chips: tuple[str, str]  # asic ids
    what: str  # pre-flight's words for it
    fix: str  # pre-flight's fix (the reset that brings the links back)


class Unhealthy(Exception):
    """No healthy mesh of the size: ``selection`` is the mesh with every link taken as up,
    ``broken`` the pairs inside it that make it unhealthy."""

    def __init__(self, selection: meshselect.Selection, broken: list[Broken]) -> None:
        super().__init__(broken[0].what)
        self.selection = selection
        self.broken = broken


def select(
    inv: Inventory,
    n: int,
    *,
    shape: Shape | None = None,
    unavailable: dict[str, str] | None = None,
    broken: Sequence[Broken] = (),
) -> meshselect.Selection:
    """The best healthy mesh of ``n`` chips (:func:`ttmesh.mesh.select.select`'s order among
    equals); raises what that raises when no mesh exists at all, :class:`Unhealthy` when the
    only meshes hold a broken pair."""
    unavailable = dict(unavailable or {})
    pairs = [b for b in broken if not set(b.chips) & unavailable.keys()]
    if not pairs or n > len(inv.chips):
        return meshselect.select(inv, n, shape=shape, unavailable=unavailable)
    touched = {a for b in pairs for a in b.chips}
    found = _try(inv, n, shape, {**unavailable, **dict.fromkeys(touched, "link down")})
    if found is not None:
        return found
    best: tuple[tuple, meshselect.Selection] | None = None
    for cover in _covers([b.chips for b in pairs]):
        if len(inv.chips) - len(unavailable.keys() | cover) < n:
            continue
        sel = _try(inv, n, shape, {**unavailable, **dict.fromkeys(cover, "link down")})
        if sel is not None:
            key = (len(cover), *_rank(inv, sel, n))
            if best is None or key < best[0]:
                best = (key, sel)
    if best is not None:
        return best[1]
    naive = meshselect.select(inv, n, shape=shape, unavailable=unavailable)  # raises: no mesh
    inside = {a for u in naive.units for a in u.chips}
    within = [b for b in pairs if set(b.chips) <= inside]
    if not within:
        return naive  # healthy after all (a mesh the bounded searches above did not reach)
    raise Unhealthy(naive, within)


def _try(
    inv: Inventory, n: int, shape: Shape | None, unavailable: dict[str, str]
) -> meshselect.Selection | None:
    try:
        return meshselect.select(inv, n, shape=shape, unavailable=unavailable)
    except TTMeshError as exc:
        if exc.code != BAD_INPUT:
            raise
        return None


def _covers(pairs: list[tuple[str, str]]) -> list[frozenset[str]]:
    """Sets of chips to leave out so that no pair keeps both its chips (minimal vertex covers
    of the broken pairs), smallest first; at most :data:`COVERS` are tried."""
    out: list[frozenset[str]] = []

    def walk(left_out: frozenset[str], rest: list[tuple[str, str]]) -> None:
        if len(out) >= COVERS:
            return
        open_ = [p for p in rest if not set(p) & left_out]
        if not open_:
            out.append(left_out)
            return
        # The chip in more broken pairs first: leaving it out mends the most.
        for chip in sorted(open_[0], key=lambda c: -sum(c in p for p in open_)):
            walk(left_out | {chip}, open_)

    walk(frozenset(), pairs)
    minimal = {c for c in out if not any(o < c for o in out)}
    return sorted(minimal, key=lambda c: (len(c), sorted(c)))


def _rank(inv: Inventory, sel: meshselect.Selection, n: int) -> tuple:
    """How :func:`ttmesh.mesh.select.select` ranks meshes, as a key (lower is better): no idle
    chips, the shape's place (squarest first), the weakest pair's links, rings, idle chips,
    boards, PCI order."""
    shapes = meshselect.candidate_shapes(n, meshselect.full_shape(inv))
    place = shapes.index(sel.shape) if sel.shape in shapes else len(shapes)
    order = {c.asic_id: i for i, c in enumerate(inv.chips)}
    boards = len({inv.chip(a).board_id for a in sel.chips})
    return (
        sel.idle_chips > 0,
        place,
        -sel.channels,
        -sel.dim_types.count("RING"),
        sel.idle_chips,
        boards,
        sorted(order[a] for a in sel.chips),
    )


def passed_over(
    inv: Inventory,
    used: Iterable[str],
    why: dict[str, str],
    who: dict[str, str],
    broken: Sequence[Broken],
) -> list[dict[str, object]]:
    """What a choice of chips (``used``) left out and why: the chips of broken pairs it did not
    take (the pair's other chip may be in the job: pre-flight checks the links between the
    job's chips only), then every chip it could not use (leased, held, dead, locked,
    excluded), in PCI order: ``[{chips: [name...], why}]``."""
    taken = set(used)
    label = {c.asic_id: c.label for c in inv.chips}
    order = {c.asic_id: i for i, c in enumerate(inv.chips)}
    out: list[dict[str, object]] = []
    for b in broken:
        left = sorted((a for a in b.chips if a not in taken), key=lambda a: order.get(a, -1))
        if set(b.chips) & why.keys() or not left:
            continue
        out.append({"chips": [label.get(a, a) for a in left], "why": b.what})
    for c in inv.chips:
        reason = why.get(c.asic_id)
        if reason is None or c.asic_id in taken:
            continue
        detail = who.get(c.asic_id) or ("--exclude" if reason == "excluded" else "")
        out.append({"chips": [c.label], "why": f"{reason}: {detail}" if detail else reason})
    return out
