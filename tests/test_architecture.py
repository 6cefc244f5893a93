"""The shape of the house (docs/architecture.md), checked as code: no import circle anywhere in
``ttmesh``, no function a reader cannot hold in view, no folder a newcomer must scan.

Import circles are counted as grimp (import-linter's graph) finds them: imports inside
functions and under ``TYPE_CHECKING`` included, since a lazy import is still a dependency a
reader must follow and a refactor must not break."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ttmesh"
MAX_FUNCTION_LINES = 120
MAX_MODULES = 14
# tt-smi's stand-in: one long function mirrors one JSON object of the real tool's output.
STAND_INS = {PACKAGE / "sim" / "tt_smi.py"}
# The command line holds one module per command: its size is the command count.
ONE_PER_COMMAND = {PACKAGE / "cli"}


def _circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check below can fail: two modules importing each other (one lazily) are a circle."""
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from circ import b\n")
    (pkg / "b.py").write_text("def f():\n    from circ import a\n")
    (pkg / "c.py").write_text("from circ import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _circles(grimp.build_graph("circ", cache_dir=None)) == [["circ.a", "circ.b"]]


def test_no_import_circle_in_ttmesh() -> None:
    assert _circles(grimp.build_graph("ttmesh", cache_dir=None)) == []


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path}:{node.lineno} {node.name} ({lines} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES  # type: ignore[operator]
    ]


def test_no_function_over_120_lines() -> None:
    long = [
        f
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in STAND_INS
        for f in _long_functions(path)
    ]
    assert long == []


def test_the_length_check_counts_a_long_function(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def long():\n{body}")
    assert len(_long_functions(tmp_path / "m.py")) == 1  # 121 lines with its def


def test_no_folder_over_14_modules() -> None:
    crowded = {}
    for folder in sorted(p for p in PACKAGE.rglob("*") if p.is_dir()):
        if folder in ONE_PER_COMMAND or folder.name == "__pycache__":
            continue
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES:
            crowded[str(folder.relative_to(PACKAGE.parent))] = len(modules)
    assert crowded == {}
