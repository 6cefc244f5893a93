"""How a selected mesh is split over processes, and the descriptors each layout needs.

Layouts (``--mesh-layout``):

* ``isolated`` - every worker its own unit (chip, or n300 board) as its own one-unit mesh; the
  seed's one-chip recipe. Workers are separate tt-metal worlds.
* ``single-process`` - one worker drives every selected chip (``host_topology`` 1x1).
* ``mesh`` - one mesh, split over the workers by ``host_topology``: every worker has
  ``TT_MESH_ID=0`` and its own ``TT_MESH_HOST_RANK`` (the row-major index of its block).
* ``multi-mesh`` - one mesh per worker, joined in a FABRIC graph: ``TT_MESH_ID`` = the rank's
  mesh, ``TT_MESH_HOST_RANK=0``.

The last two form one tt-metal world only when every process starts under MPI.

A *block* is the rectangle of mesh coordinates one worker drives. Blocks tile the mesh; ranks
follow the ring over blocks (consecutive ranks neighbours), host ranks are row-major.

A mesh over several hosts (``host_of``: chip -> host index) keeps every block on one host, and
numbers the ranks host by host (node-major, as torchrun and tt-run do), the ring order within a
host; ``TT_MESH_HOST_RANK`` stays the block's row-major place in the whole mesh.
"""

from __future__ import annotations

from collections import Counter

from ttmesh.dataclass import dataclass
from ttmesh.errors import bad_input
from ttmesh.fabric.devices import Inventory
from ttmesh.host import boards as boardfacts
from ttmesh.mesh import descriptor as mgd
from ttmesh.mesh.select import Coord, Selection, Unit, ring_order
from ttmesh.render import plural
from ttmesh.vocab import LAYOUTS, Layout


@dataclass(frozen=True)
class Block:
    """The part of the mesh one rank drives."""

    rank: int
    origin: Coord  # top-left coordinate in the mesh
    shape: tuple[int, int]
    host_coord: Coord  # position in the host topology grid
    host_rank: int  # row-major index in the host topology
    coords: tuple[Coord, ...]  # row-major
    chips: tuple[str, ...]  # asic ids, row-major
    units: tuple[Unit, ...]

    @property
    def bdfs(self) -> tuple[str, ...]:
        return tuple(u.bdf for u in self.units)


@dataclass
class Split:
    """A selected mesh split over processes: a block per rank."""

    layout: str
    host_dims: tuple[int, int]  # blocks per mesh row/col (mesh layout's host_topology)
    blocks: list[Block]  # in rank order


def _block_shapes(shape: tuple[int, int], count: int) -> list[tuple[int, int]]:
    rows, cols = shape
    cells = rows * cols // count
    out = []
    for br in range(1, rows + 1):
        if rows % br or cells % br:
            continue
        bc = cells // br
        if bc <= cols and cols % bc == 0:
            out.append((br, bc))
    # Prefer whole rows (wide blocks): host_topology grows along the rows first.
    return sorted(out, key=lambda s: (-s[1], s[0]))


def split(
    sel: Selection,
    layout: str,
    nproc: int | None = None,
    host_of: dict[str, int] | None = None,
) -> Split:
    """Cut the selection into one block per worker (``host_of``: no block spans two hosts)."""
    if layout not in LAYOUTS:
        raise bad_input(f"unknown mesh layout {layout!r}", "one of " + ", ".join(LAYOUTS))
    rows, cols = sel.shape
    unit_of = {a: u for u in sel.units for a in u.chips}
    if layout == Layout.SINGLE_PROCESS:
        if nproc not in (None, 1):
            raise bad_input(f"--mesh-layout single-process runs one worker, not {nproc}")
        count = 1
    elif layout == Layout.ISOLATED:
        if nproc not in (None, len(sel.units)):
            raise bad_input(
                f"--mesh-layout isolated runs one worker per {'board' if sel.units[0].size > 1 else 'chip'} "
                f"({len(sel.units)}), not {nproc}",
                "use --mesh-layout mesh or multi-mesh to give workers several chips",
            )
        count = len(sel.units)
    else:
        count = nproc or len(sel.units)
    if count < 1 or (rows * cols) % count:
        raise bad_input(
            f"{plural(count, 'worker')} cannot share a {rows}x{cols} mesh equally",
            "use a worker count that divides the chip count",
        )
    shapes = _block_shapes(sel.shape, count)
    for bshape in shapes:
        blocks = _tile(sel, bshape, unit_of, host_of)
        if blocks is not None:
            return Split(layout, (rows // bshape[0], cols // bshape[1]), blocks)
    where = " on one host each" if host_of else ""
    raise bad_input(
        f"{plural(count, 'worker')}: no way to split the {rows}x{cols} mesh into equal blocks{where} that "
        "keep each board whole",
        f"workers on this mesh: {', '.join(str(n) for n in possible_worker_counts(sel, host_of))}",
    )


def possible_worker_counts(sel: Selection, host_of: dict[str, int] | None = None) -> list[int]:
    unit_of = {a: u for u in sel.units for a in u.chips}
    n = sel.shape[0] * sel.shape[1]
    return [
        k
        for k in range(1, n + 1)
        if n % k == 0 and any(_tile(sel, s, unit_of, host_of) for s in _block_shapes(sel.shape, k))
    ]


def _tile(
    sel: Selection,
    bshape: tuple[int, int],
    unit_of: dict[str, Unit],
    host_of: dict[str, int] | None = None,
) -> list[Block] | None:
    rows, cols = sel.shape
    br, bc = bshape
    hr, hc = rows // br, cols // bc
    in_mesh = set(sel.grid.values())  # a board's other chips may be idle (a 1x1 on an n300)
    blocks_by_host: dict[Coord, Block] = {}
    for i in range(hr):
        for j in range(hc):
            coords = tuple((i * br + r, j * bc + c) for r in range(br) for c in range(bc))
            chips = tuple(sel.grid[c] for c in coords)
            if host_of is not None and len({host_of[a] for a in chips}) > 1:
                return None  # a worker runs on one host
            units: list[Unit] = []
            for a in chips:
                unit = unit_of[a]
                if not set(unit.chips) & in_mesh <= set(chips):
                    return None  # a board would be split between two workers
                if unit not in units:
                    units.append(unit)
            blocks_by_host[(i, j)] = Block(
                rank=-1,
                origin=coords[0],
                shape=bshape,
                host_coord=(i, j),
                host_rank=i * hc + j,
                coords=coords,
                chips=chips,
                units=tuple(units),
            )
    ring = ring_order((hr, hc))
    if host_of is not None:  # node-major: host by host, the ring order within each
        ring.sort(key=lambda place: host_of[blocks_by_host[place].chips[0]])
        per_host = Counter(host_of[b.chips[0]] for b in blocks_by_host.values())
        if len(set(per_host.values())) > 1:
            return None  # every host runs as many workers
    ordered = []
    for rank, place in enumerate(ring):
        b = blocks_by_host[place]
        ordered.append(
            Block(rank, b.origin, b.shape, b.host_coord, b.host_rank, b.coords, b.chips, b.units)
        )
    return ordered


# --------------------------------------------------------------------------- descriptors


def _arch(inv: Inventory, sel: Selection) -> str:
    return boardfacts.ARCHS[inv.chip(sel.chips[0]).arch].mgd_name


def _links_between(sel: Selection, a: Block, b: Block) -> int:
    chips_b = set(b.chips)
    total = 0
    for (x, y), count in sel.pair_links.items():
        if (x in a.chips and y in chips_b) or (y in a.chips and x in chips_b):
            total += count
    return total


def _block_channels(sel: Selection, block: Block) -> int:
    """STRICT channels of a block's mesh: the fewest links of any linked pair among its chips,
    as tt-metal checks them on whatever placement it finds (``ttmesh.mesh.placement``)."""
    links = sel.chip_links or sel.pair_links
    inside = [count for (x, y), count in links.items() if x in block.chips and y in block.chips]
    return min(inside) if inside else 1


def descriptors(
    inv: Inventory, sel: Selection, sp: Split, strict: bool, all_links: dict | None = None
) -> tuple[dict[str, str], dict[int, str]]:
    """({file name: text}, {rank: file name}) for the split.

    Channels: the fewest links between neighbours; RELAXED unless ``strict`` (STRICT is what
    tests and conformance use: RELAXED hides missing links).
    """
    policy = "STRICT" if strict else "RELAXED"
    arch = _arch(inv, sel)
    names: dict[str, str] = {}
    of_rank: dict[int, str] = {}
    if sp.layout == Layout.ISOLATED:
        for b in sp.blocks:
            spec = mgd.MeshSpec(
                "M0",
                arch,
                b.shape,
                channels=_block_channels(sel, b) if len(b.chips) > 1 else 1,
                policy=policy if len(b.chips) > 1 else "RELAXED",
            )
            name = f"rank{b.rank}.textproto"
            names[name] = mgd.to_text(
                mgd.single_mesh(spec), f"ttmesh: rank {b.rank}'s chips ({', '.join(b.chips)})"
            )
            of_rank[b.rank] = name
        return names, of_rank
    if sp.layout in (Layout.SINGLE_PROCESS, Layout.MESH):
        spec = mgd.MeshSpec(
            "M0",
            arch,
            sel.shape,
            sel.dim_types,
            sp.host_dims if sp.layout == "mesh" else (1, 1),
            max(sel.channels, 1),
            policy,
        )
        rows, cols = sel.shape
        comment = f"ttmesh: {rows}x{cols} mesh of {', '.join(sel.chips)}"
        if sp.layout == "mesh":
            comment += (
                f"\nsplit over {plural(len(sp.blocks), 'process', 'processes')}, host_topology "
                f"{sp.host_dims[0]}x{sp.host_dims[1]}"
            )
        names["mesh.textproto"] = mgd.to_text(mgd.single_mesh(spec), comment)
        return names, {b.rank: "mesh.textproto" for b in sp.blocks}
    # multi-mesh: one mesh per block, joined where the hardware links them
    bshape = sp.blocks[0].shape
    inner = min((_block_channels(sel, b) for b in sp.blocks), default=1)
    spec = mgd.MeshSpec(
        "M0", arch, bshape, channels=inner if len(sp.blocks[0].chips) > 1 else 1, policy=policy
    )
    # ttnn 0.81.1 in mock mode binds no intermesh connection between Blackhole chips ("Found 0
    # intermesh connections, but 4 were requested" on a QuietBox 2), while Wormhole (T3K) binds
    # them: connections are STRICT only where tt-metal can check them.
    conn_policy = "RELAXED" if arch == "BLACKHOLE" else policy
    connections = []
    for i, a in enumerate(sp.blocks):
        for b in sp.blocks[i + 1 :]:
            count = _links_between(sel, a, b)
            if count:
                connections.append(mgd.Connection(a.rank, b.rank, count, conn_policy))
    graph = mgd.MeshGraph([spec], [("M0", b.rank) for b in sp.blocks], connections)
    names["mesh.textproto"] = mgd.to_text(
        graph, f"ttmesh: {len(sp.blocks)} meshes of {bshape[0]}x{bshape[1]} in one FABRIC graph"
    )
    return names, {b.rank: "mesh.textproto" for b in sp.blocks}


def mesh_ids(sp: Split, block: Block) -> tuple[int, int]:
    """(TT_MESH_ID, TT_MESH_HOST_RANK) of a block's worker."""
    if sp.layout == "multi-mesh":
        return block.rank, 0
    if sp.layout == "mesh":
        return 0, block.host_rank
    return 0, 0
