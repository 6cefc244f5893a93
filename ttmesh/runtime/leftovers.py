"""Files a job's processes leave in shared memory, and the rule for removing them.

Two kinds are known. SGLang's schedulers each hold a multiprocessing semaphore
(``/dev/shm/sem.mp-*``) that nothing unlinks when a scheduler dies (the serving profiles list them
as ``leftovers``). And every process that initialises Open MPI's shared-memory transport (ttnn
bundles Open MPI 5: a single ttnn process in mock mode, or each rank under mpirun) creates
``sm_segment.<node>.<uid>.<jobid>.<local rank>`` in the transport's backing directory
(``/dev/shm``, or ``OMPI_MCA_btl_sm_backing_directory``; Open MPI 5
``opal/mca/btl/sm/btl_sm_component.c``) and, when it is not started by an Open MPI 5 mpirun
that removes its session's files, leaves it there at exit: about 240 a day of checks on one host,
16 MiB of address space each.

ttmesh gives the ranks of a job on one host a backing directory of the job's own
(``RUN_DIR/shm``, ``launcher.planning.rankenv.SEGMENT_VAR``), so their segments go with its run directory and
no segment of anyone else's is ever judged. A server's named leftovers cannot be moved: one is
removed only when it appeared while the attempt ran (it was not there when it started), it is a
plain file of this user's alone (mode 0600 or stricter, one name), and no live process of this
user maps it or holds it open. ``check`` counts the segments in the machine's backing directory
that no live process uses (:func:`stale_segments`).
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable

from ttmesh import fileread, numeric
from ttmesh.dataclass import dataclass
from ttmesh.render import plural

MAX_MAPS = 64 * 1024 * 1024  # /proc/PID/maps: ~100 bytes a mapping; a process maps < 500k
SEGMENT_PREFIX = "sm_segment."


def segment_dir() -> str:
    """Open MPI's shared-memory backing directory, as the ranks' own library chooses it (an MCA
    parameter in the environment; the default is ``/dev/shm``)."""
    return os.environ.get("OMPI_MCA_btl_sm_backing_directory") or "/dev/shm"  # noqa: SIM112


def mapped(pid: str) -> set[tuple[int, int]]:
    """The files (device, inode) process ``pid`` maps, from ``/proc/PID/maps`` read bounded;
    OSError or ValueError when it is gone or not readable."""
    maps = fileread.read_text(f"/proc/{pid}/maps", MAX_MAPS, "memory map")
    out: set[tuple[int, int]] = set()
    for line in maps.splitlines():
        fields = line.split(None, 5)  # address perms offset MAJ:MIN inode [path]
        if len(fields) < 6 or fields[4] == "0":
            continue
        major, _, minor = fields[3].partition(":")
        try:
            out.add((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
        except ValueError:
            continue
    return out


def in_use(files: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Which of ``files`` ((device, inode)) a live process of this user maps (a semaphore or
    shared memory segment in use) or holds open. Only this user's processes can open a file of
    this user's that no one else may read or write (root's: root's, and root sees every
    process)."""
    me = os.getuid()
    used: set[tuple[int, int]] = set()
    for name in os.listdir("/proc"):
        if not numeric.digits(name) or used == files:
            continue
        try:
            if me != 0 and os.stat(f"/proc/{name}").st_uid != me:
                continue
            used |= mapped(name) & files
        except (OSError, ValueError):  # gone, or not readable: nothing to learn from it
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{name}/fd/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in files:
                used.add((st.st_dev, st.st_ino))
    return used


def _private(path: str) -> tuple[int, int] | None:
    """(device, inode) of a plain file of this user's alone at ``path`` (never a link)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    # One name only: a hard link another user made in a shared directory is never this file.
    private = not st.st_mode & 0o077 and st.st_nlink == 1
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and private:
        return (st.st_dev, st.st_ino)
    return None


def remove_unused(candidates: Iterable[str]) -> list[str]:
    """Remove those of ``candidates`` that are this user's private plain files no live process
    of this user uses; the paths removed."""
    found: dict[tuple[int, int], str] = {}
    for path in sorted(set(candidates)):
        key = _private(path)
        if key is not None:
            found[key] = path
    if not found:
        return []
    used = in_use(set(found))
    removed = []
    for key, path in found.items():
        if key in used or _private(path) != key:
            continue  # in use, or replaced meanwhile: not the file looked at
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed


class Leftovers:
    """What a server's profile names (``leftovers`` globs) that appeared during one attempt, to
    be removed once its processes are gone: taken when the attempt starts (before any rank),
    cleaned after its sweep."""

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self.patterns = tuple(patterns)
        self.before = self._now()

    def _now(self) -> set[str]:
        return {p for pattern in self.patterns for p in glob.glob(pattern)}

    def clean(self) -> list[str]:
        """Remove what appeared since the start and no live process of this user uses."""
        return remove_unused(self._now() - self.before)


@dataclass(frozen=True)
class Stale:
    """Open MPI segments in the backing directory that no live process uses."""

    directory: str
    count: int
    bytes: int  # blocks in use (a segment is sparse until written)
    unjudged: int  # other users' segments this user cannot judge (not root)

    def to_json(self) -> dict[str, object]:
        return {
            "directory": self.directory,
            "stale_segments": self.count,
            "bytes": self.bytes,
            "others_unjudged": self.unjudged,
        }

    def note(self) -> str | None:
        """One line for ``check`` when there is something to say."""
        if not self.count and not self.unjudged:
            return None
        parts = []
        if self.count:
            size = f"{self.bytes / 2**20:.0f} MiB" if self.bytes >= 2**20 else f"{self.bytes} B"
            whose = "" if os.getuid() == 0 else " of yours"
            parts.append(
                f"{plural(self.count, 'stale Open MPI segment')}{whose} in {self.directory} "
                f"({SEGMENT_PREFIX}*, {size} of memory) that no live process uses: left by "
                "processes that loaded Open MPI outside an Open MPI 5 mpirun (ttmesh removes "
                "its own jobs'); remove them with rm while no MPI program runs"
            )
        if self.unjudged:
            parts.append(
                f"{plural(self.unjudged, 'Open MPI segment')} of other users in "
                f"{self.directory} (run ttmesh check as root to see which are stale)"
            )
        return "; ".join(parts)


def stale_segments() -> Stale:
    """Count the host's segments no live process maps or holds (root judges every user's; any
    other user only their own, and is told how many others there are)."""
    directory = segment_dir()
    me = os.getuid()
    keys: dict[tuple[int, int], int] = {}
    unjudged = 0
    for path in glob.glob(os.path.join(glob.escape(directory), SEGMENT_PREFIX + "*")):
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if me != 0 and st.st_uid != me:
            unjudged += 1
            continue
        keys[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    used = in_use(set(keys)) if keys else set()
    stale = {k: size for k, size in keys.items() if k not in used}
    return Stale(directory, len(stale), sum(stale.values()), unjudged)
