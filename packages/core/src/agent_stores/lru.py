"""A small bounded mapping that drops its least recently used key first.

The stores keep what they learned of recent runs and sessions in these (a log's counter
version, a run's expiry, the state a session store saved last), bounded so a process
serving millions of them keeps only the busy ones.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``size`` keys; reading or setting a key makes it the most recent.

    Safe to share between threads (stores may be used from several threads, each with
    its own event loop): each method holds a lock, since a read's look-up and its move
    to the end are two steps another thread's removal could fall between.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def set(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._data.pop(key, None)

    def discard_where(self, predicate: Callable[[K], bool]) -> None:
        with self._lock:
            for key in [k for k in self._data if predicate(k)]:
                del self._data[key]
