"""What never goes into the journal: credentials, and values too large or not JSON.

Input the caller controls (task state, stored arguments, operator receipts) is refused with
UnsafeValue naming the path. A receipt comes back after the effect happened, so a bad one must
never cost the confirmation: it is reduced (secrets redacted, or the whole receipt replaced by
a note) and a ReceiptWarning names what was dropped.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import re
import sys
import warnings
from typing import Any

from intentlog._errors import UnsafeValue

__all__ = [
    "DEFAULT_MAX_BYTES",
    "REDACTED",
    "ReceiptWarning",
    "check_safe",
    "clean_receipt",
    "dumps_bounded",
    "scrub_text",
]

DEFAULT_MAX_BYTES = 64 * 1024
REDACTED = "[redacted by intentlog]"

# Names under which values are treated as credentials. A name is split into words
# (snake_case, kebab-case, camelCase); it counts if one word, or two adjacent words, match.
# Whole words, so "max_tokens" or "signature_required" are ordinary data, "access_token",
# "X-Api-Key" and "apiKey" are not.
_SECRET_WORDS = frozenset(
    {"authorization", "password", "passwd", "passphrase", "pwd", "token", "secret", "cookie",
     "credential", "credentials", "bearer", "apikey", "privatekey", "accesskey", "secretkey"}
)  # fmt: skip
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
     ("session", "key"), ("session", "id"), ("client", "secret")}
)  # fmt: skip
_WORD_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
# Values that look like credentials whatever their name.
_SECRET_VALUE_RES = (
    re.compile(r"^\s*(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"^eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*$"),  # a JWT
    re.compile(r"^(sk|rk)_(live|test)_[A-Za-z0-9]{8,}$"),  # Stripe-style secret keys
    re.compile(r"^(ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{16,}$"),  # GitHub tokens
    re.compile(r"^xox[abprs]-[A-Za-z0-9-]{10,}$"),  # Slack tokens
    re.compile(r"^AKIA[0-9A-Z]{16}$"),  # AWS access key ids
    re.compile(r"^[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"),  # URL with a password
)


def _one_pattern(patterns: list[re.Pattern[str]]) -> re.Pattern[str]:
    return re.compile(
        "|".join(
            f"(?i:{p.pattern})" if p.flags & re.IGNORECASE else f"(?:{p.pattern})" for p in patterns
        )
    )


# The same shapes as two patterns, so a string costs two regex calls instead of eight: those
# anchored at the start, tried only there, and the rest, searched for (each starts with a
# literal, which the search skips to).
_SECRET_VALUE_START = _one_pattern([p for p in _SECRET_VALUE_RES if p.pattern.startswith("^")])
_SECRET_VALUE_INSIDE = _one_pattern([p for p in _SECRET_VALUE_RES if not p.pattern.startswith("^")])
# What the journal's JSON texts are made with (json.dumps builds a new encoder per call
# when given options; these are the same options, built once).
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


class ReceiptWarning(UserWarning):
    """Part of a receipt was dropped before it reached the journal (secrets, size, type).

    Turn it into an error in a test suite with ``-W error::intentlog.ReceiptWarning``.
    """


def _user_stacklevel() -> int:
    """The stacklevel that points a warning at the first frame outside intentlog."""
    package = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


@functools.lru_cache(maxsize=4096)  # receipts repeat the same few field names
def _secret_name(name: str) -> bool:
    words = [w.lower() for w in _WORD_RE.findall(name)]
    return any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in itertools.pairwise(words)
    )


# The same credential shapes, found inside free text (error messages, notes).
_SECRET_IN_TEXT = (
    (re.compile(r"\b(bearer|basic|token)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE), r"\1 " + "***"),
    (
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)", re.DOTALL
        ),
        "***",
    ),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), "***"),
    (re.compile(r"\b(sk|rk)_(live|test)_[A-Za-z0-9]{8,}"), "***"),
    (re.compile(r"\b(ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{16,}"), "***"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), "***"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), "***"),
    (re.compile(r"(://[^/\s:@]+:)[^/\s@]+@"), r"\1***@"),
)


def scrub_text(text: str, *, limit: int = 2000) -> str:
    """Free text (an error message, a reason) made safe to journal and print: credential
    shapes replaced by ``***`` and the length bounded."""
    for pattern, replacement in _SECRET_IN_TEXT:
        text = pattern.sub(replacement, text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _secret_value(value: str) -> bool:
    return (
        _SECRET_VALUE_START.match(value) is not None
        or _SECRET_VALUE_INSIDE.search(value) is not None
    )


def _holds_secret(value: Any) -> bool:
    """Whether :func:`_find_secrets` would find anything, without building paths (the
    common answer is no, and it is asked of every receipt)."""
    if isinstance(value, str):
        return _secret_value(value)
    if isinstance(value, dict):
        for name, item in value.items():
            if isinstance(name, str) and _secret_name(name) and item not in (None, ""):
                return True
            if _holds_secret(item):
                return True
    elif isinstance(value, list | tuple):
        return any(_holds_secret(item) for item in value)
    return False


def _find_secrets(value: Any, path: str) -> list[str]:
    """Paths of every secret-like name or value inside a JSON value."""
    found: list[str] = []
    if isinstance(value, dict):
        for name, item in value.items():
            sub = f"{path}.{name}"
            if isinstance(name, str) and _secret_name(name) and item not in (None, ""):
                found.append(sub)
            else:
                found.extend(_find_secrets(item, sub))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found.extend(_find_secrets(item, f"{path}[{index}]"))
    elif isinstance(value, str) and _secret_value(value):
        found.append(path)
    return found


def dumps_bounded(value: Any, *, what: str, max_bytes: int) -> str:
    """Serialise ``value`` as JSON text of at most ``max_bytes`` bytes, or raise UnsafeValue."""
    try:
        text = _encode(value)
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) included
        raise UnsafeValue(f"{what} is not JSON data: {exc}", path=what) from exc
    if size > max_bytes:
        raise UnsafeValue(
            f"{what} is {size} bytes as JSON; the journal keeps at most {max_bytes}",
            path=what,
        )
    return text


def check_safe(value: Any, *, what: str, max_bytes: int) -> str:
    """Refuse a caller-controlled value that holds credentials, is not JSON or is too big.

    Returns its JSON text. Raises UnsafeValue whose ``path`` names the first offending place
    (``state.user.password``); nothing is written.
    """
    text = dumps_bounded(value, what=what, max_bytes=max_bytes)
    secrets = _find_secrets(value, what) if _holds_secret(value) else []
    if secrets:
        raise UnsafeValue(
            f"{secrets[0]} looks like a credential; intentlog never stores credentials "
            "(keep a reference to where the secret lives instead)",
            path=secrets[0],
        )
    return text


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            name: REDACTED
            if isinstance(name, str) and _secret_name(name) and item not in (None, "")
            else _redact(item)
            for name, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(item) for item in value]
    if isinstance(value, str) and _secret_value(value):
        return REDACTED
    return value


def clean_receipt(value: Any, *, effect: str, max_bytes: int) -> tuple[Any, str]:
    """Reduce a receipt to what the journal may keep; never raises for a bad receipt.

    Returns the stored value and its JSON text. Secret-like values are replaced by
    :data:`REDACTED`; a receipt that is not JSON or is larger than ``max_bytes`` is replaced
    by a note of its type, size and digest. Each reduction emits a ReceiptWarning.
    """
    try:
        text = _encode(value)
        size = len(text.encode("utf-8"))  # a lone surrogate cannot be stored
    except (TypeError, ValueError):
        raw = repr(value).encode("utf-8", "replace")
        note = {
            "intentlog_note": "receipt was not JSON data and was not stored",
            "type": type(value).__qualname__,
            "repr_sha256": hashlib.sha256(raw).hexdigest(),
        }
        warnings.warn(
            f"receipt of effect {effect!r} is a {type(value).__qualname__}, not JSON data; "
            "the journal keeps a note of its type and digest instead",
            ReceiptWarning,
            stacklevel=_user_stacklevel(),
        )
        return note, json.dumps(note)
    secrets = _find_secrets(value, "receipt") if _holds_secret(value) else []
    if secrets:
        value = _redact(value)
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        size = len(text.encode("utf-8"))
        warnings.warn(
            f"receipt of effect {effect!r} held credential-like values at "
            f"{', '.join(secrets)}; they were redacted before journaling",
            ReceiptWarning,
            stacklevel=_user_stacklevel(),
        )
    if size > max_bytes:
        big: dict[str, Any] = {
            "intentlog_note": "receipt was too large and was not stored",
            "type": type(value).__qualname__,
            "bytes": size,
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        }
        warnings.warn(
            f"receipt of effect {effect!r} is {size} bytes as JSON (limit {max_bytes}); "
            "the journal keeps a note of its size and digest instead; select fields with "
            "Effect(receipt=...)",
            ReceiptWarning,
            stacklevel=_user_stacklevel(),
        )
        return big, json.dumps(big)
    return value, text
