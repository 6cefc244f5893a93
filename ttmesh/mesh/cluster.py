"""One mesh over several hosts: every host's chips, joined by the cables between the hosts.

Each host reports what discovery finds there: its chips, the links between them and, for every
cable to another host, a link to a remote device named by the peer chip's unique id (as tt-umd
writes ``ethernet_connections_to_remote_devices``). :func:`join` turns the reports into one link
graph over every chip; a mesh is then chosen on it as on one host (``mesh.select``), with one
more rule: **the hosts tile the mesh**. Each host drives one rectangle (its place in a host
grid), so ``host_topology`` can split the mesh over processes that each stay on their host, and
the ranks can be numbered host by host.

Which host goes where is chosen from the wiring, not from the order the hosts were named in:
the placement that is tried first is the given order, then the others. :func:`check_host_ranks`
is the reverse question for a plan that fixes the host ranks itself (a tt-run rank binding):
whether the hosts it makes neighbours in the host grid are cabled at all.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from typing import Any

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.fabric.devices import Inventory, LinkSpec
from ttmesh.host import boards as boardfacts
from ttmesh.host import clusterdesc as cdm
from ttmesh.mesh import embed
from ttmesh.mesh import select as meshselect
from ttmesh.mesh.embed import Coord, Shape
from ttmesh.render import plural

MAX_PLACEMENTS = 720  # host placements tried per shape (every one for up to 6 hosts)


@dataclass
class HostView:
    """One host of the job as its report shows it."""

    name: str  # how mpirun reaches it (an entry of --hosts)
    inv: Inventory  # its chips and links (PCI addresses are that host's own)
    mock: cdm.ClusterDescriptor | None = None  # simulated: what tt-metal maps in mock mode
    hostname: str = ""  # what the host calls itself
    # Links down between its chips, as its own pre-flight words them: (what, fix, chips).
    links_down: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)
    # Its ends of the cables to other hosts, as it reads them (recovery.cables.CableEnd, JSON).
    cable_ends: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Cluster:
    hosts: list[HostView]
    inv: Inventory  # every chip: links within hosts, and the cables between them
    host_of: dict[str, int]  # asic -> host index
    cables: list[LinkSpec] = field(default_factory=list)

    def chips_of(self, index: int) -> list[str]:
        return [c.asic_id for c in self.hosts[index].inv.chips]

    def name_of(self, asic: str) -> str:
        return self.hosts[self.host_of[asic]].name


@dataclass(frozen=True)
class HostGrid:
    """How the hosts tile the mesh: ``dims`` hosts per mesh row/column, each a ``block``."""

    dims: tuple[int, int]
    block: tuple[int, int]
    place: dict[int, Coord]  # host index -> its position in the host grid


def _remote_links(view: HostView) -> list[tuple[str, int, str, int]]:
    """(local asic, chan, peer asic, peer chan) for every cable this host's topology shows."""
    cd = view.inv.descriptor
    if cd is None:
        return []
    ids = {c.id: c.asic_id for c in cd.chips.values()}
    out = []
    for r in cd.remote_links:
        local = ids.get(r.chip)
        if local is not None:
            out.append((local, r.chan, format(r.remote_unique_id, "016x"), r.remote_chan))
    return out


def join(hosts: list[HostView]) -> Cluster:
    """The hosts' chips as one inventory, their cables as links (each cable once)."""
    host_of: dict[str, int] = {}
    chips = []
    for i, view in enumerate(hosts):
        for chip in view.inv.chips:
            if chip.asic_id in host_of:
                other = hosts[host_of[chip.asic_id]].name
                raise bad_input(
                    f"hosts {other} and {view.name} both report chip {chip.asic_id}",
                    "name each host once (two names for one machine?)",
                )
            host_of[chip.asic_id] = i
            chips.append(chip)
    links = [lk for view in hosts for lk in view.inv.links]
    cables: list[LinkSpec] = []
    seen: set[frozenset] = set()
    for i, view in enumerate(hosts):
        for a, ca, b, cb in _remote_links(view):
            if host_of.get(b, i) == i:
                continue  # a cable to a machine outside the job (or a host naming itself)
            key = frozenset({(a, ca), (b, cb)})
            if key not in seen:
                seen.add(key)
                cables.append(LinkSpec(a, ca, b, cb))
    first = hosts[0].inv
    inv = Inventory(
        host=first.host,
        driver=first.driver,
        chips=chips,
        links=links + cables,
        topology="hosts",
        missing=[a for view in hosts for a in view.inv.missing],
        notes=[n for view in hosts for n in view.inv.notes],
        beats={k: v for view in hosts for k, v in view.inv.beats.items()},
    )
    return Cluster(hosts, inv, host_of, cables)


# --------------------------------------------------------------------------- choosing a mesh


def _host_grids(shape: Shape, count: int) -> list[tuple[int, int]]:
    """Host grids (hosts per mesh row, per mesh column) that divide ``shape``: hosts side by
    side along the longer dimension first."""
    rows, cols = shape
    out = [
        (hr, count // hr)
        for hr in range(1, count + 1)
        if count % hr == 0 and rows % hr == 0 and cols % (count // hr) == 0
    ]
    return sorted(out, key=lambda d: (d[0] > d[1]) == (cols >= rows))


def _placements(count: int) -> list[tuple[int, ...]]:
    """Which host takes which grid position, the given order first."""
    first = tuple(range(count))
    rest = itertools.islice(itertools.permutations(range(count)), MAX_PLACEMENTS)
    return [first, *(p for p in rest if p != first)]


def select(
    cluster: Cluster,
    n: int,
    *,
    shape: Shape | None = None,
    unavailable: dict[str, str] | None = None,
) -> tuple[meshselect.Selection, HostGrid]:
    """``n`` chips forming one mesh whose hosts each drive one rectangle of it (an equal share)."""
    count = len(cluster.hosts)
    if n % count:
        raise bad_input(
            f"tp-size {n}: {count} hosts share a mesh equally",
            f"give a multiple of {count} (each host drives as many chips)",
        )
    share = n // count
    host = meshselect._Host.of(cluster.inv)
    allowed = host.free(unavailable or {}, None)
    free_on = Counter(cluster.host_of[a] for a in allowed)
    for i, view in enumerate(cluster.hosts):
        if free_on[i] < share:
            raise bad_input(
                f"tp-size {n}: host {view.name} has {plural(free_on[i], 'free chip')}, its share is "
                f"{share}",
                "every host drives as many chips: see ttmesh ls on that host",
            )
    index = {a: k for k, a in enumerate(allowed)}
    masks = [sum(1 << index[a] for a in allowed if cluster.host_of[a] == i) for i in range(count)]
    shapes = [shape] if shape else meshselect.candidate_shapes(n)
    for sh in shapes:
        if embed.tt_metal_refuses(sh, host.arch):
            continue
        found = _search(host, cluster, sh, allowed, masks, count)
        if found is not None:
            return found
    what = f"mesh shape {shape[0]}x{shape[1]}" if shape else f"{n}-chip mesh"
    raise bad_input(
        f"tp-size {n}: no {what} over these {count} hosts in which each host drives one block "
        "of it",
        "check the cables between the hosts (ttmesh ls on each), or another --mesh-shape",
    )


def _search(
    host: meshselect._Host,
    cluster: Cluster,
    shape: Shape,
    allowed: list[str],
    masks: list[int],
    count: int,
) -> tuple[meshselect.Selection, HostGrid] | None:
    levels = host.link_levels(allowed) or [1]
    for dims in _host_grids(shape, count):
        block = (shape[0] // dims[0], shape[1] // dims[1])
        positions = [(i, j) for i in range(dims[0]) for j in range(dims[1])]
        for min_links in levels:
            graph = host.graph(allowed, min_links)
            for dim_types in meshselect._ring_options(shape):
                pat = embed.pattern(shape, dim_types)
                for placement in _placements(count):
                    at = {positions[k]: h for k, h in enumerate(placement)}
                    domains = [masks[at[(r // block[0], c // block[1])]] for r, c in pat.cells]
                    found = next(
                        embed.embeddings(
                            graph, pat, budget=meshselect.SEARCH_BUDGET, domains=domains
                        ),
                        None,
                    )
                    if found is None:
                        continue
                    grid = dict(zip(pat.cells, (allowed[k] for k in found), strict=True))
                    sel = meshselect._selection(host, shape, dim_types, grid)
                    place = {h: positions[k] for k, h in enumerate(placement)}
                    return sel, HostGrid(dims, block, place)
    return None


# --------------------------------------------------------------------------- the wiring


def merged_descriptor(cluster: Cluster) -> cdm.ClusterDescriptor:
    """Every host's mock cluster as one descriptor (chip ids renumbered host after host), the
    cables between hosts of the job as links: :func:`ttmesh.mesh.mock.chips_view` of it is what a
    rank of a mesh over several hosts maps in mock mode (other ranks' chips, on this host or
    another, as remote devices)."""
    chips: dict[int, cdm.CDChip] = {}
    links: list[cdm.Link] = []
    remote: list[cdm.RemoteLink] = []
    boards: list[cdm.Board] = []
    uid_to_new: dict[int, int] = {}
    offset = 0
    parts = []
    for view in cluster.hosts:
        cd = view.mock or view.inv.descriptor
        if cd is None:
            raise bad_input(f"host {view.name} reported no topology", "see ttmesh ls on that host")
        new = {cid: offset + k for k, cid in enumerate(sorted(cd.chips))}
        offset += len(cd.chips)
        for cid, chip in cd.chips.items():
            chips[new[cid]] = replace(chip, id=new[cid])
            if chip.unique_id is not None:
                uid_to_new[chip.unique_id] = new[cid]
        links += [cdm.Link(new[lk.chip_a], lk.chan_a, new[lk.chip_b], lk.chan_b) for lk in cd.links]
        boards += [
            cdm.Board(b.board_id, b.board_type, tuple(new[c] for c in b.chips)) for b in cd.boards
        ]
        parts.append((cd, new))
    seen: set[frozenset] = set()
    for cd, new in parts:
        for r in cd.remote_links:
            if r.remote_unique_id not in uid_to_new:
                remote.append(replace(r, chip=new[r.chip]))
                continue
            a, b = (new[r.chip], r.chan), (uid_to_new[r.remote_unique_id], r.remote_chan)
            if frozenset({a, b}) not in seen:
                seen.add(frozenset({a, b}))
                links.append(cdm.Link(*a, *b))
    first = parts[0][0]
    return cdm.ClusterDescriptor(
        chips=dict(sorted(chips.items())),
        links=links,
        remote_links=remote,
        boards=boards,
        io_device_type=first.io_device_type,
    )


def check_host_ranks(
    cluster: Cluster, host_dims: tuple[int, int], ranks: list[tuple[int, int, list[str]]]
) -> str | None:
    """For ranks that fix their own host ranks (rank, mesh host rank, chips): None when every
    pair of host ranks that ``host_dims`` makes neighbours is joined by a link, else why not."""
    hr_, hc_ = host_dims
    links: dict[frozenset, int] = Counter()
    for lk in cluster.inv.links:
        links[frozenset({lk.a, lk.b})] += 1
    at = {host_rank: (rank, chips) for rank, host_rank, chips in ranks}
    for host_rank, (rank, chips) in sorted(at.items()):
        row, col = divmod(host_rank, hc_)
        for nrow, ncol in ((row, col + 1), (row + 1, col)):
            if nrow >= hr_ or ncol >= hc_ or nrow * hc_ + ncol not in at:
                continue
            other, other_chips = at[nrow * hc_ + ncol]
            if any(frozenset({a, b}) in links for a in chips for b in other_chips):
                continue
            here, there = cluster.name_of(chips[0]), cluster.name_of(other_chips[0])
            return (
                f"mesh host ranks {host_rank} (rank {rank} on {here}) and {nrow * hc_ + ncol} "
                f"(rank {other} on {there}) are neighbours in host_topology {hr_}x{hc_}, but no "
                "link joins their chips: the host ranks are swapped against the wiring"
            )
    return None


# --------------------------------------------------------------------------- tt-metal's groupings


def groupings(
    merged: cdm.ClusterDescriptor, blocks: list[Any], host_dims: tuple[int, int]
) -> str | None:
    """tt-metal's physical grouping descriptor (``TT_METAL_PHYSICAL_GROUPING_DESCRIPTOR_PATH``)
    for a mesh of Wormhole Galaxy chips split over processes: each process's block, row-major,
    by the trays and tray places tt-umd reads (one custom grouping per block), and the mesh as
    those blocks in the host grid. None for other chips (tt-metal maps them without one).

    Without it tt-metal (ttnn 0.81.1, which ships no grouping descriptor) found no mapping for a
    mesh over four Galaxies: a sub-mesh is refused ("a mesh has no grouping variants") and the
    8x16 torus did not map within its own two-minute wait; with it the 8x16 torus maps in
    seconds, and host ranks swapped against the wiring are still refused."""
    by_asic = {c.asic_id: c for c in merged.chips.values()}
    boards = {cid: b.board_type for b in merged.boards for cid in b.chips}
    place: dict[str, tuple[int, int]] = {}
    for block in blocks:
        for asic in block.chips:
            chip = by_asic.get(asic)
            if chip is None or boards.get(chip.id) != "ubb" or chip.asic_location is None:
                return None
            tray = boardfacts.wh_galaxy_tray(chip.bus_id)
            if tray is None:
                return None
            place[asic] = (chip.asic_location, tray)
    out = ["# ttmesh: where each process's chips sit on their Galaxy (trays as tt-umd reads them)"]
    for block in blocks:
        name = f"ttmesh_block_{block.host_rank}"
        out += [f'groupings {{\n  name: "{name}"\n  custom_type: "{name}"\n  instances: [']
        items = [
            f"    {{ id: {i} location {{ asic_location: ASIC_LOCATION_{place[a][0]} "
            f"tray_id: TRAY_{place[a][1]} }} }}"
            for i, a in enumerate(block.chips)
        ]
        out += [",\n".join(items), "  ]", f"  row_major_mesh {{ dims: [{block.shape[0]}, "
                f"{block.shape[1]}] }}\n}}"]  # fmt: skip
    refs = [
        f'    {{ id: {b.host_rank} grouping_ref {{ custom_type: "ttmesh_block_{b.host_rank}" }} }}'
        for b in sorted(blocks, key=lambda b: b.host_rank)
    ]
    out += ['groupings {\n  name: "ttmesh_mesh"\n  preset_type: MESH\n  instances: [']
    out += [
        ",\n".join(refs),
        "  ]",
        f"  row_major_mesh {{ dims: [{host_dims[0]}, {host_dims[1]}] }}\n}}",
    ]
    return "\n".join(out) + "\n"
