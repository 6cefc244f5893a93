"""Where each rank's output goes, as torchrun's users ask for it (``--redirects``, ``--tee``,
``--log-dir``, ``--local-ranks-filter``, ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``).

torch 2.13's ``DefaultLogsSpecs`` is the model: a value ``0``-``3`` (none, stdout, stderr, both)
for every local rank, or a map ``0:1,1:2`` (ranks not named: 0); the files go to
``LOG_DIR/<run id>_<random>/attempt_<N>/<local rank>/stdout.log`` and ``stderr.log``, the run
directory made once per job (:mod:`ttmesh.launcher.job.logdir`, only when there are files),
one ``attempt_N`` per restart. A stream that is redirected and not tee'd leaves the console;
with ``-r``/``-t`` and no ``--log-dir`` the files go to a new ``torchelastic_*`` directory, as
torchrun's do. ttmesh's own habit stays: with a log
directory every stream of every rank is written (torchrun writes only the streams named).

The run directory is opened once (no symbolic link followed, checked to be this user's) and
every file below it is made relative to that descriptor: a base directory another user can
write (``/tmp``) cannot swap it for a link between the check and the writes.
"""

from __future__ import annotations

import os
import re
import stat

from ttmesh import numeric
from ttmesh.dataclass import dataclass, field
from ttmesh.errors import bad_input

NONE, OUT, ERR, ALL = 0, 1, 2, 3
BITS = {"stdout": OUT, "stderr": ERR}
_VALUE = re.compile(r"[0-3]")
_MAP = re.compile(r"[0-9]{1,5}:[0-3](,[0-9]{1,5}:[0-3])*", re.ASCII)
_STD_HINT = "0 none, 1 stdout, 2 stderr, 3 both, or per local rank: e.g. 0:1,1:2"


def parse_std(value: str | None, flag: str) -> int | dict[int, int]:
    """torchrun's ``--redirects``/``--tee`` value: one number for every rank, or a map."""
    if value is None:
        return NONE
    text = value.strip()
    if _VALUE.fullmatch(text):
        return int(text)
    if _MAP.fullmatch(text):
        out: dict[int, int] = {}
        for item in text.split(","):
            rank, _, std = item.partition(":")
            out[int(rank)] = int(std)
        return out
    raise bad_input(f"{flag} {value!r}: not 0-3 or a map of local ranks", _STD_HINT)


def parse_ranks(value: str | None, flag: str = "--local-ranks-filter") -> set[int] | None:
    """torchrun's ``--local-ranks-filter 0,1,2``: local ranks, comma-separated."""
    if value is None:
        return None
    items = [v.strip() for v in value.split(",")]
    if not items or not all(numeric.digits(v) and len(v) <= 5 for v in items):
        raise bad_input(f"{flag} {value!r}: expected rank numbers", f"e.g. {flag} 0,2")
    return {int(v) for v in items}


def _of(spec: int | dict[int, int], rank: int) -> int:
    return spec if isinstance(spec, int) else spec.get(rank, NONE)


@dataclass(frozen=True)
class LogSpec:
    """What the user asked for the ranks' streams; the same on every attempt. Frozen: the
    job's directory, once made, is a new one (``launcher.job.logdir.make_run_dir``)."""

    redirects: int | dict[int, int] = NONE
    tee: int | dict[int, int] = NONE
    template: str | None = None  # TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    run_dir: str | None = None  # LOG_DIR/<run id>_<random>: attempt_N/ go here
    dir_fd: int | None = field(default=None, repr=False)  # run_dir, opened once

    @property
    def files_wanted(self) -> bool:
        """A stream is redirected or tee'd: the files need a directory (a temporary one
        when --log-dir is not given, as torchrun's)."""
        return self.redirects != NONE or self.tee != NONE

    def on_console(self, rank: int, name: str) -> bool:
        """Redirected and not tee'd: the file only."""
        bit = BITS[name]
        return not (_of(self.redirects, rank) & bit and not _of(self.tee, rank) & bit)

    def prefix(self, rank: int, local_rank: int, role: str = "default") -> str | None:
        """torchrun's substitutions: ``${role_name}``, ``${rank}`` (global), ``${local_rank}``;
        anything else is left as written (``Template.safe_substitute``)."""
        if self.template is None:
            return None
        from string import Template  # only with a template: most launches have none

        return Template(self.template).safe_substitute(
            role_name=role, rank=rank, local_rank=local_rank
        )

    def open_log(self, attempt: int, owner: str, name: str, suffix: str = ".log") -> int | None:
        """A new file ``attempt_N/<owner>/<name>.log`` under the run directory, opened for
        appending (None when the job has no log directory)."""
        if self.dir_fd is None:
            return None
        fd = self.dir_fd
        opened: list[int] = []
        try:
            for part in (f"attempt_{attempt}", owner):
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                opened.append(fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(f"{name}{suffix}", flags, 0o644, dir_fd=fd)
        finally:
            for d in opened:
                os.close(d)

    def keep_error(self, attempt: int, owner: str, source: str) -> None:
        """A copy of the rank's ``TORCHELASTIC_ERROR_FILE`` as ``attempt_N/<owner>/error.json``,
        torchrun's place for it. The rank writes it in the job's private run directory (a
        rank writing by path into a shared log directory could be sent elsewhere by a link);
        the copy is made here, through the run directory's descriptor. Nothing when the rank
        wrote none."""
        if self.dir_fd is None:
            return
        from ttmesh import fileread

        try:  # bounded, never a link, FIFO or device: a rank may leave anything there
            if not stat.S_ISREG(os.lstat(source).st_mode):
                return
            data = fileread.read_bytes(source, fileread.MiB, "error file")
        except (OSError, ValueError):  # none written (fileread.Refused is a ValueError)
            return
        fd = self.open_log(attempt, owner, "error", suffix=".json")
        if fd is not None:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
