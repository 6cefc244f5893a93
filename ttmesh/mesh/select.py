"""Choosing chips: a connected sub-mesh of the requested shape, and the order of its ranks.

Input is what discovery found (chips and their Ethernet links), never the stock system files.
A mesh of shape RxC is an embedding of the RxC grid into the link graph (``ttmesh.mesh.embed``):
grid neighbours must be linked chips, and in a RING dimension the ends of every line too. Any
grid tt-metal's topology mapper would map is accepted: a 1x4 line on a QuietBox 2, a 1x8 on a
T3K, a 3x5 on a Blackhole Galaxy. Among the embeddings that avoid unavailable chips (dead, held,
leased by another job, excluded), the best has the most links between its weakest neighbour
pair, then the most rings, leaves the fewest chips of its boards idle, spans the fewest boards
and comes first in PCI order. A process opens every chip of a board (an n300's remote chip
rides with its PCI chip), so a board is available only when all its chips are, and a mesh on
part of one still gets the whole board.

Ranks follow the ring when the hardware closes one (consecutive ranks are linked, so a ring
all-reduce runs over real links); mesh coordinates are row-major.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from itertools import islice
from typing import TypeVar

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.fabric.devices import Chip, Inventory
from ttmesh.mesh import embed, placement
from ttmesh.mesh.embed import Coord, DimTypes, Shape
from ttmesh.render import plural

T = TypeVar("T")
MAX_EMBEDDINGS = 400  # embeddings compared to choose the best
SEARCH_BUDGET = 20_000  # chips tried while looking for them (a few tens of milliseconds)


@dataclass(frozen=True)
class Unit:
    """The chips one process must be given together: one PCI device and the chips behind it."""

    chips: tuple[str, ...]  # asic ids, the PCI chip first
    bdf: str

    @property
    def size(self) -> int:
        return len(self.chips)


@dataclass
class Selection:
    """The chips chosen for a job: their grid, rank order, units and links."""

    shape: tuple[int, int]
    grid: dict[Coord, str]  # coordinate -> asic id
    order: list[Coord]  # rank order over coordinates (ring or snake)
    units: list[Unit]  # the units, in rank order of their first chip
    dim_types: tuple[str, str]
    channels: int  # the STRICT count every placement on its chips holds (placement.py)
    pair_links: dict[tuple[str, str], int] = field(default_factory=dict)  # grid neighbour pairs
    chip_links: dict[tuple[str, str], int] = field(default_factory=dict)  # every linked pair

    @property
    def chips(self) -> list[str]:
        return [self.grid[c] for c in self.order]

    @property
    def idle_chips(self) -> int:
        """Chips of the mesh's boards left out of it (opened by its processes, unused)."""
        return sum(u.size for u in self.units) - len(self.grid)

    def coord_of(self, asic: str) -> Coord:
        return next(c for c, a in self.grid.items() if a == asic)


def units_of(inv: Inventory) -> list[Unit]:
    """Worker units in PCI order: every PCI chip with the remote chips reached through it."""
    out = []
    for chip in inv.chips:
        if chip.bdf is None:
            continue
        behind = [c.asic_id for c in inv.chips if c.via == chip.asic_id]
        out.append(Unit((chip.asic_id, *behind), chip.bdf))
    return out


def link_graph(inv: Inventory) -> dict[str, Counter]:
    graph: dict[str, Counter] = defaultdict(Counter)
    for link in inv.links:
        if link.a == link.b:
            continue
        graph[link.a][link.b] += 1
        graph[link.b][link.a] += 1
    return graph


def candidate_shapes(n: int, full: Shape | None = None) -> list[Shape]:
    """Shapes of n chips, most square first, rows <= cols; the whole host keeps its own shape
    (8x4 for a whole Galaxy, but 2x4 for 8 of its chips, as on a T3K)."""
    shapes = [(r, n // r) for r in range(1, n + 1) if n % r == 0]
    shapes.sort(key=lambda s: (s != full, max(s) / min(s), s[0] > s[1]))
    return shapes


@dataclass
class _Host:
    """What choosing needs from the inventory, worked out once per call."""

    inv: Inventory
    links: dict[str, Counter]
    unit_of: dict[str, Unit]
    order_key: dict[str, int]
    board_of: dict[str, str]

    @classmethod
    def of(cls, inv: Inventory) -> _Host:
        units = units_of(inv)
        return cls(
            inv=inv,
            links=link_graph(inv),
            unit_of={a: u for u in units for a in u.chips},
            order_key={c.asic_id: i for i, c in enumerate(inv.chips)},
            board_of={c.asic_id: c.board_id for c in inv.chips},
        )

    @property
    def arch(self) -> str:
        return self.inv.chips[0].arch if self.inv.chips else ""

    @property
    def chips(self) -> list[str]:
        return [c.asic_id for c in self.inv.chips]

    @property
    def galaxy(self) -> bool:
        return any(c.board_type.startswith("galaxy") for c in self.inv.chips)

    def refusal(self, shape: Shape, allowed: list[str]) -> str | None:
        """tt-metal's reason to refuse ``shape`` on ``allowed`` that the link graph does not
        show (its shape rules, its grouping of a whole Galaxy), or None."""
        return embed.tt_metal_refuses(shape, self.arch) or placement.grouping_refusal(
            self.links, allowed, shape, self.galaxy
        )

    def graph(self, allowed: list[str], min_links: int = 1) -> embed.Graph:
        return embed.graph_of(self.links, allowed, min_links)

    def wiring(self, allowed: list[str]) -> tuple:
        """What the answers about ``allowed`` depend on: the arch, the chips, their links."""
        inside = set(allowed)
        pairs = sorted(
            (a, b, n) for a in allowed for b, n in self.links[a].items() if b in inside and a < b
        )
        return (self.arch, tuple(allowed), tuple(pairs))

    def link_levels(self, allowed: list[str]) -> list[int]:
        """The link counts of the pairs among ``allowed``, most first."""
        inside = set(allowed)
        counts = {n for a in allowed for b, n in self.links[a].items() if b in inside}
        return sorted(counts, reverse=True)

    def free(self, unavailable: dict[str, str], chips: list[str] | None) -> list[str]:
        """The chips a mesh may use, in preference (PCI) order: the user's ``chips``, else
        every chip whose whole board is available (a process opens every chip of its board)."""
        if chips is not None:
            return sorted(chips, key=self.order_key.__getitem__)
        out = []
        for c in self.inv.chips:
            unit = self.unit_of.get(c.asic_id)
            board = unit.chips if unit else (c.asic_id,)
            if not any(a in unavailable for a in board):
                out.append(c.asic_id)
        return out


def full_shape(inv: Inventory) -> Shape | None:
    """The mesh the whole host forms, if any (e.g. 2x2 on a QuietBox 2, 8x4 on a Galaxy)."""
    return _full_shape(_Host.of(inv))


# Answers that take whole searches (a refusal's possible shapes, the host's own shape), kept per
# wiring: a process choosing many meshes on one host (ttmesh's tests, a planner) asks them often.
_MEMO: dict[tuple, object] = {}


def _memo(key: tuple, compute: Callable[[], T]) -> T:
    if key not in _MEMO:
        if len(_MEMO) >= 256:
            _MEMO.clear()
        _MEMO[key] = compute()
    return _MEMO[key]  # type: ignore[return-value]


def _full_shape(host: _Host) -> Shape | None:
    chips = [c.asic_id for c in host.inv.chips]
    galaxy = host.galaxy
    key = ("full", galaxy, host.wiring(chips))
    return _memo(key, lambda: _find_full_shape(host, galaxy))


def _find_full_shape(host: _Host, galaxy: bool) -> Shape | None:
    n = len(host.inv.chips)
    graph = host.graph([c.asic_id for c in host.inv.chips])
    shapes = [(r, n // r) for r in range(1, n + 1) if n % r == 0]
    shapes.sort(key=lambda s: (max(s) / min(s), (s[0] < s[1]) if galaxy else (s[0] > s[1])))
    for shape in shapes:
        if _shape_fits(host, graph, shape):
            return shape
    return None


def _shape_fits(host: _Host, graph: embed.Graph, shape: Shape) -> bool:
    """tt-metal would map a LINE x LINE mesh of ``shape`` onto the graph's chips."""
    if embed.tt_metal_refuses(shape, host.arch):
        return False
    return embed.fits(graph, embed.pattern(shape))


def select(
    inv: Inventory,
    n: int,
    *,
    shape: Shape | None = None,
    unavailable: dict[str, str] | None = None,
    chips: list[str] | None = None,
) -> Selection:
    """Choose ``n`` chips forming a connected mesh. ``unavailable`` maps asic -> why not.

    ``chips``: the user's explicit choice (asic ids), used as is and in that order of preference.
    """
    unavailable = unavailable or {}
    host = _Host.of(inv)
    allowed = host.free(unavailable, chips)
    if n > len(inv.chips):
        raise bad_input(
            f"tp-size {n}: this host has {plural(len(inv.chips), 'chip')}",
            _shapes_hint(host, allowed),
        )
    if n > len(allowed):
        why = Counter(unavailable.values())
        detail = ", ".join(f"{k} {v}" for k, v in why.items())
        raise bad_input(
            f"tp-size {n}: only {len(allowed)} of {plural(len(inv.chips), 'chip')} "
            + ("is" if len(allowed) == 1 else "are")
            + " free"
            + (f" ({detail} unavailable)" if detail else ""),
            _shapes_hint(host, allowed) if allowed else "wait for the chips to be free",
        )
    full = _full_shape(host)
    found = None
    for sh in [shape] if shape else candidate_shapes(n, full):
        best = _best_embedding(host, sh, allowed)
        if best is not None and not best.idle_chips:
            return best
        found = found or best
    if found is None:
        raise _no_mesh(host, n, shape, allowed, full)
    return found  # every shape leaves chips of its boards idle: the squarest


def _ring_options(shape: Shape) -> list[DimTypes]:
    """Dimension types to try, most rings first (a ring needs 3 or more chips)."""
    per_dim = [("RING", "LINE") if size >= 3 else ("LINE",) for size in shape]
    options = [(a, b) for a in per_dim[0] for b in per_dim[1]]
    return sorted(options, key=lambda t: -t.count("RING"))


def _best_embedding(host: _Host, shape: Shape, allowed: list[str]) -> Selection | None:
    """The best mesh of ``shape`` on ``allowed``: the most links between its weakest neighbour
    pair (what a STRICT descriptor may demand), then the fewest idle chips on its boards, the
    most rings, the fewest boards, the earliest chips in PCI order."""
    if not _shape_fits(host, host.graph(allowed), shape):
        return None
    if placement.grouping_refusal(host.links, allowed, shape, host.galaxy):
        return None
    for min_links in host.link_levels(allowed) or [1]:
        graph = host.graph(allowed, min_links)
        if not embed.fits(graph, embed.pattern(shape)):
            continue
        found = []
        for dim_types in _ring_options(shape):
            grid = _best_grid(host, graph, embed.pattern(shape, dim_types), allowed)
            if grid is not None:
                found.append(_selection(host, shape, dim_types, grid))
                if not found[-1].idle_chips:
                    return found[-1]
        if found:  # rings, unless they leave more chips of their boards idle
            return min(found, key=lambda sel: sel.idle_chips)
        # The LINE x LINE mesh fits (proved above) but hid beyond the search budget.
        line = embed.pattern(shape)
        first = next(embed.embeddings(graph, line))
        grid = dict(zip(line.cells, (allowed[i] for i in first), strict=True))
        return _selection(host, shape, ("LINE", "LINE"), grid)
    return None


def _best_grid(
    host: _Host, graph: embed.Graph, pat: embed.Pattern, allowed: list[str]
) -> dict[Coord, str] | None:
    """The best of the first embeddings a bounded search finds (rings may hide beyond it)."""
    best: tuple | None = None
    best_grid = None
    edges = embed.grid_edges(pat.shape)
    # A mesh of every allowed chip, each chip its own unit (one PCI device, no remote chip):
    # every embedding scores alike (same chips, boards and order, no board to keep together),
    # so the first one found is the best (a whole Galaxy, or 128 p150s, without 400 searches).
    alike = len(pat.cells) == len(allowed) and all(
        host.unit_of[a].size == 1 for a in allowed if a in host.unit_of
    )
    for found in islice(embed.embeddings(graph, pat, budget=SEARCH_BUDGET), MAX_EMBEDDINGS):
        grid = dict(zip(pat.cells, (allowed[i] for i in found), strict=True))
        if alike:
            return grid
        score = _score(host, grid, edges)
        if best is None or score < best:
            best, best_grid = score, grid
    return best_grid


def _score(host: _Host, grid: dict[Coord, str], edges: list[tuple[Coord, Coord]]) -> tuple:
    """Lower is better: idle chips on the mesh's boards, then boards lying across the grid
    (a board's chips should be grid neighbours, so workers can take whole boards), boards
    spanned, and the chips' PCI order."""
    chosen = set(grid.values())
    unit_of = host.unit_of
    units = {unit_of[a] for a in chosen if a in unit_of}
    idle = sum(u.size for u in units) - len(chosen)
    paired = sum(
        1 for a, b in edges if grid[a] in unit_of and unit_of[grid[a]] == unit_of.get(grid[b])
    )
    boards = len({host.board_of[a] for a in chosen})
    return (idle, -paired, boards, sorted(host.order_key[a] for a in chosen))


def ring_order(shape: tuple[int, int]) -> list[Coord]:
    """Visiting order: a Hamiltonian cycle of the grid where one exists, else a snake."""
    rows, cols = shape
    if rows == 1:
        return [(0, c) for c in range(cols)]
    if cols == 1:
        return [(r, 0) for r in range(rows)]
    if rows % 2 == 0:
        # Down the first column's return path: snake over columns 1.., back up column 0.
        order = [(0, 0)]
        for r in range(rows):
            cs = range(1, cols) if r % 2 == 0 else range(cols - 1, 0, -1)
            order += [(r, c) for c in cs]
        order += [(r, 0) for r in range(rows - 1, 0, -1)]
        return order
    if cols % 2 == 0:
        return [(r, c) for r, c in ((rc[1], rc[0]) for rc in ring_order((cols, rows)))]
    return [(r, c if r % 2 == 0 else cols - 1 - c) for r in range(rows) for c in range(cols)]


def _selection(host: _Host, shape: Shape, dim_types: DimTypes, grid: dict[Coord, str]) -> Selection:
    order = ring_order(shape)
    # Each unit once, in ring order (a dict: a list's `in` would compare every unit met).
    found = (host.unit_of.get(grid[coord]) for coord in order)
    units = list(dict.fromkeys(u for u in found if u is not None))
    pair_links = {}
    for a, b in embed.grid_edges(shape, dim_types):  # a RING's wrap-around pairs count too
        key = tuple(sorted((grid[a], grid[b])))
        pair_links[key] = host.links[grid[a]][grid[b]]
    chips = list(grid.values())
    inside = set(chips)
    chip_links = {
        (a, b): n for a in chips for b, n in host.links[a].items() if b in inside and a < b
    }
    return Selection(
        shape=shape,
        grid=grid,
        order=order,
        units=units,
        dim_types=dim_types,
        # tt-metal checks STRICT channels on the placement it finds, which may use any linked
        # pair of the chips (placement.strict_channels), not only the grid's neighbour pairs.
        channels=placement.strict_channels(host.links, chips, host.chips) if pair_links else 0,
        pair_links=pair_links,  # type: ignore[arg-type]
        chip_links=chip_links,
    )


def possible_shapes(inv: Inventory, allowed: list[str] | None = None) -> list[Shape]:
    """Every shape (rows <= cols) tt-metal would map onto ``allowed`` (default: every chip),
    fewest chips first; a transposed shape fits as well."""
    host = _Host.of(inv)
    return _possible_shapes(host, host.free({}, allowed))


def _possible_shapes(host: _Host, allowed: list[str]) -> list[Shape]:
    return list(_memo(("possible", host.wiring(allowed)), lambda: _find_shapes(host, allowed)))


def _find_shapes(host: _Host, allowed: list[str]) -> list[Shape]:
    """A grid that fits holds every smaller grid: per row count, grow the columns until one
    does not fit (one failed search per row count)."""
    graph = host.graph(allowed)
    out = []
    for rows in range(1, len(allowed) + 1):
        cols = rows
        while rows * cols <= len(allowed) and embed.fits(graph, embed.pattern((rows, cols))):
            out.append((rows, cols))
            cols += 1
        if cols == rows:
            break  # no rows x rows grid: no grid with more rows either
    out = [s for s in out if not host.refusal(s, allowed)]
    return sorted(out, key=lambda s: (s[0] * s[1], s[0]))


def possible_sizes(inv: Inventory, allowed: list[str]) -> list[int]:
    """Chip counts some mesh of the host has."""
    return sorted({r * c for r, c in possible_shapes(inv, allowed)})


def _shapes_hint(host: _Host, allowed: list[str]) -> str:
    shapes = _possible_shapes(host, allowed)
    return "possible shapes: " + (", ".join(f"{r}x{c}" for r, c in shapes) or "none")


def _no_mesh(
    host: _Host, n: int, shape: Shape | None, allowed: list[str], full: Shape | None
) -> Exception:
    where = f"on this {full[0]}x{full[1]} host" if full else "on this host"
    what = f"mesh shape {shape[0]}x{shape[1]}" if shape else f"connected {n}-chip mesh"
    candidates = [shape] if shape else candidate_shapes(n)
    rules = {host.refusal(s, allowed) for s in candidates}
    why = f": {rules.pop()}" if len(rules) == 1 and None not in rules else ""
    return bad_input(
        f"tp-size {n}: no {what} {where} ({plural(len(allowed), 'chip')} available){why}",
        _shapes_hint(host, allowed),
    )


def check_connected(inv: Inventory, chips: list[Chip]) -> str | None:
    """For explicit --chips: None when they form a connected set, else the missing link."""
    graph = link_graph(inv)
    asics = [c.asic_id for c in chips]
    seen = {asics[0]}
    stack = [asics[0]]
    while stack:
        a = stack.pop()
        for b in graph[a]:
            if b in asics and b not in seen:
                seen.add(b)
                stack.append(b)
    missing = [c for c in chips if c.asic_id not in seen]
    if not missing:
        return None
    return f"{missing[0].label} has no Ethernet link to {', '.join(c.label for c in chips if c.asic_id in seen)}"


def as_given(inv: Inventory, chips: list[str]) -> Selection:
    """The chips a rank binding names, as they are: their mesh if they form one, else a line."""
    try:
        return select(inv, len(chips), chips=chips)
    except Exception:
        units = [u for u in units_of(inv) if u.chips[0] in chips]
        grid = {(0, i): a for i, a in enumerate(chips)}
        return Selection(
            shape=(1, len(chips)),
            grid=grid,
            order=list(grid),
            units=units,
            dim_types=("LINE", "LINE"),
            channels=0,
            pair_links={},
        )
