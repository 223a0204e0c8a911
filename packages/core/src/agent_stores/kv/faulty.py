"""Fault injection at the KV API: the injector of the embedded backends, and the fallback.

``memory://`` and ``sqlite://`` have no transport: the KV primitives are their wire, so
their :class:`~agent_stores.faults.FaultInjector` wraps the store itself
(:class:`FaultyKV`). The wrapper carries the store's native ports (SQLite's), so a fault
lands on a whole port call — one transaction — as it would on a request. The contract
also uses it for a backend that offers no injector of its own.

Faults (all standard kinds):

``Unavailable`` (transient)
    The call fails with :class:`~agent_stores.errors.BackendUnavailableError` before it
    reaches the store.
``ConnectionReset`` (reset)
    The same, caused by a :class:`ConnectionResetError`, as a backend reports its driver's.
``LostReply`` (lost_reply, writes only)
    The write is applied, then the call fails with ``BackendUnavailableError``.
``ResentWrite`` (lost_reply, writes only)
    The write is applied, its reply lost, and the write sent again, as an SDK's own retry
    does: the caller sees the second attempt's outcome (a conflict with its own write).
``Blackhole`` (blackhole)
    The call never answers (the store's deadline ends it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..errors import BackendUnavailableError
from ..faults import BaseFaultInjector, FaultKind
from ..url import StoreURL
from .base import Entry, KVStore, Operation, ScanItem
from .carried import carry_ports

T = TypeVar("T")

_WRITE_FAULTS = ("LostReply", "ResentWrite")


class KVFaultInjector(BaseFaultInjector):
    """Injects faults into every KV store it opens or wraps (see the module doc).

    ``after_lost_reply``, when set, is awaited after a lost reply's write was applied and
    before the caller hears of it: a test uses it to let another client act in between.
    Operation names for :meth:`arm`: ``get``, ``get_many``, ``create``, ``replace``,
    ``delete``, ``scan``, ``scopes``, ``drop_scope``, ``commit``, and for the native ports
    a wrapped store carries (:mod:`agent_stores.kv.carried`) ``sessions.acquire``,
    ``sessions.save``, ``memory.read``, ``memory.write``, ``journal.append``.
    """

    faults: Mapping[str, FaultKind] = {
        "Unavailable": FaultKind.TRANSIENT,
        "ConnectionReset": FaultKind.RESET,
        "LostReply": FaultKind.LOST_REPLY,
        "ResentWrite": FaultKind.LOST_REPLY,
        "Blackhole": FaultKind.BLACKHOLE,
    }

    #: its ResentWrite fault re-sends writes, as a naive client library does
    resends_writes = True

    def __init__(self) -> None:
        super().__init__()
        self.after_lost_reply: Callable[[], Awaitable[None]] | None = None

    async def open_kv(self, url: StoreURL, **options: Any) -> KVStore:
        from ..selection import open_kv

        return self.wrap(open_kv(url, **options), owns_inner=True)

    def wrap(
        self, inner: KVStore, *, owns_inner: bool = False, native_ports: bool = True
    ) -> FaultyKV:
        """``inner`` behind this injector, carrying its native ports (each port call one
        request to fault), or with the core's generic ports only (``native_ports=False``)."""
        return FaultyKV(inner, self, owns_inner=owns_inner, native_ports=native_ports)


class FaultyKV(KVStore):
    """A KV store whose calls pass through a :class:`KVFaultInjector`."""

    def __init__(
        self,
        inner: KVStore,
        injector: KVFaultInjector,
        *,
        owns_inner: bool,
        native_ports: bool = True,
    ) -> None:
        super().__init__(clock=lambda: inner.clock())
        from .ports import GENERIC_ONLY

        self.inner = inner
        self.injector = injector
        self.limits = inner.limits
        self.capabilities = inner.capabilities
        self.deadline_seconds = inner.deadline_seconds
        self._owns_inner = owns_inner
        self.ports = carry_ports(inner, self) if native_ports else GENERIC_ONLY

    async def through_port(
        self, call: str, run: Callable[[], Awaitable[T]], *, write: bool, sent: int, key: str
    ) -> T:
        """A carried native port's call, faulted as one request (operation name ``call``:
        ``sessions.acquire``, ``sessions.save``, ``memory.read``, ``memory.write``,
        ``journal.append``)."""
        return await self._through(call, run, write=write)

    def describe(self) -> str:
        return self.inner.describe()

    @property
    def auto_setup(self) -> bool:
        return self.inner.auto_setup

    async def setup(self) -> None:
        await self.inner.setup()

    async def _aclose(self) -> None:
        if self._owns_inner:
            await self.inner.aclose()

    async def _through(
        self, operation: str, call: Callable[[], Awaitable[T]], *, write: bool = False
    ) -> T:
        eligible = None if write else [f for f in self.injector.faults if f not in _WRITE_FAULTS]
        fault = self.injector.next_fault(operation, eligible=eligible)
        if fault is None:
            return await call()
        lost = f"{self.describe()}: connection lost ({fault}, injected)"
        if fault == "Unavailable":
            raise BackendUnavailableError(detail=f"{self.describe()}: unavailable (injected)")
        if fault == "ConnectionReset":
            # What a backend makes of its driver's ConnectionResetError.
            raise BackendUnavailableError(detail=lost) from ConnectionResetError(lost)
        if fault == "Blackhole":
            await asyncio.Event().wait()
        await call()
        if fault == "ResentWrite":
            return await call()
        if self.injector.after_lost_reply is not None:
            await self.injector.after_lost_reply()
        raise BackendUnavailableError(detail=lost)

    async def _get(self, scope: str, key: str) -> Entry | None:
        return await self._through("get", lambda: self.inner._get(scope, key))

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        return await self._through("get_many", lambda: self.inner._get_many(scope, keys))

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        return await self._through(
            "create", lambda: self.inner._create(scope, key, value, expires_at, now), write=True
        )

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        return await self._through(
            "replace",
            lambda: self.inner._replace(scope, key, value, expected_version, expires_at, now),
            write=True,
        )

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        return await self._through(
            "delete", lambda: self.inner._delete(scope, key, expected_version, now), write=True
        )

    async def _scan(
        self,
        scope: str,
        prefix: str,
        start_after: str | None,
        limit: int,
        values: bool,
        now: float,
    ) -> list[ScanItem]:
        return await self._through(
            "scan", lambda: self.inner._scan(scope, prefix, start_after, limit, values, now)
        )

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        return await self._through(
            "scopes", lambda: self.inner._scopes(prefix, start_after, limit, now)
        )

    async def _scope_pages(
        self, prefix: str, page_size: int, now: float
    ) -> AsyncGenerator[list[str], None]:
        pages = self.inner._scope_pages(prefix, page_size, now)
        try:
            while True:
                try:
                    page = await self._through("scope_pages", lambda: anext(pages))
                except StopAsyncIteration:
                    return
                yield page
        finally:
            await pages.aclose()

    async def _drop_scope(self, scope: str) -> int:
        return await self._through("drop_scope", lambda: self.inner._drop_scope(scope), write=True)

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        return await self._through(
            "commit", lambda: self.inner._commit(scope, ops, now), write=True
        )
