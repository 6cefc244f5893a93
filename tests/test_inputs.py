"""Inputs a hostile or careless user can hand ttmesh, class by class: every file read bounded
(a FIFO, /dev/zero, a huge file, a YAML alias bomb), rank bindings and profiles that set what
ttmesh owns, simulated roots with a corrupted file, XDG variables that are relative paths,
and no reader that goes around the bounded one.

Every run of ttmesh on a hostile input is capped (address space, time): a regression fails
here instead of hanging the suite or waking the kernel's OOM killer.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, Result, worker

MEMORY_CAP = 2 << 30
TIMEOUT = 30
HUGE = 3 << 30


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def hostile(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Result:
    """``ttmesh ARGS`` capped; a hang is a result (code -9), not a stuck suite."""
    argv = [sys.executable, "-m", "ttmesh", *args]
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=_cap,
            env={**os.environ, **(env or {})}, cwd=cwd,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Result(-9, "", f"(hung: killed after {TIMEOUT} s)")
    return Result(proc.returncode, proc.stdout, proc.stderr)


def one_line(res: Result, code: int = 2) -> str:
    """The one ``ttmesh: ...`` line a refusal prints (exit ``code``, no traceback)."""
    assert res.code == code, (res.code, res.err)
    assert "Traceback" not in res.err and "internal error" not in res.err, res.err
    lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host: ")]
    assert len(lines) == 1 and lines[0].startswith("ttmesh: "), res.err
    return lines[0]


def _bomb(levels: int = 9) -> str:
    """A "billion laughs": nine lists of nine aliases to the list before (9^9 strings)."""
    text = 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, levels):
        text += f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]\n"
    return text


def _hostile_file(path: Path, kind: str) -> Path:
    """A file no reader may read whole: a FIFO, /dev/zero, a huge sparse file."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "huge":
        with open(path, "w") as f:
            f.truncate(HUGE)
    else:
        raise AssertionError(kind)
    return path


READ_KINDS = ["fifo", "devzero", "huge"]


# --------------------------------------------------------------------------- profiles


@pytest.mark.parametrize("kind", [*READ_KINDS, "bomb", "recursive"])
def test_a_hostile_profile_is_refused_in_one_line(kind: str, tmp_path: Path, qb2: Path) -> None:
    mine = tmp_path / "profiles"
    mine.mkdir()
    path = mine / "evil.yaml"
    if kind == "bomb":
        path.write_text(_bomb() + "name: evil\nrecognise: {program: evil}\nenv: {BOOM: *l8}\n")
    elif kind == "recursive":
        path.write_text("name: &n [evil, *n]\nrecognise: {program: evil}\n")
    else:
        _hostile_file(path, kind)
    env = {"TTMESH_PROFILES": str(mine)}
    for args in (
        ["profiles"],
        ["launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", *worker("exit=0")],
    ):
        line = one_line(hostile(*args, env=env))
        assert str(path) in line, line


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_ttmesh_profiles_must_name_a_directory(kind: str, tmp_path: Path) -> None:
    where = tmp_path / "nope"
    if kind == "file":
        where.write_text("name: x\n")
    line = one_line(hostile("profiles", env={"TTMESH_PROFILES": str(where)}))
    assert f"TTMESH_PROFILES {where}" in line, line
    assert hostile("profiles", env={"TTMESH_PROFILES": str(tmp_path)}).code == 0


@pytest.mark.parametrize("key", ["RANK", "TT_VISIBLE_DEVICES", "TTMESH_JOB_ID", "MASTER_PORT"])
def test_a_profile_may_not_set_what_ttmesh_owns(key: str, tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        f"name: mine\nrecognise: {{program: mine}}\nenv: {{OK_VAR: '1', {key}: '7'}}\n"
    )
    line = one_line(hostile("profiles", env={"TTMESH_PROFILES": str(tmp_path)}))
    assert f"profile {tmp_path / 'mine.yaml'}: env sets {key}, which ttmesh sets" in line, line
    (tmp_path / "mine.yaml").write_text(
        "name: mine\nrecognise: {program: mine}\nenv: {OK_VAR: '1'}\n"
    )
    assert hostile("profiles", env={"TTMESH_PROFILES": str(tmp_path)}).code == 0


# --------------------------------------------------------------------------- rank bindings


@pytest.fixture
def exported(qb2: Path, tmp_path: Path) -> tuple[Path, dict]:
    """The rank binding ttmesh exports for a 2x2 mesh on the QuietBox 2, parsed."""
    import yaml

    out = tmp_path / "desc"
    res = hostile(
        "descriptor", "--root", str(qb2), "--mesh-layout", "mesh", "-o", str(out),
        "--export-rank-binding", str(out / "b.yaml"),
    )  # fmt: skip
    assert res.code == 0, res.err
    return out / "b.yaml", yaml.safe_load((out / "b.yaml").read_text())


@pytest.mark.parametrize("kind", [*READ_KINDS, "bomb"])
def test_a_hostile_rank_binding_is_refused(
    kind: str, exported: tuple[Path, dict], qb2: Path
) -> None:
    path = exported[0].with_name(f"{kind}.yaml")
    if kind == "bomb":
        text = exported[0].read_text().replace("global_env:\n", "global_env:\n  BOOM: *l8\n")
        path.write_text(_bomb() + text)
    else:
        _hostile_file(path, kind)
    line = one_line(hostile("launch", "--root", str(qb2), "--rank-binding", str(path), "true"))
    assert str(path) in line, line
    if kind == "bomb":
        assert "aliases" in line, line


# (where, variable, what the hint says sets it instead)
OWNED = [
    ("global_env", "RANK", "each rank gets its own"),
    ("global_env", "MASTER_PORT", "--master-port"),
    ("global_env", "TORCHELASTIC_RUN_ID", "--job-id"),
    ("global_env", "TT_VISIBLE_DEVICES", "in its own env_overrides"),
    ("global_env", "TTMESH_READY_FILE", "TTMESH_ variables are ttmesh's own"),
    ("env_overrides", "WORLD_SIZE", "--tp-size"),
    ("env_overrides", "MASTER_ADDR", "127.0.0.1"),
    ("env_overrides", "TT_MESH_ID", "mesh_id"),
    ("env_overrides", "TT_MESH_HOST_RANK", "mesh_host_rank"),
    ("env_overrides", "TTMESH_RANK", "TTMESH_ variables"),
    ("env_overrides", "TT_METAL_MOCK_CLUSTER_DESC_PATH", "mock cluster"),
]


@pytest.mark.parametrize(("where", "key", "instead"), OWNED, ids=[f"{w}-{k}" for w, k, _ in OWNED])
def test_a_rank_binding_may_not_set_what_ttmesh_owns(
    where: str, key: str, instead: str, exported: tuple[Path, dict], qb2: Path
) -> None:
    import yaml

    path, data = exported
    if where == "global_env":
        data["global_env"][key] = "5"
        at = "global_env"
    else:
        data["rank_bindings"][1]["env_overrides"][key] = "5"
        at = "rank_bindings[1].env_overrides"
    bad = path.with_name("owned.yaml")
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    line = one_line(
        hostile("launch", "--root", str(qb2), "--rank-binding", str(bad), "--dry-run", "true")
    )
    assert f"{bad}: {at} sets {key}, which ttmesh sets for every rank" in line, line
    assert instead in line, line


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="a binding's dry run plans mpirun")
def test_a_rank_binding_still_sets_what_tt_run_bindings_carry(
    exported: tuple[Path, dict], qb2: Path
) -> None:
    """What ttmesh's own export writes (chips, symmetric DRAM) and the user's own variables."""
    import yaml

    path, data = exported
    data["global_env"]["MY_SETTING"] = "on"
    data["rank_bindings"][0]["env_overrides"]["MY_RANK_SETTING"] = "zero"
    ok = path.with_name("ok.yaml")
    ok.write_text(yaml.safe_dump(data, sort_keys=False))
    res = hostile(
        "launch", "--root", str(qb2), "--rank-binding", str(ok), "--dry-run", "--json", "true"
    )
    assert res.code == 0, res.err
    ranks = json.loads(res.out)["ranks"]
    assert ranks[0]["env"]["MY_RANK_SETTING"] == "zero"
    assert {r["env"]["MY_SETTING"] for r in ranks} == {"on"}
    bad = dict(data, global_env={"A=B": "x"})
    ok.write_text(yaml.safe_dump(bad, sort_keys=False))
    line = one_line(hostile("launch", "--root", str(qb2), "--rank-binding", str(ok), "true"))
    assert "'A=B' is not an environment variable name" in line, line


# --------------------------------------------------------------------------- system files


@pytest.mark.parametrize("kind", [*READ_KINDS, "bomb"])
def test_a_hostile_system_file_is_refused(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "system.yaml"
    if kind == "bomb":
        path.write_text(_bomb() + "name: boom\nchips: *l8\n")
    else:
        _hostile_file(path, kind)
    line = one_line(
        hostile("sim", "create", "--system", str(path), "--root", str(tmp_path / "new"))
    )
    assert str(path) in line, line
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------- corrupted roots


def _truncate(rel: str, keep: int = 100) -> Callable[[Path], None]:
    def do(root: Path) -> None:
        path = root / rel
        path.write_bytes(path.read_bytes()[:keep])

    return do


def _replace(rel: str, how: str) -> Callable[[Path], None]:
    def do(root: Path) -> None:
        path = root / rel
        path.unlink()
        if how == "fifo":
            os.mkfifo(path)
        elif how == "dir":
            path.mkdir()
        elif how == "devzero":
            path.symlink_to("/dev/zero")
        elif how == "missing":
            pass
        else:
            path.write_bytes(how.encode("latin-1"))

    return do


def _edit_json(rel: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def do(root: Path) -> None:
        data = json.loads((root / rel).read_text())
        change(data)
        (root / rel).write_text(json.dumps(data))

    return do


ASIC = "sys/class/tenstorrent/tenstorrent!0/tt_asic_id"
HOST_CMDS = ["ls", "check", "launch", "reset", "top"]
ALL_CMDS = [*HOST_CMDS, "sim show", "sim fault", "tt-smi"]
# name -> (corruption, the file it names, the commands that read that file)
CORRUPT: dict[str, tuple[Callable[[Path], None], str, list[str]]] = {
    "state truncated": (_truncate("sim/state.json"), "sim/state.json", ALL_CMDS),
    "state a FIFO": (_replace("sim/state.json", "fifo"), "sim/state.json", ALL_CMDS),
    "state a directory": (_replace("sim/state.json", "dir"), "sim/state.json", ALL_CMDS),
    "state missing": (_replace("sim/state.json", "missing"), "sim/state.json", ALL_CMDS),
    "state /dev/zero": (_replace("sim/state.json", "devzero"), "sim/state.json", ALL_CMDS),
    "state without chips": (
        _edit_json("sim/state.json", lambda s: s.pop("chips")),
        "sim/state.json",
        ALL_CMDS,
    ),
    "state heartbeat a string": (
        _edit_json("sim/state.json", lambda s: next(iter(s["chips"].values())).update(hb_base="x")),
        "sim/state.json",
        ALL_CMDS,
    ),
    "system random bytes": (
        _replace("sim/system.json", "\x89\xfe\x00\x17random"),
        "sim/system.json",
        ALL_CMDS,
    ),
    "system links a chip it has not": (
        _edit_json("sim/system.json", lambda s: s["links"].append([0, 1, 99, 1])),
        "sim/system.json",
        ALL_CMDS,
    ),
    "descriptor random bytes": (
        _replace("cluster_descriptor.yaml", "\x89\xfe\x00\x17random"),
        "cluster_descriptor.yaml",
        HOST_CMDS,
    ),
    "descriptor a FIFO": (
        _replace("cluster_descriptor.yaml", "fifo"),
        "cluster_descriptor.yaml",
        HOST_CMDS,
    ),
    "tt_asic_id garbled": (_replace(ASIC, "zz-not-hex\n"), ASIC, HOST_CMDS),
    "tt_asic_id a FIFO": (_replace(ASIC, "fifo"), ASIC, HOST_CMDS),
    "driver version /dev/zero": (
        _replace("sys/module/tenstorrent/version", "devzero"),
        "sys/module/tenstorrent/version",
        [*HOST_CMDS, "tt-smi"],
    ),
}


def _command(name: str, root: Path) -> list[str]:
    return {
        "ls": ["ls", "--root", str(root)],
        "check": ["check", "--root", str(root)],
        "launch": ["launch", "--root", str(root), "--tp-size", "1", *worker("exit=0")],
        "reset": ["reset", "--root", str(root), "--timeout", "5"],
        "top": ["top", "--root", str(root), "--once"],
        "sim show": ["sim", "show", "--root", str(root)],
        "sim fault": ["sim", "fault", "--root", str(root), "chip-dead", "0000:01:00.0"],
    }[name]


@pytest.mark.parametrize("name", list(CORRUPT))
def test_a_corrupted_simulated_root_is_one_line_naming_the_file_and_the_fix(
    name: str, qb2: Path
) -> None:
    corrupt, rel, commands = CORRUPT[name]
    corrupt(qb2)
    fix = f"(recreate it: ttmesh sim create --force --system quietbox2 --root {qb2})"
    for cmd in commands:
        if cmd == "tt-smi":
            # The stand-in as it runs in the field: the system's Python, no ttmesh importable.
            proc = subprocess.run(
                ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "python3", str(qb2 / "bin/tt-smi"),
                 "-s"],
                capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=_cap,
            )  # fmt: skip
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
            lines = proc.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("tt-smi: "), proc.stderr
            assert str(qb2 / rel) in lines[0] and lines[0].endswith(fix), lines[0]
            continue
        line = one_line(hostile(*_command(cmd, qb2)))
        assert str(qb2 / rel) in line and line.endswith(fix), (cmd, line)


def test_a_garbled_driver_file_on_a_root_that_is_not_simulated(qb2: Path, tmp_path: Path) -> None:
    """The reader is the same for every root: the driver's files, no simulator behind them."""
    root = tmp_path / "host"
    shutil.copytree(qb2, root, symlinks=True)
    (root / ".ttmesh-sim").unlink()
    _replace(ASIC, "\xff\xfe garbage\n")(root)
    line = one_line(hostile("ls", "--root", str(root)))
    assert f"{root / ASIC} holds " in line and "not a chip's unique id" in line, line
    assert line.endswith(f"(check the files under {root})"), line
    _replace(ASIC, "fifo")(root)
    line = one_line(hostile("check", "--root", str(root)))
    assert f"{root / ASIC} is a FIFO (named pipe), not a regular file" in line, line


def test_a_root_recreated_from_a_capture_is_recreated_from_it(qb2: Path, tmp_path: Path) -> None:
    archive = tmp_path / "cap.tar.gz"
    assert hostile("doctor", "--root", str(qb2), "--capture", str(archive)).code == 0
    root = tmp_path / "field"
    assert hostile("sim", "create", "--from-capture", str(archive), "--root", str(root)).code == 0
    _truncate("sim/state.json")(root)
    line = one_line(hostile("ls", "--root", str(root)))
    assert line.endswith(
        f"(recreate it: ttmesh sim create --force --from-capture {archive} --root {root})"
    ), line


# --------------------------------------------------------------------------- another user's root


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_root_never_writes_through_a_link_another_user_left_in_their_root(
    qb2: Path, tmp_path: Path
) -> None:
    """nobody's simulated root, its marker saying another ttmesh made it (so its tools look
    stale) and a link where the tools are written: root reading it writes nothing there."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    base = Path(tempfile.mkdtemp(prefix="ttmesh-inputs-", dir="/tmp"))
    try:
        _plant_and_read(qb2, base, victim)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert victim.read_text() == "precious\n"
    assert victim.stat().st_mode & 0o777 == 0o644


def _plant_and_read(qb2: Path, base: Path, victim: Path) -> None:
    base.chmod(0o755)
    root = base / "nobody-root"
    shutil.copytree(qb2, root, symlinks=True)
    subprocess.run(["chown", "-R", "nobody:nogroup", str(root)], check=True)
    plant = (
        f"import json, os; b = {str(root / 'bin')!r}\n"
        "for name in ('tt-smi', '_ttmesh_simcore.py', '_ttmesh_fileread.py'):\n"
        f"    os.symlink({str(victim)!r}, os.path.join(b, '.' + name + '.tmp'))\n"
        f"open({str(root / '.ttmesh-sim')!r}, 'w').write(json.dumps("
        "{'system': 'quietbox2', 'ttmesh': '0.0.0'}))\n"
    )
    subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "/usr/bin/python3",
         "-c", plant],
        check=True,
    )  # fmt: skip
    assert hostile("ls", "--root", str(root)).code == 0


# --------------------------------------------------------------------------- XDG


def test_relative_xdg_directories_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The XDG Base Directory spec: a relative path in these variables is invalid and must be
    ignored; every reader falls back to its default under HOME (none for XDG_RUNTIME_DIR)."""
    from ttmesh import paths, yamlio
    from ttmesh.fabric import known_good
    from ttmesh.mesh import descriptor
    from ttmesh.runtime import jobs
    from ttmesh.sim import roots

    home = tmp_path / "home"
    work = tmp_path / "work"
    (work / "rel").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    for var in ("XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.setenv(var, "rel")
    assert paths.xdg_dir("XDG_CACHE_HOME", ".cache") == str(home / ".cache")
    assert paths.xdg_dir("XDG_RUNTIME_DIR", None) is None
    for found in (yamlio._cache_dir(), roots.cache_root(), descriptor._cache_dir()):
        assert found.is_absolute() and found.is_relative_to(home / ".cache"), found
    assert known_good.store_dir().is_relative_to(home / ".local" / "state")
    assert jobs.base_dir().is_absolute() and not jobs.base_dir().is_relative_to(work)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))
    assert roots.cache_root() == tmp_path / "abs" / "ttmesh" / "sim"


def test_a_relative_xdg_cache_home_writes_nothing_where_ttmesh_runs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {"XDG_CACHE_HOME": "cache", "XDG_RUNTIME_DIR": "run", "HOME": str(tmp_path / "home")}
    assert hostile("ls", "--sim", "p150", env=env, cwd=work).code == 0
    res = hostile("launch", "--sim", "p150", "--tp-size", "1", *worker("exit=0"), env=env, cwd=work)
    assert res.code == 0, res.err
    assert os.listdir(work) == []
    assert (tmp_path / "home" / ".cache" / "ttmesh" / "sim" / "p150").is_dir()


# --------------------------------------------------------------------------- the reader


def test_the_bounded_reader(tmp_path: Path) -> None:
    from ttmesh import fileread

    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(fileread.Refused, match="is a FIFO"):
        fileread.read_bytes(tmp_path / "fifo", 10)  # returns: nothing opens it for reading
    with pytest.raises(fileread.Refused, match="is a character device"):
        fileread.read_bytes("/dev/zero", 10)
    with open(tmp_path / "huge", "w") as f:
        f.truncate(HUGE)
    with pytest.raises(fileread.Refused, match="is 3 GiB: more than the 1 KiB a thing can be"):
        fileread.read_bytes(tmp_path / "huge", 1024, "thing")
    # A kernel file says its size is 0 whatever it holds: the limit holds on what is read.
    with pytest.raises(fileread.Refused, match="holds more than the 16 bytes"):
        fileread.read_bytes("/proc/self/status", 16)
    (tmp_path / "bin").write_bytes(b"ok\xff")
    with pytest.raises(fileread.Refused, match="is not UTF-8 text"):
        fileread.read_text(tmp_path / "bin", 10)
    (tmp_path / "ok").write_text("fine\n")
    assert fileread.read_text(tmp_path / "ok", 5) == "fine\n"
    with pytest.raises(FileNotFoundError):
        fileread.read_bytes(tmp_path / "missing", 10)


# Reads that do not go through ttmesh.fileread (or paths.read_text / yamlio / Host.read_text,
# which use it), each with why: the kernel's own files, files ttmesh itself wrote in a
# directory only this user can write, the package's own files.
NOT_BOUNDED = {
    "procs.py": "the kernel's /proc files",
    "sim/core.py": "/proc/PID/stat",
    "sim/tt_smi.py": "/proc and /etc/os-release",
    "sim/create.py": "the package's own tools",
    "runtime/leases.py": "/proc/locks and lease files (the leases' own checks)",
    "runtime/jobs.py": "job records in the user's private runtime directory (mode 0700)",
    "launcher/nodes/rankshim.py": "the plan's files it is about to write",
    "launcher/job/active.py": "the logs of the probe it ran, in its own temporary directory",
    "launcher/serving/watch.py": "/proc/PID/cmdline",
}
RAW_READ = re.compile(r"\.read_text\((?!\w)|\.read_bytes\(\)|json\.load\(|(?<![\w.])open\(")
WRITE_MODE = re.compile(r"[\"'][wax]b?\+?[\"']")


def test_no_reader_goes_around_the_bounded_one() -> None:
    found = []
    for path in sorted((REPO / "ttmesh").rglob("*.py")):
        rel = str(path.relative_to(REPO / "ttmesh"))
        if rel in NOT_BOUNDED or rel == "fileread.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if RAW_READ.search(code) and "fileread." not in code and "def " not in code:
                if WRITE_MODE.search(code) or re.search(
                    r"\b(host|self|paths)\.read_text\(|tarfile\.open\(", code
                ):
                    continue
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "reads that are not bounded:\n" + "\n".join(found)


def test_a_limit_on_open_files_too_low_for_the_ranks_is_one_line(qb2: Path) -> None:
    """A shell whose ``ulimit -n`` cannot hold the job's pipes is refused before anything is
    chosen or started (exit 2, one line naming the limit and how to raise it), not by the
    guardian's EMFILE once some ranks run; a limit that fits runs the job."""
    from conftest import _environment

    def launch(files: int) -> subprocess.CompletedProcess[str]:
        def limit() -> None:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (files, hard))

        return subprocess.run(
            [sys.executable, "-m", "ttmesh", "launch", "--root", str(qb2), "--tp-size", "4",
             "--job-id", f"files-{files}", "--", "true"],
            capture_output=True, text=True, env=_environment(None, ()), timeout=60,
            preexec_fn=limit,
        )  # fmt: skip

    refused = launch(60)
    assert refused.returncode == 2, refused.stderr
    said = [ln for ln in refused.stderr.splitlines() if ln.startswith("ttmesh:")]
    assert len(said) == 1 and "ulimit -n" in said[0] and "may open 60" in said[0], refused.stderr
    assert "Traceback" not in refused.stderr
    ls = subprocess.run([sys.executable, "-m", "ttmesh", "ps", "--all", "--json"],
                        capture_output=True, text=True, env=_environment(None, ()))  # fmt: skip
    assert "files-60" not in ls.stdout  # nothing recorded
    fits = launch(200)
    assert fits.returncode == 0, fits.stderr
