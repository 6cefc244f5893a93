"""Every mesh shape of every stock system: ttmesh's verdict against tt-metal's (issue 10).

For each stock system, as built and in two damaged variants, and for every shape RxC with
R*C <= its chip count, ttmesh decides (``ttmesh descriptor --tp-size R*C --mesh-shape RxC
--strict-links``, called in-process through the same ``launch.prepare`` the command uses) and
tt-metal's control plane (ttnn in mock-cluster mode, against the host's WHOLE cluster
descriptor) judges:

* ttmesh accepts -> tt-metal maps the exact STRICT descriptor ttmesh wrote, to that shape
  (ttmesh is not too loose, and its channel count and RING dimensions hold);
* ttmesh refuses -> tt-metal refuses even a lenient descriptor of that shape (RELAXED,
  LINE x LINE, 1 channel): ttmesh is not too strict.

Variants, written as system YAML files and built with ``ttmesh sim create --system FILE`` (as a
user would): ``link-down``, one Ethernet link of a chip pair missing (that pair then has fewer
links than the others: what STRICT channels mean is pinned by
``test_strict_channels_are_a_minimum``), and ``pair-gone``, every link of one chip pair missing
(the QuietBox 2's cross-card pair, ...), which removes shapes.

No disagreement is allowed, on damaged hosts either (issue 22): where tt-metal's placement
refuses a mesh the link graph holds (STRICT channels checked on the placement it finds, a whole
Galaxy's mesh placed in its 4x8 grouping), ttmesh models it (``ttmesh.mesh.placement``).

On damaged Galaxies each shape is checked in one orientation (R <= C) to keep the file within
its time budget; test_transposed_shapes_get_the_same_verdicts shows orientation does not matter
on the whole hosts. All tt-metal checks go through ``mgd-check-many`` (ttnn imported once, a
forked child per check); ``test_batch_verdicts_match_single_checks`` shows its children re-read
their files.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import CAPTURES, CONFORMANCE, STOCK, run_cli, scratch

from ttmesh.cli.hosts import open_host as Host
from ttmesh.errors import TTMeshError
from ttmesh.host import boards as boardfacts
from ttmesh.launcher.planning.prepare import prepare
from ttmesh.launcher.planning.request import LaunchRequest
from ttmesh.mesh import descriptor as mgd
from ttmesh.mesh.select import Selection
from ttmesh.sim.system import SystemModel, load

pytestmark = pytest.mark.conformance

Shape = tuple[int, int]
Pair = frozenset[int]


# --------------------------------------------------------------------------- variants


def _pairs(model: SystemModel) -> list[Pair]:
    """Linked chip pairs (UMD chip ids), in the order of the system's links."""
    return list(dict.fromkeys(frozenset((lk.chip_a, lk.chip_b)) for lk in model.links))


def _links_of(model: SystemModel, pair: Pair) -> list:
    return [lk for lk in model.links if frozenset((lk.chip_a, lk.chip_b)) == pair]


def _cut_pair(model: SystemModel) -> Pair | None:
    """A pair whose cutting strands no chip behind it: the first joining two boards (a cable),
    else the first of two PCI chips; None when every pair carries a remote chip's only way."""
    for pair in _pairs(model):
        a, b = (model.chip(c) for c in pair)
        if a.board_id != b.board_id or (a.bdf and b.bdf):
            return pair
    return None


def _link_down(model: SystemModel) -> SystemModel | None:
    """One Ethernet link fewer: the last link of the cut pair (or of the first pair with two)."""
    pairs = [_cut_pair(model), *_pairs(model)]
    pair = next((p for p in pairs if p is not None and len(_links_of(model, p)) >= 2), None)
    if pair is None:
        return None
    gone = _links_of(model, pair)[-1]
    return dataclasses.replace(model, links=[lk for lk in model.links if lk is not gone])


def _pair_gone(model: SystemModel) -> SystemModel | None:
    """Every link of the cut pair gone."""
    pair = _cut_pair(model)
    if pair is None:
        return None
    gone = _links_of(model, pair)
    return dataclasses.replace(model, links=[lk for lk in model.links if lk not in gone])


VARIANTS = {"whole": lambda m: m, "link-down": _link_down, "pair-gone": _pair_gone}


@functools.cache
def _model(name: str, variant: str) -> SystemModel | None:
    return VARIANTS[variant](load(name))


CASES = [
    (name, variant) for name in STOCK for variant in VARIANTS if _model(name, variant) is not None
]


def _shapes(chips: int) -> list[Shape]:
    return [(r, c) for r in range(1, chips + 1) for c in range(1, chips // r + 1)]


def _shapes_of(name: str, variant: str) -> list[Shape]:
    """Every shape; on a damaged Galaxy one orientation of each (R <= C), to stay in the time
    budget (~0.3 s per tt-metal check there): both sides treat a transposed mesh alike, which
    the whole hosts show for every shape (test_transposed_shapes_get_the_same_verdicts)."""
    shapes = _shapes(len(load(name).chips))
    if variant != "whole" and name.startswith("galaxy"):
        shapes = [(r, c) for r, c in shapes if r <= c]
    return shapes


def _arch(model: SystemModel) -> str:
    return boardfacts.ARCHS[model.arch].mgd_name


# --------------------------------------------------------------------------- ttmesh's side


def ttmesh_descriptor(
    root: Path, shape: Shape
) -> tuple[str | None, TTMeshError | None, Selection | None]:
    """``ttmesh descriptor --root ROOT --tp-size R*C --mesh-shape RxC --strict-links``, as the
    command runs it (test_library_call_is_the_descriptor_command checks they agree): the
    descriptor text and the chips chosen, or the refusal."""
    request = LaunchRequest(
        command=[],
        tp_size=shape[0] * shape[1],
        layout="single-process",
        mesh_shape=shape,
        strict_links=True,
        job="descriptor",
        run_dir="/nonexistent",
    )
    try:
        prepared = prepare(request, Host(root), descriptor_only=True)
    except TTMeshError as exc:
        return None, exc, None
    (text,) = prepared.plan.files.values()
    return text, None, prepared.selection


def _lenient(arch: str, shape: Shape) -> str:
    spec = mgd.MeshSpec("M0", arch, shape, ("LINE", "LINE"), (1, 1), 1, "RELAXED")
    return mgd.to_text(mgd.single_mesh(spec), "lenient: RELAXED, LINE x LINE, 1 channel")


def _sim_create(model: SystemModel, where: Path) -> Path:
    """The variant as a system file, built the way a user would: ``ttmesh sim create``."""
    system_file = where.with_suffix(".yaml")
    system_file.write_text(yaml.safe_dump(model.to_dict(), sort_keys=False))
    res = run_cli("sim", "create", "--system", str(system_file), "--root", str(where))
    assert res.code == 0, res.err
    return where


@dataclasses.dataclass
class Row:
    system: str
    variant: str
    shape: Shape
    descriptor: str | None  # what ttmesh wrote; None when it refused
    refusal: TTMeshError | None
    selection: Selection | None  # the chips ttmesh chose
    check: Path  # the descriptor given to tt-metal
    cluster: Path
    verdict: dict = dataclasses.field(default_factory=dict)  # mgd-check-many's answer

    @property
    def accepted(self) -> bool:
        return self.descriptor is not None


def _rows(name: str, variant: str, root: Path, out: Path) -> Iterator[Row]:
    model = _model(name, variant)
    assert model is not None
    for shape in _shapes_of(name, variant):
        text, refusal, sel = ttmesh_descriptor(root, shape)
        check = out / f"{name}-{variant}-{shape[0]}x{shape[1]}.textproto"
        check.write_text(text if text is not None else _lenient(_arch(model), shape))
        cluster = root / "cluster_descriptor.yaml"
        yield Row(name, variant, shape, text, refusal, sel, check, cluster)


def mgd_check_many(pairs: list[dict]) -> list[dict]:
    """Verdicts of tt-metal for (cluster, mgd) pairs, in order."""
    proc = subprocess.run(
        [str(CONFORMANCE / "mgd-check-many")],
        input="".join(json.dumps(p) + "\n" for p in pairs),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(verdicts) == len(pairs), proc.stderr[-3000:]
    return verdicts


@pytest.fixture(scope="module")
def table(ttnn_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """{(system, variant): [Row]}: ttmesh's verdicts, then tt-metal's, for every case."""
    out = tmp_path_factory.mktemp("shapes")
    with pytest.MonkeyPatch.context() as mp, scratch(out / "roots") as base:
        mp.setenv("XDG_CACHE_HOME", str(out / "xdg"))
        rows: dict[tuple[str, str], list[Row]] = {}
        for name, variant in CASES:
            model = _model(name, variant)
            assert model is not None
            root = _sim_create(model, base / f"{name}-{variant}")
            rows[(name, variant)] = list(_rows(name, variant, root, out))
        every = [row for group in rows.values() for row in group]
        pairs = [{"cluster": str(r.cluster), "mgd": str(r.check)} for r in every]
        for row, verdict in zip(every, mgd_check_many(pairs), strict=True):
            row.verdict = verdict
        yield rows


# --------------------------------------------------------------------------- the table


def _disagreement(row: Row) -> str | None:
    """Why ttmesh and tt-metal disagree on the row, or None."""
    r, c = row.shape
    tt = row.verdict
    if row.accepted:
        (mesh,) = mgd.parse(row.descriptor or "").meshes
        if mesh.dims != row.shape or (mesh.policy != "STRICT" and row.shape != (1, 1)):
            return f"ttmesh wrote {mesh.dims} {mesh.policy} for {r}x{c}"
        if not tt["ok"]:
            return f"ttmesh accepts {r}x{c} ({mesh.dim_types}, {mesh.channels} ch), tt-metal: {tt['error']}"
        if tt["shapes"] != {"0": [r, c]}:
            return f"tt-metal mapped ttmesh's {r}x{c} as {tt['shapes']}"
        return None
    text = str(row.refusal)
    if row.refusal is None or row.refusal.code != 2 or "\n" in text:
        return f"ttmesh's refusal of {r}x{c} is not one bad-input line: {text!r}"
    if "(possible shapes: " not in text:
        return f"ttmesh's refusal of {r}x{c} lists no possible shapes: {text}"
    if tt["ok"]:
        return f"ttmesh refuses {r}x{c} ({text}), tt-metal maps it even so: {tt['shapes']}"
    return None


@pytest.mark.parametrize(("name", "variant"), CASES)
def test_ttmesh_and_tt_metal_agree_on_every_shape(name: str, variant: str, table: dict) -> None:
    """Equal verdicts on every shape, whole and damaged hosts alike: no exception."""
    rows = table[(name, variant)]
    assert [row.shape for row in rows] == _shapes_of(name, variant)
    problems = [p for p in map(_disagreement, rows) if p]
    assert not problems, f"{name} {variant}:\n" + "\n".join(problems)


def test_transposed_shapes_get_the_same_verdicts(table: dict) -> None:
    """RxC and CxR: the same answer from ttmesh and from tt-metal on every whole host."""
    for name in STOCK:
        rows = {row.shape: row for row in table[(name, "whole")]}
        for (r, c), row in rows.items():
            other = rows[(c, r)]
            assert (row.accepted, row.verdict["ok"]) == (other.accepted, other.verdict["ok"]), (
                name,
                (r, c),
            )


def test_damage_removes_shapes(table: dict) -> None:
    """The variants matter: a missing pair takes shapes away where the wiring has no spare
    (a QuietBox 2 or four p150s lose their 2x2, a T3K its 2x3 and 2x4), and never adds one."""
    for name in STOCK:
        whole = {row.shape for row in table[(name, "whole")] if row.verdict["ok"]}
        for variant in ("link-down", "pair-gone"):
            if (name, variant) in table:
                damaged = {row.shape for row in table[(name, variant)] if row.verdict["ok"]}
                assert damaged <= whole, (name, variant, damaged - whole)
    for name in ("quietbox2", "p150x4", "p300", "t3k", "galaxy-wh"):
        cut = {row.shape for row in table[(name, "pair-gone")] if row.accepted}
        whole = {row.shape for row in table[(name, "whole")] if row.accepted} & set(
            _shapes_of(name, "pair-gone")
        )
        assert cut < whole, name


# --------------------------------------------------------------------------- STRICT channels


@pytest.fixture(scope="module")
def strict_cases(
    ttnn_python: str, tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[str, dict]]:
    """STRICT descriptors of 1..max+1 channels, LINE and RING, on four p150s (4 links per
    pair) and a QuietBox 2 with one cross-card link down (a pair of 1 beside pairs of 2)."""
    from ttmesh.sim.create import create

    out = tmp_path_factory.mktemp("strict")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(out / "xdg"))
        hosts = {
            "p150x4": create(load("p150x4"), out / "p150x4"),
            "quietbox2-link-down": create(_model("quietbox2", "link-down"), out / "qb2"),
        }
        pairs = []
        for label, root in hosts.items():
            for shape, types in (((2, 2), ("LINE", "LINE")), ((1, 4), ("LINE", "LINE")),
                                 ((1, 4), ("LINE", "RING"))):  # fmt: skip
                for count in range(1, 6):
                    spec = mgd.MeshSpec("M0", "BLACKHOLE", shape, types, (1, 1), count, "STRICT")
                    path = out / f"{label}-{shape}-{types}-{count}.textproto"
                    path.write_text(mgd.to_text(mgd.single_mesh(spec)))
                    pairs.append(
                        {
                            "cluster": str(root / "cluster_descriptor.yaml"),
                            "mgd": str(path),
                            "host": label,
                            "shape": list(shape),
                            "types": list(types),
                            "count": count,
                        }
                    )
        return [(v["host"], v) for v in mgd_check_many(pairs)]


def _fits_with_at_least(host: str, shape: Shape, types: tuple[str, str], count: int) -> bool:
    """ttmesh's reading of STRICT ``count``: the grid (its rings' wrap-around pairs included)
    embeds using only chip pairs with at least ``count`` links."""
    from collections import Counter

    from ttmesh.mesh import embed

    model = load("p150x4") if host == "p150x4" else _model("quietbox2", "link-down")
    assert model is not None
    links: dict[str, Counter] = {c.asic_id: Counter() for c in model.chips}
    for lk in model.links:
        a, b = model.chip(lk.chip_a).asic_id, model.chip(lk.chip_b).asic_id
        links[a][b] += 1
        links[b][a] += 1
    graph = embed.graph_of(links, list(links), count)
    return embed.fits(graph, embed.pattern(shape, types))


def test_strict_channels_are_a_minimum(strict_cases: list[tuple[str, dict]]) -> None:
    """tt-metal (ttnn 0.81.1) reads STRICT ``count`` as: every neighbour pair of the mapped
    grid, a RING's wrap-around pair included, has AT LEAST ``count`` links (not exactly). So the
    weakest pair's link count, which ttmesh writes, is always accepted."""
    for host, v in strict_cases:
        shape, types = tuple(v["shape"]), tuple(v["types"])
        expected = _fits_with_at_least(host, shape, types, v["count"])  # type: ignore[arg-type]
        assert v["ok"] == expected, (host, shape, types, v["count"], v.get("error"))
    # It tells "at least" from "exactly": four p150s (4 links a pair) take STRICT 1, 2 and 3.
    taken = {v["count"] for h, v in strict_cases if h == "p150x4" and v["ok"]}
    assert {1, 2, 3, 4} <= taken and 5 not in taken


# --------------------------------------------------------------------------- the tools


def test_batch_verdicts_match_single_checks(ttnn_python: str, make_sim, tmp_path: Path) -> None:
    """Forked children re-read their cluster and descriptor: one batch, alternating clusters
    and descriptors, accepted and refused, gives what one mgd-check per pair gives."""
    qb2 = make_sim("quietbox2") / "cluster_descriptor.yaml"
    galaxy = make_sim("galaxy-wh") / "cluster_descriptor.yaml"
    uncabled = CAPTURES / "p300x2-disconnected.yaml"

    def desc(shape: Shape, types: tuple[str, str], count: int, policy: str, arch: str) -> Path:
        path = tmp_path / f"{arch}-{shape}-{types}-{count}{policy}.textproto"
        spec = mgd.MeshSpec("M0", arch, shape, types, (1, 1), count, policy)
        path.write_text(mgd.to_text(mgd.single_mesh(spec)))
        return path

    square = desc((2, 2), ("LINE", "LINE"), 2, "STRICT", "BLACKHOLE")
    pairs = [
        (qb2, square),  # accepted
        (uncabled, square),  # refused: no cross-card cables
        (qb2, desc((2, 2), ("LINE", "LINE"), 3, "STRICT", "BLACKHOLE")),  # refused: 2 links
        (qb2, desc((1, 4), ("LINE", "RING"), 2, "STRICT", "BLACKHOLE")),  # accepted
        (galaxy, desc((1, 3), ("LINE", "LINE"), 1, "RELAXED", "WORMHOLE_B0")),  # refused: odd
        (qb2, square),  # accepted again, after refusals
        (galaxy, desc((2, 4), ("LINE", "LINE"), 4, "STRICT", "WORMHOLE_B0")),  # accepted
        (uncabled, desc((1, 2), ("LINE", "LINE"), 2, "STRICT", "BLACKHOLE")),  # accepted
    ]
    batch = mgd_check_many([{"cluster": str(c), "mgd": str(d)} for c, d in pairs])
    for (cluster, descriptor), verdict in zip(pairs, batch, strict=True):
        single = subprocess.run(
            [str(CONFORMANCE / "mgd-check"), str(cluster), str(descriptor)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert single.returncode in (0, 1), single.stderr
        assert verdict["ok"] == (single.returncode == 0), (cluster, descriptor, verdict)
        if verdict["ok"]:
            r, c = verdict["shapes"]["0"]
            assert single.stdout.strip().splitlines()[-1] == f"{{0: [{r}, {c}]}}"
    assert [v["ok"] for v in batch] == [True, False, False, True, False, True, True, True]


@pytest.mark.parametrize(
    ("name", "shape"), [("quietbox2", (1, 4)), ("quietbox2", (2, 3)), ("t3k", (1, 3))]
)
def test_library_call_is_the_descriptor_command(name: str, shape: Shape, make_sim) -> None:
    """The table calls launch.prepare in-process; the command prints the same."""
    root = make_sim(name)
    text, refusal, _ = ttmesh_descriptor(root, shape)
    res = run_cli(
        "descriptor", "--root", str(root), "--tp-size", str(shape[0] * shape[1]),
        "--mesh-shape", f"{shape[0]}x{shape[1]}", "--strict-links",
    )  # fmt: skip
    if text is not None:
        assert (res.code, res.out) == (0, text), res.err
    else:
        assert res.code == 2 and res.err.strip().splitlines()[-1] == f"ttmesh: {refusal}"


def test_descriptor_on_a_t3k_with_a_pair_down_is_one_tt_metal_maps(
    ttnn_python: str, tmp_path: Path
) -> None:
    """A T3K with both links of one pair down (a killed job's leftovers): ``ttmesh descriptor
    --tp-size 8`` once wrote a 2x4 that tt-metal refuses on the job's own mock cluster (the
    host as discovery finds it, links down left out), exit 0. Now it writes a mesh tt-metal
    maps there, or refuses as the launch would: one line naming the reset, exit 3."""
    from ttmesh.mesh import mock

    root = tmp_path / "t3k"
    root.mkdir()
    assert run_cli("sim", "create", "--system", "t3k", "--root", str(root)).code == 0
    res = run_cli("sim", "fault", "--root", str(root), "link-down", "0000:01:00.0", "0000:02:00.0")
    assert res.code == 0, res.err
    out = tmp_path / "out"
    res = run_cli("descriptor", "--root", str(root), "--tp-size", "8", "-o", str(out))
    if res.code != 0:
        lines = [ln for ln in res.err.strip().splitlines() if not ln.startswith("simulated host")]
        assert res.code == 3 and len(lines) == 1, res.err
        assert lines[0].startswith("ttmesh: ") and "ttmesh reset" in lines[0], lines
        assert not (out / "mesh.textproto").exists()
        return
    cluster = tmp_path / "mock.yaml"
    cluster.write_text(mock.whole_host(Host(root)))
    (verdict,) = mgd_check_many([{"cluster": str(cluster), "mgd": str(out / "mesh.textproto")}])
    assert verdict["ok"], (verdict, res.out)
