"""The native session fast path: a turn in two round trips instead of three.

Same stored layout, same fencing rules as the generic
:class:`~agent_stores.sessions.KVSessionStorage` (``records.py``); two transitions are
done by single PostgreSQL statements:

``load_and_acquire`` — one statement reads the ``state`` row (locking it), decides in
    the server what the generic code decides in Python (lease held by another owner →
    busy; this store just released and another client waits → courtesy; otherwise take
    the lease: ``fence + 1``, new lease, ``updated_at``, ``released`` cleared), writes the
    new state with a fresh version, drops this store's waiting hint, and returns the new
    state together with every history chunk part this process does not have cached. An
    absent (or expired) session is created in the same statement. Anything unusual — a
    recovery marker, chunks that need re-copying before the TTL, a header the server
    cannot read — is left to the generic code (its extra round trips only then).

``save_and_release`` / ``checkpoint`` / ``release`` — new history chunks are not written
    ahead; they are inserted by the same statement that swaps the state (``UPDATE … WHERE
    version = <fence>`` in a CTE, chunks inserted only if it matched). Chunks and the state
    referencing them therefore commit together, which is stronger than "chunks first",
    and a fenced-out writer leaves no orphan chunks.

A statement whose connection breaks mid-flight surfaces as a transient error; the
generic layer then resolves it as it does for any unknown outcome (retry with the same
owner for an acquire, compare the stored bytes for a save).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
import psycopg.errors
from agent_stores.errors import ConfigError, ConflictError
from agent_stores.kv.base import new_version
from agent_stores.sessions import SessionStore
from agent_stores.sessions.errors import TransientStoreError
from agent_stores.sessions.records import (
    EMPTY_ARRAY,
    FORMAT,
    STATE_KEY,
    WAITER_KEY,
    ChunkRef,
    Lease,
    StateHeader,
    encode_state,
)
from agent_stores.sessions.storage import (
    Acquired,
    Busy,
    KVSessionStorage,
    LeaseHandle,
    _MissingChunk,
)
from psycopg import AsyncConnection, sql
from pydantic_ai.messages import ModelMessage

from .kv import PostgresKV

# Chunk parts staged by the save being run in this context: (key, bytes, expires_at).
_STAGED: contextvars.ContextVar[list[tuple[str, bytes, float | None]] | None] = (
    contextvars.ContextVar("agent_stores_postgres_staged_chunks", default=None)
)

_HINT_SCOPES = 4096

_ACQUIRE: LiteralString = """
WITH cur AS (
    SELECT version, value, position(decode('0a', 'hex') IN value) AS nl
    FROM {kv}
    WHERE scope = %(scope)s AND key = %(state)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
    FOR UPDATE
),
hdr AS (
    SELECT version, value, nl,
           CASE WHEN nl > 1
                THEN convert_from(substring(value FROM 1 FOR nl - 1), 'UTF8')::jsonb
           END AS h
    FROM cur
),
waiter AS (
    SELECT value FROM {kv}
    WHERE scope = %(scope)s AND key = %(waiter)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
),
dec AS (
    SELECT hdr.*,
        CASE
            WHEN h IS NULL OR jsonb_typeof(h) <> 'object'
                 OR h->>'format' IS DISTINCT FROM %(format)s
                 OR NOT h ?& ARRAY['lease', 'fence', 'chunks', 'tail_count', 'recovery',
                                   'created_at', 'updated_at']
                 OR jsonb_typeof(h->'chunks') <> 'array'
                THEN 'fallback'
            WHEN jsonb_typeof(h->'lease') = 'object'
                 AND (h->'lease'->>'expires_at')::float8 > %(now)s
                 AND h->'lease'->>'owner' IS DISTINCT FROM %(owner)s
                THEN 'busy'
            WHEN jsonb_typeof(h->'released') = 'object'
                 AND h->'released'->>'by' = %(store_id)s
                 AND EXISTS (SELECT 1 FROM waiter WHERE waiter.value <> %(store_id_b)s)
                 AND (h->'released'->>'at')::float8 + %(courtesy)s > %(now)s
                THEN 'courtesy'
            WHEN jsonb_typeof(h->'recovery') <> 'null'
                THEN 'fallback'
            WHEN %(horizon)s::float8 IS NOT NULL AND EXISTS (
                    SELECT 1 FROM jsonb_array_elements(h->'chunks') AS c(ref)
                    WHERE jsonb_typeof(ref->6) = 'number'
                      AND (ref->>6)::float8 < %(horizon)s::float8)
                THEN 'fallback'
            ELSE 'acquire'
        END AS decision
    FROM hdr
),
upd AS (
    UPDATE {kv} AS t
    SET value = convert_to((d.h || jsonb_build_object(
                    'lease', jsonb_build_object(
                        'owner', %(owner)s::text,
                        'fence', (d.h->>'fence')::bigint + 1,
                        'expires_at', %(lease_end)s::float8,
                        'acquired_at', %(now)s::float8),
                    'fence', (d.h->>'fence')::bigint + 1,
                    'updated_at', %(now)s::float8,
                    'released', NULL))::text, 'UTF8')
                || decode('0a', 'hex') || substring(d.value FROM d.nl + 1),
        version = %(version)s,
        expires_at = %(expires_at)s::float8
    FROM dec AS d
    WHERE t.scope = %(scope)s AND t.key = %(state)s AND t.version = d.version
      AND d.decision = 'acquire'
    RETURNING t.value
),
ins AS (
    INSERT INTO {kv} AS t (scope, key, value, version, expires_at)
    SELECT %(scope)s::text, %(state)s::text, %(fresh)s::bytea, %(version)s::text,
           %(expires_at)s::float8
    WHERE NOT EXISTS (SELECT 1 FROM cur)
    ON CONFLICT (scope, key) DO UPDATE
        SET value = EXCLUDED.value, version = EXCLUDED.version, expires_at = EXCLUDED.expires_at
        WHERE t.expires_at IS NOT NULL AND t.expires_at <= %(now)s
    RETURNING t.value
),
unwait AS (
    DELETE FROM {kv}
    WHERE scope = %(scope)s AND key = %(waiter)s AND value = %(store_id_b)s
      AND EXISTS (SELECT 1 FROM upd)
)
SELECT 'state'::text AS kind,
       d.decision,
       NULL::text AS key,
       COALESCE((SELECT value FROM upd), (SELECT value FROM ins)) AS value,
       CASE WHEN d.decision = 'busy' THEN (d.h->'lease'->>'expires_at')::float8 END,
       CASE WHEN d.decision = 'busy' THEN d.h->'lease'->>'owner' END,
       EXISTS (SELECT 1 FROM waiter),
       CASE WHEN d.decision = 'courtesy'
            THEN (d.h->'released'->>'at')::float8 + %(courtesy)s - %(now)s END
FROM (VALUES (1)) AS one(x) LEFT JOIN dec AS d ON true
UNION ALL
SELECT 'chunk', NULL, k.key, k.value, NULL, NULL, NULL, NULL
FROM {kv} AS k
WHERE %(load)s AND k.scope = %(scope)s
  AND (k.expires_at IS NULL OR k.expires_at > %(now)s)
  AND k.key = ANY (ARRAY(
      SELECT (ref->>0) || '/' || part
      FROM dec,
           jsonb_array_elements(dec.h->'chunks') AS c(ref),
           generate_series(0, (ref->>3)::int - 1) AS part
      WHERE dec.decision = 'acquire' AND NOT ((ref->>0) = ANY (%(cached)s::text[]))))
"""

_SAVE: LiteralString = """
WITH st AS (
    UPDATE {kv}
    SET value = %(value)s, version = %(version)s, expires_at = %(expires_at)s::float8
    WHERE scope = %(scope)s AND key = %(state)s AND version = %(expected)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
    RETURNING 1
),
ch AS (
    INSERT INTO {kv} (scope, key, value, version, expires_at)
    SELECT %(scope)s::text, u.k, u.v, u.ver, u.e
    FROM unnest(%(keys)s::text[], %(values)s::bytea[], %(versions)s::text[],
                %(expiries)s::float8[]) AS u(k, v, ver, e)
    WHERE EXISTS (SELECT 1 FROM st)
    RETURNING 1
)
SELECT (SELECT count(*) FROM st), (SELECT count(*) FROM ch)
"""


class PostgresSessionStorage(KVSessionStorage):
    """:class:`KVSessionStorage` with single-statement acquire and save on :class:`PostgresKV`."""

    def __init__(self, kv: Any, **options: Any) -> None:
        if not isinstance(kv, PostgresKV):
            raise ConfigError(
                detail=f"PostgresSessionStorage needs a PostgresKV, got {type(kv).__name__}"
            )
        super().__init__(kv, **options)
        self.pg = kv
        self._acquire_sql = sql.SQL(_ACQUIRE).format(kv=kv.names.kv).as_bytes(None)
        self._save_sql = sql.SQL(_SAVE).format(kv=kv.names.kv).as_bytes(None)
        # Chunk keys of the last state seen per session: candidates for "already cached".
        self._hints: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    # -- acquire + load: one statement -------------------------------------------------------

    def _remember(self, scope: str, header: StateHeader) -> None:
        self._hints[scope] = tuple(c.key for c in header.chunks)
        self._hints.move_to_end(scope)
        while len(self._hints) > _HINT_SCOPES:
            self._hints.popitem(last=False)

    async def load_and_acquire(
        self,
        session_id: str,
        *,
        owner: str,
        allow_recovery: bool = False,
        load_history: bool = True,
    ) -> Acquired | Busy:
        scope = self.scope_for(session_id)
        now = self.clock()
        lease_end = now + self.lease_seconds
        fresh = encode_state(
            StateHeader(
                lease=Lease(owner, 1, lease_end, now), fence=1, created_at=now, updated_at=now
            ),
            EMPTY_ARRAY,
        )
        cached = [k for k in self._hints.get(scope, ()) if self.cache.get(scope, k) is not None]
        params: dict[str, Any] = {
            "scope": scope,
            "state": STATE_KEY,
            "waiter": WAITER_KEY,
            "now": now,
            "owner": owner,
            "store_id": self.store_id,
            "store_id_b": self.store_id.encode(),
            "courtesy": self.handover_courtesy_seconds,
            "horizon": None if self.ttl_seconds is None else now + self.ttl_seconds,
            "format": FORMAT,
            "lease_end": lease_end,
            "version": new_version(),
            "expires_at": None if self.ttl_seconds is None else now + self.ttl_seconds,
            "fresh": fresh,
            "load": load_history,
            "cached": cached,
        }

        async def run(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]] | None:
            try:
                cur = await conn.execute(self._acquire_sql, params, binary=True)
            except psycopg.errors.DataError:
                return None  # a header the server cannot read: the generic path reports it
            return await cur.fetchall()

        rows = await self._call(session_id, self.pg.run_native_write("session acquire", run))
        state = next((r for r in rows or () if r[0] == "state"), None)
        if state is None:
            return await super().load_and_acquire(
                session_id, owner=owner, allow_recovery=allow_recovery, load_history=load_history
            )
        _, decision, _, value, lease_expires_at, holder, waiter, retry_after = state
        if decision == "busy":
            return Busy(lease_expires_at=lease_expires_at, holder=holder, waiter_hinted=waiter)
        if decision == "courtesy":
            return Busy(retry_after=max(float(retry_after), 0.0))
        if decision not in (None, "acquire"):
            return await super().load_and_acquire(
                session_id, owner=owner, allow_recovery=allow_recovery, load_history=load_history
            )
        if value is None:
            # Lost a race for an absent session (or the row changed under the lock).
            return Busy(retry_after=0.0)
        header, tail = self._decode(session_id, bytes(value))
        assert header.lease is not None
        handle = LeaseHandle(
            session_id,
            scope,
            owner,
            header.fence,
            header.lease.expires_at,
            [],
            header.recovery,
            params["version"],
            header,
            tail,
        )
        self._remember(scope, header)
        if not load_history:
            return Acquired(handle)
        try:
            parts = {r[2]: bytes(r[3]) for r in rows or () if r[0] == "chunk"}
            fetched: dict[str, bytes] = {}
            missing: list[ChunkRef] = []
            for ref in header.chunks:
                if self.cache.get(scope, ref.key) is not None:
                    continue
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
            handle.messages = self._assemble(session_id, scope, header, tail, fetched)
        except BaseException:
            await asyncio.shield(self._release_quietly(handle))
            raise
        return Acquired(handle)

    # -- save + release: one statement -------------------------------------------------------

    async def checkpoint(self, handle: LeaseHandle, messages: Sequence[ModelMessage]) -> None:
        token = _STAGED.set([])
        try:
            await super().checkpoint(handle, messages)
        finally:
            _STAGED.reset(token)

    async def save_and_release(
        self, handle: LeaseHandle, messages: Sequence[ModelMessage] | None
    ) -> None:
        token = _STAGED.set([])
        try:
            await super().save_and_release(handle, messages)
        finally:
            _STAGED.reset(token)

    async def release(self, handle: LeaseHandle) -> None:
        token = _STAGED.set([])
        try:
            await super().release(handle)
        finally:
            _STAGED.reset(token)

    async def _store_chunk_parts(
        self, session_id: str, scope: str, key: str, parts: Sequence[bytes], now: float
    ) -> None:
        staged = _STAGED.get()
        if staged is None:
            await super()._store_chunk_parts(session_id, scope, key, parts, now)
            return
        # Inside a save: the parts are written by the same statement as the state.
        ttl = self.chunk_ttl
        expires_at = None if ttl is None else now + ttl
        staged.extend((f"{key}/{i}", part, expires_at) for i, part in enumerate(parts))

    async def _cas_state(self, handle: LeaseHandle, header: StateHeader, tail: bytes) -> None:
        staged = _STAGED.get()
        if staged is None:
            await super()._cas_state(handle, header, tail)
            return
        header, written, obsolete = await self._ready_for_cas(handle, header)
        value = encode_state(header, tail)
        chunks = list(staged)
        staged.clear()
        now = self.clock()
        params: dict[str, Any] = {
            "scope": handle.scope,
            "state": STATE_KEY,
            "value": value,
            "version": new_version(),
            "expected": handle.version,
            "expires_at": None if self.ttl_seconds is None else now + self.ttl_seconds,
            "now": now,
            "keys": [c[0] for c in chunks],
            "values": [c[1] for c in chunks],
            "versions": [new_version() for _ in chunks],
            "expiries": [c[2] for c in chunks],
        }

        async def run(conn: AsyncConnection[Any]) -> tuple[int, int]:
            self.pg._check_value(handle.scope, STATE_KEY, value)
            cur = await conn.execute(self._save_sql, params)
            row = await cur.fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

        try:
            swapped, inserted = await self._call(
                handle.session_id, self.pg.run_native_write("session save", run)
            )
            if not swapped:
                raise ConflictError("state version changed", scope=handle.scope, key=STATE_KEY)
        except ConflictError:
            handle.lost = True
            self._discard_later(handle.session_id, handle.scope, written)
            raise self._lost(handle) from None
        except TransientStoreError:
            handle.uncertain = value
            raise
        assert inserted == len(chunks)
        handle.version = params["version"]
        handle.header = header
        handle.tail = tail
        self._remember(handle.scope, header)
        self._discard_later(handle.session_id, handle.scope, obsolete)


class PostgresSessionStore(SessionStore):
    """:class:`~agent_stores.sessions.SessionStore` with the PostgreSQL fast path (2 round trips per turn)."""

    storage_class = PostgresSessionStorage
