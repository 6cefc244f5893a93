"""Regular expressions a user gives ttmesh, matched in linear time (RE2).

A ``--ready-pattern`` is matched against every line a rank prints, in the guardian, the one
process that can stop the job. Python's backtracking ``re`` takes exponential time on patterns
such as ``(a+)+$`` against ``aaaa...a!`` and, while it matches, the guardian handles no
signal: the job became deaf to Ctrl-C, SIGTERM and ``ttmesh stop`` at 100 % CPU, its chips
leased. Every pattern from outside ttmesh's code (``--ready-pattern``, a profile's ``model:``
conditions, the table of known failures) is compiled here with RE2 (google-re2), whose
matching time is linear in the text whatever the pattern. What RE2 cannot run in linear time
(backreferences, lookaround, possessive or atomic groups) is refused when the pattern is read,
saying why; nothing is matched with ``re`` as a fallback.

``re2`` is imported only when a pattern is compiled: a launch without one does not pay for it.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Protocol

__all__ = ["Matcher", "PatternError", "compile_pattern", "deferred_pattern"]


class Matcher(Protocol):
    """A compiled pattern: what ttmesh asks of one."""

    @property
    def pattern(self) -> str: ...

    def search(self, text: Any) -> Any:
        """A match (``group(n)``, as ``re``'s) or None; ``text`` is str, or bytes."""
        ...


class PatternError(ValueError):
    """A pattern that cannot be used; ``str()`` says why in a few words, ``hint`` how to fix it."""

    def __init__(self, why: str, hint: str) -> None:
        super().__init__(why)
        self.hint = hint


# What Python's re accepts and RE2 refuses, by what the pattern says, most telling first.
_UNSUPPORTED: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"\\[1-9]|\(\?P="),
        "a backreference needs backtracking, which RE2 does not do",
        "match the repeated text literally, or drop the backreference",
    ),
    (
        re.compile(r"\(\?<?[=!]"),
        "lookahead and lookbehind need backtracking, which RE2 does not do",
        "match the surrounding text instead, e.g. 'ready(?=:)' as 'ready:'",
    ),
    (
        re.compile(r"\(\?>|[*+?}][+]"),
        "atomic groups and possessive repeats are not supported by RE2",
        "drop the '+' after the repeat, or the '?>'",
    ),
    (
        re.compile(r"\(\?\("),
        "conditional groups are not supported by RE2",
        "write the alternatives out with '|'",
    ),
    (
        re.compile(r"\\Z"),
        "RE2 writes the end of the text as \\z, not \\Z",
        "use \\z, or $",
    ),
    (
        re.compile(r"\\[uUN]"),
        "RE2 writes a character by its code as \\x{...}, not \\u or \\N{...}",
        "e.g. \\x{e9} for \\u00e9",
    ),
    (
        re.compile(r"\(\?#"),
        "comments (?#...) are not supported by RE2",
        "remove the comment",
    ),
)
_HINT = "see https://github.com/google/re2/wiki/Syntax for what RE2 accepts"


def compile_pattern(pattern: str, ignore_case: bool = False) -> Matcher:
    """``pattern`` compiled with RE2 (``search`` in linear time), or :class:`PatternError`."""
    return _compile(pattern, ignore_case)


def deferred_pattern(pattern: str, ignore_case: bool = False) -> Matcher:
    """``pattern`` compiled on its first ``search``: for ttmesh's own tables, checked whole by
    their tests, which every guardian loads but most jobs never search (their live lines are
    looked for by words first). A pattern from a user is compiled at once, to be refused at once."""
    return _Deferred(pattern, ignore_case)


class _Deferred:
    def __init__(self, pattern: str, ignore_case: bool) -> None:
        self._pattern = pattern
        self._ignore_case = ignore_case
        self._compiled: Matcher | None = None

    @property
    def pattern(self) -> str:
        return self._pattern

    def search(self, text: Any) -> Any:
        if self._compiled is None:  # two threads at once compile it twice: the same value
            self._compiled = _compile(self._pattern, self._ignore_case)
        return self._compiled.search(text)


@functools.lru_cache(maxsize=256)
def _compile(pattern: str, ignore_case: bool) -> Matcher:
    import re2

    options = re2.Options()
    options.log_errors = False  # RE2 would log to stderr, past ttmesh's one line
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(pattern, options)
    except UnicodeError:
        raise PatternError("not valid UTF-8 text", "give the pattern as text") from None
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        said = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        for regex, why, hint in _UNSUPPORTED:
            if regex.search(pattern):
                raise PatternError(why, hint) from None
        raise PatternError(f"not a regular expression RE2 can run ({said})", _HINT) from None
