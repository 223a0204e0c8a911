"""The native port of the memory store: writing a file record with its receipt, and reading it.

A memory write is one conditional write of the file's record (on the generic port it
carries the operation's receipt too; on an atomic port the receipt lives only in the index
entry, which commits with the record), the global receipt index entry that
``get_operation`` reads, and, for a file in a new directory, the directory markers that
make it listable. "Atomic" means all of them — three kinds of scope — commit together or
not at all. The generic
:class:`KVMemoryPort` does these with KV primitives in that order (markers, record CAS,
index); a backend with transactions implements :class:`MemoryPort` with
``atomic = True`` and does all of them in one transaction (one commit), and returns it
from its ``memory_port`` hook, which every :class:`~agent_stores.memory.KVMemoryStore`
built without an explicit port asks::

    @hookimpl
    def memory_port(kv):
        return MyMemoryPort(kv) if isinstance(kv, MyKV) else None

Everything else — receipts, replay, conflicts, chunking, listing, search — stays in the
core and runs unchanged over every port.

An atomic port lets the store skip reading the record before a write it can predict (the
store remembers the record it last wrote or read, and a create expects nothing): if the
prediction was wrong the write fails as a whole and the store reads and decides again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..errors import ConflictError
from ..kv.base import Create, Entry, KVStore, Operation, Replace

logger = logging.getLogger("agent_stores.memory")

#: The value of a directory marker.
MARKER_VALUE = b"{}"


# Not frozen: one of each is made per write, and a frozen dataclass's ``__init__`` sets
# every field through ``object.__setattr__`` (about 0.1 µs a field). Ports only read them.
@dataclass(slots=True)
class IndexWrite:
    """The receipt index entry of a write: created only if absent (or expired)."""

    scope: str
    key: str
    value: bytes
    ttl: float | None


@dataclass(slots=True)
class FileWrite:
    """One memory mutation as the port applies it."""

    scope: str
    key: str
    #: the record's bytes
    value: bytes
    #: the record's current KV version; None: the record must be absent (or expired)
    expected_version: str | None
    #: the record's TTL (tombstones expire; live files do not)
    ttl: float | None
    #: the receipt index entry, when the write has an operation
    index: IndexWrite | None
    #: directory markers ``(scope, key)`` to create if absent (value :data:`MARKER_VALUE`)
    markers: Sequence[tuple[str, str]]


def check_file_write(kv: KVStore, write: FileWrite) -> None:
    """Refuse, before anything is written, all that the public KV API would refuse in
    ``write``, in :class:`KVMemoryPort`'s order: a closed client; each marker, the record
    and the index entry (id, then size); their TTLs. A native port calls this first, so it
    refuses exactly what the generic port does."""
    kv.check_open()
    for scope, key in write.markers:
        kv.check_ids(scope, key)
    kv.check_ids(write.scope, write.key)
    kv.check_value(write.scope, write.key, write.value)
    if write.index is not None:
        kv.check_ids(write.index.scope, write.index.key)
        kv.check_value(write.index.scope, write.index.key, write.index.value)
    _check_ttls(kv, write)


def _check_ttls(kv: KVStore, write: FileWrite) -> None:
    now = kv.clock()
    kv.expires_at(write.ttl, now)
    if write.index is not None:
        kv.expires_at(write.index.ttl, now)


@runtime_checkable
class MemoryPort(Protocol):
    """The memory operations a backend may implement natively."""

    #: True when :meth:`write` applies record, index and markers all-or-nothing, failing
    #: (ConflictError) when the index entry already exists.
    atomic: bool

    async def read(self, scope: str, key: str) -> Entry | None:
        """The record at ``(scope, key)`` (a live entry), or None."""
        ...

    async def write(self, write: FileWrite) -> str:
        """Apply ``write``; the record's new KV version, or ConflictError when its
        condition (or, on an atomic port, the index's absence) does not hold."""
        ...


class Transacting(Protocol):
    """A KV store with a cross-scope transaction (DynamoDB, Firestore): what
    :class:`TransactMemoryPort` needs."""

    async def get(self, scope: str, key: str) -> Entry | None: ...

    async def transact(
        self,
        ops: Sequence[tuple[str, Operation]],
        *,
        ensure: Sequence[tuple[str, str, bytes]] = (),
    ) -> list[str | None]:
        """``(scope, operation)`` pairs all-or-nothing across scopes, plus ``ensure``:
        ``(scope, key, value)`` entries created when absent and left as they are when
        present, which never fail it. Each operation's new version (None for Delete and
        Check); ConflictError (``index`` into ``ops``) on a failed condition."""
        ...


class TransactMemoryPort:
    """An atomic :class:`MemoryPort` on a KV store with a cross-scope ``transact``: the
    receipt index entry (created only if absent), the record's create or replace and the
    directory markers (ensured) in one transaction.

    A backend whose KV store implements :class:`Transacting` offers it from its
    ``memory_port`` hook; the store, seeing an atomic port, writes without reading first
    when it can predict the record's version.
    """

    atomic = True

    def __init__(self, kv: KVStore) -> None:
        if not callable(getattr(kv, "transact", None)):
            raise TypeError(f"{type(kv).__name__} has no transact(ops, ensure=)")
        self.kv = kv

    async def read(self, scope: str, key: str) -> Entry | None:
        """``kv.get``."""
        return await self.kv.get(scope, key)

    async def write(self, write: FileWrite) -> str:
        """Receipt index entry, record and markers in one transaction."""
        check_file_write(self.kv, write)
        ops: list[tuple[str, Operation]] = []
        if write.index is not None:
            index = write.index
            ops.append((index.scope, Create(index.key, index.value, ttl=index.ttl)))
        if write.expected_version is None:
            record: Operation = Create(write.key, write.value, ttl=write.ttl)
        else:
            record = Replace(write.key, write.value, write.expected_version, ttl=write.ttl)
        ops.append((write.scope, record))
        transacting: Transacting = self.kv  # type: ignore[assignment]
        versions = await transacting.transact(
            ops, ensure=[(scope, key, MARKER_VALUE) for scope, key in write.markers]
        )
        version = versions[-1]
        assert version is not None
        return version


class KVMemoryPort:
    """The default port on any KV store: markers, then the record's CAS, then the index.

    Not atomic: the index is written after the record. When that fails the write raises
    (applied, but not yet findable by ``get_operation``) and the caller's retry with the
    same operation replays from the record's receipt, which is authoritative, and writes
    the index; an index entry that already exists is left as it is (a concurrent replay
    wrote it).
    """

    atomic = False

    def __init__(self, kv: KVStore) -> None:
        self.kv = kv

    async def read(self, scope: str, key: str) -> Entry | None:
        """``kv.get``."""
        return await self.kv.get(scope, key)

    async def write(self, write: FileWrite) -> str:
        """Markers (in parallel), the record's create or replace, then the index entry."""
        # A bad TTL of the index entry must not leave the record written before it.
        _check_ttls(self.kv, write)
        if write.markers:
            await asyncio.gather(*(self._mark(scope, key) for scope, key in write.markers))
        if write.expected_version is None:
            version = await self.kv.create(write.scope, write.key, write.value, ttl=write.ttl)
        else:
            version = await self.kv.replace(
                write.scope,
                write.key,
                write.value,
                expected_version=write.expected_version,
                ttl=write.ttl,
            )
        if write.index is not None:
            await self._index(write.index)
        return version

    async def _mark(self, scope: str, key: str) -> None:
        try:
            await self.kv.create(scope, key, MARKER_VALUE)
        except ConflictError:
            pass  # already marked

    async def _index(self, index: IndexWrite) -> None:
        # A failure propagates: the write is applied but not yet findable by
        # get_operation, so the caller hears "unavailable" and its retry (same operation)
        # replays from the record's receipt and writes the index.
        try:
            await self.kv.create(index.scope, index.key, index.value, ttl=index.ttl)
        except ConflictError:
            pass  # a concurrent replay (or this write, re-sent) indexed it already
