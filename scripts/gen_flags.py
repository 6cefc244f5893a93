#!/usr/bin/env python3
"""Generate a serving profile's flag table (ttmesh/configs/profiles/<name>.flags.json) from the
server's own argument parser, so ttmesh reads a command as the server will.

    python scripts/gen_flags.py sglang                  # stock SGLang 0.5.23, from the rig's venv
    python scripts/gen_flags.py sglang-torchtpu         # SGLang 0.5.23 + the tpu_oot plugin's flags
    python scripts/gen_flags.py sglang-jax --source SRC # an SGLang-JAX checkout at the pinned commit
    python scripts/gen_flags.py --check [NAME ...]      # exit 1 when a stored table is out of date

How each table is made (its header says the same):

* ``sglang``: the real SGLang that scripts/sglang-cpu/setup installs (``TTMESH_SGLANG_DIR``, else
  ~/.cache/ttmesh-sglang) builds its parser exactly as ``prepare_server_args`` does
  (``argparse.ArgumentParser(prog="sglang serve")`` + ``ServerArgs.add_cli_args``), and this
  script, run by that venv's Python (standard library only), writes down every action.
* ``sglang-torchtpu``: SGLang-TorchTPU is stock SGLang with its ``tpu_oot`` platform plugin
  (``SGLANG_PLATFORM`` names a platform plugin's entry point in stock SGLang). The plugin's own
  source is not published where this could be generated from, so its table is the ``sglang``
  table (``base``) plus the plugin's two flags as its guide uses them (``--tpu-compile-bs 1 4``,
  ``--tpu-compile-tokens 64``), written down here and marked ``by_hand``.
* ``sglang-jax``: SGLang-JAX needs JAX and TPU libraries to import, so its ``server_args.py`` (and
  the multimodal arguments ``from_cli`` adds) run against stubs: every module it imports is a
  stand-in whose names come from that module's own source read as a syntax tree (literal lists,
  dicts' keys, a function's name), everything else an inert placeholder. ``add_cli_args`` then
  runs for real on ``argparse.ArgumentParser()``. SRC is a checkout, or ``GIT_DIR@COMMIT``.
  Nothing of SGLang-JAX is copied into ttmesh but the table.

``--check`` regenerates what it can here (``sglang`` and ``sglang-torchtpu`` need the rig;
``sglang-jax`` needs ``--source``) and compares it with the stored file.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROFILES = REPO / "ttmesh" / "configs" / "profiles"
SCHEMA = "ttmesh.flags/1"
SGLANG_VERSION = "0.5.23"
JAX_REPO = "https://github.com/sgl-project/sglang-jax"
JAX_COMMIT = "c44938c0b5c2c51fe49b4a9a03ed8875cbbd3d6f"  # refs/pull/1527/head, the TT backend
JAX_FILES = (
    "python/sgl_jax/srt/server_args.py",
    "python/sgl_jax/srt/multimodal/common/ServerArgs.py",
)

# SGLang-TorchTPU's plugin flags, as the SGLang-TorchTPU guide runs them (``--tpu-compile-bs 1 4
# --tpu-compile-tokens 64``): the batch sizes and prefill lengths it compiles, integers, one or more.
TORCHTPU_FLAGS = [
    {"options": ["--tpu-compile-bs"], "dest": "tpu_compile_bs", "kind": "store", "nargs": "+",
     "type": "int"},
    {"options": ["--tpu-compile-tokens"], "dest": "tpu_compile_tokens", "kind": "store",
     "nargs": "+", "type": "int"},
]  # fmt: skip


# --------------------------------------------------------------------------- reading a parser
# (runs in the server's own Python: standard library only)

_KINDS = [  # most specific first: BooleanOptionalAction before store, extend before append
    ("BooleanOptionalAction", "boolean_optional"),
    ("_StoreTrueAction", "store_true"),
    ("_StoreFalseAction", "store_false"),
    ("_StoreConstAction", "store_const"),
    ("_AppendConstAction", "append_const"),
    ("_ExtendAction", "extend"),
    ("_AppendAction", "append"),
    ("_CountAction", "count"),
    ("_HelpAction", "help"),
    ("_VersionAction", "version"),
    ("_StoreAction", "store"),
]
# Actions of a server's own, by what they do with what they read (SGLang's argparse_actions).
_CUSTOM = {
    "DeprecatedStoreTrueAction": "store_true",
    "DeprecatedStoreConstAction": "store_const",
    "DeprecatedAliasStoreAction": "store",
    "LoRAPathAction": "store",
}


def _jsonable(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value)) == value
    except (TypeError, ValueError):
        return False


def describe(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The parser's settings and every action, as ``ttmesh.flags/1`` writes them."""
    flags = []
    for action in parser._actions:
        entry: dict[str, Any] = {"options": list(action.option_strings), "dest": action.dest}
        cls = type(action)
        names = [c.__name__ for c in cls.__mro__]
        kind = _CUSTOM.get(cls.__name__)
        if kind is None and cls.__name__ == "DeprecatedAction":
            kind = "error" if getattr(action, "error_message", None) else "ignore"
        if kind is None:
            kind = next((k for n, k in _KINDS if n in names), "custom")
        if cls.__module__ != "argparse":
            entry["class"] = cls.__name__
        entry["kind"] = kind
        if kind not in (
            "store_true",
            "store_false",
            "help",
            "version",
            "count",
            "boolean_optional",
        ):
            entry["nargs"] = action.nargs
        if action.type is not None:
            entry["type"] = getattr(action.type, "__name__", repr(action.type))
        if action.choices is not None:
            choices = list(action.choices)
            if isinstance(action.choices, set | frozenset):
                choices = sorted(choices, key=str)
            entry["choices"] = choices if _jsonable(choices) else [str(c) for c in choices]
        const = getattr(action, "const_value", action.const)
        if kind in ("store_const", "append_const") or (action.nargs == "?" and const is not None):
            entry["const"] = const if _jsonable(const) else repr(const)
        if kind == "error":
            entry["message"] = str(action.error_message)  # type: ignore[attr-defined]
        if action.required:
            entry["required"] = True
        default = action.default
        if default is not None and default is not argparse.SUPPRESS and kind != "help":
            entry["default"] = default if _jsonable(default) else repr(default)
        flags.append(entry)
    return {
        "prog": parser.prog,
        "allow_abbrev": parser.allow_abbrev,
        "add_help": parser.add_help,
        "prefix_chars": parser.prefix_chars,
        "fromfile_prefix_chars": parser.fromfile_prefix_chars,
        "argument_default": parser.argument_default,
        "flags": flags,
    }


def _extract_sglang() -> None:
    """In the rig's venv: SGLang's parser, as ``prepare_server_args`` builds it, on stdout."""
    import sglang
    from sglang.srt import server_args

    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    out = describe(parser)
    out["version"] = sglang.__version__
    out["sha256"] = hashlib.sha256(Path(server_args.__file__).read_bytes()).hexdigest()
    json.dump(out, sys.stdout)


# --------------------------------------------------------------------------- SGLang-JAX, on stubs


class _Inert:
    """A placeholder for whatever a stubbed module has that its source does not spell out."""

    def __init__(self, name: str = "stub") -> None:
        self.__name__ = name

    def __getattr__(self, name: str) -> _Inert:
        return _Inert(name)

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert(self.__name__)

    def __iter__(self) -> Any:
        return iter(())

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


def _literal(node: ast.AST) -> Any:
    """A literal, or a dict/list whose keys/items are literals (values that are not: None)."""
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError):
        pass
    if isinstance(node, ast.Dict):
        return {ast.literal_eval(k): None for k in node.keys if k is not None}
    raise ValueError("not a literal")


def _stub_module(name: str, source: str | None) -> types.ModuleType:
    """A module whose names are what its source spells out literally; the rest inert."""
    module = types.ModuleType(name)
    module.__path__ = []  # a package too, so its submodules can be stubbed
    known: dict[str, Any] = {}
    for node in ast.parse(source).body if source else []:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            known[node.name] = _named_function(node.name)
        elif isinstance(node, ast.ClassDef):
            attrs: dict[str, Any] = {}
            for item in node.body:
                target, value = _assignment(item)
                if target is not None:
                    try:
                        attrs[target] = _literal(value)
                    except (ValueError, SyntaxError):
                        pass
            known[node.name] = type(node.name, (), attrs)
        else:
            target, value = _assignment(node)
            if target is not None:
                try:
                    known[target] = _literal(value)
                except (ValueError, SyntaxError):
                    pass
    module.__dict__.update(known)
    module.__getattr__ = lambda attr: _Inert(attr)  # type: ignore[method-assign]
    return module


def _assignment(node: ast.AST) -> tuple[str | None, Any]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Name):
            return target.id, node.value
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
        return node.target.id, node.value
    return None, None


def _named_function(name: str) -> Any:
    def stand_in(value: Any) -> Any:
        raise RuntimeError(f"{name} is a stand-in: the table records its name only")

    stand_in.__name__ = name
    return stand_in


class _Sources:
    """SGLang-JAX's files: a checkout, or ``GIT_DIR@COMMIT`` (read with ``git show``)."""

    def __init__(self, spec: str) -> None:
        self.git_dir, _, self.commit = spec.partition("@")
        self.spec = spec

    def read(self, rel: str) -> str | None:
        if self.commit:
            proc = subprocess.run(
                ["git", "--git-dir", self.git_dir, "show", f"{self.commit}:{rel}"],
                capture_output=True, text=True,
            )  # fmt: skip
            return proc.stdout if proc.returncode == 0 else None
        path = Path(self.git_dir, rel)
        return path.read_text() if path.is_file() else None

    def revision(self) -> str:
        if self.commit:
            args = ["git", "--git-dir", self.git_dir, "rev-parse", f"{self.commit}^{{commit}}"]
        else:
            args = ["git", "-C", self.git_dir, "rev-parse", "HEAD"]
        proc = subprocess.run(args, capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def _extract_jax(spec: str) -> dict[str, Any]:
    src = _Sources(spec)
    texts = {rel: src.read(rel) for rel in JAX_FILES}
    missing = [rel for rel, text in texts.items() if text is None]
    if missing:
        sys.exit(f"gen_flags: {spec} has no {', '.join(missing)} (give an SGLang-JAX checkout)")

    class Finder:
        """Stub every module SGLang-JAX's arguments import, but the two files that are run."""

        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            top = name.split(".")[0]
            if top not in ("sgl_jax", "jax", "jaxlib", "flax", "numpy", "transformers", "torch"):
                return None
            return importlib.machinery.ModuleSpec(name, self)

        def create_module(self, spec: Any) -> types.ModuleType:
            rel = "python/" + spec.name.replace(".", "/")
            source = src.read(rel + ".py") or src.read(rel + "/__init__.py")
            if spec.name == "sgl_jax.srt.server_args":
                module = types.ModuleType(spec.name)
                sys.modules[spec.name] = module
                exec(compile(texts[JAX_FILES[0]] or "", JAX_FILES[0], "exec"), module.__dict__)
                return module
            return _stub_module(spec.name, None if spec.name.split(".")[0] != "sgl_jax" else source)

        def exec_module(self, module: types.ModuleType) -> None:
            pass

    saved = dict(sys.modules)
    sys.meta_path.insert(0, Finder())
    try:
        server_args = __import__("sgl_jax.srt.server_args", fromlist=["ServerArgs"])
        mm = types.ModuleType("sgl_jax.srt.multimodal.common.ServerArgs")
        sys.modules[mm.__name__] = mm
        exec(compile(texts[JAX_FILES[1]] or "", JAX_FILES[1], "exec"), mm.__dict__)
        # ServerArgs.from_cli: argparse.ArgumentParser(), whose prog is the script's name
        # (python -m sgl_jax.launch_server: launch_server.py).
        parser = argparse.ArgumentParser(prog="launch_server.py")
        server_args.ServerArgs.add_cli_args(parser)
        mm.MultimodalServerArgs.add_cli_args(parser)
    finally:
        sys.meta_path.pop(0)
        for name in set(sys.modules) - set(saved):
            del sys.modules[name]
    out = describe(parser)
    out["revision"] = src.revision()
    out["sha256"] = hashlib.sha256((texts[JAX_FILES[0]] or "").encode()).hexdigest()
    return out


# --------------------------------------------------------------------------- the tables


def rig_python() -> Path:
    base = Path(os.environ.get("TTMESH_SGLANG_DIR") or Path.home() / ".cache" / "ttmesh-sglang")
    return base / "venv" / "bin" / "python"


def _from_rig() -> dict[str, Any]:
    py = rig_python()
    if not py.exists():
        sys.exit(f"gen_flags: no SGLang rig at {py} (build it: bash scripts/sglang-cpu/setup DIR)")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [str(py), str(Path(__file__).resolve()), "--extract-sglang"],
        capture_output=True, text=True, env=env, cwd="/",
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"gen_flags: SGLang's parser could not be read:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def _parser_header(raw: dict[str, Any], **extra: Any) -> dict[str, Any]:
    keys = ("prog", "allow_abbrev", "add_help", "prefix_chars", "fromfile_prefix_chars",
            "argument_default")  # fmt: skip
    return {**{k: raw[k] for k in keys}, **extra}


def table_sglang() -> dict[str, Any]:
    raw = _from_rig()
    if raw["version"] != SGLANG_VERSION:
        sys.exit(
            f"gen_flags: the rig has SGLang {raw['version']}, the profile pins {SGLANG_VERSION}"
        )
    return {
        "schema": SCHEMA,
        "profile": "sglang",
        "server": f"SGLang {SGLANG_VERSION}",
        "source": f"sglang {SGLANG_VERSION} from PyPI (the wheel scripts/sglang-cpu/setup installs): "
        f"https://github.com/sgl-project/sglang/blob/v{SGLANG_VERSION}/python/sglang/srt/server_args.py",
        "source_sha256": raw["sha256"],
        "how": "extracted: SGLang's own ServerArgs.add_cli_args run on argparse.ArgumentParser("
        "prog='sglang serve'), as sglang.srt.server_args.prepare_server_args builds it",
        "regenerate": "python scripts/gen_flags.py sglang",
        "complete": True,
        "config_file": "sglang",  # --config FILE: merged as SGLang's ConfigArgumentMerger does
        "parser": _parser_header(raw),
        "flags": raw["flags"],
    }


def table_torchtpu() -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "profile": "sglang-torchtpu",
        "server": f"SGLang {SGLANG_VERSION} + SGLang-TorchTPU (the tpu_oot plugin)",
        "source": "stock SGLang's table (base: sglang) and the plugin's flags as the SGLang-TorchTPU "
        "on Tenstorrent guide (libtt) runs them; the plugin's own server arguments are not published "
        "where they could be generated from",
        "how": "base table extracted (see sglang.flags.json); the plugin's two flags by hand",
        "regenerate": "python scripts/gen_flags.py sglang-torchtpu",
        "complete": True,
        "base": "sglang",
        "by_hand": [f["options"][0] for f in TORCHTPU_FLAGS],
        "flags": TORCHTPU_FLAGS,
    }


def table_jax(source: str) -> dict[str, Any]:
    raw = _extract_jax(source)
    return {
        "schema": SCHEMA,
        "profile": "sglang-jax",
        "server": f"SGLang-JAX {raw['revision'][:8]}",
        "source": f"{JAX_REPO}/blob/{raw['revision']}/{JAX_FILES[0]} (and {JAX_FILES[1]}); "
        "refs/pull/1527/head, the TT backend branch libtt's README names",
        "source_sha256": raw["sha256"],
        "how": "extracted against stubs: server_args.py's ServerArgs.add_cli_args and "
        "MultimodalServerArgs.add_cli_args run on argparse.ArgumentParser(), as ServerArgs.from_cli "
        "does, with every module they import stubbed from its own source's literals",
        "regenerate": f"python scripts/gen_flags.py sglang-jax --source SGLANG_JAX_CHECKOUT "
        f"(or GIT_DIR@{JAX_COMMIT[:8]})",
        "complete": True,
        "parser": _parser_header(raw),
        "flags": raw["flags"],
    }


def dumps(table: dict[str, Any]) -> str:
    """One flag a line, so a change in the server reads as a diff of the flags it touches."""
    head = {k: v for k, v in table.items() if k != "flags"}
    lines = json.dumps(head, indent=1)[:-2] + ',\n "flags": [\n'
    lines += ",\n".join("  " + json.dumps(f) for f in table["flags"])
    return lines + "\n ]\n}\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--extract-sglang"]:
        _extract_sglang()
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="sglang, sglang-torchtpu, sglang-jax")
    ap.add_argument("--source", help="SGLang-JAX: a checkout, or GIT_DIR@COMMIT")
    ap.add_argument("--check", action="store_true", help="compare with the stored tables")
    ap.add_argument("--out", type=Path, default=PROFILES, help="where the tables are")
    args = ap.parse_args(argv)
    names = args.names or (["sglang", "sglang-torchtpu"] + (["sglang-jax"] if args.source else []))
    stale = []
    for name in names:
        if name == "sglang":
            table = table_sglang()
        elif name == "sglang-torchtpu":
            table = table_torchtpu()
        elif name == "sglang-jax":
            if not args.source:
                ap.error(f"sglang-jax needs --source (an SGLang-JAX checkout at {JAX_COMMIT[:8]})")
            table = table_jax(args.source)
        else:
            ap.error(f"no generator for {name!r}")
        path = args.out / f"{name}.flags.json"
        text = dumps(table)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"{path}: {len(table['flags'])} flags")
    if stale:
        print(f"out of date: {', '.join(stale)} (run scripts/gen_flags.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
