"""The stored layout of a session, and the encoding of messages.

A session lives in one KV scope (``<scope_prefix><session_id>``):

``state``
    One small record, rewritten by every transition with a compare-and-swap. Its bytes
    are a JSON header line, a newline, then the *inline tail*: a JSON array of the most
    recent messages (``ModelMessagesTypeAdapter`` format). The header holds the lease,
    the fence counter, the list of history chunks, the recovery marker and bookkeeping.
    The state's KV version is the fencing token: every write names the version it read.
``h/<id>/<part>``
    Immutable history chunks: each chunk is one JSON array of consecutive messages,
    split into parts no larger than the backend's item limit. Written *before* the state
    CAS that references them and never modified afterwards, so they can be cached by key.
``w``
    A short-lived hint written by a turn waiting for the session, so the task that just
    released it yields instead of taking it again at once (fair hand-over).
``q/<arrival>-<token>``
    One ticket per waiting client (store object), named by its arrival time, so a scan
    of ``q/`` lists the waiters in arrival order. Only the first live ticket tries to
    take the session; a ticket expires unless its waiter keeps it alive, so a dead
    waiter holds nobody up for long.

The history is ``[*chunk_0, *chunk_1, …, *tail]``. Everything here is pure: no I/O.
"""

from __future__ import annotations

import importlib.util
import json
import math
import operator
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import islice
from typing import TYPE_CHECKING, Any

from .catalog import check_catalog
from .errors import EffectCall

if TYPE_CHECKING:
    from pydantic.type_adapter import TypeAdapter
    from pydantic_ai.messages import ModelMessage

# Pydantic AI (the ``harness`` extra) is imported only when messages are encoded or
# decoded (see ``messages_adapter``): importing it costs over a second of CPU, which
# listing or inspecting sessions never needs. A missing install still fails here, on
# import, as the eager import did, so ``connect().sessions()`` reports it at once.
if importlib.util.find_spec("pydantic_ai") is None:
    raise ModuleNotFoundError("No module named 'pydantic_ai'", name="pydantic_ai")

FORMAT = "agent-stores.session/1"
STATE_KEY = "state"
WAITER_KEY = "w"
CHUNK_PREFIX = "h/"
QUEUE_PREFIX = "q/"

EMPTY_ARRAY = b"[]"

#: Key in the header's ``extra`` of the random mark every state write carries, so the
#: writer can recognise its own write after an ambiguous outcome (a lost reply). Native
#: acquires copy ``extra`` byte for byte, so the mark survives the next client's acquire.
WRITE_MARK = "w"

# Made once: ``json.dumps`` with options builds a new encoder on every call.
_COMPACT = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a session: an owner token, the fence number of the acquisition, and its expiry."""

    owner: str
    fence: int
    expires_at: float
    acquired_at: float


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """A pointer from the state to one immutable history chunk."""

    key: str
    count: int
    size: int
    parts: int
    level: int
    sealed: bool = False
    expires_at: float | None = None
    #: the KV scope holding the chunk when it is not the session's own: a chunk shared
    #: with the session this one was forked from (``forks.py``); None: the session's scope
    home: str | None = None

    def part_keys(self) -> list[str]:
        """The KV keys holding this chunk's bytes, in order."""
        return [f"{self.key}/{i}" for i in range(self.parts)]


@dataclass(frozen=True, slots=True)
class StateHeader:
    """The decoded header of the ``state`` record."""

    lease: Lease | None = None
    fence: int = 0
    chunks: tuple[ChunkRef, ...] = ()
    tail_count: int = 0
    recovery: tuple[EffectCall, ...] = ()
    recovery_since: float | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    released_by: str | None = None
    released_at: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: owner, title, tags, metadata and index bookkeeping (``catalog.py``); None: never set
    catalog: dict[str, Any] | None = None
    #: where a forked session came from: ``{"source", "count", "turn", "at"}`` (``forks.py``)
    lineage: dict[str, Any] | None = None
    #: written by a checkpoint inside a turn: ``{"fence", "count"}``, the lease's fence and
    #: the message count when that turn began (None: not an extension of it), so a fork
    #: taken while the turn runs reads the history as it was before it (never half a turn)
    open_turn: dict[str, Any] | None = None

    @property
    def message_count(self) -> int:
        """Messages in the whole history."""
        return sum(c.count for c in self.chunks) + self.tail_count

    def lease_live(self, now: float) -> bool:
        """True while the lease is held and not expired at ``now``."""
        return self.lease is not None and self.lease.expires_at > now


class RecordError(ValueError):
    """Stored bytes do not decode as a session record (turned into SESSION_INVALID by the caller)."""


# -- state record -------------------------------------------------------------------------


def encode_state(header: StateHeader, tail: bytes) -> bytes:
    """The bytes of a ``state`` record."""
    # Field order matters: the fields an acquire rewrites come first, so a native port
    # can take a lease by rewriting the bytes before ``,"chunks":`` (see ``port.py``).
    rewritten = {
        "format": FORMAT,
        "fence": header.fence,
        "lease": None
        if header.lease is None
        else {
            "owner": header.lease.owner,
            "fence": header.lease.fence,
            "expires_at": header.lease.expires_at,
            "acquired_at": header.lease.acquired_at,
        },
        "updated_at": header.updated_at,
        "released": None
        if header.released_by is None
        else {"by": header.released_by, "at": header.released_at},
    }
    rest: dict[str, Any] = {
        "tail_count": header.tail_count,
        "recovery": None
        if not header.recovery
        else {"calls": [list(c) for c in header.recovery], "since": header.recovery_since},
        "created_at": header.created_at,
    }
    if header.catalog is not None:
        rest["catalog"] = header.catalog
    if header.lineage is not None:
        rest["lineage"] = header.lineage
    if header.open_turn is not None:
        rest["open_turn"] = header.open_turn
    if header.extra:
        rest["extra"] = header.extra
    # The same bytes as one object encoded whole: "{…rewritten…" + ',"chunks":[…],' +
    # "…rest…}". The chunk list is most of a header and rarely changes between saves.
    kept = b"".join(
        (
            KEPT_FIELDS,
            _chunk_list_json(header.chunks),
            b",",
            _COMPACT.encode(rest)[1:].encode(),
        )
    )
    _remember_kept(kept, header)
    return b"".join((_COMPACT.encode(rewritten)[:-1].encode(), kept, b"\n", tail))


# The chunk lists encoded lately, by the identities of their refs, and each ref's own
# encoding: a session's saves between two spills write the same refs again, and a spill
# adds one or two to them (refs are frozen, so their encoding cannot change). Entries hold
# the refs, so no live ref can share an identity with a cached one: an equal key is the
# same refs. Insertion-ordered, the oldest goes first past the bound.
_chunk_lists: OrderedDict[tuple[int, ...], tuple[tuple[ChunkRef, ...], bytes]] = OrderedDict()
_chunk_refs: OrderedDict[int, tuple[ChunkRef, str]] = OrderedDict()
_CHUNK_LISTS_ENTRIES = 4096
_CHUNK_REFS_ENTRIES = 16384


def _chunk_list_json(chunks: tuple[ChunkRef, ...]) -> bytes:
    if not chunks:
        return EMPTY_ARRAY
    identities = tuple(map(id, chunks))
    cached = _chunk_lists.get(identities)
    if cached is not None:
        return cached[1]
    text = ("[" + ",".join(map(_chunk_ref_json, chunks)) + "]").encode()
    _bounded_put(_chunk_lists, _CHUNK_LISTS_ENTRIES, identities, (tuple(chunks), text))
    return text


def _chunk_ref_json(c: ChunkRef) -> str:
    cached = _chunk_refs.get(id(c))
    if cached is not None:
        return cached[1]
    text = _COMPACT.encode(
        [c.key, c.count, c.size, c.parts, c.level, c.sealed, c.expires_at]
        if c.home is None
        else [c.key, c.count, c.size, c.parts, c.level, c.sealed, c.expires_at, c.home]
    )
    _bounded_put(_chunk_refs, _CHUNK_REFS_ENTRIES, id(c), (c, text))
    return text


def _bounded_put(cache: OrderedDict[Any, Any], entries: int, key: Any, value: Any) -> None:
    """``cache[key] = value``, the oldest entry evicted first past ``entries``.

    An ``OrderedDict`` evicts its oldest entry at once; a plain dict finds its first live
    entry by skipping the deleted ones before it, thousands once a cache stays full (5 µs
    a put at 16,384 entries instead of 0.15, several puts a turn in a process that has
    served many sessions).
    """
    if len(cache) >= entries:
        try:
            cache.popitem(last=False)
        except KeyError:  # another thread emptied it meanwhile
            pass
    cache[key] = value


#: The first field of the part of a header an acquire copies byte for byte (``port.py``):
#: the fields before it (fence, lease, updated_at, released) are the ones it rewrites.
KEPT_FIELDS = b',"chunks":'
_REWRITTEN_FIELDS = frozenset({"format", "fence", "lease", "updated_at", "released"})


@dataclass(frozen=True, slots=True)
class _KeptFields:
    chunks: tuple[ChunkRef, ...]
    tail_count: int
    recovery: tuple[EffectCall, ...]
    recovery_since: float | None
    created_at: float
    extra: dict[str, Any]
    catalog: dict[str, Any] | None
    lineage: dict[str, Any] | None
    open_turn: dict[str, Any] | None


# The kept part of the headers this process encoded lately, already decoded: the next
# acquire of such a session reads the same bytes back behind a rewritten lease, so only
# the few fields before them are parsed (the chunk list is most of a header's decode).
# Insertion-ordered, the oldest entry goes first past the bound.
_kept_decoded: OrderedDict[bytes, _KeptFields] = OrderedDict()
_KEPT_DECODED_ENTRIES = 4096


def _remember_kept(kept: bytes, header: StateHeader) -> None:
    """Note ``kept`` (a header's bytes from ``,"chunks":`` on) as the encoding of ``header``'s kept fields."""
    # Only what decodes back to equal values (other extras could change type in JSON;
    # a recovery time without calls is not stored, hence read as None, below).
    if any(type(v) is not str for v in header.extra.values()):
        return
    fields = _KeptFields(
        header.chunks,
        header.tail_count,
        header.recovery,
        None
        if not header.recovery or header.recovery_since is None
        else float(header.recovery_since),
        float(header.created_at),
        dict(header.extra),
        header.catalog,
        header.lineage,
        header.open_turn,
    )
    _bounded_put(_kept_decoded, _KEPT_DECODED_ENTRIES, kept, fields)


def _with_kept(
    kept: _KeptFields,
    lease: Lease | None,
    fence: int,
    updated_at: float,
    released_by: str | None,
    released_at: float | None,
) -> StateHeader:
    """A header of ``kept`` fields (as decoded) and the rewritten ones."""
    return StateHeader(
        lease=lease,
        fence=fence,
        chunks=kept.chunks,
        tail_count=kept.tail_count,
        recovery=kept.recovery,
        recovery_since=kept.recovery_since,
        created_at=kept.created_at,
        updated_at=updated_at,
        released_by=released_by,
        released_at=released_at,
        extra=dict(kept.extra),
        catalog=kept.catalog,
        lineage=kept.lineage,
        open_turn=kept.open_turn,
    )


# States an acquire just made of a state this process encoded (``port.acquired_state``),
# decoded from the fields noted then; the core decodes each once, from the acquire's
# reply, and the entry goes with it. The reply holds the very bytes object made here, so
# the lookup hashes nothing again (a bytes object keeps its hash). Bounded: a reply that
# never comes back to be decoded (an error between) leaves its entry until evicted.
_acquired_states: OrderedDict[bytes, tuple[StateHeader, bytes]] = OrderedDict()
_ACQUIRED_STATES_ENTRIES = 256


def remember_acquired(
    value: bytes, kept: bytes, tail: bytes, *, fence: int, owner: str, lease_end: float, now: float
) -> None:
    """Note ``value``, an acquire's rewrite of a stored state (``port.acquired_state``:
    its kept header bytes ``kept``, from ``,"chunks":`` to the newline, and its ``tail``),
    as :func:`decode_state` would read it, when this process encoded those kept fields."""
    fields = _kept_decoded.get(kept)
    if fields is None or type(owner) is not str or type(fence) is not int:
        return
    try:
        at = _num(float(now))
        lease = Lease(owner, fence, _num(float(lease_end)), at)
    except (TypeError, ValueError, OverflowError):
        return
    header = _with_kept(fields, lease, fence, at, None, None)
    try:
        _check_tail(header, tail)
    except RecordError:
        return  # the decoder reports it
    _bounded_put(_acquired_states, _ACQUIRED_STATES_ENTRIES, value, (header, tail))


def _decode_known_header(head: bytes) -> StateHeader | None:
    """``head`` decoded when its kept part is one this process encoded, else None.

    Only an exact layout is taken (the rewritten fields and nothing else before the kept
    part); anything else, valid or not, goes through the full decode and its errors.
    """
    at = head.find(KEPT_FIELDS)
    if at < 0:
        return None
    kept = _kept_decoded.get(head[at:])
    if kept is None:
        return None
    try:
        doc = json.loads(head[:at].decode() + "}")
        if type(doc) is not dict or doc.keys() != _REWRITTEN_FIELDS or doc["format"] != FORMAT:
            return None
        released = doc["released"]
        return _with_kept(
            kept,
            _lease(doc["lease"]),
            _int(doc["fence"]),
            _num(doc["updated_at"]),
            None if released is None else _str(released["by"]),
            None if released is None else _num(released["at"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def decode_state(value: bytes) -> tuple[StateHeader, bytes]:
    """Split and validate a ``state`` record; raises :class:`RecordError` on anything unexpected."""
    if _acquired_states and type(value) is bytes:
        noted = _acquired_states.pop(value, None)
        if noted is not None:
            return noted
    head, sep, tail = bytes(value).partition(b"\n")
    if not sep:
        raise RecordError("the state record has no header line")
    header = _decode_known_header(head) or _decode_header(head)
    _check_tail(header, tail)
    return header, tail


def _decode_header(head: bytes) -> StateHeader:
    try:
        doc = json.loads(head)
    except ValueError as exc:
        raise RecordError(f"the state header is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise RecordError(f"the state header is not a {FORMAT} record")
    try:
        # Read in this order so a malformed record names the same field it always did.
        lease = _lease(doc["lease"])
        chunks = tuple(_chunk(item) for item in _list(doc["chunks"]))
        recovery, since = _recovery(doc["recovery"])
        released = doc.get("released")
        return StateHeader(
            lease=lease,
            fence=_int(doc["fence"]),
            chunks=chunks,
            tail_count=_int(doc["tail_count"]),
            recovery=recovery,
            recovery_since=since,
            created_at=_num(doc["created_at"]),
            updated_at=_num(doc["updated_at"]),
            released_by=None if released is None else _str(released["by"]),
            released_at=None if released is None else _num(released["at"]),
            extra=doc.get("extra") or {},
            catalog=check_catalog(doc.get("catalog")),
            lineage=_opt_dict(doc.get("lineage")),
            open_turn=_opt_dict(doc.get("open_turn")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"the state header is malformed ({type(exc).__name__}: {exc})") from None


def _lease(doc: Any) -> Lease | None:
    if doc is None:
        return None
    return Lease(
        owner=_str(doc["owner"]),
        fence=_int(doc["fence"]),
        expires_at=_num(doc["expires_at"]),
        acquired_at=_num(doc["acquired_at"]),
    )


def _recovery(doc: Any) -> tuple[tuple[EffectCall, ...], float | None]:
    if doc is None:
        return (), None
    calls = tuple(
        EffectCall(_str(name), _str(call_id))
        for name, call_id in (_pair(c) for c in _list(doc["calls"]))
    )
    return calls, _opt_num(doc.get("since"))


def _check_tail(header: StateHeader, tail: bytes) -> None:
    """The inline tail and the chunk references agree with what the header says."""
    if not tail.startswith(b"[") or not tail.endswith(b"]"):
        raise RecordError("the inline tail is not a JSON array")
    if any(c.count < 1 or c.size < 2 or c.parts < 1 for c in header.chunks):
        raise RecordError("a chunk reference has impossible sizes")
    if header.tail_count < 0 or (header.tail_count == 0) != (tail == EMPTY_ARRAY):
        raise RecordError("the inline tail does not match its message count")


def _chunk(item: Any) -> ChunkRef:
    fields = list(_list(item))
    home = _str(fields.pop()) if len(fields) == 8 else None
    key, count, size, parts, level, sealed, expires_at = fields
    key = _str(key)
    if not key.startswith(CHUNK_PREFIX):
        raise ValueError(f"chunk key {key!r} outside {CHUNK_PREFIX}")
    return ChunkRef(
        key=key,
        count=_int(count),
        size=_int(size),
        parts=_int(parts),
        level=_int(level),
        sealed=bool(sealed),
        expires_at=_opt_num(expires_at),
        home=home,
    )


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _int(v: Any) -> int:
    if type(v) is int:  # the usual case, without the two isinstance checks
        return v
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    return v


def _num(v: Any) -> float:
    if type(v) is float and math.isfinite(v):
        return v
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
        raise TypeError(f"expected a number, got {v!r}")
    return float(v)


def _opt_num(v: Any) -> float | None:
    return None if v is None else _num(v)


def _opt_dict(v: Any) -> dict[str, Any] | None:
    if v is not None and not isinstance(v, dict):
        raise TypeError(f"expected an object, got {type(v).__name__}")
    return v


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise TypeError(f"expected a list, got {type(v).__name__}")
    return v


def _pair(v: Any) -> tuple[Any, Any]:
    items = _list(v)
    if len(items) != 2:
        raise ValueError("expected a [tool_name, tool_call_id] pair")
    return items[0], items[1]


# -- messages -------------------------------------------------------------------------------


@cache
def messages_adapter() -> TypeAdapter[list[ModelMessage]]:
    """Pydantic AI's ``ModelMessagesTypeAdapter``, imported on first use."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    return ModelMessagesTypeAdapter


def encode_messages(messages: Sequence[ModelMessage]) -> bytes:
    """A JSON array of ``messages`` in Pydantic AI's public format."""
    if not messages:
        return EMPTY_ARRAY
    return messages_adapter().dump_json(list(messages))


def decode_messages(data: bytes, expected_count: int) -> list[ModelMessage]:
    """Messages from a JSON array; :class:`RecordError` if invalid or not ``expected_count`` long."""
    try:
        messages = messages_adapter().validate_json(data)
    except ValueError as exc:
        raise RecordError(f"stored messages do not validate: {str(exc)[:300]}") from None
    if len(messages) != expected_count:
        raise RecordError(f"expected {expected_count} stored messages, found {len(messages)}")
    return messages


def join_arrays(arrays: Iterable[bytes]) -> bytes:
    """Concatenate JSON arrays without decoding them."""
    inner = [a[1:-1] for a in arrays if a != EMPTY_ARRAY]
    return b"[" + b",".join(inner) + b"]" if inner else EMPTY_ARRAY


def without_last(array: bytes, last: bytes) -> bytes | None:
    """The JSON array ``array`` without its last element, whose own one-element array is
    ``last`` (both as :func:`encode_messages` writes them), or None if ``array`` does not
    end with that element. Saves encoding the other elements a second time."""
    inner = last[1:-1]
    if len(last) < 3 or not array.endswith(b"," + inner + b"]"):
        return None
    return array[: len(array) - len(inner) - 2] + b"]"


def split_parts(data: bytes, part_size: int) -> list[bytes]:
    """Cut ``data`` into pieces of at most ``part_size`` bytes (at least one piece)."""
    return [data[i : i + part_size] for i in range(0, len(data), part_size)] or [b""]


def is_extension(new: Sequence[ModelMessage], old: Sequence[ModelMessage]) -> bool:
    """True when ``new`` starts with exactly the messages of ``old``.

    Identity is checked first: a history passed through ``agent.run(message_history=…)``
    comes back with the same message objects, which makes the usual case O(n) pointer
    comparisons; only unequal pairs are compared by their JSON.
    """
    if len(new) < len(old):
        return False
    if all(map(operator.is_, new, old)):
        return True  # the usual case, compared in C (a generator costs ~50 ns a message)
    # Equal JSON also counts: a decoded message may differ in type from the one saved
    # (BinaryContent of an image comes back as BinaryImage) yet stores the same.
    return all(
        a is b or a == b or encode_messages([a]) == encode_messages([b])
        for a, b in zip(new, old, strict=False)
    )


def extends_prefix(new: Sequence[ModelMessage], old: Sequence[ModelMessage], count: int) -> bool:
    """``new`` holds at least ``count`` messages and ``is_extension(new[:count],
    old[:count])``, without copying the two prefixes (a turn of a long history asks this
    of thousands of messages)."""
    if len(new) < count:
        return False
    if all(map(operator.is_, islice(new, count), islice(old, count))):
        return True
    return is_extension(new[:count], old[:count])


def effect_calls_succeeded(calls: Iterable[EffectCall], messages: Sequence[ModelMessage]) -> bool:
    """True when every call in ``calls`` has a ``ToolReturnPart`` with outcome ``'success'`` in ``messages``."""
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    wanted = {c.tool_call_id for c in calls}
    if not wanted:
        return True
    for message in reversed(messages):
        if not isinstance(message, ModelRequest):
            continue
        for part in message.parts:
            if (
                isinstance(part, ToolReturnPart)
                and part.outcome == "success"
                and part.tool_call_id in wanted
            ):
                wanted.discard(part.tool_call_id)
        if not wanted:
            return True
    return False
