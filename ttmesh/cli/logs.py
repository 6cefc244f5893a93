"""``ttmesh logs JOB``: a job's output, running or ended, from the copy it keeps with its record.

Each stream of each rank (a server's, mpirun's) is kept under the job's record
(:mod:`ttmesh.runtime.joblogs`). This command prints them merged in the order they were written
(to the index's second), each line prefixed with its rank when more than one is shown, as the
launch's console does. ``--follow`` goes on printing until the job ends.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import click

from ttmesh import numeric
from ttmesh.cli.params import CONTEXT, Number
from ttmesh.dataclass import dataclass

FOLLOW_EVERY = 0.2  # seconds between two looks at the files while following
STREAM_ORDER = {"stdout": 0, "stderr": 1}
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(s|m|h|d)?", re.ASCII)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?", re.ASCII)


@click.command("logs", context_settings=CONTEXT)
@click.argument("job")
@click.option(
    "--rank",
    "rank",
    type=Number(whole=True, low=0, high=65535, unit="rank", example="0"),
    help="Only rank R's output (its number, as [rN] shows it; a server is rank 0).",
)
@click.option(
    "--replica",
    "replica",
    type=Number(whole=True, low=0, high=65535, unit="replica", example="0"),
    help="A fleet (--replicas): only replica K's output.",
)
@click.option(
    "--attempt",
    "attempt",
    type=Number(whole=True, low=1, high=1_000_000, unit="attempt", example="1"),
    help="Only attempt N (1 is the first). Default: every attempt kept (the first and the "
    "last two).",
)
@click.option(
    "--stream",
    type=click.Choice(["both", "stdout", "stderr"]),
    default="both",
    show_default=True,
    help="Which of the ranks' streams.",
)
@click.option(
    "--tail",
    "-n",
    "tail",
    type=Number(whole=True, low=0, high=100_000_000, unit="lines", example="100"),
    help="Only the last N lines.",
)
@click.option(
    "--since",
    metavar="T",
    help="Only what was written since T: a time ago (30s, 10m, 2h, 1d; plain seconds) or a "
    "time (14:05, 14:05:30 today, or 2026-12-05T14:05:00).",
)
@click.option("--follow", "-f", is_flag=True, help="Go on printing new output until the job ends.")
def logs_cmd(
    job: str,
    rank: int | None,
    replica: int | None,
    attempt: int | None,
    stream: str,
    tail: int | None,
    since: str | None,
    follow: bool,
) -> int:
    """Print a job's output (its ranks', or its server's), running or ended.

    \b
    Every job keeps its ranks' stdout and stderr with its record, bounded (the first and the
    last bytes of each stream; TTMESH_JOB_LOG_MB per job, TTMESH_LOGS_MB for all), for as long
    as `ttmesh ps --all` lists it. Lines of several ranks are merged in the order they were
    written and prefixed [rN]; a fleet's replicas [replicaK].

    \b
    Examples:
      ttmesh logs qwen8b --tail 50
      ttmesh logs train --rank 3 --stream stderr --since 10m
      ttmesh logs qwen8b --follow
      ttmesh logs fleet --replica 1
    """
    from ttmesh.paths import safe_name

    safe_name(job, "job id")
    since_at = parse_since(since) if since is not None else None
    sources = _sources(job, replica)
    if rank is not None:
        _check_rank(sources, rank)
    shown = Shown(rank, attempt - 1 if attempt is not None else None, stream, since_at)
    out = sys.stdout.buffer
    snapshot = collect(sources, shown)
    if len(snapshot.missing) == len(sources) and not follow:
        snapshot.close()
        _none_kept(job, sources)
    if shown.attempt is not None and not snapshot.attempts and not follow:
        snapshot.close()
        _attempt_not_kept(job, sources, shown.attempt)
    _write(out, render(snapshot, tail))
    if not follow:
        return 0
    try:
        _follow(out, sources, shown, snapshot)
    except KeyboardInterrupt:
        return 130
    return 0


@dataclass
class Source:
    """A job whose logs are shown: the job itself, or one replica of a fleet."""

    job: str
    label: str  # "" for the job itself, "replicaK" for a fleet's replica
    record: dict[str, Any]


@dataclass(frozen=True)
class Shown:
    """What the user asked to see."""

    rank: int | None
    attempt: int | None  # 0-based
    stream: str
    since: float | None


def parse_since(value: str) -> float:
    """``--since``: a time ago (``30s``, ``10m``, ``2h``, ``1d``, plain seconds) or a time of
    day today (``14:05``), or a date and time (``2026-12-05T14:05``); a Unix time."""
    from ttmesh.errors import bad_input

    text = value.strip()
    hint = "give a time ago (30s, 10m, 2h, 1d) or a time (14:05, 2026-12-05T14:05:00)"
    now = time.time()
    m = _DURATION.fullmatch(text)
    if m:
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
        if seconds > 3650 * 86400:
            raise bad_input(f"--since {value}: too long ago", hint)
        return now - seconds
    c = _CLOCK.fullmatch(text)
    if c:
        hour, minute, sec = int(c.group(1)), int(c.group(2)), int(c.group(3) or 0)
        if hour > 23 or minute > 59 or sec > 59:
            raise bad_input(f"--since {value}: not a time of day", hint)
        day = time.localtime(now)
        return time.mktime((day.tm_year, day.tm_mon, day.tm_mday, hour, minute, sec, 0, 0, -1))
    if text.isascii() and 10 <= len(text) <= 40:
        from datetime import datetime

        try:
            return datetime.fromisoformat(text).timestamp()
        except (ValueError, OverflowError, OSError):
            pass
    raise bad_input(f"--since {value!r}: not a duration or a time", hint)


def _sources(job: str, replica: int | None) -> list[Source]:
    """The job's record (running or ended), and for a fleet its replicas' (one with
    ``--replica``); one line, exit 2, for a job this user has no record of."""
    from ttmesh.errors import bad_input
    from ttmesh.runtime import jobs

    records = {r["job"]: r for r in jobs.every()}
    record = records.get(job)
    if record is None:
        raise bad_input(
            f"no job '{job}' of yours (running, or ended and kept)",
            "ttmesh ps --all lists your jobs; ended ones are kept as TTMESH_JOB_HISTORY says",
        )
    fleet = record.get("fleet") if isinstance(record.get("fleet"), dict) else None
    if fleet is None:
        if replica is not None:
            raise bad_input(f"--replica {replica}: job {job} is no fleet", "drop --replica")
        return [Source(job, "", record)]
    replicas = [r for r in fleet.get("replicas") or [] if isinstance(r, dict)]
    if replica is not None:
        replicas = [r for r in replicas if r.get("replica") == replica]
        if not replicas:
            count = len(fleet.get("replicas") or [])
            raise bad_input(
                f"--replica {replica}: fleet {job} has {count} replicas",
                f"give 0..{count - 1}" if count else "drop --replica",
            )
    return [
        Source(str(r["job"]), f"replica{r.get('replica')}", records.get(str(r["job"]), {}))
        for r in replicas
        if isinstance(r.get("job"), str)
    ]


def _none_kept(job: str, sources: list[Source]) -> None:
    """No copy of the job's output is there: why, in one line (exit 2)."""
    from ttmesh.errors import bad_input

    if all(s.record and not s.record.get("logs") for s in sources):
        raise bad_input(
            f"job {job} kept no output (it ran with --no-logs)",
            "its output went to the console only; --log-dir keeps a copy of your own",
        )
    raise bad_input(
        f"job {job}'s output is not kept any more (older logs go first past TTMESH_LOGS_MB)",
        "raise TTMESH_LOGS_MB to keep more",
    )


def _attempt_not_kept(job: str, sources: list[Source], attempt: int) -> None:
    """``--attempt N`` the job did not run, or whose output is not kept: which ones are."""
    from ttmesh.errors import bad_input
    from ttmesh.runtime import logread

    kept: set[int] = set()
    for s in sources:
        found = logread.read(s.job)
        if found is not None:
            kept |= set(found.attempts)
            found.close()
    listed = ", ".join(str(a + 1) for a in sorted(kept)) or "none"
    raise bad_input(
        f"--attempt {attempt + 1}: job {job} keeps the output of attempts {listed}",
        "a job keeps its first attempt and its last two",
    )


def _check_rank(sources: list[Source], rank: int) -> None:
    from ttmesh.errors import bad_input
    from ttmesh.render import plural

    for s in sources:
        ranks = [r.get("rank") for r in s.record.get("ranks") or [] if isinstance(r, dict)]
        known = sorted(r for r in ranks if isinstance(r, int))
        if known and rank not in known:
            shown = f"{known[0]}..{known[-1]}" if len(known) > 1 else str(known[0])
            raise bad_input(
                f"--rank {rank}: job {s.job} has {plural(len(known), 'rank')} here",
                f"give {shown}",
            )


@dataclass
class Piece:
    """Bytes of one stream, or a line of ttmesh's own (``data`` then is text)."""

    when: float
    order: tuple[int, ...]
    label: str
    stream: Any  # logread.StreamFiles, or None for ttmesh's own line
    start: int
    end: int
    text: str = ""


@dataclass
class Snapshot:
    """Every piece shown so far, and where each stream was read to."""

    pieces: list[Piece]
    read_to: dict[tuple[str, int, str, str], int]
    attempts: dict[str, set[int]]
    kept: list[Any]
    missing: list[str]
    many_labels: bool = False

    def close(self) -> None:
        for k in self.kept:
            k.close()
        self.kept = []


def _label(source: Source, owner: str, ranks: int) -> str:
    who = f"r{owner}" if numeric.digits(owner) else owner
    if source.label:
        return source.label if ranks <= 1 and numeric.digits(owner) else f"{source.label}/{who}"
    return who


def collect(sources: list[Source], shown: Shown, read_to: dict | None = None) -> Snapshot:
    """Every piece of the streams asked for (from ``read_to``: where each was read to)."""
    from ttmesh.runtime import logread

    snap = Snapshot([], dict(read_to or {}), {}, [], [])
    labels: set[str] = set()
    for si, source in enumerate(sources):
        kept = logread.read(source.job)
        if kept is None:
            snap.missing.append(source.job)
            continue
        snap.kept.append(kept)
        ranks = len(source.record.get("ranks") or []) or 1
        for attempt, owners in kept.attempts.items():
            if shown.attempt is not None and attempt != shown.attempt:
                continue
            snap.attempts.setdefault(source.job, set()).add(attempt)
            for oi, (owner, streams) in enumerate(owners.items()):
                if shown.rank is not None and owner != str(shown.rank):
                    continue
                for name, files in streams.items():
                    if shown.stream != "both" and name != shown.stream:
                        continue
                    key = (source.job, attempt, owner, name)
                    label = _label(source, owner, ranks)
                    labels.add(label)
                    for p in files.pieces(snap.read_to.get(key, 0)):
                        if shown.since is not None and p.when < shown.since:
                            continue
                        order = (attempt, si, oi, STREAM_ORDER[name])
                        snap.pieces.append(Piece(p.when, order, label, files, p.start, p.end))
                    snap.read_to[key] = max(files.end, snap.read_to.get(key, 0))
    # Lines are labelled whenever they could be another rank's: a job of several ranks
    # (its record says), even when one alone printed (a silent stream keeps no files).
    several = shown.rank is None and any(len(s.record.get("ranks") or []) > 1 for s in sources)
    snap.many_labels = len(labels) > 1 or several
    snap.pieces.sort(key=lambda p: (p.order[0], p.when, p.order))
    _mark_attempts(snap, sources)
    return snap


def _mark_attempts(snap: Snapshot, sources: list[Source]) -> None:
    """A line of ttmesh's before each attempt's output, when more than one is shown."""
    if not any(len(a) > 1 for a in snap.attempts.values()):
        return
    seen: set[tuple[str, int]] = set()
    out: list[Piece] = []
    for p in snap.pieces:
        key = (p.label.split("/")[0] if p.label.startswith("replica") else "", p.order[0])
        if key not in seen:
            seen.add(key)
            who = f"{key[0]}: " if key[0] else ""
            out.append(Piece(p.when, p.order, "", None, 0, 0, f"ttmesh: {who}attempt {key[1] + 1}"))
        out.append(p)
    snap.pieces = out


def lines_of(snap: Snapshot, piece: Piece) -> list[bytes]:
    """A piece's lines as printed: prefixed with its rank when several are shown; what was
    not kept said in one line of ttmesh's."""
    if piece.stream is None:
        return [piece.text.encode()]
    prefix = f"[{piece.label}] ".encode() if snap.many_labels and piece.label else b""
    out: list[bytes] = []
    for _, data in piece.stream.read(piece.start, piece.end):
        if isinstance(data, int):
            out.append(prefix + _cut_line(data, piece.stream.name).encode())
            continue
        body = data[:-1] if data.endswith(b"\n") else data
        out.extend(prefix + line for line in body.split(b"\n"))
    return out


def _cut_line(count: int, stream: str) -> str:
    from ttmesh.runtime.joblogs import MiB

    size = f"{count / MiB:.1f} MiB" if count >= MiB else f"{count} bytes"
    return (
        f"ttmesh: {size} of this {stream} not kept here (a job keeps each stream's first and "
        "last bytes: TTMESH_JOB_LOG_MB)"
    )


def render(snap: Snapshot, tail: int | None) -> list[bytes]:
    """The lines to print (the last ``tail`` only: read from the end)."""
    if tail is None:
        return [line for p in snap.pieces for line in lines_of(snap, p)]
    if tail == 0:
        return []
    out: list[bytes] = []
    for p in reversed(snap.pieces):
        out[:0] = lines_of(snap, p)
        if len(out) >= tail:
            break
    return out[-tail:]


def _write(out: Any, lines: list[bytes]) -> None:
    if lines:
        out.write(b"\n".join(lines) + b"\n")
        out.flush()


def _follow(out: Any, sources: list[Source], shown: Shown, snap: Snapshot) -> None:
    """New output as it comes, until every job shown has ended (then what it wrote last)."""
    from ttmesh.runtime import jobs

    read_to, attempts = snap.read_to, {k: set(v) for k, v in snap.attempts.items()}
    many = snap.many_labels
    snap.close()
    live = Shown(shown.rank, shown.attempt, shown.stream, None)
    while True:
        ended = all(not _running(jobs, s.job) for s in sources)
        snap = collect(sources, live, read_to)
        snap.many_labels = snap.many_labels or many
        for p in snap.pieces:
            if p.stream is None:  # an attempt's line: only for an attempt not seen yet
                continue
            job_attempts = attempts.setdefault(_job_of(sources, p), set())
            if p.order[0] not in job_attempts:
                job_attempts.add(p.order[0])
                _write(out, [f"ttmesh: attempt {p.order[0] + 1}".encode()])
            _write(out, lines_of(snap, p))
        read_to = snap.read_to
        snap.close()
        if ended:
            return
        time.sleep(FOLLOW_EVERY)


def _job_of(sources: list[Source], piece: Piece) -> str:
    return sources[piece.order[1]].job


def _running(jobs: Any, job: str) -> bool:
    path = jobs.jobs_dir() / f"{job}.json"
    try:
        import json

        from ttmesh import fileread

        record = json.loads(fileread.read_text(str(path), 1 << 20, "job record"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and jobs.is_running(record)
