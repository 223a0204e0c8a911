"""The native ports of the SQLite backend: each store write is one ``BEGIN IMMEDIATE``
transaction (one job on the worker thread, one commit) instead of one autocommit job per
KV call.

* memory — the record, its receipt index entry and the directory markers together
  (:class:`SQLiteMemoryPort`, atomic);
* sessions — the acquire (state and hint read, the lease taken, the missing chunk parts
  read) and the save (new history chunks and the fenced state) each in one transaction,
  and the warm acquire and a save without chunks in one statement
  (:class:`SQLiteSessionPort`);
* checkpointer — the position counter and the entry together (:class:`SQLiteJournalPort`).

The builtin plugin hands them to the core stores through the ``*_store`` hooks.

Every port method applies the public KV API's checks (closed store, ids, value sizes,
TTLs) to everything it would write, before the transaction starts: the generic ports get
them from the KV calls they make, and a port must refuse exactly what they refuse.
"""

from __future__ import annotations

import sqlite3

from ..checkpointer.port import AppendOutcome, AppendRequest, check_append
from ..errors import ConflictError
from ..kv.base import Entry, new_version
from ..memory.port import MARKER_VALUE, FileWrite, check_file_write
from ..sessions.port import (
    GENERIC,
    AcquireReply,
    AcquireRequest,
    SaveRequest,
    acquired_state,
    check_save,
    decide_acquire,
    known_acquired_state,
)
from ..sessions.records import STATE_KEY, WAITER_KEY
from .sqlite import SQLiteKV


class SQLiteMemoryPort:
    """:class:`~agent_stores.memory.port.MemoryPort` on :class:`SQLiteKV`: one transaction a write."""

    atomic = True

    def __init__(self, kv: SQLiteKV) -> None:
        self.kv = kv

    async def read(self, scope: str, key: str) -> Entry | None:
        """``kv.get``, run inline when the connection is free (:meth:`SQLiteKV.get_inline`)."""
        entry = self.kv.get_inline(scope, key)
        if entry is False:
            return await self.kv.get(scope, key)
        return entry

    async def write(self, write: FileWrite) -> str:
        """Index created if absent → record CAS → markers, all in one transaction."""
        kv = self.kv
        check_file_write(kv, write)
        index = write.index
        now = kv.clock()
        record_expiry = kv.expires_at(write.ttl, now)
        index_expiry = None if index is None else kv.expires_at(index.ttl, now)

        def op(c: sqlite3.Connection) -> str:
            # The index entry first: its create-if-absent is the absence check (one
            # statement fewer than a SELECT before it); a later refusal rolls it back.
            if index is not None and (
                kv.create_in(c, index.scope, index.key, index.value, index_expiry, now) is None
            ):
                raise ConflictError("operation already indexed", scope=index.scope, key=index.key)
            if write.expected_version is None:
                version = kv.create_in(c, write.scope, write.key, write.value, record_expiry, now)
            else:
                version = kv.replace_in(
                    c,
                    write.scope,
                    write.key,
                    write.value,
                    write.expected_version,
                    record_expiry,
                    now,
                )
            if version is None:
                raise ConflictError("record changed", scope=write.scope, key=write.key)
            for scope, key in write.markers:
                kv.create_in(c, scope, key, MARKER_VALUE, None, now)  # None: already marked
            return version

        return await kv.transaction(op)


#: The warm acquire (port.py's module doc): the known state swapped for its acquired one
#: if still stored, live, and no client's waiting hint is live.
_SWAP_KNOWN = (
    "UPDATE agent_stores_kv SET value = :state, version = :version, expires_at = :expires_at "
    f"WHERE scope = :scope AND key = '{STATE_KEY}' AND version = :known "
    "AND (expires_at IS NULL OR expires_at > :now) "
    "AND NOT EXISTS (SELECT 1 FROM agent_stores_kv WHERE scope = :scope "
    f"AND key = '{WAITER_KEY}' AND (expires_at IS NULL OR expires_at > :now))"
)


class SQLiteSessionPort:
    """:class:`~agent_stores.sessions.port.SessionPort` on :class:`SQLiteKV`: the acquire
    and the save each in one transaction, or one statement (the warm acquire, a save
    without chunks); run inline when the connection is free."""

    def __init__(self, kv: SQLiteKV) -> None:
        self.kv = kv

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        """The warm acquire when the request knows the state; else (or when it matched
        nothing) state and hint read, decided (:func:`decide_acquire`), the lease taken
        and the parts of chunks not held read, in one transaction; an absent session is
        created."""
        kv = self.kv
        kv.check_open()
        scope, now = request.scope, request.now
        kv.check_ids(scope, STATE_KEY)
        expires_at = kv.expires_at(request.ttl_seconds, now)  # refuses a TTL <= 0
        limit = kv.limits.max_value_bytes
        known, warm = request.known, known_acquired_state(request, limit)
        if known is not None and warm is not None:
            version = new_version()
            values = {
                "state": warm,
                "version": version,
                "expires_at": expires_at,
                "scope": scope,
                "known": known.version,
                "now": now,
            }
            swapped = await kv.autocommit(lambda c: c.execute(_SWAP_KNOWN, values).rowcount)
            if swapped == 1:
                return AcquireReply("acquired", version=version, state=warm)

        def op(c: sqlite3.Connection) -> AcquireReply:
            found = kv.entries_in(c, scope, (STATE_KEY, WAITER_KEY), now)
            stored, hint = found.get(STATE_KEY), found.get(WAITER_KEY)
            if stored is None:  # absent or expired: a new session
                fresh = request.fresh_state()
                if len(fresh) > limit:
                    return GENERIC  # the generic create refuses it
                created = kv.create_in(c, scope, STATE_KEY, fresh, expires_at, now)
                assert created is not None  # nothing live there, in this transaction
                return AcquireReply("acquired", version=created, state=fresh)
            decided = decide_acquire(stored.value, hint, request)
            if isinstance(decided, AcquireReply):
                return decided
            state = acquired_state(
                stored.value, owner=request.owner, lease_end=request.lease_end, now=now
            )
            if state is None or len(state) > limit:
                return GENERIC  # a layout it cannot splice, or too big: the core decides
            version = kv.replace_in(c, scope, STATE_KEY, state, stored.version, expires_at, now)
            assert version is not None  # read in this transaction
            if hint is not None and hint.value == request.store_id.encode():
                # This store waits no longer: room for the next client's hint.
                kv.delete_in(c, scope, WAITER_KEY, hint.version, now)
            parts: dict[str, bytes] = {}
            if request.load_history:
                wanted = [
                    key
                    for chunk in decided.chunks
                    if chunk.key not in request.held_chunks and chunk.home is None
                    for key in chunk.part_keys()
                ]
                # A missing part (or another scope's) is left out: the core reads it.
                read = kv.entries_in(c, scope, wanted, now)
                parts = {key: entry.value for key, entry in read.items()}
            return AcquireReply("acquired", version=version, state=state, parts=parts)

        return await kv.transaction(op)

    async def save(self, request: SaveRequest) -> str:
        """Chunk parts and the fenced state swap in one transaction; the swap alone (no
        parts) in one statement."""
        kv = self.kv
        check_save(kv, request)
        parts = [
            (f"{chunk.key}/{i}", part, chunk.expires_at)
            for chunk in request.chunks
            for i, part in enumerate(chunk.parts)
        ]
        now = kv.clock()
        state_expiry = kv.expires_at(request.ttl_seconds, now)

        def op(c: sqlite3.Connection) -> str:
            for key, part, expiry in parts:
                if kv.create_in(c, request.scope, key, bytes(part), expiry, now) is None:
                    raise ConflictError("chunk exists", scope=request.scope, key=key)
            version = kv.replace_in(
                c,
                request.scope,
                STATE_KEY,
                request.state,
                request.expected_version,
                state_expiry,
                now,
            )
            if version is None:
                raise ConflictError("state version changed", scope=request.scope, key=STATE_KEY)
            return version

        # The state's swap alone is one statement, atomic without a transaction around it.
        return await (kv.transaction(op) if parts else kv.autocommit(op))


class SQLiteJournalPort:
    """:class:`~agent_stores.checkpointer.port.JournalPort` on :class:`SQLiteKV`: counter and
    entry in one transaction."""

    atomic = True

    def __init__(self, kv: SQLiteKV) -> None:
        self.kv = kv

    async def append(self, request: AppendRequest) -> AppendOutcome:
        """See :meth:`~agent_stores.checkpointer.port.JournalPort.append`."""
        kv = self.kv
        check_append(kv, request)
        now = kv.clock()
        expiry = kv.expires_at(request.ttl, now)

        def op(c: sqlite3.Connection) -> AppendOutcome:
            row = c.execute(
                "SELECT value, version FROM agent_stores_kv WHERE scope = ? AND key = ? "
                "AND (expires_at IS NULL OR expires_at > ?)",
                (request.scope, request.key, now),
            ).fetchone()
            if row is not None:
                return AppendOutcome(None, None, Entry(bytes(row[0]), str(row[1]), None))
            if request.head_version is None:
                head = kv.create_in(
                    c, request.scope, request.head_key, request.head_value, expiry, now
                )
            else:
                head = kv.replace_in(
                    c,
                    request.scope,
                    request.head_key,
                    request.head_value,
                    request.head_version,
                    expiry,
                    now,
                )
            if head is None:
                raise ConflictError(
                    "position counter moved", scope=request.scope, key=request.head_key
                )
            version = kv.create_in(c, request.scope, request.key, request.value, expiry, now)
            assert version is not None  # checked absent under the write lock
            return AppendOutcome(version, head, None)

        return await kv.transaction(op)
