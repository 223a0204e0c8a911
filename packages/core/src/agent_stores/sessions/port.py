"""The native port of the session store: the two operations a backend may do natively.

Every turn is *acquire + load* (take the lease, return the state and the history chunks
this process lacks) and *save + release* (write the new chunks and the fenced state). The
generic :class:`KVSessionPort` does them with KV primitives (get, CAS, create); a backend
with server-side logic (a Lua script, one SQL statement, a transaction) implements
:class:`SessionPort` and returns it from its ``session_port`` hook, which every
:class:`~agent_stores.sessions.SessionStore` built without an explicit port asks::

    @hookimpl
    def session_port(kv):
        return MySessionPort(kv) if isinstance(kv, MyKV) else None

The stored layout (:mod:`agent_stores.sessions.records`) and the rules stay the core's:
the state's KV version is the fencing token, chunks are never modified, a failed
condition writes nothing. Everything else — waiting, renewal, checkpoints, the recovery
latch, decoding, caching — stays in the core and runs unchanged over every port.

The port's operations:

``acquire(request) -> AcquireReply``
    Atomically read ``state`` and the waiting hint ``w``, decide as the generic code does
    (``docs/plugins.md``, "Sessions": the lease, the hint, the same owner), and when the
    lease is free write :func:`acquired_state` of the
    stored bytes under a fresh version; return that state and the bytes of every chunk
    part the state references and the request does not list in ``held_chunks``. Cases a
    port does not handle natively (an absent session may be created, or not; a recovery
    marker; chunks due for re-copy before ``refresh_horizon``; a header it cannot read)
    are answered with ``GENERIC``: the core then runs its KV algorithm for this call.
``save(request) -> version``
    Write every chunk part in ``request.chunks`` (create-if-absent) and replace ``state``
    with ``request.state`` if its version is still ``request.expected_version``; return
    the new version, or raise :class:`~agent_stores.errors.ConflictError` (nothing of the
    state written). Chunks may be written before the state (the generic port) or in the
    same transaction (native ports); never after.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from ..errors import ConflictError
from ..kv.base import Entry, KVStore
from .records import FORMAT, STATE_KEY, RecordError, StateHeader, decode_state, remember_acquired
from .records import KEPT_FIELDS as KEPT_FIELDS  # part of the port's layout (public)

#: Prefix every state header written by :func:`encode_state` and :func:`acquired_state`
#: starts with; the fields up to ``,"chunks":`` are the ones an acquire rewrites.
HEADER_START = b'{"format":"' + FORMAT.encode() + b'","fence":'

Outcome = Literal["acquired", "busy", "courtesy", "generic"]


@dataclass(frozen=True, slots=True)
class AcquireRequest:
    """Everything a port needs to take a session's lease in one round trip."""

    scope: str
    owner: str
    #: the store's clock now (decides expiry of the lease, the hint and the entries)
    now: float
    #: expiry of the new lease
    lease_end: float
    #: identifies the store object (``released.by`` in the header, the hint's value)
    store_id: str
    #: how long after its own release this store yields to another client's hint
    courtesy_seconds: float
    #: TTL of the state record (None: no expiry)
    ttl_seconds: float | None
    #: chunks expiring before this instant must be re-copied: answer ``GENERIC``
    refresh_horizon: float | None
    #: False: take the lease only, return no chunks
    load_history: bool
    #: chunk keys (``h/<id>``) whose bytes this process holds; never send them back
    held_chunks: frozenset[str]
    #: the state this store wrote last (its bytes and version), when this process holds
    #: every chunk it names: a port may swap that version for :func:`known_acquired_state`
    #: without reading the state (see the module doc); None: nothing known
    known: Entry | None = None
    #: the header of ``known`` as this store encoded it, so a port deciding in Python on
    #: the known state (:func:`known_acquired_state`) need not decode it again; None:
    #: decode ``known.value``
    known_header: StateHeader | None = None

    def fresh_state(self) -> bytes:
        """The state to create when the session is absent (a port may answer GENERIC instead)."""
        return fresh_state(self.owner, self.lease_end, self.now)


@dataclass(frozen=True, slots=True)
class AcquireReply:
    """What :meth:`SessionPort.acquire` decided."""

    outcome: Outcome
    #: acquired: the new version of ``state`` and its bytes
    version: str | None = None
    state: bytes | None = None
    #: acquired: chunk part key (``h/<id>/<n>``) -> bytes, for chunks not held
    parts: Mapping[str, bytes] = field(default_factory=dict)
    #: busy: the holder's lease expiry and owner; whether a waiting hint exists
    lease_expires_at: float | None = None
    holder: str | None = None
    waiter_hinted: bool = False
    #: courtesy: seconds until this store may take the session again
    retry_after: float | None = None


#: The reply asking the core to run its generic KV algorithm for this acquire.
GENERIC = AcquireReply("generic")


@dataclass(frozen=True, slots=True)
class ChunkWrite:
    """A new immutable history chunk: its parts go to ``<key>/0``, ``<key>/1``, …"""

    key: str
    parts: Sequence[bytes]
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class SaveRequest:
    """A fenced state write together with the chunks it references."""

    scope: str
    state: bytes
    expected_version: str
    ttl_seconds: float | None
    #: the TTL of the chunk parts (None: no expiry)
    chunk_ttl_seconds: float | None
    chunks: Sequence[ChunkWrite]


def check_save(kv: KVStore, request: SaveRequest) -> None:
    """Refuse, before anything is written, all that the public KV API would refuse in
    ``request``, in :class:`KVSessionPort`'s order: a closed client; each chunk part, then
    the state (id, then size); the parts' TTL (when there are parts), then the state's. A
    native port calls this first, so it refuses exactly what the generic port does."""
    kv.check_open()
    for chunk in request.chunks:
        for i, part in enumerate(chunk.parts):
            key = f"{chunk.key}/{i}"
            kv.check_ids(request.scope, key)
            kv.check_value(request.scope, key, part)
    kv.check_ids(request.scope, STATE_KEY)
    kv.check_value(request.scope, STATE_KEY, request.state)
    _check_save_ttls(kv, request)


def _check_save_ttls(kv: KVStore, request: SaveRequest) -> None:
    now = kv.clock()
    if any(chunk.parts for chunk in request.chunks):
        kv.expires_at(request.chunk_ttl_seconds, now)
    kv.expires_at(request.ttl_seconds, now)


@runtime_checkable
class SessionPort(Protocol):
    """The operations of a turn that a backend may implement natively (see the module doc)."""

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        """Take the lease and load what the process lacks, or say why not (see the module doc)."""
        ...

    async def save(self, request: SaveRequest) -> str:
        """Write ``request.chunks`` and the fenced state; the new version, or ConflictError."""
        ...


class KVSessionPort:
    """The default port on any KV store: the core's algorithm does the acquire (get + CAS,
    chunk reads alongside), the save writes chunk parts and then CASes the state."""

    def __init__(self, kv: KVStore) -> None:
        self.kv = kv

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        """Always ``GENERIC``: the core's KV algorithm is this port's acquire."""
        return GENERIC

    async def save(self, request: SaveRequest) -> str:
        """Chunk parts first (in parallel), then one CAS on ``state``."""
        # A bad TTL of the state must not leave the chunk parts written before it.
        _check_save_ttls(self.kv, request)
        if request.chunks:  # most saves have none: nothing made for them, nothing held
            await asyncio.gather(
                *(
                    self._create_part(
                        request.scope, f"{c.key}/{i}", part, request.chunk_ttl_seconds
                    )
                    for c in request.chunks
                    for i, part in enumerate(c.parts)
                )
            )
        return await self.kv.replace(
            request.scope,
            STATE_KEY,
            request.state,
            expected_version=request.expected_version,
            ttl=request.ttl_seconds,
        )

    async def _create_part(self, scope: str, key: str, part: bytes, ttl: float | None) -> None:
        """Create one chunk part. Chunk keys are fresh random names, so a conflict can only
        be this very write, re-sent after its reply was lost: it is ours if the bytes match."""
        try:
            await self.kv.create(scope, key, part, ttl=ttl)
        except ConflictError:
            stored = await self.kv.get(scope, key)
            if stored is None or stored.value != part:
                raise


def acquired_state(stored: bytes, *, owner: str, lease_end: float, now: float) -> bytes | None:
    """The state an acquire writes: ``stored`` with a new lease, ``fence + 1``, ``updated_at``
    and no ``released``; every other field copied byte for byte.

    Returns None when ``stored`` is not in the layout :func:`encode_state` writes (then
    the generic path decodes and re-encodes it). Native ports doing the acquire in the
    server mirror this function exactly (the Redis script does), so the bytes they write
    are the ones the core would: ``json.dumps`` of a float is its ``repr``.
    """
    if not stored.startswith(HEADER_START):
        return None
    newline = stored.find(b"\n")
    kept = stored.find(KEPT_FIELDS, 0, newline)
    if newline < 0 or kept < 0:
        return None
    fence_end = stored.find(b",", len(HEADER_START), kept)
    try:
        fence = int(stored[len(HEADER_START) : fence_end])
    except ValueError:
        return None
    state = acquired_header(fence + 1, owner, lease_end, now) + stored[kept:]
    # The core decodes it next, from the acquire's reply: from the kept fields it noted.
    remember_acquired(
        state,
        stored[kept:newline],
        stored[newline + 1 :],
        fence=fence + 1,
        owner=owner,
        lease_end=lease_end,
        now=now,
    )
    return state


def decide_acquire(
    stored: bytes,
    hint: Entry | None,
    request: AcquireRequest,
    *,
    header: StateHeader | None = None,
) -> StateHeader | AcquireReply:
    """What an acquire of a live stored state decides, as the generic code does: the
    stored header when the lease may be taken (then write :func:`acquired_state`), else
    the reply saying why not — ``busy`` (another owner's lease is live), ``courtesy`` (this
    store just released it and another client's ``hint`` waits) or ``GENERIC`` (a header
    that cannot be decoded, a recovery marker, chunks due for re-copy before
    ``request.refresh_horizon``: the core handles those).

    For ports that decide in Python, inside their database's transaction; ``hint`` is the
    live waiting hint (``WAITER_KEY``) read in the same transaction, or None. ``header``:
    ``stored`` decoded already (it is not decoded again).
    """
    if header is None:
        try:
            header, _ = decode_state(stored)
        except RecordError:
            return GENERIC  # damaged: the core reports it and overwrites nothing
    lease = header.lease
    if lease is not None and lease.expires_at > request.now and lease.owner != request.owner:
        return AcquireReply(
            "busy",
            lease_expires_at=lease.expires_at,
            holder=lease.owner,
            waiter_hinted=hint is not None,
        )
    if (
        header.released_by == request.store_id
        and header.released_at is not None
        and hint is not None
        and hint.value != request.store_id.encode()
    ):
        retry_after = header.released_at + request.courtesy_seconds - request.now
        if retry_after > 0:
            return AcquireReply("courtesy", retry_after=retry_after)
    if header.recovery:
        return GENERIC  # the recovery latch is the core's to raise
    horizon = request.refresh_horizon
    if horizon is not None and any(
        chunk.expires_at is not None and chunk.expires_at < horizon for chunk in header.chunks
    ):
        return GENERIC  # chunks due for re-copy: the core copies them
    return header


def acquired_state_if_takeable(
    stored: bytes, request: AcquireRequest, max_bytes: int, *, header: StateHeader | None = None
) -> bytes | None:
    """The state an acquire writes over ``stored`` when its write requires that no hint
    waits (so none is read), or None when ``stored`` does not allow taking the lease
    without the full decision: a live lease of another owner, a recovery marker, chunks
    due for re-copy, a header that cannot be decoded, a layout :func:`acquired_state`
    cannot splice, a new state over ``max_bytes``. ``header``: ``stored`` decoded
    already (it is not decoded again)."""
    decided = decide_acquire(stored, None, request, header=header)
    if not isinstance(decided, StateHeader):
        return None
    state = acquired_state(
        stored, owner=request.owner, lease_end=request.lease_end, now=request.now
    )
    if state is None or len(state) > max_bytes:
        return None
    return state


def known_acquired_state(request: AcquireRequest, max_bytes: int) -> bytes | None:
    """The state a warm acquire writes over ``request.known`` (see the module doc), or None
    when the known state does not allow taking the lease without the full decision
    (:func:`acquired_state_if_takeable`)."""
    known = request.known
    if known is None:
        return None
    return acquired_state_if_takeable(known.value, request, max_bytes, header=request.known_header)


def acquired_header(fence: int, owner: str, lease_end: float, now: float) -> bytes:
    """The rewritten first fields of an acquired state header (up to ``,"chunks":``)."""
    return b"".join(
        (
            HEADER_START,
            str(fence).encode(),
            b',"lease":{"owner":',
            json.dumps(owner).encode(),
            b',"fence":',
            str(fence).encode(),
            b',"expires_at":',
            repr(float(lease_end)).encode(),
            b',"acquired_at":',
            repr(float(now)).encode(),
            b'},"updated_at":',
            repr(float(now)).encode(),
            b',"released":null',
        )
    )


def fresh_state(owner: str, lease_end: float, now: float) -> bytes:
    """The state of a session created by an acquire: fence 1, no history (as ``encode_state``)."""
    return b"".join(
        (
            acquired_header(1, owner, lease_end, now),
            b',"chunks":[],"tail_count":0,"recovery":null,"created_at":',
            repr(float(now)).encode(),
            b"}\n[]",
        )
    )
