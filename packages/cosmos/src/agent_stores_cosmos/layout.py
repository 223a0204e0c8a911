"""How a ``(scope, key)`` entry is laid out as one Cosmos item.

One container, partition key path ``/pk``. Every item::

    {"id": …, "pk": …, "a": prefix, "s": hex(scope), "k": hex(key),
     "v": base64(value), "x": expires_at | null, "w": write token, "ttl": seconds?}

* ``k`` and ``s`` are the lowercase hex of the UTF-8 bytes. Hex digits sort the same in
  every string collation (ordinal, UTF-16, case-insensitive), and hex of UTF-8 sorts in
  byte order, which is code point order: exactly the contract's scan order, whatever order
  the server gives strings with other characters. (The npm test server compares strings by
  UTF-16 code unit, which puts U+E000..U+FFFF after emoji; hex sidesteps that.) Hex also
  keeps prefixes: ``key.startswith(p)`` iff ``hex(key).startswith(hex(p))``, so a prefix
  scan is the range ``[hex(p), hex(p) + "g")``.
* ``id`` is ``hex(key)`` while that is at most 254 characters (keys up to 127 UTF-8
  bytes), else ``"~"`` + SHA-256 of the key. Ids then never contain ``/ \\ ? #``, stay
  within Cosmos' 255-character id limit, and a hashed id can never equal a hex one.
  Scans order by ``k``, never by ``id``, so hashing long keys costs nothing in order.
* ``pk`` is ``prefix + "/" + scope`` (the prefix has no ``/`` or ``#``), or
  ``prefix + "#" + SHA-256(scope)`` when that would pass 1 KiB, within the 2 KiB limit
  of partition key values. The scope itself is always recoverable from ``s``.
* ``x`` is the expiry on the core's clock; ``ttl`` (native, set only when ``x`` is) is
  garbage collection only and fires a grace period after ``x``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from typing import Any

#: Items are at most 2 MB (2,097,152 bytes) in Cosmos. Values are stored as base64
#: (4 bytes per 3), and the other fields take at most ~13 KB (hex key and scope of 512
#: four-byte characters, partition key, system properties): 1,500,000 bytes of value is
#: 2,000,000 characters of base64, which leaves ~97 KB of room.
MAX_VALUE_BYTES = 1_500_000
MAX_ITEM_BYTES = 2 * 1024 * 1024
MAX_HEX_ID = 254
MAX_PK_BYTES = 1024
#: Native TTL fires this many seconds after an entry's own expiry: margin for the round
#: trip and for the server's clock, which native TTL runs on, drifting from ours.
GC_GRACE_SECONDS = 60

#: Key upper bound sentinel: "g" sorts after every hex digit.
HEX_END = "g"


def to_hex(text: str) -> str:
    """Lowercase hex of the UTF-8 bytes of ``text``."""
    return text.encode("utf-8").hex()


def from_hex(text: str) -> str:
    """Inverse of :func:`to_hex`; ValueError when ``text`` is not hex of UTF-8."""
    return bytes.fromhex(text).decode("utf-8")


def item_id(key: str) -> str:
    """The Cosmos ``id`` of ``key`` (see the module docstring)."""
    encoded = to_hex(key)
    if len(encoded) <= MAX_HEX_ID:
        return encoded
    return "~" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def partition_value(prefix: str, scope: str) -> str:
    """The partition key value of ``scope`` under the app ``prefix``."""
    plain = f"{prefix}/{scope}"
    if len(plain.encode("utf-8")) <= MAX_PK_BYTES:
        return plain
    return f"{prefix}#{hashlib.sha256(scope.encode('utf-8')).hexdigest()}"


def gc_ttl(expires_at: float, now: float) -> int:
    """The native ``ttl`` (whole seconds from the write) that collects an entry after expiry."""
    return max(1, math.ceil(expires_at - now)) + GC_GRACE_SECONDS


def encode_value(value: bytes) -> str:
    """``value`` as base64 text for the JSON item."""
    return base64.b64encode(bytes(value)).decode("ascii")


def decode_value(text: Any) -> bytes:
    """Inverse of :func:`encode_value`; ValueError when the field is not base64."""
    if not isinstance(text, str):
        raise ValueError("value field is not a string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError("value field is not base64") from exc


def make_version(etag: str, expires_at: float | None) -> str:
    """The version handed to callers: the ETag, plus the expiry of that write.

    The expiry belongs to the write the ETag names, so a conditional write can decide
    "that version has expired" from the version alone, with no read: if the ETag still
    matches, the stored entry is exactly that write, expiry included.
    """
    if expires_at is None:
        return etag
    return f"{etag}|{float(expires_at)!r}"


def parse_version(version: str) -> tuple[str, float | None] | None:
    """``(etag, expires_at)`` from :func:`make_version`'s output; None when malformed."""
    if not isinstance(version, str) or not version:
        return None
    etag, sep, tail = version.rpartition("|")
    if not sep:
        return version, None
    try:
        expires_at = float(tail)
    except ValueError:
        return None
    if not etag or expires_at != expires_at:
        return None
    return etag, expires_at
