"""What tt-metal's placement asks beyond the link graph, so ttmesh never writes what it refuses.

``ttmesh.mesh.embed`` answers "does the grid lie in the link graph". tt-metal's control plane
(ttnn 0.81.1, mock-cluster mode) refuses some meshes that do, on damaged hosts only; this module
holds those rules, each measured against it (tests/test_conformance_shapes.py checks every shape
of every stock system, whole and damaged, and fails on any disagreement):

* **STRICT channels are checked on the placement tt-metal finds, not searched for.**
  ``TopologyMapper::build_mapping`` (``tt_metal/fabric/topology_mapper.cpp``) places the mesh
  with its solver (``map_mesh_to_physical`` over the chips' adjacency, then
  ``ConnectionValidationMode::STRICT`` validation of each neighbour pair's channel count) and
  fails with ``TT_FATAL ... mapping_result.success`` when the placement it found uses a pair
  with fewer links, although another placement would have passed: a Blackhole Galaxy with one
  link of a 2-link pair down refuses a STRICT 2 2x16 that avoids that pair; a Wormhole Galaxy
  with one link of a 4-link pair down, a STRICT 4 1x14 ring that avoids it (the job's mock
  cluster is the whole host). So a STRICT count must hold on the placements tt-metal may find
  (:func:`strict_channels`): on every linked pair among the mesh's chips, not only its grid
  neighbour pairs, and on every *weak* pair of the chips tt-metal is given, a pair with fewer
  links than every other pair of both its chips (a link of it down: :func:`weak_pairs`).
  Pairs at their chips' usual counts elsewhere on the host do not lower it: on every stock
  system, whole, tt-metal accepts the count of the mesh's own pairs for every shape, a
  Blackhole Galaxy's 4-link meshes beside its 2-link pairs included.
* **A mesh of a whole Galaxy is placed in the Galaxy's own grid grouping.** The physical
  grouping descriptor (``tt_metal/fabric/physical_grouping_descriptor.cpp``,
  ``validate_and_populate_preformed_groups_from_physical_system``) builds the host's MESH
  grouping from its trays and takes a 32-ASIC host to be its 4x8 grid; a descriptor's mesh is
  then matched inside that grouping (``get_valid_groupings_for_mgd``), and a whole-host mesh
  that is neither a line nor that grid maps only through the grid's wrap-around links. With a
  pair of the torus gone, a 2x16 is refused in every form (``TT_FATAL ... SAT placement: mesh
  'M0' (mesh 0) has no grouping in the provided valid-groupings map``,
  ``physical_grouping_descriptor_matching.cpp``: ``mesh_groupings != nullptr``), even on a
  host that is exactly that 2x16, while the same 2x16 on the whole torus, and a 1x32 ring or a
  2x15 on the damaged one, map (:func:`grouping_refusal`).

Pure: the caller gives the link counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ttmesh.mesh import embed
from ttmesh.mesh.embed import Shape

GALAXY_CHIPS = 32  # a Galaxy: 4 trays of 8 ASICs, which tt-metal groups as one 4x8 grid
GALAXY_GRID: Shape = (4, 8)


def weak_pairs(links: Mapping[str, Mapping[str, int]], chips: Sequence[str]) -> dict:
    """{frozenset pair: links} of the pairs among ``chips`` with fewer links than every other
    pair of both their chips (each chip having another): a pair missing a link."""
    inside = set(chips)
    out = {}
    for a in chips:
        for b, n in links.get(a, {}).items():
            if b not in inside or b <= a:
                continue
            others = [m for c, o in ((a, b), (b, a)) for d, m in links[c].items() if d != o]
            if others and all(n < m for m in others):
                out[frozenset((a, b))] = n
    return out


def strict_channels(
    links: Mapping[str, Mapping[str, int]], chips: Sequence[str], given: Sequence[str] = ()
) -> int:
    """The STRICT channel count the placements tt-metal may find for a mesh over ``chips``
    satisfy, when it is given the chips ``given`` (the host; default: the mesh's chips): the
    fewest links of any linked pair among ``chips`` and of any weak pair among ``given``."""
    inside = set(chips)
    counts = [n for a in chips for b, n in links.get(a, {}).items() if b in inside and b != a]
    counts += weak_pairs(links, given).values()
    return max(min(counts, default=1), 1)


def grouping_refusal(
    links: Mapping[str, Mapping[str, int]],
    chips: Sequence[str],
    shape: Shape,
    galaxy: bool,
) -> str | None:
    """Why tt-metal's grouping matcher refuses a mesh of ``shape`` on ``chips`` (the host's
    chips), or None. Only a whole Galaxy's mesh is concerned: one that is neither a line
    (1xN) nor the Galaxy's own 4x8 grid needs every wrap-around pair of that grid, which a
    Galaxy whose 4x8 is a torus (Blackhole) has unless a pair is gone."""
    rows, cols = sorted(shape)
    if not galaxy or len(chips) != GALAXY_CHIPS or rows * cols != GALAXY_CHIPS:
        return None
    if rows == 1 or (rows, cols) == GALAXY_GRID:
        return None
    graph = embed.graph_of(links, list(chips))
    torus = embed.pattern(GALAXY_GRID, ("RING", "RING"))
    if embed.fits(graph, torus):
        return None
    return (
        f"tt-metal places a whole Galaxy's mesh, unless a line or its own "
        f"{GALAXY_GRID[1]}x{GALAXY_GRID[0]} grid, only on the Galaxy's whole torus, and this "
        "one lacks a pair of it"
    )
