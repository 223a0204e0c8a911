"""A per-store cache of immutable history chunks, bounded by their raw size.

Chunks never change once written (a new version of a chunk is a new key), so a process
that served the previous turn of a session only reads what is new: the state record and
any chunk written by another process since. Entries hold both the raw JSON (reused when
chunks are merged or copied) and the decoded messages.

Eviction is random among the entries not used recently, not strictly least-recently-used:
many sessions served in turn form a cycle, and a cycle a little larger than the cache makes
LRU evict every chunk just before it is needed again (no hit at all), where random eviction
keeps most of them. An entry used within the last eighth of accesses is passed over (unless
eight random picks find nothing older), so a chunk just written or read survives until its
session's next turn.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

#: entries used within this share of the last accesses are passed over by eviction
_RECENT_SHARE = 8
#: random picks tried before an eviction takes whatever it drew
_EVICTION_TRIES = 8


@dataclass(frozen=True, slots=True)
class CachedChunk:
    """One chunk: its JSON array bytes and the decoded messages."""

    raw: bytes
    messages: tuple[ModelMessage, ...]


_Key = tuple[str, str]


class ChunkCache:
    """Chunks bounded by the total size of their raw bytes; see the module for eviction."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: dict[_Key, CachedChunk] = {}
        # When each entry was last used (a counter of accesses, not a clock).
        self._used: dict[_Key, int] = {}
        self._clock = 0
        # The keys in a list with each key's position, so a random pick and a removal are O(1).
        self._order: list[_Key] = []
        self._slot: dict[_Key, int] = {}
        # Keys per scope, so an acquire can tell the server which chunks it need not send.
        self._by_scope: dict[str, set[str]] = {}
        self._bytes = 0
        self._random = random.Random()
        # Stores may be shared by threads running their own event loops.
        self._lock = threading.Lock()

    def get(self, scope: str, key: str) -> CachedChunk | None:
        """The cached chunk, marked as recently used, or None."""
        with self._lock:
            item = self._items.get((scope, key))
            if item is not None:
                self._clock += 1
                self._used[(scope, key)] = self._clock
            return item

    def put(self, scope: str, key: str, chunk: CachedChunk) -> None:
        """Remember ``chunk``; evicts others while the cache holds more than ``max_bytes``."""
        size = len(chunk.raw)
        if size > self.max_bytes:
            return
        entry = (scope, key)
        with self._lock:
            old = self._items.get(entry)
            if old is not None:
                self._bytes -= len(old.raw)
            else:
                self._slot[entry] = len(self._order)
                self._order.append(entry)
                self._by_scope.setdefault(scope, set()).add(key)
            self._items[entry] = chunk
            self._clock += 1
            self._used[entry] = self._clock
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._order) > 1:
                self._remove(self._victim(entry))

    def discard(self, scope: str, key: str) -> None:
        """Forget a chunk (after it was deleted)."""
        with self._lock:
            if (scope, key) in self._items:
                self._remove((scope, key))

    def keys(self, scope: str) -> frozenset[str]:
        """The keys of the chunks of ``scope`` held now."""
        with self._lock:
            return frozenset(self._by_scope.get(scope, ()))

    def _victim(self, keep: _Key) -> _Key:
        recent = self._clock - len(self._order) // _RECENT_SHARE
        pick = keep
        for _ in range(_EVICTION_TRIES):
            pick = self._order[self._random.randrange(len(self._order))]
            if pick != keep and self._used[pick] <= recent:
                return pick
        if pick == keep:
            # Never the entry being added: the other end of the list always differs from it.
            pick = self._order[0] if self._order[0] != keep else self._order[-1]
        return pick

    def _remove(self, entry: _Key) -> None:
        chunk = self._items.pop(entry)
        self._bytes -= len(chunk.raw)
        del self._used[entry]
        slot = self._slot.pop(entry)
        last = self._order.pop()
        if last != entry:
            self._order[slot] = last
            self._slot[last] = slot
        scope, key = entry
        keys = self._by_scope.get(scope)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_scope[scope]

    @property
    def held_bytes(self) -> int:
        """The total raw size of the chunks held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
