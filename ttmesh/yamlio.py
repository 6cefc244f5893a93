"""YAML reading that keeps PCI addresses as strings.

PyYAML follows YAML 1.1, where ``0000:01:00.0`` is a base-60 number (60.0) and ``0x01`` an int.
tt-umd writes BDFs unquoted, so every YAML that ttmesh reads goes through this loader, which keeps
YAML 1.2's plain decimal and hex integers and floats and treats everything else as a string.
PyYAML is imported on first use only (design: yaml only when reading YAML).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

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
