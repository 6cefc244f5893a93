"""``ttmesh check`` inside a container (docs/containers.md), on a simulated host that models
one (``ttmesh sim fault container``: /.dockerenv, an overlay root, Docker's private 64 MiB
/dev/shm, a device node a reset re-created outside the container)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path


def _check(cli: Callable, root: Path, *args: str) -> tuple[int, dict]:
    r = cli("check", "--json", "--root", str(root), *args)
    assert r.code in (0, 1), r.err
    return r.code, json.loads(r.out)


def test_check_in_a_container_names_the_mistakes(qb2: Path, cli: Callable) -> None:
    fault = cli("sim", "fault", "--root", str(qb2), "container", "0000:03:00.0")
    assert fault.code == 0, fault.err
    code, doc = _check(cli, qb2)
    assert code == 1
    by_what = {p["what"]: p for p in doc["problems"]}
    node = next(p for w, p in by_what.items() if "has no driver node in this container" in w)
    assert node["severity"] == "error" and node["what"].startswith("0000:03:00.0 ")
    assert "restart the container" in node["fix"]
    assert "--device-cgroup-rule 'c 240:* rwm'" in node["fix"]
    small = next(p for w, p in by_what.items() if w.startswith("/dev/shm holds 64 MiB"))
    assert small["severity"] == "warning" and "--shm-size 16g" in small["fix"]
    private = next(p for w, p in by_what.items() if "/dev/shm is the container's own" in w)
    assert "--ipc=host" in private["fix"]
    assert any(n.startswith("running in a container (/.dockerenv exists") for n in doc["notes"])
    assert any("/tmp/tt_umd_listeners" in n for n in doc["notes"])
    text = cli("check", "--root", str(qb2))
    assert text.code == 1
    assert "error: 0000:03:00.0 has no driver node in this container" in text.out
    assert "warning: /dev/shm holds 64 MiB" in text.out
    assert "  fix: start the container with --shm-size 16g" in text.out


def test_a_big_shared_shm_and_no_container_say_nothing(qb2: Path, cli: Callable) -> None:
    _, plain = _check(cli, qb2)
    assert not any("container" in p["what"] for p in plain["problems"])
    assert not any("container" in n for n in plain["notes"])
    assert cli("sim", "fault", "--root", str(qb2), "container", "--shm-size", "16384").code == 0
    _, doc = _check(cli, qb2)
    assert not any(p["what"].startswith("/dev/shm holds") for p in doc["problems"])
    assert cli("sim", "clear", "--root", str(qb2)).code == 0
    assert not os.path.exists(qb2 / ".dockerenv")
    code, after = _check(cli, qb2)
    assert code == 0  # the node is back too
    assert not any("container" in p["what"] for p in after["problems"]), after["problems"]


def test_outside_a_container_a_missing_node_keeps_the_driver_fix(qb2: Path, cli: Callable) -> None:
    os.unlink(qb2 / "dev/tenstorrent/0")
    code, doc = _check(cli, qb2)
    assert code == 1
    node = next(p for p in doc["problems"] if "has no driver node" in p["what"])
    assert "in this container" not in node["what"] and "modprobe" in node["fix"]
