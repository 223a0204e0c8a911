"""Canonical JSON: the byte form records are stored in and payloads are compared by.

Keys sorted, fixed separators, UTF-8, no NaN: two equal values produce the same bytes in
any process, so a digest of the canonical form tells a retried append from a diverged one
no matter in which order a caller built its dictionaries.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import CorruptRecordError

JSONValue = Any
"""A value made of dict / list / str / int / float / bool / None."""


# One encoder for every call: ``json.dumps`` with options builds a new one each time,
# which costs more than encoding a small record.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
# The standard library's C encoder behind ``_ENCODER``, made once: ``JSONEncoder.encode``
# makes a new one on every call (a quarter of a step event's encoding). Made without
# the circular-reference check (whose marker table a failed call could leave dirty): a
# cycle raises RecursionError, and ``_ENCODER`` then names it.
# Not every Python has it (the name is CPython's, undocumented): without it, ``_ENCODER``.
_MAKE_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODER = (
    None
    if _MAKE_C_ENCODER is None
    else _MAKE_C_ENCODER(
        None,
        _ENCODER.default,
        json.encoder.encode_basestring,
        None,
        ":",
        ",",
        True,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )
)


def canonical(value: JSONValue) -> bytes:
    """The canonical JSON bytes of ``value``.

    Raises ``TypeError`` for values JSON cannot hold and ``ValueError`` for NaN/Infinity,
    so a payload that would not round-trip is refused before anything is written.
    """
    if _C_ENCODER is not None:
        try:
            return "".join(_C_ENCODER(value, 0)).encode("utf-8")
        except RecursionError:
            pass  # a cycle or a very deep value: the full encoder below raises its error
    return _ENCODER.encode(value).encode("utf-8")


def digest(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def decode_record(data: bytes, *, what: str) -> dict[str, Any]:
    """Parse a stored record; a record that is not a JSON object raises CorruptRecordError."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptRecordError(detail=f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise CorruptRecordError(detail=f"{what} is not a JSON object")
    return value
