"""A profile's flag rules, checked before anything starts (a start can take minutes of
compilation, so a rule that fails later wastes them).

A rule is data::

    - id: chunked-prefill
      severity: error                      # or warning (an error with --strict)
      when: [{flag: --tpu-compile-tokens}] # every condition must hold for the rule to apply
      check: {compare: [--chunked-prefill-size, "==", "max(--tpu-compile-tokens)"]}
      message: "--chunked-prefill-size {--chunked-prefill-size} is not ..."
      fix: "--chunked-prefill-size {max(--tpu-compile-tokens)}"

Conditions and checks: ``{flag: F}`` (given), ``{no_flag: F}``, ``{flag: F, in: [..]}`` and
``{flag: F, not_in: [..]}`` (its value, or the server's default), ``{model: REGEX}`` (the model
path), ``{env: NAME, equals: V}`` (the environment the server gets), ``{tp: {at_least: N}}`` /
``{tp: {at_most: N}}`` (chips), ``{compare: [A, OP, B]}`` with A and B a number, ``tp``, ``F``
(its first value) or ``max(F)``, OP one of == != >= <= > <. Messages and fixes name values as
``{F}``, ``{max(F)}``, ``{tp}``, ``{env:NAME}``.

A flag's value is what the server's own parser stores (``args.ServerArgs`` read with the
profile's flag table): a rule names a flag by one of its spellings, and every flag a rule reads
must be in the table (:func:`flags_read`, checked when the table is loaded).
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any

from ttmesh.dataclass import dataclass
from ttmesh.errors import bad_input
from ttmesh.launcher.serving.args import ServerArgs
from ttmesh.patterns import PatternError, compile_pattern

OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
MODEL_FLAGS = ("--model-path", "--model", "--model-name")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str  # error | warning
    message: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass
class Context:
    args: ServerArgs
    defaults: dict[str, str]
    env: dict[str, str]
    tp: int

    def text(self, flag: str) -> str | None:
        value = self.args.text(flag)
        return value if value is not None else self.defaults.get(flag)

    def number(self, expr: str | int | float) -> float | None:
        if isinstance(expr, int | float):
            return float(expr)
        expr = expr.strip()
        if expr == "tp":
            return float(self.tp)
        match = re.fullmatch(r"max\((--?[\w-]+)\)", expr)
        if match:
            values = self.args.numbers(match.group(1)) or _floats(
                [self.defaults.get(match.group(1))]
            )
            return max(values) if values else None
        if expr.startswith("-"):
            values = self.args.numbers(expr) or _floats([self.defaults.get(expr)])
            return values[0] if values else None
        return _floats([expr])[0] if _floats([expr]) else None

    def model(self) -> str:
        # A model flag, or an entry point's positional (`vllm serve MODEL`); a script's name
        # (`python serve.py`) is not a model.
        positional = self.args.positionals[0] if self.args.positionals else ""
        return next((v for f in MODEL_FLAGS if (v := self.args.text(f))), "") or positional


def _floats(texts: list[str | None]) -> list[float]:
    out = []
    for t in texts:
        try:
            number = float(t)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out.append(number)
    return out


def _pretty(value: float | None) -> str:
    if value is None:
        return "(not given)"
    return str(int(value)) if value == int(value) else str(value)


def holds(cond: dict[str, Any], ctx: Context) -> bool:
    if "compare" in cond:
        a, op, b = cond["compare"]
        left, right = ctx.number(a), ctx.number(b)
        return left is not None and right is not None and OPS[op](left, right)
    if "model" in cond:
        return compile_pattern(str(cond["model"]), ignore_case=True).search(ctx.model()) is not None
    if "env" in cond:
        return ctx.env.get(cond["env"]) == str(cond["equals"])
    if "tp" in cond:
        bound = cond["tp"]
        return ctx.tp >= bound.get("at_least", 0) and ctx.tp <= bound.get("at_most", ctx.tp)
    if "no_flag" in cond:
        return not ctx.args.has(cond["no_flag"])
    if "flag" in cond:
        flag = cond["flag"]
        if "in" in cond or "not_in" in cond:
            value = (ctx.text(flag) or "").lower()
            if "in" in cond:
                return value in {str(v).lower() for v in cond["in"]}
            return value not in {str(v).lower() for v in cond["not_in"]}
        return ctx.args.has(flag)
    raise ValueError(f"unknown rule condition {cond!r}")


def fill(template: str, ctx: Context) -> str:
    """``{--flag}``, ``{max(--flag)}``, ``{tp}``, ``{env:NAME}`` replaced by their values."""

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key.startswith("env:"):
            return ctx.env.get(key[4:], "(unset)")
        if key.startswith("-") and not key.startswith("max("):
            text = ctx.text(key)
            return text if text is not None else "(not given)"
        return _pretty(ctx.number(key))

    return re.sub(r"\{([^{}]+)\}", value, template)


def check_patterns(rules: list[dict[str, Any]], source: str) -> None:
    """Refuse (exit 2) a ``model:`` pattern RE2 cannot run, naming the profile and the rule,
    before any rule is asked (patterns are matched in linear time: ttmesh.patterns)."""
    for rule in rules:
        for cond in _conditions(rule):
            if "model" not in cond:
                continue
            try:
                compile_pattern(str(cond["model"]), ignore_case=True)
            except PatternError as exc:
                raise bad_input(
                    f"profile {source}: rule {rule.get('id', '?')}: model pattern "
                    f"{cond['model']!r}: {exc}",
                    exc.hint,
                ) from None


_TEMPLATE_FLAG = re.compile(r"\{(max\()?(--?[\w-]+)\)?\}")
_EXPR_FLAG = re.compile(r"(max\()?(--?[\w-]+)\)?")


def flags_read(rules: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """Every flag the rules read: ``(rule id, flag, read as a number)``. Each must be one of
    the server's flags (its table), and one read as a number must be one the server converts
    to a number; a rule naming anything else is refused when the table is loaded."""
    out: list[tuple[str, str, bool]] = []
    for rule in rules:
        rid = str(rule.get("id", "?"))
        for cond in _conditions(rule):
            for key in ("flag", "no_flag"):
                if isinstance(cond.get(key), str):
                    out.append((rid, cond[key], False))
            for operand in cond.get("compare") or []:
                match = _EXPR_FLAG.fullmatch(operand.strip()) if isinstance(operand, str) else None
                if match:
                    out.append((rid, match.group(2), True))
        for key in ("message", "fix"):
            for match in _TEMPLATE_FLAG.finditer(str(rule.get(key, ""))):
                out.append((rid, match.group(2), bool(match.group(1))))
    return out


def _conditions(rule: dict[str, Any]) -> list[dict[str, Any]]:
    checks = rule.get("check") or []
    every = [*(rule.get("when") or []), *(checks if isinstance(checks, list) else [checks])]
    return [c for c in every if isinstance(c, dict)]


def check(rules: list[dict[str, Any]], ctx: Context, source: str = "profile") -> list[Finding]:
    """The findings of every rule that applies and fails (``source``: the profile's file)."""
    check_patterns(rules, source)
    out = []
    for rule in rules:
        when = rule.get("when") or []
        if not all(holds(c, ctx) for c in when):
            continue
        checks = rule["check"] if isinstance(rule["check"], list) else [rule["check"]]
        if all(holds(c, ctx) for c in checks):
            continue
        out.append(
            Finding(
                rule=str(rule["id"]),
                severity=str(rule.get("severity", "error")),
                message=fill(str(rule["message"]), ctx),
                fix=fill(str(rule.get("fix", "")), ctx),
            )
        )
    return out
