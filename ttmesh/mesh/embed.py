"""Mesh grids in a chip link graph: which R x C meshes a host has, as tt-metal maps them.

tt-metal's control plane (its topology mapper) maps a mesh graph descriptor's ``RxC`` device
grid onto the physical chips: grid neighbours must be linked chips, and in a RING dimension the
last and first chip of every line too. Channels bound the links a neighbour pair needs: with
STRICT ``count``, at least ``count`` links; with RELAXED, one (measured with ttnn 0.81.1 in
mock-cluster mode: a 2x2 with STRICT 1..4 fits four p150 cards cabled with 4 links per pair and
5 does not; tests/test_conformance_shapes.py pins it). Wormhole meshes whose dimensions are both
odd are refused unless 1x1 (tt-metal's ``mesh_graph.cpp``).

This module answers those questions exactly (a complete search, no sampling), and fast enough
to list every shape of a 32-chip Galaxy: chips are bits of an integer, candidates for a grid
cell are the chips linked to its already placed neighbours, a chip must have as many links as
its cell has neighbours, and a placed chip must keep enough free linked chips for its
unplaced neighbours. Mirror images of the grid are searched once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import cache

from ttmesh.dataclass import dataclass

Coord = tuple[int, int]
Shape = tuple[int, int]
DimTypes = tuple[str, str]
LINE_LINE: DimTypes = ("LINE", "LINE")


@dataclass(frozen=True)
class Pattern:
    """A grid to embed, as a placement order and the constraints of each step."""

    shape: Shape
    dim_types: DimTypes
    cells: tuple[Coord, ...]  # placement order
    earlier: tuple[tuple[int, ...], ...]  # per step: steps of its already placed neighbours
    degree: tuple[int, ...]  # per step: neighbours of the cell
    frontier: tuple[tuple[tuple[int, int], ...], ...]  # per step: (step, neighbours still to place)
    lower: tuple[tuple[int, ...], ...]  # per step: earlier steps whose chip must rank lower
    higher: tuple[tuple[int, ...], ...]  # per step: earlier steps whose chip must rank higher
    odd_ring: bool  # a RING dimension of odd length (an odd cycle)


def ring_dims(shape: Shape, dim_types: DimTypes) -> tuple[bool, bool]:
    """Which dimensions close a ring: RING and at least 3 long (shorter rings add no pair)."""
    return (
        dim_types[0] == "RING" and shape[0] >= 3,
        dim_types[1] == "RING" and shape[1] >= 3,
    )


def grid_edges(shape: Shape, dim_types: DimTypes = LINE_LINE) -> list[tuple[Coord, Coord]]:
    """Neighbour pairs of the grid, wrap-around pairs of its rings last."""
    rows, cols = shape
    edges = []
    for r in range(rows):
        for c in range(cols):
            if c + 1 < cols:
                edges.append(((r, c), (r, c + 1)))
            if r + 1 < rows:
                edges.append(((r, c), (r + 1, c)))
    ring_r, ring_c = ring_dims(shape, dim_types)
    if ring_r:
        edges += [((rows - 1, c), (0, c)) for c in range(cols)]
    if ring_c:
        edges += [((r, cols - 1), (r, 0)) for r in range(rows)]
    return edges


def _symmetry(shape: Shape, dim_types: DimTypes) -> list[tuple[Coord, Coord]]:
    """Pairs (a, b): the chip at a ranks below the chip at b. One embedding of each class of
    mirror images passes: (0, 0) holds the lowest corner, and a square is not also transposed."""
    rows, cols = shape
    corners = {(0, cols - 1), (rows - 1, 0), (rows - 1, cols - 1)} - {(0, 0)}
    pairs = [((0, 0), corner) for corner in sorted(corners)]
    if rows == cols >= 2 and dim_types[0] == dim_types[1]:
        pairs.append(((0, 1), (1, 0)))
    return pairs


@cache
def pattern(shape: Shape, dim_types: DimTypes = LINE_LINE) -> Pattern:
    """The search plan for a grid: anti-diagonals out from the corner (0, 0), so every cell
    after the first has a placed neighbour and each square of the grid closes early."""
    rows, cols = shape
    cells = sorted(
        ((r, c) for r in range(rows) for c in range(cols)),
        key=lambda rc: (rc[0] + rc[1], rc[1] if cols > rows else rc[0]),
    )
    step = {cell: i for i, cell in enumerate(cells)}
    nbrs: dict[Coord, list[Coord]] = {cell: [] for cell in cells}
    for a, b in grid_edges(shape, dim_types):
        nbrs[a].append(b)
        nbrs[b].append(a)
    earlier = tuple(
        tuple(step[n] for n in nbrs[cell] if step[n] < i) for i, cell in enumerate(cells)
    )
    # frontier[i]: each placed cell z <= i with neighbours still unplaced after step i, and
    # how many. A cell waits from its own step until its last neighbour's: walking only those
    # steps keeps this linear in the cells (a 128-chip grid's every pair was a launch's 4%).
    frontier: list[list[tuple[int, int]]] = [[] for _ in cells]
    for z, cell in enumerate(cells):
        later = [step[n] for n in nbrs[cell] if step[n] > z]
        for i in range(z, max(later, default=z)):
            frontier[i].append((z, sum(s > i for s in later)))
    lower: list[list[int]] = [[] for _ in cells]
    higher: list[list[int]] = [[] for _ in cells]
    for a, b in _symmetry(shape, dim_types):
        if step[a] < step[b]:
            lower[step[b]].append(step[a])
        else:
            higher[step[a]].append(step[b])
    return Pattern(
        shape=shape,
        dim_types=dim_types,
        cells=tuple(cells),
        earlier=earlier,
        degree=tuple(len(nbrs[cell]) for cell in cells),
        frontier=tuple(tuple(waiting) for waiting in frontier),
        lower=tuple(tuple(x) for x in lower),
        higher=tuple(tuple(x) for x in higher),
        odd_ring=any(
            ring and size % 2 for ring, size in zip(ring_dims(shape, dim_types), shape, strict=True)
        ),
    )


@dataclass(frozen=True)
class Graph:
    """Chips 0..n-1 (in order of preference) and, per chip, the bit mask of its linked chips."""

    adj: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.adj)

    def with_degree(self, d: int) -> int:
        """The chips with at least ``d`` linked chips."""
        return sum(1 << i for i, m in enumerate(self.adj) if m.bit_count() >= d)

    @property
    def bipartite(self) -> bool:
        """Two-colourable (every cycle even): true of grids and tori of even rings."""
        colour: dict[int, int] = {}
        for start in range(self.size):
            if start in colour:
                continue
            colour[start] = 0
            stack = [start]
            while stack:
                a = stack.pop()
                for b in _bits(self.adj[a]):
                    if b not in colour:
                        colour[b] = 1 - colour[a]
                        stack.append(b)
                    elif colour[b] == colour[a]:
                        return False
        return True


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def graph_of(
    links: Mapping[str, Mapping[str, int]], chips: Sequence[str], min_links: int = 1
) -> Graph:
    """The link graph over ``chips`` (in that order), keeping pairs with >= ``min_links`` links."""
    index = {a: i for i, a in enumerate(chips)}
    adj = []
    for a in chips:
        mask = 0
        for b, count in links.get(a, {}).items():
            if b in index and b != a and count >= min_links:
                mask |= 1 << index[b]
        adj.append(mask)
    return Graph(tuple(adj))


def _impossible(g: Graph, pat: Pattern) -> bool:
    """Quick proofs that no embedding exists: too few chips, too few well-linked chips (for
    every k, as many chips with k links as cells with k neighbours), an odd ring in a graph
    without odd cycles."""
    if len(pat.cells) > g.size:
        return True
    have = sorted((m.bit_count() for m in g.adj), reverse=True)
    need = sorted(pat.degree, reverse=True)
    if any(n > h for n, h in zip(need, have, strict=False)):
        return True
    return pat.odd_ring and g.bipartite


def embeddings(
    g: Graph, pat: Pattern, budget: int | None = None, domains: Sequence[int] | None = None
) -> Iterator[list[int]]:
    """Every embedding of the pattern (one per mirror class): chip index per step, earlier
    chips (in the graph's order) tried first. Exhaustive, so no embedding means none exists,
    unless ``budget`` bounds the chips tried (then it stops early, and proves nothing).

    ``domains``: per step, the bit mask of the chips its cell may hold (a mesh over several
    hosts: each block of cells on its own host). Mirror images then differ, so every one is
    searched."""
    if _impossible(g, pat):
        return
    if domains is not None and any(d == 0 for d in domains):
        return
    n = len(pat.cells)
    everyone = (1 << g.size) - 1
    by_degree = {d: g.with_degree(d) for d in set(pat.degree)}
    chip = [0] * n
    tried = [0]

    def place(i: int, used: int) -> Iterator[list[int]]:
        if i == n:
            yield list(chip)
            return
        cand = everyone & ~used & by_degree[pat.degree[i]]
        for j in pat.earlier[i]:
            cand &= g.adj[chip[j]]
        if domains is not None:
            cand &= domains[i]
        else:
            for j in pat.lower[i]:
                cand &= ~((2 << chip[j]) - 1)
            for j in pat.higher[i]:
                cand &= (1 << chip[j]) - 1
        for p in _bits(cand):
            tried[0] += 1
            if budget is not None and tried[0] > budget:
                return
            chip[i] = p
            free = everyone & ~(used | 1 << p)
            # Every placed cell keeps enough free linked chips for its neighbours to come.
            if any((g.adj[chip[z]] & free).bit_count() < need for z, need in pat.frontier[i]):
                continue
            yield from place(i + 1, used | 1 << p)

    yield from place(0, 0)


def fits(g: Graph, pat: Pattern) -> bool:
    return next(embeddings(g, pat), None) is not None


def tt_metal_refuses(shape: Shape, arch: str) -> str | None:
    """tt-metal's own rule on shapes, before any mapping: why it refuses ``shape``, or None."""
    rows, cols = shape
    if arch.startswith("wormhole") and rows % 2 and cols % 2 and (rows, cols) != (1, 1):
        return "tt-metal maps no Wormhole mesh whose dimensions are both odd, except 1x1"
    return None
