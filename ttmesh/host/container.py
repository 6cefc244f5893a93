"""Is ttmesh running in a container, and what does the container let it see?

tt-inference-server runs in Docker and Kubernetes. A container sees the device nodes it was
started with (``--device``), its own ``/dev/shm`` (Docker's default: a private 64 MiB tmpfs)
and its own ``/tmp``; what tt-umd and ttmesh share with the host (chip locks in ``/dev/shm``,
reset notices in ``/tmp/tt_umd_listeners``, 1 GiB pages in ``/dev/hugepages-1G``) is then
private. Everything is read under the host's root through its one reader, so a simulated root
models a container with the same files (``ttmesh sim fault container``):

* ``/.dockerenv`` (Docker writes it into every container) and ``/run/.containerenv``
  (Podman's, containers-common ``containerenv.5``);
* ``/proc/1/cgroup`` (``cgroups(7)``: one ``id:controllers:path`` line per hierarchy; a
  container's path names ``docker``, ``kubepods``, ``containerd`` or ``libpod``);
* ``/proc/self/mountinfo`` (``proc_pid_mountinfo(5)``: ``ID PARENT MAJ:MIN ROOT MOUNTPOINT
  OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS``, spaces in paths as ``\\040``): an
  ``overlay`` root, and the ``/dev/shm``, ``/dev/hugepages-1G`` and listener mounts.
"""

from __future__ import annotations

import os
import re

from ttmesh.dataclass import dataclass
from ttmesh.host.base import Host

MOUNTINFO = "proc/self/mountinfo"
CGROUP = "proc/1/cgroup"
MARKERS = (".dockerenv", "run/.containerenv")
RUNTIMES = ("docker", "kubepods", "containerd", "libpod", "crio")
LISTENERS = "/tmp/tt_umd_listeners"  # tt-umd's reset-notice sockets
HUGEPAGES = "/dev/hugepages-1G"  # where tt-umd opens its 1 GiB pages (hugepage.cpp)
_SIZE = re.compile(r"size=([0-9]+)([kmgKMG%]?)")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo."""

    point: str
    fstype: str
    source: str
    options: str  # the superblock's options (``size=65536k`` for a tmpfs)

    def size(self) -> int | None:
        """A tmpfs's ``size=`` in bytes; None when the options name none (or a percentage)."""
        m = _SIZE.search(self.options)
        if m is None or m.group(2) == "%":
            return None
        unit = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2).lower()]
        return int(m.group(1)) * unit


@dataclass(frozen=True)
class Container:
    """What was seen: ``signs`` (why ttmesh thinks it is in a container) and the mounts."""

    signs: tuple[str, ...]
    mounts: tuple[Mount, ...]

    def mount(self, point: str) -> Mount | None:
        """The mount at ``point`` (the last one mounted there: it hides the others)."""
        return next((m for m in reversed(self.mounts) if m.point == point), None)

    def covers(self, path: str) -> Mount | None:
        """The mount ``path`` lies on other than the root: the longest mount point above it."""
        above = [
            m
            for m in self.mounts
            if m.point != "/" and (path == m.point or path.startswith(m.point.rstrip("/") + "/"))
        ]
        return max(reversed(above), key=lambda m: len(m.point), default=None)


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts(host: Host) -> list[Mount]:
    """mountinfo's lines (malformed ones skipped: the kernel writes none)."""
    text = host.read_text(MOUNTINFO) or ""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        head, tail = left.split(), right.split()
        if not sep or len(head) < 6 or len(tail) < 2:
            continue
        out.append(Mount(_unescape(head[4]), tail[0], tail[1], tail[2] if len(tail) > 2 else ""))
    return out


def detect(host: Host) -> Container | None:
    """The container ttmesh runs in, None when no sign of one is seen."""
    signs = [f"/{m} exists" for m in MARKERS if os.path.lexists(host.path(m))]
    cgroup = host.read_text(CGROUP) or ""
    named = sorted({r for r in RUNTIMES if r in cgroup})
    if named:
        signs.append(f"/proc/1/cgroup names {', '.join(named)}")
    found = mounts(host)
    root = next((m for m in reversed(found) if m.point == "/"), None)
    if root is not None and root.fstype == "overlay":
        signs.append("the root is an overlay mount")
    if not signs:
        return None
    return Container(tuple(signs), tuple(found))


def shm_size(host: Host, mount: Mount | None) -> int | None:
    """The size of ``/dev/shm``: the tmpfs's ``size=``, else (on ``/`` only: a simulated
    root's directory is not the machine's) what statvfs says."""
    size = mount.size() if mount is not None else None
    if size is None and host.root == host.root.parent:  # "/"
        try:
            st = os.statvfs("/dev/shm")
        except OSError:
            return None
        size = st.f_blocks * st.f_frsize
    return size
