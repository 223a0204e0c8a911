"""The storage layer of the session store: every state transition, on the KV CAS base class.

:class:`KVSessionStorage` is the one place that reads and writes session data. The
:class:`~agent_stores.sessions.SessionStore` above it owns everything else (waiting,
lease renewal timing, cancellation, draining) and calls only these methods:

========================  ==============================================================
``load_and_acquire``      read the state, take the lease with one CAS, load the history
``renew``                 extend the lease (one CAS)
``mark_effects``          durably add effect calls to the recovery marker (one CAS)
``checkpoint``            save a history and keep the lease (chunk writes + one CAS)
``save_and_release``      save a history (or nothing) and release (chunk writes + one CAS)
``release``               release without saving
``reset`` / ``clear_recovery``   with an acquired handle: delete / unlatch
``force_reset``           erase a session whose state cannot even be decoded
``note_waiting`` / ``withdraw_hint``   leave / take back the fair hand-over hint
``enqueue`` / ``queue_front`` / ``keep_ticket`` / ``leave_queue``   the waiters' queue
``inspect`` / ``read_messages`` / ``list_sessions``   lease-free reads
========================  ==============================================================

Every acquire and every state write goes through the store's
:class:`~agent_stores.sessions.port.SessionPort`: the generic :class:`KVSessionPort` by
default, a backend's native port (a Redis script, one PostgreSQL statement) when its
``session_port`` hook supplies one. The port only moves bytes; the rules stay here:

* every write of ``state`` is conditional on the version read (the fencing token); a
  failed condition raises :class:`LeaseLostError` and marks the handle lost;
* chunks are written before (or together with) the state that references them and never
  modified;
* no referenced chunk expires before the state that references it.

The caller serializes calls on one handle; different handles may be used concurrently.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..errors import (
    AppError,
    ConflictError,
    CorruptRecordError,
    ResourceClosedError,
)
from ..kv.base import Deadline, Delete, Entry, KVStore, random_hex
from ..lru import LRU
from .cache import CachedChunk, ChunkCache
from .catalog import (
    ERASING_KEY,
    CatalogUpdate,
    IdlePurge,
    OwnerErasure,
    SessionPage,
    applied,
    check_prefixes,
    erased_key,
    listed_fields,
    next_activity,
    preview_of,
)
from .catalog_index import CatalogIndex
from .errors import (
    BranchNotFoundError,
    EffectCall,
    InvalidSessionError,
    LeaseLostError,
    OwnerErasingError,
    RecoveryRequiredError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStoreError,
    TransientStoreError,
)
from .forks import (
    BRANCH_PREFIX,
    PIN_PREFIX,
    REF_PREFIX,
    BranchInfo,
    ForkReport,
    branch_id_of,
    cut_at_turn,
    decode_branch,
    decode_pin,
    encode_branch,
    encode_pin,
    foreign_needs,
    lineage_doc,
    new_branch_key,
    pin_key,
    protected_keys,
    refs_by_home,
    rehomed,
)
from .history import StoredHistory
from .info import SessionInfo
from .port import (
    AcquireReply,
    AcquireRequest,
    ChunkWrite,
    KVSessionPort,
    SaveRequest,
    SessionPort,
)
from .records import (
    CHUNK_PREFIX,
    EMPTY_ARRAY,
    QUEUE_PREFIX,
    STATE_KEY,
    WAITER_KEY,
    WRITE_MARK,
    ChunkRef,
    Lease,
    RecordError,
    StateHeader,
    decode_messages,
    decode_state,
    effect_calls_succeeded,
    encode_messages,
    encode_state,
    extends_prefix,
    join_arrays,
    split_parts,
    without_last,
)

if TYPE_CHECKING:
    from pydantic_ai.messages import ModelMessage

log = logging.getLogger("agent_stores.sessions")

T = TypeVar("T")

#: Passes of ``erase_owner`` over the owner's index (each finds what turns added meanwhile).
_ERASE_PASSES = 5

#: Branch and pin records read in one request before deleting chunks (more: a paged walk).
_REF_PAGE = 100
#: chunk parts deleted by one ``commit`` when collecting (within every backend's limit on
#: operations per transaction: DynamoDB and Cosmos DB take 100)
_DELETES_PER_COMMIT = 50

#: Sessions whose last written state a store keeps for its next warm acquire (each about
#: the inline tail's bound plus the header: a few MB in all).
_KNOWN_STATES = 1024

#: Sessions whose hand-over hint a store remembers the version of (for its withdrawal).
_HINTS = 1024

#: Tries of a fork whose source keeps dropping the chunks it pinned (turns merging them).
_FORK_ATTEMPTS = 8

#: Errors after which the same operation may succeed if retried.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, OSError)


#: Pauses before reading a missing chunk again (None: give up): see ``_fetch_chunks``.
_MISSING_CHUNK_PAUSES: tuple[float | None, ...] = (0.05, 0.15, 0.3, None)


@dataclass
class LeaseHandle:
    """An acquired session, as the storage layer sees it.

    ``messages`` is the history as stored now (the basis for incremental writes);
    ``version``/``header``/``tail`` are the ``state`` record as last written.
    """

    session_id: str
    scope: str
    owner: str
    fence: int
    lease_expires_at: float
    messages: Sequence[ModelMessage]
    pending_effects: tuple[EffectCall, ...]
    version: str
    header: StateHeader
    tail: bytes
    lost: bool = False
    #: the bytes of a state write whose outcome is unknown (transient error), if any
    uncertain: bytes | None = None
    #: whether that write released the lease
    uncertain_release: bool = False
    #: the catalog field whose index write landed before a state write that did not
    #: (a retried save reuses it instead of writing the index again)
    indexed: dict[str, Any] | None = None
    #: a list of messages the session found to start with ``messages`` message for
    #: message (the same objects), and that ``messages`` list: the save of that list
    #: then skips the same comparison (:meth:`KVSessionStorage.extends_stored`)
    extension: tuple[Sequence[ModelMessage], Sequence[ModelMessage]] | None = None


@dataclass(frozen=True, slots=True)
class Acquired:
    """``load_and_acquire`` took the lease."""

    handle: LeaseHandle


@dataclass(frozen=True, slots=True)
class Busy:
    """``load_and_acquire`` found the session held (or yielded to a waiter); try again later.

    ``lease_expires_at`` is when the holder's lease runs out (None if unknown);
    ``retry_after`` is a suggested wait in seconds (None: use the normal backoff).
    """

    lease_expires_at: float | None = None
    retry_after: float | None = None
    holder: str | None = None
    #: a waiting-client hint is already in place (no need to write one)
    waiter_hinted: bool = False


@dataclass(frozen=True, slots=True)
class Ticket:
    """A waiting client's place in a session's queue: its key, version and expiry."""

    key: str
    version: str
    expires_at: float


@dataclass
class _Planned:
    """A chunk in a history plan: either already stored (``ref``) or still to write (``blob``)."""

    count: int
    size: int
    level: int
    sealed: bool
    ref: ChunkRef | None = None
    blob: bytes | None = None
    messages: Sequence[ModelMessage] | None = None
    #: what a reader decodes from ``blob``, when already known (a merge of cached chunks)
    decoded: tuple[ModelMessage, ...] | None = None


@dataclass
class _Plan:
    chunks: list[ChunkRef]
    tail: bytes
    tail_count: int
    written: list[ChunkRef] = field(default_factory=list)
    obsolete: list[ChunkRef] = field(default_factory=list)
    writes: list[ChunkWrite] = field(default_factory=list)


def marked_extra(header: StateHeader) -> dict[str, Any]:
    """``header.extra`` with a fresh write mark (see :meth:`KVSessionStorage._cas_state`)."""
    return {**header.extra, WRITE_MARK: random_hex(8)}


def _expires_before(ref: ChunkRef, horizon: float) -> bool:
    """Whether chunk ``ref`` expires before ``horizon`` (then a state written now copies it)."""
    return ref.expires_at is not None and ref.expires_at < horizon


@dataclass
class _ForkPlan:
    """What a fork takes from its source, read from one committed state of it (the shared
    chunks already pinned for the new session): planned before anything is written."""

    header: StateHeader
    #: how many of the source's messages the new session has
    count: int
    #: the latched effect calls the new session keeps
    recovery: tuple[EffectCall, ...]
    plan: _Plan
    #: the catalog fields the new session is to have
    wanted: dict[str, Any]
    #: whether the chunks are shared (same owner) rather than copied
    share: bool
    now: float


def _pin_keys(
    entry: Entry | None, keys: set[str], *, grow: bool
) -> tuple[frozenset[str], set[str]]:
    """The keys a stored pin (``entry``, None: none) names, and those it is to name: its
    keys and ``keys`` when a fork grows it or it is damaged (written again whole from
    ``keys``), else only those of its keys still in ``keys`` (a pin only shrinks, see
    :meth:`KVSessionStorage._set_pin`)."""
    old: frozenset[str] = frozenset()
    damaged = False
    if entry is not None:
        try:
            old = decode_pin(entry.value)[1]
        except RecordError:
            damaged = True
    want = set(keys) | old if grow or damaged else set(keys) & old
    return old, want


def _pin_end(entry: Entry | None, *, grow: bool, expires_at: float | None) -> float | None:
    """When a pin written over ``entry`` expires: never when the stored pin never expires
    or a fork grows it with chunks that never expire (some of the chunks never do), else
    the later of the stored pin's end and ``expires_at`` (a pin outlives what it names)."""
    if (entry is not None and entry.expires_at is None) or (grow and expires_at is None):
        return None
    stored_end = None if entry is None else entry.expires_at
    ends = [x for x in (expires_at, stored_end) if x is not None]
    return max(ends) if ends else None


@dataclass
class _Refreshed:
    """Chunks after re-copying those that would expire before a state written now."""

    chunks: list[ChunkRef]
    written: list[ChunkRef]
    obsolete: list[ChunkRef]
    writes: list[ChunkWrite]


class KVSessionStorage:
    """Session persistence on any :class:`~agent_stores.kv.KVStore` (single-key CAS + scan).

    Sizes derive from ``kv.limits.max_value_bytes`` unless given: the inline tail spills
    into a chunk past ``tail_bytes``; chunks are merged ``fanout`` at a time (so their
    count stays logarithmic in the history length) up to ``chunk_bytes``, beyond which
    they are sealed; chunk parts are at most ``max_value_bytes``. Decoded chunks are
    cached up to ``cache_bytes`` of their JSON (:class:`~agent_stores.sessions.cache.ChunkCache`).
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        store_id: str,
        ttl_seconds: float | None,
        lease_seconds: float,
        scope_prefix: str = "session:",
        tail_bytes: int | None = None,
        chunk_bytes: int | None = None,
        fanout: int = 8,
        cache_bytes: int = 64 << 20,
        handover_courtesy_seconds: float = 0.1,
        waiter_hint_seconds: float = 0.5,
        port: SessionPort | None = None,
        catalog_prefix: str = "session-owner:",
    ) -> None:
        check_prefixes(scope_prefix, catalog_prefix)
        self.kv = kv
        #: the native port of the backend, or the generic one
        self.port: SessionPort = port or kv.ports.session or KVSessionPort(kv)
        # The generic port's acquire is the algorithm below: skip asking it.
        self._native_acquire = not isinstance(self.port, KVSessionPort)
        self.store_id = store_id
        self.ttl_seconds = ttl_seconds
        self.lease_seconds = lease_seconds
        self.scope_prefix = scope_prefix
        max_value = kv.limits.max_value_bytes
        self.part_bytes = max_value
        self.tail_bytes = (
            tail_bytes if tail_bytes is not None else max(256, min(4 << 10, max_value // 8))
        )
        self.chunk_bytes = chunk_bytes if chunk_bytes is not None else max(4 << 20, max_value)
        self.fanout = fanout
        self.cache = ChunkCache(cache_bytes)
        self.handover_courtesy_seconds = handover_courtesy_seconds
        self.waiter_hint_seconds = waiter_hint_seconds
        # Smoothed seconds of one backend call, as this process sees them (None: none yet).
        self._round_trip: float | None = None
        self._cleanup_tasks: set[asyncio.Task[None]] = set()
        # The state this store wrote last per session, and the keys of its chunks: sent
        # with the next acquire (AcquireRequest.known) while every chunk is cached.
        self._known: LRU[str, tuple[Entry, frozenset[str], StateHeader]] = LRU(_KNOWN_STATES)
        # The version of the hand-over hint this store left last per session: a waiter
        # that gives up deletes that very write, even once it has expired (see
        # withdraw_hint).
        self._hints: LRU[str, str] = LRU(_HINTS)
        #: the owners' indexes (``catalog.py``)
        self.catalog = CatalogIndex(kv, catalog_prefix, self._call, self._spawn)

    # -- identity -------------------------------------------------------------------------

    def clock(self) -> float:
        """Now, on the KV store's clock (which decides expiry)."""
        return self.kv.clock()

    def scope_for(self, session_id: str) -> str:
        """The KV scope of a session; :class:`InvalidSessionError` for an unusable id."""
        if not isinstance(session_id, str):
            raise InvalidSessionError(
                f"a session id must be a string, got {type(session_id).__name__}"
            )
        if not session_id:
            raise InvalidSessionError("a session id must not be empty")
        limit = self.kv.limits.max_scope_chars - len(self.scope_prefix)
        if len(session_id) > limit:
            raise InvalidSessionError(
                f"session id {session_id[:40]!r}… is {len(session_id)} characters; "
                f"{self.kv.backend_name} allows at most {limit}",
                session_id=session_id[:80],
            )
        if "\x00" in session_id:
            raise InvalidSessionError(
                f"session id {session_id[:80]!r} contains a NUL character",
                session_id=session_id[:80],
            )
        try:
            session_id.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidSessionError(
                f"session id {session_id[:80]!r} is not valid Unicode", session_id=session_id[:80]
            ) from None
        return self.scope_prefix + session_id

    def session_id_for(self, scope: str) -> str | None:
        """The session id of a scope, or None when the scope is not a session's."""
        return scope[len(self.scope_prefix) :] if scope.startswith(self.scope_prefix) else None

    # -- hand-over timing -------------------------------------------------------------------
    #
    # A waiting client's poll is a sleep of up to ``poll_max_seconds`` plus a few backend
    # calls. The configured windows are sized for sub-millisecond backends; on a slow or
    # loaded one (an emulator, a busy DynamoDB table) a waiter's poll can outlast them,
    # its hint lapses and the releasing store takes the session straight back. So each
    # window grows by a few round trips as measured here.

    def _observe_round_trip(self, seconds: float) -> None:
        previous = self._round_trip
        self._round_trip = seconds if previous is None else previous + (seconds - previous) * 0.2

    @property
    def round_trip_seconds(self) -> float:
        """Smoothed duration of one backend call seen by this store (capped at 1 s)."""
        return min(self._round_trip or 0.0, 1.0)

    @property
    def courtesy_seconds(self) -> float:
        """How long a released session is left to a waiting client: the option plus 6 round trips."""
        return self.handover_courtesy_seconds + 6 * self.round_trip_seconds

    @property
    def hint_seconds(self) -> float:
        """Lifetime of a waiter's hint: the option plus 12 round trips (it outlives a poll)."""
        return self.waiter_hint_seconds + 12 * self.round_trip_seconds

    @property
    def ticket_seconds(self) -> float:
        """How long a waiter's queue ticket lives unless kept alive."""
        return max(1.0, 4 * self.hint_seconds)

    # -- backend calls ----------------------------------------------------------------------

    async def _call(self, session_id: str, awaitable: Awaitable[T]) -> T:
        """Await a KV call, turning backend failures into session errors naming the session.

        ConflictError and ResourceClosedError pass through: callers handle the first, the
        second has its own code.
        """
        started = time.perf_counter()
        try:
            # Native ports bypass the KV API, so their requests get the deadline here.
            with Deadline(self.kv):
                return await awaitable
        except (ConflictError, ResourceClosedError):
            raise
        except CorruptRecordError as exc:
            raise InvalidSessionError(
                f"session {session_id!r}: the backend reports a corrupted record: {exc.detail}",
                session_id=session_id,
            ) from exc
        except TRANSIENT_ERRORS as exc:
            raise TransientStoreError(
                f"session {session_id!r}: the backend is unavailable: {exc}",
                session_id=session_id,
            ) from exc
        except AppError as exc:
            raise SessionStoreError(
                f"session {session_id!r}: {exc.code}: {exc.detail}", session_id=session_id
            ) from exc
        except Exception as exc:
            raise SessionStoreError(
                f"session {session_id!r}: backend error {type(exc).__name__}: {exc}",
                session_id=session_id,
            ) from exc
        finally:
            self._observe_round_trip(time.perf_counter() - started)

    def _invalid(self, session_id: str, why: str) -> InvalidSessionError:
        return InvalidSessionError(
            f"session {session_id!r} has invalid stored data: {why}", session_id=session_id
        )

    def _decode(self, session_id: str, value: bytes) -> tuple[StateHeader, bytes]:
        try:
            return decode_state(value)
        except RecordError as exc:
            raise self._invalid(session_id, str(exc)) from None

    # -- sizes and TTLs -------------------------------------------------------------------

    @property
    def index_ttl(self) -> float | None:
        """TTL of an owner's index entries: they outlive the session they name.

        The index is rewritten by a turn when its entry is older than a quarter of the
        session TTL, so at the session's last turn the entry is at most that old; the
        session expires a TTL after that turn (plus a lease's margin).
        """
        if self.ttl_seconds is None:
            return None
        return self.ttl_seconds * 1.25 + self.lease_seconds

    @property
    def chunk_ttl(self) -> float | None:
        """Chunks outlive the state's TTL twice over, so they are re-copied at most once per TTL."""
        return None if self.ttl_seconds is None else 2 * self.ttl_seconds

    def _level(self, size: int) -> int:
        ratio = size / self.tail_bytes
        return 0 if ratio < self.fanout else int(math.log(ratio, self.fanout))

    # -- chunks ---------------------------------------------------------------------------

    def _new_chunk(self, scope: str, planned: _Planned, now: float) -> tuple[ChunkRef, ChunkWrite]:
        """A reference to a new chunk and its write (done by the port with the state's)."""
        assert planned.blob is not None
        key = f"{CHUNK_PREFIX}{random_hex(8)}"
        parts = split_parts(planned.blob, self.part_bytes)
        ttl = self.chunk_ttl
        expires_at = None if ttl is None else now + ttl
        ref = ChunkRef(
            key=key,
            count=planned.count,
            size=planned.size,
            parts=len(parts),
            level=planned.level,
            sealed=planned.sealed,
            expires_at=expires_at,
        )
        self._remember_written_chunk(scope, key, planned)
        return ref, ChunkWrite(key, parts, expires_at)

    def _as_stored(
        self, scope: str, chunks: Sequence[ChunkRef], messages: Sequence[ModelMessage]
    ) -> Sequence[ModelMessage]:
        """``messages`` with its chunked part replaced by the decoded chunks.

        The next save compares against this to decide whether the chunks can be kept. The
        caller's own objects must not be used for that: Pydantic AI edits messages in place
        after a save (it fills in the request it was about to send), and comparing an
        edited object with itself would keep a chunk that no longer matches.
        """
        pieces: list[Sequence[ModelMessage]] = []
        stored = 0
        for ref in chunks:
            cached = self.cache.get(ref.home or scope, ref.key)
            if cached is None:
                # Not cached (evicted, or larger than the cache): the caller's objects
                # are the best we have; an in-place edit of them would go unnoticed.
                return list(messages)
            pieces.append(cached.messages)
            stored += len(cached.messages)
        pieces.append(messages[stored:])
        return StoredHistory(pieces)

    def _remember_written_chunk(self, scope: str, key: str, planned: _Planned) -> None:
        """Cache a chunk this process is writing.

        The cache holds what a reader decodes from the stored bytes, never the caller's own
        objects: Pydantic AI edits messages in place after they were saved, and a later
        turn must see exactly what another process would read.
        """
        if planned.messages is not None and planned.blob is not None:
            decoded = planned.decoded
            if decoded is None:
                decoded = tuple(decode_messages(planned.blob, planned.count))
            self.cache.put(scope, key, CachedChunk(planned.blob, decoded))

    async def _fetch_chunks(
        self, session_id: str, scope: str, refs: Sequence[ChunkRef]
    ) -> dict[str, bytes | CachedChunk]:
        """Every chunk of ``refs``: the cached ones as held now, the others' raw bytes read
        in one ``get_many``.

        The cached ones are held so that :meth:`_stored_history` never looks them up again: other
        turns fill the cache while this one waits for its read, and may evict them.
        A chunk the state references but the read did not find is read again a few times
        over about half a second before it counts as missing: a lagging replica (an
        eventually consistent read) can serve a new state before its new chunks.
        """
        out, missing = self._held_chunks(scope, refs)
        for pause in _MISSING_CHUNK_PAUSES:
            if not missing:
                return out
            found = await self._read_parts(session_id, scope, missing)
            absent: list[ChunkRef] = []
            for ref in missing:
                pieces = [found.get((ref.home or scope, k)) for k in ref.part_keys()]
                if any(p is None for p in pieces):
                    absent.append(ref)
                else:
                    out[ref.key] = b"".join(p.value for p in pieces if p is not None)
            if absent and pause is None:
                raise _MissingChunk(absent[0].key)
            missing = absent
            if missing and pause is not None:
                await asyncio.sleep(pause)
        return out

    async def _read_parts(
        self, session_id: str, scope: str, refs: Sequence[ChunkRef]
    ) -> dict[tuple[str, str], Entry]:
        """The stored parts of ``refs`` by (scope, key): one ``get_many`` per scope holding
        some (a fork's shared chunks live in the scope of the session they came from)."""
        by_home: dict[str, list[str]] = {}
        for ref in refs:
            by_home.setdefault(ref.home or scope, []).extend(ref.part_keys())
        homes = list(by_home)
        reads = await asyncio.gather(
            *(self._call(session_id, self.kv.get_many(h, by_home[h])) for h in homes)
        )
        return {(h, k): e for h, got in zip(homes, reads, strict=True) for k, e in got.items()}

    def _held_chunks(
        self, scope: str, refs: Sequence[ChunkRef]
    ) -> tuple[dict[str, bytes | CachedChunk], list[ChunkRef]]:
        """The chunks of ``refs`` cached now, held (a later eviction cannot take them from
        the caller), and the ones that are not."""
        held: dict[str, bytes | CachedChunk] = {}
        missing: list[ChunkRef] = []
        for ref in refs:
            cached = self.cache.get(ref.home or scope, ref.key)
            if cached is None:
                missing.append(ref)
            else:
                held[ref.key] = cached
        return held, missing

    def _stored_history(
        self,
        session_id: str,
        scope: str,
        header: StateHeader,
        tail: bytes,
        fetched: Mapping[str, bytes | CachedChunk],
    ) -> StoredHistory:
        """The history: each chunk from ``fetched`` (held from the cache, or its raw bytes,
        decoded and cached now; every chunk of ``header`` must be there), then the tail."""
        pieces: list[Sequence[ModelMessage]] = []
        try:
            for ref in header.chunks:
                got = fetched[ref.key]
                if isinstance(got, CachedChunk):
                    cached = got
                else:
                    raw = got
                    if len(raw) != ref.size:
                        raise RecordError(
                            f"chunk {ref.key} holds {len(raw)} bytes, the state says {ref.size}"
                        )
                    cached = CachedChunk(raw, tuple(decode_messages(raw, ref.count)))
                    self.cache.put(ref.home or scope, ref.key, cached)
                pieces.append(cached.messages)
            pieces.append(decode_messages(tail, header.tail_count))
        except RecordError as exc:
            raise self._invalid(session_id, str(exc)) from None
        return StoredHistory(pieces)

    async def _chunk_content(
        self, session_id: str, scope: str, ref: ChunkRef
    ) -> tuple[bytes, Sequence[ModelMessage]]:
        """A chunk's raw JSON and its messages: the cached ones, or read and decoded
        (``SESSION_INVALID`` when missing or undecodable)."""
        got: bytes | CachedChunk | None = self.cache.get(ref.home or scope, ref.key)
        if got is None:
            try:
                got = (await self._fetch_chunks(session_id, scope, [ref]))[ref.key]
            except _MissingChunk as exc:
                raise self._invalid(session_id, f"history chunk {exc} is missing") from None
        raw = got.raw if isinstance(got, CachedChunk) else got
        return raw, self._chunk_messages(session_id, ref, got)

    async def _refresh_chunks(
        self,
        session_id: str,
        scope: str,
        chunks: Sequence[ChunkRef],
        now: float,
        *,
        unshare: bool = False,
    ) -> _Refreshed:
        """Copy chunks that would expire before a state written now, and (``unshare``) the
        ones shared with another session (the copies are written by the state's save)."""
        if self.ttl_seconds is None and not unshare:
            return _Refreshed(list(chunks), [], [], [])
        horizon = None if self.ttl_seconds is None else now + self.ttl_seconds
        out = _Refreshed([], [], [], [])
        for ref in chunks:
            due = horizon is not None and _expires_before(ref, horizon)
            if not due and not (unshare and ref.home is not None):
                out.chunks.append(ref)
                continue
            raw, messages = await self._chunk_content(session_id, scope, ref)
            # The copy is cached under its new key, so an acquire reading the chunks in the
            # same round trip as the save that creates the copy never has to fetch it.
            copy, write = self._new_chunk(
                scope,
                _Planned(
                    ref.count,
                    ref.size,
                    ref.level,
                    ref.sealed,
                    blob=raw,
                    messages=messages,
                    decoded=tuple(messages),
                ),
                now,
            )
            out.chunks.append(copy)
            out.written.append(copy)
            out.obsolete.append(ref)
            out.writes.append(write)
        return out

    async def _plan_history(
        self, handle: LeaseHandle, messages: Sequence[ModelMessage], now: float
    ) -> _Plan:
        """Decide what to write so the stored history becomes ``messages``.

        When ``messages`` starts with the chunked part of the stored history, the chunks
        are kept and only the inline tail is re-encoded from ``messages`` (it is rewritten
        with the state anyway, and re-encoding captures messages Pydantic AI updated in
        place after a checkpoint, such as the request it was about to send). So appending
        k messages costs O(k) bytes (amortized: spills and merges rewrite each message a
        logarithmic number of times, bounded by ``chunk_bytes``). Anything else is a full
        rewrite.
        """
        header = handle.header
        chunked = header.message_count - header.tail_count
        obsolete: list[ChunkRef] = []
        extends = self.extends_stored(handle, messages, chunked)
        tail_messages = messages[chunked:] if extends else messages
        tail = encode_messages(tail_messages)
        if len(tail) <= self.tail_bytes and extends:
            # The usual turn: the chunks stay as they are and the new messages fit inline;
            # nothing to spill, so nothing to merge.
            return _Plan(list(header.chunks), tail, len(tail_messages))
        if extends:
            planned = [_Planned(c.count, c.size, c.level, c.sealed, ref=c) for c in header.chunks]
        else:
            obsolete = list(header.chunks)
            planned = []
        if len(tail) > self.tail_bytes:
            # The newest message stays inline when it is small: it is the one most likely
            # to be updated by the next save (see above).
            last = encode_messages(tail_messages[-1:])
            if len(tail_messages) > 1 and len(last) <= self.tail_bytes // 2:
                rest = without_last(tail, last)
                if rest is None:  # pragma: no cover - dump_json of a list joins its items
                    rest = encode_messages(tail_messages[:-1])
                planned.extend(self._spill(rest, tail_messages[:-1]))
                tail, tail_messages = last, tail_messages[-1:]
            else:
                planned.extend(self._spill(tail, tail_messages))
                tail, tail_messages = EMPTY_ARRAY, []
        await self._compact(handle, planned, messages, obsolete)
        refs: list[ChunkRef] = []
        writes: list[ChunkWrite] = []
        for p in planned:
            if p.ref is None:
                p.ref, write = self._new_chunk(handle.scope, p, now)
                refs.append(p.ref)
                writes.append(write)
        chunks = [p.ref for p in planned if p.ref is not None]
        return _Plan(chunks, tail, len(tail_messages), refs, obsolete, writes)

    def _spill(self, tail: bytes, messages: Sequence[ModelMessage]) -> list[_Planned]:
        """Turn an over-full tail into chunks of at most ``chunk_bytes`` (split at message boundaries)."""
        if len(tail) <= self.chunk_bytes:
            return [
                _Planned(
                    len(messages),
                    len(tail),
                    self._level(len(tail)),
                    len(tail) >= self.chunk_bytes,
                    blob=tail,
                    messages=messages,
                )
            ]
        out: list[_Planned] = []
        group: list[bytes] = []
        group_msgs: list[ModelMessage] = []
        size = 0
        for message in messages:
            one = encode_messages([message])[1:-1]
            if group and size + len(one) + 1 > self.chunk_bytes:
                blob = b"[" + b",".join(group) + b"]"
                out.append(
                    _Planned(
                        len(group),
                        len(blob),
                        self._level(len(blob)),
                        True,
                        blob=blob,
                        messages=group_msgs,
                    )
                )
                group, group_msgs, size = [], [], 0
            group.append(one)
            group_msgs.append(message)
            size += len(one) + 1
        if group:
            blob = b"[" + b",".join(group) + b"]"
            out.append(
                _Planned(
                    len(group),
                    len(blob),
                    self._level(len(blob)),
                    len(blob) >= self.chunk_bytes,
                    blob=blob,
                    messages=group_msgs,
                )
            )
        return out

    async def _compact(
        self,
        handle: LeaseHandle,
        planned: list[_Planned],
        messages: Sequence[ModelMessage],
        obsolete: list[ChunkRef],
    ) -> None:
        """Merge the newest ``fanout`` chunks while they share a level (a base-``fanout`` counter)."""
        f = self.fanout
        while len(planned) >= f:
            last = planned[-f:]
            if any(p.sealed for p in last) or len({p.level for p in last}) != 1:
                return
            size = sum(p.size for p in last) - 2 * (f - 1) + (f - 1)
            if size > self.chunk_bytes:
                for p in last:
                    p.sealed = True
                return
            blobs = []
            # The merged chunk's decoded messages are its parts' (a JSON array joined from
            # arrays decodes to their concatenation): parts decoded before (cached, or a
            # merge's) are reused, and only a new spill is decoded, not the whole merge.
            decoded: list[ModelMessage] = []
            for p in last:
                if p.blob is not None:
                    blobs.append(p.blob)
                    decoded += p.decoded or decode_messages(p.blob, p.count)
                else:
                    assert p.ref is not None
                    raw, stored = await self._chunk_content(handle.session_id, handle.scope, p.ref)
                    blobs.append(raw)
                    decoded += stored
                    obsolete.append(p.ref)
            blob = join_arrays(blobs)
            count = sum(p.count for p in last)
            start = sum(p.count for p in planned[:-f])
            merged = _Planned(
                count,
                len(blob),
                last[0].level + 1,
                len(blob) >= self.chunk_bytes,
                blob=blob,
                messages=messages[start : start + count],
                decoded=tuple(decoded) if len(decoded) == count else None,
            )
            planned[-f:] = [merged]

    def _discard_later(self, session_id: str, scope: str, refs: Sequence[ChunkRef]) -> None:
        """In the background, let go of chunks the session's state no longer references:
        its own are deleted unless a branch or another session's pin names them, its
        shared ones lose this session's pin (``forks.py``). TTLs collect what this misses."""
        if refs:
            self._spawn(self.let_go(session_id, scope, refs))

    async def let_go(self, session_id: str, scope: str, refs: Sequence[ChunkRef]) -> None:
        """Let go of ``refs``, which the state of ``scope`` no longer references (or the
        session was deleted) — called after that write landed."""
        own = [r for r in refs if r.home is None or r.home == scope]
        homes = {r.home for r in refs if r.home is not None and r.home != scope}
        if own:
            await self._collect(session_id, scope, own)
        if homes:
            await self._update_pins(session_id, scope, homes, refs)

    async def _ref_records(
        self, session_id: str, scope: str, prefix: str
    ) -> list[tuple[str, bytes]]:
        """The branches and pins (``r/…``) under ``prefix`` of a scope, every page.

        Most sessions have no branch and were never forked, and this runs after every turn
        that merged chunks away: one page answers them, the paging walk only past it.
        """

        async def walk() -> list[tuple[str, bytes]]:
            page = await self.kv.scan(scope, prefix=prefix, limit=_REF_PAGE)
            if len(page) < _REF_PAGE:
                return [(i.key, i.entry.value) for i in page if i.entry is not None]
            return [
                (item.key, item.entry.value)
                async for item in self.kv.iter_scan(scope, prefix=prefix, page_size=200)
                if item.entry is not None
            ]

        return await self._call(session_id, walk())

    async def _collect(self, session_id: str, scope: str, refs: Sequence[ChunkRef]) -> None:
        """Delete the chunks of ``refs`` (held in ``scope``) that nothing there names any
        more: no branch, no pin, not the scope's state.

        Read in this order — records, then state — because a restore writes its new branch,
        then the state, then deletes the branch it restored: whichever moment this lands
        on, one of the reads sees the chunks it brings back. The state is read even when
        ``refs`` are chunks the state just stopped referencing: this runs in the
        background, and a restore by another client (or a later turn of this one) may
        have brought them back by the time it does.
        """
        protected = protected_keys(scope, await self._ref_records(session_id, scope, REF_PREFIX))
        entry = await self._call(session_id, self.kv.get(scope, STATE_KEY))
        if entry is not None:
            try:
                header, _ = decode_state(entry.value)
            except RecordError:
                return  # damaged: touch nothing
            protected.update(r.key for r in header.chunks if r.home is None)
        doomed = [r for r in refs if r.key not in protected]
        for ref in doomed:
            self.cache.discard(scope, ref.key)
        keys = [k for r in doomed for k in r.part_keys()]
        if not self.kv.capabilities.commit:
            await asyncio.gather(*(self.kv.delete(scope, k) for k in keys))
            return
        # One request (and one commit) for many parts instead of a request each.
        for at in range(0, len(keys), _DELETES_PER_COMMIT):
            batch = keys[at : at + _DELETES_PER_COMMIT]
            await self.kv.commit(scope, [Delete(k) for k in batch])

    async def _update_pins(
        self, session_id: str, scope: str, homes: set[str], refs: Sequence[ChunkRef]
    ) -> None:
        """Shrink the pins the session at ``scope`` keeps in ``homes`` to what its state and
        branches still reference, then collect what no one names any more in each home.

        Branches are read before the state for the same reason as in :meth:`_collect`.
        """
        branches: list[StateHeader] = []
        for key, value in await self._ref_records(session_id, scope, BRANCH_PREFIX):
            try:
                branches.append(decode_branch(branch_id_of(key), value)[1])
            except RecordError:
                return  # a branch we cannot read may need them: keep every pin
        entry = await self._call(session_id, self.kv.get(scope, STATE_KEY))
        header: StateHeader | None = None
        if entry is not None:
            try:
                header, _ = decode_state(entry.value)
            except RecordError:
                return
        needs = foreign_needs(scope, header, branches)
        by_key = {r.key: r for r in refs}
        for home in sorted(homes):
            dropped = await self._set_pin(session_id, home, scope, needs.get(home, set()))
            if dropped:
                await self._collect(
                    session_id, home, [by_key[k] for k in sorted(dropped) if k in by_key]
                )

    async def _set_pin(
        self,
        session_id: str,
        home: str,
        pinner: str,
        keys: set[str],
        *,
        grow: bool = False,
        expires_at: float | None = None,
    ) -> set[str]:
        """Make the pin of ``pinner`` in ``home`` name ``keys`` (``grow``: its keys and
        ``keys``); returns the keys it named before and no longer does.

        Only a fork grows a pin. Otherwise what it names only shrinks (to the keys it
        names and ``keys``; a damaged pin is written again from ``keys``): ``keys`` may
        have been read before the pinner changed, and a cleanup that read the state just
        before the session was reset must not write back the pin the reset dropped.
        """
        key = pin_key(pinner)
        for _ in range(8):
            entry = await self._call(session_id, self.kv.get(home, key))
            if entry is None and not grow:
                return set()
            old, want = _pin_keys(entry, keys, grow=grow)
            if entry is not None and want == old:
                return set()
            end = _pin_end(entry, grow=grow, expires_at=expires_at)
            ttl = None if end is None else max(end - self.clock(), 1.0)
            try:
                await self._write_pin(session_id, home, pinner, entry, want, ttl)
            except ConflictError:
                continue
            return set(old) - want
        raise SessionStoreError(
            f"session {session_id!r}: its pin in {home!r} changed too often to be written",
            session_id=session_id,
        )

    async def _write_pin(
        self,
        session_id: str,
        home: str,
        pinner: str,
        entry: Entry | None,
        want: set[str],
        ttl: float | None,
    ) -> None:
        """Write the pin of ``pinner`` in ``home`` (read as ``entry``) naming ``want``:
        deleted when it names nothing, created when there was none, else replaced; each
        conditional on what was read (:class:`ConflictError` when it changed since)."""
        key = pin_key(pinner)
        if not want:
            if entry is not None:
                await self._call(
                    session_id, self.kv.delete(home, key, expected_version=entry.version)
                )
        elif entry is None:
            await self._call(
                session_id, self.kv.create(home, key, encode_pin(pinner, want), ttl=ttl)
            )
        else:
            await self._call(
                session_id,
                self.kv.replace(
                    home, key, encode_pin(pinner, want), expected_version=entry.version, ttl=ttl
                ),
            )

    def _discard_unreferenced(self, session_id: str, scope: str, refs: Sequence[ChunkRef]) -> None:
        """After a lost CAS that wrote ``refs``: delete those the stored state does not reference.

        The CAS may have landed after all (a re-sent request meeting its own success), and
        then the stored state, or one derived from it, references them.
        """
        if not refs:
            return

        async def run() -> None:
            entry = await self.kv.get(scope, STATE_KEY)
            kept: set[str] = set()
            if entry is not None:
                try:
                    header, _ = decode_state(entry.value)
                except RecordError:
                    return  # damaged: touch nothing
                kept = {c.key for c in header.chunks}
            self._discard_later(session_id, scope, [r for r in refs if r.key not in kept])

        self._spawn(run())

    def _spawn(self, work: Awaitable[Any]) -> None:
        """Run best-effort cleanup in the background (waited for by :meth:`drain`)."""

        async def run() -> None:
            try:
                await work
            except Exception as exc:  # TTLs collect whatever this misses
                log.debug("session cleanup failed: %r", exc)

        task = asyncio.get_running_loop().create_task(run())
        self._cleanup_tasks.add(task)
        task.add_done_callback(self._cleanup_tasks.discard)

    async def drain(self) -> None:
        """Wait for background chunk deletions (called when the store closes)."""
        while self._cleanup_tasks:
            tasks = list(self._cleanup_tasks)
            await asyncio.gather(*tasks, return_exceptions=True)
            # Each task drops itself when done, but on CPython 3.13.0 a task's done callback
            # was seen never to run: without this, the loop would then spin for ever.
            self._cleanup_tasks.difference_update(tasks)

    # -- state writes ---------------------------------------------------------------------

    def _save_request(
        self, scope: str, value: bytes, expected_version: str, writes: Sequence[ChunkWrite]
    ) -> SaveRequest:
        return SaveRequest(
            scope, value, expected_version, self.ttl_seconds, self.chunk_ttl, tuple(writes)
        )

    async def _cas_state(
        self,
        handle: LeaseHandle,
        header: StateHeader,
        tail: bytes,
        writes: Sequence[ChunkWrite] = (),
        *,
        release: bool = False,
        marked: bool = False,
    ) -> None:
        """Write ``state`` (and the new chunks ``writes``) fenced by the handle's version
        through the port; on success the handle follows.

        Every write carries a fresh write mark, so an ambiguous outcome (a conflict that
        may echo our own re-sent write, a lost reply) is settled by reading the state back
        and recognising our own write (:meth:`_settle_conflict`), never guessed. A release
        whose write landed succeeds even if another client took the session since.
        ``marked``: ``header`` already carries a mark drawn for this very write
        (:func:`marked_extra`).
        """
        if handle.lost:
            self._forget_chunks(handle.scope, writes)
            raise self._lost(handle)
        if handle.uncertain is not None:
            try:
                moved_on = await self._resolve_uncertain(handle)
            except BaseException:
                self._forget_chunks(handle.scope, writes)
                raise
            if moved_on:
                self._forget_chunks(handle.scope, writes)
                handle.lost = True
                if release and handle.uncertain_release:
                    return  # the earlier release landed: the turn was saved and released
                raise self._lost(handle)
        now = self.clock()
        obsolete: Sequence[ChunkRef] = ()  # the chunks copied below, let go of once saved
        horizon = None if self.ttl_seconds is None else now + self.ttl_seconds
        if horizon is not None and any(_expires_before(r, horizon) for r in header.chunks):
            # Not asked when nothing is due: its result would be held through the write.
            refreshed = await self._refresh_chunks(
                handle.session_id, handle.scope, header.chunks, now
            )
            header = replace(header, chunks=tuple(refreshed.chunks))
            writes = [*writes, *refreshed.writes]
            obsolete = refreshed.obsolete
        if not marked:
            header = replace(header, extra=marked_extra(header))
        value = encode_state(header, tail)
        try:
            version = await self._call(
                handle.session_id,
                self.port.save(self._save_request(handle.scope, value, handle.version, writes)),
            )
        except ConflictError:
            landed = await self._settle_conflict(handle, value, header, tail, writes)
            if landed == "unchanged":
                raise TransientStoreError(
                    f"session {handle.session_id!r}: a write met a conflict although the "
                    "session's state is unchanged (a re-sent chunk write?); it may be retried",
                    session_id=handle.session_id,
                ) from None
            if landed is None:
                pass  # adopted: the stored state is exactly our write
            elif landed and release:
                handle.lost = True  # saved and released; the session has moved on since
            else:
                handle.lost = True
                raise self._lost(handle) from None
        except TransientStoreError:
            handle.uncertain = value
            handle.uncertain_release = release
            raise
        else:
            handle.version = version
            handle.header = header
            handle.tail = tail
            self._remember_state(handle.scope, version, value, header)
        self._discard_later(handle.session_id, handle.scope, obsolete)

    async def _settle_conflict(
        self,
        handle: LeaseHandle,
        value: bytes,
        header: StateHeader,
        tail: bytes,
        writes: Sequence[ChunkWrite],
    ) -> bool | Literal["unchanged"] | None:
        """After a conflict on our fenced write: did it land anyway?

        A lost reply re-sent by the SDK (or by us) meets its own earlier success as a
        conflict. Reads the state back: None when it is exactly our write (adopted: the
        handle follows it); True when our write landed and another client has moved on
        from it (its write mark, or our new chunks, are in the stored state); False when
        it never landed; ``"unchanged"`` when the state is still the one we hold (the
        conflict was not the state's: the write may be retried). The chunks we wrote are
        deleted only when the stored state does not reference them: a state derived from
        ours still does.
        """
        entry = await self._call(handle.session_id, self.kv.get(handle.scope, STATE_KEY))
        if entry is not None and entry.value == value:
            handle.version = entry.version
            handle.header = header
            handle.tail = tail
            return None
        if entry is not None and entry.version == handle.version:
            return "unchanged"
        stored: StateHeader | None = None
        if entry is not None:
            try:
                stored, _ = decode_state(entry.value)
            except RecordError:
                stored = None
        referenced = {c.key for c in stored.chunks} if stored is not None else set()
        written = {w.key for w in writes}
        landed = stored is not None and (
            stored.extra.get(WRITE_MARK) == header.extra.get(WRITE_MARK)
            or bool(written & referenced)
        )
        if not landed and stored is not None and entry is not None:
            landed = await self._extends(handle, header, value, stored, entry.value)
        unreferenced = [c for c in header.chunks if c.key in written and c.key not in referenced]
        if stored is not None or entry is None:
            self._discard_later(handle.session_id, handle.scope, unreferenced)
        return landed

    async def _extends(
        self,
        handle: LeaseHandle,
        mine: StateHeader,
        mine_value: bytes,
        stored: StateHeader,
        stored_value: bytes,
    ) -> bool:
        """Does the stored history begin with the whole history our write held?

        Then our write landed and another client built on it (its messages carry their
        timestamps, so nobody else writes the same ones). Only asked after an ambiguous
        outcome whose mark was overwritten: it reads the chunks this process lacks.
        """
        if stored.message_count < mine.message_count:
            return False
        refs = {c.key: c for c in (*mine.chunks, *stored.chunks)}
        sid, scope = handle.session_id, handle.scope
        try:
            fetched = await self._fetch_chunks(sid, scope, list(refs.values()))
            ours = self._stored_history(sid, scope, mine, mine_value.partition(b"\n")[2], fetched)
            theirs = self._stored_history(
                sid, scope, stored, stored_value.partition(b"\n")[2], fetched
            )
        except (_MissingChunk, InvalidSessionError):
            return False
        return theirs[: len(ours)] == ours

    def _forget_chunks(self, scope: str, writes: Sequence[ChunkWrite]) -> None:
        """Drop the cache entries of chunks planned but never sent."""
        for write in writes:
            self.cache.discard(scope, write.key)

    async def _resolve_uncertain(self, handle: LeaseHandle) -> bool:
        """After a write whose outcome is unknown: adopt it if it is the stored state, else
        go on from the old version.

        True when it landed and another client has moved on from it since (its write mark
        is in the stored state): the caller decides what that means for its own write.
        """
        entry = await self._call(handle.session_id, self.kv.get(handle.scope, STATE_KEY))
        attempted, handle.uncertain = handle.uncertain, None
        if entry is not None and entry.value == attempted:
            handle.version = entry.version
            handle.header, handle.tail = self._decode(handle.session_id, entry.value)
            return False
        if entry is not None and entry.version == handle.version:
            return False  # it never landed; the lease is still ours
        if entry is not None and attempted is not None:
            try:
                stored, _ = decode_state(entry.value)
                mine, _ = decode_state(attempted)
            except RecordError:
                pass
            else:
                mark = mine.extra.get(WRITE_MARK)
                if mark is not None and stored.extra.get(WRITE_MARK) == mark:
                    return True
                # Or a client built on it: the chunks only our write referenced are in use,
                # or the stored history extends the one we wrote.
                ours = {c.key for c in mine.chunks} - {c.key for c in handle.header.chunks}
                if ours & {c.key for c in stored.chunks}:
                    return True
                if await self._extends(handle, mine, attempted, stored, entry.value):
                    return True
        handle.lost = True
        raise self._lost(handle)

    def _lost(self, handle: LeaseHandle) -> LeaseLostError:
        return LeaseLostError(
            f"session {handle.session_id!r}: the lease (fence {handle.fence}) was lost to another "
            "owner or expired before it could be renewed; nothing more is saved by this turn",
            session_id=handle.session_id,
        )

    def _new_lease(self, handle: LeaseHandle, now: float) -> Lease:
        assert handle.header.lease is not None
        return replace(handle.header.lease, expires_at=now + self.lease_seconds)

    # -- transitions ----------------------------------------------------------------------

    async def load_and_acquire(
        self,
        session_id: str,
        *,
        owner: str,
        allow_recovery: bool = False,
        load_history: bool = True,
    ) -> Acquired | Busy:
        """Take the session's lease with one CAS and load its history.

        Returns :class:`Busy` when another owner's lease is live (or when this store just
        released the session and another client is waiting: the hand-over courtesy).
        Raises :class:`RecoveryRequiredError` when the recovery marker is set (unless
        ``allow_recovery``; the attempt renews the session's TTL) and
        :class:`InvalidSessionError` when the stored data cannot be decoded (the lease
        is released again and nothing is overwritten).

        A native port does it in one round trip; the generic algorithm below (also run
        when a port answers ``GENERIC``) reads the state, then CASes it while reading the
        chunks this process lacks.
        """
        scope = self.scope_for(session_id)
        if self._native_acquire:
            reply = await self._call(
                session_id, self.port.acquire(self._acquire_request(scope, owner, load_history))
            )
            if reply.outcome == "acquired":
                return await self._acquired(session_id, scope, owner, reply, load_history)
            # Not taken over the known state: it is stale, or a client waits for the
            # session. Either way the next attempt must not pay for trying it again (on
            # DynamoDB a failed conditional write is a request).
            self._known.pop(scope)
            if reply.outcome == "busy":
                return Busy(
                    lease_expires_at=reply.lease_expires_at,
                    holder=reply.holder,
                    waiter_hinted=reply.waiter_hinted,
                )
            if reply.outcome == "courtesy":
                return Busy(retry_after=max(reply.retry_after or 0.0, 0.0))
        return await self._generic_acquire(
            session_id, scope, owner=owner, allow_recovery=allow_recovery, load_history=load_history
        )

    def _acquire_request(self, scope: str, owner: str, load_history: bool) -> AcquireRequest:
        now = self.clock()
        lease_end = now + self.lease_seconds
        held = self.cache.keys(scope)
        known = self._known.get(scope)
        if known is not None and load_history and not known[1] <= held:
            known = None
        return AcquireRequest(
            scope=scope,
            owner=owner,
            now=now,
            lease_end=lease_end,
            store_id=self.store_id,
            courtesy_seconds=self.courtesy_seconds,
            ttl_seconds=self.ttl_seconds,
            refresh_horizon=None if self.ttl_seconds is None else now + self.ttl_seconds,
            load_history=load_history,
            held_chunks=held,
            known=None if known is None else known[0],
            known_header=None if known is None else known[2],
        )

    def _remember_state(self, scope: str, version: str, value: bytes, header: StateHeader) -> None:
        """Note the state this store just wrote (for the next acquire's ``known``)."""
        self._known.set(
            scope,
            (Entry(value, version, None), frozenset(c.key for c in header.chunks), header),
        )

    async def _acquired(
        self, session_id: str, scope: str, owner: str, reply: AcquireReply, load_history: bool
    ) -> Acquired:
        """A handle from a port's ``acquired`` reply; the history from the cache and the reply."""
        if reply.version is None or reply.state is None:
            raise SessionStoreError(
                f"session {session_id!r}: the backend's acquire returned no state",
                session_id=session_id,
            )
        header, tail = self._decode(session_id, reply.state)
        lease = header.lease
        if lease is None or lease.owner != owner:
            raise self._invalid(session_id, "the acquired state does not hold this turn's lease")
        handle = LeaseHandle(
            session_id,
            scope,
            owner,
            header.fence,
            lease.expires_at,
            [],
            header.recovery,
            reply.version,
            header,
            tail,
        )
        if not load_history:
            return Acquired(handle)
        try:
            fetched, not_cached = self._held_chunks(scope, header.chunks)
            missing: list[ChunkRef] = []
            parts = reply.parts
            for ref in not_cached:
                pieces = [parts.get(k) for k in ref.part_keys()]
                if all(p is not None for p in pieces):
                    fetched[ref.key] = b"".join(p for p in pieces if p is not None)
                else:
                    missing.append(ref)  # evicted from the cache meanwhile, or truly missing
            if missing:
                try:
                    fetched.update(await self._fetch_chunks(session_id, scope, missing))
                except _MissingChunk as exc:
                    raise self._invalid(session_id, f"history chunk {exc} is missing") from None
            handle.messages = self._stored_history(session_id, scope, header, tail, fetched)
        except BaseException:
            await asyncio.shield(self._release_quietly(handle))
            raise
        return Acquired(handle)

    async def _generic_acquire(
        self,
        session_id: str,
        scope: str,
        *,
        owner: str,
        allow_recovery: bool,
        load_history: bool,
    ) -> Acquired | Busy:
        found = await self._call(session_id, self.kv.get_many(scope, [STATE_KEY, WAITER_KEY]))
        now = self.clock()
        entry = found.get(STATE_KEY)
        lease_end = now + self.lease_seconds
        if entry is None:
            header = StateHeader(
                lease=Lease(owner, 1, lease_end, now), fence=1, created_at=now, updated_at=now
            )
            try:
                version = await self._call(
                    session_id,
                    self.kv.create(
                        scope, STATE_KEY, encode_state(header, EMPTY_ARRAY), ttl=self.ttl_seconds
                    ),
                )
            except ConflictError:
                # Lost the race to create it: the winner holds it now. A plain Busy (not a
                # retry-now) so the hand-over hint goes out with the queue ticket, or the
                # winner takes turn after turn until a waiter's later poll leaves one.
                return Busy()
            return Acquired(
                LeaseHandle(
                    session_id, scope, owner, 1, lease_end, [], (), version, header, EMPTY_ARRAY
                )
            )
        header, tail = self._decode(session_id, entry.value)
        waiter = found.get(WAITER_KEY)
        if header.lease_live(now) and header.lease is not None and header.lease.owner != owner:
            return Busy(
                lease_expires_at=header.lease.expires_at,
                holder=header.lease.owner,
                waiter_hinted=waiter is not None,
            )
        courtesy = self._courtesy(header, waiter, now)
        if courtesy is not None:
            return Busy(retry_after=courtesy)
        if header.recovery and not allow_recovery:
            await self._touch(session_id, scope, entry.version, header, tail)
            raise RecoveryRequiredError(
                f"session {session_id!r} may have an unrecorded effect: "
                + ", ".join(f"{c.tool_name} (call {c.tool_call_id})" for c in header.recovery)
                + "; reconcile it, then clear_recovery() or reset()",
                session_id=session_id,
                pending_effects=header.recovery,
            )
        fence = header.fence + 1
        acquired = replace(
            header,
            lease=Lease(owner, fence, lease_end, now),
            fence=fence,
            updated_at=now,
            released_by=None,
            released_at=None,
        )
        refreshed = await self._refresh_chunks(session_id, scope, header.chunks, now)
        if refreshed.written:
            acquired = replace(acquired, chunks=tuple(refreshed.chunks))
        cas = self._call(
            session_id,
            self.port.save(
                self._save_request(
                    scope, encode_state(acquired, tail), entry.version, refreshed.writes
                )
            ),
        )
        fetched: dict[str, bytes | CachedChunk] | BaseException = {}
        cas_result: str | BaseException
        if load_history:
            # The chunk reads ride along with the CAS: one round trip for both.
            cas_result, fetched = await asyncio.gather(
                cas, self._fetch_chunks(session_id, scope, acquired.chunks), return_exceptions=True
            )
        else:
            (cas_result,) = await asyncio.gather(cas, return_exceptions=True)
        if isinstance(cas_result, ConflictError):
            self._discard_unreferenced(session_id, scope, refreshed.written)
            return Busy()  # another client took it first (see the create race above)
        if isinstance(cas_result, BaseException):
            raise cas_result
        handle = LeaseHandle(
            session_id,
            scope,
            owner,
            fence,
            lease_end,
            [],
            acquired.recovery,
            cas_result,
            acquired,
            tail,
        )
        self._discard_later(session_id, scope, refreshed.obsolete)
        if waiter is not None and waiter.value == self.store_id.encode():
            # We are no longer waiting: make room for the hint of whoever waits now.
            self._spawn(self.kv.delete(scope, WAITER_KEY, expected_version=waiter.version))
        if not load_history:
            return Acquired(handle)
        try:
            if isinstance(fetched, _MissingChunk):
                raise self._invalid(session_id, f"history chunk {fetched} is missing")
            if isinstance(fetched, BaseException):
                raise fetched
            handle.messages = self._stored_history(session_id, scope, acquired, tail, fetched)
        except BaseException:
            await asyncio.shield(self._release_quietly(handle))
            raise
        return Acquired(handle)

    def _courtesy(self, header: StateHeader, waiter: Entry | None, now: float) -> float | None:
        """Seconds to hold back because this store just released the session and someone else waits."""
        if header.released_by != self.store_id or header.released_at is None or waiter is None:
            return None
        if waiter.value == self.store_id.encode():
            return None
        remaining = header.released_at + self.courtesy_seconds - now
        return remaining if remaining > 0 else None

    async def _touch(
        self, session_id: str, scope: str, version: str, header: StateHeader, tail: bytes
    ) -> None:
        """Renew a latched session's TTL (each recovery attempt does); losing the race is fine."""
        now = self.clock()
        refreshed = await self._refresh_chunks(session_id, scope, header.chunks, now)
        header = replace(header, chunks=tuple(refreshed.chunks), updated_at=now)
        try:
            await self._call(
                session_id,
                self.port.save(
                    self._save_request(scope, encode_state(header, tail), version, refreshed.writes)
                ),
            )
        except ConflictError:
            self._discard_unreferenced(session_id, scope, refreshed.written)
            return
        self._discard_later(session_id, scope, refreshed.obsolete)

    async def _release_quietly(self, handle: LeaseHandle) -> None:
        try:
            await self.release(handle)
        except Exception as exc:
            log.warning("session %r: could not release the lease: %r", handle.session_id, exc)

    async def renew(self, handle: LeaseHandle) -> None:
        """Extend the lease by ``lease_seconds`` from now (and the session's TTL)."""
        now = self.clock()
        header = replace(handle.header, lease=self._new_lease(handle, now), updated_at=now)
        await self._cas_state(handle, header, handle.tail)
        handle.lease_expires_at = now + self.lease_seconds

    async def mark_effects(self, handle: LeaseHandle, calls: Sequence[EffectCall]) -> None:
        """Durably add ``calls`` (names and ids only) to the recovery marker before the effects run."""
        new = [c for c in calls if c not in handle.header.recovery]
        if not new:
            return
        now = self.clock()
        header = replace(
            handle.header,
            lease=self._new_lease(handle, now),
            recovery=(*handle.header.recovery, *new),
            recovery_since=handle.header.recovery_since or now,
            updated_at=now,
        )
        await self._cas_state(handle, header, handle.tail)
        handle.lease_expires_at = now + self.lease_seconds
        handle.pending_effects = header.recovery

    async def checkpoint(self, handle: LeaseHandle, messages: Sequence[ModelMessage]) -> None:
        """Save ``messages`` as the history and keep the lease.

        The recovery marker is cleared in the same write when every marked call has a
        successful ``ToolReturnPart`` in ``messages``.
        """
        await self._save(handle, messages, release=False)

    async def save_and_release(
        self,
        handle: LeaseHandle,
        messages: Sequence[ModelMessage] | None,
        catalog: CatalogUpdate | None = None,
    ) -> None:
        """Save ``messages`` (None: keep the stored history) and ``catalog`` fields, and release
        the lease, in one CAS (after the owner's index write, when it is due)."""
        await self._save(handle, messages, release=True, catalog=catalog)

    async def release(self, handle: LeaseHandle) -> None:
        """Release the lease without touching the history."""
        await self._save(handle, None, release=True)

    async def _save(
        self,
        handle: LeaseHandle,
        messages: Sequence[ModelMessage] | None,
        *,
        release: bool,
        catalog: CatalogUpdate | None = None,
        plan: _Plan | None = None,
    ) -> None:
        if handle.lost:
            raise self._lost(handle)
        now = self.clock()
        header = handle.header
        open_turn = None if release else self._open_turn(handle, messages)
        if plan is None:
            plan = (
                _Plan(list(header.chunks), handle.tail, header.tail_count)
                if messages is None
                else await self._plan_history(handle, messages, now)
            )
        recovery, since = header.recovery, header.recovery_since
        if recovery and messages is not None and effect_calls_succeeded(recovery, messages):
            recovery, since = (), None
        new_catalog = await self._saved_catalog(handle, catalog, messages, plan, now, release)
        new_header = replace(
            header,
            catalog=new_catalog,
            open_turn=open_turn,
            lease=None if release else self._new_lease(handle, now),
            chunks=tuple(plan.chunks),
            tail_count=plan.tail_count,
            recovery=recovery,
            recovery_since=since,
            updated_at=now,
            released_by=self.store_id if release else None,
            released_at=now if release else None,
            extra=marked_extra(header),  # in this one copy of the header, not a second
        )
        await self._cas_state(
            handle, new_header, plan.tail, plan.writes, release=release, marked=True
        )
        handle.indexed = None
        self._discard_later(handle.session_id, handle.scope, plan.obsolete)
        if messages is not None and not release:
            # The basis of this turn's next save. After a release there is none, and the
            # copy would be two more lists of the whole history a turn for the
            # interpreter's garbage collector to walk (most of a long history's client CPU).
            handle.messages = self._as_stored(handle.scope, plan.chunks, messages)
        handle.pending_effects = recovery
        if not release:
            handle.lease_expires_at = now + self.lease_seconds

    async def _saved_catalog(
        self,
        handle: LeaseHandle,
        catalog: CatalogUpdate | None,
        messages: Sequence[ModelMessage] | None,
        plan: _Plan,
        now: float,
        release: bool,
    ) -> dict[str, Any] | None:
        """The catalog field a save stores (written to the owner's index only by the turn's
        last write, the release); when it changes the owner, ``plan`` takes copies of the
        chunks it shared."""
        header = handle.header
        if release and (catalog is not None or header.catalog is not None):
            count = sum(c.count for c in plan.chunks) + plan.tail_count
            new_catalog = await self._next_catalog(handle, catalog, messages, count, now)
        else:
            new_catalog = header.catalog
        if (new_catalog or {}).get("owner") != (header.catalog or {}).get("owner") and any(
            r.home is not None for r in plan.chunks
        ):
            # Owners never share chunks (erasing one must not break or expose the other's
            # session): a session changing owner takes copies of what it shared.
            unshared = await self._refresh_chunks(
                handle.session_id, handle.scope, plan.chunks, now, unshare=True
            )
            plan.chunks, plan.writes = unshared.chunks, [*plan.writes, *unshared.writes]
            plan.obsolete = [*plan.obsolete, *unshared.obsolete]
        return new_catalog

    def _open_turn(
        self, handle: LeaseHandle, messages: Sequence[ModelMessage] | None
    ) -> dict[str, Any] | None:
        """The ``open_turn`` field of a write that keeps the lease: how many messages the
        history had when this turn began, while what it saves still starts with them."""
        marked = handle.header.open_turn
        if marked is not None and marked.get("fence") != handle.fence:
            marked = None  # left by an earlier turn
        if marked is None:
            marked = {"fence": handle.fence, "count": handle.header.message_count}
        count = marked.get("count")
        if messages is None or count is None:
            return marked
        if self.extends_stored(handle, messages, count):
            return marked
        return {"fence": handle.fence, "count": None}

    @staticmethod
    def extends_stored(handle: LeaseHandle, messages: Sequence[ModelMessage], count: int) -> bool:
        """``extends_prefix(messages, handle.messages, count)``, answered at once when the
        session already found ``messages`` to extend ``handle.messages`` (``extension``):
        a long history is then compared once a turn, not once per use."""
        known = handle.extension
        if (
            known is not None
            and known[0] is messages
            and known[1] is handle.messages
            and count <= len(handle.messages)
        ):
            return True
        return extends_prefix(messages, handle.messages, count)

    async def _next_catalog(
        self,
        handle: LeaseHandle,
        update: CatalogUpdate | None,
        messages: Sequence[ModelMessage] | None,
        count: int,
        now: float,
    ) -> dict[str, Any] | None:
        """The catalog field the turn's last write stores, its owner's index written first.

        The index is rewritten when what a listing shows changed, when the session is not
        indexed yet (or the last index write failed), and, on a store with a TTL, when the
        entry is older than a quarter of it (so it never expires before the session).
        A failed index write is logged; the state then records the session as not
        indexed, and its next turn writes the index again — except the first write for an
        owner, whose failure fails the save (the owner's index must name every session of
        the owner, for ``erase_owner``), and a write refused because the owner is being
        erased (:class:`OwnerErasingError`: the turn is fenced out).
        """
        if handle.indexed is not None:
            return handle.indexed
        old = handle.header.catalog
        new = applied(old, update)
        if messages is not None:
            new["preview"] = preview_of(messages)
        new["count"] = count
        if not new.get("owner"):
            return new
        due = (
            old is None
            or not old.get("key")
            or listed_fields(new) != listed_fields(old)
            or (self.ttl_seconds is not None and now - (old.get("at") or 0) > self.ttl_seconds / 4)
        )
        if not due:
            return new
        new["at"] = next_activity(now, old.get("at") if old is not None else None)
        # Listed: an index write for this owner has landed once, so its pointer exists.
        listed = old is not None and old.get("owner") == new["owner"] and bool(old.get("listed"))
        new.pop("listed", None)
        try:
            indexed = await self.catalog.write(
                handle.session_id,
                new,
                old,
                created_at=handle.header.created_at,
                ttl=self.index_ttl,
            )
        except OwnerErasingError:
            raise
        except (ConflictError, SessionStoreError) as exc:
            if not listed:
                # The index must name every session of an owner (erase_owner finds them
                # there): a session not yet listed for this owner is not saved without it.
                raise
            log.warning(
                "session %r: its owner's index was not updated (%s); the next turn retries",
                handle.session_id,
                exc,
            )
            return {**new, "key": None, "v": None, "listed": True}
        handle.indexed = {**indexed, "listed": True}
        return handle.indexed

    async def clear_recovery(self, handle: LeaseHandle) -> bool:
        """Clear the recovery marker (keeping the history) and release. True if it was set."""
        was_set = bool(handle.header.recovery)
        now = self.clock()
        header = replace(
            handle.header,
            lease=None,
            recovery=(),
            recovery_since=None,
            updated_at=now,
            released_by=self.store_id,
            released_at=now,
        )
        await self._cas_state(handle, header, handle.tail)
        handle.pending_effects = ()
        return was_set

    async def reset(self, handle: LeaseHandle) -> None:
        """Delete the session (history, marker, lease) with one conditional delete."""
        if handle.lost:
            raise self._lost(handle)
        deleted = await self._call(
            handle.session_id,
            self.kv.delete(handle.scope, STATE_KEY, expected_version=handle.version),
        )
        if not deleted:
            handle.lost = True
            raise self._lost(handle)
        self._spawn(self._forget(handle.session_id, handle.scope, handle.header))
        catalog = handle.header.catalog
        if catalog is not None and catalog.get("owner"):
            try:
                await self.catalog.remove(handle.session_id, catalog)
            except SessionStoreError as exc:
                log.warning(
                    "session %r: deleted, but its owner's index still lists it (%s)",
                    handle.session_id,
                    exc,
                )

    async def force_reset(self, session_id: str) -> bool:
        """Erase a session whose state record cannot be decoded (no one can hold its lease).

        Chunks go first, then the state, conditionally on the version read. Returns False
        when the state changed meanwhile (it was not deleted).
        """
        scope = self.scope_for(session_id)
        entry = await self._call(session_id, self.kv.get(scope, STATE_KEY))
        if entry is None:
            return False
        try:
            decode_state(entry.value)
        except RecordError:
            pass
        else:
            return False
        records = await self._ref_records(session_id, scope, REF_PREFIX)
        # Other sessions' pins keep their chunks; this session's branches go with it.
        pinned = protected_keys(scope, [(k, v) for k, v in records if k.startswith(PIN_PREFIX)])
        keys = [
            item.key
            async for item in self.kv.iter_scan(scope, prefix=CHUNK_PREFIX, values=False)
            if item.key.rsplit("/", 1)[0] not in pinned
        ]
        keys += [k for k, _ in records if k.startswith(BRANCH_PREFIX)]
        for key in keys:
            await self._call(session_id, self.kv.delete(scope, key))
        return bool(
            await self._call(
                session_id, self.kv.delete(scope, STATE_KEY, expected_version=entry.version)
            )
        )

    async def note_waiting(self, session_id: str) -> bool:
        """Tell the current holder's store that another client is waiting (fair hand-over).

        Returns True when the hint now names this store. A hint left by another store is
        taken over: it may be the stale hint of the client that now holds the session
        (which deletes it only after acquiring), and such a hint would not hold that
        client back when it releases.
        """
        scope = self.scope_for(session_id)
        ours = self.store_id.encode()
        try:
            version = await self._call(
                session_id, self.kv.create(scope, WAITER_KEY, ours, ttl=self.hint_seconds)
            )
        except ConflictError:
            pass
        else:
            self._hints.set(session_id, version)
            return True
        entry = await self._call(session_id, self.kv.get(scope, WAITER_KEY))
        if entry is None:
            return False  # gone meanwhile: the next poll leaves a new one
        if entry.value == ours:
            self._hints.set(session_id, entry.version)
            return True
        try:
            version = await self._call(
                session_id,
                self.kv.replace(
                    scope,
                    WAITER_KEY,
                    ours,
                    expected_version=entry.version,
                    ttl=self.hint_seconds,
                ),
            )
        except ConflictError:
            return False
        self._hints.set(session_id, version)
        return True

    def withdraw_hint(self, session_id: str) -> None:
        """Delete the hand-over hint of this store, if it is still the stored one, in the
        background (best effort: it expires anyway): for a waiter that gave up.

        The write this store made is deleted at its version, in one request, even when it
        has expired already: a waiter gives up about when its hint expires, and an
        expired hint that is still stored fails a port's "no hint" condition where the
        database cannot tell expired from live (Firestore's preconditions). Without a
        remembered version, the live hint is read and deleted if it names this store."""
        scope = self.scope_for(session_id)
        version = self._hints.get(session_id)
        self._hints.pop(session_id)
        ours = self.store_id.encode()

        async def withdraw() -> None:
            if version is not None:
                await self._call(
                    session_id, self.kv.delete(scope, WAITER_KEY, expected_version=version)
                )
                return
            entry = await self._call(session_id, self.kv.get(scope, WAITER_KEY))
            if entry is not None and entry.value == ours:
                await self._call(
                    session_id, self.kv.delete(scope, WAITER_KEY, expected_version=entry.version)
                )

        self._spawn(withdraw())

    # -- the waiters' queue ---------------------------------------------------------------
    #
    # A client that finds the session busy takes a ticket named by its arrival time and
    # tries to acquire only once its ticket is the first live one, so waiters of
    # different processes are served in arrival order instead of by who polls first
    # (exponential backoff would otherwise favour the newest waiter). The queue costs
    # nothing until a session is contended: an uncontended turn never touches it.

    async def enqueue(self, session_id: str) -> Ticket:
        """Take a ticket at the end of the session's queue of waiting clients."""
        scope = self.scope_for(session_id)
        now = self.clock()
        key = f"{QUEUE_PREFIX}{max(0, int(now * 1_000_000)):016x}-{random_hex(4)}"
        ttl = self.ticket_seconds
        version = await self._call(
            session_id, self.kv.create(scope, key, self.store_id.encode(), ttl=ttl)
        )
        return Ticket(key, version, now + ttl)

    async def queue_front(self, session_id: str, count: int = 2) -> list[str]:
        """The keys of the first ``count`` live tickets of the session's queue, in order."""
        scope = self.scope_for(session_id)
        page = await self._call(
            session_id, self.kv.scan(scope, prefix=QUEUE_PREFIX, limit=count, values=False)
        )
        return [item.key for item in page]

    async def queue(self, session_id: str) -> list[str]:
        """The store ids of the clients waiting for the session, in arrival order."""
        scope = self.scope_for(session_id)
        waiting: list[str] = []
        async for item in self.kv.iter_scan(scope, prefix=QUEUE_PREFIX):
            if item.entry is not None:
                waiting.append(item.entry.value.decode("utf-8", "replace"))
        return waiting

    async def keep_ticket(self, session_id: str, ticket: Ticket) -> Ticket:
        """Keep a ticket alive once half its life is gone; one that expired is taken again.

        The same key is written again, so a waiter whose ticket lapsed (a stalled event
        loop) keeps its place in the queue.
        """
        scope = self.scope_for(session_id)
        value = self.store_id.encode()
        for _ in range(3):
            now = self.clock()
            ttl = self.ticket_seconds
            if ticket.expires_at - now > ttl / 2:
                return ticket
            try:
                version = await self._call(
                    session_id,
                    self.kv.replace(
                        scope,
                        ticket.key,
                        value,
                        expected_version=ticket.version,
                        ttl=ttl,
                    ),
                )
                return Ticket(ticket.key, version, now + ttl)
            except ConflictError:
                pass
            try:
                version = await self._call(
                    session_id, self.kv.create(scope, ticket.key, value, ttl=ttl)
                )
                return Ticket(ticket.key, version, now + ttl)
            except ConflictError:
                pass
            # Live at another version: our own earlier renewal whose reply was lost.
            entry = await self._call(session_id, self.kv.get(scope, ticket.key))
            if entry is None or entry.expires_at is None:
                return ticket  # gone meanwhile: taken again on the next poll
            ticket = Ticket(ticket.key, entry.version, entry.expires_at)
        return ticket

    def leave_queue(self, session_id: str, ticket: Ticket) -> None:
        """Delete a ticket in the background (its TTL collects it if this fails)."""
        scope = self.scope_for(session_id)
        self._spawn(self.kv.delete(scope, ticket.key))

    # -- lease-free reads -----------------------------------------------------------------

    def _info(self, session_id: str, entry: Entry) -> SessionInfo:
        try:
            header, tail = decode_state(entry.value)
        except RecordError as exc:
            return SessionInfo(
                session_id, 0, 0, 0, None, None, 0, (), None, 0.0, 0.0, entry.expires_at, str(exc)
            )
        now = self.clock()
        live = header.lease if header.lease_live(now) else None
        return SessionInfo(
            session_id=session_id,
            message_count=header.message_count,
            chunk_count=len(header.chunks),
            stored_bytes=sum(c.size for c in header.chunks) + len(tail),
            lease_owner=live.owner if live else None,
            lease_expires_at=live.expires_at if live else None,
            fence=header.fence,
            pending_effects=header.recovery,
            recovery_since=header.recovery_since,
            created_at=header.created_at,
            updated_at=header.updated_at,
            expires_at=entry.expires_at,
            owner=(header.catalog or {}).get("owner"),
            title=(header.catalog or {}).get("title"),
            tags=tuple((header.catalog or {}).get("tags") or ()),
            forked_from=None if header.lineage is None else header.lineage.get("source"),
            fork_point=None if header.lineage is None else header.lineage.get("count"),
            **_conversation_summary(header.extra),
        )

    async def exists(self, session_id: str) -> bool:
        """Whether the session has a state record (one read; nothing decoded or checked)."""
        scope = self.scope_for(session_id)
        return await self._call(session_id, self.kv.get(scope, STATE_KEY)) is not None

    async def inspect(self, session_id: str) -> SessionInfo | None:
        """A summary of the session, or None when it does not exist. Takes no lease."""
        scope = self.scope_for(session_id)
        entry = await self._call(session_id, self.kv.get(scope, STATE_KEY))
        if entry is None:
            return None
        info = self._info(session_id, entry)
        if info.problem is None and info.chunk_count:
            missing = await self._missing_chunk(session_id, scope, entry)
            if missing is not None:
                info = replace(info, problem=f"history chunk {missing} is missing")
        return info

    async def _missing_chunk(self, session_id: str, scope: str, entry: Entry) -> str | None:
        """The first chunk the state references whose parts are not all stored (keys only).

        Re-checked against a fresh read of the state: a turn may have merged the chunk
        away meanwhile.
        """
        header, _ = self._decode(session_id, entry.value)

        async def stored_keys(home: str) -> set[tuple[str, str]]:
            return {
                (home, item.key)
                async for item in self.kv.iter_scan(
                    home, prefix=CHUNK_PREFIX, page_size=500, values=False
                )
            }

        keys: set[tuple[str, str]] = set()
        for home in {ref.home or scope for ref in header.chunks}:
            keys |= await self._call(session_id, stored_keys(home))
        for ref in header.chunks:
            if any((ref.home or scope, k) not in keys for k in ref.part_keys()):
                again = await self._call(session_id, self.kv.get(scope, STATE_KEY))
                return ref.key if again is not None and again.version == entry.version else None
        return None

    async def read_messages(self, session_id: str) -> list[ModelMessage] | None:
        """The saved history without taking the lease (a snapshot; None when absent)."""
        scope = self.scope_for(session_id)
        for _ in range(5):
            entry = await self._call(session_id, self.kv.get(scope, STATE_KEY))
            if entry is None:
                return None
            header, tail = self._decode(session_id, entry.value)
            try:
                fetched = await self._fetch_chunks(session_id, scope, header.chunks)
            except _MissingChunk as missing:
                # A turn may have merged the chunk away since we read the state.
                again = await self._call(session_id, self.kv.get(scope, STATE_KEY))
                if again is not None and again.version != entry.version:
                    continue
                raise self._invalid(session_id, f"history chunk {missing} is missing") from None
            return self._stored_history(session_id, scope, header, tail, fetched).to_list()
        raise SessionStoreError(
            f"session {session_id!r} changed too often to be read", session_id=session_id
        )

    async def list_sessions(
        self, prefix: str = "", *, start_after: str | None = None, limit: int = 100
    ) -> list[SessionInfo]:
        """Up to ``limit`` sessions whose id starts with ``prefix``, in byte order, after ``start_after``."""
        if limit < 1:
            raise ValueError("limit must be >= 1")
        out: list[SessionInfo] = []
        cursor = self.scope_prefix + start_after if start_after is not None else None
        while len(out) < limit:
            page = await self._call(
                prefix,
                self.kv.scopes(prefix=self.scope_prefix + prefix, start_after=cursor, limit=limit),
            )
            entries = await asyncio.gather(
                *(self._call(s, self.kv.get(s, STATE_KEY)) for s in page)
            )
            for scope, entry in zip(page, entries, strict=True):
                sid = self.session_id_for(scope)
                if entry is not None and sid is not None and len(out) < limit:
                    out.append(self._info(sid, entry))
            if len(page) < limit:
                break
            cursor = page[-1]
        return out

    async def purge_idle(
        self, idle_seconds: float, *, include_latched: bool, prefix: str = ""
    ) -> IdlePurge:
        """Delete every session not used for ``idle_seconds`` (no turn started or ended).

        One walk over the sessions' scopes. A session is deleted by a conditional delete of
        its state at the version read, so a turn that starts meanwhile keeps it; then its
        history chunks and index entries go (a crash between leaves chunks that nothing
        references, collected by their TTL or the next ``doctor``). Sessions held by a
        turn are skipped; latched ones (a recovery marker) only with ``include_latched``.
        Running it again after a crash finishes the work.
        """
        now = self.clock()
        cutoff = now - idle_seconds
        removed: list[str] = []
        latched: list[str] = []
        scanned = 0
        async for scope in self.kv.iter_scopes(prefix=self.scope_prefix + prefix):
            session_id = self.session_id_for(scope)
            if session_id is None:
                continue
            entry = await self._call(session_id, self.kv.get(scope, STATE_KEY))
            if entry is None:
                continue
            scanned += 1
            try:
                header, _ = decode_state(entry.value)
            except RecordError:
                continue  # damaged: ``doctor`` reports it, retention does not guess
            if header.lease_live(now) or header.updated_at >= cutoff:
                continue
            if header.recovery and not include_latched:
                latched.append(session_id)
                continue
            deleted = await self._call(
                session_id, self.kv.delete(scope, STATE_KEY, expected_version=entry.version)
            )
            if not deleted:
                continue  # used meanwhile
            await self._forget(session_id, scope, header)
            if header.catalog is not None and header.catalog.get("owner"):
                await self.catalog.remove(session_id, header.catalog)
            removed.append(session_id)
        return IdlePurge(tuple(removed), scanned, tuple(latched))

    async def erase_owner(self, owner: str) -> OwnerErasure:
        """Erase every session of ``owner`` and its index, then read every scope back.

        The owner's index gets the erasing marker first (from then on index writes for the
        owner are refused, and with them the turns that make them); each session the index
        names is dropped whole (state, history chunks, queue) before its index entries, so
        an erase cut off anywhere is resumed by the next one from what is left. Passes
        repeat until one finds nothing (a turn that wrote its pointer just before the
        marker is caught by the next pass). Then each erased scope and the owner's index
        are read back; the marker goes only when nothing is left.
        """
        index = self.catalog
        scope = index.scope_for(owner)
        started = self.clock()
        marker = await self._call(owner, self.kv.get(scope, ERASING_KEY))
        resumed = marker is not None
        if marker is None:
            try:
                await self._call(
                    owner,
                    self.kv.create(scope, ERASING_KEY, json.dumps({"since": started}).encode()),
                )
            except ConflictError:
                resumed = True  # another erase of this owner is running: do the same work
        erased: dict[str, None] = {}
        for _ in range(_ERASE_PASSES):
            named = await index.named(owner)
            if not named:
                break
            for session_id, keys in sorted(named.items()):
                if await self.owned_by_another(session_id, owner):
                    # Given to another owner since: this index's entry is stale (the move
                    # removes it in the background, best effort), the session not ours.
                    for key in keys:
                        await self._call(session_id, self.kv.delete(scope, key))
                    continue
                await self._call(session_id, self.kv.drop_scope(self.scope_for(session_id)))
                await self._tombstone(scope, session_id)
                for chunk_key in self.cache.keys(self.scope_for(session_id)):
                    self.cache.discard(self.scope_for(session_id), chunk_key)
                for key in keys:
                    await self._call(session_id, self.kv.delete(scope, key))
                erased[session_id] = None
        left = 0
        for session_id in erased:
            left += await self._left_after_drop(session_id, self.scope_for(session_id))
        remaining = await index.named(owner)
        left += sum(len(keys) for keys in remaining.values())
        if left == 0:
            await self._call(owner, self.kv.delete(scope, ERASING_KEY))
        return OwnerErasure(
            owner=owner,
            sessions=tuple(erased),
            scopes_checked=len(erased) + 1,
            entries_left=left,
            resumed=resumed,
            started_at=started,
            finished_at=self.clock(),
        )

    async def owned_by_another(self, session_id: str, owner: str) -> bool:
        """True when the session's state names an owner other than ``owner`` (absent or
        undecodable: False, so an erase drops what the owner's index names)."""
        entry = await self._call(session_id, self.kv.get(self.scope_for(session_id), STATE_KEY))
        if entry is None:
            return False
        try:
            header, _ = decode_state(entry.value)
        except RecordError:
            return False
        current = (header.catalog or {}).get("owner")
        return current is not None and current != owner

    async def _tombstone(self, scope: str, session_id: str) -> None:
        """Refuse index writes for the erased session for two leases (a turn that held it
        during the erase must not list it again once the erase is over)."""
        try:
            await self._call(
                session_id,
                self.kv.create(
                    scope, erased_key(session_id), b"{}", ttl=2 * self.lease_seconds + 30
                ),
            )
        except ConflictError:
            pass  # a resumed erase: it is there already

    async def _left_after_drop(self, session_id: str, scope: str) -> int:
        """Entries in a dropped session scope, dropping again what a fenced-out turn left.

        A turn whose save was refused deletes the chunk parts it wrote first, in the
        background; until it has, they are dropped again here.
        """
        for pause in (0.05, 0.2, 0.5, None):
            found = await self._call(session_id, self.kv.scan(scope, limit=100, values=False))
            if not found or pause is None:
                return len(found)
            await asyncio.sleep(pause)
            await self._call(session_id, self.kv.drop_scope(scope))
        return 0  # pragma: no cover - the loop returns

    # -- forks, rewinds, branches (``forks.py``) -------------------------------------------

    async def _forget(self, session_id: str, scope: str, header: StateHeader) -> None:
        """After the session's state was deleted: delete its branches, then let go of every
        chunk the state and the branches referenced."""
        refs: dict[tuple[str, str], ChunkRef] = {(r.home or scope, r.key): r for r in header.chunks}
        for key, value in await self._ref_records(session_id, scope, BRANCH_PREFIX):
            try:
                _, kept, _ = decode_branch(branch_id_of(key), value)
            except RecordError:
                kept = StateHeader()
            refs.update({(r.home or scope, r.key): r for r in kept.chunks})
            await self._call(session_id, self.kv.delete(scope, key))
        await self.let_go(session_id, scope, list(refs.values()))

    async def _committed(self, session_id: str, scope: str) -> tuple[str, StateHeader, bytes, int]:
        """The session's state as committed (version, header, tail), and how many of its
        messages a fork may take:
        all of them, except while a turn that checkpointed runs (the messages it had when
        it began; :class:`SessionBusyError` when that turn rewrote them)."""
        entry = await self._call(session_id, self.kv.get(scope, STATE_KEY))
        if entry is None:
            raise SessionNotFoundError(
                f"session {session_id!r} does not exist", session_id=session_id
            )
        header, tail = self._decode(session_id, entry.value)
        count = header.message_count
        lease, marked = header.lease, header.open_turn
        if (
            marked is not None
            and lease is not None
            and header.lease_live(self.clock())
            and marked.get("fence") == lease.fence
        ):
            if marked.get("count") is None:
                raise SessionBusyError(
                    f"session {session_id!r}: the turn running now rewrote its history; "
                    "fork it once that turn has ended",
                    session_id=session_id,
                )
            count = int(marked["count"])
        return entry.version, header, tail, count

    async def _prefix(
        self,
        session_id: str,
        scope: str,
        header: StateHeader,
        tail: bytes,
        count: int,
        target: str,
        now: float,
        *,
        share: bool,
    ) -> _Plan:
        """The first ``count`` messages of a history as a plan for the session at ``target``.

        Chunks entirely inside the prefix are referenced as they are (``share``) or copied
        byte for byte; only the messages of the one chunk (or the tail) the cut falls in
        are decoded and written again, so the bytes written are at most one chunk's,
        whatever the length of the history. The chunks it must read come in one read per
        scope; one gone meanwhile raises ``_MissingChunk`` (the caller knows whether that
        is a race or damage).
        """
        inside: list[ChunkRef] = []
        cut: ChunkRef | None = None
        taken = 0
        for ref in header.chunks:
            if taken >= count:
                break
            if taken + ref.count <= count:
                inside.append(ref)
            else:
                cut = ref
                break
            taken += ref.count
        needed = [*([] if share else inside), *([cut] if cut is not None else [])]
        fetched = await self._fetch_chunks(session_id, scope, needed) if needed else {}
        plan = _Plan([], EMPTY_ARRAY, 0)
        for ref in inside:
            if share:
                plan.chunks.append(rehomed(ref, scope, target))
                continue
            got = fetched[ref.key]
            raw = got.raw if isinstance(got, CachedChunk) else got
            copy, write = self._new_chunk(
                target, _Planned(ref.count, ref.size, ref.level, ref.sealed, blob=raw), now
            )
            plan.chunks.append(copy)
            plan.writes.append(write)
        rest: Sequence[ModelMessage] = ()
        if cut is not None:
            rest = self._chunk_messages(session_id, cut, fetched[cut.key])[: count - taken]
        elif count - taken == header.tail_count:
            plan.tail, plan.tail_count = tail, header.tail_count
        elif count > taken:
            try:
                rest = decode_messages(tail, header.tail_count)[: count - taken]
            except RecordError as exc:
                raise self._invalid(session_id, str(exc)) from None
        if rest:
            blob = encode_messages(rest)
            if len(blob) <= self.tail_bytes:
                plan.tail, plan.tail_count = blob, len(rest)
            else:
                for planned in self._spill(blob, rest):
                    ref, write = self._new_chunk(target, planned, now)
                    plan.chunks.append(ref)
                    plan.writes.append(write)
        return plan

    def _chunk_messages(
        self, session_id: str, ref: ChunkRef, got: bytes | CachedChunk
    ) -> Sequence[ModelMessage]:
        """The messages of a chunk as :meth:`_fetch_chunks` gave it (cached or raw)."""
        if isinstance(got, CachedChunk):
            return got.messages
        try:
            return decode_messages(got, ref.count)
        except RecordError as exc:
            raise self._invalid(session_id, f"history chunk {ref.key}: {exc}") from None

    async def _fork_point(
        self,
        session_id: str,
        scope: str,
        header: StateHeader,
        tail: bytes,
        count: int,
        at_turn: int | None,
    ) -> tuple[int, tuple[EffectCall, ...]]:
        """How many of the first ``count`` messages a fork takes (up to ``at_turn``), and
        the latched effect calls it keeps: an effect that may have happened did so in the
        world, whichever session goes on from there (all of them when the fork takes the
        whole history, else those called within the part it takes). The history is read
        (from the cache when warm) only when a turn is asked for or a latch is cut."""
        recovery = header.recovery
        if at_turn is None and (not recovery or count >= header.message_count):
            return count, recovery
        fetched = await self._fetch_chunks(session_id, scope, header.chunks)
        messages = self._stored_history(session_id, scope, header, tail, fetched)[:count]
        if at_turn is not None:
            count = cut_at_turn(messages, at_turn, f"session {session_id!r}")
        if not recovery or count >= header.message_count:
            return count, recovery
        from pydantic_ai.messages import ModelResponse

        called = {
            call.tool_call_id
            for message in messages[:count]
            if isinstance(message, ModelResponse)
            for call in message.tool_calls
        }
        return count, tuple(c for c in recovery if c.tool_call_id in called)

    async def fork(
        self,
        source_id: str,
        new_id: str,
        *,
        at_turn: int | None,
        catalog: CatalogUpdate | None,
    ) -> ForkReport:
        """Create ``new_id`` with the history of ``source_id`` up to ``at_turn`` (None: all).

        Takes no lease: reads the source's committed state. Chunks are shared when both
        sessions have the same owner (pinned first, then the source read again to check it
        still references them), copied otherwise, so erasing one owner never leaves the
        other's session reading it. The new state is created, never overwritten:
        :class:`SessionExistsError` when ``new_id`` exists.
        """
        source = self.scope_for(source_id)
        target = self.scope_for(new_id)
        if source == target:
            raise InvalidSessionError(
                f"session {source_id!r} cannot be forked into itself", session_id=source_id
            )
        if await self._call(new_id, self.kv.get(target, STATE_KEY)) is not None:
            raise SessionExistsError(f"session {new_id!r} already exists", session_id=new_id)
        # Planning (what the new session takes, its shared chunks pinned) is done whole
        # before anything of the new session is written, so a source that keeps changing
        # costs retries of reads and pins only.
        taken = await self._plan_fork(source_id, source, new_id, target, at_turn, catalog)
        written = await self._write_fork(new_id, target, source_id, taken, at_turn)
        return ForkReport(
            session_id=new_id,
            source=source_id,
            message_count=taken.count,
            at_turn=at_turn,
            shared_chunks=sum(1 for r in taken.plan.chunks if r.home is not None),
            copied=not taken.share,
            bytes_written=written,
        )

    async def _plan_fork(
        self,
        source_id: str,
        source: str,
        new_id: str,
        target: str,
        at_turn: int | None,
        catalog: CatalogUpdate | None,
    ) -> _ForkPlan:
        """What a fork of ``source_id`` into ``new_id`` takes, read from the source's
        committed state, with the chunks it shares pinned for the new session (read again
        from scratch, up to :data:`_FORK_ATTEMPTS` times, when the source changed under it)."""
        for _ in range(_FORK_ATTEMPTS):
            version, header, tail, count = await self._committed(source_id, source)
            now = self.clock()
            wanted = applied(header.catalog, catalog)
            share = wanted.get("owner") == (header.catalog or {}).get("owner")
            try:
                count, recovery = await self._fork_point(
                    source_id, source, header, tail, count, at_turn
                )
                plan = await self._prefix(
                    source_id, source, header, tail, count, target, now, share=share
                )
            except _MissingChunk as missing:
                # A turn of the source may have merged the chunk away since we read it.
                again = await self._call(source_id, self.kv.get(source, STATE_KEY))
                if again is not None and again.version != version:
                    continue
                raise self._invalid(source_id, f"history chunk {missing} is missing") from None
            if await self._pin_for_fork(source_id, source, new_id, target, plan.chunks):
                return _ForkPlan(header, count, recovery, plan, wanted, share, now)
        raise SessionStoreError(
            f"session {source_id!r} changed too often to be forked", session_id=source_id
        )

    async def _pin_for_fork(
        self,
        source_id: str,
        source: str,
        new_id: str,
        target: str,
        chunks: Sequence[ChunkRef],
    ) -> bool:
        """Pin, for the session at ``target``, the shared ones of ``chunks`` in their homes;
        whether the source still references every one of them once pinned (if not, the
        pins are let go: a turn of the source may have collected a chunk before the pin
        landed, and the fork must be planned again)."""
        pinned = refs_by_home(target, [r for r in chunks if r.home is not None])
        for home, refs in sorted(pinned.items()):
            ends = [r.expires_at for r in refs]
            await self._set_pin(
                new_id,
                home,
                target,
                {r.key for r in refs},
                grow=True,
                expires_at=None if None in ends else max(e for e in ends if e is not None),
            )
        again = await self._call(source_id, self.kv.get(source, STATE_KEY))
        still = (
            set()
            if again is None
            else {r.key for r in self._decode(source_id, again.value)[0].chunks}
        )
        if all(r.key in still for rs in pinned.values() for r in rs):
            return True
        await self.let_go(new_id, target, [r for rs in pinned.values() for r in rs])
        return False

    async def _write_fork(
        self, new_id: str, target: str, source_id: str, taken: _ForkPlan, at_turn: int | None
    ) -> int:
        """Write the new session of a planned fork (its copied chunks, then its state,
        created, never overwritten); the bytes written. On any failure the chunks it
        wrote or pinned are let go in the background."""
        plan, now = taken.plan, taken.now
        written = sum(len(p) for w in plan.writes for p in w.parts)
        try:
            await asyncio.gather(
                *(
                    self._call(
                        new_id,
                        self.kv.create(target, f"{w.key}/{i}", part, ttl=self.chunk_ttl),
                    )
                    for w in plan.writes
                    for i, part in enumerate(w.parts)
                )
            )
            fresh = StateHeader(
                chunks=tuple(plan.chunks),
                tail_count=plan.tail_count,
                recovery=taken.recovery,
                recovery_since=taken.header.recovery_since if taken.recovery else None,
                created_at=now,
                updated_at=now,
                lineage=lineage_doc(source_id, taken.count, at_turn, now),
            )
            handle = LeaseHandle(new_id, target, "", 0, 0.0, [], (), "", fresh, plan.tail)
            new_catalog = await self._fork_catalog(handle, taken)
            value = encode_state(replace(fresh, catalog=new_catalog), plan.tail)
            written += len(value)
            await self._call(new_id, self.kv.create(target, STATE_KEY, value, ttl=self.ttl_seconds))
        except BaseException as exc:
            self._spawn(self.let_go(new_id, target, plan.chunks))
            if isinstance(exc, ConflictError):
                raise SessionExistsError(
                    f"session {new_id!r} already exists", session_id=new_id
                ) from None
            raise
        return written

    async def _fork_catalog(self, handle: LeaseHandle, taken: _ForkPlan) -> dict[str, Any] | None:
        """The catalog field of a fork's new session (its owner's index written first)."""
        wanted = taken.wanted
        if not wanted:
            return None
        # Only what the source's user set is carried over (not its index bookkeeping).
        update = CatalogUpdate.of(
            wanted.get("owner"), wanted.get("title"), wanted.get("tags"), wanted.get("meta")
        )
        return await self._next_catalog(handle, update, None, taken.count, taken.now)

    async def rewind(self, handle: LeaseHandle, to_turn: int) -> BranchInfo:
        """Cut the held session's history back to ``to_turn``, keeping what it held as a
        branch, and release: one branch write, then the fenced state write."""
        header, tail = handle.header, handle.tail
        count = cut_at_turn(handle.messages, to_turn, f"session {handle.session_id!r}")
        now = self.clock()
        try:
            plan = await self._prefix(
                handle.session_id, handle.scope, header, tail, count, handle.scope, now, share=True
            )
        except _MissingChunk as missing:
            raise self._invalid(handle.session_id, f"history chunk {missing} is missing") from None
        plan.obsolete = _dropped(header.chunks, plan.chunks)
        branch = await self._set_aside(handle, now, "rewind")
        await self._save_or_drop_branch(handle, handle.messages[:count], plan, branch)
        return branch

    async def restore(self, handle: LeaseHandle, branch_id: str) -> BranchInfo:
        """Bring back the branch ``branch_id`` as the held session's history (what it holds
        now becomes a branch in turn), and release."""
        key = BRANCH_PREFIX + branch_id
        self.kv.check_ids(handle.scope, key)
        entry = await self._call(handle.session_id, self.kv.get(handle.scope, key))
        if entry is None:
            raise BranchNotFoundError(
                f"session {handle.session_id!r} has no branch {branch_id!r}",
                session_id=handle.session_id,
            )
        try:
            _, kept, kept_tail = decode_branch(branch_id, entry.value)
        except RecordError as exc:
            raise self._invalid(handle.session_id, f"branch {branch_id}: {exc}") from None
        try:
            fetched = await self._fetch_chunks(handle.session_id, handle.scope, kept.chunks)
        except _MissingChunk as missing:
            raise self._invalid(
                handle.session_id, f"branch {branch_id}: history chunk {missing} is missing"
            ) from None
        messages = self._stored_history(handle.session_id, handle.scope, kept, kept_tail, fetched)
        plan = _Plan(list(kept.chunks), kept_tail, kept.tail_count)
        plan.obsolete = _dropped(handle.header.chunks, kept.chunks)
        branch = await self._set_aside(handle, self.clock(), "restore")
        await self._save_or_drop_branch(handle, messages, plan, branch)
        await self._call(
            handle.session_id, self.kv.delete(handle.scope, key, expected_version=entry.version)
        )
        return branch

    async def _set_aside(self, handle: LeaseHandle, now: float, reason: str) -> BranchInfo:
        """Write the held history as a branch (before the state write that replaces it)."""
        key = new_branch_key(now)
        value = encode_branch(handle.header, handle.tail, at=now, reason=reason)
        ends = [r.expires_at for r in handle.header.chunks]
        ttl: float | None = self.chunk_ttl
        if ends and None not in ends:
            ttl = max(min(e for e in ends if e is not None) - now, 1.0)
        await self._call(handle.session_id, self.kv.create(handle.scope, key, value, ttl=ttl))
        return BranchInfo(branch_id_of(key), now, handle.header.message_count, reason)

    async def _save_or_drop_branch(
        self,
        handle: LeaseHandle,
        messages: Sequence[ModelMessage],
        plan: _Plan,
        branch: BranchInfo,
    ) -> None:
        """Save ``plan`` and release; a save that did not land takes its branch back."""
        try:
            await self._save(handle, messages, release=True, plan=plan)
        except BaseException:
            if handle.lost:
                # Not saved: the branch would repeat the history the session still holds.
                self._spawn(self.kv.delete(handle.scope, BRANCH_PREFIX + branch.branch_id))
            raise

    async def branches(self, session_id: str) -> list[BranchInfo]:
        """The histories rewinds and restores of the session set aside, oldest first."""
        scope = self.scope_for(session_id)
        out: list[BranchInfo] = []
        for key, value in await self._ref_records(session_id, scope, BRANCH_PREFIX):
            try:
                out.append(decode_branch(branch_id_of(key), value)[0])
            except RecordError as exc:
                raise self._invalid(session_id, f"branch {branch_id_of(key)}: {exc}") from None
        return out

    async def lineage(self, session_id: str) -> list[dict[str, Any]]:
        """Where the session came from: its fork record, then its source's, … (oldest last).

        Stops at a session that was not forked, or whose source no longer exists.
        """
        out: list[dict[str, Any]] = []
        seen = {session_id}
        current = session_id
        while True:
            entry = await self._call(current, self.kv.get(self.scope_for(current), STATE_KEY))
            if entry is None:
                return out
            header, _ = self._decode(current, entry.value)
            if header.lineage is None:
                return out
            out.append({"session_id": current, **header.lineage})
            current = str(header.lineage.get("source"))
            if current in seen:
                return out
            seen.add(current)

    async def list_owner(
        self, owner: str, *, limit: int, cursor: str | None, tags: Sequence[str] | None
    ) -> SessionPage:
        """One page of the owner's sessions, most recent first (see ``CatalogIndex.page``)."""
        return await self.catalog.page(owner, limit=limit, cursor=cursor, tags=tags)


def _dropped(old: Sequence[ChunkRef], new: Sequence[ChunkRef]) -> list[ChunkRef]:
    """The chunks of ``old`` that ``new`` does not reference (by home and key)."""
    kept = {(r.home, r.key) for r in new}
    return [r for r in old if (r.home, r.key) not in kept]


class _MissingChunk(Exception):
    """A chunk part referenced by the state is absent (raised internally, then classified)."""


def _conversation_summary(extra: dict[str, Any]) -> dict[str, Any]:
    """``SessionInfo``'s usage and pending deferred calls from the header (JSON only: a
    listing never imports Pydantic AI), never a call's arguments."""
    kept = extra.get("conversation")
    if not isinstance(kept, dict):
        return {}
    deferred = kept.get("deferred") if isinstance(kept.get("deferred"), dict) else {}
    pending = tuple(
        (str(call.get("tool_name", "")), str(call.get("tool_call_id", "")), kind)
        for kind, field_name in (("approval", "approvals"), ("external", "calls"))
        for call in (deferred or {}).get(field_name) or ()
        if isinstance(call, dict)
    )
    usage = kept.get("usage")
    return {"usage": dict(usage) if isinstance(usage, dict) else {}, "pending_deferred": pending}
