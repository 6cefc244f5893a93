"""YAML reading that keeps PCI addresses as strings.

PyYAML follows YAML 1.1, where ``0000:01:00.0`` is a base-60 number (60.0) and ``0x01`` an int.
tt-umd writes BDFs unquoted, so every YAML that ttmesh reads goes through this loader, which keeps
YAML 1.2's plain decimal and hex integers and floats and treats everything else as a string.
PyYAML is imported on first use only (design: yaml only when reading YAML), and a file ttmesh
reads on every launch (the serving profiles; the table of known failures) is parsed once:
:func:`load_cached` keeps what it parsed as JSON in the user's cache while the file is unchanged.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

CACHE_VERSION = 1  # bump when what the loader makes of a file changes

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
    """Parse YAML text; raises ``ValueError`` with the parser's message on malformed input."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader())
    except yaml.YAMLError as exc:
        raise ValueError(str(exc).replace("\n", " ")) from exc


def load_file(path: str | Path, what: str = "file") -> Any:
    """Parse a YAML file the user named; a missing, unreadable or non-file path is bad input."""
    from ttmesh import paths

    return loads(paths.read_text(path, what))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ttmesh" / "parsed"


def load_cached(path: str | Path, what: str = "file") -> Any:
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
        return load_file(path, what)  # the reader says what is wrong with it
    key = [CACHE_VERSION, name, st.st_mtime_ns, st.st_size, st.st_ino]
    cache = _cache_dir() / f"{zlib.crc32(name.encode()):08x}-{os.path.basename(name)}.json"
    try:
        with open(cache) as f:
            saved = json.load(f)
        if saved.get("key") == key:
            return saved["value"]
    except (OSError, ValueError, AttributeError, KeyError):
        pass
    value = load_file(path, what)
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
