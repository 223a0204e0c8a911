"""Compact JSON between Python values and bytes, by pydantic-core's Rust codec.

The stores encode and decode their own small records on every operation (a memory file's
record and its receipt index entry, a session state's header). pydantic-core, installed
with pydantic already, encodes such a record about four times as fast as the standard
library's encoder and decodes it three to four times as fast. Its output is the standard
library's ``separators=(",", ":")``, ``ensure_ascii=False`` form byte for byte, except
that a float may print in another form of the same value (``6.103515625e-05`` as
``0.00006103515625``): the bytes decode to equal values, which is all a record needs.

What pydantic-core refuses goes to the standard library, so such values come out as they
always did: a lone surrogate (legal in a Python ``str``; the stores carry it with
``surrogatepass``), and bytes it will not decode (the standard library decodes them, or
raises its usual ``ValueError``, which callers report as a damaged record).

Only for values made of dict, list, str, int, float, bool and None: pydantic-core would
also encode a datetime or bytes where the standard library refuses them, so callers check
anything that comes from outside first (as the session catalog does its metadata).
Canonical JSON (sorted keys, compared by digest) stays with the standard library
(``checkpointer/codec.py``): its bytes must never change. So do the session state's
header (ASCII, parsed in the servers by the native ports) and the receipts' JSON.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticSerializationError, from_json, to_json

_ENCODING = "utf-8"
# Lone surrogates round-trip through the stores' bytes (see the module docstring).
_ERRORS = "surrogatepass"
_STDLIB = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (non-ASCII characters as themselves)."""
    try:
        return to_json(value)
    except PydanticSerializationError:
        return _STDLIB.encode(value).encode(_ENCODING, _ERRORS)


def loads(data: bytes) -> Any:
    """The value of the JSON document ``data``; ``ValueError`` (the standard library's
    message) when it is not one."""
    try:
        return from_json(data)
    except ValueError:
        return json.loads(data.decode(_ENCODING, _ERRORS))
