"""tt-umd's reset notices (issue 26): ttmesh listens as tt-umd's listeners do, the simulated
tt-smi notifies as tt-umd's notifier does, and a notice stops a job only when it is about the
job's chips and its sender could reset them."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
import umdclients
from conftest import alive, start_launch, wait_for, worker
from users import NEEDS_NOBODY, User, can_switch, users_fixture  # noqa: F401

from ttmesh import procs
from ttmesh.cli.hosts import open_host
from ttmesh.errors import TTMeshError
from ttmesh.fabric import resetscope
from ttmesh.fabric.devices import discover
from ttmesh.host import umdnotice
from ttmesh.host.umdnotice import Notice
from ttmesh.launcher.attempt.resetwatch import ResetWatch


def _send(root: Path, name: str, data: bytes) -> socket.socket:
    """A notifier of our own, as tt-umd's connects and writes (kept open, as asio's is)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(root / umdnotice.LISTENER_DIR, os.O_PATH)
    try:
        s.connect(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)
    s.sendall(data)
    return s


def _heard(listener: umdnotice.Listener, count: int = 1) -> list[Notice]:
    """Wait (on the listener's own descriptor: an event, not a sleep) for ``count`` notices."""
    got: list[Notice] = []
    with selectors.DefaultSelector() as sel:
        sel.register(listener.fileno(), selectors.EVENT_READ)
        while len(got) < count:
            assert sel.select(10), f"no notice within 10 s (heard {got})"
            got += listener.read()
    return got


def test_a_notice_is_heard_with_who_sent_it(qb2: Path) -> None:
    listener = umdnotice.listen(qb2)
    try:
        name = umdnotice.socket_name(os.getpid())
        path = qb2 / umdnotice.LISTENER_DIR / name
        assert path.is_socket() and (path.stat().st_mode & 0o777) == 0o666
        with _send(qb2, name, bytes([umdnotice.PRE_RESET])):
            (notice,) = _heard(listener)
        assert notice.kind == "pre-reset"
        assert (notice.pid, notice.uid) == (os.getpid(), os.getuid())
        # Its command line as the kernel shows it (pytest-xdist retitles its workers).
        own = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()
        assert notice.command[:1] == (own,)
        with _send(qb2, name, bytes([umdnotice.POST_RESET])):
            assert [n.kind for n in _heard(listener)] == ["post-reset"]
    finally:
        listener.close()
    assert not (qb2 / umdnotice.LISTENER_DIR / name).exists()


def test_unknown_bytes_and_silent_callers_do_not_stop_listening(qb2: Path) -> None:
    listener = umdnotice.listen(qb2)
    name = umdnotice.socket_name(os.getpid())
    silent = []
    try:
        for _ in range(umdnotice.MAX_OPEN + 4):  # callers that never write: bounded
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            fd = os.open(qb2 / umdnotice.LISTENER_DIR, os.O_PATH)
            s.connect(f"/proc/self/fd/{fd}/{name}")
            os.close(fd)
            silent.append(s)
            assert listener.read() == []  # accepted (a backlog left full would block callers)
        with _send(qb2, name, b"\x07"), _send(qb2, name, bytes([umdnotice.PRE_RESET])):
            assert [n.kind for n in _heard(listener)] == ["pre-reset"]
        assert len(listener.waiting) <= umdnotice.MAX_OPEN
    finally:
        for s in silent:
            s.close()
        listener.close()


def test_a_link_planted_for_the_directory_is_refused(qb2: Path, tmp_path: Path) -> None:
    """Another user's link in the directory's place is never followed (the socket would be
    made wherever it points)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (qb2 / "tmp").mkdir(exist_ok=True)
    link = qb2 / umdnotice.LISTENER_DIR
    link.symlink_to(elsewhere)
    os.lchown(link, 65534, 65534)
    listener, why = umdnotice.try_listen(qb2)
    assert listener is None
    assert "tt-umd's listener directory" in why and "nobody" in why
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(TTMeshError):
        umdnotice.listen(qb2)


def test_close_leaves_a_socket_that_is_no_longer_ours(qb2: Path) -> None:
    listener = umdnotice.listen(qb2)
    path = qb2 / umdnotice.LISTENER_DIR / listener.name
    path.unlink()  # another user (the directory is everyone's) replaced it
    path.write_text("someone else's")
    listener.close()
    assert path.read_text() == "someone else's"


def test_the_simulated_tt_smi_notifies_around_its_reset(qb2: Path) -> None:
    """PRE_RESET before the reset, POST_RESET after it, from tt-smi itself (the kernel says
    which process), its command naming the chip it resets."""
    inv = discover(open_host(qb2))
    bdf = inv.chips[0].bdf
    listener = umdnotice.listen(qb2)
    try:
        proc = subprocess.Popen(
            [str(qb2 / "bin" / "tt-smi"), "-r", bdf],
            stdout=subprocess.DEVNULL,
            env={**os.environ, "TTMESH_SIM_ROOT": str(qb2)},
        )
        pre, post = _heard(listener, 2)
        assert proc.wait(30) == 0
    finally:
        listener.close()
    assert (pre.kind, post.kind) == ("pre-reset", "post-reset")
    assert pre.pid == proc.pid and "-r" in pre.command and bdf in pre.command
    assert resetscope.reset_targets(pre.command) == [bdf]


@pytest.mark.parametrize(
    ("command", "targets"),
    [
        (("/usr/bin/python3", "/usr/local/bin/tt-smi", "-r", "0000:03:00.0,0000:04:00.0"),
         ["0000:03:00.0", "0000:04:00.0"]),
        (("tt-smi", "-r", "0", "1"), ["0", "1"]),
        (("tt-smi", "--reset", "/dev/tenstorrent/2"), ["/dev/tenstorrent/2"]),
        (("tt-smi", "-r"), []),
        (("tt-smi", "-r", "all"), []),
        (("tt-smi", "-r", "0", "--no_reinit"), ["0"]),
        (("tt-smi", "-s"), None),
        (("./my_umd_tool",), None),
        ((), None),
    ],
)  # fmt: skip
def test_tt_smis_targets_are_read_as_tt_smi_reads_them(
    command: tuple[str, ...], targets: list[str] | None
) -> None:
    assert resetscope.reset_targets(command) == targets


def test_a_notice_stops_only_the_job_whose_chips_it_resets(qb2: Path) -> None:
    host = open_host(qb2)
    inv = discover(host)
    every = resetscope.targets(host, [c.bdf for c in inv.chips if c.bdf])
    mine, other = every[:2], every[2:]
    me = os.getuid()
    ours = Notice("pre-reset", 1, me, ("tt-smi", "-r", mine[0].bdf or ""))
    theirs = Notice("pre-reset", 1, me, ("tt-smi", "-r", ",".join(c.bdf or "" for c in other)))
    unknown = Notice("pre-reset", 1, me, ("./my_umd_tool",))
    everything = Notice("pre-reset", 1, me, ("tt-smi", "-r"))
    assert resetscope.judge(host, ours, mine, me).heed
    assert "reset by tt-smi -r" in resetscope.judge(host, ours, mine, me).why
    assert not resetscope.judge(host, theirs, mine, me).heed
    assert resetscope.judge(host, unknown, mine, me).heed
    assert resetscope.judge(host, everything, mine, me).heed
    by_id = Notice("pre-reset", 1, me, ("tt-smi", "-r", str(mine[1].pci_index)))
    by_node = Notice("pre-reset", 1, me, ("tt-smi", "-r", f"/dev/tenstorrent/{other[0].dev_index}"))
    assert resetscope.judge(host, by_id, mine, me).heed
    assert not resetscope.judge(host, by_node, mine, me).heed


@pytest.mark.parametrize(
    ("args", "heed"),
    [
        (["7"], True),  # past the end: tt-umd resets every device
        (["0000:09:00.0"], True),  # no such chip: every device
        (["0000:09:00.0,{bdf1}"], True),
        (["{other}"], False),
        (["/dev/tenstorrent/ {dev1}"], True),  # tt-smi strips the number
        (["/dev/tenstorrent/9"], False),  # no such node: tt-umd resets nothing
        (["{umd1}"], True),
        (["-0"], True),  # UMD id 0, which is a job chip
        (["-1"], True),  # before tt-umd's list (undefined): any device
        (["²"], True),  # tt-smi refuses it: whoever sent this, its scope is unknown
        (["2147483648"], True),  # tt-umd's binding refuses it: likewise
        (["{umd3},0000:01:00.0"], True),  # mixed kinds: tt-smi refuses
        (["{other}", "--no_reinit"], False),
    ],
)
def test_a_notice_names_the_chips_tt_umd_would_reset(
    qb2: Path, args: list[str], heed: bool
) -> None:
    """tt-smi's targets are mapped to chips as tt-umd maps them: ids or addresses matching
    nothing reset EVERY device (the job is concerned); /dev numbers matching nothing reset
    none; targets tt-smi or tt-umd would refuse are no tt-smi's (scope unknown)."""
    host = open_host(qb2)
    every = resetscope.targets(host, sorted(c.bdf for c in discover(host).chips if c.bdf))
    mine = [every[0], every[1]]  # UMD ids 0 and 1: the first two in PCI order
    fill = {
        "bdf1": mine[1].bdf, "other": every[3].bdf, "dev1": mine[1].dev_index,
        "umd1": 1, "umd3": 3,
    }  # fmt: skip
    me = os.getuid()
    for flag in ("-r", "--res"):
        notice = Notice("pre-reset", 1, me, ("tt-smi", flag, *(a.format(**fill) for a in args)))
        assert resetscope.judge(host, notice, mine, me).heed is heed, (flag, args)


def test_a_notice_from_a_user_who_cannot_reset_the_chips_is_ignored(qb2: Path) -> None:
    host = open_host(qb2)
    inv = discover(host)
    chips = resetscope.targets(host, [c.bdf for c in inv.chips[:2] if c.bdf])
    nodes = [qb2 / "dev" / "tenstorrent" / str(c.dev_index) for c in chips]
    stranger = Notice("pre-reset", 1, 65534, ("tt-smi", "-r"))
    for node in nodes:
        os.chmod(node, 0o600)
    verdict = resetscope.judge(host, stranger, chips, job_uid=0)
    assert not verdict.heed and "cannot reset" in verdict.why
    os.chmod(nodes[1], 0o666)  # the driver lets anyone open it: anyone could reset it
    assert resetscope.judge(host, stranger, chips, job_uid=0).heed


def _tt_smi_reset(root: Path, bdf: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(root / "bin" / "tt-smi"), "-r", bdf],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "TTMESH_SIM_ROOT": str(root)},
    )


def _wait_heard(watch: ResetWatch, done: Callable[[str | None], bool]) -> str | None:
    """Read the watch each time its descriptor is readable until ``done`` (an event)."""
    with selectors.DefaultSelector() as sel:
        sel.register(watch.fileno(), selectors.EVENT_READ)
        while True:
            assert sel.select(10), "no notice within 10 s"
            said = watch.heard()
            if done(said):
                return said


def test_an_attempt_stops_for_a_reset_of_its_chips_and_not_for_others(qb2: Path) -> None:
    """The guardian's watch: tt-smi resetting a chip of the job is a reason to stop, naming
    tt-smi; a reset of another chip is said and the job goes on."""
    host = open_host(qb2)
    bdfs = [c.bdf for c in discover(host).chips if c.bdf]
    said: list[str] = []
    watch = ResetWatch(host, bdfs[:2], os.getuid(), said.append)
    try:
        other = _tt_smi_reset(qb2, bdfs[3])
        assert _wait_heard(watch, lambda stop: stop is not None or len(said) == 2) is None
        assert said[0] == (
            f"tt-umd reset notice: a reset of other chips than the job's: tt-smi -r {bdfs[3]} "
            f"(pid {other.pid}, user {procs.user_name(os.getuid())}): the job goes on"
        )
        assert said[1].startswith(f"tt-umd reset notice: the reset by tt-smi -r {bdfs[3]}")
        assert other.wait(30) == 0
        ours = _tt_smi_reset(qb2, bdfs[1])
        reason = _wait_heard(watch, lambda stop: stop is not None)
        assert reason is not None
        assert reason.startswith(f"reset notice: {bdfs[1]} reset by ") and "tt-smi -r" in reason
        assert f"pid {ours.pid}" in reason
        assert ours.wait(30) == 0
    finally:
        watch.close()
    assert not any((qb2 / umdnotice.LISTENER_DIR).iterdir())


def _listening(root: Path) -> list[Path]:
    where = root / umdnotice.LISTENER_DIR
    return list(where.glob("client_*.sock")) if where.is_dir() else []


def test_a_job_stops_when_another_tool_resets_its_chips(qb2: Path, tmp_path: Path) -> None:
    """tt-smi -r on a chip of the running job: the ranks are stopped before its grace ends,
    the job says who reset, exits 143, leaves the reset to that tool (no recovery of its own,
    no restart) and leaves no process nor listener behind."""
    go = tmp_path / "never"
    proc = start_launch(
        qb2, "--tp-size", "2", "--max-restarts", "2",
        *worker(f"pids={tmp_path}", f"await={go}", "exit=0"),
    )  # fmt: skip
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 2, what="the ranks")
        wait_for(lambda: _listening(qb2), what="the guardian's listener")
        plan_bdfs = [c.bdf for c in discover(open_host(qb2)).chips if c.bdf]
        ranks = {int(p.read_text()) for p in tmp_path.glob("*.pid")}
        # The job took the first two chips of the PCI order (healthy first on a QuietBox 2).
        reset = _tt_smi_reset(qb2, plan_bdfs[0])
        _out, err = proc.communicate(timeout=60)
        assert reset.wait(30) == 0
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert f"reset notice: {plan_bdfs[0]} reset by tt-smi -r {plan_bdfs[0]} (pid {reset.pid}" in err
    assert ": stopping every worker" in err
    assert "ttmesh leaves them to it" in err
    assert "restarting" not in err and "resetting its chips" not in err
    assert not [p for p in ranks if alive(p)]
    assert _listening(qb2) == []


def test_a_reset_of_other_chips_is_said_and_the_job_goes_on(qb2: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = start_launch(
        qb2, "--chips", "0000:01:00.0", *worker(f"pids={tmp_path}", f"await={go}", "exit=0")
    )
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 1, what="the rank")
        wait_for(lambda: _listening(qb2), what="the guardian's listener")
        other = [c.bdf for c in discover(open_host(qb2)).chips if c.bdf][-1]
        assert other != "0000:01:00.0"
        assert _tt_smi_reset(qb2, other).wait(30) == 0  # PRE and POST were both sent
        go.touch()
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"a reset of other chips than the job's: tt-smi -r {other}" in err
    assert "the job goes on" in err


def test_a_senders_command_line_is_shown_on_one_printable_line() -> None:
    """Anyone may connect: what its command line holds never reaches a terminal raw."""
    hostile = Notice(
        "pre-reset", 7, 0, ("/usr/bin/python3", "-c", "x\n\x1b[31mred\x1b[0m" + "y" * 300)
    )
    shown = hostile.who()
    assert "\n" not in shown and "\x1b" not in shown
    assert shown.startswith("python3 -c x \\x1b[31mred") and shown.endswith("(pid 7, user root)")
    assert len(shown) < 160
    tool = Notice("pre-reset", 7, 0, ("/usr/bin/python3", "/usr/local/bin/tt-smi", "-r"))
    assert tool.who() == "tt-smi -r (pid 7, user root)"


def test_with_pass_the_ranks_go_on_and_ttmesh_says_who_reset(qb2: Path, tmp_path: Path) -> None:
    """--on-reset-notice pass: a tt-umd client that pauses and resumes on the notices it hears
    itself keeps running; ttmesh only names the reset."""
    go = tmp_path / "go"
    proc = start_launch(
        qb2, "--chips", "0000:01:00.0", "--on-reset-notice", "pass",
        *worker(f"pids={tmp_path}", f"await={go}", "exit=0"),
    )  # fmt: skip
    try:
        wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 1, what="the rank")
        wait_for(lambda: _listening(qb2), what="the guardian's listener")
        assert _tt_smi_reset(qb2, "0000:01:00.0").wait(30) == 0
        go.touch()
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "reset notice: 0000:01:00.0 reset by tt-smi -r 0000:01:00.0" in err
    assert "the ranks go on (--on-reset-notice pass)" in err


def test_the_dry_run_says_what_a_reset_notice_does(qb2: Path, cli: Callable) -> None:
    import json

    plan = json.loads(cli("launch", "--root", str(qb2), "--tp-size", "1", "--dry-run", "--json",
                          "--", "true").out)  # fmt: skip
    assert plan["on_reset_notice"] == "stop"
    bad = cli("launch", "--root", str(qb2), "--on-reset-notice", "pause", "--", "true")
    assert bad.code == 2 and "--on-reset-notice" in bad.err and len(bad.err.splitlines()) == 1


# -- hostile notifiers (issue 33): anyone may connect, as often as they like, and write anything


def _pump(listener: umdnotice.Listener, out: IO[str]) -> tuple[list[Notice], str]:
    """Serve ``listener`` (as a guardian's loop does) until a line comes on ``out`` (a client's
    stdout); the notices heard meanwhile and the line."""
    got: list[Notice] = []
    with selectors.DefaultSelector() as sel:
        sel.register(listener.fileno(), selectors.EVENT_READ, "listener")
        sel.register(out, selectors.EVENT_READ, "client")
        while True:
            ready = sel.select(umdclients.HANG)
            assert ready, "the client said nothing in time"
            got += listener.read()
            assert len(listener.waiting) <= umdnotice.MAX_OPEN
            if any(key.data == "client" for key, _ in ready):
                return got, out.readline().strip()


@pytest.mark.skipif(not can_switch(), reason=NEEDS_NOBODY)
@pytest.mark.parametrize("flooder", ["nobody", "root"])
def test_a_flood_never_breaks_a_listener_nor_pushes_out_another_users_notice(
    users: dict[str, User], flooder: str
) -> None:
    """One user holds hundreds of silent connections and writes junk, 1 MiB, half messages
    and notices, before and after another user's notifier connected (tt-umd's connects all
    listeners first and writes after): the listener keeps at most MAX_OPEN connections, the
    flooder's own oldest give way, and the other user's notice is heard."""
    flooding, other = users[flooder], users["root" if flooder == "nobody" else "nobody"]
    listener = umdnotice.listen(users["root"].sim)
    sock = users["root"].sim / umdnotice.LISTENER_DIR / listener.name
    first = subprocess.Popen(
        umdclients.flood_argv(flooding, sock, "100:none", "hold"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    notifier = second = None
    try:
        assert first.stdout is not None and first.stdin is not None
        assert _pump(listener, first.stdout)[1] == "done 100"
        notifier = umdclients.Notifier(other, sock, "01")  # connected: its byte comes later
        second = subprocess.Popen(
            umdclients.flood_argv(
                flooding, sock, "100:none", "40:junk", "5:mib", "20:shut", "30:02", "30:01",
                "hold",
            ),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert second.stdout is not None and second.stdin is not None
        heard, line = _pump(listener, second.stdout)
        assert line == "done 205"  # the 20 shut ones are not counted
        assert {n.uid for n in heard} <= {flooding.uid}
        assert notifier.proc.stdout is not None
        notifier.notify()
        heard, line = _pump(listener, notifier.proc.stdout)
        assert line == "sent"
        assert [(n.kind, n.pid, n.uid) for n in heard] == [("pre-reset", notifier.pid, other.uid)]
        dropped = listener.take_dropped()
        assert set(dropped) == {flooding.uid} and dropped[flooding.uid] >= 100
        first.stdin.close()
        second.stdin.close()
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()
        if notifier is not None:
            notifier.close()
        listener.close()


def test_what_a_listener_lets_pass_is_said_in_few_lines_per_user() -> None:
    """A thousand notices from one user: the first few said, the rest one count once the
    window has passed; another user's lines are said meanwhile all the same."""
    now = [100.0]
    said: list[str] = []
    tally = umdnotice.Tally(said.append, clock=lambda: now[0])
    for i in range(1000):
        tally.line(65534, f"notice {i}")
        if i == 500:
            tally.line(0, "root's notice")
    tally.dropped(Counter({65534: 7}))
    tally.tick()  # the window has not passed: nothing more
    assert said == [f"notice {i}" for i in range(umdnotice.BURST)] + ["root's notice"]
    now[0] += umdnotice.EVERY
    tally.tick()
    assert said[-1] == (
        f"tt-umd reset notices from user nobody in the last 10 seconds: "
        f"{1000 - umdnotice.BURST} more notices not shown one by one, "
        "7 connections closed without a notice"
    )
    count = len(said)
    for _ in range(100):  # the flood goes on: counted, one line per window
        tally.line(65534, "again")
    assert len(said) == count
    tally.flush()
    assert said[-1].endswith(": 100 more notices not shown one by one") and len(said) == count + 1
    tally.flush()
    assert len(said) == count + 1


@pytest.mark.parametrize(
    ("target", "ours"),
    [
        ("²", True),  # tt-smi's int() refuses it after isdigit() said yes: nothing is reset
        ("٣", False),  # tt-smi 6.8.0 reads it as 3 (int('٣')): chip 3, not the job's 0 and 1
        ("/dev/tenstorrent/²", True),
        ("/dev/tenstorrent/٣", False),
        ("7" * 5000, True),  # past a C int: tt-umd's binding refuses it
        ("0x1", True),  # tt-smi refuses these words: not that tt-smi, the scope is unknown
        ("+1", True),
        (" 1", True),  # chip 1, the job's
        ("1_0", True),
    ],
)
def test_a_reset_target_is_read_as_tt_smi_reads_it(qb2: Path, target: str, ours: bool) -> None:
    """``tt-smi -r ²`` (which ``int`` refuses after ``isdigit`` said yes), Arabic-Indic digits
    (which tt-smi 6.8.0 reads as the number they are), a number past a C int, a word tt-smi
    refuses: each is read as tt-smi 6.8.0 reads it (``tt_smi/device_input.py``), and a reset
    whose scope cannot be told may be the job's. Never a crash."""
    host = open_host(qb2)
    chips = resetscope.targets(host, [c.bdf for c in discover(host).chips[:2] if c.bdf])
    me = os.getuid()
    notice = Notice("pre-reset", 1, me, ("tt-smi", "-r", target))
    verdict = resetscope.judge(host, notice, chips, me)
    assert verdict.heed is ours and "tt-smi -r" in verdict.why, verdict


@pytest.mark.skipif(not can_switch(), reason=NEEDS_NOBODY)
def test_a_flood_of_notices_neither_kills_a_job_nor_floods_its_output(
    users: dict[str, User], tmp_path: Path
) -> None:
    """With --on-reset-notice pass, nobody (who may not reset the chips: nodes 0660) and then
    root flood the guardian's socket with notices, junk, 1 MiB writes, half messages and
    silent connections, and a process named ``tt-smi -r ²`` sends a notice: the job goes on
    to exit 0, and the notices take a few lines per user, not one each."""
    root, nobody = users["root"], users["nobody"]
    nodes = sorted((root.sim / "dev" / "tenstorrent").glob("[0-9]*"))
    modes = {n: n.stat().st_mode & 0o777 for n in nodes}
    for node in nodes:
        node.chmod(0o660)
    before = set(_listening(root.sim))
    go = tmp_path / "go"
    proc = start_launch(
        root.sim, "--chips", "0000:01:00.0", "--on-reset-notice", "pass",
        *worker(f"pids={tmp_path}", f"await={go}", "exit=0"),
    )  # fmt: skip
    try:
        wait_for(lambda: set(_listening(root.sim)) - before, what="the guardian's listener")
        (sock,) = set(_listening(root.sim)) - before
        assert (
            umdclients.flood(
                nobody, sock, "300:01", "100:02", "60:junk", "5:mib", "30:shut", "30:none"
            )
            == "done 495"
        )
        assert umdclients.flood(root, sock, "100:01", "100:02") == "done 200"
        tt_smi = tmp_path / "tt-smi"
        tt_smi.symlink_to(sys.executable)
        odd = subprocess.run(
            [str(tt_smi), "-c", umdclients.FLOOD, str(sock), "1:01", "-r", "²"],
            capture_output=True, text=True, timeout=umdclients.HANG + 10,
        )  # fmt: skip
        assert odd.stdout.strip() == "done 1", odd.stderr
        go.touch()
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        for node, mode in modes.items():
            node.chmod(mode)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "supervisor error" not in err
    about = [line for line in err.splitlines() if "reset notice" in line]
    # Per user: BURST lines, then a count per 10 s window (a slow machine: a few windows).
    assert len(about) <= 2 * (umdnotice.BURST + 4), "\n".join(about)
    counts = [line for line in about if "not shown one by one" in line]
    assert any("from user nobody" in line for line in counts), "\n".join(about)
    assert any("from user root" in line for line in counts), "\n".join(about)


def test_bytes_from_connections_pushed_out_in_the_same_turn_are_still_read(qb2: Path) -> None:
    """MAX_OPEN connections wait, then new ones queue and only then the waiting ones write:
    one turn of the listener sees both. The bytes already there are read before anyone is
    accepted (and pushed out). The listener once accepted first and then looked the dropped
    connections up: StopIteration, and the guardian died."""
    listener = umdnotice.listen(qb2)
    name = umdnotice.socket_name(os.getpid())
    fd = os.open(qb2 / umdnotice.LISTENER_DIR, os.O_PATH)
    made: list[socket.socket] = []

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(f"/proc/self/fd/{fd}/{name}")
        made.append(s)
        return s

    try:
        held = [connect() for _ in range(umdnotice.MAX_OPEN)]
        assert listener.read() == [] and len(listener.waiting) == umdnotice.MAX_OPEN
        for _ in range(umdnotice.MAX_OPEN):
            connect()  # queued: the listening socket is ready first
        for s in held:
            s.sendall(bytes([umdnotice.PRE_RESET]))
        heard = listener.read()  # one turn
        assert [n.kind for n in heard] == ["pre-reset"] * umdnotice.MAX_OPEN
        assert len(listener.waiting) == umdnotice.MAX_OPEN  # the new ones, silent so far
    finally:
        for s in made:
            s.close()
        os.close(fd)
        listener.close()
