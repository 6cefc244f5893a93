"""The simulated host's view (ttmesh.runtime.hostview), built in a child of the test: what a
rank sees at /dev/tenstorrent and /proc/driver/tenstorrent, and how it is mounted."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

as_root = pytest.mark.skipif(os.getuid() != 0, reason="a mount namespace of its own: root")


def _in_child(look: Callable[[], dict]) -> dict:
    """``look()`` run in a forked child (a view is the child's own mount namespace, a grown
    descriptor table its own, both gone with it): what it returned, or why it raised."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            seen = look()
        except BaseException as exc:
            seen = {"failed": str(exc) or repr(exc)}
        os.write(write, json.dumps(seen).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text)


def _seen(root: Path, devices: list[str]) -> dict:
    """What a process sees once the view of ``devices`` is built, or why it could not be."""
    from ttmesh.runtime import hostview

    def look() -> dict:
        hostview.build(str(root), devices)
        by_id = "/dev/tenstorrent/by-id"
        mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()]
        return {
            "dev": sorted(os.listdir("/dev/tenstorrent")),
            "by_id": {n: os.readlink(f"{by_id}/{n}") for n in os.listdir(by_id)},
            "proc": sorted(os.listdir("/proc/driver/tenstorrent")),
            "mounts": [m for m in mounts if "tenstorrent" in m],
            "null": os.path.exists("/dev/null"),
        }

    return _in_child(look)


@as_root
def test_every_chip_of_the_root_is_one_mount_each_directory(qb2: Path) -> None:
    """A job with every chip of the root sees the root's own directories, bound whole (one
    mount each, not one per chip: at 128 chips the binds took about 20 ms)."""
    seen = _seen(qb2, ["0", "1", "2", "3"])
    assert seen["dev"] == ["0", "1", "2", "3", "by-id"] and seen["proc"] == ["0", "1", "2", "3"]
    assert sorted(seen["by_id"].values()) == ["../0", "../1", "../2", "../3"]
    assert sorted(seen["mounts"]) == ["/dev/tenstorrent", "/proc/driver/tenstorrent"]
    assert seen["null"]


@as_root
def test_some_chips_are_bound_one_by_one(qb2: Path) -> None:
    seen = _seen(qb2, ["0", "2"])
    assert seen["dev"] == ["0", "2", "by-id"] and seen["proc"] == ["0", "2"]
    assert sorted(seen["by_id"].values()) == ["../0", "../2"]
    assert "/dev/tenstorrent/0" in seen["mounts"] and "/dev/tenstorrent/1" not in seen["mounts"]


@as_root
def test_a_root_with_more_than_its_chips_is_not_shown_whole(qb2: Path) -> None:
    """An entry the view would not make (a by-id link elsewhere, a file beside the chips) keeps
    every chip bound one by one, the links written as the view writes them."""
    by_id = qb2 / "dev" / "tenstorrent" / "by-id"
    (by_id / "elsewhere").symlink_to("/etc/shadow")
    (qb2 / "proc" / "driver" / "tenstorrent" / "notes").write_text("planted\n")
    seen = _seen(qb2, ["0", "1", "2", "3"])
    assert seen["dev"] == ["0", "1", "2", "3", "by-id"] and seen["proc"] == ["0", "1", "2", "3"]
    assert sorted(seen["by_id"].values()) == ["../0", "../1", "../2", "../3"]
    assert "/dev/tenstorrent" not in seen["mounts"] and "/dev/tenstorrent/3" in seen["mounts"]


@as_root
def test_a_chip_that_is_a_link_is_refused_whole_or_not(qb2: Path) -> None:
    entry = qb2 / "dev" / "tenstorrent" / "1"
    entry.unlink()
    entry.symlink_to("/dev/null")
    seen = _seen(qb2, ["0", "1", "2", "3"])
    assert "is a link" in seen["failed"]


def _fd_size() -> int:
    """The size of this process's descriptor table (what it has room for)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(ln.split()[1] for ln in status if ln.startswith("FDSize")))


def _fds() -> list[int]:
    return sorted(int(n) for n in os.listdir("/proc/self/fd"))


def test_the_descriptor_table_is_grown_while_one_thread_has_it() -> None:
    """A descriptor table that threads share waits for an RCU grace period each time it grows
    (7 to 15 ms): the view's thread, which opens the chips' entries and the ranks' pipes, finds
    it grown already. Nothing is left open."""
    from ttmesh.runtime.rankview import reserve_descriptors

    def look() -> dict:
        before = _fds()
        reserve_descriptors(600)
        return {"size": _fd_size(), "highest": before[-1], "same": _fds() == before}

    seen = _in_child(look)
    assert seen["same"], seen
    assert seen["size"] > seen["highest"] + 600, seen


@as_root
def test_the_views_thread_opens_the_ranks_pipes_without_growing_the_table(qb2: Path) -> None:
    from ttmesh.runtime.rankview import Views

    def look() -> dict:
        views = Views([], str(qb2), ["0", "1"], open_files=700)
        views.open()
        assert views.notice is None, views.notice

        def start() -> int:
            pipes = [os.pipe() for _ in range(300)]
            grown = _fd_size()
            for r, w in pipes:
                os.close(r)
                os.close(w)
            return grown

        try:
            return {"before": _fd_size(), "in_thread": views.within(start)}
        finally:
            views.close()

    seen = _in_child(look)
    assert seen["in_thread"] == seen["before"], seen
