"""``ttmesh doctor --capture`` and ``ttmesh sim create --from-capture``: a field capture
rebuilds the host it came from, and a hostile archive is refused before anything is written.

Every stock system is captured and recreated in-process (the CLI is exercised where it is the
point: exit codes, one-line errors, files written or not)."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import STOCK

from ttmesh.cli.hosts import open_host
from ttmesh.errors import TTMeshError
from ttmesh.fabric import health, listing
from ttmesh.fabric.devices import discover
from ttmesh.host import clusterdesc
from ttmesh.recovery import capture
from ttmesh.sim import core, faults
from ttmesh.sim.from_capture import recreate

ALL = [*STOCK, "n300x2", "p300x2-disconnected"]  # every system under ttmesh/configs/systems


def take(root: Path, dest: Path) -> Path:
    """Capture ``root`` into ``dest`` in-process."""
    return capture.write_archive(capture.collect(open_host(root)), dest)


def view(root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ls, check) documents of ``root``, heartbeat counters and the root path left out.
    (Heartbeats advance at 10 Hz: a 0.3 s poll tells alive from frozen.)"""
    inv = discover(open_host(root))
    ls = listing.build(inv, timeout=0.3)
    doc = health.check(inv, timeout=0.3).to_json()
    text = json.dumps({"ls": ls, "check": doc}).replace(str(root.resolve()), "ROOT")
    both = json.loads(text)
    both["ls"].pop("host")
    return both["ls"], both["check"]


def members(archive: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as tar:
        return {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("system", ALL)
def test_every_stock_system_recreated(
    system: str, make_sim: Callable[..., Path], tmp_path: Path
) -> None:
    root = make_sim(system)
    archive = take(root, tmp_path / "capture.tar.gz")
    twin = tmp_path / "twin"
    rec, _ = recreate(archive, twin)
    assert rec.reproduced == [] and not rec.dead and not rec.gone and not rec.links_down
    ls_a, check_a = view(root)
    ls_b, check_b = view(twin)
    assert ls_b["chips"] == ls_a["chips"]  # ids, PCI addresses, /dev numbers, boards, arch
    assert ls_b["links"] == ls_a["links"]
    assert ls_b == ls_a and check_b == check_a
    assert clusterdesc.load(twin / "cluster_descriptor.yaml") == clusterdesc.load(
        root / "cluster_descriptor.yaml"
    )  # harvesting, boards, asic locations, coordinates, bus ids, links
    model = json.loads((twin / core.SYSTEM_FILE).read_text())
    stock = json.loads((root / core.SYSTEM_FILE).read_text())
    for key in ("chips", "boards", "links", "remote_links", "driver_version"):
        assert model[key] == stock[key], key


def test_archive_layout_and_manifest(qb2: Path, tmp_path: Path, cli: Callable) -> None:
    archive = tmp_path / "qb2.tar.gz"
    res = cli("doctor", "--root", str(qb2), "--capture", str(archive))
    assert res.code == 0, res.err
    assert f"wrote {archive}" in res.out
    found = members(archive)
    tops = {m.name.split("/", 1)[0] for m in found.values()}
    assert len(tops) == 1 and next(iter(tops)).startswith("ttmesh-capture-")
    for name in (
        "manifest.json",
        "cluster_descriptor.yaml",
        "tt-smi-snapshot.json",
        "dev-tenstorrent.json",
        "ttmesh/ls.json",
        "ttmesh/check.json",
        "host/sys/module/tenstorrent/version",
        "host/proc/driver/tenstorrent/0/pids",
    ):
        assert found[name].isreg(), name
    # The driver's links are links; attributes are regular files with their real size.
    node = found["host/sys/class/tenstorrent/tenstorrent!0"]
    assert node.issym() and node.linkname.startswith("../../devices/")
    assert found["host/sys/bus/pci/devices/0000:01:00.0"].issym()
    asic = [n for n in found if n.endswith("tenstorrent!0/tt_asic_id")]
    assert len(asic) == 1 and found[asic[0]].size == 17
    assert not any(m.isdev() or m.islnk() for m in found.values())
    with tarfile.open(archive) as tar:
        top = next(iter(tops))
        manifest = json.load(tar.extractfile(f"{top}/manifest.json"))  # type: ignore[arg-type]
        smi = json.load(tar.extractfile(f"{top}/tt-smi-snapshot.json"))  # type: ignore[arg-type]
    assert manifest["schema"] == "ttmesh.capture/1"
    assert manifest["host"]["root"] == str(qb2.resolve()) and manifest["host"]["simulated"]
    assert manifest["driver"] == "2.10.0" and manifest["ttmesh"]
    assert set(manifest["sections"]) == set(capture.SECTIONS)
    assert manifest["sections"]["tt-smi -s"]["ok"] and manifest["sections"]["ttmesh check"]["ok"]
    assert [m["what"] for m in manifest["not_captured"]] == ["kernel messages"]
    assert "host/sys/class/tenstorrent/tenstorrent!0" in manifest["captured"]
    assert len(smi["device_info"]) == 4


def test_a_captured_hosts_faults_are_recreated_by_sim_create(
    make_sim: Callable[..., Path], tmp_path: Path, cli: Callable, hold_pids: list[int]
) -> None:
    """t3k: a link down, a dead chip, a chip (and the remote chip behind it) gone after a
    reset, a holder: the recreated host fails check the same way; the holder is named as not
    reproduced."""
    root = make_sim("t3k")
    host = open_host(root)
    faults.link_down(host, "0000:01:00.0", "0000:02:00.0")
    faults.chip_dead(host, "0000:03:00.0")
    gone = faults.chip_dead(host, "0000:04:00.0", permanent=True)
    core.SimRoot(str(root)).reset([gone])
    hold_pids.append(faults.hold(host, "0000:02:00.0"))
    archive = tmp_path / "t3k.tar.gz"
    res = cli("doctor", "--root", str(root), "--capture", str(archive))
    assert res.code == 0, res.err
    faults.clear(host)  # the holder ends; the capture keeps what it saw
    twin = tmp_path / "twin"
    res = cli("sim", "create", "--from-capture", str(archive), "--root", str(twin))
    assert res.code == 0, res.err
    assert "reproduced: dead" in res.out and "0000:03:00.0" in res.out
    # check --json: the same problems (a dead chip, a lost chip, links down), bar the holder.
    with tarfile.open(archive) as tar:
        name = next(m for m in tar.getnames() if m.endswith("ttmesh/check.json"))
        captured = json.load(tar.extractfile(name))  # type: ignore[arg-type]
    res = cli("check", "--json", "--root", str(twin))
    assert res.code == 1, res.err
    now = json.loads(res.out.replace(str(twin.resolve()), str(root.resolve())))
    held = [p for p in captured["problems"] if "is held by" in p["what"]]
    assert len(held) == 1
    assert now["problems"] == [p for p in captured["problems"] if p not in held]
    kinds = " ".join(p["what"] for p in now["problems"])
    assert "heartbeat" in kinds and "down" in kinds and "0000:04:00.0" in kinds
    assert now["links"] == captured["links"]
    ls_b, _ = view(twin)
    assert sorted(ls_b["missing"]) == sorted([gone, gone.replace("00000002", "00000003", 1)])
    res = cli("sim", "show", "--json", "--root", str(twin))
    shown = json.loads(res.out)
    assert shown["faults"]["permanent"] and len(shown["links_down"]) == 14
    assert shown["capture"]["archive"] == str(archive.resolve())
    assert any("held by pid" in n for n in shown["capture"]["not_reproduced"])
    text = cli("sim", "show", "--root", str(twin)).out
    assert "not reproduced: 0000:02:00.0 was held by pid" in text
    # The archive's members are kept with the host, as they were.
    assert (twin / "sim/capture/manifest.json").is_file()
    assert (twin / "sim/capture/host/sys/class/tenstorrent/tenstorrent!0").is_symlink()


def test_link_down_and_dead_chip_on_quietbox2(qb2: Path, tmp_path: Path, cli: Callable) -> None:
    host = open_host(qb2)
    faults.link_down(host, "0000:01:00.0", "0000:05:00.0", channel=None)
    faults.chip_dead(host, "0000:07:00.0")
    twin = tmp_path / "twin"
    recreate(take(qb2, tmp_path / "qb2.tar.gz"), twin)
    _, check_a = view(qb2)
    _, check_b = view(twin)
    assert check_b["problems"] == check_a["problems"] and not check_b["healthy"]
    assert check_b == check_a


# --------------------------------------------------------------------------- capture edges


def test_capture_never_follows_links_out_of_the_root(qb2: Path, tmp_path: Path) -> None:
    """A driver entry pointing outside the root is named in the manifest, not archived."""
    (qb2 / "sys/class/tenstorrent/tenstorrent!9").symlink_to("/etc")
    (qb2 / "sys/module/tenstorrent/escape").symlink_to("../../../../../../../../etc/passwd")
    archive = take(qb2, tmp_path / "x.tar.gz")
    found = members(archive)
    assert "host/sys/class/tenstorrent/tenstorrent!9" not in found
    assert not any("passwd" in n or n.startswith("host/etc") for n in found)
    manifest = capture.read_archive(archive).manifest
    outside = {m["what"] for m in manifest["not_captured"]}
    assert {"sys/class/tenstorrent/tenstorrent!9", "sys/module/tenstorrent/escape"} <= outside


def test_missing_or_failing_tt_smi_is_recorded(qb2: Path, tmp_path: Path, cli: Callable) -> None:
    (qb2 / "bin" / "tt-smi").unlink()
    archive = tmp_path / "a.tar.gz"
    res = cli("doctor", "--root", str(qb2), "--capture", str(archive))
    assert res.code == 0, res.err
    manifest = capture.read_archive(archive).manifest
    assert not manifest["sections"]["tt-smi -s"]["ok"]
    assert "tt-smi not found" in manifest["sections"]["tt-smi -s"]["why"]
    failing = tmp_path / "tt-smi"
    failing.write_text("#!/bin/sh\necho ' No Tenstorrent devices detected! Exiting... '\nexit 1\n")
    failing.chmod(0o755)
    res = cli("doctor", "--root", str(qb2), "--capture", str(archive), "--force", "--tt-smi",
              str(failing))  # fmt: skip
    assert res.code == 0, res.err
    ar = capture.read_archive(archive)
    smi = ar.manifest["sections"]["tt-smi -s"]
    assert smi["code"] == 1 and "No Tenstorrent devices detected" in smi["why"]
    assert "No Tenstorrent devices" in (ar.text(capture.SMI_TEXT) or "")
    assert "tt-smi -s" in res.out  # said on the terminal too


def test_bad_capture_paths_are_refused_in_one_line_keeping_what_exists(
    qb2: Path, tmp_path: Path, cli: Callable
) -> None:
    existing = tmp_path / "old.tar.gz"
    existing.write_bytes(b"keep me")
    cases = [
        (existing, [], "already exists"),
        (tmp_path / "no" / "dir.tar.gz", [], "no directory"),
        (tmp_path, [], "is a directory"),
        (tmp_path / "new.tar.gz", ["--tt-smi", str(tmp_path / "nope")], "tt-smi not found"),
    ]
    for path, extra, said in cases:
        res = cli("doctor", "--root", str(qb2), "--capture", str(path), *extra)
        assert res.code == 2, res.out
        lines = [ln for ln in res.err.splitlines() if not ln.startswith("simulated host:")]
        assert len(lines) == 1 and lines[0].startswith("ttmesh: ") and said in lines[0], res.err
    assert existing.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.tar.gz"]
    res = cli("doctor", "--root", str(qb2), "--capture", str(existing), "--force")
    assert res.code == 0, res.err
    assert capture.read_archive(existing).manifest["schema"] == capture.SCHEMA
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.tar.gz"]  # no temporary left


# --------------------------------------------------------------------------- hostile archives


def _archive(path: Path, *extra: tarfile.TarInfo | tuple[tarfile.TarInfo, Any]) -> Path:
    """A gzip tar with a valid manifest plus ``extra`` members (contents: bytes or a stream)."""
    manifest = json.dumps({"schema": capture.SCHEMA}).encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("top/manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        for item in extra:
            if isinstance(item, tuple):
                data = item[1]
                tar.addfile(item[0], io.BytesIO(data) if isinstance(data, bytes) else data)
            else:
                tar.addfile(item)
    return path


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.left)
        b[:n] = bytes(n)
        self.left -= n
        return n


def _huge(name: str) -> tuple[tarfile.TarInfo, Any]:
    info = tarfile.TarInfo(name)
    info.size = capture.MAX_MEMBER + 1
    return info, _Zeros(info.size)


HOSTILE: dict[str, tuple[Callable[[], list[Any]], str]] = {
    "dotdot": (lambda: [_file("top/../../escaped")], "climbs out with '..'"),
    "absolute": (lambda: [_file("/tmp/ttmesh-escaped")], "has an absolute path"),
    "symlink to /etc": (lambda: [_link("top/host/etc", "/etc")], "outside the archive"),
    "relative link out": (lambda: [_link("top/host/up", "../../../etc")], "outside the archive"),
    "link chain out": (lambda: [_link("top/a", "."), _link("top/b", "a/../..")], "outside the"),
    "through a link": (lambda: [_link("top/l", "host"), _file("top/l/x")], "behind a symbolic"),
    "link over files": (lambda: [_file("top/d/x"), _link("top/d", "host")], "hides members"),
    "hard link": (lambda: [_link("top/h", "top/manifest.json", tarfile.LNKTYPE)], "hard link"),
    "device": (lambda: [_link("top/dev", "", tarfile.CHRTYPE)], "is a character device"),
    "two tops": (lambda: [_file("other/x")], "outside the top directory"),
    "huge member": (lambda: [_huge("top/big")], "is 16777217 bytes"),
    # Appended under a name the archive has (tar --append): refused for what it is, not as a
    # member that "appears twice".
    "hard link, taken name": (
        lambda: [_link("top/manifest.json", "top/x", tarfile.LNKTYPE)],
        "is a hard link (to 'top/x')",
    ),
    "device, taken name": (
        lambda: [_link("top/manifest.json", "", tarfile.CHRTYPE)],
        "is a character device",
    ),
    "FIFO, taken name": (
        lambda: [_link("top/manifest.json", "", tarfile.FIFOTYPE)],
        "is a FIFO (named pipe)",
    ),
    "huge, taken name": (lambda: [_huge("top/manifest.json")], "is 16777217 bytes"),
    # A loop is no way out of the archive, and is not called one: it is named for what it is.
    "link to itself": (lambda: [_link("top/a", "a")], "link 'top/a' (to 'a') is in a link loop"),
    "two links in a loop": (
        lambda: [_link("top/d/a", "b"), _link("top/d/b", "a")],
        "link 'top/d/a' (to 'b') is in a link loop",
    ),
    # Names are printed: a newline or an escape in one is no name a capture has.
    "newline in a name": (lambda: [_file("top/x\nttmesh: fine")], "not a name a capture has"),
    "escape in a link": (lambda: [_link("top/l", "host\x1b[2J")], "not one a capture has"),
    "JSON member over 4 MiB": (
        lambda: [_file("top/ttmesh/ls.json", b" " * (4 << 20) + b"{}")],
        "is 4194306 bytes (a capture's JSON members are at most 4 MiB)",
    ),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_archives_are_refused(kind: str, tmp_path: Path, cli: Callable) -> None:
    bad = tmp_path / "in" / "bad.tar.gz"
    bad.parent.mkdir()
    items, said = HOSTILE[kind]
    _archive(bad, *items())
    work = tmp_path / "work"
    work.mkdir()
    res = cli("sim", "create", "--from-capture", str(bad), "--root", "DIR", cwd=work)
    assert res.code == 2, (res.out, res.err)
    assert len(res.err.splitlines()) == 1 and res.err.startswith("ttmesh: "), res.err
    assert "Traceback" not in res.err and "refusing the archive" in res.err and said in res.err
    assert os.listdir(work) == []  # not even DIR
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "work"]
    assert os.listdir(bad.parent) == ["bad.tar.gz"]
    assert not Path("/tmp/ttmesh-escaped").exists()


def test_a_file_that_is_not_a_capture_is_refused_creating_nothing(
    tmp_path: Path, cli: Callable
) -> None:
    cases = {
        "text.tar.gz": b"hello",
        "no-manifest.tar.gz": None,
    }
    for name, data in cases.items():
        path = tmp_path / name
        if data is None:
            with tarfile.open(path, "w:gz") as tar:
                info, blob = _file("top/x")
                tar.addfile(info, io.BytesIO(blob))
        else:
            path.write_bytes(data)
        res = cli("sim", "create", "--from-capture", str(path), "--root", str(tmp_path / "d"))
        assert res.code == 2 and len(res.err.splitlines()) == 1, res.err
        assert not (tmp_path / "d").exists()
    res = cli("sim", "create", "--from-capture", str(tmp_path / "missing.tgz"), "--root", "d")
    assert res.code == 2 and "missing.tgz" in res.err
    res = cli("sim", "create", "--root", str(tmp_path / "d"))
    assert res.code == 2 and "--system" in res.err and "--from-capture" in res.err


def test_archive_reader_keeps_links_inside(tmp_path: Path) -> None:
    """Links that stay inside (as sysfs's do) are kept; extraction writes nothing outside."""
    path = _archive(
        tmp_path / "ok.tar.gz",
        _file("top/host/sys/devices/p/0000:01:00.0/vendor", b"0x1e52\n"),
        _link("top/host/sys/bus/pci/devices/0000:01:00.0", "../../../devices/p/0000:01:00.0"),
    )
    ar = capture.read_archive(path)
    assert ar.text("host/sys/bus/pci/devices/0000:01:00.0/vendor") == "0x1e52\n"
    assert stat.S_ISREG(os.stat(path).st_mode)


def test_a_decompression_bomb_stops_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes are counted as they are unpacked, headers included (tarfile reads a pax header
    whole, before any member check could see it)."""
    info, data = _file("top/x")
    info.pax_headers = {"comment": "z" * 200_000}
    path = _archive(tmp_path / "bomb.tar.gz", (info, data))
    assert path.stat().st_size < 4096
    monkeypatch.setattr(capture, "MAX_TOTAL", 1000)
    monkeypatch.setattr(capture, "HEADROOM", 100_000)
    with pytest.raises(TTMeshError, match="unpacks to more than 101000 bytes"):
        capture.read_archive(path)


def test_links_leading_out_only_through_other_links(qb2: Path, tmp_path: Path) -> None:
    """Each link stays inside on its own; followed one through the other, the second leaves
    the root. It is named in the manifest instead of archived."""
    module = qb2 / "sys/module/tenstorrent"
    (module / "a").symlink_to(".")
    (module / "b").symlink_to("a/../../../..")  # lexically the root itself
    archive = take(qb2, tmp_path / "x.tar.gz")
    ar = capture.read_archive(archive)
    assert "host/sys/module/tenstorrent/a" in ar.links
    assert "host/sys/module/tenstorrent/b" not in ar.links
    assert "sys/module/tenstorrent/b" in {m["what"] for m in ar.manifest["not_captured"]}
    # Resolved as the kernel would: through "a" (.), then up; lexically it stays inside.
    links = {"host/m/a": ".", "host/m/b": "a/../.."}
    assert capture._resolve("host/m/b", links) == ""  # the archive's top, above host/
    assert capture._resolve("host/m/b/../x", links) is None


def _rewritten(archive: Path, dest: Path, members: dict[str, bytes]) -> Path:
    """``archive`` with the members (below its top directory) replaced."""
    with tarfile.open(archive) as src, tarfile.open(dest, "w:gz") as out:
        for member in src.getmembers():
            rel = member.name.split("/", 1)[1] if "/" in member.name else ""
            if rel in members:
                member.size = len(members[rel])
                out.addfile(member, io.BytesIO(members[rel]))
            else:
                out.addfile(member, src.extractfile(member) if member.isreg() else None)
    return dest


DEEP = b"[" * 100_000 + b"]" * 100_000  # Python's JSON parser recursed out of this


def test_json_nested_past_the_bound_refuses_the_archive(
    qb2: Path, tmp_path: Path, cli: Callable
) -> None:
    """A capture's JSON member nested deeply ended sim create --from-capture with an internal
    error (RecursionError, exit 1): each JSON member it reads refuses the archive in one line
    (exit 2) naming the member and the bound, before anything is written."""
    archive = take(qb2, tmp_path / "x.tar.gz")
    for member in ("manifest.json", "ttmesh/ls.json", "ttmesh/check.json",
                   "dev-tenstorrent.json", "umd-locks.json", "container.json"):  # fmt: skip
        bad = _rewritten(archive, tmp_path / "bad.tar.gz", {member: DEEP})
        with pytest.raises(TTMeshError) as refused:
            recreate(bad, tmp_path / "twin")
        assert refused.value.code == 2 and f"/{member} nests deeper than 64 levels" in str(
            refused.value
        ), (member, refused.value)
        assert not (tmp_path / "twin").exists()
    res = cli("sim", "create", "--from-capture", str(bad), "--root", str(tmp_path / "twin"))
    assert res.code == 2 and len(res.err.splitlines()) == 1, res.err
    assert "container.json nests deeper than 64 levels (refusing the archive" in res.err
    # The bound itself: 64 levels are read, 65 are not.
    from ttmesh import fileread

    assert fileread.load_json("[" * 64 + "]" * 64) is not None
    with pytest.raises(fileread.TooDeep):
        fileread.load_json('{"a": ' * 65 + "1" + "}" * 65)


def test_a_captured_host_name_is_printed_escaped(qb2: Path, tmp_path: Path, cli: Callable) -> None:
    """The manifest's host name, root and time were printed raw by sim create and sim show,
    and written into the descriptor's header comment: a newline made a second line that could
    pose as ttmesh's (and YAML in the descriptor), an escape sequence reached the terminal."""
    archive = take(qb2, tmp_path / "x.tar.gz")
    with tarfile.open(archive) as tar:
        top = tar.getmembers()[0].name.split("/")[0]
        manifest = json.load(tar.extractfile(f"{top}/manifest.json"))  # type: ignore[arg-type]
    evil = "box\nttmesh: every chip is healthy \x1b]0;pwned\x07"
    manifest["host"].update(hostname=evil, root="/r\noot")
    bad = _rewritten(archive, tmp_path / "evil.tar.gz",
                     {"manifest.json": json.dumps(manifest).encode()})  # fmt: skip
    twin = tmp_path / "twin"
    made = cli("sim", "create", "--from-capture", str(bad), "--root", str(twin))
    shown = cli("sim", "show", "--root", str(twin))
    assert made.code == 0 and shown.code == 0, made.err + shown.err
    shown_as = "box\\x0attmesh: every chip is healthy \\x1b]0;pwned\\x07"
    for out in (made.out, shown.out):
        assert not any(ln.startswith("ttmesh:") for ln in out.splitlines()), out
        assert "\x1b" not in out and "\x07" not in out and shown_as in out, out
    header = (twin / "cluster_descriptor.yaml").read_text().splitlines()
    assert header[0].startswith("# Simulated capture: captured on " + shown_as), header[0]
    assert header[1].startswith("# Written by ttmesh"), header[:2]
