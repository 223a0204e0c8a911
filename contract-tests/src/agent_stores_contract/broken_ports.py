"""Deliberately broken native ports: the port contract's self-test.

:class:`ReferenceSessionPort`, :class:`ReferenceMemoryPort` and :class:`ReferenceJournalPort`
are correct native ports written on the public KV API alone (any backend, ``memory://`` in
the self-test): the session acquire decides in the port as a server-side script would,
the memory write and the journal append are atomic among ports of one process (a lock per
event loop stands in for a transaction). Every other class here is one of them with one
realistic bug, the kind a careful backend author still writes. The self-test
(``contract-tests/tests/test_broken_ports.py``) runs :class:`~agent_stores_contract.ports.PortContract`
on the references (they must pass) and on each broken port (it must fail, and by the
behaviour named in :data:`BROKEN`).

They show a backend author what each port rule guards against; they are not meant to be
used as ports.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agent_stores import KVStore
from agent_stores.checkpointer.port import AppendOutcome, AppendRequest, JournalPort, check_append
from agent_stores.errors import ConflictError
from agent_stores.kv.base import Entry
from agent_stores.memory.port import (
    MARKER_VALUE,
    FileWrite,
    IndexWrite,
    MemoryPort,
    check_file_write,
)
from agent_stores.sessions.port import (
    GENERIC,
    AcquireReply,
    AcquireRequest,
    ChunkWrite,
    SaveRequest,
    SessionPort,
    acquired_state,
    known_acquired_state,
)
from agent_stores.sessions.records import (
    STATE_KEY,
    WAITER_KEY,
    ChunkRef,
    RecordError,
    StateHeader,
    decode_state,
)

from .ports import PortSet

_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _transaction() -> asyncio.Lock:
    """The lock standing in for a transaction: one per event loop (tests run one loop each)."""
    loop = asyncio.get_running_loop()
    lock = _LOCKS.get(loop)
    if lock is None:
        lock = _LOCKS[loop] = asyncio.Lock()
    return lock


async def _raw(kv: KVStore, scope: str, key: str) -> Entry | None:
    """The stored entry, expired or not: what a port reading its backend directly sees."""
    return await kv._get(scope, key)


# -- sessions ---------------------------------------------------------------------------------


class ReferenceSessionPort:
    """A correct :class:`~agent_stores.sessions.port.SessionPort` on the public KV API."""

    def __init__(self, kv: KVStore) -> None:
        self.kv = kv

    # The steps a port author writes, each overridable by a broken variant.

    async def state(self, scope: str, now: float) -> Entry | None:
        return await self.kv.get(scope, STATE_KEY)

    async def waiter(self, scope: str, now: float) -> Entry | None:
        return await self.kv.get(scope, WAITER_KEY)

    def lease_live(self, expires_at: float, now: float) -> bool:
        return expires_at > now

    def courtesy_left(self, released_at: float, courtesy: float, now: float) -> float | None:
        left = released_at + courtesy - now
        return left if left > 0 else None

    def due(self, chunks: Sequence[ChunkRef], horizon: float | None) -> bool:
        return horizon is not None and any(
            c.expires_at is not None and c.expires_at < horizon for c in chunks
        )

    async def drop_hint(self, scope: str, waiter: Entry | None, store_id: str) -> None:
        if waiter is not None and waiter.value == store_id.encode():
            await self.kv.delete(scope, WAITER_KEY, expected_version=waiter.version)

    def part_keys(self, chunk: ChunkWrite) -> list[str]:
        return [f"{chunk.key}/{i}" for i in range(len(chunk.parts))]

    async def create_part(self, scope: str, key: str, part: bytes, request: SaveRequest) -> None:
        await self.kv.create(scope, key, part, ttl=request.chunk_ttl_seconds)

    async def absent(self, request: AcquireRequest) -> AcquireReply:
        """The session does not exist (or expired): create it, as the documented option."""
        fresh = request.fresh_state()
        try:
            version = await self.kv.create(request.scope, STATE_KEY, fresh, ttl=request.ttl_seconds)
        except ConflictError:
            return AcquireReply("busy")
        return AcquireReply("acquired", version=version, state=fresh)

    async def warm_blocked(self, request: AcquireRequest) -> bool:
        """A live hint of any client stops the warm acquire (only the full decision may answer it)."""
        return await self.waiter(request.scope, request.now) is not None

    async def warm_expected(self, request: AcquireRequest, known: Entry) -> str | None:
        """The version the warm write is conditioned on: the known one."""
        return known.version

    async def warm(self, request: AcquireRequest) -> AcquireReply | None:
        """The warm acquire (``request.known``), or None to decide as usual."""
        known = request.known
        new = known_acquired_state(request, self.kv.limits.max_value_bytes)
        if known is None or new is None or await self.warm_blocked(request):
            return None
        expected = await self.warm_expected(request, known)
        if expected is None:
            return None
        try:
            version = await self.kv.replace(
                request.scope, STATE_KEY, new, expected_version=expected, ttl=request.ttl_seconds
            )
        except ConflictError:
            return None  # written since (or expired): the full decision
        return AcquireReply("acquired", version=version, state=new)

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        warm = await self.warm(request)
        if warm is not None:
            return warm
        scope, now = request.scope, request.now
        state = await self.state(scope, now)
        waiter = await self.waiter(scope, now)
        if state is None:
            return await self.absent(request)
        try:
            header, _ = decode_state(state.value)
        except RecordError:
            return GENERIC
        held = self._held_elsewhere(request, header, waiter)
        if held is not None:
            return held
        if header.recovery or self.due(header.chunks, request.refresh_horizon):
            return GENERIC
        new = acquired_state(state.value, owner=request.owner, lease_end=request.lease_end, now=now)
        if new is None:
            return GENERIC
        try:
            version = await self.kv.replace(
                scope, STATE_KEY, new, expected_version=state.version, ttl=request.ttl_seconds
            )
        except ConflictError:
            return AcquireReply("busy")
        await self.drop_hint(scope, waiter, request.store_id)
        parts = await self._missing_parts(request, header) if request.load_history else {}
        return AcquireReply("acquired", version=version, state=new, parts=parts)

    def _held_elsewhere(
        self, request: AcquireRequest, header: StateHeader, waiter: Entry | None
    ) -> AcquireReply | None:
        """BUSY while another owner's lease is live; COURTESY while this store's own release
        leaves another store waiting; None when the request may take the session."""
        lease = header.lease
        if (
            lease is not None
            and self.lease_live(lease.expires_at, request.now)
            and lease.owner != request.owner
        ):
            return AcquireReply(
                "busy",
                lease_expires_at=lease.expires_at,
                holder=lease.owner,
                waiter_hinted=waiter is not None,
            )
        if (
            header.released_by == request.store_id
            and header.released_at is not None
            and waiter is not None
            and waiter.value != request.store_id.encode()
        ):
            left = self.courtesy_left(header.released_at, request.courtesy_seconds, request.now)
            if left is not None:
                return AcquireReply("courtesy", retry_after=left)
        return None

    async def _missing_parts(
        self, request: AcquireRequest, header: StateHeader
    ) -> dict[str, bytes]:
        """The stored parts of every chunk the caller does not hold yet."""
        wanted = [
            key for c in header.chunks if c.key not in request.held_chunks for key in c.part_keys()
        ]
        if not wanted:
            return {}
        found = await self.kv.get_many(request.scope, wanted)
        return {key: entry.value for key, entry in found.items()}

    async def save(self, request: SaveRequest) -> str:
        creates = [
            self.create_part(request.scope, key, part, request)
            for chunk in request.chunks
            for key, part in zip(self.part_keys(chunk), chunk.parts, strict=True)
        ]
        if creates:
            await asyncio.gather(*creates)
        return await self.kv.replace(
            request.scope,
            STATE_KEY,
            request.state,
            expected_version=request.expected_version,
            ttl=request.ttl_seconds,
        )


class LeaseExpiryOffByOne(ReferenceSessionPort):
    """A lease counts as live at its expires_at (``>=`` where ``>`` belongs)."""

    def lease_live(self, expires_at: float, now: float) -> bool:
        return expires_at >= now


class ExpiredStateTakenLive(ReferenceSessionPort):
    """The state is read without the expiry filter (a store whose native TTL deletes late)."""

    async def state(self, scope: str, now: float) -> Entry | None:
        return await _raw(self.kv, scope, STATE_KEY)


class ExpiredHintCounts(ReferenceSessionPort):
    """The waiting hint is read without the expiry filter: an expired hint still waits."""

    async def waiter(self, scope: str, now: float) -> Entry | None:
        return await _raw(self.kv, scope, WAITER_KEY)


class RevivesRememberedState(ReferenceSessionPort):
    """A cold-turn shortcut gone wrong: the state this port saved last is written back when
    the stored one is gone (expired), instead of starting a fresh session."""

    def __init__(self, kv: KVStore) -> None:
        super().__init__(kv)
        self.remembered: dict[str, bytes] = {}

    async def save(self, request: SaveRequest) -> str:
        version = await super().save(request)
        self.remembered[request.scope] = request.state
        return version

    async def absent(self, request: AcquireRequest) -> AcquireReply:
        old = self.remembered.get(request.scope)
        new = (
            None
            if old is None
            else acquired_state(
                old, owner=request.owner, lease_end=request.lease_end, now=request.now
            )
        )
        if new is None:
            return await super().absent(request)
        version = await self.kv.create(request.scope, STATE_KEY, new, ttl=request.ttl_seconds)
        return AcquireReply("acquired", version=version, state=new)


class CourtesyUntilInclusive(ReferenceSessionPort):
    """The hand-over courtesy still holds at released.at + courtesy_seconds (``>=`` 0 left)."""

    def courtesy_left(self, released_at: float, courtesy: float, now: float) -> float | None:
        left = released_at + courtesy - now
        return max(left, 1e-9) if left >= 0 else None


class IgnoresRefreshHorizon(ReferenceSessionPort):
    """Never answers GENERIC for chunks due before the refresh horizon: they expire under the state."""

    def due(self, chunks: Sequence[ChunkRef], horizon: float | None) -> bool:
        return False


class HintNeverRemoved(ReferenceSessionPort):
    """The acquire forgets to delete its own waiting hint."""

    async def drop_hint(self, scope: str, waiter: Entry | None, store_id: str) -> None:
        return None


class PartsInStringOrder(ReferenceSessionPort):
    """Part keys numbered in string order (0, 1, 10, 11, 2, …): fine up to 10 parts."""

    def part_keys(self, chunk: ChunkWrite) -> list[str]:
        return [f"{chunk.key}/{i}" for i in sorted(range(len(chunk.parts)), key=str)]


class SaveSkipsSizeCheck(ReferenceSessionPort):
    """Chunk parts are written with the backend's own call, which checks no size."""

    async def create_part(self, scope: str, key: str, part: bytes, request: SaveRequest) -> None:
        now = self.kv.clock()
        ttl = request.chunk_ttl_seconds
        await self.kv._create(scope, key, part, None if ttl is None else now + ttl, now)


class ChunkTTLDropped(ReferenceSessionPort):
    """Chunk parts are written without their TTL (they never expire)."""

    async def create_part(self, scope: str, key: str, part: bytes, request: SaveRequest) -> None:
        await self.kv.create(scope, key, part)


class WarmAcquirePassesAWaiter(ReferenceSessionPort):
    """The warm acquire takes the lease without looking for a waiting hint."""

    async def warm_blocked(self, request: AcquireRequest) -> bool:
        return False


class WarmAcquireTrustsAStaleState(ReferenceSessionPort):
    """The warm acquire writes over whatever version is stored, not only the known one."""

    async def warm_expected(self, request: AcquireRequest, known: Entry) -> str | None:
        stored = await self.state(request.scope, request.now)
        return None if stored is None else stored.version


class SaveRevivesExpiredState(ReferenceSessionPort):
    """A save whose condition failed because the state expired writes it anyway: the
    version still matches the stored (expired) row, so the port takes it as live."""

    async def save(self, request: SaveRequest) -> str:
        try:
            return await super().save(request)
        except ConflictError:
            raw = await _raw(self.kv, request.scope, STATE_KEY)
            if raw is None or raw.version != request.expected_version:
                raise
            return await self.kv.create(
                request.scope, STATE_KEY, request.state, ttl=request.ttl_seconds
            )


# -- memory ------------------------------------------------------------------------------------


class ReferenceMemoryPort:
    """A correct atomic :class:`~agent_stores.memory.port.MemoryPort` on the public KV API."""

    atomic = True

    def __init__(self, kv: KVStore) -> None:
        self.kv = kv

    async def read(self, scope: str, key: str) -> Entry | None:
        return await self.kv.get(scope, key)

    async def index_taken(self, index: IndexWrite) -> bool:
        return await self.kv.get(index.scope, index.key) is not None

    def record_ttl(self, write: FileWrite) -> float | None:
        return write.ttl

    def index_ttl(self, index: IndexWrite) -> float | None:
        return index.ttl

    async def write(self, write: FileWrite) -> str:
        kv = self.kv
        index = write.index
        check_file_write(kv, write)
        async with _transaction():
            if index is not None and await self.index_taken(index):
                raise ConflictError("operation already indexed", scope=index.scope, key=index.key)
            if write.expected_version is None:
                version = await kv.create(
                    write.scope, write.key, write.value, ttl=self.record_ttl(write)
                )
            else:
                version = await kv.replace(
                    write.scope,
                    write.key,
                    write.value,
                    expected_version=write.expected_version,
                    ttl=self.record_ttl(write),
                )
            if index is not None:
                await kv.create(index.scope, index.key, index.value, ttl=self.index_ttl(index))
            for scope, key in write.markers:
                try:
                    await kv.create(scope, key, MARKER_VALUE)
                except ConflictError:
                    pass  # already marked
            return version


class IndexComparedByPrefix(ReferenceMemoryPort):
    """The receipt index is looked up by the key's first 32 characters (a prefix query)."""

    async def index_taken(self, index: IndexWrite) -> bool:
        return bool(await self.kv.scan(index.scope, prefix=index.key[:32], limit=1))


class ExpiredIndexBlocks(ReferenceMemoryPort):
    """The receipt index entry is read without the expiry filter: a forgotten id still blocks."""

    async def index_taken(self, index: IndexWrite) -> bool:
        return await _raw(self.kv, index.scope, index.key) is not None


class TombstoneNeverExpires(ReferenceMemoryPort):
    """The record is written without its ttl: tombstones stay forever."""

    def record_ttl(self, write: FileWrite) -> float | None:
        return None


class IndexNeverExpires(ReferenceMemoryPort):
    """The receipt index entry is written without its ttl: operation ids are never forgotten."""

    def index_ttl(self, index: IndexWrite) -> float | None:
        return None


class ReadSkipsChecks(ReferenceMemoryPort):
    """read goes straight to the backend: no id check, no expiry filter."""

    async def read(self, scope: str, key: str) -> Entry | None:
        return await _raw(self.kv, scope, key)


# -- journal -------------------------------------------------------------------------------------


class ReferenceJournalPort:
    """A correct atomic :class:`~agent_stores.checkpointer.port.JournalPort` on the public KV API."""

    atomic = True

    def __init__(self, kv: KVStore) -> None:
        self.kv = kv

    async def existing(self, scope: str, key: str) -> Entry | None:
        return await self.kv.get(scope, key)

    def head_ttl(self, request: AppendRequest) -> float | None:
        return request.ttl

    async def append(self, request: AppendRequest) -> AppendOutcome:
        kv = self.kv
        check_append(kv, request)
        async with _transaction():
            found = await self.existing(request.scope, request.key)
            if found is not None:
                return AppendOutcome(None, None, found)
            if request.head_version is None:
                head = await kv.create(
                    request.scope, request.head_key, request.head_value, ttl=self.head_ttl(request)
                )
            else:
                head = await kv.replace(
                    request.scope,
                    request.head_key,
                    request.head_value,
                    expected_version=request.head_version,
                    ttl=self.head_ttl(request),
                )
            created = await kv.create(request.scope, request.key, request.value, ttl=request.ttl)
            return AppendOutcome(created, head, None)


class JournalKeyByPrefix(ReferenceJournalPort):
    """The duplicate check looks the entry up by a prefix of its key (a range query)."""

    async def existing(self, scope: str, key: str) -> Entry | None:
        page = await self.kv.scan(scope, prefix=key[:40], limit=1)
        return page[0].entry if page else None


class JournalExpiredDuplicate(ReferenceJournalPort):
    """The duplicate check reads without the expiry filter: an expired entry is a duplicate."""

    async def existing(self, scope: str, key: str) -> Entry | None:
        return await _raw(self.kv, scope, key)


class JournalCounterNeverExpires(ReferenceJournalPort):
    """The position counter is written without the run's TTL."""

    def head_ttl(self, request: AppendRequest) -> float | None:
        return None


@dataclass(frozen=True)
class Broken:
    """One broken port: which port it replaces, its class, the behaviours that must catch it."""

    kind: str
    port: type
    caught_by: tuple[str, ...]


#: Every broken port, by name, with the behaviour ids of which at least one must fail.
BROKEN: Mapping[str, Broken] = {
    "lease-expiry-off-by-one": Broken(
        "sessions", LeaseExpiryOffByOne, ("ports.session_acquire_lease_expiry_boundary",)
    ),
    "expired-state-taken-live": Broken(
        "sessions", ExpiredStateTakenLive, ("ports.session_acquire_expired_state_is_absent",)
    ),
    "expired-hint-counts": Broken(
        "sessions", ExpiredHintCounts, ("ports.session_acquire_lease_expiry_boundary",)
    ),
    "revives-remembered-state": Broken(
        "sessions", RevivesRememberedState, ("ports.session_expired_session_is_not_revived",)
    ),
    "courtesy-until-inclusive": Broken(
        "sessions", CourtesyUntilInclusive, ("ports.session_acquire_courtesy_boundary",)
    ),
    "ignores-refresh-horizon": Broken(
        "sessions",
        IgnoresRefreshHorizon,
        ("ports.session_acquire_refresh_horizon_and_sliding_ttl",),
    ),
    "hint-never-removed": Broken(
        "sessions",
        HintNeverRemoved,
        (
            "ports.session_acquire_removes_only_its_own_hint",
            "ports.session_hints_are_removed_or_expire",
        ),
    ),
    "parts-in-string-order": Broken(
        "sessions", PartsInStringOrder, ("ports.session_save_many_parts_read_back_in_order",)
    ),
    "save-skips-size-check": Broken(
        "sessions", SaveSkipsSizeCheck, ("ports.session_save_refuses_oversized_values",)
    ),
    "chunk-ttl-dropped": Broken(
        "sessions", ChunkTTLDropped, ("ports.session_save_expiry_of_state_and_chunk_parts",)
    ),
    "save-revives-expired-state": Broken(
        "sessions",
        SaveRevivesExpiredState,
        ("ports.session_save_is_fenced_and_an_expired_state_is_not_live",),
    ),
    "warm-acquire-passes-a-waiter": Broken(
        "sessions",
        WarmAcquirePassesAWaiter,
        ("ports.session_warm_acquire_takes_only_the_known_state",),
    ),
    "warm-acquire-trusts-a-stale-state": Broken(
        "sessions",
        WarmAcquireTrustsAStaleState,
        ("ports.session_warm_acquire_takes_only_the_known_state",),
    ),
    "index-compared-by-prefix": Broken(
        "memory", IndexComparedByPrefix, ("ports.memory_index_entries_are_compared_whole",)
    ),
    "expired-index-blocks": Broken(
        "memory", ExpiredIndexBlocks, ("ports.memory_index_entries_are_compared_whole",)
    ),
    "tombstone-never-expires": Broken(
        "memory",
        TombstoneNeverExpires,
        ("ports.memory_write_expiry_of_record_index_and_markers",),
    ),
    "index-never-expires": Broken(
        "memory", IndexNeverExpires, ("ports.memory_write_expiry_of_record_index_and_markers",)
    ),
    "read-skips-checks": Broken("memory", ReadSkipsChecks, ("ports.memory_read_is_a_checked_get",)),
    "journal-key-by-prefix": Broken(
        "journal", JournalKeyByPrefix, ("ports.journal_duplicates_are_whole_live_keys",)
    ),
    "journal-expired-duplicate": Broken(
        "journal", JournalExpiredDuplicate, ("ports.journal_duplicates_are_whole_live_keys",)
    ),
    "journal-counter-never-expires": Broken(
        "journal",
        JournalCounterNeverExpires,
        ("ports.journal_counter_and_entry_expire_at_their_ttl",),
    ),
}


def reference_ports(kv: KVStore, broken: str | None = None) -> PortSet:
    """The reference ports on ``kv``, with the broken port ``broken`` (a :data:`BROKEN` name)
    in place of its reference."""
    sessions: SessionPort = ReferenceSessionPort(kv)
    memory: MemoryPort = ReferenceMemoryPort(kv)
    journal: JournalPort = ReferenceJournalPort(kv)
    sources = dict.fromkeys(("sessions", "memory", "journal"), "reference")
    if broken is not None:
        spec = BROKEN[broken]
        port = spec.port(kv)
        if spec.kind == "sessions":
            sessions = port
        elif spec.kind == "memory":
            memory = port
        else:
            journal = port
        sources[spec.kind] = f"broken: {broken}"
    return PortSet(sessions, memory, journal, sources)
