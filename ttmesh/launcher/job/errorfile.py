"""The launcher's own ``TORCHELASTIC_ERROR_FILE``: the job's root cause, in torchrun's JSON.

A scheduler that runs torchrun (TorchX, for one) sets ``TORCHELASTIC_ERROR_FILE`` on the
launcher and reads it after a failure. torchrun's ``@record`` main writes it: the failing
rank's own error file (its ``@record``), with ``message.errorCode`` set to the rank's exit code
(``ErrorHandler.dump_error_file``), or, when torchrun itself was stopped by a signal, its
``SignalException`` (``ErrorHandler.record_exception``). ttmesh writes the same, and also when
the failing rank recorded nothing (torchrun then writes nothing): the rank's reason, its last
stderr lines as the call stack, its code.

Each rank still gets a ``TORCHELASTIC_ERROR_FILE`` of its own in the run directory (the plan);
this is the launcher's, named in ttmesh's own environment, and written as the user's files
are (``paths.write_text``: never through a link another user planted).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ttmesh import paths, procs
from ttmesh.errors import TTMeshError
from ttmesh.render import json_text

ENV = "TORCHELASTIC_ERROR_FILE"


def _rank_record(path: str | None) -> dict[str, Any] | None:
    """What a rank recorded with torch's ``@record`` (bounded; anything else: None)."""
    if not path:
        return None
    from ttmesh import fileread

    try:
        data = json.loads(fileread.read_bytes(path, fileread.MiB, "error file"))
    except (OSError, ValueError):  # fileread.Refused is a ValueError
        return None
    return data if isinstance(data, dict) and "message" in data else None


def root_cause(final: Any, plan: Any, signal: int | None) -> dict[str, Any] | None:
    """The launcher's error file for how the job ended (None: it succeeded)."""
    if final.code == 0:
        return None
    now = str(int(time.time()))
    if signal is not None:  # torchrun's SignalException, recorded by its @record main
        return {
            "message": {
                "message": f"SignalException: Process {os.getpid()} got signal: {signal}",
                "extraInfo": {"py_callstack": final.reason, "timestamp": now},
            }
        }
    rank = final.rank
    if rank is not None and 0 <= rank < len(plan.ranks):
        record = _rank_record(plan.ranks[rank].env.get(ENV))
        if record is not None:
            if isinstance(record["message"], dict):  # torchrun overrides the code alike
                record["message"]["errorCode"] = final.code
            return record
    return {
        "message": {
            "message": final.reason,
            "extraInfo": {"py_callstack": "\n".join(final.stderr_tail), "timestamp": now},
            "errorCode": final.code,
        }
    }


def write(final: Any, plan: Any, environ: dict[str, str] | None = None) -> str | None:
    """Write the launcher's error file when ttmesh's environment names one; the line saying
    why it could not be, or None. Called before the run directory (the ranks' files) goes."""
    path = (environ if environ is not None else os.environ).get(ENV)
    if not path:
        return None
    # A signal to ttmesh stopped the job: its reason ends as stop_reason gives it.
    by_signal = (
        final.source == "ttmesh"
        and final.rank is None
        and 128 < final.code < 128 + 65
        and final.reason.endswith(f"({procs.signal_name(final.code - 128)})")
    )
    signal = final.code - 128 if by_signal else None
    data = root_cause(final, plan, signal)
    if data is None:
        return None
    try:
        paths.write_text(path, json_text(data), ENV)
    except TTMeshError as err:
        return str(err)
    return None
