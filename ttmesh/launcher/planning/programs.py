"""Program profiles: plain programs on a stack ttmesh knows (``kind: program`` in
``ttmesh/configs/profiles/*.yaml`` or ``$TTMESH_PROFILES``), as serving profiles are servers.

A program runs once per rank, as any command; its profile says what each rank needs beyond
torchrun's variables: the stack's environment (``env``), its launch contract (``contract``:
torch_tpu's distributed variables, built by ``rankenv.torch_tpu_env``), a TMPDIR and working
directory per rank (``private_dirs``), the files it leaves in shared memory (``leftovers``) and
the libtt releases it runs on (``libtt``: which one joins processes into one mesh, and how the
chips reach it). A profile is chosen by the job's environment (``recognise: {env: ...}``: the
launcher's, ``--env``'s, or the variables the profile itself sets when named) or by name
(``--profile NAME``); a serving profile that matches the command comes first.

:func:`choose` picks one (the options' stage); :func:`read_stack` reads which libtt the rank's
Python has, once, in a short subprocess that starts no device, and :func:`check_stack` refuses
what that release cannot run (the prepare stage), before minutes are spent starting it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input
from ttmesh.render import plural

if TYPE_CHECKING:
    from ttmesh.launcher.planning.rankenv import TpuSlice

KIND = "program"
CONTRACTS = ("none", "torch-tpu")
CHIPS = ("pass", "libtt")
STACK_TIMEOUT = 10.0  # seconds for the rank's Python to say which packages it has
STACK_OUTPUT = 64 * 1024  # bytes of its answer read (a few hundred)


@dataclass(frozen=True)
class Release:
    """A line of libtt releases: those below ``below`` (None: every later one)."""

    below: tuple[int, ...] | None
    below_text: str | None
    joins: bool  # libtt joins processes into one mesh
    chips: str  # "pass": TT_VISIBLE_DEVICES and a descriptor per rank; "libtt": left unset
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"below": self.below_text, "joins": self.joins, "chips": self.chips, "why": self.why}


@dataclass(frozen=True)
class Libtt:
    """Where a profile reads libtt's version, and what each release line can run."""

    distribution: str
    required: str | None
    releases: tuple[Release, ...]

    def release(self, version: str) -> Release:
        number = version_tuple(version)
        for line in self.releases:
            if line.below is None or number < line.below:
                return line
        return self.releases[-1]


@dataclass(frozen=True)
class ProgramProfile:
    """A stack plain programs run on: how it is recognised and what each rank needs."""

    name: str
    title: str
    source: str
    path: str
    recognise: dict[str, str]  # environment variable -> value
    # variable -> the values that leave its stack off, when its reader takes any other value
    # as on (libtt's hook: anything but "" and "0"); such a value recognises the stack too
    unless: dict[str, tuple[str, ...]]
    # variable -> the separator of the list it holds, when its reader takes the value as one of
    # several (JAX_PLATFORMS=tt,cpu: JAX opens tt, then cpu); the value among them recognises
    among: dict[str, str]
    env: dict[str, str]
    contract: str
    private_dirs: bool
    leftovers: tuple[str, ...]  # globs; {chip}: each chip's unique id in decimal
    libtt: Libtt | None

    def leftover_paths(self, chips: list[str]) -> list[str]:
        """The ``leftovers`` of a job on ``chips`` (asic ids, hex)."""
        out: list[str] = []
        for pattern in self.leftovers:
            if "{chip}" in pattern:
                out += [pattern.replace("{chip}", str(int(a, 16))) for a in chips]
            else:
                out.append(pattern)
        return out


@dataclass(frozen=True)
class Stack:
    """What the rank's Python has, read without starting a device."""

    python: str | None  # None: the command is not a Python ttmesh can name
    versions: dict[str, str | None] = field(default_factory=dict)
    unread: str = ""  # why the versions were not read

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "versions": dict(self.versions), "unread": self.unread}


@dataclass(frozen=True)
class ProgramSpec:
    """The program profile a job runs with, why, and what its stack is (``plan.program``)."""

    profile: ProgramProfile
    why: str
    stack: Stack | None = None
    release: Release | None = None
    notes: tuple[str, ...] = ()
    tpu: TpuSlice | None = None  # what a torch-tpu job's ranks share

    @property
    def chips(self) -> str:
        return self.release.chips if self.release is not None else "pass"

    def to_json(self) -> dict[str, Any]:
        libtt = self.profile.libtt
        version = self.stack.versions.get(libtt.distribution) if self.stack and libtt else None
        return {
            "profile": self.profile.name,
            "title": self.profile.title,
            "why": self.why,
            "contract": self.profile.contract,
            "private_dirs": self.profile.private_dirs,
            "stack": self.stack.to_json() if self.stack is not None else None,
            "libtt": None
            if libtt is None
            else {
                "distribution": libtt.distribution,
                "version": version,
                "release": self.release.to_json() if self.release is not None else None,
            },
            "torch_tpu": self.tpu.to_json() if self.tpu is not None else None,
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- reading profiles


def version_tuple(text: str) -> tuple[int, ...]:
    """``0.1.5`` -> (0, 1, 5); a local or development suffix (``0.1.5.dev3+g5861d04``) reads as
    its release numbers."""
    parts: list[int] = []
    for piece in text.split("+")[0].split("."):
        match = re.match(r"[0-9]+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
        if match.end() != len(piece):
            break
    return tuple(parts)


def _words(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where} must be text")
    return " ".join(value.split())


def _releases(raw: Any, where: str) -> tuple[Release, ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}.releases must be a list of release lines")
    out: list[Release] = []
    for i, item in enumerate(raw):
        at = f"{where}.releases[{i}]"
        if not isinstance(item, dict) or set(item) - {"below", "joins", "chips", "why"}:
            raise ValueError(f"{at} must be a map of below, joins, chips, why")
        below = item.get("below")
        if below is not None and (not isinstance(below, str) or not version_tuple(below)):
            raise ValueError(f'{at}: below must be a version such as "0.1.5", or null')
        if not isinstance(item.get("joins"), bool):
            raise ValueError(f"{at}: joins must be true or false")
        chips = item.get("chips", "pass")
        if chips not in CHIPS:
            raise ValueError(f"{at}: chips must be one of {', '.join(CHIPS)}")
        if out and out[-1].below is None:
            raise ValueError(f"{at}: a line after the last one (below: null)")
        out.append(
            Release(
                version_tuple(below) if below is not None else None,
                below,
                item["joins"],
                chips,
                _words(item.get("why", ""), f"{at}: why"),
            )
        )
    return tuple(out)


def _libtt(raw: Any, where: str) -> Libtt | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"distribution", "required", "releases"}:
        raise ValueError(f"{where} must be a map of distribution, required, releases")
    required = raw.get("required")
    return Libtt(
        _words(raw.get("distribution"), f"{where}.distribution"),
        _words(required, f"{where}.required") if required is not None else None,
        _releases(raw.get("releases"), where),
    )


def load(path: Path) -> ProgramProfile:
    """A program profile, checked: a value of the wrong kind is one line naming the file."""
    from ttmesh import yamlio
    from ttmesh.launcher.serving.profiles import MAX_BYTES, _env

    where = f"profile {path}"
    try:
        data = yamlio.load_cached(path, "profile", MAX_BYTES)
        if not isinstance(data, dict):
            raise ValueError("not a map")
        unknown = set(data) - {
            "kind", "name", "title", "source", "recognise", "env", "contract", "private_dirs",
            "leftovers", "libtt",
        }  # fmt: skip
        if unknown:
            raise ValueError(f"unknown keys {', '.join(sorted(unknown))}")
        recognise = data.get("recognise") or {}
        if not isinstance(recognise, dict) or set(recognise) - {"env", "unless", "among"}:
            raise ValueError(
                "recognise must be {env: {VARIABLE: value}, unless: {VARIABLE: [value]}, "
                "among: {VARIABLE: separator}}"
            )
        wanted = recognise.get("env") or {}
        if not isinstance(wanted, dict):
            raise ValueError("recognise.env must be a map of variables to values")
        unless = recognise.get("unless") or {}
        if not isinstance(unless, dict) or not all(
            k in wanted and isinstance(v, list) and all(isinstance(x, str) for x in v)
            for k, v in unless.items()
        ):
            raise ValueError(
                "recognise.unless must map variables of recognise.env to lists of values"
            )
        among = recognise.get("among") or {}
        if not isinstance(among, dict) or not all(
            k in wanted and isinstance(v, str) and v for k, v in among.items()
        ):
            raise ValueError("recognise.among must map variables of recognise.env to separators")
        contract = data.get("contract", "none")
        if contract not in CONTRACTS:
            raise ValueError(f"contract must be one of {', '.join(CONTRACTS)}")
        leftovers = data.get("leftovers") or []
        if not isinstance(leftovers, list) or not all(
            isinstance(g, str) and g.startswith("/dev/shm/") and "/" not in g[9:] for g in leftovers
        ):
            raise ValueError("leftovers must be a list of names in /dev/shm (/dev/shm/NAME)")
        private = data.get("private_dirs", False)
        if not isinstance(private, bool):
            raise ValueError("private_dirs must be true or false")
        return ProgramProfile(
            name=_words(data.get("name"), "name"),
            title=str(data.get("title", "")),
            source=str(data.get("source", "")),
            path=str(path),
            recognise={str(k): str(v) for k, v in wanted.items()},
            unless={str(k): tuple(v) for k, v in unless.items()},
            among={str(k): str(v) for k, v in among.items()},
            env=_env(path, data.get("env") or {}),
            contract=str(contract),
            private_dirs=private,
            leftovers=tuple(leftovers),
            libtt=_libtt(data.get("libtt"), "libtt"),
        )
    except TTMeshError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise bad_input(f"{where}: malformed ({exc})", "compare with a stock profile") from None


def every() -> list[ProgramProfile]:
    """Every program profile, in the order of their files (stock, then TTMESH_PROFILES')."""
    from ttmesh.launcher.serving import profiles

    return [load(p) for p in profiles.profile_paths() if profiles.kind_of(p) == KIND]


# --------------------------------------------------------------------------- choosing one


def choose(
    name: str | None, environ: dict[str, str], user_env: list[tuple[str, str]]
) -> ProgramSpec | None:
    """The program profile of a job that runs no server a profile knows: ``--profile NAME``'s,
    else the first whose ``recognise`` variables the job's environment sets (``--env`` over
    the launcher's). None: a command like any other."""
    from ttmesh.launcher.planning import rankenv

    if name == "none":
        return None
    given = dict(user_env)
    found = every()
    chosen: ProgramSpec | None = None
    if name is not None:
        profile = next((p for p in found if p.name == name), None)
        if profile is None:
            return None  # a serving profile's name (options decided so)
        chosen = ProgramSpec(profile, f"--profile {name}")
    else:
        for profile in found:
            why = _recognised(profile, environ, given)
            if why is not None:
                chosen = ProgramSpec(profile, why)
                break
    if chosen is None:
        return None
    profile = chosen.profile
    for key, value in profile.env.items():
        theirs = given.get(key, environ.get(key))
        if theirs is not None and theirs != value:
            source = "--env" if key in given else "your environment"
            raise bad_input(
                f"{profile.name}: {key}={theirs} in {source}, but {profile.title} needs "
                f"{key}={value}",
                f"drop {key} (the profile sets {key}={value}), or run with --profile none",
            )
    for key, _ in user_env:
        why = rankenv.program_owner(profile.contract, profile.private_dirs, key)
        if why is not None:
            raise bad_input(f"--env {key}: ttmesh sets {key} for every rank of a {profile.name} job",
                            f"drop it: {why}")  # fmt: skip
    return chosen


def _recognised(
    profile: ProgramProfile, environ: dict[str, str], given: dict[str, str]
) -> str | None:
    """Why ``profile`` is the job's (``LIBTT_TPU_COMPAT=1 is in --env``), or None."""
    if not profile.recognise:
        return None
    sources = []
    for key, value in profile.recognise.items():
        theirs = given[key] if key in given else environ.get(key)
        off, sep = profile.unless.get(key), profile.among.get(key)
        if theirs is not None and sep is not None and value in theirs.split(sep):
            theirs = value  # one of the list the reader takes: the stack's
        if theirs is None or (theirs != value and (off is None or theirs in off)):
            return None  # a value the variable's reader takes as on is the stack: checked after
        sources.append(f"{key}={value} is in {'--env' if key in given else 'your environment'}")
    return ", ".join(sources)


def check_layout(spec: ProgramSpec, mesh_layout: str, rank_binding: str | None) -> None:
    """A program profile's ranks are started by ttmesh itself: one per chip, or one over all."""
    from ttmesh.vocab import Layout

    name = spec.profile.name
    if rank_binding is not None:
        raise bad_input(
            f"--rank-binding with {name} ({spec.why}): a tt-run rank binding starts a tt-metal "
            "world under mpirun, which this stack does not use",
            "drop --rank-binding, or run the command as any other with --profile none",
        )
    if mesh_layout not in (Layout.ISOLATED, Layout.SINGLE_PROCESS):
        raise bad_input(
            f"--mesh-layout {mesh_layout} with {name} ({spec.why}): it starts a tt-metal world "
            "under mpirun, which this stack does not use",
            "drop --mesh-layout (one process per chip), or give --mesh-layout single-process "
            "(one process over every chip)",
        )


# --------------------------------------------------------------------------- the rank's stack

_PYTHON_NAME = re.compile(r"^python[0-9.]*$")
_READ = (
    "import json, sys\n"
    "from importlib import metadata\n"
    "def v(d):\n"
    "    try:\n"
    "        return metadata.version(d)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps({d: v(d) for d in sys.argv[1:]}))\n"
)


def rank_python(argv: list[str], launcher_python: str, path: str | None) -> str | None:
    """The Python a rank's command runs (its own first word when that is a Python; a script
    runs with ``launcher_python``), or None when the command is not a Python."""
    first = argv[0] if argv else ""
    if first == launcher_python:
        return first
    if _PYTHON_NAME.match(os.path.basename(first)):
        return first if "/" in first else shutil.which(first, path=path)
    return None


def read_stack(python: str | None, names: list[str], environ: dict[str, str]) -> Stack:
    """Which of ``names`` (distributions) ``python`` has, and their versions: importlib.metadata
    in a short subprocess of that Python (its own site-packages and PYTHONPATH), which opens no
    device and imports neither torch nor libtt (LIBTT_TPU_COMPAT is left out of its
    environment, so libtt's .pth does nothing). Bounded in time and output."""
    if python is None:
        return Stack(None, {}, "the command is not a Python interpreter ttmesh can name")
    env = {k: v for k, v in environ.items() if k != "LIBTT_TPU_COMPAT"}
    try:
        proc = subprocess.Popen(
            [python, "-c", _READ, *names],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its whole group is stopped if it does not answer
        )
    except OSError as exc:
        return Stack(python, {}, f"{python} could not be run ({exc.strerror or exc})")
    assert proc.stdout is not None
    data, timed_out = _bounded(proc.stdout.fileno(), STACK_OUTPUT, STACK_TIMEOUT)
    proc.stdout.close()
    if timed_out or proc.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait()
    if timed_out:
        return Stack(python, {}, f"{python} did not say which packages it has within "
                     f"{STACK_TIMEOUT:g} s")  # fmt: skip
    if len(data) >= STACK_OUTPUT:
        return Stack(python, {}, f"{python} said more than {STACK_OUTPUT // 1024} KiB when asked "
                     "which packages it has")  # fmt: skip
    lines = data.decode(errors="replace").strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        found = None
    if code != 0 or not isinstance(found, dict):
        return Stack(python, {}, f"{python} exited {code} when asked which packages it has")
    return Stack(python, {str(k): (str(v) if v else None) for k, v in found.items()})


def _bounded(fd: int, limit: int, timeout: float) -> tuple[bytes, bool]:
    """What ``fd`` gives until EOF, at most ``limit`` bytes, within ``timeout`` seconds:
    (the bytes, whether the time ran out)."""
    import selectors
    import time

    data = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while len(data) < limit:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                return data, True
            chunk = os.read(fd, limit - len(data))
            if not chunk:
                break
            data += chunk
    return data, False


def check_stack(spec: ProgramSpec, stack: Stack, world: int, chips: int) -> ProgramSpec:
    """The spec with its stack and libtt release; refused (exit 2, one line) when the rank's
    Python lacks the stack, or when a world of ``world`` processes needs a libtt that joins
    processes and this one cannot."""
    profile = spec.profile
    libtt = profile.libtt
    if libtt is None:
        return replace(spec, stack=stack)
    name = profile.name
    if stack.python is None or not stack.versions:
        note = f"which libtt the ranks run was not read: {stack.unread}"
        return replace(spec, stack=stack, notes=(*spec.notes, note))
    for dist, what in ((libtt.distribution, "libtt's PJRT plugin"), (libtt.required, None)):
        if dist and stack.versions.get(dist) is None:
            raise bad_input(
                f"{name}: the ranks' Python {stack.python} has no {dist}"
                + (f" ({what})" if what else "")
                + f": {profile.title} cannot start there",
                f"install it there (pip install {dist}), or run the ranks with the Python that "
                "has it: ttmesh launch -- /path/to/venv/bin/python script.py (docs/torch-tpu.md)",
            )
    version = str(stack.versions[libtt.distribution])
    release = libtt.release(version)
    said = f"libtt {version} ({libtt.distribution} in {stack.python})"
    notes = list(spec.notes)
    if profile.contract == "torch-tpu" and world > 1 and not release.joins:
        raise bad_input(
            f"{name}: {said} cannot run {plural(world, 'process', 'processes')} as one "
            f"torch_tpu world: {release.why}",
            f"run one process over all {plural(chips, 'chip')} (--mesh-layout single-process), "
            "or install libtt from main (jax-tt-plugin 0.1.5+, built from source; "
            "docs/torch-tpu.md)",
        )
    joins = "joins processes into one mesh" if release.joins else "joins no processes"
    notes.append(f"{said}: {joins}; {_chips_said(release.chips)}")
    return replace(spec, stack=stack, release=release, notes=tuple(notes))


def _chips_said(chips: str) -> str:
    if chips == "libtt":
        return "TT_VISIBLE_DEVICES and TT_MESH_GRAPH_DESC_PATH are left unset: libtt sets both"
    return "each rank gets its chips (TT_VISIBLE_DEVICES) and its mesh graph descriptor"
