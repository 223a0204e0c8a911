"""The session catalog: whose a session is, what it is called, and a per-owner index.

A session may carry catalog fields: an **owner** (a subject id), a **title**, **tags** and
small custom **metadata**. They live in the session's ``state`` header (field
``catalog``) and change in the same fenced write that ends a turn, so they can never
disagree with the history they describe.

A session with an owner is also listed in its owner's **index**, one KV scope per owner
(``<catalog_prefix><owner>``), which serves "this owner's most recent sessions" with one
range read of that scope and one batched read, however many other owners and sessions
the store holds:

``r/<inverted last activity, ms>/<session id>``
    One entry per session, in recency order (byte order of the key), holding what a
    sidebar shows: title, tags, metadata, times, message count, a preview of the last
    message. Never the history.
``s/<session id>``
    The pointer naming the session's current ``r/`` key. An ``r/`` entry the pointer does
    not name is stale (a write after it, or one half done without an atomic commit) and
    is skipped by a listing and deleted when seen.

The index is written by the turn that holds the session's lease, in one atomic commit
on the owner's scope (old entry deleted, new entry and pointer written), *before* the
state write that ends the turn — so two turns of one session never write it out of
order. It is derived data: a failed index write is logged and retried by the session's
next turn; the turn's own save never fails because of it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..subjects import subject_problem
from .errors import InvalidSessionError

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

RECENT_PREFIX = "r/"
POINTER_PREFIX = "s/"
#: Present in an owner's index while :meth:`SessionStore.erase_owner` runs: index writes
#: for the owner are refused (so are the turns that make them).
ERASING_KEY = "~erasing"
#: ``x/<hash of a session id>``: a session erased moments ago (expires after two leases),
#: so a turn that held it during the erase cannot list it again afterwards.
ERASED_PREFIX = "x/"

#: Bounds of the catalog fields (a header stays small; a listing page stays one read).
MAX_TITLE_CHARS = 200
MAX_TAGS = 32
MAX_TAG_CHARS = 64
MAX_METADATA_BYTES = 2048
PREVIEW_CHARS = 160

# 10**13 ms is the year 2286: the inverted time keeps 13 digits until then.
_TIME_SPAN_MS = 10**13
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One session as its owner's listing shows it (no history is read to build it).

    Times are unix seconds on the store's clock.
    """

    session_id: str
    owner: str
    title: str | None
    tags: tuple[str, ...]
    metadata: Mapping[str, Any]
    """The custom metadata given to ``turn(..., metadata=...)``."""
    created_at: float
    last_activity_at: float
    """When a turn last saved messages or catalog fields."""
    message_count: int
    preview: str | None
    """The start of the last message's text (at most 160 characters), if it has text."""


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One page of an owner's sessions, most recent first."""

    sessions: list[SessionSummary]
    cursor: str | None
    """Pass it as ``cursor=`` for the next page; None when there are no more sessions."""


@dataclass(frozen=True, slots=True)
class OwnerErasure:
    """What :meth:`SessionStore.erase_owner` removed and verified: keep it as evidence."""

    owner: str
    sessions: tuple[str, ...]
    """The sessions erased (state, history, waiting queue, index entries), by id."""
    scopes_checked: int
    """KV scopes read back after the erase: every erased session's and the owner's index."""
    entries_left: int
    """Entries found in those scopes afterwards; 0 means the erase is complete."""
    resumed: bool
    """An earlier erase of this owner had started and not finished (this one completed it)."""
    started_at: float
    finished_at: float

    @property
    def complete(self) -> bool:
        return self.entries_left == 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for an audit log."""
        return {
            "owner": self.owner,
            "sessions": list(self.sessions),
            "scopes_checked": self.scopes_checked,
            "entries_left": self.entries_left,
            "complete": self.complete,
            "resumed": self.resumed,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


@dataclass(frozen=True, slots=True)
class IdlePurge:
    """What :meth:`SessionStore.purge_idle` removed."""

    removed: tuple[str, ...]
    """Sessions deleted (state, history chunks, index entries), by id."""
    scanned: int
    """Sessions read."""
    kept_latched: tuple[str, ...]
    """Idle sessions kept because a recovery marker is set (``include_latched=False``)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "removed": list(self.removed),
            "scanned": self.scanned,
            "kept_latched": list(self.kept_latched),
        }


@dataclass(frozen=True, slots=True)
class CatalogUpdate:
    """Catalog fields a turn sets (None: leave as stored). ``metadata`` keys set to None are removed."""

    owner: str | None = None
    title: str | None = None
    tags: tuple[str, ...] | None = None
    metadata: Mapping[str, Any] | None = None

    @staticmethod
    def of(
        owner: str | None,
        title: str | None,
        tags: Sequence[str] | None,
        metadata: Mapping[str, Any] | None,
    ) -> CatalogUpdate | None:
        """A checked update, or None when nothing is asked (raises ``ValueError``/``TypeError``)."""
        if owner is None and title is None and tags is None and metadata is None:
            return None
        # Each field is checked by a function of its own, in the order of the arguments
        # (the first bad one is the one reported).
        if owner is not None:
            check_owner_text(owner)
        if title is not None:
            _check_title(title)
        checked_tags = None if tags is None else _checked_tags(tags)
        if metadata is not None:
            metadata = _checked_metadata(metadata)
        return CatalogUpdate(owner, title, checked_tags, metadata)


def _check_title(title: object) -> None:
    """Raise ``TypeError``/``ValueError`` for a title no catalog stores."""
    if not isinstance(title, str):
        raise TypeError(f"title must be a string, got {type(title).__name__}")
    if len(title) > MAX_TITLE_CHARS:
        raise ValueError(f"title is {len(title)} characters; at most {MAX_TITLE_CHARS}")


def _checked_tags(tags: Sequence[str]) -> tuple[str, ...]:
    """``tags`` without repeats, in their order (``TypeError``/``ValueError`` when a
    catalog cannot store them)."""
    if isinstance(tags, str):
        raise TypeError("tags must be a sequence of strings, not one string")
    checked = tuple(dict.fromkeys(tags))
    if len(checked) > MAX_TAGS:
        raise ValueError(f"{len(checked)} tags; at most {MAX_TAGS}")
    for tag in checked:
        if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG_CHARS:
            raise ValueError(f"a tag must be a string of 1-{MAX_TAG_CHARS} characters")
    return checked


def _checked_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` exactly as it reads back once stored (a JSON round trip), or
    ``TypeError``/``ValueError`` when it is not a JSON object of at most
    ``MAX_METADATA_BYTES``."""
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise TypeError("metadata must be a mapping with string keys")
    try:
        encoded = json.dumps(dict(metadata), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serializable: {exc}") from None
    if len(encoded.encode()) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata is over {MAX_METADATA_BYTES} bytes of JSON")
    loaded: dict[str, Any] = json.loads(encoded)
    return loaded


def check_owner_text(owner: object) -> None:
    """Raise ``InvalidSessionError`` for an owner id no backend could hold (an owner is a
    subject: the same rules)."""
    problem = subject_problem(owner, "owner")
    if problem is not None:
        raise InvalidSessionError(problem)


def check_prefixes(scope_prefix: str, catalog_prefix: str) -> None:
    """The owners' scopes must never be taken for sessions' scopes, nor the reverse."""
    if not catalog_prefix:
        raise ConfigError(detail="catalog_prefix must not be empty")
    if catalog_prefix.startswith(scope_prefix) or scope_prefix.startswith(catalog_prefix):
        raise ConfigError(
            detail=f"catalog_prefix {catalog_prefix!r} and scope_prefix {scope_prefix!r} "
            "must not be prefixes of each other"
        )


# -- the header field -----------------------------------------------------------------------
#
# Stored as a JSON object in the state header: owner, title, tags, meta, preview,
# at (last activity), count (messages when indexed), key (the r/ key written for the
# session, None until indexed) and v (the pointer's version after that write). Only
# JSON-native values, so it decodes back equal to what was encoded.


def applied(current: Mapping[str, Any] | None, update: CatalogUpdate | None) -> dict[str, Any]:
    """The catalog field after ``update`` (index bookkeeping kept as is)."""
    out: dict[str, Any] = dict(current or {})
    if update is None:
        return out
    if update.owner is not None:
        out["owner"] = update.owner
    if update.title is not None:
        out["title"] = update.title
    if update.tags is not None:
        out["tags"] = list(update.tags)
    if update.metadata is not None:
        meta = dict(out.get("meta") or {})
        for key, value in update.metadata.items():
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
        out["meta"] = meta
    return out


def listed_fields(catalog: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a listing shows of a catalog field (a change means the index is rewritten)."""
    return (
        catalog.get("owner"),
        catalog.get("title"),
        catalog.get("tags"),
        catalog.get("meta"),
        catalog.get("preview"),
        catalog.get("count"),
    )


def check_catalog(value: Any) -> dict[str, Any] | None:
    """The decoded catalog field, or ``ValueError``/``TypeError`` when it is malformed."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"expected a catalog object, got {type(value).__name__}")
    for name in ("owner", "title", "preview", "key", "v"):
        if value.get(name) is not None and not isinstance(value[name], str):
            raise TypeError(f"catalog field {name} is not a string")
    tags = value.get("tags")
    if tags is not None and (
        not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)
    ):
        raise TypeError("catalog tags are not a list of strings")
    if value.get("meta") is not None and not isinstance(value["meta"], dict):
        raise TypeError("catalog metadata is not an object")
    for name in ("at", "count"):
        number = value.get(name)
        if number is not None and (
            not isinstance(number, int | float)
            or isinstance(number, bool)
            or not math.isfinite(number)
        ):
            raise TypeError(f"catalog field {name} is not a number")
    return value


# -- the index entries ------------------------------------------------------------------------


def recent_key(last_activity_at: float, session_id: str) -> str:
    """The ``r/`` key: most recent first in byte order, ties by session id."""
    inverted = max(0, _TIME_SPAN_MS - 1 - round(last_activity_at * 1000))
    return f"{RECENT_PREFIX}{inverted:013d}/{session_id}"


def next_activity(now: float, previous: float | None) -> float:
    """The activity time of a new index write: ``now`` in whole milliseconds, and always
    later than ``previous`` so the new ``r/`` key differs from the one it replaces."""
    ms = round(now * 1000)
    if previous is not None:
        ms = max(ms, round(previous * 1000) + 1)
    return ms / 1000


def erased_key(session_id: str) -> str:
    """The tombstone key of an erased session: a hash, so it holds no id after the erase."""
    return ERASED_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()[:32]


def pointer_key(session_id: str) -> str:
    return POINTER_PREFIX + session_id


def key_overhead() -> int:
    """Characters an index key adds to a session id (the longer of the two keys)."""
    return len(recent_key(0.0, ""))


def entry_value(session_id: str, catalog: Mapping[str, Any], created_at: float) -> bytes:
    return json.dumps(
        {
            "id": session_id,
            "title": catalog.get("title"),
            "tags": catalog.get("tags") or [],
            "meta": catalog.get("meta") or {},
            "created": created_at,
            "at": catalog.get("at"),
            "count": catalog.get("count") or 0,
            "preview": catalog.get("preview"),
        },
        separators=(",", ":"),
    ).encode()


def pointer_value(key: str) -> bytes:
    return json.dumps({"k": key}, separators=(",", ":")).encode()


def pointed_key(value: bytes) -> str | None:
    """The ``r/`` key a pointer names (None if it cannot be read: treated as no pointer)."""
    try:
        doc = json.loads(value)
    except ValueError:
        return None
    key = doc.get("k") if isinstance(doc, dict) else None
    return key if isinstance(key, str) else None


def summary_of(owner: str, value: bytes) -> SessionSummary | None:
    """An ``r/`` entry as a summary (None when it does not decode: skipped, never raised)."""
    try:
        doc = json.loads(value)
        tags = doc["tags"]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            return None
        return SessionSummary(
            session_id=str(doc["id"]),
            owner=owner,
            title=doc.get("title"),
            tags=tuple(tags),
            metadata=dict(doc.get("meta") or {}),
            created_at=float(doc["created"]),
            last_activity_at=float(doc["at"]),
            message_count=int(doc["count"]),
            preview=doc.get("preview"),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The ``r/`` key a cursor stands for; ``ValueError`` when it is not one of ours."""
    try:
        key = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError(f"cursor {cursor[:40]!r} is not a session listing cursor") from None
    if not key.startswith(RECENT_PREFIX):
        raise ValueError(f"cursor {cursor[:40]!r} is not a session listing cursor")
    return key


def preview_of(messages: Sequence[ModelMessage]) -> str | None:
    """The start of the text of the last message that has text (whitespace collapsed)."""
    from pydantic_ai.messages import TextPart, UserPromptPart

    for message in reversed(messages):
        for part in reversed(message.parts):
            content: object = part.content if isinstance(part, TextPart | UserPromptPart) else None
            text = content if isinstance(content, str) else None
            if text and text.strip():
                flat = _SPACES.sub(" ", text).strip()
                return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"
    return None
