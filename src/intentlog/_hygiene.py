"""What never goes into the journal: credentials, and values too large, too deep or not JSON.

Input the caller controls (task state, stored arguments, operator receipts and notes) is
refused with UnsafeValue naming the path (InvalidInput when it nests deeper than
:data:`~intentlog._keys.MAX_DEPTH`). A receipt comes back after the effect happened, so a bad
one must never cost the confirmation: whatever it is, it is reduced (secrets redacted, or the
whole receipt replaced by a note) and a ReceiptWarning names what was dropped. Free text the
journal keeps (error messages, reasons) is made storable: credentials masked, lone surrogates
and NUL characters escaped, length bounded.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import json.scanner
import os
import re
import sys
import warnings
from typing import Any

from intentlog._errors import InvalidInput, UnsafeValue
from intentlog._keys import MAX_DEPTH, json_encoder, nested_deeper, too_deep

__all__ = [
    "DEFAULT_MAX_BYTES",
    "REDACTED",
    "ReceiptWarning",
    "check_safe",
    "check_text",
    "clean_receipt",
    "describe",
    "dumps_bounded",
    "read_json",
    "reduce_receipt",
    "scrub_text",
    "storable",
    "warn_receipt",
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
_encode = json_encoder(allow_nan=False, separators=(",", ":"))
# Reads back a text that ``_encode`` made: the scanner alone, without ``json.loads``'s checks
# for surrounding whitespace (there is none), at a third of its cost.
_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed: a TODO
# What neither store can keep in a text column: NUL (PostgreSQL refuses it) and lone
# surrogates (not encodable as UTF-8, so SQLite's driver refuses them).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


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


def storable(text: str) -> str:
    """``text`` with what no store can keep written as backslash escapes, as Python shows
    them: NUL as ``\\x00``, a lone surrogate as ``\\udc80``. Everything else is unchanged."""
    return _UNSTORABLE.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def describe(value: object) -> str:
    """``str(value)``, and never an exception: an exception whose ``__str__`` raises, or returns
    something other than a string, is described by its type instead."""
    try:
        return str(value)
    except Exception:  # the user's own __str__; describing it must not fail in turn
        return f"<{_type_name(value)} that cannot be shown as text>"


def scrub_text(text: str, *, limit: int = 2000) -> str:
    """Free text (an error message, a reason) made safe to journal and print: credential
    shapes replaced by ``***``, NUL and lone surrogates escaped (see :func:`storable`) and the
    length bounded. Never raises; anything that is not a string is described first."""
    if not isinstance(text, str):
        text = describe(text)
    text = storable(text)
    for pattern, replacement in _SECRET_IN_TEXT:
        text = pattern.sub(replacement, text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Credentials in free text a caller asks us to keep (a resolve note). The shapes masked in
# error messages, except that a scheme word counts only before something token-like (a digit
# or base64 padding in it, or 20 characters or more): "token rotation" is a sentence, not a
# credential. Plus "name: value" pairs under a secret-like name.
_SECRET_IN_NOTE = re.compile(
    "|".join(
        [
            r"(?i:\b(?:bearer|basic|token)\s+(?:(?=[A-Za-z._~-]*[0-9+/=])[A-Za-z0-9._~+/=-]{8,}"
            r"|[A-Za-z0-9._~+/=-]{20,}))",
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
            r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.",
            r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{8,}",
            r"\b(?:ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{16,}",
            r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
            r"\bAKIA[0-9A-Z]{16}\b",
            r"://[^/\s:@]+:[^/\s@]+@",
            r"(?i:\b(?:password|passwd|passphrase|pwd|secret|api[_-]?key|access[_-]?key"
            r"|secret[_-]?key|private[_-]?key|client[_-]?secret|token)\s*[:=]\s*\S{4,})",
        ]
    )
)


def check_text(text: str, *, what: str, task_id: str | None = None, key: str | None = None) -> str:
    """Refuse free text the caller asked us to keep (a resolve note) that holds a credential
    (UnsafeValue, ``path`` = ``what``) or characters no store can keep, NUL or a lone
    surrogate (InvalidInput). Returns ``text``; nothing is written when it raises.
    ``task_id`` and ``key`` go on the error."""
    bad = _UNSTORABLE.search(text)
    if bad is not None:
        raise InvalidInput(
            f"{what} holds {storable(bad.group())} at position {bad.start()}, which the journal "
            "cannot store (NUL characters and lone surrogates are not text)",
            task_id=task_id,
            key=key,
        )
    if _SECRET_IN_NOTE.search(text) is not None:
        raise UnsafeValue(
            f"{what} looks like it holds a credential; intentlog never stores credentials "
            "(say where the secret lives instead)",
            path=what,
            task_id=task_id,
            key=key,
        )
    return text


def _secret_value(value: str) -> bool:
    return (
        _SECRET_VALUE_START.match(value) is not None
        or _SECRET_VALUE_INSIDE.search(value) is not None
    )


# Values under a secret-like name that hold nothing to hide; the marker itself among them, so
# that redacting is idempotent (a receipt already reduced is kept as it is).
_NOT_SECRET = (None, "", REDACTED)


def _holds_secret(value: Any) -> bool:
    """Whether :func:`_find_secrets` would find anything, without building paths (the
    common answer is no, and it is asked of every receipt)."""
    if isinstance(value, str):
        return _secret_value(value)
    if isinstance(value, dict):
        for name, item in value.items():
            if isinstance(name, str) and _secret_name(name) and item not in _NOT_SECRET:
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
            if isinstance(name, str) and _secret_name(name) and item not in _NOT_SECRET:
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
    """Serialise ``value`` as JSON text of at most ``max_bytes`` bytes, or raise UnsafeValue
    (InvalidInput if it nests deeper than :data:`~intentlog._keys.MAX_DEPTH`)."""
    try:
        text = _encode(value)
        size = len(text.encode("utf-8"))
    except RecursionError:
        raise too_deep(what) from None
    except Exception as exc:  # UnicodeEncodeError (a lone surrogate) included
        raise UnsafeValue(f"{what} is not JSON data: {exc}", path=what) from exc
    if nested_deeper(value, MAX_DEPTH, len(text)):
        raise too_deep(what)
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


def redact(value: Any) -> Any:
    """``value`` (JSON data) with every secret-like value replaced by :data:`REDACTED`: those
    under secret-like names and those shaped like credentials. Returns ``value`` itself when
    it holds none."""
    return _redact(value) if _holds_secret(value) else value


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            name: REDACTED
            if isinstance(name, str) and _secret_name(name) and item not in _NOT_SECRET
            else _redact(item)
            for name, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(item) for item in value]
    if isinstance(value, str) and _secret_value(value):
        return REDACTED
    return value


def clean_receipt(value: Any, *, effect: str, max_bytes: int) -> tuple[Any, str]:
    """:func:`reduce_receipt`, with its warnings emitted at once."""
    stored, text, dropped = reduce_receipt(value, effect=effect, max_bytes=max_bytes)
    warn_receipt(dropped)
    return stored, text


def reduce_receipt(value: Any, *, effect: str, max_bytes: int) -> tuple[Any, str, list[str]]:
    """Reduce a receipt to what the journal may keep. Total: never raises, whatever ``value``
    is (a receipt comes back after the effect happened, so it must never cost the
    confirmation).

    Returns the stored value, its JSON text and the warnings to emit (one per reduction, for
    :func:`warn_receipt`; returned rather than emitted, so a caller that turned
    ReceiptWarning into an error can make the receipt durable first). The stored value is
    the text read back, a new object, so it is exactly what a replay will see: integer keys
    are strings and tuples are lists the first time too. Secret-like values are replaced by
    :data:`REDACTED`; a receipt that is not JSON, nests deeper than
    :data:`~intentlog._keys.MAX_DEPTH` or is larger than ``max_bytes`` is replaced by a note
    of its type and, where they can be had, its size and digest.
    """
    try:
        return _reduce(value, effect, max_bytes)
    except Exception as exc:  # a last line: a value whose own methods raise while examined
        note = _note("receipt could not be examined and was not stored", value, error=exc)
        dropped = f"receipt of effect {effect!r} could not be examined ({_type_name(exc)}); "
        return note, _encode(note), [dropped + "the journal keeps a note instead"]


def _reduce(value: Any, effect: str, max_bytes: int) -> tuple[Any, str, list[str]]:
    try:
        text = _encode(value)
        # Counted in UTF-8 bytes; encoding also finds a lone surrogate, which cannot be stored.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except RecursionError:
        return _too_deep_note(value, effect, None)
    except Exception as exc:  # not JSON data: TypeError, a too-long int's ValueError, ...
        note = _note("receipt was not JSON data and was not stored", value, error=exc)
        digest = _repr_digest(value)
        if digest is not None:
            note["repr_sha256"] = digest
        return (
            note,
            _encode(note),
            [
                f"receipt of effect {effect!r} is a {_type_name(value)}, not JSON data; the "
                "journal keeps a note of its type and digest instead"
            ],
        )
    if nested_deeper(value, MAX_DEPTH, len(text)):
        return _too_deep_note(value, effect, text)
    dropped = []
    if _holds_secret(value):
        secrets = _find_secrets(value, "receipt")
        value = _redact(value)
        text = _encode(value)
        size = len(text.encode("utf-8"))
        dropped.append(
            f"receipt of effect {effect!r} held credential-like values at "
            f"{', '.join(secrets)}; they were redacted before journaling"
        )
    if size > max_bytes:
        big = _note("receipt was too large and was not stored", value)
        big.update(bytes=size, sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())
        dropped.append(
            f"receipt of effect {effect!r} is {size} bytes as JSON (limit {max_bytes}); "
            "the journal keeps a note of its size and digest instead; select fields with "
            "Effect(receipt=...)"
        )
        return big, _encode(big), dropped
    return read_json(text), text, dropped


def _too_deep_note(value: Any, effect: str, text: str | None) -> tuple[Any, str, list[str]]:
    note = _note(f"receipt nested more than {MAX_DEPTH} levels deep and was not stored", value)
    if text is not None:
        data = text.encode("utf-8", "surrogatepass")
        note.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    return (
        note,
        _encode(note),
        [
            f"receipt of effect {effect!r} nests more than {MAX_DEPTH} levels deep; the journal "
            "keeps a note of its type instead; select fields with Effect(receipt=...)"
        ],
    )


def _note(what: str, value: Any, *, error: BaseException | None = None) -> dict[str, Any]:
    """A note kept in place of a receipt; every part of it storable JSON."""
    note: dict[str, Any] = {"intentlog_note": what, "type": _type_name(value)}
    if error is not None:
        note["error"] = scrub_text(f"{_type_name(error)}: {describe(error)}", limit=200)
    return note


def _type_name(value: object) -> str:
    try:
        name = type(value).__qualname__
    except Exception:  # a metaclass's own __qualname__
        name = None
    return scrub_text(name, limit=200) if isinstance(name, str) else "object"


def _repr_digest(value: Any) -> str | None:
    """A sha256 of ``repr(value)``, or None when it has none (its ``repr`` raises, or nests
    too deep, or holds an int too long to show)."""
    try:
        text = repr(value)
        return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()
    except Exception:
        return None


def read_json(text: str) -> Any:
    """The value of a JSON text made here (by :func:`reduce_receipt`), read back as a new
    object; cheaper than ``json.loads``."""
    return _scan(text, 0)[0]


def warn_receipt(dropped: list[str]) -> None:
    """Emit one ReceiptWarning per message of :func:`reduce_receipt`, pointed at the user's
    code. Call it once the receipt is durable."""
    for message in dropped:
        warnings.warn(message, ReceiptWarning, stacklevel=_user_stacklevel())


def kept_arguments(value: Any, *, max_bytes: int = 2048, max_text: int = 200) -> Any:
    """Enough of a call's arguments for a person to find the call at its service, never a
    credential: secret-like values redacted (:func:`redact`), strings longer than
    ``max_text`` cut (with their length noted), and a whole that is still larger than
    ``max_bytes`` replaced by a note of its size and digest. Total: never raises."""
    try:
        reduced = _cut(redact(value), max_text)
        text = _encode(reduced)
    except Exception as exc:  # not JSON: keep only a note, the call goes on
        return _note("arguments could not be kept", value, error=exc)
    if len(text.encode()) > max_bytes:
        return _note("arguments too large to keep", value)
    return reduced


def _cut(value: Any, limit: int) -> Any:
    if isinstance(value, dict):
        return {name: _cut(item, limit) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_cut(item, limit) for item in value]
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}... ({len(value)} characters)"
    return value
