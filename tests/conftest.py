"""Shared fixtures: simulated hosts in temporary roots, the CLI, and leak checks.

Every test runs with its own XDG cache (so ``--sim NAME`` builds a fresh cached root) and, at the
end of the session, the suite checks that no process it started and no lease it took is left.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
CAPTURES = REPO / "tests" / "data" / "captures"
CONFORMANCE = REPO / "scripts" / "conformance"
STOCK = [
    "p150",
    "p300",
    "quietbox2",
    "p150x4",
    "p150x8",
    "n150",
    "n300",
    "t3k",
    "galaxy-wh",
    "galaxy-bh",
]


# The slow tier (``pytest -m "not slow"`` runs the rest, the inner loop): tests that start the
# real heavy things, known by their module, a fixture they use or their marker. Emulated hosts
# (namespaces, their own mpirun or Slurm cluster), a real mpirun, SGLang, torch, tt-metal's
# libraries (conformance), and the chaos matrix.
SLOW_MODULES = {"test_multihost", "test_emuhosts", "test_mpi"}
SLOW_FIXTURES = {"world", "ttnn_python", "sglang_dir", "torchtpu_dir"}
SLOW_MARKERS = {"conformance", "sglang", "torch", "slow"}


# .ci/run spreads whole files over two workers (pytest-xdist, --dist loadfile), each taking the
# next file when it is done. The longest files go first, so that none of them starts last and
# keeps one worker busy while the other idles (longest-first packing; the rest keep their order).
LONGEST_FIRST = [
    "test_sglang",
    "test_chaos",
    "test_multihost",
    "test_meshhosts",
    "test_conformance_shapes",
    "test_active",
    "test_fleet",
    "test_hardening",
    "test_serving_server",
    "test_conformance_meshhosts",
    "test_cables",
    "test_bringup",
]

# pytest-xdist sets COLUMNS=80 and LINES=24 in its workers (for its own output). They are not
# the user's: a command a test runs on a pseudo-terminal would take them over the terminal's size.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__ if getattr(item, "module", None) else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        marked = {m.name for m in item.iter_markers()}
        if module in SLOW_MODULES or fixtures & SLOW_FIXTURES or marked & SLOW_MARKERS:
            item.add_marker(pytest.mark.slow)

    def rank(item: pytest.Item) -> int:
        module = item.module.__name__ if getattr(item, "module", None) else ""
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a file, and among the rest, the order is kept


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("TTMESH_ROOT", raising=False)
    monkeypatch.delenv("TTMESH_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("TT_VISIBLE_DEVICES", raising=False)


@pytest.fixture(autouse=True)
def _not_a_subreaper() -> None:
    """Each test starts in a process that is no child subreaper: a test that ran an attempt in
    this process (the front makes itself one) would otherwise take in the orphans of the next
    test's helpers (a chip holder whose starter exited), which then read as this process's own."""
    from ttmesh import procs

    procs.set_subreaper(False)


def _segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("sm_segment.")}


def _drop_segments(before: set[str]) -> None:
    """Remove the Open MPI segments made since ``before`` that no live process uses."""
    from ttmesh.runtime import leftovers  # (the rule ttmesh's own clean-up follows)

    leftovers.remove_unused(os.path.join("/dev/shm", n) for n in _segments() - before)


@pytest.fixture(autouse=True, scope="session")
def _open_mpi_segments() -> Iterator[None]:
    """Conformance tests start ttnn, whose bundled Open MPI 5 library leaves its shared-memory
    segments (/dev/shm/sm_segment.*) behind (run alone, or under a Debian Open MPI 4 mpirun):
    the ones the session made, and no process still maps, are removed at its end, as the
    library's own runtime would have."""
    if not os.path.isdir("/dev/shm"):
        yield
        return
    before = _segments()
    yield
    _drop_segments(before)


@pytest.fixture
def make_sim(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Build a simulated host of a stock system (on tmpfs when there is one, else under
    tmp_path); resets take ~no time."""
    from ttmesh.sim.create import create

    with scratch(tmp_path / "roots") as base:

        def make(system: str = "quietbox2", name: str | None = None, **config: float) -> Path:
            root = base / (name or system)
            create(stock_model(system), root, config={"reset_seconds": 0.0, **config})
            return root

        yield make


@pytest.fixture
def qb2(make_sim: Callable[..., Path]) -> Path:
    return make_sim("quietbox2")


@pytest.fixture(scope="module")
def shared_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """Simulated hosts shared by a module's tests that only read them, built once per system
    (a test that changes a host builds its own with ``make_sim``)."""
    from ttmesh.sim.create import create

    roots: dict[str, Path] = {}
    with scratch(tmp_path_factory.mktemp("shared")) as base:

        def get(system: str) -> Path:
            if system not in roots:
                roots[system] = create(
                    stock_model(system), base / system, config={"reset_seconds": 0.0}
                )
            return roots[system]

        yield get


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A runtime directory of the test's own (job records and run directories go under it),
    so a test's jobs are not mixed with another test's or the machine's."""
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(rt))
    return rt


@pytest.fixture
def hold_pids() -> Iterator[list[int]]:
    """PIDs of ``sim fault hold`` processes a test started (each keeps a chip's device node
    open): at the end, each still running is killed by PID, and only if its command line is
    still the hold's (a PID reused by another process is left alone)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"ttmesh-sim-hold" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def env_without(*keys: str, **more: str) -> dict[str, str]:
    """This process's environment less ``keys``, plus ``more``: what a command sees from a
    shell that does not set them (this machine's shells set PYTHONUNBUFFERED, CI, COLUMNS...
    where users' shells may not)."""
    return {**{k: v for k, v in os.environ.items() if k not in keys}, **more}


def users_shell(**more: str) -> dict[str, str]:
    """The environment of a user's shell, which (unlike this machine's) has no
    PYTHONUNBUFFERED: output tests see the buffering users get."""
    return env_without("PYTHONUNBUFFERED", **more)


def _environment(env: dict[str, str] | None, unset: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    cwd: str | Path | None = None,
    unset: tuple[str, ...] = (),
) -> Result:
    """Run the real ``ttmesh`` entry point in a subprocess: this environment with ``env`` over
    it, less the variables in ``unset``."""
    full_env = _environment(env, unset)
    proc = subprocess.run(
        [sys.executable, "-m", "ttmesh", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli() -> Callable[..., Result]:
    return run_cli


def _our_processes() -> set[int]:
    """Descendants of this pytest process (what a test could have leaked)."""
    import psutil

    me = psutil.Process()
    return {p.pid for p in me.children(recursive=True)}


SESSION = f"{os.getpid()}-{os.urandom(4).hex()}"
os.environ["TTMESH_TEST_SESSION"] = SESSION  # inherited by everything the suite starts


def _own_runtime_dir() -> None:
    """Job records, run directories, kept logs and dumps of the session's jobs go to a runtime
    directory of its own (in memory, as the machine's is), removed at its end: never into the
    machine's (a developer's ``ttmesh ps`` would list the suite's jobs). A test that needs one
    of its own still sets it (the ``runtime`` fixture)."""
    import atexit
    import shutil
    import tempfile

    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    where = tempfile.mkdtemp(prefix="ttmesh-test-rt-", dir=shm)  # 0700, this user's
    os.environ["XDG_RUNTIME_DIR"] = where
    atexit.register(shutil.rmtree, where, ignore_errors=True)


_own_runtime_dir()
# The stand-in server (ttmesh/sim/standin) paces its start as a real one's (about 15 s); the
# suite's servers start at once unless a test asks otherwise.
os.environ.setdefault("FAKE_PACE", "0")


def _ours(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"TTMESH_TEST_SESSION={SESSION}".encode() in f.read().split(b"\0")
    except OSError:
        return False


@pytest.fixture(autouse=True, scope="session")
def _no_leaks() -> Iterator[None]:
    yield
    import psutil

    leaked = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        tagged = "ttmesh-sim-hold" in cmd or "ttmesh-test-worker" in cmd
        if tagged and p.pid != os.getpid() and _ours(p.pid):
            leaked.append(f"{p.pid}: {cmd}")
    assert not leaked, "processes left behind by the suite:\n" + "\n".join(leaked)
    # No job of this session is still recorded as running, so none holds a lease (a lease is
    # a flock held by the job's processes, gone with them).
    from ttmesh.runtime import jobs

    running = [r for r in jobs.running() if _ours(r["pid"])]
    assert not running, f"jobs left running by the suite: {[r['job'] for r in running]}"


@pytest.fixture(scope="session")
def ttnn_python() -> str:
    """A Python 3.12 with ttnn (the conformance cache's venv, installed on first use)."""
    proc = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1" && printf %s "$TTNN_PY"',
            "bash",
            str(CONFORMANCE / "_ttnn-env.sh"),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode == 3:
        pytest.skip(f"conformance prerequisite missing: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def mock_chip_files() -> Iterator[None]:
    """The machine's /dev/shm/tt_device_<unique id>_memory files (libtt's mock chips) for the
    test's length: every simulated QuietBox 2 has the same unique ids, so two tests making
    those files at once (two xdist workers, or two suites on one machine) would see each
    other's as there before the job, and a job keeps what was there before it."""
    import fcntl

    # The lock is the directory's own: no file of the tests' is left behind.
    fd = os.open("/dev/shm", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@pytest.fixture(scope="session")
def torchtpu_dir() -> Path:
    """The seed's own stack, real: a venv with torch 2.13.0 (CPU), torch_tpu 0.2.0 and libtt's
    PJRT plugin (jax-tt-plugin 0.1.3), in $TTMESH_TORCHTPU_DIR or ~/.cache/ttmesh-torchtpu
    (installed on first use: scripts/torchtpu/setup; .ci/run builds it first)."""
    where = Path(
        os.environ.get("TTMESH_TORCHTPU_DIR") or Path.home() / ".cache" / "ttmesh-torchtpu"
    )
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "torchtpu" / "setup"), str(where)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if proc.returncode == 3:
        pytest.skip(f"torch_tpu prerequisite missing: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    return where


# --------------------------------------------------------------------------- shared helpers

TW = str(REPO / "tests" / "workers" / "tw.py")  # the standard-library test worker
TAG = "ttmesh-test-worker"  # in every test worker's argv, so leaks can be found


def worker(*actions: str) -> list[str]:
    """``-- python tw.py TAG ACTION...``: a launch command running the test worker."""
    return ["--", sys.executable, TW, TAG, *actions]


class Lines:
    """A process's stderr lines as they come, read by a thread: waits have deadlines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.queue.put(line)
            self.queue.put(None)

        threading.Thread(target=read, daemon=True).start()

    def until(self, text: str, count: int = 1, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while sum(text in ln for ln in self.seen) < count:
            left = deadline - time.monotonic()
            try:
                line = self.queue.get(timeout=max(left, 0.01))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"no {count} x {text!r}:\n" + "".join(self.seen))
            self.seen.append(line)

    def rest(self, timeout: float = 60) -> str:
        """Every line until the process closes its stderr (each within ``timeout`` s)."""
        while (line := self.queue.get(timeout=timeout)) is not None:
            self.seen.append(line)
        return "".join(self.seen)


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_for(
    predicate: Callable[[], object], timeout: float = 15.0, what: str = "condition"
) -> None:
    """Poll until ``predicate()`` holds (an awaited condition, with a deadline)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def until(cond: Callable[[], object], timeout: float) -> bool:
    """Poll ``cond`` until it holds or ``timeout`` passes; its last answer."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


@functools.cache
def stock_model(name: str) -> Any:
    """A stock system model, loaded once per session."""
    from ttmesh.sim.system import load

    return load(name)


@contextlib.contextmanager
def scratch(fallback: Path) -> Iterator[Path]:
    """tmpfs for simulated roots when there is one (many small files), else ``fallback``."""
    import shutil
    import tempfile

    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="ttmesh-test-", dir="/dev/shm"))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    else:
        fallback.mkdir(parents=True, exist_ok=True)
        yield fallback


def start_launch(
    root: Path,
    *args: str,
    stdout: int = subprocess.PIPE,
    stderr: int = subprocess.PIPE,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
) -> subprocess.Popen:
    """``ttmesh launch --root ROOT ARGS`` as a running process (text pipes by default), in
    this environment with ``env`` over it, less the variables in ``unset``."""
    return subprocess.Popen(
        [sys.executable, "-m", "ttmesh", "launch", "--root", str(root), *args],
        stdout=stdout,
        stderr=stderr,
        text=True,
        env=_environment(env, unset),
    )
