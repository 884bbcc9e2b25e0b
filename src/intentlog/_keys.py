"""Operation keys, canonical JSON and fingerprints.

A key is derived from the task id, the effect name and a canonical JSON of the arguments, so
the same call made again after a restart (even by a non-deterministic agent) gets the same
key, and with it the stored receipt instead of a second effect.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from intentlog._errors import InvalidInput

__all__ = [
    "MAX_DEPTH",
    "MAX_KEY_LENGTH",
    "canonical_json",
    "derive_key",
    "fingerprint",
    "nested_deeper",
    "too_deep",
    "validate_key",
]

MAX_KEY_LENGTH = 255  # Stripe's limit and a common one for idempotency keys
# How deeply a JSON value in the journal may nest (a scalar is 0, ``[]`` is 1, ``[[]]`` 2). Real
# arguments, state and receipts nest a few levels; a bound far below the interpreter's recursion
# limit means no value in the journal can make encoding, scanning or reading it fail.
MAX_DEPTH = 100
MAX_TASK_ID_LENGTH = 200
_KEY_RE = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces: safe in any HTTP header
_SLUG_RE = re.compile(r"[^a-z0-9_.-]+")


def json_encoder(
    *, sort_keys: bool = False, allow_nan: bool = True, separators: tuple[str, str] = (", ", ": ")
) -> Callable[[Any], str]:
    """``json.JSONEncoder(ensure_ascii=False, ...).encode``, the same text and the same errors
    for every value, made cheaper for the per-effect path.

    The standard ``encode`` sets up a new C encoder (and a closure) on every call, which costs
    more than encoding a small receipt. This one is set up once, without the C encoder's
    cycle check (it needs a fresh set per call); a value that is circular, or nests deeper
    than the interpreter can recurse, ends in RecursionError there, and then the standard
    encoder encodes it again and raises what it always raised.
    """
    item_separator, key_separator = separators
    standard = json.JSONEncoder(
        ensure_ascii=False, sort_keys=sort_keys, allow_nan=allow_nan, separators=separators
    )
    make = getattr(json.encoder, "c_make_encoder", None)  # None without the C accelerator
    if make is None:
        return standard.encode
    one_shot = make(
        None,  # markers: no cycle check (see above)
        standard.default,
        json.encoder.encode_basestring,
        None,  # indent
        key_separator,
        item_separator,
        sort_keys,
        False,  # skipkeys
        allow_nan,
    )

    def encode(value: Any) -> str:
        try:
            return "".join(one_shot(value, 0))
        except RecursionError:  # circular or too deep: the standard encoder says which
            return standard.encode(value)

    return encode


# Built once, with exactly the options the texts (and so every key ever derived) were made with.
_canonical = json_encoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_key_material = json_encoder()


def canonical_json(value: Any, *, what: str = "value") -> str:
    """The canonical JSON text of ``value``: sorted keys, no spaces, no NaN.

    Raises InvalidInput naming ``what`` if the value is not plain JSON data or nests deeper
    than :data:`MAX_DEPTH`.
    """
    try:
        text = _canonical(value)
        text.encode("utf-8")  # a lone surrogate cannot be stored or hashed
    except RecursionError:
        raise too_deep(what) from None
    except Exception as exc:  # whatever the value's own methods raise, it is not JSON data
        raise InvalidInput(
            f"{what} must be JSON data (dict, list, str, int, float, bool, None): {exc}"
        ) from exc
    if nested_deeper(value, MAX_DEPTH, len(text)):
        raise too_deep(what)
    return text


def nested_deeper(value: Any, limit: int, text_length: int) -> bool:
    """Whether ``value`` (whose JSON text is ``text_length`` characters) nests deeper than
    ``limit``. Free for short texts, which cannot nest that deep (each level costs two
    brackets); otherwise one walk over the containers, level by level, without recursion."""
    if text_length <= 2 * limit:
        return False
    level = [value]
    for _ in range(limit):  # after round i, ``level`` holds the containers at depth i + 1
        deeper: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                deeper.extend(item.values())
            elif isinstance(item, list | tuple):
                deeper.extend(item)
        level = [item for item in deeper if isinstance(item, dict | list | tuple)]
        if not level:
            return False
    return True


def too_deep(what: str) -> InvalidInput:
    """The error for a value that nests deeper than :data:`MAX_DEPTH`."""
    return InvalidInput(
        f"{what} nests more than {MAX_DEPTH} levels deep; the journal keeps JSON values at "
        f"most {MAX_DEPTH} levels deep (store a reference to deeper data instead)"
    )


def fingerprint(canonical: str) -> str:
    """A sha256 hex digest of a canonical JSON text."""
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def derive_key(task_id: str, effect: str, canonical_args: str) -> str:
    """The stable key for one call: ``<effect slug>-<32 hex digits>``, ASCII, under 80 chars.

    The digest covers task id, effect name and arguments, separated so that no two
    different triples can produce the same input.
    """
    material = _key_material([task_id, effect, canonical_args])
    digest = hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]
    return f"{_slug(effect)}-{digest}"


@functools.lru_cache(maxsize=1024)  # a program has a handful of effects
def _slug(effect: str) -> str:
    return _SLUG_RE.sub("-", effect.lower()).strip("-")[:40] or "op"


def validate_key(key: object) -> str:
    """Return ``key`` if it is a usable explicit operation key, else raise InvalidInput."""
    if not isinstance(key, str) or not key:
        raise InvalidInput(f"operation key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LENGTH or not _KEY_RE.match(key):
        raise InvalidInput(
            f"operation key {key[:60]!r} must be 1 to {MAX_KEY_LENGTH} printable ASCII "
            "characters without spaces (it is sent as an idempotency key header)",
            key=key[:MAX_KEY_LENGTH],
        )
    return key


def validate_task_id(task_id: object) -> str:
    """Return ``task_id`` if it is a usable task id, else raise InvalidInput."""
    return validate_label(task_id, "task id", MAX_TASK_ID_LENGTH)


def validate_label(value: object, what: str, max_length: int) -> str:
    """Return ``value`` if it is a usable name (a task id, an effect name, a task kind, a
    next step): a non-empty string of at most ``max_length`` printable characters, spaces
    only inside. Printable excludes control characters, NUL and lone surrogates, which no
    store can keep as text; else raise InvalidInput naming ``what``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > max_length:
        raise InvalidInput(f"{what} is {len(value)} characters long; at most {max_length} allowed")
    if any((ch.isspace() and ch != " ") or not ch.isprintable() for ch in value):
        raise InvalidInput(f"{what} {value!r} contains control or non-printable characters")
    if value != value.strip():
        raise InvalidInput(f"{what} {value!r} has leading or trailing spaces")
    return value
