"""Two users of one machine for tests: root and ``nobody`` (via setpriv).

ttmesh runs as root on hosts several people share, so what one user can do to another (plant a
link, hold a lock, delete a file) is tested with two real users. The other user runs ttmesh from
a virtual environment on /usr/bin/python3 (pyenv's Python under /root is closed to others) with
this checkout's source copied where it can read it. Import the fixture into a test module with
``from users import users_fixture  # noqa: F401`` (a test asks for ``users``).
"""

from __future__ import annotations

import grp
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import REPO, SESSION

SYSTEM_PYTHON = "/usr/bin/python3"
# ttmesh's own dependencies, as pyproject.toml lists them (the venv on the system's Python runs
# ttmesh from the checkout, so it needs exactly these).
DEPS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
NOBODY_UID = 65534


@dataclass
class User:
    name: str
    run: Callable[..., subprocess.CompletedProcess[str]]  # ttmesh ARGS as this user
    base: Path  # a directory this user can write, for the test's paths
    sim: Path  # a simulated QuietBox 2 this user owns
    prefix: list[str] = field(default_factory=list)  # runs a program as this user
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)  # this user's environment (prefix's)
    uid: int = 0

    def argv(self, *args: str, env: dict[str, str] | None = None) -> list[str]:
        """A command line running ``args`` as this user (with ``env`` added)."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        if not self.prefix:
            return ["env", *extra, *args] if extra else list(args)
        return [*self.prefix, *extra, *args]

    def ttmesh(self, *args: str, env: dict[str, str] | None = None) -> list[str]:
        return self.argv(self.python, "-m", "ttmesh", *args, env=env)

    def py(
        self, code: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` (``sys.argv[1:]`` = ``args``) as this user."""
        return subprocess.run(
            self.argv(self.python, "-c", code, *args, env=env),
            capture_output=True, text=True, timeout=60, cwd=self.base,
        )  # fmt: skip

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, text=True, cwd=self.base, **kwargs)  # type: ignore[call-overload, no-any-return]


def world_dir(prefix: str, mode: int = 0o777) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(mode)
    return path


def _nobody_venv() -> Path:
    """A venv on the system Python with ttmesh's dependencies (cached between sessions)."""
    key = hashlib.sha256(" ".join(DEPS).encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"ttmesh-test-venv-{key}"
    python = venv / "bin" / "python"
    if not python.exists():
        tmp = Path(f"{venv}.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(tmp)], check=True)
        subprocess.run(
            [str(tmp / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *DEPS],
            check=True,
            timeout=600,
        )
        subprocess.run(["chmod", "-R", "a+rX", str(tmp)], check=True)
        try:
            tmp.rename(venv)
        except OSError:  # another test process (a pytest-xdist worker) built it first
            shutil.rmtree(tmp, ignore_errors=True)
            if not python.exists():
                raise
    return venv


def can_switch() -> bool:
    return (
        os.geteuid() == 0 and Path(SYSTEM_PYTHON).exists() and shutil.which("setpriv") is not None
    )


NEEDS_NOBODY = "switching to nobody needs root, /usr/bin/python3 and setpriv"
MEMORY_CAP = 2 << 30  # address space a hostile run may use: reading /dev/zero stops at this
HOSTILE_TIMEOUT = 30  # seconds: a refusal takes well under one (a hung open takes forever)


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _run(
    argv: list[str], cwd: Path | None, hostile: bool, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ttmesh; a hostile input's run (``hostile``: a FIFO, /dev/zero, a huge file for a
    path) is capped (memory, time) and a hang is a result, not a hung suite."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, cwd=cwd, env=env,
            timeout=HOSTILE_TIMEOUT if hostile else 60,
            preexec_fn=_cap_memory if hostile else None,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        if not hostile:
            raise
        return subprocess.CompletedProcess(
            argv, -9, "", f"(hung: killed after {HOSTILE_TIMEOUT} s)"
        )


@pytest.fixture(scope="session", name="users")
def users_fixture() -> Iterator[dict[str, User]]:
    made: list[Path] = []

    def as_root(
        *args: str,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        hostile: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "ttmesh", *args]
        return _run(argv, cwd, hostile, {**os.environ, **(env or {})})

    root_base = world_dir("ttmesh-paths-root-")
    made.append(root_base)
    root_sim = root_base / "sim"
    assert (
        as_root("sim", "create", "--system", "quietbox2", "--root", str(root_sim)).returncode == 0
    )
    out = {"root": User("root", as_root, root_base, root_sim)}
    if can_switch():
        venv = _nobody_venv()
        src = world_dir("ttmesh-paths-src-")
        made.append(src)
        shutil.copytree(
            REPO / "ttmesh", src / "ttmesh", ignore=shutil.ignore_patterns("__pycache__")
        )
        subprocess.run(["chmod", "-R", "a+rX", str(src)], check=True)
        base = world_dir("ttmesh-paths-nobody-")
        made.append(base)
        # nobody's job records and logs: the session's, not the machine's (in a sticky
        # directory: ttmesh refuses a runtime directory another user could change)
        runtime = Path(tempfile.mkdtemp(prefix="ttmesh-test-rt-nobody-", dir="/dev/shm"))
        made.append(runtime)
        os.chown(runtime, NOBODY_UID, grp.getgrnam("nogroup").gr_gid)
        env = {
            "PATH": f"{venv}/bin:/usr/bin:/bin",
            "HOME": "/nonexistent",
            "PYTHONPATH": str(src),
            "XDG_CACHE_HOME": str(base / "cache"),
            "XDG_RUNTIME_DIR": str(runtime),
            "TTMESH_TEST_SESSION": SESSION,
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "env", "-i"]
        prefix += [f"{k}={v}" for k, v in env.items()]
        python = str(venv / "bin" / "python")

        def as_nobody(
            *args: str,
            cwd: Path | None = None,
            env: dict[str, str] | None = None,
            hostile: bool = False,
        ) -> subprocess.CompletedProcess[str]:
            extra = [f"{k}={v}" for k, v in (env or {}).items()]
            argv = [*prefix, *extra, python, "-m", "ttmesh", *args]
            return _run(argv, cwd or base, hostile)

        sim = base / "sim"
        made_sim = as_nobody("sim", "create", "--system", "quietbox2", "--root", str(sim))
        assert made_sim.returncode == 0, made_sim.stderr
        out["nobody"] = User("nobody", as_nobody, base, sim, prefix, python, env, NOBODY_UID)
    yield out
    for path in made:
        subprocess.run(["chmod", "-R", "u+rwX", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)
