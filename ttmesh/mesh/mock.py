"""Cluster descriptors for tt-metal's mock mode (``TT_METAL_MOCK_CLUSTER_DESC_PATH``).

On a simulated host, a job's tt-metal processes map their meshes onto these files instead of
hardware. A single process gets the whole host; in a mesh over several processes each rank gets
a file holding only its own chips, renumbered from 0 (unique ids, arch, harvesting, board and
PCI address kept), the links between its own chips, and every link to another rank's chip as a
link to a remote device named by unique id. Each file has a distinct name: tt-metal takes the
basename as the host's name. Links the simulator has down are left out, as discovery on a real
host would not find them.
"""

from __future__ import annotations

from dataclasses import replace

from ttmesh.host import clusterdesc as cdm
from ttmesh.host.base import Host


def _live(host: Host) -> cdm.ClusterDescriptor:
    cd = host.mock_cluster()
    if cd is None:
        raise ValueError(f"{host.root} has no mock cluster (not a simulated host?)")
    return cd


def whole_host(host: Host, header: str = "") -> str:
    """The host's descriptor as discovery would find it now (links down left out)."""
    return whole_view(_live(host), header, f" of {host.root}")


def for_chips(host: Host, asics: list[str], header: str = "") -> str:
    """One rank's view: its chips renumbered from 0, other ranks' chips as remote devices."""
    return chips_view(_live(host), asics, header)


def whole_view(cd: cdm.ClusterDescriptor, header: str = "", of: str = "") -> str:
    lines = [header] if header else []
    return cdm.dump(cd, [*lines, f"ttmesh: mock cluster{of}, links down left out"])


def chips_view(cd: cdm.ClusterDescriptor, asics: list[str], header: str = "") -> str:
    """``asics`` of ``cd`` renumbered from 0, links to the other chips as remote devices."""
    return ChipViews(cd).of(asics, header)


class ChipViews:
    """:func:`chips_view` for many ranks of one descriptor: the descriptor is indexed once
    (chips by unique id, links and boards by chip), so each view costs its own chips' links
    rather than the whole host's (128 ranks of a 128-chip host)."""

    def __init__(self, cd: cdm.ClusterDescriptor) -> None:
        self.cd = cd
        self.by_asic = {c.asic_id: c for c in cd.chips.values()}
        self.links_of: dict[int, list[int]] = {}  # chip id -> indexes into cd.links
        for i, lk in enumerate(cd.links):
            self.links_of.setdefault(lk.chip_a, []).append(i)
            if lk.chip_b != lk.chip_a:
                self.links_of.setdefault(lk.chip_b, []).append(i)
        self.remote_of: dict[int, list[int]] = {}
        for i, r in enumerate(cd.remote_links):
            self.remote_of.setdefault(r.chip, []).append(i)
        self.boards_of: dict[int, list[int]] = {}
        for i, b in enumerate(cd.boards):
            for c in b.chips:
                self.boards_of.setdefault(c, []).append(i)

    def of(self, asics: list[str], header: str = "") -> str:
        cd, by_asic = self.cd, self.by_asic
        missing = [a for a in asics if a not in by_asic]
        if missing:
            raise ValueError(f"chips not in the cluster descriptor: {', '.join(missing)}")
        old_ids = sorted(by_asic[a].id for a in asics)  # keep the host's relative order
        new_id = {old: i for i, old in enumerate(old_ids)}
        mine = set(old_ids)
        chips = {}
        dev = 0
        for old in old_ids:
            chip = cd.chips[old]
            chips[new_id[old]] = replace(
                chip, id=new_id[old], mmio_dev=(dev if chip.mmio_dev is not None else None)
            )
            if chip.mmio_dev is not None:
                dev += 1
        links, remote = [], []
        for i in sorted({i for c in old_ids for i in self.links_of.get(c, ())}):
            lk = cd.links[i]
            a_in, b_in = lk.chip_a in mine, lk.chip_b in mine
            if a_in and b_in:
                links.append(cdm.Link(new_id[lk.chip_a], lk.chan_a, new_id[lk.chip_b], lk.chan_b))
            elif a_in:
                uid = cd.chips[lk.chip_b].unique_id
                if uid is not None:
                    remote.append(cdm.RemoteLink(new_id[lk.chip_a], lk.chan_a, uid, lk.chan_b))
            elif b_in:
                uid = cd.chips[lk.chip_a].unique_id
                if uid is not None:
                    remote.append(cdm.RemoteLink(new_id[lk.chip_b], lk.chan_b, uid, lk.chan_a))
        for i in sorted({i for c in old_ids for i in self.remote_of.get(c, ())}):
            remote.append(replace(cd.remote_links[i], chip=new_id[cd.remote_links[i].chip]))
        boards = []
        for i in sorted({i for c in old_ids for i in self.boards_of.get(c, ())}):
            b = cd.boards[i]
            boards.append(
                cdm.Board(b.board_id, b.board_type, tuple(new_id[c] for c in b.chips if c in mine))
            )
        out = cdm.ClusterDescriptor(
            chips=chips,
            links=links,
            remote_links=remote,
            boards=boards,
            io_device_type=cd.io_device_type,
        )
        lines = [header] if header else []
        return cdm.dump(out, [*lines, f"ttmesh: mock cluster for chips {', '.join(asics)}"])
