"""Chip selection (project issue 5): connected sub-meshes of the link graph, ring order, dim types.

In-process and fast: simulated roots (read-only ones built once per module, a fresh QuietBox 2
for each fault test), ``discover`` on them, then ``ttmesh.mesh.select``. Every check on links goes against the link graph read from the captured
cluster descriptor in tests/data/captures (the ground truth the simulator is built from), not
against the selector's own graph, so a selector that invents or misreads links fails here.
Faults go through the real ``ttmesh sim fault`` command line.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CAPTURES, STOCK, run_cli

from ttmesh.cli.hosts import open_host as Host
from ttmesh.errors import TTMeshError
from ttmesh.fabric.devices import Inventory, discover
from ttmesh.host import clusterdesc
from ttmesh.launcher.planning.choose import unavailable_chips
from ttmesh.mesh import descriptor as mgd
from ttmesh.mesh import select as meshselect
from ttmesh.mesh.select import Selection, select
from ttmesh.runtime import leases

# QuietBox 2: two p300 boards (01+03, 05+07) cabled as a ring 01-03-07-05-01.
C01, C03, C05, C07 = "0000:01:00.0", "0000:03:00.0", "0000:05:00.0", "0000:07:00.0"

# system: (default full-system shape, channels = fewest links between grid neighbours,
#          dim types of the whole mesh). Shapes are tt-metal's own descriptors' (captures README);
# RING where the capture closes a dimension with wrap-around links: the BH galaxy is a torus
# (68 linked pairs = 64 of an 8x4 torus + 4), the 8 x p150 LoudBox closes each row of 4 (12 pairs
# = 10 of a 2x4 grid + 2 wraps); the WH galaxy is an open 8x4 grid (52 pairs).
EXPECTED: dict[str, tuple[tuple[int, int], int, tuple[str, str]]] = {
    "p150": ((1, 1), 0, ("LINE", "LINE")),
    "p300": ((1, 2), 2, ("LINE", "LINE")),
    "quietbox2": ((2, 2), 2, ("LINE", "LINE")),
    "p150x4": ((2, 2), 4, ("LINE", "LINE")),
    "p150x8": ((2, 4), 2, ("LINE", "RING")),
    "n150": ((1, 1), 0, ("LINE", "LINE")),
    "n300": ((1, 2), 2, ("LINE", "LINE")),
    "t3k": ((2, 4), 2, ("LINE", "LINE")),
    "galaxy-wh": ((8, 4), 4, ("LINE", "LINE")),
    "galaxy-bh": ((8, 4), 2, ("RING", "RING")),
}


# --------------------------------------------------------------------------- helpers


@functools.cache
def capture_links(name: str) -> Counter:
    """Links per unordered chip pair (asic ids) in the captured cluster descriptor."""
    cd = clusterdesc.load(CAPTURES / f"{name}.yaml")
    asic = {c.id: c.asic_id for c in cd.chips.values()}
    return Counter(
        frozenset((asic[lk.chip_a], asic[lk.chip_b])) for lk in cd.links if lk.chip_a != lk.chip_b
    )


def links(name: str, a: str, b: str) -> int:
    return capture_links(name)[frozenset((a, b))]


def inventory(root: Path) -> Inventory:
    return discover(Host(root))


def grid_pairs(shape: tuple[int, int]) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    rows, cols = shape
    out = []
    for r in range(rows):
        for c in range(cols):
            if c + 1 < cols:
                out.append(((r, c), (r, c + 1)))
            if r + 1 < rows:
                out.append(((r, c), (r + 1, c)))
    return out


def assert_connected_mesh(name: str, sel: Selection, shape: tuple[int, int]) -> None:
    """The selection is an RxC grid of distinct chips whose grid neighbours are linked."""
    rows, cols = shape
    assert sel.shape == shape
    assert sorted(sel.grid) == [(r, c) for r in range(rows) for c in range(cols)]
    assert len(set(sel.grid.values())) == rows * cols
    assert sorted(sel.order) == sorted(sel.grid)
    for a, b in grid_pairs(shape):
        assert links(name, sel.grid[a], sel.grid[b]) > 0, (a, b, "not linked")


def closes_ring(shape: tuple[int, int]) -> bool:
    """A grid has a Hamiltonian cycle iff both sides are >= 2 and it has an even cell count."""
    rows, cols = shape
    return rows >= 2 and cols >= 2 and (rows * cols) % 2 == 0


def fault(root: Path, *args: str) -> str:
    res = run_cli("sim", "fault", "--root", str(root), *args)
    assert res.code == 0, res.err
    return res.out


def bdfs(inv: Inventory, sel: Selection) -> set[str]:
    return {inv.chip(a).bdf for a in sel.chips}


def refusal(call: Callable[[], object]) -> TTMeshError:
    with pytest.raises(TTMeshError) as info:
        call()
    assert info.value.code == 2, str(info.value)
    assert "\n" not in str(info.value)
    return info.value


# --------------------------------------------------------------------------- whole systems


@pytest.mark.parametrize("name", STOCK)
def test_default_selection_of_every_stock_system(
    name: str, shared_sim: Callable[[str], Path]
) -> None:
    shape, channels, dim_types = EXPECTED[name]
    inv = inventory(shared_sim(name))
    # The simulator's links are the capture's (else the checks below would prove nothing).
    seen = Counter(frozenset((lk.a, lk.b)) for lk in inv.links)
    assert seen == capture_links(name)

    sel = select(inv, len(inv.chips))
    assert_connected_mesh(name, sel, shape)
    assert set(sel.grid.values()) == {c.asic_id for c in inv.chips}

    # Ranks follow a ring: consecutive ranks linked, and last -> first where the grid closes.
    order = [sel.grid[c] for c in sel.order]
    assert order == sel.chips
    for a, b in itertools.pairwise(order):
        assert links(name, a, b) > 0, (a, b)
    if closes_ring(shape):
        assert links(name, order[-1], order[0]) > 0
    assert sel.order[0] == (0, 0)

    # RING exactly where wrap-around links close every line of a dimension of >= 3 chips.
    rows, cols = shape
    wrap_rows = rows >= 3 and all(
        links(name, sel.grid[(0, c)], sel.grid[(rows - 1, c)]) for c in range(cols)
    )
    wrap_cols = cols >= 3 and all(
        links(name, sel.grid[(r, 0)], sel.grid[(r, cols - 1)]) for r in range(rows)
    )
    assert sel.dim_types == ("RING" if wrap_rows else "LINE", "RING" if wrap_cols else "LINE")
    assert sel.dim_types == dim_types

    # Channels: the fewest links between grid neighbours (the weakest pair).
    fewest = min((links(name, sel.grid[a], sel.grid[b]) for a, b in grid_pairs(shape)), default=0)
    assert sel.channels == fewest == channels

    # Every chip in exactly one worker unit; remote chips ride with their PCI partner.
    in_units = [a for u in sel.units for a in u.chips]
    assert sorted(in_units) == sorted(sel.chips)
    for u in sel.units:
        assert inv.chip(u.chips[0]).bdf == u.bdf
        assert all(inv.chip(a).via == u.chips[0] for a in u.chips[1:])


def test_galaxy_bh_capture_is_a_torus_and_galaxy_wh_is_not() -> None:
    """What the captures say, independent of ttmesh: pair counts and neighbour degrees."""
    bh, wh = capture_links("galaxy-bh"), capture_links("galaxy-wh")
    assert len(bh) == 68 and Counter(bh.values()) == {2: 66, 4: 2}
    assert len(wh) == 52 and set(wh.values()) == {4}
    degree = Counter(a for pair in bh for a in pair)
    assert sorted(Counter(degree.values()).items()) == [(4, 24), (5, 8)]


@pytest.mark.parametrize(
    ("name", "n", "shape"),
    [
        ("quietbox2", 4, (2, 2)),
        ("quietbox2", 2, (1, 2)),
        ("p150x8", 4, (2, 2)),
        ("t3k", 4, (2, 2)),
        ("galaxy-wh", 8, (2, 4)),
        ("galaxy-bh", 8, (2, 4)),
        ("galaxy-wh", 4, (2, 2)),
        ("galaxy-wh", 2, (1, 2)),
        ("galaxy-wh", 32, (8, 4)),
    ],
)
def test_default_shape_is_the_squarest(
    name: str, n: int, shape: tuple[int, int], shared_sim: Callable[[str], Path]
) -> None:
    """Issue 5: 2x2 for 4 on a QB2, 2x4 for 8 on a Galaxy, 8x4 for the whole Galaxy."""
    sel = select(inventory(shared_sim(name)), n)
    assert_connected_mesh(name, sel, shape)
    order = sel.chips
    for a, b in itertools.pairwise(order):
        assert links(name, a, b) > 0
    if closes_ring(shape):
        assert links(name, order[-1], order[0]) > 0


def test_possible_sizes_on_quietbox2(qb2: Path) -> None:
    inv = inventory(qb2)
    assert meshselect.possible_sizes(inv, [c.asic_id for c in inv.chips]) == [1, 2, 3, 4]


# --------------------------------------------------------------------------- pairs (N=2)


def test_pair_on_quietbox2_is_one_board(qb2: Path) -> None:
    inv = inventory(qb2)
    sel = select(inv, 2)
    assert_connected_mesh("quietbox2", sel, (1, 2))
    assert len({inv.chip(a).board_id for a in sel.chips}) == 1
    assert bdfs(inv, sel) == {C01, C03}
    assert sel.channels == 2


def test_pair_on_quietbox2_stays_on_one_board_around_an_unavailable_chip(qb2: Path) -> None:
    inv = inventory(qb2)
    asic = {c.bdf: c.asic_id for c in inv.chips}
    sel = select(inv, 2, unavailable={asic[C03]: "dead"})
    # 01 is still free and linked to 05 (a cross-board pair), but 05+07 share a board.
    assert bdfs(inv, sel) == {C05, C07}
    assert len({inv.chip(a).board_id for a in sel.chips}) == 1


def test_pair_prefers_more_links(shared_sim: Callable[[str], Path]) -> None:
    """The BH galaxy has two pairs with 4 links among 66 with 2: N=2 takes a 4-link pair."""
    inv = inventory(shared_sim("galaxy-bh"))
    sel = select(inv, 2)
    a, b = sel.chips
    assert links("galaxy-bh", a, b) == 4
    assert sel.channels == 4


def test_pair_on_t3k_is_one_n300_board(shared_sim: Callable[[str], Path]) -> None:
    inv = inventory(shared_sim("t3k"))
    sel = select(inv, 2)
    assert_connected_mesh("t3k", sel, (1, 2))
    assert len(sel.units) == 1 and sorted(sel.units[0].chips) == sorted(sel.chips)
    assert len({inv.chip(a).board_id for a in sel.chips}) == 1


# --------------------------------------------------------------------------- faults


def test_dead_chip_is_avoided(qb2: Path) -> None:
    fault(qb2, "chip-dead", C01)
    inv = inventory(qb2)
    why, _ = unavailable_chips(inv)
    assert why == {inv.by_bdf()[C01].asic_id: "dead"}
    sel = select(inv, 2, unavailable=why)
    assert C01 not in bdfs(inv, sel)
    assert bdfs(inv, sel) == {C05, C07}  # the whole other board
    err = refusal(lambda: select(inv, 4, unavailable=why))
    assert "only 3 of 4 chips are free" in str(err) and "dead 1" in str(err)


def test_held_chip_is_avoided(qb2: Path, hold_pids: list[int]) -> None:
    out = fault(qb2, "hold", C05)
    pid = int(re.fullmatch(rf"hold: pid (\d+) holds {re.escape(C05)}\n", out).group(1))
    hold_pids.append(pid)
    inv = inventory(qb2)
    why, who = unavailable_chips(inv)
    c05 = inv.by_bdf()[C05].asic_id
    assert why == {c05: "held"}
    assert str(pid) in who[c05]
    sel = select(inv, 2, unavailable=why)
    assert C05 not in bdfs(inv, sel)
    assert bdfs(inv, sel) == {C01, C03}
    sel1 = select(inv, 1, unavailable=why)
    assert bdfs(inv, sel1) == {C01}
    os.kill(pid, signal.SIGKILL)
    hold_pids.remove(pid)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def test_leased_chip_is_avoided(qb2: Path) -> None:
    inv = inventory(qb2)
    c01 = inv.by_bdf()[C01].asic_id
    held = leases.acquire(inv.host, [c01], "other-job", cmd="a test")
    try:
        why, who = unavailable_chips(inv)
        assert why == {c01: "leased"}
        assert "other-job" in who[c01]
        sel = select(inv, 2, unavailable=why)
        assert bdfs(inv, sel) == {C05, C07}
    finally:
        held.release()
    assert unavailable_chips(inv)[0] == {}


def test_two_unavailable_chips_leave_no_linked_pair(qb2: Path) -> None:
    """01 and 07 gone: 03 and 05 are free but not linked, so no pair; only 1 chip is possible."""
    inv = inventory(qb2)
    asic = {c.bdf: c.asic_id for c in inv.chips}
    unavailable = {asic[C01]: "dead", asic[C07]: "leased"}
    err = refusal(lambda: select(inv, 2, unavailable=unavailable))
    assert str(err).startswith("tp-size 2: ")
    assert str(err).endswith("(possible shapes: 1x1)")
    assert bdfs(inv, select(inv, 1, unavailable=unavailable)) == {C03}


def test_two_jobs_on_one_galaxy_get_disjoint_meshes(shared_sim: Callable[[str], Path]) -> None:
    inv = inventory(shared_sim("galaxy-wh"))
    first = select(inv, 8)
    assert_connected_mesh("galaxy-wh", first, (2, 4))
    taken = {a: "leased" for a in first.chips}
    second = select(inv, 8, unavailable=taken)
    assert_connected_mesh("galaxy-wh", second, (2, 4))
    assert not set(first.chips) & set(second.chips)
    taken |= {a: "leased" for a in second.chips}
    third = select(inv, 8, unavailable=taken)
    assert_connected_mesh("galaxy-wh", third, (2, 4))
    assert not set(third.chips) & set(taken)
    for sel in (first, second, third):
        assert sel.channels == 4
        order = sel.chips
        assert all(
            links("galaxy-wh", a, b) for a, b in zip(order, [*order[1:], order[0]], strict=True)
        )


def test_enough_free_chips_but_no_mesh_is_refused(shared_sim: Callable[[str], Path]) -> None:
    """Another job holds the galaxy's middle rows 3-4: 24 chips are free, in two 3x4 slabs, so
    a 4x4 mesh (16 chips) does not exist although enough chips are free; a 3x4 slab does."""
    inv = inventory(shared_sim("galaxy-wh"))
    whole = select(inv, 32)
    middle = {whole.grid[(r, c)]: "leased" for r in (3, 4) for c in range(4)}
    err = refusal(lambda: select(inv, 16, unavailable=middle))
    text = str(err)
    assert text.startswith("tp-size 16: ") and "24 chips available" in text, text
    shapes = re.fullmatch(r".*\(possible shapes: ([\dx, ]+)\)", text).group(1).split(", ")
    sizes = [int(r) * int(c) for r, c in (s.split("x") for s in shapes)]
    assert 16 not in sizes and 12 in sizes and max(sizes) == 12, sizes
    slab = select(inv, 12, unavailable=middle)
    assert_connected_mesh("galaxy-wh", slab, (3, 4))
    assert not set(slab.chips) & set(middle)


# --------------------------------------------------------------------------- refusals


def test_shape_that_does_not_fit_quietbox2(qb2: Path) -> None:
    inv = inventory(qb2)
    assert_connected_mesh("quietbox2", select(inv, 3, shape=(1, 3)), (1, 3))
    assert_connected_mesh("quietbox2", select(inv, 3), (1, 3))
    err = refusal(lambda: select(inv, 8))
    assert "tp-size 8" in str(err)


def test_shapes_that_do_not_fit_a_galaxy(shared_sim: Callable[[str], Path]) -> None:
    inv = inventory(shared_sim("galaxy-wh"))
    possible = (
        "1x1, 1x2, 1x4, 2x2, 1x6, 2x3, 1x8, 2x4, 1x10, 2x5, 1x12, 2x6, 3x4, 1x14, 2x7, 1x16, 2x8, "
        "4x4, 1x18, 3x6, 1x20, 4x5, 1x22, 1x24, 3x8, 4x6, 1x26, 1x28, 4x7, 1x30, 1x32, 4x8"
    )
    for n, shape in ((25, (5, 5)), (9, (1, 9)), (11, None)):
        err = refusal(lambda n=n, shape=shape: select(inv, n, shape=shape))
        assert str(err).startswith(f"tp-size {n}: "), err
        assert str(err).endswith(f"(possible shapes: {possible})"), err
    # A 3x3 block is part of the 8x4 grid, but tt-metal maps no Wormhole mesh whose dimensions
    # are both odd (except 1x1); the Blackhole Galaxy takes it.
    err = refusal(lambda: select(inv, 9, shape=(3, 3)))
    assert "both odd" in str(err), err
    bh = inventory(shared_sim("galaxy-bh"))
    assert_connected_mesh("galaxy-bh", select(bh, 9, shape=(3, 3)), (3, 3))


@pytest.mark.parametrize(
    ("name", "n", "possible"),
    [
        ("t3k", 3, "1x1, 1x2, 1x4, 2x2, 1x6, 2x3, 1x8, 2x4"),
        ("n300", 3, "1x1, 1x2"),
        ("t3k", 5, "1x1, 1x2, 1x4, 2x2, 1x6, 2x3, 1x8, 2x4"),
        ("p300", 4, "1x1, 1x2"),
    ],
)
def test_impossible_size_lists_what_is_possible(
    name: str, n: int, possible: str, shared_sim: Callable[[str], Path]
) -> None:
    inv = inventory(shared_sim(name))
    err = refusal(lambda: select(inv, n))
    assert str(err).startswith(f"tp-size {n}: "), err
    assert f"possible shapes: {possible}" in str(err), err


def test_impossible_size_on_the_command_line(qb2: Path) -> None:
    res = run_cli("descriptor", "--root", str(qb2), "--tp-size", "5")
    assert res.code == 2
    last = res.err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"ttmesh: tp-size 5: .*\(possible shapes: 1x1, 1x2, 1x3, 1x4, 2x2\)", last
    ), res.err
    assert res.out == ""


def test_explicit_chips_not_connected_name_the_missing_link(qb2: Path) -> None:
    inv = inventory(qb2)
    by = inv.by_bdf()
    gap = meshselect.check_connected(inv, [by[C03], by[C05]])
    assert gap == f"{C05} has no Ethernet link to {C03}"
    assert meshselect.check_connected(inv, [by[C01], by[C05]]) is None
    res = run_cli(
        "launch", "--root", str(qb2), "--chips", f"{C03},{C05}", "--dry-run", "--", "true"
    )
    assert res.code == 2
    assert res.err.strip().splitlines()[-1] == (
        f"ttmesh: --chips are not connected: {C05} has no Ethernet link to {C03} "
        "(choose chips linked by Ethernet)"
    )


# --------------------------------------------------------------------------- any shape (issue 10)


@pytest.mark.parametrize(
    ("name", "shape", "dim_types"),
    [
        ("quietbox2", (1, 4), ("LINE", "RING")),  # the 2x2 ring cabling, as one ring of 4
        ("quietbox2", (4, 1), ("RING", "LINE")),
        ("p150x4", (1, 4), ("LINE", "RING")),
        ("t3k", (1, 8), ("LINE", "RING")),
        ("p150x8", (1, 8), ("LINE", "RING")),
        ("quietbox2", (1, 3), ("LINE", "LINE")),  # no three chips close a ring
    ],
)
def test_lines_of_serving_stacks_are_accepted(
    name: str, shape: tuple[int, int], dim_types: tuple[str, str], shared_sim: Callable[[str], Path]
) -> None:
    """Issue 10: 1x4 on a QuietBox 2 or four p150s, 1x8 on a T3K or eight p150s; a dimension
    is RING where the chips close one, and channels count the wrap-around pair too."""
    inv = inventory(shared_sim(name))
    sel = select(inv, shape[0] * shape[1], shape=shape)
    assert_connected_mesh(name, sel, shape)
    assert sel.dim_types == dim_types
    rows, cols = shape
    if dim_types[0] == "RING":
        assert all(links(name, sel.grid[(0, c)], sel.grid[(rows - 1, c)]) for c in range(cols))
    if dim_types[1] == "RING":
        assert all(links(name, sel.grid[(r, 0)], sel.grid[(r, cols - 1)]) for r in range(rows))
    assert sel.channels == min(links(name, a, b) for a, b in sel.pair_links)


def test_three_chips_of_a_quietbox2_form_a_line(qb2: Path) -> None:
    res = run_cli("descriptor", "--root", str(qb2), "--tp-size", "3", "--strict-links")
    assert res.code == 0, res.err
    (mesh,) = mgd.parse(res.out).meshes
    assert (mesh.dims, mesh.dim_types, mesh.channels, mesh.policy) == (
        (1, 3),
        ("LINE", "LINE"),
        2,
        "STRICT",
    )


def test_refusal_lists_the_possible_shapes(make_sim: Callable[..., Path]) -> None:
    """Two p300 cards without the cross-card cables: no 2x2, no 1x4; one line, one message."""
    inv = inventory(make_sim("p300x2-disconnected"))
    for shape in ((2, 2), (1, 4)):
        err = refusal(lambda shape=shape: select(inv, 4, shape=shape))
        text = str(err)
        assert text.startswith(f"tp-size 4: no mesh shape {shape[0]}x{shape[1]} on this host")
        assert text.endswith("(possible shapes: 1x1, 1x2)"), text


def test_tp_size_beyond_the_host_names_its_chip_count(qb2: Path) -> None:
    inv = inventory(qb2)
    err = refusal(lambda: select(inv, 999))
    assert str(err) == (
        "tp-size 999: this host has 4 chips (possible shapes: 1x1, 1x2, 1x3, 1x4, 2x2)"
    )
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "999", "--dry-run", "--", "true")
    assert res.code == 2
    assert res.err.strip().splitlines()[-1] == f"ttmesh: {err}"


def test_one_chip_of_an_n300_takes_the_whole_board(make_sim: Callable[..., Path]) -> None:
    """tt-metal maps a 1x1 mesh onto an n300 (one chip idle); the process opens both chips,
    so the job leases both."""
    from ttmesh.launcher.planning.prepare import prepare
    from ttmesh.launcher.planning.request import LaunchRequest

    root = make_sim("n300")
    inv = inventory(root)
    sel = select(inv, 1)
    (unit,) = sel.units
    assert sel.chips == [unit.chips[0]] and sel.idle_chips == 1
    assert inv.chip(sel.chips[0]).bdf == unit.bdf
    request = LaunchRequest(command=[], tp_size=1, job="t", run_dir="/nonexistent")
    plan = prepare(request, Host(root), descriptor_only=True).plan
    assert plan.all_chips() == list(unit.chips)
    assert [r.bdfs for r in plan.ranks] == [(unit.bdf,)]


def _without(name: str, pairs: int, links_per_pair: int = 0) -> Any:
    """The stock system minus links of its first ``pairs`` linked chip pairs: all of them, or
    all but ``links_per_pair``."""
    import dataclasses

    from ttmesh.sim.system import load

    model = load(name)
    by_pair: dict[frozenset, list] = {}
    for lk in model.links:
        by_pair.setdefault(frozenset((lk.chip_a, lk.chip_b)), []).append(lk)
    drop = [lk for group in list(by_pair.values())[:pairs] for lk in group[links_per_pair:]]
    return dataclasses.replace(model, links=[lk for lk in model.links if lk not in drop])


def test_the_weakest_pair_is_avoided_before_rings_are_sought(tmp_path: Path) -> None:
    """A QuietBox 2 with one link of a pair gone: its 2x2 has to use that pair (1 channel),
    a 1x4 line avoids it (its neighbour pairs have 2 links) rather than close the ring over
    it. Its STRICT count is 1 all the same: tt-metal checks channels on the placement it
    finds, which may lie on the weak pair (``ttmesh.mesh.placement``)."""
    from ttmesh.sim.create import create

    root = create(_without("quietbox2", 1, 1), tmp_path / "qb2", config={"reset_seconds": 0.0})
    inv = inventory(root)
    square = select(inv, 4, shape=(2, 2))
    assert (square.channels, square.dim_types) == (1, ("LINE", "LINE"))
    line = select(inv, 4, shape=(1, 4))
    assert (line.channels, line.dim_types) == (1, ("LINE", "LINE"))
    assert min(line.pair_links.values()) == 2


def test_galaxy_shapes_are_decided_fast(shared_sim: Callable[[str], Path]) -> None:
    """A Galaxy's possible shapes, and its hardest shapes (per row count, the widest that
    fits and the narrowest that does not: the refusal is a complete search), are each
    decided well under a second."""
    import time

    for name in ("galaxy-wh", "galaxy-bh"):
        inv = inventory(shared_sim(name))
        start = time.perf_counter()
        shapes = meshselect.possible_shapes(inv)
        slowest = time.perf_counter() - start
        widest = {r: max(c for rr, c in shapes if rr == r) for r, _ in shapes}
        for rows, cols in widest.items():
            for shape in ((rows, cols), (cols, rows), (rows, cols + 1), (cols + 1, rows)):
                start = time.perf_counter()
                with contextlib.suppress(TTMeshError):
                    select(inv, shape[0] * shape[1], shape=shape)
                slowest = max(slowest, time.perf_counter() - start)
        assert slowest < 1.0, (name, slowest)
