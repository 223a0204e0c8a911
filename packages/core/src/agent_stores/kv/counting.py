"""A KV wrapper that counts operations and bytes, for tests and benchmarks.

``CountingKV(inner)`` forwards every primitive to ``inner`` and records how many calls
of each kind were made and how many value bytes were written and read. Stores built on
it behave exactly as on ``inner``: it carries ``inner``'s native ports (each port call
counted as one call, ``sessions.save``, ``memory.write``, …), unless built with
``native_ports=False``, which makes every store on it run the core's generic ports.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from .base import Create, Entry, KVStore, Operation, Replace, ScanItem
from .carried import carry_ports, received_bytes

T = TypeVar("T")


class CountingKV(KVStore):
    """Counts calls (``calls``), bytes written (``bytes_written``) and read (``bytes_read``)."""

    def __init__(self, inner: KVStore, *, native_ports: bool = True) -> None:
        # Follows the inner store's clock unless a test sets ``clock`` on the wrapper.
        super().__init__(clock=lambda: inner.clock())
        from .ports import GENERIC_ONLY

        self.inner = inner
        self.limits = inner.limits
        self.capabilities = inner.capabilities
        self.deadline_seconds = inner.deadline_seconds
        self.calls: Counter[str] = Counter()
        self.bytes_written = 0
        self.bytes_read = 0
        self.ports = carry_ports(inner, self) if native_ports else GENERIC_ONLY

    async def through_port(
        self, call: str, run: Callable[[], Awaitable[T]], *, write: bool, sent: int, key: str
    ) -> T:
        """Count one call of a carried native port (see :mod:`agent_stores.kv.carried`)."""
        self.calls[call] += 1
        self.bytes_written += sent
        result = await run()
        self.bytes_read += received_bytes(result)
        return result

    def reset_counts(self) -> None:
        """Zero every counter."""
        self.calls.clear()
        self.bytes_written = 0
        self.bytes_read = 0

    @property
    def total_calls(self) -> int:
        """Number of primitive calls (each one round trip on a networked backend)."""
        return sum(self.calls.values())

    def describe(self) -> str:
        return f"counting({self.inner.describe()})"

    async def _aclose(self) -> None:
        await self.inner.aclose()

    async def setup(self) -> None:
        await self.inner.setup()

    def _read(self, entry: Entry | None) -> Entry | None:
        if entry is not None:
            self.bytes_read += len(entry.value)
        return entry

    async def _get(self, scope: str, key: str) -> Entry | None:
        self.calls["get"] += 1
        return self._read(await self.inner._get(scope, key))

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        self.calls["get_many"] += 1
        found = await self.inner._get_many(scope, keys)
        for entry in found.values():
            self._read(entry)
        return found

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        self.calls["create"] += 1
        self.bytes_written += len(value)
        return await self.inner._create(scope, key, value, expires_at, now)

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        self.calls["replace"] += 1
        self.bytes_written += len(value)
        return await self.inner._replace(scope, key, value, expected_version, expires_at, now)

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        self.calls["delete"] += 1
        return await self.inner._delete(scope, key, expected_version, now)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        self.calls["scan"] += 1
        items = await self.inner._scan(scope, prefix, start_after, limit, values, now)
        for item in items:
            self._read(item.entry)
        return items

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        self.calls["scopes"] += 1
        return await self.inner._scopes(prefix, start_after, limit, now)

    async def _scope_pages(
        self, prefix: str, page_size: int, now: float
    ) -> AsyncGenerator[list[str], None]:
        async with contextlib.aclosing(self.inner._scope_pages(prefix, page_size, now)) as pages:
            async for page in pages:
                self.calls["scope_pages"] += 1
                yield page

    async def _drop_scope(self, scope: str) -> int:
        self.calls["drop_scope"] += 1
        return await self.inner._drop_scope(scope)

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        self.calls["commit"] += 1
        self.bytes_written += sum(len(op.value) for op in ops if isinstance(op, Create | Replace))
        return await self.inner._commit(scope, ops, now)
