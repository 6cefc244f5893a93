"""tt-run's two ways of naming a job's ranks: ``--rank-binding`` (one file) and
``--rank-bindings-mapping`` (a file per sub-context), one at a time, as tt-run takes them."""

from __future__ import annotations

import os
from typing import Any

from ttmesh import paths
from ttmesh.errors import bad_input


def binding_flag(rank_binding: str | None, mapping: str | None) -> str | None:
    """The file that names the ranks (either flag's), refusing both at once."""
    if rank_binding is not None and mapping is not None:
        raise bad_input(
            "--rank-binding and --rank-bindings-mapping together",
            "give one: the mapping names every sub-context's rank-binding file",
        )
    return rank_binding if rank_binding is not None else mapping


def load(path: str, mapping: str | None) -> Any:
    """The rank-binding file (adapters.ttrun.BindingFile) of either flag."""
    if mapping is not None:
        from ttmesh.launcher.adapters import subcontexts

        return subcontexts.load(path, dict(os.environ), paths.cwd())
    from ttmesh.launcher.adapters import ttrun

    return ttrun.load(path, dict(os.environ), paths.cwd())
