"""A per-store LRU cache of immutable history chunks.

Chunks never change once written (a new version of a chunk is a new key), so a process
that served the previous turn of a session only reads what is new: the state record and
any chunk written by another process since. Entries hold both the raw JSON (reused when
chunks are merged or copied) and the decoded messages.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage


@dataclass(frozen=True, slots=True)
class CachedChunk:
    """One chunk: its JSON array bytes and the decoded messages."""

    raw: bytes
    messages: tuple[ModelMessage, ...]


class ChunkCache:
    """Least-recently-used chunks, bounded by the total size of their raw bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, str], CachedChunk] = OrderedDict()
        # Keys per scope, so an acquire can tell the server which chunks it need not send.
        self._by_scope: dict[str, set[str]] = {}
        self._bytes = 0
        # Stores may be shared by threads running their own event loops.
        self._lock = threading.Lock()

    def get(self, scope: str, key: str) -> CachedChunk | None:
        """The cached chunk, marked as recently used, or None."""
        with self._lock:
            item = self._items.get((scope, key))
            if item is not None:
                self._items.move_to_end((scope, key))
            return item

    def put(self, scope: str, key: str, chunk: CachedChunk) -> None:
        """Remember ``chunk``; evicts the least recently used ones past ``max_bytes``."""
        size = len(chunk.raw)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop((scope, key), None)
            if old is not None:
                self._bytes -= len(old.raw)
            self._items[(scope, key)] = chunk
            self._by_scope.setdefault(scope, set()).add(key)
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                (gone_scope, gone_key), evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted.raw)
                self._unindex(gone_scope, gone_key)

    def discard(self, scope: str, key: str) -> None:
        """Forget a chunk (after it was deleted)."""
        with self._lock:
            old = self._items.pop((scope, key), None)
            if old is not None:
                self._bytes -= len(old.raw)
                self._unindex(scope, key)

    def keys(self, scope: str) -> frozenset[str]:
        """The keys of the chunks of ``scope`` held now."""
        with self._lock:
            return frozenset(self._by_scope.get(scope, ()))

    def _unindex(self, scope: str, key: str) -> None:
        keys = self._by_scope.get(scope)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_scope[scope]

    def __len__(self) -> int:
        return len(self._items)
