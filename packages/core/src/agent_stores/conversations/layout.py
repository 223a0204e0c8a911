"""Where a Pydantic AI conversation lives in the KV store, and how its records are encoded.

Three kinds of KV scope, all under the store's ``scope_prefix``:

* ``{prefix}p:{id}`` — the conversation's *pointer*: which owner scope holds it. Written
  when the conversation is created, rewritten only when a deleted id is created again
  under another ``scope``; so a process reads it once and keeps it.
* ``{prefix}o-`` (no ``scope``) or ``{prefix}o={scope}`` — the *owner scope*: every
  conversation of one Pydantic AI ``scope`` keeps its record and its entries here, so a
  save commits the record and its new entries in one KV ``commit`` and
  ``list_conversations(scope=…)`` is one scan:

  (``{id}`` below is the conversation id, or ``#`` and its SHA-256 when it is long or odd)

  - ``r/{id}`` the record (JSON, the ``ConversationRecord`` plus where its entries live);
  - ``e/{id}/{inc}/{first entry id}`` a *segment*: the entries one save added, in order;
    ``…~0001`` continuation parts when a segment is larger than one KV value;
  - ``k/{id}/{inc}/{fork id}/{fork inc}`` a *pin*: a fork's history reaches into this
    incarnation's entries up to the entry the pin names;
  - ``g/{id}/{inc}`` *gone*: the conversation was deleted; its entries stay until no pin
    reaches them.

``inc`` (the *incarnation*) is minted when a conversation id is created, so a conversation
deleted and created again never mixes its entries with the old ones forks still use. A
*home* is the ``(owner scope, id, inc)`` triple whose segments hold an entry.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError
from pydantic_ai.conversation_store import ConversationEntry, ConversationRecord
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.usage import RunUsage

from .errors import ConversationDamagedError, ConversationFormatError

#: The format this code writes; a record or segment of a newer one is refused, not guessed.
FORMAT = 1

#: Longest conversation id or scope kept verbatim in a KV name; longer ones are hashed.
_VERBATIM_CHARS = 200

_usage_adapter: TypeAdapter[RunUsage] = TypeAdapter(RunUsage)
_deferred_adapter: TypeAdapter[DeferredToolRequests] = TypeAdapter(DeferredToolRequests)
_any_adapter: TypeAdapter[Any] = TypeAdapter(Any)


class Home(NamedTuple):
    """Where an entry's segment lives: owner scope, conversation's KV name, incarnation."""

    owner: str
    name: str
    inc: str

    def to_json(self) -> list[str]:
        return [self.owner, self.name, self.inc]

    @classmethod
    def from_json(cls, value: Any) -> Home:
        owner, name, inc = value
        return cls(str(owner), str(name), str(inc))


def kv_name(text: str) -> str:
    """``text`` as part of a KV name: verbatim when short and plain, else ``#`` and its hash."""
    if len(text) <= _VERBATIM_CHARS and not text.startswith("#") and "\x00" not in text:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            pass
        else:
            return text
    return "#" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Layout:
    """The KV names of one conversation store (its ``scope_prefix``)."""

    prefix: str

    def pointer_scope(self, conversation_id: str) -> str:
        return f"{self.prefix}p:{kv_name(conversation_id)}"

    def owner_scope(self, scope: str | None) -> str:
        return f"{self.prefix}o-" if scope is None else f"{self.prefix}o={kv_name(scope)}"

    @property
    def owner_prefix(self) -> str:
        return f"{self.prefix}o"

    @staticmethod
    def record_key(name: str) -> str:
        return f"r/{name}"

    @staticmethod
    def segments_prefix(home: Home) -> str:
        return f"e/{home.name}/{home.inc}/"

    @staticmethod
    def pins_prefix(home: Home) -> str:
        return f"k/{home.name}/{home.inc}/"

    @staticmethod
    def pin_key(home: Home, fork: Home) -> str:
        return f"{Layout.pins_prefix(home)}{fork.name}/{fork.inc}"

    @staticmethod
    def gone_key(home: Home) -> str:
        return f"g/{home.name}/{home.inc}"


POINTER_KEY = "p"


# -- records ---------------------------------------------------------------------------------


@dataclass
class StoredRecord:
    """A ``ConversationRecord`` as stored, with what locates its entries."""

    record: ConversationRecord
    inc: str
    head_home: Home | None
    branch_homes: dict[str, Home] = field(default_factory=dict[str, Home])
    #: The home of ``record.forked_at``, whose incarnation this one's pin keeps alive.
    forked_home: Home | None = None

    def homes(self) -> Iterable[tuple[str, Home]]:
        """Every entry id the record names with its home (to locate histories)."""
        if self.record.head_id is not None and self.head_home is not None:
            yield self.record.head_id, self.head_home
        yield from self.branch_homes.items()
        if self.record.forked_at is not None and self.forked_home is not None:
            yield self.record.forked_at, self.forked_home


def encode_record(stored: StoredRecord) -> bytes:
    record = stored.record
    body: dict[str, Any] = {
        "f": FORMAT,
        "id": record.conversation_id,
        "inc": stored.inc,
        "head": record.head_id,
        "head_home": stored.head_home.to_json() if stored.head_home else None,
        "usage": _usage_adapter.dump_python(record.usage, mode="json"),
        "deferred": (
            _deferred_adapter.dump_python(record.deferred_tool_requests, mode="json")
            if record.deferred_tool_requests is not None
            else None
        ),
        "scope": record.scope,
        "forked_from": record.forked_from,
        "forked_at": record.forked_at,
        "forked_home": stored.forked_home.to_json() if stored.forked_home else None,
        "title": record.title,
        "metadata": _any_adapter.dump_python(record.metadata, mode="json"),
        "branches": record.branches,
        "branch_homes": {tip: home.to_json() for tip, home in stored.branch_homes.items()},
        "revision": record.revision,
        "updated_at": record.updated_at.isoformat(),
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def decode_record(conversation_id: str, raw: bytes) -> StoredRecord:
    """The stored record; ``ConversationDamagedError`` / ``ConversationFormatError`` naming it."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConversationDamagedError(conversation_id, f"its record is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ConversationDamagedError(conversation_id, "its record is not a JSON object")
    version = body.get("f")
    if isinstance(version, int) and version > FORMAT:
        raise ConversationFormatError(conversation_id, version, FORMAT)
    if version != FORMAT or body.get("id") != conversation_id:
        raise ConversationDamagedError(
            conversation_id,
            "its record is not a conversation record of this store "
            f"(format {version!r}, conversation {body.get('id')!r})",
        )
    try:
        return _record_from(body)
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise ConversationDamagedError(
            conversation_id, f"its record is malformed ({type(exc).__name__}: {exc})"
        ) from None


def decode_record_named(name: str, raw: bytes) -> StoredRecord:
    """The record stored under KV name ``name`` (read by a scan, its id not known yet);
    ``ConversationDamagedError`` when it names a conversation that is not stored there."""
    try:
        found = json.loads(raw).get("id")
    except (ValueError, UnicodeDecodeError, AttributeError):
        raise ConversationDamagedError(name, "its record is not a JSON object") from None
    if not isinstance(found, str) or kv_name(found) != name:
        raise ConversationDamagedError(name, f"its record names conversation {found!r}")
    return decode_record(found, raw)


def _record_from(body: dict[str, Any]) -> StoredRecord:
    deferred = body["deferred"]
    record = ConversationRecord(
        conversation_id=body["id"],
        head_id=body["head"],
        usage=_usage_adapter.validate_python(body["usage"]),
        deferred_tool_requests=(
            _deferred_adapter.validate_python(deferred) if deferred is not None else None
        ),
        scope=body["scope"],
        forked_from=body["forked_from"],
        forked_at=body["forked_at"],
        title=body["title"],
        metadata=body["metadata"],
        branches=[str(tip) for tip in body["branches"]],
        revision=str(body["revision"]),
        updated_at=datetime.fromisoformat(body["updated_at"]),
    )
    head_home = body["head_home"]
    forked_home = body.get("forked_home")
    return StoredRecord(
        record=record,
        inc=str(body["inc"]),
        head_home=Home.from_json(head_home) if head_home is not None else None,
        branch_homes={
            str(tip): Home.from_json(home) for tip, home in dict(body["branch_homes"]).items()
        },
        forked_home=Home.from_json(forked_home) if forked_home is not None else None,
    )


# -- segments ---------------------------------------------------------------------------------


class StoredEntry(NamedTuple):
    """An entry read back, with the home of its parent when that is another home."""

    entry: ConversationEntry
    parent_home: Home | None


#: A continuation part's marker: a segment too large for one KV value is split in parts.
PART_MARK = "~"
_PARTS_HEADER = b"P"


def encode_segment(entries: Sequence[StoredEntry]) -> bytes:
    messages: list[ModelMessage] = [item.entry.message for item in entries]
    body = {
        "f": FORMAT,
        "ids": [item.entry.id for item in entries],
        "parents": [item.entry.parent_id for item in entries],
        "kinds": [item.entry.kind for item in entries],
        "parent_homes": {
            str(index): item.parent_home.to_json()
            for index, item in enumerate(entries)
            if item.parent_home is not None
        },
        "messages": ModelMessagesTypeAdapter.dump_python(messages, mode="json"),
    }
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def decode_segment(conversation_id: str, key: str, raw: bytes) -> list[StoredEntry]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConversationDamagedError(
            conversation_id, f"its entry segment {key!r} is not JSON ({exc})"
        ) from None
    if not isinstance(body, dict):
        raise ConversationDamagedError(
            conversation_id, f"its entry segment {key!r} is not an object"
        )
    version = body.get("f")
    if isinstance(version, int) and version > FORMAT:
        raise ConversationFormatError(conversation_id, version, FORMAT)
    try:
        messages = ModelMessagesTypeAdapter.validate_python(body["messages"])
        homes = {int(index): Home.from_json(home) for index, home in body["parent_homes"].items()}
        entries = [
            StoredEntry(
                ConversationEntry(id=str(entry_id), parent_id=parent, message=message, kind=kind),
                homes.get(index),
            )
            for index, (entry_id, parent, kind, message) in enumerate(
                zip(body["ids"], body["parents"], body["kinds"], messages, strict=True)
            )
        ]
    except (KeyError, TypeError, ValueError, ValidationError) as exc:
        raise ConversationDamagedError(
            conversation_id,
            f"its entry segment {key!r} is malformed ({type(exc).__name__}: {str(exc)[:200]})",
        ) from None
    return entries


def split_parts(value: bytes, limit: int) -> list[bytes]:
    """``value`` as one KV value, or a parts header followed by the parts, each within ``limit``."""
    if len(value) <= limit:
        return [value]
    size = limit - 64
    parts = [value[start : start + size] for start in range(0, len(value), size)]
    return [_PARTS_HEADER + str(len(parts)).encode(), *parts]


def part_key(base: str, index: int) -> str:
    return f"{base}{PART_MARK}{index:04d}"


def joined_segments(items: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """Scanned ``(key, value)`` pairs with each split segment joined back, in key order.

    A segment whose parts are not all there (a write in progress, or released under a
    reader) is left out; the history walk then finds its entries missing.
    """
    joined: list[tuple[str, bytes]] = []
    index = 0
    while index < len(items):
        key, value = items[index]
        index += 1
        if PART_MARK in key.rsplit("/", 1)[-1]:
            continue  # a part whose header was not seen
        if not value.startswith(_PARTS_HEADER):
            joined.append((key, value))
            continue
        count = int(value[len(_PARTS_HEADER) :] or b"0")
        wanted = [part_key(key, n) for n in range(1, count + 1)]
        got = items[index : index + count]
        if [k for k, _ in got] == wanted:
            joined.append((key, b"".join(v for _, v in got)))
            index += count
    return joined
