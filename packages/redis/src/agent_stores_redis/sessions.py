"""The native session store on Redis: a turn in two round trips.

Same stored layout, fencing and guarantees as the generic
:class:`~agent_stores.sessions.SessionStore` (it *is* that store, with a faster storage
layer), built on the Redis KV store's atomic multi-key ``commit`` script:

* **acquire + load in one round trip.** The store remembers the ``state`` record it
  wrote when it last released a session (version, header, inline tail; the history
  chunks are in the chunk cache). The next turn on that session builds the acquired
  state from it and sends one script: replace ``state`` if it is still at that version
  *and* no other client left a waiting hint. When that holds, the stored state is
  byte-for-byte what the generic store would have read, so the outcome is the same; when
  it does not (another process took a turn, someone waits, the state expired), the
  generic path runs (two more round trips).
* **save + release in one round trip.** New history chunks are written in the same
  script as the fenced ``state`` write (``commit``: creates of fresh random keys + a
  conditional replace), instead of one round trip for the chunks and one for the state.
  Chunks still never exist referenced-but-unwritten, and a lost lease writes nothing.

Everything else — waiting, renewal, cancellation, checkpoints, the recovery latch — is
the generic code, and the session contract runs unchanged on it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from agent_stores.errors import ConflictError
from agent_stores.kv.base import Check, Create, Operation, Replace
from agent_stores.sessions import Acquired, Busy, KVSessionStorage, LeaseHandle, SessionStore
from agent_stores.sessions.errors import TransientStoreError
from agent_stores.sessions.records import (
    STATE_KEY,
    WAITER_KEY,
    Lease,
    StateHeader,
    encode_state,
)

# A private type of the generic layer: the chunk plan handed to ``_write_chunk``.
from pydantic_ai.messages import ModelMessage

#: How many released sessions a store remembers for the one-round-trip acquire.
KNOWN_STATES = 4096


@dataclass(frozen=True, slots=True)
class _Known:
    """The ``state`` record exactly as this store wrote it when releasing the session."""

    version: str
    header: StateHeader
    tail: bytes


@dataclass(frozen=True, slots=True)
class _StagedChunk:
    key: str
    parts: list[bytes]
    ttl: float | None


# Chunk writes staged by the save running in this task (None: write them at once).
_staged: ContextVar[list[_StagedChunk] | None] = ContextVar(
    "agent_stores_redis_staged_chunks", default=None
)


class RedisSessionStorage(KVSessionStorage):
    """:class:`KVSessionStorage` with one-round-trip acquire and save on :class:`RedisKV`."""

    def __init__(self, kv: Any, **options: Any) -> None:
        super().__init__(kv, **options)
        self._known: OrderedDict[str, _Known] = OrderedDict()
        #: round trips saved, for people reading metrics: (fast acquires, fallbacks)
        self.fast_acquires = 0
        self.fallback_acquires = 0

    # -- known states ---------------------------------------------------------------------

    def _remember(self, handle: LeaseHandle) -> None:
        self._known[handle.scope] = _Known(handle.version, handle.header, handle.tail)
        self._known.move_to_end(handle.scope)
        while len(self._known) > KNOWN_STATES:
            self._known.popitem(last=False)

    def _forget(self, scope: str) -> None:
        self._known.pop(scope, None)

    # -- acquire ----------------------------------------------------------------------------

    async def load_and_acquire(
        self,
        session_id: str,
        *,
        owner: str,
        allow_recovery: bool = False,
        load_history: bool = True,
    ) -> Acquired | Busy:
        scope = self.scope_for(session_id)
        known = self._known.pop(scope, None)
        if (
            known is not None
            and known.header.lease is None
            and (allow_recovery or not known.header.recovery)
        ):
            fast = await self._fast_acquire(session_id, scope, owner, known, load_history)
            if fast is not None:
                self.fast_acquires += 1
                return fast
        self.fallback_acquires += 1
        return await super().load_and_acquire(
            session_id, owner=owner, allow_recovery=allow_recovery, load_history=load_history
        )

    async def _fast_acquire(
        self, session_id: str, scope: str, owner: str, known: _Known, load_history: bool
    ) -> Acquired | None:
        """Take the lease in one script if ``state`` is still ``known`` and nobody waits."""
        now = self.clock()
        lease_end = now + self.lease_seconds
        fence = known.header.fence + 1
        acquired = replace(
            known.header,
            lease=Lease(owner, fence, lease_end, now),
            fence=fence,
            updated_at=now,
            released_by=None,
            released_at=None,
        )
        chunks, written, obsolete = await self._refresh_chunks(
            session_id, scope, known.header.chunks, now
        )
        if written:
            acquired = replace(acquired, chunks=tuple(chunks))
        # The history comes from the chunk cache (taken now: the cache may evict later).
        fetched: dict[str, bytes] = {}
        if load_history:
            for ref in acquired.chunks:
                cached = self.cache.get(scope, ref.key)
                if cached is None:
                    return None  # the generic path reads missing chunks alongside its CAS
                fetched[ref.key] = cached.raw
        ops: list[Operation] = [
            Replace(STATE_KEY, encode_state(acquired, known.tail), known.version, self.ttl_seconds),
            Check(WAITER_KEY, None),
        ]
        try:
            versions = await self._call(session_id, self.kv.commit(scope, ops))
        except ConflictError:
            self._discard_later(session_id, scope, written)
            return None
        version = versions[0]
        assert version is not None
        handle = LeaseHandle(
            session_id,
            scope,
            owner,
            fence,
            lease_end,
            [],
            acquired.recovery,
            version,
            acquired,
            known.tail,
        )
        self._discard_later(session_id, scope, obsolete)
        if load_history:
            try:
                handle.messages = self._assemble(session_id, scope, acquired, known.tail, fetched)
            except BaseException:
                await asyncio.shield(self._release_quietly(handle))
                raise
        return Acquired(handle)

    # -- saves ------------------------------------------------------------------------------

    async def _save(
        self, handle: LeaseHandle, messages: Sequence[ModelMessage] | None, *, release: bool
    ) -> None:
        token = _staged.set([])
        try:
            await super()._save(handle, messages, release=release)
        except BaseException:
            self._forget(handle.scope)
            raise
        finally:
            _staged.reset(token)
        if release:
            self._remember(handle)

    async def _store_chunk_parts(
        self, session_id: str, scope: str, key: str, parts: Sequence[bytes], now: float
    ) -> None:
        staged = _staged.get()
        if staged is None:
            await super()._store_chunk_parts(session_id, scope, key, parts, now)
            return
        # Inside a save: the parts are written by the same script as the state.
        staged.append(_StagedChunk(key, list(parts), self.chunk_ttl))

    async def _cas_state(self, handle: LeaseHandle, header: StateHeader, tail: bytes) -> None:
        staged = _staged.get()
        if staged is None:
            await super()._cas_state(handle, header, tail)
            return
        header, written, obsolete = await self._ready_for_cas(handle, header)
        value = encode_state(header, tail)
        ops: list[Operation] = [
            Create(f"{chunk.key}/{i}", part, chunk.ttl)
            for chunk in staged
            for i, part in enumerate(chunk.parts)
        ]
        ops.append(Replace(STATE_KEY, value, handle.version, self.ttl_seconds))
        staged.clear()
        try:
            versions = await self._call(handle.session_id, self.kv.commit(handle.scope, ops))
        except ConflictError:
            handle.lost = True
            self._discard_later(handle.session_id, handle.scope, written)
            raise self._lost(handle) from None
        except TransientStoreError:
            handle.uncertain = value
            raise
        version = versions[-1]
        assert version is not None
        handle.version = version
        handle.header = header
        handle.tail = tail
        self._discard_later(handle.session_id, handle.scope, obsolete)

    # -- other transitions forget the remembered state --------------------------------------

    async def reset(self, handle: LeaseHandle) -> None:
        self._forget(handle.scope)
        await super().reset(handle)

    async def force_reset(self, session_id: str) -> bool:
        self._forget(self.scope_for(session_id))
        return await super().force_reset(session_id)

    async def clear_recovery(self, handle: LeaseHandle) -> bool:
        self._forget(handle.scope)
        return await super().clear_recovery(handle)


class RedisSessionStore(SessionStore):
    """The session store with :class:`RedisSessionStorage`: two round trips per turn."""

    storage_class: ClassVar[type[KVSessionStorage]] = RedisSessionStorage
