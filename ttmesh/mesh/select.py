"""Choosing chips: a connected sub-mesh of the requested shape, and the order of its ranks.

Input is what discovery found (chips and their Ethernet links), never the stock system files.
A mesh of shape RxC is an embedding of the RxC grid into the link graph: grid neighbours must be
linked chips. Among the embeddings that avoid unavailable chips (dead, held, leased by another
job, excluded), the best has the most links between its weakest neighbour pair, spans the
fewest boards and comes first in PCI order.

Ranks follow the ring when the hardware closes one (consecutive ranks are linked, so a ring
all-reduce runs over real links); mesh coordinates are row-major.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from ttmesh.errors import bad_input
from ttmesh.fabric.devices import Chip, Inventory

Coord = tuple[int, int]
MAX_EMBEDDINGS = 400


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
    shape: tuple[int, int]
    grid: dict[Coord, str]  # coordinate -> asic id
    order: list[Coord]  # rank order over coordinates (ring or snake)
    units: list[Unit]  # the units, in rank order of their first chip
    dim_types: tuple[str, str]
    channels: int  # fewest links between grid neighbours
    pair_links: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def chips(self) -> list[str]:
        return [self.grid[c] for c in self.order]

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


def candidate_shapes(n: int, full: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """Shapes of n chips, most square first, rows <= cols; the whole host keeps its own shape
    (8x4 for a whole Galaxy, but 2x4 for 8 of its chips, as on a T3K)."""
    shapes = [(r, n // r) for r in range(1, n + 1) if n % r == 0]
    shapes.sort(key=lambda s: (s != full, max(s) / min(s), s[0] > s[1]))
    return shapes


def _embeddings(
    graph: dict[str, Counter], shape: tuple[int, int], allowed: list[str]
) -> Iterator[dict[Coord, str]]:
    rows, cols = shape
    cells = [(r, c) for r in range(rows) for c in range(cols)]
    allowed_set = set(allowed)
    rank = {a: i for i, a in enumerate(allowed)}
    grid: dict[Coord, str] = {}
    used: set[str] = set()

    def place(i: int) -> Iterator[dict[Coord, str]]:
        if i == len(cells):
            yield dict(grid)
            return
        r, c = cells[i]
        constraints = [grid[p] for p in ((r, c - 1), (r - 1, c)) if p in grid]
        if constraints:
            options = set(graph[constraints[0]]) & allowed_set
            for other in constraints[1:]:
                options &= set(graph[other])
        else:
            options = allowed_set
        for asic in sorted(options - used, key=rank.__getitem__):
            grid[(r, c)] = asic
            used.add(asic)
            yield from place(i + 1)
            del grid[(r, c)]
            used.discard(asic)

    yield from place(0)


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


def _dim_types(
    graph: dict[str, Counter], grid: dict[Coord, str], shape: tuple[int, int]
) -> tuple[str, str]:
    rows, cols = shape
    ring_rows = rows >= 3 and all(grid[(0, c)] in graph[grid[(rows - 1, c)]] for c in range(cols))
    ring_cols = cols >= 3 and all(grid[(r, 0)] in graph[grid[(r, cols - 1)]] for r in range(rows))
    return ("RING" if ring_rows else "LINE", "RING" if ring_cols else "LINE")


def _neighbour_pairs(shape: tuple[int, int]) -> list[tuple[Coord, Coord]]:
    rows, cols = shape
    pairs = []
    for r in range(rows):
        for c in range(cols):
            if c + 1 < cols:
                pairs.append(((r, c), (r, c + 1)))
            if r + 1 < rows:
                pairs.append(((r, c), (r + 1, c)))
    return pairs


def full_shape(inv: Inventory) -> tuple[int, int] | None:
    """The mesh the whole host forms, if any (e.g. 2x2 on a QuietBox 2, 8x4 on a Galaxy)."""
    n = len(inv.chips)
    graph = link_graph(inv)
    allowed = [c.asic_id for c in inv.chips]
    shapes = [(r, n // r) for r in range(1, n + 1) if n % r == 0]
    galaxy = any(c.board_type.startswith("galaxy") for c in inv.chips)
    shapes.sort(key=lambda s: (max(s) / min(s), (s[0] < s[1]) if galaxy else (s[0] > s[1])))
    for shape in shapes:
        if n == 1 or next(_embeddings(graph, shape, allowed), None) is not None:
            return shape
    return None


def select(
    inv: Inventory,
    n: int,
    *,
    shape: tuple[int, int] | None = None,
    unavailable: dict[str, str] | None = None,
    chips: list[str] | None = None,
) -> Selection:
    """Choose ``n`` chips forming a connected mesh. ``unavailable`` maps asic -> why not.

    ``chips``: the user's explicit choice (asic ids), used as is and in that order of preference.
    """
    unavailable = unavailable or {}
    graph = link_graph(inv)
    units = units_of(inv)
    unit_of = {a: u for u in units for a in u.chips}
    unit_size = max((u.size for u in units), default=1)
    order_key = {c.asic_id: i for i, c in enumerate(inv.chips)}
    if chips is not None:
        allowed = sorted(chips, key=order_key.__getitem__)
    else:
        allowed = [c.asic_id for c in inv.chips if c.asic_id not in unavailable]
    if n % unit_size:
        raise bad_input(
            f"tp-size {n}: chips on this host come in boards of {unit_size} (a process drives "
            f"a whole {inv.chips[0].board_type} board)",
            "possible: " + (", ".join(map(str, possible_sizes(inv, allowed))) or "none"),
        )
    if n > len(allowed):
        free = len(allowed)
        why = Counter(unavailable.values())
        detail = ", ".join(f"{k} {v}" for k, v in why.items())
        sizes = possible_sizes(inv, allowed)
        raise bad_input(
            f"tp-size {n}: only {free} of {len(inv.chips)} chips are free"
            + (f" ({detail} unavailable)" if detail else ""),
            ("possible: " + ", ".join(map(str, sizes)))
            if sizes
            else "wait for the chips to be free",
        )
    full = full_shape(inv)
    shapes = [shape] if shape else candidate_shapes(n, full)
    for sh in shapes:
        best = _best_embedding(graph, sh, allowed, n, unit_of, order_key, inv, full)
        if best is not None:
            return best
    return _fail(inv, n, shape, allowed, graph, unit_of, order_key)


def fits(shape: tuple[int, int], full: tuple[int, int] | None) -> bool:
    """A sub-mesh must be a block of the host's own mesh (a 1x3 line is no part of a 2x2)."""
    if full is None:
        return True
    (r, c), (fr, fc) = shape, full
    return (r <= fr and c <= fc) or (r <= fc and c <= fr)


def _best_embedding(
    graph, shape, allowed, n, unit_of, order_key, inv, full=None
) -> Selection | None:
    if shape[0] * shape[1] != n or not fits(shape, full):
        return None
    best: tuple | None = None
    best_grid = None
    pairs = _neighbour_pairs(shape)
    boards = {c.asic_id: c.board_id for c in inv.chips}
    for count, grid in enumerate(_embeddings(graph, shape, allowed)):
        if count >= MAX_EMBEDDINGS:
            break
        chosen = set(grid.values())
        if any(a in unit_of and not set(unit_of[a].chips) <= chosen for a in chosen):
            continue  # a board must be taken whole
        weakest = min((graph[grid[a]][grid[b]] for a, b in pairs), default=0)
        score = (
            -weakest,
            len({boards[a] for a in chosen}),
            sorted(order_key[a] for a in chosen),
        )
        if best is None or score < best:
            best, best_grid = score, grid
    if best_grid is None:
        return None
    return _selection(graph, shape, best_grid, unit_of, pairs)


def _selection(graph, shape, grid, unit_of, pairs) -> Selection:
    order = ring_order(shape)
    units: list[Unit] = []
    for coord in order:
        unit = unit_of.get(grid[coord])
        if unit is not None and unit not in units:
            units.append(unit)
    dim_types = _dim_types(graph, grid, shape)
    rows, cols = shape
    # A RING dimension's wrap-around pairs are neighbours too: they count for the channels.
    if dim_types[0] == "RING":
        pairs = [*pairs, *(((rows - 1, c), (0, c)) for c in range(cols))]
    if dim_types[1] == "RING":
        pairs = [*pairs, *(((r, cols - 1), (r, 0)) for r in range(rows))]
    pair_links = {}
    for a, b in pairs:
        key = tuple(sorted((grid[a], grid[b])))
        pair_links[key] = graph[grid[a]][grid[b]]
    channels = min(pair_links.values(), default=0)
    return Selection(
        shape=shape,
        grid=grid,
        order=order,
        units=units,
        dim_types=dim_types,
        channels=channels,
        pair_links=pair_links,
    )


def possible_sizes(inv: Inventory, allowed: list[str]) -> list[int]:
    graph = link_graph(inv)
    units = units_of(inv)
    unit_of = {a: u for u in units for a in u.chips}
    order_key = {c.asic_id: i for i, c in enumerate(inv.chips)}
    full = full_shape(inv)
    sizes = []
    for k in range(1, len(allowed) + 1):
        for sh in candidate_shapes(k, full):
            if _best_embedding(graph, sh, allowed, k, unit_of, order_key, inv, full) is not None:
                sizes.append(k)
                break
    return sizes


def _fail(inv, n, shape, allowed, graph, unit_of, order_key):
    sizes = possible_sizes(inv, allowed)
    full = full_shape(inv)
    host = f"{full[0]}x{full[1]} " if full else ""
    what = f"mesh shape {shape[0]}x{shape[1]}" if shape else f"connected {n}-chip sub-mesh"
    raise bad_input(
        f"tp-size {n}: no {what} on this {host}host ({len(allowed)} chips available)",
        "possible: " + (", ".join(map(str, sizes)) or "none"),
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
