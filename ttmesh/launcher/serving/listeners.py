"""Who listens on a server's port: the kernel's table of TCP sockets and the processes' own.

A ``/health`` that answers 200 says only that *something* answers on the port: another user's
server, a stale one of yours, anything. ttmesh believes it is its server only when every socket
listening where the probe connects belongs to a process of the server's own tree. The kernel
lists every listening socket of the network namespace in ``/proc/net/tcp`` and ``tcp6`` (readable
by every user, with each socket's owner uid and inode); a process's sockets are the
``socket:[INODE]`` links under ``/proc/PID/fd`` (readable for a user's own processes, and by
root for everyone's). A listener ttmesh cannot attribute (no such socket in the table, or one
whose process it cannot see) is never the server's.
"""

from __future__ import annotations

import ipaddress
import os
import struct

from ttmesh import fileread, numeric, procs
from ttmesh.dataclass import dataclass

LISTEN = "0A"  # the kernel's TCP_LISTEN in /proc/net/tcp's ``st`` column
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
MAX_TABLE = 64 * fileread.MiB  # ~150 bytes a socket: about 400,000 sockets


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket, as the kernel lists it."""

    addr: str  # "127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"
    port: int
    uid: int
    inode: int

    @property
    def where(self) -> str:
        return f"[{self.addr}]:{self.port}" if ":" in self.addr else f"{self.addr}:{self.port}"


def _address(hexed: str) -> str:
    """An address of /proc/net/tcp{,6}: 32-bit words in the kernel's byte order."""
    words = [int(hexed[i : i + 8], 16) for i in range(0, len(hexed), 8)]
    packed = b"".join(struct.pack("=I", w) for w in words)
    return str(ipaddress.ip_address(packed))


def listening(port: int | None = None) -> list[Listener]:
    """Every listening TCP socket of this network namespace (on ``port`` only, if given)."""
    out = []
    for table in TABLES:
        try:
            text = fileread.read_text(table, MAX_TABLE, "the kernel's TCP table")
        except (OSError, ValueError):  # no IPv6, or a table larger than any host has
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            addr, _, hexport = fields[1].partition(":")
            try:
                number = int(hexport, 16)
                if port is not None and number != port:
                    continue  # the address is parsed for the port asked about only
                out.append(Listener(_address(addr), number, int(fields[7]), int(fields[9])))
            except ValueError:
                continue
    return out


def reaches(listener: Listener, target: str) -> bool:
    """Does a connection to ``target`` (an address) on the listener's port reach it?"""
    try:
        mine = ipaddress.ip_address(listener.addr)
        there = ipaddress.ip_address(target)
    except ValueError:
        return False
    if isinstance(mine, ipaddress.IPv6Address) and mine.ipv4_mapped is not None:
        mine = mine.ipv4_mapped
    if isinstance(there, ipaddress.IPv6Address) and there.ipv4_mapped is not None:
        there = there.ipv4_mapped
    if mine == there:
        return True
    # The wildcard of its family; "::" also takes IPv4 unless the socket is IPV6_V6ONLY (which
    # the table does not say: such a socket cannot be what answered an IPv4 probe, and is
    # counted all the same, so a foreign one never lets a probe pass).
    return mine.is_unspecified and (mine.version == there.version or mine.version == 6)


def socket_inodes(pids: list[int]) -> tuple[set[int], list[int]]:
    """(the inodes of the sockets ``pids`` hold, the pids whose descriptors ttmesh cannot read)."""
    inodes: set[int] = set()
    hidden = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue  # gone meanwhile
        except OSError:
            hidden.append(pid)
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes, hidden


def holder(inode: int) -> int | None:
    """The process holding socket ``inode``, when ttmesh can see it (every process's
    descriptors are read: only when a listener is not the server's, to name whose it is)."""
    for name in os.listdir("/proc"):
        if not numeric.digits(name):
            continue
        if inode in socket_inodes([int(name)])[0]:
            return int(name)
    return None


def describe(listener: Listener) -> str:
    """``pid P (user: cmd) listens on ADDR:PORT``, or whose socket it is when ttmesh cannot
    see its process (another user's, to a user who is not root)."""
    pid = holder(listener.inode)
    if pid is not None:
        user, cmd, _start = procs.identity(pid)
        if len(cmd) > 120:
            cmd = cmd[:119] + "…"
        return f"pid {pid} ({user}: {cmd}) listens on {listener.where}"
    user = procs.user_name(listener.uid)
    return f"a process of user {user} that ttmesh cannot see listens on {listener.where}"


@dataclass(frozen=True)
class Verdict:
    """Whose listener answers a server's port: ``ours`` or why not (one clause)."""

    ours: bool
    why: str = ""


def whose(
    targets: list[str], port: int, tree: list[int], named: dict[int, str] | None = None
) -> Verdict:
    """Is every listener a connection to ``targets`` (addresses) on ``port`` reaches one of
    ``tree``'s (the server and its descendants)? ``named``: what :func:`describe` said of each
    socket before (naming one reads every process's descriptors: once per socket)."""
    found = [lst for lst in listening(port) if any(reaches(lst, t) for t in targets)]
    if not found:
        shown = ", ".join(Listener(t, port, 0, 0).where for t in targets) or f"port {port}"
        return Verdict(
            False,
            f"no socket listening on {shown} is in the kernel's table (a process in another "
            "network namespace, or a forwarded port?)",
        )
    inodes, hidden = socket_inodes(tree)
    for lst in found:
        if lst.inode in inodes:
            continue
        if hidden:
            return Verdict(
                False,
                f"ttmesh cannot read the descriptors of the server's pid {hidden[0]}, so "
                f"cannot tell whose socket listens on {lst.where}",
            )
        said = named.get(lst.inode) if named is not None else None
        if said is None:
            said = describe(lst)
            if named is not None:
                named[lst.inode] = said
        return Verdict(False, f"{said}, not the server")
    return Verdict(True)


def tree_ports(tree: list[int]) -> list[str]:
    """Where the processes of ``tree`` listen (``127.0.0.1:30000``), for a server that never
    answered on its port."""
    inodes, _hidden = socket_inodes(tree)
    return sorted({lst.where for lst in listening() if lst.inode in inodes})
