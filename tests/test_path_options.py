"""Every command, every path option, pointed at a file, a directory, a missing path and an
unreadable one, as root and as another user (nobody): never a traceback, always one line. The
options that read or run what they name also get what no one should read: a FIFO (an open
waits forever for a writer), /dev/zero (never ends) and a huge (sparse) file; each is refused
in one line, quickly and without reading it (a memory cap and a timeout make a regression fail
instead of hanging the suite or waking the OOM killer).

The two users are tests/users.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from users import (
    NEEDS_NOBODY,
    User,
    users_fixture,  # noqa: F401  (the fixture "users")
)

KINDS = ("file", "dir", "missing", "unreadable")
HOSTILE = ("fifo", "devzero", "huge")  # never to be read (module docstring)
HUGE = 3 << 30  # a sparse file of 3 GiB: no format ttmesh reads is a thousandth of it
C01 = "0000:01:00.0"


def _paths(user: User, tag: str) -> dict[str, Path]:
    """One path of each kind, made by the user who will use it."""
    work = user.base / tag
    script = (
        "import os, sys; w = sys.argv[1]; os.makedirs(w + '/dir'); "
        "open(w + '/file', 'w').write('x\\n'); os.makedirs(w + '/locked'); "
        "open(w + '/locked/x', 'w').write('x\\n'); os.chmod(w + '/locked', 0)\n"
        "for end in ('', '.yaml', '.py', '.tar.gz'):\n"
        "    os.mkfifo(w + '/fifo' + end); os.symlink('/dev/zero', w + '/devzero' + end)\n"
        f"    open(w + '/huge' + end, 'w').truncate({HUGE})"
    )
    if user.name == "root":
        subprocess.run([sys.executable, "-c", script, str(work)], check=True)
    else:
        work.mkdir(mode=0o777)
        work.chmod(0o777)
        subprocess.run([sys.executable, "-c", script, str(work)], check=True)
        subprocess.run(["chown", "-R", "nobody:nogroup", str(work)], check=True)
    return {
        "file": work / "file",
        "dir": work / "dir",
        "missing": work / "missing" / "deeper",
        "unreadable": work / "locked" / "x",
        **{kind: work / kind for kind in HOSTILE},
    }


# (name, argv with {P} for the path and {SIM} for the user's simulated host)
CASES: list[tuple[str, list[str]]] = [
    ("ls --root", ["ls", "--root", "{P}"]),
    ("ls --json --root", ["ls", "--json", "--root", "{P}"]),
    ("check --root", ["check", "--root", "{P}"]),
    ("check --ttnn-python", ["check", "--root", "{SIM}", "--active", "--ttnn-python", "{P}"]),
    ("reset --root", ["reset", "--root", "{P}", "--timeout", "5"]),
    ("reset --tt-smi", ["reset", "--root", "{SIM}", "--tt-smi", "{P}", "--timeout", "5"]),
    ("ps --root", ["ps", "--root", "{P}"]),
    ("launch --root", ["launch", "--root", "{P}", "--tp-size", "1", "--dry-run", "true"]),
    (
        "launch --log-dir",
        ["launch", "--root", "{SIM}", "--tp-size", "1", "--log-dir", "{P}", "true"],
    ),
    (
        "launch --workdir",
        ["launch", "--root", "{SIM}", "--tp-size", "1", "--workdir", "{P}", "true"],
    ),
    ("launch --rank-binding", ["launch", "--root", "{SIM}", "--rank-binding", "{P}", "true"]),
    (
        "launch --summary-json",
        ["launch", "--root", "{SIM}", "--tp-size", "1", "--summary-json", "{P}", "true"],
    ),
    ("launch --tt-smi", ["launch", "--root", "{SIM}", "--tp-size", "1", "--tt-smi", "{P}", "true"]),
    ("launch COMMAND", ["launch", "--root", "{SIM}", "--tp-size", "1", "{P}"]),
    ("launch SCRIPT.py", ["launch", "--root", "{SIM}", "--tp-size", "1", "{P}.py"]),
    ("descriptor -o", ["descriptor", "--root", "{SIM}", "-o", "{P}"]),
    (
        "descriptor --export-rank-binding",
        ["descriptor", "--root", "{SIM}", "-o", "{OUT}", "--export-rank-binding", "{P}"],
    ),
    ("doctor --capture", ["doctor", "--root", "{SIM}", "--capture", "{P}"]),
    ("doctor --root", ["doctor", "--root", "{P}", "--capture", "{OUT}.tar.gz"]),
    ("doctor --tt-smi", ["doctor", "--root", "{SIM}", "--tt-smi", "{P}", "--capture", "{OUT}"]),
    ("sim create --from-capture", ["sim", "create", "--from-capture", "{P}", "--root", "{NEW}"]),
    ("sim create --system", ["sim", "create", "--system", "{P}", "--root", "{NEW}"]),
    ("sim create --system YAML", ["sim", "create", "--system", "{P}.yaml", "--root", "{NEW}"]),
    ("sim create --root", ["sim", "create", "--system", "p150", "--root", "{P}"]),
    ("sim fault --root", ["sim", "fault", "--root", "{P}", "chip-dead", C01]),
    ("sim show --root", ["sim", "show", "--root", "{P}"]),
    ("sim clear --root", ["sim", "clear", "--root", "{P}"]),
    ("sim config --root", ["sim", "config", "--root", "{P}", "--heartbeat-hz", "50"]),
]


# Kinds of path each option must refuse with exit 2 (root can read "unreadable" paths, so that
# kind counts for other users only). The hostile kinds run only where they are listed.
ALL = set(KINDS)
ROOTS = {"file", "missing", "unreadable", *HOSTILE}  # a --root: only a directory will do
TOOL = ALL | set(HOSTILE)  # a program to run (a huge sparse file is not executable)
REFUSE: dict[str, set[str]] = {
    "ls --root": ROOTS,
    "check --root": ROOTS,
    "check --ttnn-python": TOOL,
    "reset --root": {*HOSTILE},
    "reset --tt-smi": TOOL,
    "ps --root": {*HOSTILE},
    "launch --root": ROOTS,
    "launch --log-dir": {"file", "unreadable", *HOSTILE},
    "launch --workdir": ROOTS,
    "launch --rank-binding": ALL | set(HOSTILE),
    "launch --summary-json": {"dir", "missing", "unreadable"},
    "launch --tt-smi": TOOL,
    "launch COMMAND": TOOL,
    "launch SCRIPT.py": ALL | {"fifo", "devzero"},  # a huge script is Python's to read
    "descriptor -o": {"file", "unreadable", *HOSTILE},
    "descriptor --export-rank-binding": {"dir", "unreadable"},
    "doctor --capture": ALL,
    "doctor --root": ROOTS,
    "doctor --tt-smi": TOOL,
    "sim create --from-capture": ALL | set(HOSTILE),
    "sim create --system": ALL | set(HOSTILE),
    "sim create --system YAML": ALL | set(HOSTILE),
    "sim create --root": {"file", "unreadable", *HOSTILE},
    "sim fault --root": ALL | set(HOSTILE),
    "sim show --root": ALL | set(HOSTILE),
    "sim clear --root": ALL | set(HOSTILE),
    "sim config --root": ALL | set(HOSTILE),
}


def _check(user: User, name: str, kind: str, res: subprocess.CompletedProcess[str]) -> list[str]:
    problems = []
    where = f"[{user.name}] {name} -> {kind}: exit {res.returncode}"
    must_refuse = kind in REFUSE.get(name, set()) and not (
        kind == "unreadable" and user.name == "root"
    )
    if must_refuse and res.returncode != 2:
        problems.append(f"{where}: expected a refusal (exit 2)\n{res.stderr}")
    if "Traceback" in res.stderr or "Traceback" in res.stdout:
        problems.append(f"{where}: a traceback\n{res.stderr}")
    if "internal error" in res.stderr or "supervisor error" in res.stderr:
        problems.append(f"{where}: {res.stderr.strip().splitlines()[-1]}")
    if res.returncode not in (0, 1, 2, 3):
        problems.append(f"{where}: unexpected exit code\n{res.stderr}")
    if res.returncode != 0:
        lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("simulated host: ")]
        if not lines or not lines[-1].startswith("ttmesh: "):
            problems.append(f"{where}: no one-line reason\n{res.stderr}")
    return problems


@pytest.mark.parametrize("who", ["root", "nobody"])
@pytest.mark.parametrize(("name", "argv"), CASES, ids=[c[0] for c in CASES])
def test_path_options_take_every_kind_of_path_without_a_traceback(
    users: dict[str, User], who: str, name: str, argv: list[str]
) -> None:
    if who not in users:
        pytest.skip(NEEDS_NOBODY)
    user = users[who]
    tag = name.replace(" ", "_").replace("-", "").replace(".", "")
    paths = _paths(user, tag)
    problems: list[str] = []
    for kind in (*KINDS, *(k for k in HOSTILE if k in REFUSE.get(name, set()))):
        args = [
            a.replace("{P}", str(paths[kind]))
            .replace("{SIM}", str(user.sim))
            .replace("{OUT}", str(user.base / tag / f"out-{kind}"))
            .replace("{NEW}", str(user.base / tag / f"new-{kind}"))
            for a in argv
        ]
        problems += _check(user, name, kind, user.run(*args, hostile=kind in HOSTILE))
    assert not problems, "\n".join(problems)


def test_another_users_simulated_host(users: dict[str, User]) -> None:
    """nobody on root's simulated host: reading works, changing it says whose it is."""
    if "nobody" not in users:
        pytest.skip(NEEDS_NOBODY)
    nobody, root_sim = users["nobody"], str(users["root"].sim)
    for args in (["ls"], ["check"], ["launch", "--tp-size", "1", "--dry-run", "true"]):
        res = nobody.run(args[0], "--root", root_sim, *args[1:])
        assert res.returncode == 0, res.stderr
    # The dry run runs pre-flight, and says the launch (changing the host) would be refused.
    res = nobody.run("launch", "--root", root_sim, "--tp-size", "1", "--dry-run", "--json", "true")
    checks = {c["check"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["pre-flight"]["result"] == "passed", checks
    assert checks["host"]["result"] == "failed" and "owned by root" in checks["host"]["detail"]
    for args in (
        ["launch", "--root", root_sim, "--tp-size", "1", "true"],
        ["reset", "--root", root_sim],
        ["sim", "fault", "--root", root_sim, "chip-dead", C01],
        ["sim", "clear", "--root", root_sim],
    ):
        res = nobody.run(*args)
        assert res.returncode == 2, (args, res.stderr)
        last = res.stderr.strip().splitlines()[-1]
        assert "Traceback" not in res.stderr
        assert last.endswith(
            "(the simulated host is owned by root: run as root, or use your own simulated host "
            "with --sim NAME)"
        ), (args, last)
    # Nothing changed: root's host is as healthy as before.
    assert users["root"].run("check", "--root", root_sim).returncode == 0


GONE = 'mkdir "$0" && cd "$0" && rmdir "$0" && exec "$@"'  # run "$@" in a deleted directory


@pytest.mark.parametrize("who", ["root", "nobody"])
def test_a_launch_names_the_path_its_surroundings_break(users: dict[str, User], who: str) -> None:
    """A launch from a working directory that was deleted, and one whose TTMESH_RUNTIME_DIR is
    /proc (a directory no file can be made in), said "cannot use: No such file or directory"
    and "cannot use 00008a26321e00c1.lock: ...", naming no path: each names it, and the fix."""
    if who not in users:
        pytest.skip(NEEDS_NOBODY)
    user = users[who]
    gone = user.base / "deleted-cwd"
    argv = user.argv("sh", "-c", GONE, str(gone), user.python, "-m", "ttmesh", "launch",
                     "--root", str(user.sim), "--chips", C01, "--", "true")  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=user.base)
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last == (
        f"ttmesh: the working directory {gone} no longer exists (it was deleted) (cd to a "
        "directory that exists and run the command again)"
    ), last
    res = user.run("launch", "--root", str(user.sim), "--chips", C01, "--", "true",
                   env={"TTMESH_RUNTIME_DIR": "/proc"})  # fmt: skip
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ttmesh: cannot create the lease file /proc/"), last
    assert "in the lease directory /proc: " in last and "TTMESH_RUNTIME_DIR=/proc: set it" in last
