"""Native ports carried through a KV wrapper, each call passing the wrapper's gate.

A wrapper around a KV store (counting calls, injecting faults) is not the backend's own KV
type, so no plugin offers it a native port: a store built on it would run the core's
generic algorithms and never the backend's code. :func:`carry_ports` gives the wrapper
its inner store's native ports (:attr:`~agent_stores.kv.base.KVStore.ports`) instead, each call routed through the wrapper's
:meth:`PortGate.through_port`, so the wrapper counts or faults a port call as one request
(which, to the backend, it is).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..checkpointer.port import AppendOutcome, AppendRequest, JournalPort
    from ..memory.port import FileWrite, MemoryPort
    from ..memory.vector_port import NearestFiles, VectorEntry, VectorPort
    from ..memory.vectors import Matrix
    from ..sessions.port import AcquireReply, AcquireRequest, SaveRequest, SessionPort
    from .base import Entry, KVStore
    from .ports import NativePorts

T = TypeVar("T")


class PortGate(Protocol):
    """What a wrapper does with each call of a carried port."""

    async def through_port(
        self, call: str, run: Callable[[], Awaitable[T]], *, write: bool, sent: int, key: str
    ) -> T:
        """Run ``run`` (the port call ``call``, e.g. ``sessions.save``; ``write`` when it
        changes data; ``sent`` value bytes it writes; ``key`` the record it is about: the
        session state, the memory file, the journal entry) and return its result."""
        ...


def received_bytes(result: Any) -> int:
    """The value bytes a port call's result carries back (for counting)."""
    value = getattr(result, "value", None)
    if isinstance(value, bytes):
        return len(value)
    state = getattr(result, "state", None)
    parts = getattr(result, "parts", None) or {}
    return (len(state) if isinstance(state, bytes) else 0) + sum(len(p) for p in parts.values())


class CarriedSessionPort:
    """A native session port whose calls pass a :class:`PortGate`."""

    def __init__(self, inner: SessionPort, gate: PortGate) -> None:
        self.inner = inner
        self.gate = gate

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        from ..sessions.records import STATE_KEY  # loaded already: a session store calls

        return await self.gate.through_port(
            "sessions.acquire",
            lambda: self.inner.acquire(request),
            write=True,
            sent=0,
            key=STATE_KEY,
        )

    async def save(self, request: SaveRequest) -> str:
        from ..sessions.records import STATE_KEY

        sent = len(request.state) + sum(len(p) for c in request.chunks for p in c.parts)
        return await self.gate.through_port(
            "sessions.save", lambda: self.inner.save(request), write=True, sent=sent, key=STATE_KEY
        )


class CarriedMemoryPort:
    """A native memory port whose calls pass a :class:`PortGate`."""

    def __init__(self, inner: MemoryPort, gate: PortGate) -> None:
        self.inner = inner
        self.gate = gate
        self.atomic = inner.atomic

    async def read(self, scope: str, key: str) -> Entry | None:
        return await self.gate.through_port(
            "memory.read", lambda: self.inner.read(scope, key), write=False, sent=0, key=key
        )

    async def write(self, write: FileWrite) -> str:
        return await self.gate.through_port(
            "memory.write",
            lambda: self.inner.write(write),
            write=True,
            sent=len(write.value),
            key=write.key,
        )


class CarriedJournalPort:
    """A native journal port whose calls pass a :class:`PortGate`."""

    def __init__(self, inner: JournalPort, gate: PortGate) -> None:
        self.inner = inner
        self.gate = gate
        self.atomic = inner.atomic

    async def append(self, request: AppendRequest) -> AppendOutcome:
        sent = len(request.head_value) + len(request.value)
        return await self.gate.through_port(
            "journal.append",
            lambda: self.inner.append(request),
            write=True,
            sent=sent,
            key=request.key,
        )


class CarriedVectorPort:
    """A native vector port whose calls pass a :class:`PortGate`."""

    def __init__(self, inner: VectorPort, gate: PortGate) -> None:
        self.inner = inner
        self.gate = gate
        self.name = inner.name

    async def unavailable(self) -> str | None:
        return await self.inner.unavailable()

    async def upsert(self, scope: str, model: str, files: Sequence[VectorEntry]) -> None:
        sent = sum(0 if f.vectors is None else f.vectors.vectors.nbytes for f in files)
        key = files[0].name if files else ""
        await self.gate.through_port(
            "vectors.upsert",
            lambda: self.inner.upsert(scope, model, files),
            write=True,
            sent=sent,
            key=key,
        )

    async def remove(self, scope: str, model: str, names: Sequence[str]) -> None:
        key = names[0] if names else ""
        await self.gate.through_port(
            "vectors.remove",
            lambda: self.inner.remove(scope, model, names),
            write=True,
            sent=0,
            key=key,
        )

    async def unindexed(
        self, scope: str, model: str, key_prefix: str, below: str, limit: int
    ) -> list[str]:
        return await self.gate.through_port(
            "vectors.unindexed",
            lambda: self.inner.unindexed(scope, model, key_prefix, below, limit),
            write=False,
            sent=0,
            key=key_prefix,
        )

    async def nearest(
        self,
        scope: str,
        model: str,
        query: Matrix,
        *,
        key_prefix: str,
        limit: int,
        max_files: int,
    ) -> NearestFiles:
        return await self.gate.through_port(
            "vectors.nearest",
            lambda: self.inner.nearest(
                scope, model, query, key_prefix=key_prefix, limit=limit, max_files=max_files
            ),
            write=False,
            sent=0,
            key=key_prefix,
        )

    async def drop_scope(self, scope: str) -> None:
        await self.gate.through_port(
            "vectors.drop_scope",
            lambda: self.inner.drop_scope(scope),
            write=True,
            sent=0,
            key="",
        )


def carry_ports(inner: KVStore, gate: PortGate) -> NativePorts:
    """``inner``'s native ports, each routed through ``gate`` (None where it has none)."""
    from .ports import NativePorts

    found = inner.ports
    return NativePorts(
        None if found.session is None else CarriedSessionPort(found.session, gate),
        None if found.memory is None else CarriedMemoryPort(found.memory, gate),
        None if found.journal is None else CarriedJournalPort(found.journal, gate),
        None if found.vector is None else CarriedVectorPort(found.vector, gate),
    )
