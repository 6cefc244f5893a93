"""Secrets out of what a support bundle carries: environment values, command lines, job records
and the ranks' last lines go to someone else.

Replaced by ``***`` (what is around them stays, so the line still reads):

* a variable whose name says it holds a secret (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``,
  ``*PASSWD*``, ``*_KEY``, ``*APIKEY*``, ``*CREDENTIAL*``, ``*AUTH*``, ``*COOKIE*``,
  ``*SESSION*``, ``*PRIVATE*``): its whole value;
* in any text: the user and password of a URL (``https://user:pass@host``); the value after a
  flag or key with such a name (``--api-key X``, ``--hf-token=X``, ``password: X``,
  ``"token": "X"``, ``TOKEN=X``); ``Authorization:`` and ``Bearer`` values; tokens of known
  shapes (Hugging Face ``hf_``, GitHub ``ghp_``/``github_pat_``, OpenAI-style ``sk-``, Slack
  ``xox?-``, AWS access key ids ``AKIA``, JWTs); PEM private key blocks.

Every pattern is linear in its input (RE2 where it is installed, ``re`` otherwise with no
nested repeats): a log line of megabytes costs one pass.
"""

from __future__ import annotations

import re
from typing import Any

MARK = "***"
# A key or flag that names a secret: the secret word last (``hf_token``, ``api-key``,
# ``db_password``; never ``max_total_tokens`` or ``num_key_value_heads``).
_NAME = (
    r"(?:[A-Za-z0-9]+[_-])*(?:token|secret|password|passwd|api[_-]?key|access[_-]?key(?:[_-]id)?"
    r"|secret[_-]?key|private[_-]?key|credentials?|cookie|session[_-]?id)(?![A-Za-z0-9_-])"
)
SECRET_NAME = re.compile(
    r"(?i)(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|PWD|APIKEY|API_KEY|KEY|CREDENTIALS?|AUTH|"
    r"COOKIE|SESSION|PRIVATE)(?:_|$)|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL"
)
_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # PEM private keys, whole blocks (a line at a time: the body lines go too).
    (re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[\s\S]{0,20000}?-----END [A-Z ]{0,40}PRIVATE KEY-----"),
     "-----BEGIN PRIVATE KEY-----***-----END PRIVATE KEY-----"),
    # scheme://user:password@host, scheme://token@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,20}://)[^/\s:@'\"]{1,256}(?::[^/\s@'\"]{0,256})?@"),
     r"\1***@"),
    # Authorization headers and bearer tokens
    (re.compile(r"(?i)\b(authorization\s*[:=]\s*)(?:(bearer|basic|token)\s+)?[^\s'\",;]{1,4096}"),
     r"\1\2 ***"),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{4,4096}"), r"\1***"),
    # --flag value / --flag=value / key: value / key=value / "key": "value" for secret names
    (re.compile(r"(?i)(--?" + _NAME + r")(\s+|=)(?!-)('[^']{0,4096}'|\"[^\"]{0,4096}\"|[^\s'\"]{1,4096})"),
     r"\1\2***"),
    (re.compile(r"(?i)([\"']?\b" + _NAME + r"[\"']?\s{0,8}[:=]\s{0,8})('[^']{0,4096}'|\"[^\"]{0,4096}\"|[^\s,;'\"}]{1,4096})"),
     r"\1***"),
    # tokens of known shapes, wherever they are
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), MARK),
    (re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"), MARK),
    (re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"), MARK),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), MARK),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MARK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), MARK),
]  # fmt: skip


def secret_name(name: str) -> bool:
    """A variable or key whose name says it holds a secret."""
    return bool(SECRET_NAME.search(name.upper()))


def text(value: str) -> tuple[str, int]:
    """``value`` with every secret replaced; how many replacements."""
    count = 0
    for pattern, repl in _PATTERNS:
        value, n = pattern.subn(repl, value)
        count += n
    return value, count


def data(value: bytes) -> tuple[bytes, int]:
    """Bytes (a log's tail, a file) redacted as text; invalid UTF-8 kept as it was around."""
    out, n = text(value.decode("utf-8", errors="surrogateescape"))
    return out.encode("utf-8", errors="surrogateescape"), n


def variable(name: str, value: str) -> tuple[str, int]:
    """An environment variable's value: all of it when its name says secret, else its text."""
    if secret_name(name):
        return MARK, 1
    return text(value)


def document(obj: Any, depth: int = 0) -> tuple[Any, int]:
    """A JSON document (a job record) with every secret replaced: values under a secret
    key whole, every other string as text. Nesting deeper than 64 is cut (``***``)."""
    if depth > 64:
        return MARK, 1
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, list):
        out, total = [], 0
        for item in obj:
            new, n = document(item, depth + 1)
            out.append(new)
            total += n
        return out, total
    if isinstance(obj, dict):
        result: dict[str, Any] = {}
        total = 0
        for key, item in obj.items():
            if isinstance(key, str) and secret_name(key) and isinstance(item, (str, int, float)):
                result[key] = MARK
                total += 1
                continue
            new, n = document(item, depth + 1)
            result[str(key)] = new
            total += n
        return result, total
    return obj, 0
