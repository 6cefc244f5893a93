"""Field captures: everything a host showed about its chips, in one archive a developer can
replay (``ttmesh doctor --capture FILE``; ``ttmesh sim create --from-capture FILE`` rebuilds it).

A capture is a ``.tar.gz`` with one top directory, ``ttmesh-capture-<host>-<time>/``::

    manifest.json              ttmesh.capture/1: version, time, host, what was captured, what
                               could not be and why
    host/...                   the driver's files at their paths under the root:
                               sys/module/tenstorrent/*, sys/class/tenstorrent/* (links, as the
                               driver makes them), the device directories they point to (tt_*
                               attributes), the PCI device attributes of those devices,
                               sys/bus/pci/devices/<BDF> links, proc/driver/tenstorrent/*/pids;
                               the kernel's files system pre-flight reads: each device's
                               iommu_group link and its group's type, sys/kernel/mm/hugepages,
                               sys/devices/system/node/{online,nodeN/hugepages}, proc/meminfo
                               and each PCI device's hwmon node (hwmonN/name, temp*_input,
                               power*_input, in*_input, curr*_input, *_label: the kernel's
                               hwmon sysfs ABI, what ttmesh metrics reads)
    dev-tenstorrent.json       the listing of dev/tenstorrent (device nodes are not archived),
                               by-id links with their targets as data (never followed)
    umd-locks.json             tt-umd's lock files in dev/shm (TT_UMD_LOCK.*): each one's name,
                               type, size, bytes (a file of tt-umd's size only), the fields
                               ttmesh reads (lock word, flag, owner tid/pid) and its verdict
    container.json             the container signs ttmesh reads (/.dockerenv,
                               /run/.containerenv as data, a link's target never followed), what
                               it concluded and the /dev/shm mount; proc/1/cgroup and
                               proc/self/mountinfo are stored under host/
    cluster_descriptor.yaml    the topology (tt-umd's discovery; a simulated host's own file)
    tt-smi-snapshot.json       tt-smi -s (tt-smi-output.txt when it printed no JSON)
    kernel-messages.txt        recent kernel messages about the chips (this machine only)
    ttmesh/ls.json             ttmesh.ls/1
    ttmesh/check.json          ttmesh.check/1

Files are read, never archived raw (sysfs reports 4096 bytes for every attribute), through
the host's reader where values move (heartbeats, holder lists). Links are stored as links and
never followed out of the root; a link whose target leaves the root is only named in the
manifest. A part that cannot be captured (no tt-smi, kernel messages not readable) is recorded
in the manifest, never fatal.

An archive is user input when read back: :func:`read_archive` refuses absolute or ``..``
names, links leaving the archive, members reached through a link, devices, hard links and
oversized members, with one line (exit 2), before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gzip
import io
import json
import os
import posixpath
import re
import socket
import stat
import subprocess
import tarfile
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ttmesh import fileread, paths
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import TTMeshError, bad_input, from_os_error
from ttmesh.host import clusterdesc
from ttmesh.host.base import CLASS_DIR, Host
from ttmesh.render import json_text
from ttmesh.version import __version__

SCHEMA = "ttmesh.capture/1"
MANIFEST = "manifest.json"
HOST_DIR = "host"
DESCRIPTOR = "cluster_descriptor.yaml"
SMI_JSON = "tt-smi-snapshot.json"
SMI_TEXT = "tt-smi-output.txt"
DEV_LISTING = "dev-tenstorrent.json"
KERNEL = "kernel-messages.txt"
UMD_LOCKS = "umd-locks.json"
CONTAINER = "container.json"
LS = "ttmesh/ls.json"
CHECK = "ttmesh/check.json"

MODULE_DIR = "sys/module/tenstorrent"
PROC_DIR = "proc/driver/tenstorrent"
DEV_DIR = "dev/tenstorrent"
# What a PCI device directory holds that says something about the device (never config,
# resource* or rom: binary, large, or with side effects).
PCI_ATTRS = (
    "vendor",
    "device",
    "subsystem_vendor",
    "subsystem_device",
    "class",
    "revision",
    "current_link_speed",
    "current_link_width",
    "max_link_speed",
    "max_link_width",
    "numa_node",
    "enable",
    "power_state",
    "reset_method",
    "aer_dev_correctable",
    "aer_dev_nonfatal",
    "aer_dev_fatal",
)
SECTIONS = (
    "driver files",
    "system files",
    "tt-umd locks",
    "container",
    "cluster descriptor",
    "tt-smi -s",
    "kernel messages",
    "ttmesh ls",
    "ttmesh check",
)
# The hwmon files captured (Documentation/hwmon/sysfs-interface.rst), never the node's links,
# uevent or power/ directory.
HWMON_NODE = re.compile(r"hwmon[0-9]{1,6}")
HWMON_FILE = re.compile(r"name|(temp|power|in|curr)[0-9]{1,3}_(input|label)")
SKIP_MODULE = frozenset({"sections", "notes"})  # addresses and binary notes: nothing to learn
MAX_READ = 1 << 20  # bytes read from one host file (a sysfs attribute is one page)
KERNEL_LINES = 2000  # the most recent matching kernel messages kept
SMI_TIMEOUT = 120.0

# Reading an archive back (user input): limits well above what a capture of a Galaxy holds.
MAX_ARCHIVE = 64 << 20  # compressed bytes
MAX_MEMBER = 16 << 20  # one member's bytes
MAX_JSON = 4 << 20  # one JSON member's bytes (a Galaxy's largest, tt-smi -s, is 140 KiB)
MAX_TOTAL = 64 << 20  # every member's bytes
HEADROOM = 32 << 20  # tar headers on top of the members' bytes
MAX_MEMBERS = 20000
MAX_NAME = 1024
MAX_LINK_HOPS = 40


# --------------------------------------------------------------------------- capturing


@dataclass
class Capture:
    """What :func:`collect` gathered, before it is written."""

    files: dict[str, bytes] = field(default_factory=dict)  # member path -> contents
    links: dict[str, str] = field(default_factory=dict)  # member path -> link target
    missed: list[dict[str, str]] = field(default_factory=list)  # {what, why}
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)

    def miss(self, what: str, why: str) -> None:
        self.missed.append({"what": what, "why": why})


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, TTMeshError) or hasattr(exc, "hint"):  # a simulated host's SimError
        return str(exc)
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


class _Reader:
    """Reads the driver's files under a host's root into a :class:`Capture`, links as links."""

    def __init__(self, host: Host, cap: Capture) -> None:
        self.host = host
        self.cap = cap
        self.root = str(host.root)

    def abs(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def lstat(self, rel: str) -> os.stat_result | None:
        try:
            return os.lstat(self.abs(rel))
        except OSError:
            return None

    def inside(self, rel: str) -> str | None:
        """``rel`` with every link resolved, relative to the root; None when it leaves it."""
        real = os.path.realpath(self.abs(rel))
        root = os.path.realpath(self.root)
        if real == root:
            return ""
        if root == "/":
            return real.lstrip("/")
        if real.startswith(root + os.sep):
            return real[len(root) + 1 :]
        return None

    def link(self, rel: str) -> str | None:
        """Store the link ``rel`` as a link; where it leads (relative to the root), or None
        when that is outside the root (then it is only named in the manifest)."""
        try:
            target = os.readlink(self.abs(rel))
        except OSError as exc:
            self.cap.miss(rel, f"cannot read the link: {_why(exc)}")
            return None
        root = os.path.realpath(self.root)
        if target.startswith("/") and (root == "/" or target.startswith(root + "/")):
            # An absolute link into the root: the same place, written relative to the link.
            inner = target if root == "/" else target[len(root) :]
            target = posixpath.relpath(inner.lstrip("/") or ".", posixpath.dirname(rel) or ".")
        lexical = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if target.startswith("/") or lexical == ".." or lexical.startswith("../"):
            self.cap.miss(rel, f"a link to {target}, outside the root: named here, not archived")
            return None
        inside = self.inside(rel)
        if inside is None:
            self.cap.miss(rel, f"a link to {target}, leading outside the root: named here only")
            return None
        self.cap.links[f"{HOST_DIR}/{rel}"] = target
        return inside

    def read_file(self, rel: str, via: Callable[[], str | None] | None = None) -> None:
        """Store the regular file ``rel`` (its contents, never followed through a link).

        ``via`` reads the value through the host's reader instead (values that move)."""
        try:
            if via is not None:
                text = via()
                if text is None:
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
                data = text.encode()
            else:
                fd = os.open(self.abs(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        self.cap.miss(rel, "not a regular file")
                        return
                    chunks, size = [], 0
                    while size <= MAX_READ:
                        chunk = os.read(fd, 65536)
                        if not chunk:
                            break
                        chunks.append(chunk)
                        size += len(chunk)
                    data = b"".join(chunks)
                finally:
                    os.close(fd)
                if len(data) > MAX_READ:
                    data = data[:MAX_READ]
                    self.cap.miss(rel, f"longer than {MAX_READ} bytes: truncated")
        except OSError as exc:
            self.cap.miss(rel, f"cannot read it: {_why(exc)}")
            return
        self.cap.files[f"{HOST_DIR}/{rel}"] = data

    def entries(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.abs(rel)))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                self.cap.miss(rel, f"cannot list it: {_why(exc)}")
            return []

    def directory(
        self,
        rel: str,
        depth: int = 0,
        skip: frozenset[str] = frozenset(),
        via: Callable[[str], Callable[[], str | None] | None] | None = None,
    ) -> int:
        """Store the readable files and links of the real directory ``rel`` (and its
        subdirectories down to ``depth``); the number of entries stored."""
        stored = 0
        for name in self.entries(rel):
            if name in skip:
                continue
            child = f"{rel}/{name}"
            st = self.lstat(child)
            if st is None:
                continue
            if stat.S_ISLNK(st.st_mode):
                self.link(child)
                stored += 1
            elif stat.S_ISDIR(st.st_mode):
                if depth > 0:
                    stored += self.directory(child, depth - 1, skip)
            elif stat.S_ISREG(st.st_mode):
                if not st.st_mode & 0o444:
                    continue  # write-only attributes (uevent triggers) have nothing to read
                self.read_file(child, via(name) if via else None)
                stored += 1
        return stored


def _driver_files(host: Host, cap: Capture) -> dict[str, Any]:
    rd = _Reader(host, cap)
    summary: dict[str, Any] = {"devices": [], "pci_devices": [], "hwmon": 0}
    st = rd.lstat(MODULE_DIR)
    if st is None:
        cap.miss(MODULE_DIR, "missing: the tenstorrent driver is not loaded")
    elif stat.S_ISLNK(st.st_mode):
        rd.link(MODULE_DIR)
    else:
        rd.directory(MODULE_DIR, depth=1, skip=SKIP_MODULE)
    if rd.lstat(CLASS_DIR) is None:
        cap.miss(CLASS_DIR, "missing: the driver shows no devices")
    for name in rd.entries(CLASS_DIR):
        rel = f"{CLASS_DIR}/{name}"
        entry = rd.lstat(rel)
        if entry is None:
            continue
        node = rd.link(rel) if stat.S_ISLNK(entry.st_mode) else rel
        if node is None:
            continue
        if not os.path.isdir(rd.abs(node)):
            cap.miss(rel, "does not lead to a device directory")
            continue

        def via(attr: str, rel: str = rel) -> Callable[[], str | None] | None:
            # Heartbeats move: read them as the host's reader sees them now.
            if attr != "tt_heartbeat":
                return None
            return functools.partial(host.read_text, f"{rel}/{attr}")

        rd.directory(node, via=via)
        summary["devices"].append(name)
        device = f"{node}/device"
        dst = rd.lstat(device)
        if dst is None:
            continue
        pci = rd.inside(device)
        if pci is None:
            cap.miss(device, "its PCI device lies outside the root: not followed")
            continue
        bdf = posixpath.basename(pci)
        for attr in PCI_ATTRS:
            if rd.lstat(f"{pci}/{attr}") is not None:
                rd.read_file(f"{pci}/{attr}")
        summary["hwmon"] += _hwmon(rd, pci)
        group = f"{pci}/iommu_group"
        gst = rd.lstat(group)
        if gst is not None and stat.S_ISLNK(gst.st_mode):
            inside = rd.link(group)
            if inside is not None and rd.lstat(f"{inside}/type") is not None:
                rd.read_file(f"{inside}/type")
        bus_link = f"sys/bus/pci/devices/{bdf}"
        bst = rd.lstat(bus_link)
        if bst is not None and stat.S_ISLNK(bst.st_mode):
            rd.link(bus_link)
        summary["pci_devices"].append(bdf)
    if rd.lstat(PROC_DIR) is None:
        cap.miss(PROC_DIR, "missing: the driver does not list holders (drivers before 2.5)")
    for name in rd.entries(PROC_DIR):
        rel = f"{PROC_DIR}/{name}"
        entry = rd.lstat(rel)
        if entry is None or not stat.S_ISDIR(entry.st_mode):
            continue
        if rd.lstat(f"{rel}/pids") is not None:
            rd.read_file(f"{rel}/pids", functools.partial(host.read_text, f"{rel}/pids"))
    cap.files[DEV_LISTING] = _json(_dev_listing(rd))
    summary["ok"] = rd.lstat(MODULE_DIR) is not None
    summary["files"] = sum(1 for k in cap.files if k.startswith(f"{HOST_DIR}/"))
    summary["links"] = len(cap.links)
    return summary


def _hwmon(rd: _Reader, pci: str) -> int:
    """The hwmon nodes tt-kmd registers on the PCI device ``pci`` (tt-kmd 1.29 and later):
    their sensor files, read as files (a node that is no directory is named, not followed);
    the number of nodes stored."""
    stored = 0
    for name in rd.entries(f"{pci}/hwmon"):
        base = f"{pci}/hwmon/{name}"
        st = rd.lstat(base)
        if st is None or not HWMON_NODE.fullmatch(name):
            continue
        if not stat.S_ISDIR(st.st_mode):
            rd.cap.miss(base, "not a directory (the kernel makes one): not followed")
            continue
        for attr in rd.entries(base):
            if HWMON_FILE.fullmatch(attr):
                rd.read_file(f"{base}/{attr}")
        stored += 1
    return stored


def _umd_locks(host: Host, cap: Capture) -> dict[str, Any]:
    """tt-umd's lock files as :mod:`ttmesh.fabric.umdlocks` judges them, recorded as data: the
    file's type, size and (a file of one of tt-umd's sizes only) its bytes, the fields ttmesh
    reads from them and the verdict. /dev/shm itself is never copied."""
    from ttmesh.fabric import umdlocks

    entries = []
    for lock in umdlocks.read(host):
        item: dict[str, Any] = {"file": umdlocks.PREFIX + lock.name, **lock.to_json()}
        for key in ("path", "asic_ids"):  # the host's absolute path; chips: check's to say
            item.pop(key)
        try:
            st = os.lstat(lock.path)
        except OSError as exc:
            item["type"] = None
            item["why"] = item["why"] or _why(exc)
            entries.append(item)
            continue
        if stat.S_ISLNK(st.st_mode):
            item["type"] = "link"
            with contextlib.suppress(OSError):
                item["target"] = os.readlink(lock.path)[:MAX_NAME]
        elif stat.S_ISREG(st.st_mode):
            item |= {"type": "file", "size": st.st_size, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
            data = umdlocks.raw(lock.path)
            if data is not None:
                item |= {"bytes": data.hex(), **umdlocks.fields(data)}
        elif stat.S_ISDIR(st.st_mode):
            item["type"] = "dir"
        else:
            item["type"] = "other"
        entries.append(item)
    cap.files[UMD_LOCKS] = _json({"path": "dev/shm", "prefix": umdlocks.PREFIX, "locks": entries})
    states: dict[str, int] = {}
    for item in entries:
        states[item["state"]] = states.get(item["state"], 0) + 1
    return {"ok": True, "locks": len(entries), "states": states}


def _container(host: Host, cap: Capture) -> dict[str, Any]:
    """The signs :mod:`ttmesh.host.container` reads, as data: the marker files (what they are;
    a link's target, never followed), proc/1/cgroup and proc/self/mountinfo (through the host's
    reader, as the check reads them) and what was concluded from them."""
    from ttmesh.host import container

    rd = _Reader(host, cap)
    markers: dict[str, dict[str, Any]] = {}
    for rel in container.MARKERS:
        st = rd.lstat(rel)
        if st is None:
            continue
        item: dict[str, Any] = {"mode": f"{stat.S_IMODE(st.st_mode):04o}"}
        if stat.S_ISLNK(st.st_mode):
            item["kind"] = "link"
            with contextlib.suppress(OSError):
                item["target"] = os.readlink(rd.abs(rel))[:MAX_NAME]
        else:
            item["kind"] = "file" if stat.S_ISREG(st.st_mode) else "other"
        markers[rel] = item
    for rel in (container.CGROUP, container.MOUNTINFO):
        if rd.lstat(rel) is None:  # a simulated host outside a container has neither
            continue
        try:
            rd.read_file(rel, functools.partial(host.read_text, rel))
        except TTMeshError as exc:  # not a file the kernel writes: named, never fatal
            cap.miss(rel, str(exc))
    box = container.detect(host)
    shm = (
        box.mount("/dev/shm")
        if box
        else next((m for m in reversed(container.mounts(host)) if m.point == "/dev/shm"), None)
    )
    doc = {
        "container": box is not None,
        "signs": list(box.signs) if box else [],
        "markers": markers,
        "dev_shm": None if shm is None else {
            "fstype": shm.fstype, "source": shm.source, "size": container.shm_size(host, shm)
        },
    }  # fmt: skip
    cap.files[CONTAINER] = _json(doc)
    return {"ok": True, "container": doc["container"], "signs": doc["signs"]}


HUGEPAGES_DIR = "sys/kernel/mm/hugepages"
NODES_DIR = "sys/devices/system/node"


def _system_files(host: Host, cap: Capture) -> dict[str, Any]:
    """The kernel's files system pre-flight reads (``fabric.syscheck``): hugepages of every
    size, in all and per NUMA node, the nodes online, /proc/meminfo. Read as files (no link
    followed); each device's IOMMU group is stored with its driver files."""
    rd = _Reader(host, cap)
    stored = 0
    for size in rd.entries(HUGEPAGES_DIR):
        if re.fullmatch(r"hugepages-[0-9]{1,12}kB", size):
            stored += rd.directory(f"{HUGEPAGES_DIR}/{size}")
    for node in rd.entries(NODES_DIR):
        if re.fullmatch(r"node[0-9]{1,4}", node):
            base = f"{NODES_DIR}/{node}/hugepages"
            for size in rd.entries(base):
                if re.fullmatch(r"hugepages-[0-9]{1,12}kB", size):
                    stored += rd.directory(f"{base}/{size}")
    for rel in (f"{NODES_DIR}/online", "proc/meminfo"):
        if rd.lstat(rel) is not None:
            rd.read_file(rel)
            stored += 1
    if not stored:
        cap.miss("system files", f"the host has no {HUGEPAGES_DIR}, {NODES_DIR} or proc/meminfo")
    return {"ok": bool(stored), "files": stored}


def _dev_listing(rd: _Reader) -> dict[str, Any]:
    """dev/tenstorrent as ``ls -l`` would show it (device nodes cannot be archived)."""
    entries: list[dict[str, Any]] = []

    def walk(rel: str, depth: int) -> None:
        for name in rd.entries(rel):
            child = f"{rel}/{name}"
            st = rd.lstat(child)
            if st is None:
                continue
            item: dict[str, Any] = {"path": child, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}
            if stat.S_ISCHR(st.st_mode):
                item |= {"kind": "char", "rdev": f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"}
            elif stat.S_ISLNK(st.st_mode):
                try:
                    item |= {"kind": "link", "target": os.readlink(rd.abs(child))}
                except OSError as exc:
                    item |= {"kind": "link", "target": None, "why": _why(exc)}
            elif stat.S_ISDIR(st.st_mode):
                item["kind"] = "dir"
            elif stat.S_ISREG(st.st_mode):
                item["kind"] = "file"
            else:
                item["kind"] = "other"
            entries.append(item)
            if item["kind"] == "dir" and depth > 0:
                walk(child, depth - 1)

    exists = rd.lstat(DEV_DIR) is not None
    if exists:
        walk(DEV_DIR, 2)
    return {"path": DEV_DIR, "exists": exists, "entries": entries}


def _descriptor(host: Host, cap: Capture) -> dict[str, Any]:
    if host.simulated:  # its topology is this file: keep it as written, even if it is broken
        rd = _Reader(host, cap)
        if rd.lstat(DESCRIPTOR) is None:
            cap.miss("cluster descriptor", f"the simulated host has no {DESCRIPTOR}")
            return {"ok": False}
        rd.read_file(DESCRIPTOR)
        data = cap.files.pop(f"{HOST_DIR}/{DESCRIPTOR}", None)
        if data is None:
            return {"ok": False}
        cap.files[DESCRIPTOR] = data
        return {"ok": True, "source": f"the simulated host's {DESCRIPTOR}"}
    cd, source, notes = host.topology()
    if cd is None:
        cap.miss("cluster descriptor", "; ".join(notes) or "no topology source")
        return {"ok": False, "source": source}
    header = [f"Written by ttmesh {__version__} from the host's topology ({source})."]
    cap.files[DESCRIPTOR] = clusterdesc.dump(cd, header).encode()
    return {"ok": True, "source": source, "chips": len(cd.chips)}


def _tt_smi(host: Host, cap: Capture, explicit: str | None) -> dict[str, Any]:
    from ttmesh.recovery.reset import find_tt_smi, run_tt_smi

    try:
        path = find_tt_smi(host, explicit)
    except TTMeshError as exc:
        cap.miss("tt-smi -s", str(exc))
        return {"ok": False, "why": str(exc)}
    run = run_tt_smi([path, "-s"], SMI_TIMEOUT, env_changes=host.tt_smi_env())
    info: dict[str, Any] = {"argv": run.argv, "code": run.code, "seconds": round(run.seconds, 3)}
    doc = _json_in(run.output)
    if run.code == 0 and doc is not None:
        cap.files[SMI_JSON] = _json(doc)
        return {"ok": True, **info}
    if run.output:
        cap.files[SMI_TEXT] = run.output.encode()
    if run.timed_out:
        why = f"timed out after {SMI_TIMEOUT:g} s"
    elif run.code is None:
        why = run.output.strip() or "could not start"
    else:
        first = next((ln.strip() for ln in run.output.splitlines() if ln.strip()), "")
        why = f"exit {run.code}" + (f": {_plain(first)}" if first else ", no output")
        if run.code == 0:
            why = "printed no JSON snapshot"
    cap.miss("tt-smi -s", why + (f" (its output: {SMI_TEXT})" if run.output else ""))
    return {"ok": False, "why": why, **info}


def _plain(text: str) -> str:
    """tt-smi wraps its messages in colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip()


def _json_in(text: str) -> Any | None:
    """The JSON document in tt-smi's output (UMD may print log lines before it)."""
    start = text.find("{")
    while start != -1:
        try:
            doc, _ = json.JSONDecoder().raw_decode(text[start:])
            return doc
        except (ValueError, RecursionError):  # a tt-smi's output nested past the parser
            start = text.find("{", start + 1)
    return None


def _kernel_messages(host: Host, cap: Capture, bdfs: list[str]) -> dict[str, Any]:
    if host.simulated or host.root != Path("/"):
        why = (
            "a simulated host has no kernel of its own"
            if host.simulated
            else f"the kernel's messages are this machine's, not {host.root}'s"
        )
        cap.miss("kernel messages", why)
        return {"ok": False, "why": why}
    words = ["tenstorrent", *bdfs]

    def wanted(line: str) -> bool:
        low = line.lower()
        return any(w in low for w in words)

    reasons = []
    lines: list[str] | None = None
    source = "dmesg"
    try:
        proc = subprocess.run(
            ["dmesg", "--ctime"],
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=20,
        )
        if proc.returncode == 0:
            lines = proc.stdout.splitlines()
        else:
            err = proc.stderr.strip().splitlines()
            reasons.append(f"dmesg: {err[-1] if err else f'exit {proc.returncode}'}")
    except FileNotFoundError:
        reasons.append("dmesg: not installed")
    except (OSError, subprocess.TimeoutExpired) as exc:
        reasons.append(f"dmesg: {_why(exc)}")
    if lines is None:
        source = "/dev/kmsg"
        try:
            lines = _read_kmsg()
        except OSError as exc:
            reasons.append(f"/dev/kmsg: {_why(exc)}")
    if lines is None:
        why = "; ".join(reasons)
        cap.miss("kernel messages", why)
        return {"ok": False, "why": why}
    kept = [ln for ln in lines if wanted(ln)][-KERNEL_LINES:]
    cap.files[KERNEL] = ("\n".join(kept) + "\n" if kept else "").encode()
    return {"ok": True, "source": source, "lines": len(kept), "matched": words}


def _read_kmsg() -> list[str]:
    """Every record in the kernel's ring buffer (as dmesg reads it), without blocking."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    out: list[str] = []
    try:
        while len(out) < 100000:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten while reading: skip on
                    continue
                raise
            if not record:
                break
            head, _, text = record.decode(errors="replace").partition(";")
            fields = head.split(",")
            stamp = f"[{int(fields[2]) / 1e6:12.6f}] " if len(fields) > 2 else ""
            out.append(stamp + text.split("\n", 1)[0])
    finally:
        os.close(fd)
    return out


def _views(host: Host, cap: Capture) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """ttmesh's own view: ls and check, from one discovery."""
    from ttmesh.fabric import health, listing
    from ttmesh.fabric.devices import discover

    try:
        inv = discover(host)
    except TTMeshError as exc:  # no driver: still a document, and the reason
        cap.files[LS] = _json(listing.without_driver(host, str(exc)))
        cap.miss("ttmesh check", str(exc))
        return {"ok": True}, {"ok": False, "why": str(exc)}, []
    cap.files[LS] = _json(listing.build(inv))
    report = health.check(inv)
    cap.files[CHECK] = _json(report.to_json())
    bdfs = [c.bdf for c in inv.chips if c.bdf]
    from ttmesh.fabric import syscheck

    system = [p.to_json() for p in report.problems if p.kind in syscheck.KINDS]
    checked = {"ok": True, "healthy": report.healthy, "system": system}
    return {"ok": True, "chips": len(inv.chips)}, checked, bdfs


def _section(cap: Capture, name: str, fn: Callable[[], dict[str, Any]]) -> None:
    """One part of the capture; its failure is recorded, never fatal (the rest still helps)."""
    try:
        cap.sections[name] = fn()
    except Exception as exc:
        if os.environ.get("TTMESH_DEBUG"):
            raise
        cap.miss(name, _why(exc))
        cap.sections[name] = {"ok": False, "why": _why(exc)}


def collect(host: Host, tt_smi: str | None = None) -> Capture:
    """Read everything a capture holds from ``host`` (changes nothing on it)."""
    cap = Capture()
    started = time.time()
    bdfs: list[str] = []
    _section(cap, "driver files", lambda: _driver_files(host, cap))
    _section(cap, "system files", lambda: _system_files(host, cap))
    _section(cap, "tt-umd locks", lambda: _umd_locks(host, cap))
    _section(cap, "container", lambda: _container(host, cap))

    def views() -> dict[str, Any]:
        ls, check, found = _views(host, cap)
        bdfs.extend(found)
        cap.sections["ttmesh check"] = check
        return ls

    _section(cap, "ttmesh ls", views)
    _section(cap, "cluster descriptor", lambda: _descriptor(host, cap))
    _section(cap, "tt-smi -s", lambda: _tt_smi(host, cap, tt_smi))
    _section(cap, "kernel messages", lambda: _kernel_messages(host, cap, bdfs))
    _drop_escaping_links(cap)
    order = list(SECTIONS) + [k for k in cap.sections if k not in SECTIONS]
    cap.sections = {k: cap.sections[k] for k in order if k in cap.sections}
    cap.manifest = {
        "schema": SCHEMA,
        "ttmesh": __version__,
        "time": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "unix_time": round(started, 3),
        "seconds": round(time.time() - started, 3),
        "host": {
            "root": str(host.root),
            "flag": host.flag,
            "simulated": host.simulated,
            "hostname": socket.gethostname(),
            "kernel": os.uname().release,
        },
        "driver": host.driver_version(),
        "sections": cap.sections,
        "captured": sorted([*cap.files, *cap.links]),
        "not_captured": cap.missed,
    }
    return cap


def _drop_escaping_links(cap: Capture) -> None:
    """Links that, followed through the other archived links, would leave the archive (each
    stays inside on its own, not in a chain) are named in the manifest instead: an archive
    ttmesh writes is always one :func:`read_archive` accepts."""
    while True:
        bad = [
            rel
            for rel, target in cap.links.items()
            if not _in_host(_resolve(posixpath.join(posixpath.dirname(rel), target), cap.links))
        ]
        if not bad:
            return
        for rel in bad:
            target = cap.links.pop(rel)
            cap.miss(rel.removeprefix(f"{HOST_DIR}/"), f"a link to {target} that leads out")


def _in_host(rel: str | None) -> bool:
    return rel is not None and (rel == HOST_DIR or rel.startswith(f"{HOST_DIR}/"))


def _json(data: Any) -> bytes:
    return (json_text(data, indent=1) + "\n").encode()  # valid UTF-8 whatever the host said


def top_name(cap: Capture) -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "_", str(cap.manifest["host"]["hostname"]))[:40] or "host"
    stamp = datetime.fromtimestamp(cap.manifest["unix_time"], UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"ttmesh-capture-{host}-{stamp}"


def write_archive(cap: Capture, dest: Path, force: bool = False, flag: str = "--capture") -> Path:
    """Write ``cap`` to ``dest`` (a temporary file renamed into place: never a half archive).

    Without ``force`` an existing ``dest`` is refused, even one that appears meanwhile.
    ``flag``: the option that named ``dest`` (``--bundle`` writes a capture too)."""
    top = top_name(cap)
    now = time.time()
    members: list[tuple[str, bytes | None, str | None]] = [
        (MANIFEST, _json(cap.manifest), None),
        *((name, data, None) for name, data in sorted(cap.files.items())),
        *((name, None, target) for name, target in sorted(cap.links.items())),
    ]
    dirs = {""}
    for name, _, _ in members:
        parent = posixpath.dirname(name)
        while parent not in dirs:
            dirs.add(parent)
            parent = posixpath.dirname(parent)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
    made = False
    try:
        # Made here, never opened through a link another user planted at its name in a shared
        # directory (O_EXCL, O_NOFOLLOW). A bundle holds the tails of the user's own logs
        # (0600): it is the user's alone to share (0600); a capture as the umask says.
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600 if flag == "--bundle" else 0o666,
        )
        made = True
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar,
        ):
            for d in sorted(dirs):
                info = tarfile.TarInfo(f"{top}/{d}".rstrip("/"))
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, int(now)
                tar.addfile(info)
            for name, data, target in members:
                info = tarfile.TarInfo(f"{top}/{name}")
                info.mtime = int(now)
                if target is not None:
                    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
                    tar.addfile(info)
                else:
                    assert data is not None
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
        if force:
            kind = paths.not_replaceable(dest)
            if kind is not None:
                raise bad_input(f"{flag} {dest} is {kind}, not a file", "give a new file name")
            os.replace(tmp, dest)
        else:
            try:
                os.link(tmp, dest)  # fails if dest appeared meanwhile: never overwritten
            except FileExistsError:
                raise bad_input(f"{flag} {dest} already exists", "add --force to overwrite it")
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                if dest.exists():
                    raise bad_input(f"{flag} {dest} already exists", "add --force to overwrite it")
                os.replace(tmp, dest)
    except OSError as exc:
        raise from_os_error(
            exc, "write the bundle" if flag == "--bundle" else "write the capture", str(dest)
        )
    finally:
        if made:  # never another's file at that name
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return dest


# --------------------------------------------------------------------------- reading back


@dataclass
class Archive:
    """A capture read into memory, every member checked (see :func:`read_archive`)."""

    path: Path
    top: str
    files: dict[str, bytes]  # member path (below the top directory) -> contents
    links: dict[str, str]  # member path -> link target
    manifest: dict[str, Any]

    def text(self, rel: str) -> str | None:
        data = self.files.get(self.resolve(rel) or rel)
        return None if data is None else data.decode(errors="replace")

    def json(self, rel: str) -> Any | None:
        """Member ``rel`` parsed; None when missing or not JSON. One nested deeper than a
        capture's JSON is refuses the archive (bad input: the parser would recurse out)."""
        text = self.text(rel)
        if text is None:
            return None
        try:
            return fileread.load_json(text)
        except fileread.TooDeep as exc:
            raise _refuse(self.path, f"member {self.top}/{rel} {exc}") from None
        except ValueError:
            return None

    def resolve(self, rel: str) -> str | None:
        """``rel`` with the archive's own links followed; None if it leaves the archive."""
        return _resolve(rel, self.links)

    def listdir(self, rel: str) -> list[str]:
        """Names directly below ``rel`` (a directory of the archive, links followed)."""
        real = self.resolve(rel)
        if real is None:
            return []
        prefix = f"{real}/" if real else ""
        names = set()
        for name in (*self.files, *self.links):
            if name.startswith(prefix):
                names.add(name[len(prefix) :].split("/", 1)[0])
        return sorted(names)


LOOP = "loop"  # why a path does not resolve: its links lead back to themselves
OUT = "out"  # ... or out of the archive


def _resolve(rel: str, links: dict[str, str]) -> str | None:
    """Resolve ``rel`` component by component as a kernel would, following the archive's
    links; None when it climbs above the archive's top or loops."""
    return _walk(rel, links)[0]


def _walk(rel: str, links: dict[str, str]) -> tuple[str | None, str]:
    """(``rel`` resolved, "") or (None, :data:`LOOP` or :data:`OUT`): why not, for the line
    that refuses it (a loop is no escape, and is not called one)."""
    parts: list[str] = []
    todo = [p for p in rel.split("/") if p not in ("", ".")]
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if not parts:
                return None, OUT
            parts.pop()
            continue
        parts.append(part)
        here = "/".join(parts)
        target = links.get(here)
        if target is None:
            continue
        hops += 1
        if target.startswith("/"):
            return None, OUT
        if hops > MAX_LINK_HOPS:
            return None, LOOP
        parts.pop()
        todo = [p for p in target.split("/") if p not in ("", ".")] + todo
    return "/".join(parts), ""


def _bad_link(path: Path, name: str, target: str, why: str) -> TTMeshError:
    if why == LOOP:
        return _refuse(
            path,
            f"link {name!r} (to {target!r}) is in a link loop: following it never ends "
            f"(more than {MAX_LINK_HOPS} links)",
        )
    return _refuse(path, f"link {name!r} points to {target!r}, outside the archive")


def _refuse(path: Path, what: str) -> TTMeshError:
    return bad_input(
        f"{path}: {what}"[:400],
        "refusing the archive: give one written by ttmesh doctor --capture",
    )


class _TooBig(Exception):
    pass


class _Capped:
    """A stream that refuses to yield more than ``limit`` bytes (a decompression bomb stops
    here, headers included, before tarfile can buffer it)."""

    def __init__(self, stream: Any, limit: int) -> None:
        self.stream = stream
        self.left = limit

    def read(self, size: int = -1) -> bytes:
        want = self.left + 1 if size is None or size < 0 else min(size, self.left + 1)
        data = self.stream.read(want)
        self.left -= len(data)
        if self.left < 0:
            raise _TooBig
        return bytes(data)


def read_archive(path: Path) -> Archive:
    """Read a capture, treating it as hostile: every member is checked before anything is
    used, and the first that breaks a rule refuses the whole archive (bad input, exit 2)."""
    try:
        fd = fileread.open_regular(path, MAX_ARCHIVE, "capture")
    except fileread.Refused as exc:
        raise bad_input(f"--from-capture {path} {exc.why}", "give a .tar.gz from ttmesh doctor")
    except OSError as exc:
        raise from_os_error(exc, "read the capture")
    limit = MAX_TOTAL + HEADROOM
    try:
        with os.fdopen(fd, "rb") as raw, gzip.GzipFile(fileobj=raw) as unzipped:
            stream = _Capped(unzipped, limit)
            with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
                top, files, links = _read_members(path, tar)
    except _TooBig:
        raise _refuse(path, f"it unpacks to more than {limit} bytes")
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise _refuse(path, f"not a readable .tar.gz ({str(exc) or type(exc).__name__})")
    except OSError as exc:
        raise from_os_error(exc, "read the capture")
    # A link checked early may lead through a link added after it: check them all again.
    for rel, target in links.items():
        found, why = _walk(posixpath.join(posixpath.dirname(rel), target), links)
        if found is None:
            raise _bad_link(path, f"{top}/{rel}", target, why)
    data = files.get(MANIFEST)
    try:
        manifest = fileread.load_json(data) if data is not None else None
    except fileread.TooDeep as exc:
        raise _refuse(path, f"member {top}/{MANIFEST} {exc}") from None
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise _refuse(path, f"no {SCHEMA} manifest ({top}/{MANIFEST} missing or not one)")
    return Archive(path, top, files, links, manifest)


def _kind(member: tarfile.TarInfo) -> str:
    """What a member that is no file, directory or symbolic link is."""
    if member.islnk():
        return f"a hard link (to {member.linkname[:80]!r})"
    if member.ischr():
        return "a character device"
    if member.isblk():
        return "a block device"
    if member.isfifo():
        return "a FIFO (named pipe)"
    return f"a special member (tar type {member.type!r})"


def _read_members(path: Path, tar: tarfile.TarFile) -> tuple[str, dict[str, bytes], dict[str, str]]:
    files: dict[str, bytes] = {}
    links: dict[str, str] = {}
    parents: set[str] = set()
    top: str | None = None
    total = count = 0
    while (member := tar.next()) is not None:
        count += 1
        if count > MAX_MEMBERS:
            raise _refuse(path, f"more than {MAX_MEMBERS} members")
        name = member.name
        if len(name) > MAX_NAME or "\\" in name or not name.isprintable():
            # Names are printed (the top directory in every line): no control character
            # (a newline posing as a line of ttmesh's, an escape sequence) and no NUL.
            raise _refuse(path, f"member {name[:80]!r}: not a name a capture has")
        if name.startswith("/"):
            raise _refuse(path, f"member {name!r} has an absolute path")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise _refuse(path, f"member {name!r} climbs out with '..'")
        if not parts:
            continue
        top = top or parts[0]
        if parts[0] != top:
            raise _refuse(path, f"member {name!r} is outside the top directory {top}/")
        rel = "/".join(parts[1:])
        for i in range(2, len(parts)):
            if "/".join(parts[1:i]) in links:
                raise _refuse(path, f"member {name!r} lies behind a symbolic link")
        # What the member is comes before whether its name was seen: a hard link, a device or
        # a huge file appended under a name the archive has is refused for what it is.
        if not (member.isdir() or member.issym() or member.isreg()):
            raise _refuse(path, f"member {name!r} is {_kind(member)}, which no capture holds")
        if member.isreg() and member.size > MAX_MEMBER:
            raise _refuse(
                path,
                f"member {name!r} is {member.size} bytes (a capture's members are at most "
                f"{fileread.size_text(MAX_MEMBER)})",
            )
        if member.isreg() and name.endswith(".json") and member.size > MAX_JSON:
            raise _refuse(
                path,
                f"member {name!r} is {member.size} bytes (a capture's JSON members are at "
                f"most {fileread.size_text(MAX_JSON)})",
            )
        if member.isdir():
            if rel in files or rel in links:
                raise _refuse(path, f"member {name!r} appears twice")
            continue
        if rel in files or rel in links or not rel:
            raise _refuse(path, f"member {name!r} appears twice")
        above = ["/".join(parts[1:i]) for i in range(2, len(parts))]
        if member.issym() and rel in parents:
            raise _refuse(path, f"link {name!r} hides members read before it")
        if rel in parents or any(a in files for a in above):
            raise _refuse(path, f"member {name!r} is both a file and a directory")
        parents.update(above)
        if member.issym():
            target = member.linkname
            if "\x00" in target or len(target) > MAX_NAME or not target.isprintable():
                raise _refuse(path, f"link {name!r}: its target is not one a capture has")
            found, why = _walk(posixpath.join(posixpath.dirname(rel), target), links)
            if target.startswith("/") or found is None:
                raise _bad_link(path, name, target, why)
            links[rel] = target
            continue
        total += member.size
        if total > MAX_TOTAL:
            raise _refuse(path, f"its members add up to more than {MAX_TOTAL} bytes")
        stream = tar.extractfile(member)
        data = stream.read(MAX_MEMBER + 1) if stream is not None else b""
        if len(data) != member.size:
            raise _refuse(path, f"member {name!r} is truncated")
        files[rel] = data
    if top is None:
        raise _refuse(path, "an empty archive")
    return top, files, links
