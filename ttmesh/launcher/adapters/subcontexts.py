"""tt-run's ``--rank-bindings-mapping``: sub-contexts, a rank-binding file per group of ranks.

The mapping file names one rank-binding overlay per sub-context id::

    subcontext_id_to_rank_bindings:
      0: prefill_rank_bindings.yaml
      1: decode_rank_bindings.yaml

tt-run merges the overlays into one MPI world in sub-context order (sub-context 0's ranks
first, each overlay's ranks in its own rank order), each rank with its overlay's
``mesh_graph_desc_path``, and tags every rank with ``TT_RUN_SUBCONTEXT_ID`` (and the sizes,
``TT_RUN_SUBCONTEXT_SIZES``) so tt-metal splits its world into one communicator per
sub-context. Here the merged overlays are one :class:`~ttmesh.launcher.adapters.ttrun.
BindingFile`: everything a rank-binding job does (chips, leases, supervision) applies.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ttmesh import numeric
from ttmesh.errors import bad_input
from ttmesh.launcher.adapters import ttrun

KEY = "subcontext_id_to_rank_bindings"


def load(path: str, environ: dict[str, str], cwd: str) -> ttrun.BindingFile:
    """Read a mapping and its overlays into one binding file, as tt-run merges them."""
    from ttmesh import yamlio

    try:
        data = yamlio.load_file(path, "rank bindings mapping", ttrun.MAX_BYTES)
    except ValueError as exc:
        raise bad_input(f"{path}: not valid YAML: {exc}")
    if not isinstance(data, dict) or KEY not in data:
        raise bad_input(
            f"{path}: no {KEY} map",
            f"{KEY}: {{0: first_rank_bindings.yaml, 1: ...}} (tt-run's mapping format)",
        )
    raw = data[KEY]
    if not isinstance(raw, dict):
        raise bad_input(f"{path}: {KEY} must be a map of sub-context id to rank-binding file")
    if not raw:
        raise bad_input(f"{path}: {KEY} names no sub-contexts", "name one rank-binding file per id")
    ids: dict[int, str] = {}
    for key, value in raw.items():
        sid = numeric.whole(key, f"{path}: {KEY} key", high=numeric.MAX_CHIPS - 1)
        if not isinstance(value, str) or not value.strip():
            raise bad_input(f"{path}: {KEY}[{sid}] must name a rank-binding file")
        ids[sid] = value
    if sorted(ids) != list(range(len(ids))):
        raise bad_input(
            f"{path}: {KEY} ids are {sorted(ids)}; they must be 0..{len(ids) - 1}, without gaps",
            "number the sub-contexts from 0",
        )
    merged: list[ttrun.Binding] = []
    sizes: list[int] = []
    global_env: dict[str, str] = {}
    env_from: dict[str, int] = {}
    first_mgd = ""
    for sid in range(len(ids)):
        overlay = _overlay(path, ids[sid], environ, cwd)
        bf = ttrun.load(overlay, environ, cwd)
        first_mgd = first_mgd or bf.mesh_graph_desc_path
        for key, value in bf.global_env.items():
            if key in global_env and global_env[key] != value:
                raise bad_input(
                    f"{path}: global_env sets {key} to {global_env[key]!r} in sub-context "
                    f"{env_from[key]} and to {value!r} in sub-context {sid} ({ids[sid]})",
                    "every rank shares one global_env: make them agree, or move it to "
                    "each rank's env_overrides",
                )
            global_env[key], env_from[key] = value, env_from.get(key, sid)
        offset = len(merged)
        for b in bf.bindings:  # already in rank order
            merged.append(
                replace(
                    b,
                    rank=offset + b.rank,
                    subcontext=sid,
                    mesh_graph_desc_path=bf.mesh_graph_desc_path,
                    origin=f"sub-context {sid} rank {b.rank}, {ids[sid]}",
                )
            )
        sizes.append(len(bf.bindings))
        if len(merged) > numeric.MAX_CHIPS:
            raise bad_input(f"{path}: more than {numeric.MAX_CHIPS} ranks in all")
    return ttrun.BindingFile(path, merged, global_env, first_mgd, sizes)


def _overlay(mapping: str, named: str, environ: dict[str, str], cwd: str) -> str:
    """An overlay's path as tt-run finds it: relative to the mapping file first, then under
    TT_METAL_HOME, then the launch directory."""
    given = Path(named).expanduser()
    if given.is_absolute():
        return str(given)
    bases = [Path(mapping).resolve().parent]
    if environ.get("TT_METAL_HOME"):
        bases.append(Path(environ["TT_METAL_HOME"]))
    bases.append(Path(cwd))
    found = next((b / given for b in bases if (b / given).is_file()), None)
    if found is None:
        raise bad_input(
            f"{mapping}: rank-binding file {named} not found (looked beside the mapping, "
            "under TT_METAL_HOME and in this directory)",
            "fix the path in the mapping",
        )
    return str(found)
