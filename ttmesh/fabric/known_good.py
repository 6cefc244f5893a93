"""The last known-good topology of a real host: which chips and Ethernet links it had when healthy.

On real hardware the topology comes from tt-umd's discovery, which only sees the links that train:
after a crash a link that stays down simply vanishes from it. So every check that finds all links
up records the topology, and later checks expect those links too; a link that disappeared is then
"down", not silently absent, and a chip that disappeared is "missing".

Records live under the user's state directory (``$XDG_STATE_HOME/ttmesh/topology``, default
``~/.local/state/ttmesh/topology``; ``TTMESH_TOPOLOGY_DIR`` overrides), one JSON file per set of
chips, named by the SHA-256 of their sorted unique ids. Chips are known by unique id only, never
by ``/dev/tenstorrent`` number. A host that lost a chip no longer hashes to its record's name, so
lookups pick the record sharing the most chips with what the host has now (unique ids never repeat
across hosts, so a home directory shared by several hosts is fine).

A simulated host does not use records: its cluster descriptor is already the complete topology.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from ttmesh.dataclass import dataclass, field
from ttmesh.fabric.devices import Inventory, LinkSpec

SCHEMA = "ttmesh.topology/1"


@dataclass
class Record:
    """A recorded topology: the chips and links a host had when every link was up."""

    path: Path
    chips: dict[str, dict]  # asic id -> {"bdf", "board_type", "arch", "via"}
    links: list[LinkSpec]
    written: float = 0.0
    host: str = ""
    pairs: dict[frozenset, int] = field(default_factory=dict)  # links per chip pair


def _hostname() -> str:
    import socket

    return socket.gethostname()


def store_dir() -> Path:
    override = os.environ.get("TTMESH_TOPOLOGY_DIR")
    if override:
        return Path(override)
    from ttmesh.paths import xdg_dir

    base = xdg_dir("XDG_STATE_HOME", os.path.join(".local", "state")) or "."
    return Path(base) / "ttmesh" / "topology"


def host_key(asics: Iterable[str]) -> str:
    import hashlib  # (this module is on the launch path, which never records: imports on use)

    return hashlib.sha256(",".join(sorted(set(asics))).encode()).hexdigest()


def link_key(link: LinkSpec) -> frozenset:
    return frozenset({(link.a, link.chan_a), (link.b, link.chan_b)})


def pair_key(link: LinkSpec) -> frozenset:
    return frozenset({link.a, link.b})


def _parse(path: Path) -> Record | None:
    try:
        from ttmesh import fileread

        data = json.loads(fileread.read_bytes(path, fileread.MiB, "topology record"))
    except (OSError, ValueError):  # fileread.Refused is a ValueError
        return None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None
    try:
        chips = {str(c["asic_id"]): dict(c) for c in data["chips"]}
        links = [
            LinkSpec(
                str(lk["a"]["asic_id"]),
                int(lk["a"]["chan"]),
                str(lk["b"]["asic_id"]),
                int(lk["b"]["chan"]),
            )
            for lk in data["links"]
        ]
    except (KeyError, TypeError, ValueError):
        return None
    pairs: dict[frozenset, int] = {}
    for lk in links:
        pairs[pair_key(lk)] = pairs.get(pair_key(lk), 0) + 1
    return Record(
        path, chips, links, float(data.get("written") or 0), str(data.get("host", "")), pairs
    )


def find(asics: Iterable[str], directory: Path | None = None) -> Record | None:
    """The record that shares the most chips with ``asics`` (newest first on a tie), or None."""
    wanted = set(asics)
    directory = store_dir() if directory is None else directory
    if not wanted:
        return None
    exact = _parse(directory / f"{host_key(wanted)}.json")
    if exact is not None:
        return exact
    best: tuple[int, float] | None = None
    chosen = None
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return None
    for path in paths:
        rec = _parse(path)
        if rec is None:
            continue
        overlap = len(wanted & set(rec.chips))
        if overlap == 0:
            continue
        score = (overlap, rec.written)
        if best is None or score > best:
            best, chosen = score, rec
    return chosen


def merge(inv: Inventory, record: Record | None) -> tuple[list[LinkSpec], list[str]]:
    """Links discovery sees plus those only the record has; chips the record has and the host lost."""
    links = list(inv.links)
    if record is None:
        return links, list(inv.missing)
    seen = {link_key(lk) for lk in links}
    for lk in record.links:
        if link_key(lk) not in seen:
            seen.add(link_key(lk))
            links.append(lk)
    present = {c.asic_id for c in inv.chips}
    missing = list(inv.missing)
    for asic in sorted(record.chips):
        if asic not in present and asic not in missing:
            missing.append(asic)
    return links, missing


def save(inv: Inventory, links: list[LinkSpec], directory: Path | None = None) -> Path | None:
    """Record ``inv``'s chips and ``links`` as known good. Never fails a check: None on errors.

    Records of a subset of these chips (the same host before a card was added) are replaced.
    """
    directory = store_dir() if directory is None else directory
    asics = {c.asic_id for c in inv.chips}
    if not asics:
        return None
    doc = {
        "schema": SCHEMA,
        "written": time.time(),
        "host": _hostname(),
        "chips": [
            {
                "asic_id": c.asic_id,
                "bdf": c.bdf,
                "board_type": c.board_type,
                "arch": c.arch,
                "via": c.via,
            }
            for c in inv.chips
        ],
        "links": [
            {"a": {"asic_id": lk.a, "chan": lk.chan_a}, "b": {"asic_id": lk.b, "chan": lk.chan_b}}
            for lk in links
        ],
    }
    path = directory / f"{host_key(asics)}.json"
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        old = _parse(path)
        if old is not None and set(old.chips) == asics and _same_links(old.links, links):
            return path  # unchanged: keep the file as it is
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=".topology.", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
        for other in directory.glob("*.json"):
            if other == path:
                continue
            rec = _parse(other)
            if rec is not None and set(rec.chips) < asics:
                with contextlib.suppress(OSError):
                    other.unlink()
    except OSError:
        return None
    return path


def _same_links(a: list[LinkSpec], b: list[LinkSpec]) -> bool:
    return {link_key(lk) for lk in a} == {link_key(lk) for lk in b}
