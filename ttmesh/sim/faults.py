"""Fault injection on a simulated host: ``ttmesh sim fault / clear / show``.

Every fault is validated in full before the state changes, so bad input leaves the host as it
was. Faults model what goes wrong on real machines:

* ``link-down A B [--channel C]`` - Ethernet links between two chips stop training;
* ``bad-cable X [--channel C]`` - a cable from chip X to another host (all of X's, or the one on
  channel C) never trains again, whatever is reset, on both sides (the shared cable state:
  sim/cables.py);
* ``chip-dead X [--permanent]`` - firmware hangs (heartbeat frozen); a reset revives it unless
  permanent, in which case the chip does not come back from the reset at all;
* ``chip-gone X`` - the chip falls off the PCI bus: the driver lists it no more (no
  ``/dev/tenstorrent`` node, no sysfs entry); a reset cannot bring back a device the driver lost
  (power-cycle: ``sim clear``);
* ``reset-fails [--times N]`` - tt-smi -r changes nothing yet still exits 0;
* ``reset-renumbers`` - the next reset brings chips back under other /dev/tenstorrent numbers;
* ``reset-hangs SECONDS`` - a reset takes that long;
* ``hold X`` - a detached process holds the chip until killed or cleared;
* ``no-hugepages`` - the kernel has no 1 GiB hugepages set aside (nr_hugepages 0 everywhere);
* ``fw-mismatch X [--version V]`` - one chip runs another firmware bundle than the others;
* ``old-kmd [--version V]`` - the tenstorrent driver is an old one (default 1.34.0);
* ``umd-lock X [--kind K] [--dead]`` - tt-umd's lock file for the chip, as tt-umd writes it
  (:mod:`ttmesh.fabric.umdlocks`), held by a detached process that maps it, or left locked by
  one that died;
* ``container [X] [--shm-size MIB]`` - ttmesh runs in a Docker container started before a
  reset re-created the chips' nodes: ``/.dockerenv``, an overlay root and Docker's private
  64 MiB ``/dev/shm`` in ``proc/self/mountinfo``, and chip X's ``/dev/tenstorrent`` node gone
  (the first PCI chip's by default). ``sim clear`` (or a reset, which re-renders /dev) brings
  the node back; ``sim clear`` also ends the container.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ttmesh import numeric
from ttmesh.errors import bad_input
from ttmesh.host.base import Host
from ttmesh.sim import cables as simcables
from ttmesh.sim import core
from ttmesh.sim.backend import sim_of

HOLD_TAG = "ttmesh-sim-hold"
UMD_LOCK_TAG = "ttmesh-sim-umd-lock"


def _chip(sim: core.SimRoot, ref: str) -> dict[str, Any]:
    """A chip by PCI address or unique id (remote chips have only the latter)."""
    ref = ref.strip().lower()
    for chip in sim.chips():
        if chip.get("bdf") == ref or core.asic_hex(chip["unique_id"]) == ref:
            return chip
    from ttmesh.host.boards import BDF_RE

    if ":" in ref and not BDF_RE.match(ref):
        raise bad_input(
            f"malformed PCI address {ref!r}", "write it as DDDD:BB:DD.F, e.g. 0000:01:00.0"
        )
    known = ", ".join(c["bdf"] for c in sim.chips() if c.get("bdf"))
    raise bad_input(f"no chip {ref} on this simulated host", f"its PCI devices: {known}")


def link_down(host: Host, a: str, b: str, channel: int | None = None) -> list[str]:
    sim = sim_of(host)
    ca, cb = _chip(sim, a), _chip(sim, b)
    asic_a, asic_b = core.asic_hex(ca["unique_id"]), core.asic_hex(cb["unique_id"])
    between = [lk for lk in sim.links() if {lk[0], lk[2]} == {asic_a, asic_b} and asic_a != asic_b]
    if not between:
        raise bad_input(
            f"chips {a} and {b} have no Ethernet link between them",
            "ttmesh ls shows which chips are linked",
        )
    if channel is not None:
        chosen = [
            lk
            for lk in between
            if (lk[0], lk[1]) == (asic_a, channel) or (lk[2], lk[3]) == (asic_a, channel)
        ]
        if not chosen:
            chans = sorted(lk[1] if lk[0] == asic_a else lk[3] for lk in between)
            raise bad_input(
                f"chip {a} has no link to {b} on channel {channel}",
                f"its channels to {b}: {', '.join(map(str, chans))}",
            )
        between = chosen
    keys = [sim.link_key(*lk) for lk in between]
    with sim.change() as state:
        state["links_down"] = sorted(set(state["links_down"]) | set(keys))
    return keys


def _shared(sim: core.SimRoot) -> tuple[Any, int]:
    """The shared cable state of a host of a system of several hosts, and its index."""
    store, index = sim.cable_store(), sim.host_index()
    if store is None or index is None:
        raise bad_input(
            f"{sim.root} has no cables to other hosts",
            "make the hosts of a multi-host system: ttmesh sim create --system dual-t3k --host N",
        )
    return store, index


def bad_cable(host: Host, ref: str, channel: int | None = None) -> list[dict[str, Any]]:
    """The cables of chip ``ref`` (the one on ``channel``) go down and never train again
    until ``sim clear`` (on either host): a bad cable or a dead port. Both hosts see it."""
    sim = sim_of(host)
    store, index = _shared(sim)
    chip = _chip(sim, ref)
    asic = core.asic_hex(chip["unique_id"])
    chans = sorted(lk[1] for lk in sim.remote_links() if lk[0] == asic)
    if not chans:
        with_cables = sorted({
            c.get("bdf") or core.asic_hex(c["unique_id"])
            for c in sim.chips()
            if any(lk[0] == core.asic_hex(c["unique_id"]) for lk in sim.remote_links())
        })  # fmt: skip
        raise bad_input(
            f"chip {ref} has no cable to another host",
            f"chips with cables here: {', '.join(with_cables) or 'none'}",
        )
    if channel is not None and channel not in chans:
        raise bad_input(
            f"chip {ref} has no cable on channel {channel}",
            f"its cables' channels: {', '.join(map(str, chans))}",
        )
    wanted = chans if channel is None else [channel]
    out = []
    with sim.cable_errors(), store.change() as data:
        for c in simcables.of_host(data, index):
            mine, _other = simcables.end_of(c, index)
            if mine["asic"] == asic and mine["chan"] in wanted:
                c["bad"] = True
                c["why"] = "a bad cable (sim fault bad-cable)"
                out.append(c)
    return out


def chip_dead(host: Host, ref: str, permanent: bool = False, gone: bool = False) -> str:
    """The chip's firmware hangs: its heartbeat stands still where it was. ``permanent``: no
    reset brings it back. ``gone``: it also falls off the bus (see :func:`chip_gone`)."""
    sim = sim_of(host)
    asic = core.asic_hex(_chip(sim, ref)["unique_id"])
    with sim.change() as state:
        chip = state["chips"][asic]
        if chip["alive"]:
            chip["hb_base"] = sim.heartbeat(state, asic)
            chip["alive"] = False
        if gone:
            chip["present"] = False
        if (permanent or gone) and asic not in state["faults"]["permanent"]:
            state["faults"]["permanent"].append(asic)
        if gone:
            sim.render(state)  # its driver files go
    return asic


def chip_gone(host: Host, ref: str) -> str:
    """The chip falls off the bus: not present (its driver files go), and no reset brings it
    back (as a permanent fault: on hardware a lost device needs a power cycle)."""
    return chip_dead(host, ref, gone=True)


def reset_fails(host: Host, times: int | None) -> None:
    if times is not None:
        times = numeric.whole(times, "--times", low=1, example="--times 2")
    with sim_of(host).change() as state:
        state["faults"]["reset_fails"] = {"times": times}


def reset_renumbers(host: Host) -> None:
    with sim_of(host).change() as state:
        state["faults"]["reset_renumbers"] = True


def reset_hangs(host: Host, seconds: float) -> None:
    seconds = numeric.seconds(seconds, "reset-hangs")  # inf: tt-smi -r's sleep overflows
    with sim_of(host).change() as state:
        state["faults"]["reset_hangs"] = float(seconds)


def hold(host: Host, ref: str) -> int:
    """Start a detached sleeping process and register it as holder of the chip."""
    sim = sim_of(host)
    chip = _chip(sim, ref)
    asic = core.asic_hex(chip["unique_id"])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nwhile True: time.sleep(3600)",
            HOLD_TAG,
            chip.get("bdf") or asic,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    # Wait until the child exists as itself (its start time is what identifies it later).
    deadline = time.monotonic() + 2
    while core.proc_start_time(proc.pid) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    sim.add_holder([asic], proc.pid, kind="fault")
    return proc.pid


def umd_lock(host: Host, ref: str, kind: str = "CHIP_IN_USE", dead: bool = False) -> int:
    """tt-umd's ``kind`` lock of the chip's PCI device, locked by a detached process that
    holds it (or, ``dead``, that died holding it); its PID. The file is where ttmesh reads a
    host's locks: ``ROOT/dev/shm`` (:func:`ttmesh.fabric.umdlocks.lock_dir`)."""
    from ttmesh.fabric import umdlocks

    sim = sim_of(host)
    chip = _chip(sim, ref)
    if kind not in umdlocks.KINDS:
        raise bad_input(f"no tt-umd lock kind {kind!r}", f"one of {', '.join(umdlocks.KINDS)}")
    asic = core.asic_hex(chip["unique_id"])
    dev = sim.dev_of(sim.read_state(), asic)
    if dev is None or not chip.get("bdf"):
        raise bad_input(f"chip {ref} has no PCI device now", "give the PCI address of a chip")
    base = _own_lock_dir(host)
    if base is None:
        where = umdlocks.lock_dir(host)
        raise bad_input(
            f"{where} leads out of the simulated root (a link)",
            f"remove it: the simulator keeps its tt-umd locks in {where} itself",
        )
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"{umdlocks.PREFIX}{kind}_{dev}_PCIe"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ttmesh.sim.lockholder", str(path), "dead" if dead else "held",
         UMD_LOCK_TAG],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )  # fmt: skip
    assert proc.stdout is not None
    said = proc.stdout.readline()  # the event: the lock is written (EOF: it failed)
    proc.stdout.close()
    if dead:
        proc.wait()
    if said.startswith(b"refused: "):
        proc.wait()
        why = said[len(b"refused: ") :].decode(errors="replace").strip()
        raise bad_input(why, f"remove it (the simulator writes its own lock files in {base})")
    if said.strip() != b"ok":
        proc.wait()
        raise bad_input(f"could not write {path}", f"check that {base} is writable")
    return proc.pid


def no_hugepages(host: Host) -> None:
    with (sim := sim_of(host)).change() as state:
        state["faults"]["no_hugepages"] = True
        sim.render_system(state)


CONTAINER_FILES = (".dockerenv", "proc/self/mountinfo", "proc/1/cgroup")
# proc_pid_mountinfo(5) lines as Docker 24 sets a container up (its default /dev/shm:
# "shm" tmpfs, size=65536k); no /tmp/tt_umd_listeners or /dev/hugepages-1G bind mounts.
MOUNTINFO = (
    "1200 1100 0:60 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/lib/docker/"
    "overlay2/l/SIM,upperdir=/var/lib/docker/overlay2/sim/diff,workdir=/var/lib/docker/overlay2/"
    "sim/work\n"
    "1201 1200 0:63 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "1202 1200 0:64 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755\n"
    "1203 1200 0:65 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro\n"
    "1204 1202 0:66 / /dev/shm rw,nosuid,nodev,noexec,relatime - tmpfs shm rw,size={shm}k\n"
)


def container(host: Host, ref: str | None = None, shm_mib: int = 64) -> str:
    """Model a container (module docstring); the node removed, as the simulator names it."""
    from ttmesh.sim.create import replace_file

    sim = sim_of(host)
    chip = _chip(sim, ref) if ref is not None else None
    state = sim.read_state()
    pci = [c for c in sim.chips() if c.get("bdf")]
    chip = chip or (pci[0] if pci else None)
    if chip is None or not chip.get("bdf"):
        raise bad_input(
            f"chip {ref} has no device node (a remote chip)", "name a PCI device: see ttmesh ls"
        )
    n = sim.dev_of(state, core.asic_hex(chip["unique_id"]))
    root = sim.root
    for rel in ("proc/self", "proc/1"):
        os.makedirs(os.path.join(root, rel), exist_ok=True)
    replace_file(Path(root, ".dockerenv"), b"")
    replace_file(Path(root, "proc/self/mountinfo"), MOUNTINFO.format(shm=shm_mib * 1024).encode())
    replace_file(Path(root, "proc/1/cgroup"), b"0::/\n")  # cgroup v2 in a cgroup namespace
    node = os.path.join(root, "dev/tenstorrent", str(n))
    if n is not None and os.path.lexists(node):
        os.unlink(node)
    return node


def uncontainer(root: str) -> None:
    """``sim clear``: the host is no container any more."""
    for rel in CONTAINER_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, rel))


def _version(value: str, flag: str, example: str) -> str:
    from ttmesh.host.system import _VERSION

    if not _VERSION.fullmatch(value):
        raise bad_input(
            f"{flag} {value!r}: not a version", f"give dotted numbers, e.g. {flag} {example}"
        )
    return value


def fw_mismatch(host: Host, ref: str, version: str = "18.6.0.0") -> str:
    """Chip ``ref`` reports firmware bundle ``version`` (the others keep theirs)."""
    version = _version(version, "--version", "18.6.0.0")
    sim = sim_of(host)
    chip = _chip(sim, ref)
    if not chip.get("bdf"):
        raise bad_input(
            f"chip {ref} is a remote chip: its firmware is its board's",
            "name the PCI device it is reached through",
        )
    asic = core.asic_hex(chip["unique_id"])
    with sim.change() as state:
        state["faults"].setdefault("fw_mismatch", {})[asic] = version
        sim.render(state)
    return asic


def old_kmd(host: Host, version: str = "1.34.0") -> None:
    version = _version(version, "--version", "1.34.0")
    with (sim := sim_of(host)).change() as state:
        state["faults"]["old_kmd"] = version
        sim.render_system(state)


def set_config(
    host: Host,
    heartbeat_hz: float | None,
    reset_seconds: float | None,
    cable: dict[str, float | None] | None = None,
) -> dict:
    """Change the host's timing (and the cables', shared by every host of the system: their
    ``cable_window`` and ``cable_train_seconds``); returns every setting as it is now."""
    cable = {k: v for k, v in (cable or {}).items() if v is not None}
    for key, value in cable.items():
        cable[key] = float(numeric.seconds(value, "--" + key.replace("_", "-")))
    sim = sim_of(host)
    store = sim.cable_store()
    if cable and store is None:
        raise bad_input(
            f"{sim.root} has no cables to other hosts",
            "the cable settings are for a host of a multi-host system (sim create --host N)",
        )
    # nan or inf would break every reader of the state; 0 Hz is no heartbeat.
    if heartbeat_hz is not None:
        heartbeat_hz = numeric.number(
            heartbeat_hz, "--heartbeat-hz", low=0, low_open=True, high=1e6, unit="a rate in Hz"
        )
    if reset_seconds is not None:
        reset_seconds = numeric.seconds(reset_seconds, "--reset-seconds")
    with sim_of(host).change() as state:
        now = time.time()
        if heartbeat_hz is not None:
            for asic, chip in state["chips"].items():
                if chip["alive"]:
                    chip["hb_base"] = sim_of(host).heartbeat(state, asic, now)
                    chip["hb_t0"] = now
            state["config"]["heartbeat_hz"] = float(heartbeat_hz)
        if reset_seconds is not None:
            state["config"]["reset_seconds"] = float(reset_seconds)
        config = dict(state["config"])
    if store is not None:
        with sim.cable_errors():
            if cable:
                with store.change() as data:
                    simcables.settle(data, time.time())  # trained by the old times stays so
                    data["config"].update(cable)
            config.update(store.read()["config"])
    return config


def clear(host: Host) -> dict[str, int]:
    """Remove every fault: chips alive and present, links up, marks gone, fault holders killed."""
    sim = sim_of(host)
    killed = 0
    with sim.change() as state:
        now = time.time()
        for asic, chip in state["chips"].items():
            if not chip["alive"]:
                chip["alive"] = True
                chip["hb_t0"] = now
            if not chip["present"]:
                chip["present"] = True
                if chip["dev"] is None:
                    chip["dev"] = sim.chip_by_asic(asic).get("dev_index")
        keep = []
        for h in state["holders"]:
            if h.get("kind") == "fault":
                if core.proc_alive(h["pid"], h.get("start")):
                    try:
                        os.kill(h["pid"], signal.SIGKILL)
                        killed += 1
                    except ProcessLookupError:
                        pass
            else:
                keep.append(h)
        state["holders"] = keep
        killed += _clear_umd_locks(host)
        cleared = len(state["links_down"]) + len(state["fabric_marks"])
        state["links_down"] = []
        state["fabric_marks"] = []
        state["faults"] = {
            "reset_fails": None,
            "reset_renumbers": False,
            "reset_hangs": 0.0,
            "permanent": [],
            "no_hugepages": False,
            "fw_mismatch": {},
            "old_kmd": None,
        }
        sim.prune(state)
        sim.render(state)
        cleared += _clear_cables(sim)
    uncontainer(sim.root)
    return {"holders_killed": killed, "cleared": cleared}


def _clear_cables(sim: core.SimRoot) -> int:
    """This host's cables up again, none bad (as ``clear`` brings its links up)."""
    store, index = sim.cable_store(), sim.host_index()
    if store is None or index is None:
        return 0
    count = 0
    with sim.cable_errors(), store.change() as data:
        for c in simcables.of_host(data, index):
            if c["bad"] or not c["trained"]:
                count += 1
            c.update(bad=False, trained=True, train_at=None, why="")
    return count


def _own_lock_dir(host: Host) -> Any:
    """The simulated root's dev/shm, or None when it (or dev) is a link: the simulator never
    writes, nor clears, the machine's /dev/shm through one."""
    from pathlib import Path

    from ttmesh.fabric import umdlocks

    base = umdlocks.lock_dir(host)
    return base if Path(os.path.realpath(base)) == base else None


def _clear_umd_locks(host: Host) -> int:
    """Kill the simulator's lock holders (their command line carries the tag) and remove the
    lock files under the simulated root: the simulator's own directory, never /dev/shm."""
    from ttmesh.fabric import umdlocks

    killed = 0
    if _own_lock_dir(host) is None:
        return 0
    for lock in umdlocks.read(host):
        pid = lock.owner_pid
        if lock.state == umdlocks.HELD and pid and UMD_LOCK_TAG in (core_cmd(pid) or ""):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        with contextlib.suppress(OSError):
            os.unlink(lock.path)
    return killed


def core_cmd(pid: int) -> str | None:
    from ttmesh import procs

    return procs.command_line(pid)


def show(host: Host) -> dict[str, Any]:
    from ttmesh.sim.from_capture import capture_info

    sim = sim_of(host)
    state = sim.read_state()
    dead_marks = sim.dead_marked_chips(state)
    chips = []
    for chip in sorted(sim.chips(), key=lambda c: c["id"]):
        asic = core.asic_hex(chip["unique_id"])
        st = state["chips"][asic]
        chips.append(
            {
                "asic_id": asic,
                "bdf": chip.get("bdf"),
                "dev_index": sim.dev_of(state, asic),
                "alive": st["alive"],
                "present": st["present"],
                "heartbeat": sim.heartbeat(state, asic),
                "holders": sim.holders(state, asic),
            }
        )
    down = []
    for lk in sim.links():
        if not sim.link_up(state, lk, dead_marks):
            why = "fault" if sim.link_key(*lk) in state["links_down"] else "chip or fabric"
            down.append(
                {
                    "a": {"asic_id": lk[0], "chan": lk[1]},
                    "b": {"asic_id": lk[2], "chan": lk[3]},
                    "why": why,
                }
            )
    return {
        "schema": "ttmesh.simstate-view/1",
        "cables": cable_view(sim, state, dead_marks),
        "root": sim.root,
        "system": sim.system["name"]
        + (f" host {sim.system['host']}" if sim.system.get("host") is not None else ""),
        "config": state["config"],
        "chips": chips,
        "links_down": down,
        "faults": state["faults"],
        "fabric_marks": [{**m, "alive": not sim.mark_dead(m)} for m in state["fabric_marks"]],
        "resets": len(state["resets"]),
        "capture": capture_info(sim.root),
        "container": os.path.lexists(os.path.join(sim.root, ".dockerenv")),
    }


def cable_view(
    sim: core.SimRoot, state: dict[str, Any], dead_marks: list[set[str]]
) -> dict[str, Any] | None:
    """This host's cables as ``sim show`` shows them: each with both ends, its state as this
    host sees it (``up``, ``training``, ``down``) and why; None without shared cables."""
    store, index = sim.cable_store(), sim.host_index()
    if store is None or index is None:
        return None
    with sim.cable_errors():
        data = store.state_now()
    now = time.time()
    rows = []
    for c in simcables.of_host(data, index):
        mine, other = simcables.end_of(c, index)
        link = next(
            (lk for lk in sim.remote_links() if (lk[0], lk[1]) == (mine["asic"], mine["chan"])),
            None,
        )
        shared = simcables.state_of(c, now)
        seen = shared
        why = c.get("why") or ""
        if (
            link is not None
            and shared == simcables.UP
            and not sim.remote_up(state, link, dead_marks, data)
        ):
            seen = simcables.DOWN
            why = "down on this host (a fault, or a job died with the fabric open here)"
        chip = sim.chip_by_asic(mine["asic"])
        rows.append(
            {
                "local": {**mine, "bdf": chip.get("bdf")},
                "remote": dict(other),
                "state": seen,
                "bad": c["bad"],
                "train_at": c.get("train_at"),
                "why": why,
            }
        )
    return {"dir": store.directory, "host": index, "config": data["config"], "cables": rows}
