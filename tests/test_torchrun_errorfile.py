"""The launcher's own TORCHELASTIC_ERROR_FILE, as a scheduler (TorchX) reads torchrun's
(issue 23, "Failures and signals").

torchrun's @record main copies the failing rank's own error file there with ``errorCode``
set, or records its SignalException when it is stopped by a signal; ttmesh writes the same
shape, and also when the rank recorded nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TAG, alive, run_cli, start_launch, wait_for
from users import (
    User,
    users_fixture,  # noqa: F401
    world_dir,
)

RECORD = """
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("bad batch 17")

main()
"""


def _shape(data: Any) -> Any:
    """The keys of a JSON document, nested (values left out)."""
    if isinstance(data, dict):
        return {k: _shape(v) for k, v in data.items()}
    return type(data).__name__


@pytest.mark.slow
def test_the_root_cause_is_torchruns_json(qb2: Path, tmp_path: Path) -> None:
    """A rank's @record exception: torchrun and ttmesh, run here alike, write one shape, one
    message, one errorCode."""
    script = tmp_path / "rec.py"
    script.write_text(RECORD)
    theirs, ours = tmp_path / "torchrun.json", tmp_path / "ttmesh.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script)],
        capture_output=True, text=True, timeout=300,
        # torchrun makes its log directory (torchelastic_*) in TMPDIR and leaves it there
        env={**os.environ, "TORCHELASTIC_ERROR_FILE": str(theirs), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    res = run_cli("launch", "--root", str(qb2), "--nproc-per-node", "1", str(script),
                  env={"TORCHELASTIC_ERROR_FILE": str(ours)}, timeout=300)  # fmt: skip
    assert res.code == 1, res.err
    a, b = json.loads(theirs.read_text()), json.loads(ours.read_text())
    assert _shape(b) == _shape(a)
    assert b["message"]["message"] == a["message"]["message"] == "ValueError: bad batch 17"
    assert b["message"]["errorCode"] == a["message"]["errorCode"] == 1
    assert "bad batch 17" in b["message"]["extraInfo"]["py_callstack"]


# torchrun's shapes (torch 2.13: ErrorHandler.record_exception, dump_error_file).
RANK_SHAPE = {
    "message": {
        "message": "str",
        "extraInfo": {"py_callstack": "str", "timestamp": "str"},
        "errorCode": "int",
    }
}
SIGNAL_SHAPE = {
    "message": {"message": "str", "extraInfo": {"py_callstack": "str", "timestamp": "str"}}
}


def test_a_rank_that_recorded_nothing_still_gives_its_root_cause(qb2: Path, tmp_path: Path) -> None:
    """torchrun writes nothing then; ttmesh writes the rank's reason, last lines and code."""
    ours = tmp_path / "err.json"
    res = run_cli(
        "launch", "--root", str(qb2), "--tp-size", "2", "--", sys.executable, "-c",
        "import os, sys; r = os.environ['RANK']; print('boom', r, file=sys.stderr); "
        "sys.exit(7 if r == '1' else 0)",
        env={"TORCHELASTIC_ERROR_FILE": str(ours)},
    )  # fmt: skip
    assert res.code == 7, res.err
    data = json.loads(ours.read_text())
    assert _shape(data) == RANK_SHAPE
    assert data["message"]["errorCode"] == 7
    assert data["message"]["message"].startswith("rank 1 ")
    assert "boom 1" in data["message"]["extraInfo"]["py_callstack"]


def test_success_writes_no_error_file(qb2: Path, tmp_path: Path) -> None:
    ours = tmp_path / "err.json"
    res = run_cli("launch", "--root", str(qb2), "--tp-size", "1", "--", "true",
                  env={"TORCHELASTIC_ERROR_FILE": str(ours)})  # fmt: skip
    assert res.code == 0, res.err
    assert not ours.exists()


def test_a_signal_to_ttmesh_is_recorded_as_torchruns_signal_exception(
    qb2: Path, tmp_path: Path
) -> None:
    ours = tmp_path / "err.json"
    pids = tmp_path / "pids"
    pids.mkdir()
    proc = start_launch(
        qb2, "--tp-size", "1", "--no-live", "--", sys.executable, "-c",
        "import os, sys, time; open(os.path.join(sys.argv[1], 'pid'), 'w').write(str(os.getpid()));"
        " time.sleep(60)", str(pids), TAG,
        env={"TORCHELASTIC_ERROR_FILE": str(ours)},
    )  # fmt: skip
    try:
        wait_for(lambda: (pids / "pid").exists() and (pids / "pid").read_text(), what="the rank")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    data = json.loads(ours.read_text())
    assert _shape(data) == SIGNAL_SHAPE
    assert data["message"]["message"] == f"SignalException: Process {proc.pid} got signal: 2"
    rank = int((pids / "pid").read_text())
    assert not alive(rank)
    with contextlib.suppress(OSError):
        os.kill(rank, signal.SIGKILL)


def test_an_error_file_another_user_planted_as_a_link_is_not_written_through(
    users: dict[str, User], tmp_path: Path
) -> None:
    """Root's ttmesh with TORCHELASTIC_ERROR_FILE in a shared directory (/tmp-like, sticky)
    where nobody put a link to root's file: nothing is written through it, the line says so,
    and the job keeps its code."""
    if "nobody" not in users:
        pytest.skip("needs the nobody user (setpriv)")
    root, nobody = users["root"], users["nobody"]
    target = tmp_path / "roots-file"
    target.write_text("root's\n")
    sticky = world_dir("ttmesh-errfile-", 0o1777)
    try:
        link = sticky / "error.json"
        made = nobody.py("import os, sys; os.symlink(sys.argv[2], sys.argv[1])",
                         str(link), str(target))  # fmt: skip
        assert made.returncode == 0, made.stderr
        res = root.run("launch", "--root", str(root.sim), "--tp-size", "1", "--", "sh", "-c",
                       "exit 5", env={"TORCHELASTIC_ERROR_FILE": str(link)})  # fmt: skip
        assert res.returncode == 5, res.stderr
        assert f"TORCHELASTIC_ERROR_FILE {link} is a symbolic link of nobody's" in res.stderr
        assert target.read_text() == "root's\n"
    finally:
        import shutil

        shutil.rmtree(sticky)
