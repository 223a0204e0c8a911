"""``memory://[NAME]`` — a process-local store, for tests and single-process apps.

Stores opened with the same URL in one process share their data (like a SQLite file),
so two store objects behave like two clients of one server. Every operation runs
without awaiting inside the critical section, and a thread lock guards the data, so it
is safe for any number of tasks, event loops and threads. Like a network round trip,
every operation first yields to the event loop (``_round_trip``), so concurrent tasks
really interleave between a read and the write that depends on it.
"""

from __future__ import annotations

import asyncio
import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import ConflictError
from ..kv.base import (
    DEFAULT_DEADLINE_SECONDS,
    Check,
    Clock,
    Create,
    Delete,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
    new_version,
)
from ..url import StoreURL, URLOption, URLOptions, check_options

DEFAULT_MAX_VALUE_BYTES = 4 << 20

URL_OPTIONS = URLOptions(
    URLOption(
        "max_value_bytes",
        "int",
        DEFAULT_MAX_VALUE_BYTES,
        "largest value per entry (at least 1024); small values exercise the stores' chunking",
    ),
    URLOption(
        "deadline",
        "float",
        DEFAULT_DEADLINE_SECONDS,
        "seconds one call may take before `BackendUnavailableError`",
    ),
    URLOption.auto_setup(True, "nothing to create (accepted so one URL works on every backend)"),
)


@dataclass
class _Scope:
    entries: dict[str, Entry] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # sorted


class _Space:
    """The shared data of one ``memory://NAME``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scopes: dict[str, _Scope] = {}
        self.scope_names: list[str] = []  # sorted


_SPACES: dict[str, _Space] = {}
_SPACES_LOCK = threading.Lock()


def _space(name: str) -> _Space:
    with _SPACES_LOCK:
        return _SPACES.setdefault(name, _Space())


class MemoryKV(KVStore):
    """In-process KV store. ``MemoryKV()`` is private; ``MemoryKV(name="x")`` shares ``memory://x``."""

    backend_name = "memory"
    capabilities = KVCapabilities(commit=True, shared_across_processes=False)
    url_options: ClassVar[URLOptions] = URL_OPTIONS

    def __init__(
        self,
        name: str | None = None,
        *,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        clock: Clock | None = None,
        auto_setup: bool = True,
    ) -> None:
        super().__init__(clock=clock)
        self.name = name
        self._auto_setup = auto_setup
        self._space = _space(name) if name is not None else _Space()
        self.limits = KVLimits(max_value_bytes=max_value_bytes)

    @classmethod
    def from_url(cls, url: StoreURL, **options: object) -> MemoryKV:
        """``memory://`` (shared default space) or ``memory://NAME``; options: :data:`URL_OPTIONS`."""
        name = (url.host or "") + url.path.strip("/")
        URL_OPTIONS.check(url)
        check_options("memory://", options, "clock")
        max_value = url.int_option("max_value_bytes", DEFAULT_MAX_VALUE_BYTES)
        clock = options.get("clock")
        kv = cls(
            name,
            max_value_bytes=max_value,
            clock=clock if callable(clock) else None,
            auto_setup=url.bool_option("auto_setup", True),
        )
        kv.deadline_seconds = url.float_option("deadline", kv.deadline_seconds, minimum=0.001)
        return kv

    @property
    def auto_setup(self) -> bool:
        """``?auto_setup=`` (default true); a memory store has nothing to create either way."""
        return self._auto_setup

    def describe(self) -> str:
        return f"memory://{self.name}" if self.name is not None else "memory (private)"

    # -- helpers --------------------------------------------------------------------------

    def _live(self, scope: str, key: str, now: float) -> Entry | None:
        s = self._space.scopes.get(scope)
        entry = s.entries.get(key) if s else None
        if entry is None or entry.expired(now):
            return None
        return entry

    def _put(self, scope: str, key: str, entry: Entry) -> None:
        s = self._space.scopes.get(scope)
        if s is None:
            s = self._space.scopes[scope] = _Scope()
            insort(self._space.scope_names, scope)
        if key not in s.entries:
            insort(s.keys, key)
        s.entries[key] = entry

    def _remove(self, scope: str, key: str) -> None:
        s = self._space.scopes.get(scope)
        if s is None or key not in s.entries:
            return
        del s.entries[key]
        del s.keys[bisect_left(s.keys, key)]
        if not s.entries:
            self._drop(scope)

    def _drop(self, scope: str) -> int:
        s = self._space.scopes.pop(scope, None)
        if s is None:
            return 0
        del self._space.scope_names[bisect_left(self._space.scope_names, scope)]
        return len(s.entries)

    async def _round_trip(self) -> None:
        # A server round trip suspends the caller; without it, a read-then-CAS loop
        # on memory:// would never see another task's write in between.
        await asyncio.sleep(0)

    # -- primitives -----------------------------------------------------------------------

    async def _get(self, scope: str, key: str) -> Entry | None:
        await self._round_trip()
        with self._space.lock:
            s = self._space.scopes.get(scope)
            return s.entries.get(key) if s else None

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        await self._round_trip()
        with self._space.lock:
            s = self._space.scopes.get(scope)
            if s is None:
                return {}
            return {k: s.entries[k] for k in keys if k in s.entries}

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        await self._round_trip()
        with self._space.lock:
            if self._live(scope, key, now) is not None:
                raise ConflictError("key exists", scope=scope, key=key)
            version = new_version()
            self._put(scope, key, Entry(bytes(value), version, expires_at))
            return version

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        await self._round_trip()
        with self._space.lock:
            current = self._live(scope, key, now)
            if current is None or current.version != expected_version:
                raise ConflictError("version mismatch", scope=scope, key=key)
            version = new_version()
            self._put(scope, key, Entry(bytes(value), version, expires_at))
            return version

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        await self._round_trip()
        with self._space.lock:
            current = self._live(scope, key, now)
            if current is None:
                self._remove(scope, key)  # drop an expired leftover
                return False
            if expected_version is not None and current.version != expected_version:
                return False
            self._remove(scope, key)
            return True

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        await self._round_trip()
        with self._space.lock:
            s = self._space.scopes.get(scope)
            if s is None:
                return []
            lo = max(
                bisect_left(s.keys, prefix),
                bisect_right(s.keys, start_after) if start_after is not None else 0,
            )
            out: list[ScanItem] = []
            for key in s.keys[lo:]:
                if not key.startswith(prefix):
                    break
                entry = s.entries[key]
                if entry.expired(now):
                    continue
                out.append(ScanItem(key, entry if values else None))
                if len(out) >= limit:
                    break
            return out

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        await self._round_trip()
        with self._space.lock:
            names = self._space.scope_names
            lo = max(
                bisect_left(names, prefix),
                bisect_right(names, start_after) if start_after is not None else 0,
            )
            out: list[str] = []
            for name in names[lo:]:
                if not name.startswith(prefix):
                    break
                if any(not e.expired(now) for e in self._space.scopes[name].entries.values()):
                    out.append(name)
                    if len(out) >= limit:
                        break
            return out

    async def _drop_scope(self, scope: str) -> int:
        await self._round_trip()
        with self._space.lock:
            return self._drop(scope)

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        await self._round_trip()
        with self._space.lock:
            for index, op in enumerate(ops):
                current = self._live(scope, op.key, now)
                ok = True
                if isinstance(op, Create):
                    ok = current is None
                elif isinstance(op, Replace):
                    ok = current is not None and current.version == op.expected_version
                elif isinstance(op, Delete):
                    ok = op.expected_version is None or (
                        current is not None and current.version == op.expected_version
                    )
                elif isinstance(op, Check):
                    ok = (current.version if current else None) == op.expected_version
                if not ok:
                    raise ConflictError(
                        f"operation {index} ({type(op).__name__}) failed",
                        scope=scope,
                        key=op.key,
                        index=index,
                    )
            results: list[str | None] = []
            for op in ops:
                if isinstance(op, Create | Replace):
                    version = new_version()
                    expires_at = self.expires_at(op.ttl, now)
                    self._put(scope, op.key, Entry(bytes(op.value), version, expires_at))
                    results.append(version)
                elif isinstance(op, Delete):
                    self._remove(scope, op.key)
                    results.append(None)
                else:
                    results.append(None)
            return results
