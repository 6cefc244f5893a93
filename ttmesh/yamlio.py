"""YAML reading that keeps PCI addresses as strings.

PyYAML follows YAML 1.1, where ``0000:01:00.0`` is a base-60 number (60.0) and ``0x01`` an int.
tt-umd writes BDFs unquoted, so every YAML that ttmesh reads goes through this loader, which keeps
YAML 1.2's plain decimal and hex integers and floats and treats everything else as a string.
PyYAML is imported on first use only (design: yaml only when reading YAML), and a file ttmesh
reads on every launch (the serving profiles; the table of known failures) is parsed once:
:func:`load_cached` keeps what it parsed as JSON in the user's cache while the file is unchanged.

A YAML file can be small and still mean something huge: aliases (``*a``) refer to an anchored
node, and nine lists of nine aliases to the previous one (a "billion laughs") are a few hundred
bytes that stand for 9^9 strings. PyYAML's safe loader shares the node (cheap to parse), but
whatever walks the result (``str()`` of a value, the JSON cache) expands it and takes the
machine's memory. :func:`loads` counts the nodes a document stands for, aliases expanded, and
refuses one that expands to more than :data:`MAX_EXPANSION` times its written nodes (plus
:data:`EXPANSION_SLACK`), or that refers to itself.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

CACHE_VERSION = 1  # bump when what the loader makes of a file changes

CACHE_LIMIT = 64 * 1024 * 1024  # a cached parse larger than this is parsed again instead
MAX_EXPANSION = 10  # nodes a document may stand for, per node written (aliases expanded) ...
EXPANSION_SLACK = 10_000  # ... plus these
_INT = re.compile(r"^(?:[-+]?[0-9]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")


@cache
def _loader() -> type:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        pass

    dropped = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
    Loader.yaml_implicit_resolvers = {
        key: [(tag, rx) for tag, rx in resolvers if tag not in dropped]
        for key, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))

    def construct_int(loader: Any, node: Any) -> int:
        text = loader.construct_scalar(node)
        return int(text, 16) if text.lower().startswith("0x") else int(text, 10)

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    return Loader


def loads(text: str) -> Any:
    """Parse YAML text; raises ``ValueError`` with the parser's message on malformed input, on
    nesting too deep to parse, and on aliases that expand past the bound (module docstring)."""
    import yaml

    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).replace("\n", " ")) from exc
    except RecursionError:
        raise ValueError("nested too deeply") from None
    finally:
        loader.dispose()


def loads_as_pyyaml(text: str) -> Any:
    """YAML text as another program's ``yaml.safe_load`` reads it (YAML 1.1: ``017`` is 15,
    ``1_000`` is 1000), for a file ttmesh must read exactly as that program will (SGLang's
    ``--config``); aliases are bounded as in :func:`loads`."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).replace("\n", " ")) from exc
    except RecursionError:
        raise ValueError("nested too deeply") from None
    finally:
        loader.dispose()


def _check_expansion(root: Any) -> None:
    """Refuse a node graph whose aliases expand it past the bound (iteratively: a deep
    document does not exhaust the stack)."""
    import yaml

    size: dict[int, int] = {}  # node id -> nodes it stands for, aliases expanded
    stack: list[tuple[Any, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1
            if isinstance(node, yaml.SequenceNode):
                total += sum(size[id(child)] for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                total += sum(size[id(k)] + size[id(v)] for k, v in node.value)
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise ValueError("an alias refers to a node that contains it (a recursive document)")
        if isinstance(node, yaml.ScalarNode):
            size[key] = 1
            continue
        on_path.add(key)
        stack.append((node, True))
        children = (
            node.value
            if isinstance(node, yaml.SequenceNode)
            else [x for pair in node.value for x in pair]
        )
        stack.extend((child, False) for child in children if id(child) not in size)
    limit = MAX_EXPANSION * len(size) + EXPANSION_SLACK
    if size[id(root)] > limit:
        raise ValueError(
            f"its aliases (*name) expand {len(size)} nodes to {size[id(root)]}, more than "
            f"{limit}: a document that stands for that much is refused"
        )


def load_file(path: str | Path, what: str = "file", limit: int | None = None) -> Any:
    """Parse a YAML file the user named; a missing, unreadable or non-file path, or one larger
    than ``limit`` bytes (default: :data:`ttmesh.paths.DEFAULT_LIMIT`), is bad input."""
    from ttmesh import paths

    return loads(paths.read_text(path, what, limit or paths.DEFAULT_LIMIT))


def _cache_dir() -> Path:
    from ttmesh.paths import xdg_dir

    return Path(xdg_dir("XDG_CACHE_HOME", ".cache") or ".") / "ttmesh" / "parsed"


def load_cached(path: str | Path, what: str = "file", limit: int | None = None) -> Any:
    """:func:`load_file`, remembering the result (as JSON, in the user's cache) while the file
    keeps its modification time, size and inode: importing PyYAML and parsing cost tens of
    milliseconds, a JSON read well under one. A result JSON cannot hold as it is (a map with
    number keys, a date) is not cached. The cache is an optimisation only: any problem with it
    parses the file again."""
    import zlib

    name = os.path.abspath(path)
    try:
        st = os.stat(name)
    except OSError:
        return load_file(path, what, limit)  # the reader says what is wrong with it
    key = [CACHE_VERSION, name, st.st_mtime_ns, st.st_size, st.st_ino]
    cache = _cache_dir() / f"{zlib.crc32(name.encode()):08x}-{os.path.basename(name)}.json"
    try:
        from ttmesh import fileread

        saved = json.loads(fileread.read_bytes(cache, CACHE_LIMIT, "cached parse"))
        if saved.get("key") == key:
            return saved["value"]
    except (OSError, ValueError, AttributeError, KeyError):  # fileread.Refused is a ValueError
        pass
    value = load_file(path, what, limit)
    try:
        text = json.dumps({"key": key, "value": value})
        if json.loads(text)["value"] == value:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, cache)
    except (OSError, TypeError, ValueError):
        pass
    return value
