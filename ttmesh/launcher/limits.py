"""The numbers ``ttmesh launch`` takes, each bounded once: the command's options are typed from
this table (``cli.params.bounded``), and ``planning.options.Launch.from_options`` checks the
values a program gives ``ttmesh.launch`` by it, with the same line for the same mistake.

Imports nothing but :mod:`ttmesh.numeric`: ``ttmesh launch --help`` reads it."""

from __future__ import annotations

from typing import Any

from ttmesh import numeric

# LaunchOptions field -> (its flag, an example value, numeric.number's bounds)
NUMBERS: dict[str, tuple[str, str | None, dict[str, Any]]] = {
    "tp_size": (
        "--tp-size",
        "4",
        {"whole": True, "low": 1, "high": numeric.MAX_CHIPS, "unit": "chips"},
    ),
    "replicas": (
        "--replicas",
        "2",
        {"whole": True, "low": 1, "high": numeric.MAX_CHIPS, "unit": "replicas"},
    ),
    "events_fd": (
        "--events-fd",
        "3",
        {"whole": True, "low": 0, "high": 2**31 - 1, "unit": "file descriptor"},
    ),
    "nproc": (
        "--nproc-per-node",
        "2",
        {"whole": True, "low": 1, "high": numeric.MAX_CHIPS, "unit": "processes"},
    ),
    "symmetric_dram_mb": (
        "--symmetric-dram-mb",
        "2048",
        {"whole": True, "low": 1, "high": 1 << 20, "unit": "MB"},
    ),
    "master_port": ("--master-port", "29500", {"whole": True, "low": 0, "high": numeric.MAX_PORT}),
    "max_restarts": ("--max-restarts", "3", {"whole": True, "low": 0, "high": numeric.MAX_COUNT}),
    "node_rank": ("--node-rank", None, {"whole": True, "low": 0, "high": numeric.MAX_CHIPS}),
    "health_failures": (
        "--health-failures",
        "3",
        {"whole": True, "low": 1, "high": numeric.MAX_COUNT},
    ),
    # durations: 0 s allowed where it means "at once", not for a timeout or an interval
    "grace": ("--grace", "5", {"low": 0}),
    "fabric_grace": ("--fabric-grace", "20", {"low": 0}),
    "train_timeout": ("--train-timeout", "60", {"low": 0}),
    "op_timeout": ("--op-timeout", "60", {"low": 0, "low_open": True}),
    "heartbeat_timeout": ("--heartbeat-timeout", "5", {"low": 0, "low_open": True}),
    "rdzv_timeout": ("--rdzv-timeout", "300", {"low": 0, "low_open": True}),
    "health_interval": ("--health-interval", "10", {"low": 0, "low_open": True}),
    "probe_interval": ("--probe-interval", "60", {"low": 0, "low_open": True}),
    "probe_timeout": ("--probe-timeout", "60", {"low": 0, "low_open": True}),
    "ready_timeout": ("--ready-timeout", "600", {"low": 0, "low_open": True}),
    "hang_timeout": ("--hang-timeout", "900", {"low": 0, "low_open": True}),
}
for _flag, _example, _bounds in NUMBERS.values():  # a duration is at most numeric.MAX_SECONDS
    if not _bounds.get("whole"):
        _bounds.setdefault("high", numeric.MAX_SECONDS)
        _bounds["unit"] = "seconds"


def checked(values: dict[str, Any]) -> dict[str, Any]:
    """The numbers of ``values`` (LaunchOptions' fields by name; None: not given) checked and
    converted as the command's options are (``numeric.number``: "4" is 4, a bool or NaN no
    number), or one line naming the flag (exit 2)."""
    out = {}
    for name, value in values.items():
        if name in NUMBERS and value is not None:
            flag, example, bounds = NUMBERS[name]
            shown = f"{flag} {example}" if example else None
            out[name] = numeric.number(value, flag, **bounds, example=shown)
    return out
