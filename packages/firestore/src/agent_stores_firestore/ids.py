"""Reversible, order-preserving document ids for scopes and keys.

Firestore document ids may not contain ``/``, may not be ``.`` or ``..``, may not match
``__.*__`` and hold at most 1,500 bytes of UTF-8. Firestore orders string document ids
by their UTF-8 bytes (checked against Google's emulator by
``tests/test_firestore_ids.py``), which is the code point order the KV contract scans
in, so the encoding only has to keep that order:

* every id starts with the marker ``k``, so it is never ``.``/``..`` and never starts
  with ``__``;
* ``.`` becomes ``..`` and ``/`` becomes ``.0``; every other character stays itself.

The character images form a prefix-free code that keeps the order of single characters
(``-`` < ``..`` < ``.0`` < ``0``), so whole strings keep their order, a key starts with
a prefix exactly when its id starts with the prefix's id, and decoding is unambiguous.
"""

from __future__ import annotations

import re

from agent_stores.errors import InvalidIdError

MARKER = "k"
#: Firestore's limit on one document id (UTF-8 bytes).
MAX_ID_BYTES = 1500

_RESERVED_RE = re.compile(r"^__.*__$", re.DOTALL)


def encode_id(text: str) -> str:
    """The document id of a scope or key (see the module docstring)."""
    return MARKER + text.replace(".", "..").replace("/", ".0")


def decode_id(doc_id: str) -> str:
    """The scope or key back from :func:`encode_id`'s output; ValueError if it is not one."""
    if not doc_id.startswith(MARKER):
        raise ValueError(f"document id {doc_id[:80]!r} was not written by agent-stores")
    out: list[str] = []
    chars = iter(doc_id[len(MARKER) :])
    for char in chars:
        if char != ".":
            out.append(char)
            continue
        follower = next(chars, "")
        if follower == ".":
            out.append(".")
        elif follower == "0":
            out.append("/")
        else:
            raise ValueError(f"document id {doc_id[:80]!r} has a bad escape")
    return "".join(out)


def checked_id(kind: str, text: str) -> str:
    """:func:`encode_id`, raising :class:`InvalidIdError` when the id is over Firestore's limit."""
    doc_id = encode_id(text)
    size = len(doc_id.encode("utf-8"))
    if size > MAX_ID_BYTES:
        raise InvalidIdError(
            detail=f"{kind} {text[:40]!r}… takes {size} bytes as a Firestore document id "
            f"(UTF-8, '.' and '/' escaped); Firestore allows {MAX_ID_BYTES}"
        )
    return doc_id


def check_path_segment(segment: str) -> str | None:
    """Why ``segment`` cannot be a Firestore collection or document id (None when it can)."""
    if not segment:
        return "is empty"
    if "/" in segment:
        return "contains '/'"
    if segment in {".", ".."}:
        return "is '.' or '..'"
    if _RESERVED_RE.match(segment):
        return "matches __.*__ (reserved by Firestore)"
    if len(segment.encode("utf-8")) > MAX_ID_BYTES:
        return f"is over {MAX_ID_BYTES} bytes"
    return None
