"""Numbers people give ttmesh (flags, profiles, the environment, rank bindings), read strictly.

Python's ``float()`` takes ``nan``, ``inf``, ``1e400`` (infinity), ``1_000`` and digits of any
script, and ``int()`` takes ``True`` and ``1.9``. Every one of these reached a timer or a count
once: ``--grace nan`` made a SIGKILL that never came. Here a number is plain ASCII decimal
(``5``, ``0.5``, ``2.5e3``), finite, and inside the range its use allows; anything else is one
line naming where the value came from (``--grace``, ``SLURM_NNODES``, ``profile FILE:
stop.grace``), what is wrong, and the range to give. Bounds keep values where the code using
them works: a timeout handed to ``select``, a count written into a JSON document.
"""

from __future__ import annotations

import math
import re

from ttmesh.errors import TTMeshError, bad_input

# A longest wait any option asks for: 30 days. Longer waits are a typo (or an infinity).
MAX_SECONDS = 30 * 24 * 3600.0
# Chips or processes of one job (a cluster of Galaxies is thousands, not millions).
MAX_CHIPS = 65536
# Restarts, retries, failures in a row: any count a person means.
MAX_COUNT = 1_000_000
# The highest TCP port.
MAX_PORT = 65535

# The digit rule: a digit is 0-9 (ASCII). ``str.isdigit()``, ``\d`` in a pattern and ``int()``
# also take digits of other scripts and superscripts (``int('٣')`` is 3; ``'²'.isdigit()`` is
# true and ``int('²')`` raises): a value one program reads as a number and another does not.
# Every digit ttmesh reads is checked by :func:`digits` or matched by a pattern of ``[0-9]``
# (tests/test_numbers_output.py fails on any other test of digits in ttmesh).
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)
_WHOLE = re.compile(r"[-+]?[0-9]+", re.ASCII)


def _shown(value: object) -> str:
    """The value as the user wrote it, short (quoted when empty or spaced)."""
    text = value if isinstance(value, str) else repr(value)
    if not text.strip() or text != text.strip() or " " in text:
        text = repr(text)
    return text if len(text) <= 40 else text[:39] + "…"


def span(low: float | None, high: float | None, low_open: bool, whole: bool, unit: str) -> str:
    """What to give, in words: ``seconds from 0 to 2592000``, ``a whole number from 1 to 8``."""
    what = f"a whole number{f' of {unit}' if unit else ''}" if whole else (unit or "a number")

    def fmt(x: float) -> str:
        return str(int(x)) if whole or float(x).is_integer() else f"{x:g}"

    if low is not None and low_open:
        rest = f"more than {fmt(low)}" + (f", at most {fmt(high)}" if high is not None else "")
    elif low is not None and high is not None:
        rest = f"from {fmt(low)} to {fmt(high)}"
    elif low is not None:
        rest = f"at least {fmt(low)}"
    elif high is not None:
        rest = f"at most {fmt(high)}"
    else:
        return what
    return f"{what} {rest}"


def number(
    value: object,
    where: str,
    *,
    whole: bool = False,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    unit: str = "",
    example: str | None = None,
) -> float:
    """``value`` (a str, int or float; never a bool) as a finite number in range, else bad
    input (exit 2): ``ttmesh: WHERE VALUE: what is wrong (give RANGE, e.g. EXAMPLE)``.

    ``where`` names the value's source as the user wrote it; ``whole`` asks for an integer
    (then the result is an ``int``, else a ``float``); ``low_open`` excludes ``low`` itself."""
    hint = f"give {span(low, high, low_open, whole, unit)}" + (
        f", e.g. {example}" if example else ""
    )

    def wrong(problem: str) -> TTMeshError:
        return bad_input(f"{where} {_shown(value)}: {problem}", hint)

    parsed: float
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise wrong("not a number")
    if isinstance(value, str):
        text = value.strip()
        if _WHOLE.fullmatch(text):
            if len(text.lstrip("+-")) > 30:
                raise wrong("too large" if not text.startswith("-") else "too small")
            parsed = int(text)
            if whole and text[0] in "+-" and parsed >= 0 and low is not None and low >= 0:
                raise wrong("digits only, no sign")  # a count is digits: -0 and +3 are typos
        elif _DECIMAL.fullmatch(text) and not whole:
            parsed = float(text)
        else:
            raise wrong(
                "not a whole number" if whole and _DECIMAL.fullmatch(text) else "not a number"
            )
    else:
        parsed = value
    if isinstance(parsed, float) and math.isnan(parsed):
        raise wrong("not a number")
    if isinstance(parsed, float) and math.isinf(parsed):
        raise wrong("too large" if parsed > 0 else "too small")
    if whole and isinstance(parsed, float):
        if not parsed.is_integer():
            raise wrong("not a whole number")
        parsed = int(parsed)
    if low is not None and (parsed < low or (low_open and parsed == low)):
        if low == 0 and parsed < 0:
            raise wrong("cannot be negative")
        raise wrong(f"must be more than {low:g}" if low_open and parsed == low else "too small")
    if high is not None and parsed > high:
        raise wrong("too large")
    return parsed if whole else float(parsed)


def seconds(
    value: object,
    where: str,
    *,
    zero: bool = True,
    high: float = MAX_SECONDS,
    example: str | None = None,
) -> float:
    """A duration: finite, not negative (with ``zero`` False: more than 0), at most ``high``."""
    return float(
        number(value, where, low=0, low_open=not zero, high=high, unit="seconds", example=example)
    )


def count_in(text: str, high: int = MAX_COUNT) -> int | None:
    """``text`` as a count when it is plain ASCII digits (:func:`digits`) and at most ``high``,
    else None: for words another program wrote (a command line read from ``/proc``), where a
    word that is no number is not an error. ``str.isdigit`` says yes to ``²`` (which ``int``
    refuses) and to ``٣`` (which ``int`` reads as 3): neither is a number here."""
    if not _DIGITS.fullmatch(text) or len(text) > 30:
        return None
    value = int(text)
    return value if value <= high else None


def whole(
    value: object,
    where: str,
    *,
    low: int | None = 0,
    high: int | None = MAX_COUNT,
    unit: str = "",
    example: str | None = None,
) -> int:
    """An integer in ``low..high`` (strings of ASCII digits; never a bool or 1.5)."""
    return int(number(value, where, whole=True, low=low, high=high, unit=unit, example=example))


def digits(text: str) -> bool:
    """``text`` is one or more ASCII digits, nothing else (the digit rule, above)."""
    return _DIGITS.fullmatch(text) is not None


def port(value: object, where: str, *, zero: bool = False, example: str | None = None) -> int:
    """A TCP port, 1..65535 (with ``zero``: 0 too, "any free one"): given as text, ASCII
    digits alone, as torchrun's endpoint rule has it (no sign, no space: ``host:+5``)."""
    low = 0 if zero else 1
    if isinstance(value, str) and not digits(value) and _WHOLE.fullmatch(value.strip()):
        hint = f"give {span(low, MAX_PORT, False, True, '')}" + (
            f", e.g. {example}" if example else ""
        )
        raise bad_input(f"{where} {_shown(value)}: digits only, no sign or space", hint)
    return whole(value, where, low=low, high=MAX_PORT, example=example)
