"""tt-run compatibility: its rank-binding YAML, written from a ttmesh plan.

tt-run (tt-metal's MPI launcher) reads ``rank_bindings`` (rank, mesh_id, mesh_host_rank,
env_overrides), ``global_env`` and ``mesh_graph_desc_path``; each rank then gets TT_MESH_ID,
TT_MESH_HOST_RANK and TT_MESH_GRAPH_DESC_PATH from it. ttmesh writes the file so a plan can be
handed to tt-run (or to ``ttmesh launch --rank-binding``) unchanged.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input
from ttmesh.fabric.devices import Inventory
from ttmesh.launcher.planning.rankenv import ENV_KEY, owner_flag
from ttmesh.mesh.select import Unit
from ttmesh.render import plural


def dump(data: dict[str, Any], header: str = "") -> str:
    import yaml

    head = "".join(f"# {line}\n" for line in header.splitlines())
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


# --------------------------------------------------------------------------- reading tt-run files

MAX_BYTES = 1024 * 1024  # a rank binding is KiB: a Galaxy of 32 ranks' is about 3 KiB

# What a binding may set although ttmesh sets it for every rank (``launcher.planning.rankenv.OWNED``, which
# --env may not set): tt-run's format carries them, and ttmesh's own export writes them. A
# rank's chips (read as its chips, then passed on by PCI address), a rank's own mesh graph
# descriptor (the isolated layout) and the symmetric DRAM every rank gets.
BINDING_SETS = {
    "env_overrides": {
        "TT_VISIBLE_DEVICES",
        "TT_METAL_VISIBLE_DEVICES",  # the older key, still in tt-metal's own files
        "TT_MESH_GRAPH_DESC_PATH",
        "LIBTT_SYMMETRIC_DRAM_MB",
    },
    "global_env": {"TT_MESH_GRAPH_DESC_PATH", "LIBTT_SYMMETRIC_DRAM_MB"},
}
# tt-run takes these from the binding's own fields.
_FROM_FIELDS = {
    "TT_MESH_ID": "set the rank's mesh_id instead",
    "TT_MESH_HOST_RANK": "set the rank's mesh_host_rank instead",
    "TT_VISIBLE_DEVICES": "give each rank its chips in its own env_overrides",
    "TT_METAL_VISIBLE_DEVICES": "give each rank its chips in its own env_overrides",
}
# A rank's chips, by either name tt-metal reads (tt-run passes both through as written).
CHIP_KEYS = ("TT_VISIBLE_DEVICES", "TT_METAL_VISIBLE_DEVICES")


def _env(path: str, where: str, kind: str, raw: Any, environ: dict[str, str]) -> dict[str, str]:
    """A binding's ``global_env`` or ``env_overrides``, expanded as tt-run does. A binding may
    not set what ttmesh owns, exactly as --env may not (one line naming the file, the key and
    the variable, and what sets it instead)."""
    if not isinstance(raw, dict):
        raise bad_input(f"{path}: {where} must be a map")
    out = {}
    for k, v in raw.items():
        key = str(k)
        if not ENV_KEY.match(key):
            raise bad_input(
                f"{path}: {where}: {key[:80]!r} is not an environment variable name",
                "letters, digits and '_', not starting with a digit",
            )
        flag = None if key in BINDING_SETS[kind] else owner_flag(key)
        if flag is not None:
            hint = _FROM_FIELDS.get(key) or (
                f"drop it: use {flag} instead" if flag.startswith("--") else f"drop it: {flag}"
            )
            raise bad_input(f"{path}: {where} sets {key}, which ttmesh sets for every rank", hint)
        value = _expand(str(v), environ, f"{path}: {where}")
        if "\0" in value:
            raise bad_input(f"{path}: {where}: {key} holds a NUL byte", "edit the file")
        out[key] = value
    return out


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Binding:
    rank: int
    mesh_id: int
    mesh_host_rank: int | None
    env_overrides: dict[str, str]
    # Set by --rank-bindings-mapping (adapters.subcontexts): the rank's sub-context, the
    # descriptor of its overlay, and where it came from (for the lines that name it).
    subcontext: int | None = None
    mesh_graph_desc_path: str | None = None
    origin: str = ""


@dataclass
class BindingFile:
    path: str
    bindings: list[Binding]
    global_env: dict[str, str]
    mesh_graph_desc_path: str
    subcontext_sizes: list[int] = field(default_factory=list)  # [] without a mapping

    def descriptor_of(self, b: Binding) -> str:
        return b.mesh_graph_desc_path or self.mesh_graph_desc_path

    def descriptors(self) -> dict[str, str]:
        """The plan's named descriptors: one, or one per sub-context."""
        if not self.subcontext_sizes:
            return {"mesh": self.mesh_graph_desc_path}
        return {f"subcontext{b.subcontext}": self.descriptor_of(b) for b in self.bindings}

    def who(self, b: Binding) -> str:
        return f"{self.path}: rank {b.rank}" + (f" ({b.origin})" if b.origin else "")


def _expand(value: str, environ: dict[str, str], where: str) -> str:
    """tt-run expands ${VAR}; an unset variable is an error here, not a silent literal."""

    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in environ:
            raise bad_input(
                f"{where}: ${{{name}}} is not set", f"export {name}=... or edit the file"
            )
        return environ[name]

    return _VAR.sub(sub, value)


def load(path: str, environ: dict[str, str], cwd: str) -> BindingFile:
    """Read and check a tt-run rank-binding file the way tt-run's own model does."""
    from ttmesh import yamlio

    try:
        data = yamlio.load_file(path, "rank binding", MAX_BYTES)
    except ValueError as exc:
        raise bad_input(f"{path}: not valid YAML: {exc}")
    if not isinstance(data, dict) or not isinstance(data.get("rank_bindings"), list):
        raise bad_input(f"{path}: no rank_bindings list", "see tt-run's rank-binding format")
    bindings = []
    for i, raw in enumerate(data["rank_bindings"]):
        where = f"{path}: rank_bindings[{i}]"
        if not isinstance(raw, dict) or "rank" not in raw or "mesh_id" not in raw:
            raise bad_input(f"{where}: needs rank and mesh_id")
        # Whole numbers a job can have (rank: 1e12 would make the gap check below count to it).
        rank, mesh_id = (
            numeric.whole(raw[key], f"{where}: {key}", high=numeric.MAX_CHIPS - 1)
            for key in ("rank", "mesh_id")
        )
        host_rank = (
            None
            if raw.get("mesh_host_rank") is None
            else numeric.whole(
                raw["mesh_host_rank"], f"{where}: mesh_host_rank", high=numeric.MAX_CHIPS - 1
            )
        )
        expanded = _env(
            path,
            f"rank_bindings[{i}].env_overrides",
            "env_overrides",
            raw.get("env_overrides") or {},
            environ,
        )
        bindings.append(Binding(rank, mesh_id, host_rank, expanded))
    ranks = sorted(b.rank for b in bindings)
    if len(set(ranks)) != len(ranks):
        raise bad_input(f"{path}: a rank appears twice in rank_bindings")
    if ranks != list(range(len(ranks))):
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
        raise bad_input(
            f"{path}: ranks must run 0..{len(ranks) - 1} without gaps (missing {missing})"
        )
    global_env = _env(path, "global_env", "global_env", data.get("global_env") or {}, environ)
    mgd = data.get("mesh_graph_desc_path")
    if not mgd:
        raise bad_input(f"{path}: no mesh_graph_desc_path")
    mgd_path = Path(_expand(str(mgd), environ, f"{path}: mesh_graph_desc_path")).expanduser()
    if not mgd_path.is_absolute():
        candidates = (
            [Path(environ["TT_METAL_HOME"]) / mgd_path] if environ.get("TT_METAL_HOME") else []
        )
        candidates += [Path(cwd) / mgd_path, Path(path).resolve().parent / mgd_path]
        mgd_path = next((c for c in candidates if c.is_file()), candidates[-1])
    if mgd_path.exists() and not mgd_path.is_file():
        from ttmesh.fileread import kind_of

        kind = "a directory" if mgd_path.is_dir() else kind_of(mgd_path.stat().st_mode)
        raise bad_input(
            f"{path}: mesh graph descriptor {mgd_path} is {kind}, not a regular file",
            "give mesh_graph_desc_path a .textproto file",
        )
    if not mgd_path.is_file():
        raise bad_input(f"{path}: mesh graph descriptor {mgd} not found")
    return BindingFile(
        path, sorted(bindings, key=lambda b: b.rank), global_env, str(mgd_path.resolve())
    )


def rank_units(
    bf: BindingFile, inv: Inventory, units: list[Unit], host: str = ""
) -> list[tuple[Unit, ...]]:
    """Each rank's chips, from the TT_VISIBLE_DEVICES (or the older TT_METAL_VISIBLE_DEVICES)
    of its env_overrides, for the ranks of one host (``host``: its name, over several). A rank
    that names none drives every chip of its host, as tt-metal opens every chip it sees: only
    when it is the host's one rank (tt-metal's bh_qb_4x4 file is one rank on each of four
    hosts), never two ranks on the same chips."""
    by_bdf = {u.bdf: u for u in units}
    by_index = {c.pci_index: c.bdf for c in inv.chips if c.bdf}

    def chips(b: Binding, key: str) -> list[Unit]:
        """The units ``key`` of the rank's env_overrides names, by PCI address or index."""
        chosen: list[Unit] = []
        items = [v.strip() for v in b.env_overrides[key].split(",") if v.strip()]
        if not items:
            raise bad_input(f"{bf.who(b)}: {key} is empty", "name the rank's chips, or drop it")
        for item in items:
            bdf = by_index.get(int(item)) if numeric.digits(item) else item.lower()
            if bdf not in by_bdf:
                raise bad_input(
                    f"{bf.who(b)}: {key} entry {item!r} is no chip here",
                    "chips here: " + ", ".join(sorted(by_bdf)),
                )
            if by_bdf[bdf] not in chosen:
                chosen.append(by_bdf[bdf])
        return chosen

    named: list[list[Unit] | None] = []
    for b in bf.bindings:
        given = {key: chips(b, key) for key in CHIP_KEYS if key in b.env_overrides}
        if len(given) == 2 and given[CHIP_KEYS[0]] != given[CHIP_KEYS[1]]:
            raise bad_input(
                f"{bf.who(b)}: TT_VISIBLE_DEVICES {b.env_overrides[CHIP_KEYS[0]]!r} and "
                f"TT_METAL_VISIBLE_DEVICES {b.env_overrides[CHIP_KEYS[1]]!r} name different chips (or the same in another order)",
                "keep one of them",
            )
        named.append(next(iter(given.values()), None))
    bare = [b.rank for b, v in zip(bf.bindings, named, strict=True) if v is None]
    if bare and len(bf.bindings) > 1:
        raise bad_input(*_shared_host(bf, bare, host))
    taken: dict[str, int] = {}
    out = []
    for b, chosen in zip(bf.bindings, named, strict=True):
        for u in chosen or []:
            if u.bdf in taken and taken[u.bdf] != b.rank:
                raise bad_input(f"{bf.path}: {u.bdf} is given to ranks {taken[u.bdf]} and {b.rank}")
            taken[u.bdf] = b.rank
        out.append(tuple(units) if chosen is None else tuple(chosen))
    return out


def _shared_host(bf: BindingFile, bare: list[int], host: str) -> tuple[str, str]:
    """Why ranks that name no chips cannot share a host, and what to do: (what, fix)."""
    count = len(bf.bindings)
    if host:  # over several hosts: the rankfile put them together
        ranks = " and ".join(map(str, [b.rank for b in bf.bindings][:2]))
        return (
            f"{bf.path}: ranks {ranks} are both on host {host}, and rank {bare[0]} names no chips "
            "(no TT_VISIBLE_DEVICES: it drives every chip of its host, the other's too)",
            "put each rank that names no chips on a host of its own (the rankfile), or give "
            "each rank its TT_VISIBLE_DEVICES",
        )
    meshes = sorted({b.mesh_id for b in bf.bindings})
    host_ranks = sorted(b.mesh_host_rank for b in bf.bindings if b.mesh_host_rank is not None)
    shape = ""
    if len(meshes) == 1 and host_ranks == list(range(count)):
        shape = f" (mesh {meshes[0]}, mesh_host_rank 0-{count - 1})"
    if len(bare) == count:
        what = (
            f"{bf.path}: {plural(count, 'rank')} name no chips (no TT_VISIBLE_DEVICES in "
            f"env_overrides): such a file is one rank per host{shape}, each driving every chip "
            "of its host, and on one host they would all drive the same chips"
        )
        return what, (
            f"run it over {count} hosts with --hosts HOST,... , or give each rank its "
            "TT_VISIBLE_DEVICES"
        )
    return (
        f"{bf.path}: rank {bare[0]} names no chips (no TT_VISIBLE_DEVICES in env_overrides): "
        "it would drive every chip of this host, the other ranks' too"
    ), f"give rank {bare[0]} its TT_VISIBLE_DEVICES"


def binding_env(
    b: Binding, bf: BindingFile, environ: dict[str, str], cwd: str, cwd_refusal: str | None
) -> dict[str, str]:
    """What tt-run gives the rank (its managed variables, global_env, env_overrides).
    ``cwd_refusal``: :func:`pythonpath_refusal` of ``cwd``, read before the plan is built."""
    home = environ.get("TT_METAL_HOME", cwd)
    env = {
        "TT_MESH_ID": str(b.mesh_id),
        "TT_MESH_GRAPH_DESC_PATH": bf.descriptor_of(b),
        "TT_METAL_HOME": home,
        "TT_RUN_ORIGINAL_CWD": cwd,
        "TT_RUN_RANK": str(b.rank),
    }
    # tt-run defaults PYTHONPATH to the launch directory (`python tests/x.py` from a checkout
    # imports the checkout's package); a PYTHONPATH of yours is kept as it is, as tt-run does.
    if "PYTHONPATH" not in environ and cwd_refusal is None:
        env["PYTHONPATH"] = cwd
    # tt-run defaults TT_METAL_RUNTIME_ROOT to the launch directory, where an installed ttnn
    # wheel then looks for its SoC descriptors and fails ("SoC descriptor file does not
    # exist"); ttmesh passes it only when you set it.
    if "TT_METAL_RUNTIME_ROOT" in environ:
        env["TT_METAL_RUNTIME_ROOT"] = environ["TT_METAL_RUNTIME_ROOT"]
    if b.mesh_host_rank is not None:
        env["TT_MESH_HOST_RANK"] = str(b.mesh_host_rank)
    if b.subcontext is not None:  # tt-metal splits its world by these (--rank-bindings-mapping)
        sizes = bf.subcontext_sizes
        env["TT_RUN_SUBCONTEXT_ID"] = str(b.subcontext)
        env["TT_RUN_SUBCONTEXT_SIZE"] = str(sizes[b.subcontext])
        env["TT_RUN_SUBCONTEXT_COUNT"] = str(len(sizes))
        env["TT_RUN_SUBCONTEXT_SIZES"] = ",".join(map(str, sizes))
    env.update(bf.global_env)
    env.update(b.env_overrides)
    return env


def pythonpath_refusal(cwd: str) -> str | None:
    """Why the launch directory is not put on the ranks' PYTHONPATH, or None. ttmesh runs as
    root on shared hosts: a directory another user can write (or owns) could hold a module
    they planted, which every rank would import."""
    try:
        st = os.stat(cwd)
    except OSError as exc:
        return f"{cwd} cannot be read ({exc.strerror})"
    if st.st_uid not in (os.geteuid(), 0):
        return f"{cwd} is another user's"
    if st.st_mode & 0o002:
        return f"{cwd} is writable by other users"
    return None


def where_note(
    workdir: str, cwd: str, env: Mapping[str, str], environ: dict[str, str], cwd_refusal: str | None
) -> str:
    """What --dry-run says about where a rank-binding job's ranks run and what they import."""
    where = (
        f"ranks run in {workdir} (--workdir)"
        if workdir
        else f"ranks run in {cwd}, the launch directory, as tt-run runs them (--workdir DIR for "
        "another)"
    )
    if "PYTHONPATH" in environ:
        path = "PYTHONPATH kept as you set it (tt-run adds the launch directory only when unset)"
    elif env.get("PYTHONPATH") == cwd:
        path = f"PYTHONPATH={cwd} added (unset here; tt-run's default)"
    elif "PYTHONPATH" in env:
        path = "PYTHONPATH as the rank binding sets it"
    else:
        path = f"PYTHONPATH not set to the launch directory: {cwd_refusal}"
    return f"{where}; {path}"
