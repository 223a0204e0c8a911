"""History chunks shared between sessions: forks, rewinds, and when a chunk may go.

A fork refers to the chunks of the session it was taken from instead of copying them
(:attr:`~agent_stores.sessions.records.ChunkRef.home` names the scope holding such a
chunk), and a rewind keeps the history it discards as a *branch*. Both add records to
a session's scope (``<scope_prefix><session_id>``), under ``r/``:

``r/p/<digest>``
    A *pin*: the chunks of this scope that another session (the fork, named in the
    value, ``<digest>`` its scope's hash) or one of that session's branches references.
    ``{"scope": <fork's scope>, "keys": [<chunk key>, …]}``. Written *before* the fork's
    state references them; rewritten (smaller) after the fork stops needing some.
``r/b/<ms>-<token>``
    A *branch*: a JSON header line ``{"at", "count", "reason"}``, a newline, then the
    bytes of the state record whose history a rewind (or restore) replaced.

**The rule.** A chunk is deleted only by whoever removed the last reference to it, and
only after checking, *after* its own write landed: the scope's state, the scope's
branches, the scope's pins. A fork writes its pin and then reads the state it forked
from again: if that state still references the chunks, every later removal of them
lands after the pin and sees it; if not, the fork starts over. So no chunk another
session can still read is ever deleted. Two removals racing may each leave a chunk to
the other: it is then left to its TTL (never read again: a leak, not a loss).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import TurnOutOfRangeError
from .records import ChunkRef, RecordError, StateHeader, decode_state, encode_state

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

#: every record of this module starts with it (one scan finds pins and branches)
REF_PREFIX = "r/"
PIN_PREFIX = "r/p/"
BRANCH_PREFIX = "r/b/"


def pin_key(pinner_scope: str) -> str:
    """The key of the pin that ``pinner_scope`` keeps in a home scope."""
    return PIN_PREFIX + hashlib.sha256(pinner_scope.encode()).hexdigest()[:32]


def encode_pin(pinner_scope: str, keys: Iterable[str]) -> bytes:
    """A pin's value."""
    return json.dumps({"scope": pinner_scope, "keys": sorted(set(keys))}).encode()


def decode_pin(value: bytes) -> tuple[str, frozenset[str]]:
    """The pinner's scope and the chunk keys of a pin; RecordError when it does not decode."""
    try:
        doc = json.loads(value)
        scope, keys = doc["scope"], doc["keys"]
        if not isinstance(scope, str) or not all(isinstance(k, str) for k in keys):
            raise TypeError("pin fields of the wrong type")
        return scope, frozenset(keys)
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"a chunk pin does not decode ({exc})") from None


def new_branch_key(now: float) -> str:
    """A branch key: creation order first (a scan lists branches oldest first)."""
    return f"{BRANCH_PREFIX}{int(now * 1000):013d}-{time.perf_counter_ns() % 10**6:06d}"


@dataclass(frozen=True, slots=True)
class BranchInfo:
    """A history a rewind or restore set aside, as :meth:`SessionStore.branches` lists it."""

    #: pass it to :meth:`SessionStore.restore`
    branch_id: str
    #: when it was set aside (store clock, unix seconds)
    created_at: float
    #: messages in that history
    message_count: int
    #: ``"rewind"`` or ``"restore"``: what set it aside
    reason: str


@dataclass(frozen=True, slots=True)
class ForkReport:
    """What :meth:`SessionStore.fork` created."""

    session_id: str
    source: str
    #: messages the new session starts with
    message_count: int
    #: the turn it was cut at (None: the whole committed history)
    at_turn: int | None
    #: history chunks it reads from the source's scope instead of holding its own
    shared_chunks: int
    #: True when the owners differ: every chunk was copied, nothing is shared
    copied: bool
    #: bytes the fork wrote (its state record and any chunk it could not share)
    bytes_written: int


def encode_branch(header: StateHeader, tail: bytes, *, at: float, reason: str) -> bytes:
    """A branch record: what it is, then the state it keeps (without the lease)."""
    kept = StateHeader(
        fence=header.fence,
        chunks=header.chunks,
        tail_count=header.tail_count,
        created_at=header.created_at,
        updated_at=header.updated_at,
    )
    meta = json.dumps({"at": at, "count": header.message_count, "reason": reason}).encode()
    return meta + b"\n" + encode_state(kept, tail)


def decode_branch(branch_id: str, value: bytes) -> tuple[BranchInfo, StateHeader, bytes]:
    """A branch record's summary and the state it keeps; RecordError when it does not decode."""
    meta, sep, state = value.partition(b"\n")
    if not sep:
        raise RecordError("a branch record has no header line")
    try:
        doc = json.loads(meta)
        info = BranchInfo(branch_id, float(doc["at"]), int(doc["count"]), str(doc["reason"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"a branch header does not decode ({exc})") from None
    header, tail = decode_state(state)
    return info, header, tail


def branch_id_of(key: str) -> str:
    """The id a caller sees for the branch stored at ``key``."""
    return key[len(BRANCH_PREFIX) :]


def refs_by_home(own_scope: str, refs: Iterable[ChunkRef]) -> dict[str, list[ChunkRef]]:
    """``refs`` grouped by the scope holding each (``own_scope`` for the session's own)."""
    out: dict[str, list[ChunkRef]] = {}
    for ref in refs:
        out.setdefault(ref.home or own_scope, []).append(ref)
    return out


def rehomed(ref: ChunkRef, source_scope: str, target_scope: str) -> ChunkRef:
    """``ref`` as read by a session at ``target_scope``, given as stored at ``source_scope``."""
    home = ref.home or source_scope
    return replace(ref, home=None if home == target_scope else home)


def protected_keys(scope: str, records: Sequence[tuple[str, bytes]]) -> set[str]:
    """Keys of ``scope``'s own chunks that its branches or other sessions' pins still name.

    ``records``: the ``r/`` entries of ``scope``. A record that does not decode protects
    nothing it cannot name, but is never deleted here (``doctor`` reports it).
    """
    keys: set[str] = set()
    for key, value in records:
        try:
            if key.startswith(PIN_PREFIX):
                keys.update(decode_pin(value)[1])
            elif key.startswith(BRANCH_PREFIX):
                _, header, _ = decode_branch(branch_id_of(key), value)
                keys.update(r.key for r in header.chunks if r.home is None)
        except RecordError:
            continue
    return keys


def foreign_needs(
    scope: str, header: StateHeader | None, branches: Sequence[StateHeader]
) -> dict[str, set[str]]:
    """Per home scope, the keys of its chunks that the session at ``scope`` still needs."""
    out: dict[str, set[str]] = {}
    for h in (*([header] if header is not None else []), *branches):
        for ref in h.chunks:
            if ref.home is not None and ref.home != scope:
                out.setdefault(ref.home, set()).add(ref.key)
    return out


def turn_starts(messages: Sequence[ModelMessage]) -> list[int]:
    """Where each turn of a history starts: the index of each request carrying a user prompt.

    Turn ``k`` of a history (0-based) is what happened from its ``k``-th user prompt up to
    the next one; "the history up to turn ``k``" is everything before the ``k``-th start
    (``k`` equal to the number of turns: all of it).
    """
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    return [
        i
        for i, m in enumerate(messages)
        if isinstance(m, ModelRequest) and any(isinstance(p, UserPromptPart) for p in m.parts)
    ]


def cut_at_turn(messages: Sequence[ModelMessage], turn: int, what: str) -> int:
    """The message count of the history up to ``turn``; :class:`TurnOutOfRangeError`
    naming the turns there are."""
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise TurnOutOfRangeError(f"{what}: a turn must be an integer >= 0, got {turn!r}")
    starts = turn_starts(messages)
    if turn > len(starts):
        raise TurnOutOfRangeError(
            f"{what}: turn {turn} is past the end (the history has {len(starts)} turns)"
        )
    return starts[turn] if turn < len(starts) else len(messages)


def lineage_doc(source: str, count: int, turn: int | None, at: float) -> dict[str, Any]:
    """The ``lineage`` field of a fork's state header."""
    return {"source": source, "count": count, "turn": turn, "at": at}
