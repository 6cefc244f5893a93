"""The job's log directory, made once when its ranks' streams go to files (``--log-dir``,
``--redirects``, ``--tee``): ``LOG_DIR/<run id>_<random>``, as torchrun's ``DefaultLogsSpecs``
makes it (``tempfile.mkdtemp``). Apart from the spec (:mod:`ttmesh.launcher.planning.logspec`,
read by every launch) so that a launch without log files never imports ``tempfile`` and
``secrets`` (and through them ``random``, ``hashlib``, OpenSSL).
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from dataclasses import replace

from ttmesh.errors import bad_input, from_os_error
from ttmesh.launcher.planning.logspec import LogSpec


def make_run_dir(spec: LogSpec, log_dir: str | None, run_id: str) -> LogSpec:
    """``LOG_DIR/<run id>_<random>`` (a new ``torchelastic_*`` base directory under the
    temporary directory when no ``--log-dir`` is given), made and opened once for the job:
    ``spec`` with its ``run_dir`` and ``dir_fd``.

    ``LOG_DIR`` is reached and made as ``paths.walk`` does (a symbolic link is followed only
    when root or this user owns it); the job's directory is new (mode 0700, as ``mkdtemp``
    makes it) and opened relative to it, so what another user can rename in ``LOG_DIR`` never
    redirects a write."""
    from ttmesh import paths

    base = log_dir
    try:
        base = base or tempfile.mkdtemp(prefix="torchelastic_")
        base_fd, _ = paths.walk(base, what="--log-dir", create=True)
        try:
            name, fd = _new_dir(base_fd, run_id, base)
        finally:
            os.close(base_fd)
    except OSError as exc:
        raise from_os_error(exc, "create the log directory", base) from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        raise bad_input(
            f"--log-dir {base}: {name} was changed by another user", "give a private --log-dir"
        )
    return replace(spec, run_dir=os.path.join(base, name), dir_fd=fd)


def _new_dir(base_fd: int, prefix: str, base: str) -> tuple[str, int]:
    """``mkdtemp`` relative to a directory descriptor: (the name, the new directory open).
    An error names the whole path (``base``/name)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789_"
    for _ in range(100):
        name = f"{prefix}_" + "".join(secrets.choice(alphabet) for _ in range(8))
        try:
            os.mkdir(name, 0o700, dir_fd=base_fd)
        except FileExistsError:
            continue
        except OSError as exc:
            exc.filename = os.path.join(base, name)
            raise
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        return name, os.open(name, flags, dir_fd=base_fd)
    raise FileExistsError(f"no free name for {prefix}_* after 100 tries")
