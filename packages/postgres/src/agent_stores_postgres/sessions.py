"""The native session port on PostgreSQL: a turn in two statements, warm or cold (three
once when another client writes a session this store last acquired warm).

:class:`PostgresSessionPort` implements :class:`~agent_stores.sessions.SessionPort`; the
store is the core's :class:`~agent_stores.sessions.SessionStore` with this port (same
stored layout and fencing rules, the contract unchanged):

``acquire`` — one statement reads the ``state`` row (locking it); when it is still the
    state this store wrote last (the request's ``known`` version) and no client waits, it
    writes the acquired state the client built from those bytes
    (:func:`~agent_stores.sessions.port.known_acquired_state`: the warm acquire, no
    header parsed in the server and no state sent back); otherwise it decides in the server
    what the generic code decides in Python (lease held by another owner → busy; this
    store just released and another client waits → courtesy; otherwise take the lease:
    ``fence + 1``, new lease, ``updated_at``, ``released`` cleared), writes the new state
    with a fresh version — byte for byte what
    :func:`~agent_stores.sessions.port.acquired_state` makes of the stored one: the
    rewritten header fields come from Python, the server splices in the fence and copies
    the rest — drops this store's waiting hint, and returns the new state
    together with every history chunk part whose chunk the request does not list as held
    (the client lists the chunks it has cached, so a cold turn costs the same one
    statement and receives only what it lacks). An absent (or expired) session is created
    in the same statement. When this store's last acquire of the session was warm, the
    warm write is first sent alone (``_ACQUIRE_WARM``: the server plans and runs the full
    statement whole even for that write); if it matches nothing (another client wrote,
    or one waits), the full statement follows. Anything unusual — a recovery marker,
    chunks that need re-copying before the TTL, a header the server cannot read or that
    is not in the layout ``encode_state`` writes, a new state over ``max_value_bytes`` —
    is answered ``GENERIC``.

``save`` — new history chunks are inserted by the same statement that swaps the state
    (``UPDATE … WHERE version = <fence>`` in a CTE, chunks inserted only if it matched):
    one statement, one commit, and a fenced-out writer leaves no orphan chunks.

A statement whose connection breaks mid-flight surfaces as an unknown outcome; the core
then resolves it as it does for any (retry with the same owner for an acquire, compare
the stored bytes for a save).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
import psycopg.errors
from agent_stores.backend import (
    FORMAT,
    GENERIC,
    HEADER_START,
    KEPT_FIELDS,
    LRU,
    STATE_KEY,
    WAITER_KEY,
    AcquireReply,
    AcquireRequest,
    SaveRequest,
    acquired_header,
    check_save,
    known_acquired_state,
    new_version,
)
from agent_stores.errors import ConfigError, ConflictError
from psycopg import AsyncConnection, sql

from .kv import PostgresKV
from .numbered import NumberedStatement
from .pool import write_cursor

#: Sessions remembered as acquired warm last (see ``PostgresSessionPort``).
_WARM_LAST_ENTRIES = 4096

#: The second fence field of an acquired header (the lease's; the first ends HEADER_START).
_LEASE_FENCE = b',"fence":'


def _acquired_header_around_fence(owner: str, lease_end: float, now: float) -> tuple[bytes, bytes]:
    """``acquired_header`` cut around its two fence numbers, as ``(middle, end)``:
    ``acquired_header(f, …) == HEADER_START + str(f) + middle + str(f) + end`` for every f.

    Taken from the core's function rather than spelled out again, so the statement writes
    the bytes :func:`~agent_stores.sessions.port.acquired_state` does even if its layout
    changes; the server only knows the fence.
    """
    zero = acquired_header(0, owner, lease_end, now)
    body = zero[len(HEADER_START) + 1 :]
    # The lease's fence is the last one: only numbers and fixed names follow it.
    cut = body.rindex(_LEASE_FENCE + b"0") + len(_LEASE_FENCE)
    middle, end = body[:cut], body[cut + 1 :]
    probe = acquired_header(12, owner, lease_end, now)
    if not zero.startswith(HEADER_START) or probe != HEADER_START + b"12" + middle + b"12" + end:
        raise AssertionError("acquired_header's layout changed: update the session port")
    return middle, end


_ACQUIRE: LiteralString = """
WITH cur AS (
    SELECT version, value, position(decode('0a', 'hex') IN value) AS nl
    FROM {kv}
    WHERE scope = %(scope)s AND key = %(state)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
    FOR UPDATE
),
waiter AS (
    SELECT value FROM {kv}
    WHERE scope = %(scope)s AND key = %(waiter)s
      AND (expires_at IS NULL OR expires_at > %(now)s)
),
known AS (
    -- the warm acquire: the client sent these very bytes, nothing to parse
    SELECT cur.*, version = %(known)s::text AND NOT EXISTS (SELECT 1 FROM waiter) AS warm
    FROM cur
),
hdr AS (
    SELECT version, value, nl, warm,
           CASE WHEN warm THEN NULL
                WHEN nl > 1
                THEN convert_from(substring(value FROM 1 FOR nl - 1), 'UTF8')::jsonb
           END AS h,
           -- the header after HEADER_START, when the record starts with it
           CASE WHEN nl > %(start_len)s::int
                     AND substring(value FROM 1 FOR %(start_len)s::int) = %(start)s
                THEN substring(value FROM %(start_len)s::int + 1 FOR nl - 1 - %(start_len)s::int)
           END AS rest
    FROM known
),
lay AS (
    -- where acquired_state() finds the fence's digits (up to the first comma) and the
    -- first kept field (,"chunks":), 1-based within rest; 0: absent
    SELECT hdr.*, position(%(kept)s IN rest) AS kept, position(','::bytea IN rest) AS comma
    FROM hdr
),
fen AS (
    SELECT lay.*,
           CASE WHEN comma > 1 AND kept > comma
                     AND encode(substring(rest FROM 1 FOR comma - 1), 'escape') ~ '^[0-9]+$'
                THEN (encode(substring(rest FROM 1 FOR comma - 1), 'escape')::numeric + 1)::text
           END AS fence
    FROM lay
),
dec AS (
    SELECT fen.*,
        CASE
            WHEN warm THEN 'known'
            WHEN h IS NULL OR jsonb_typeof(h) <> 'object'
                 OR h->>'format' IS DISTINCT FROM %(format)s
                 OR NOT h ?& ARRAY['lease', 'fence', 'chunks', 'tail_count', 'recovery',
                                   'created_at', 'updated_at']
                 OR jsonb_typeof(h->'chunks') <> 'array'
                 -- the inline tail must still look like a JSON array ([...]): a cut record
                 -- goes to the generic path, which refuses it before writing anything
                 OR length(value) <= nl OR get_byte(value, nl) <> 91
                 OR get_byte(value, length(value) - 1) <> 93
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
            -- not the layout acquired_state() rewrites: the generic path re-encodes it
            WHEN fence IS NULL
                THEN 'fallback'
            -- the new state must fit like any KV value: the generic path refuses it
            WHEN %(start_len)s::int + 2 * length(fence) + %(fixed_len)s::int
                 + length(value) - %(start_len)s::int - kept + 1 > %(max_bytes)s::int
                THEN 'fallback'
            ELSE 'acquire'
        END AS decision
    FROM fen
),
upd AS (
    UPDATE {kv} AS t
    SET value = CASE WHEN d.decision = 'known' THEN %(warm)s::bytea
                     ELSE %(start)s || convert_to(d.fence, 'UTF8') || %(middle)s
                          || convert_to(d.fence, 'UTF8') || %(end)s
                          || substring(d.value FROM %(start_len)s::int + d.kept) END,
        version = %(version)s,
        expires_at = %(expires_at)s::float8
    FROM dec AS d
    WHERE t.scope = %(scope)s AND t.key = %(state)s AND t.version = d.version
      AND d.decision IN ('acquire', 'known')
    -- the warm state is the client's own bytes: not sent back
    RETURNING CASE WHEN d.decision = 'known' THEN ''::bytea ELSE t.value END AS value
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
      WHERE dec.decision = 'acquire' AND NOT (%(cached)s::jsonb ? (ref->>0))))
"""

#: The warm acquire alone: the state this store wrote last swapped for the acquired state
#: the client built from it, while still stored, live, and no client waits (the full
#: statement's ``known`` decision, without its reads of the header and chunks).
_ACQUIRE_WARM: LiteralString = """
UPDATE {kv}
SET value = %(warm)s, version = %(version)s, expires_at = %(expires_at)s::float8
WHERE scope = %(scope)s AND key = %(state)s AND version = %(known)s
  AND (expires_at IS NULL OR expires_at > %(now)s)
  AND NOT EXISTS (
      SELECT 1 FROM {kv}
      WHERE scope = %(scope)s AND key = %(waiter)s
        AND (expires_at IS NULL OR expires_at > %(now)s))
"""

#: The fenced swap of the state: every save's, alone when it spilled no chunk.
_SAVE_STATE: LiteralString = """
UPDATE {kv}
SET value = %(value)s, version = %(version)s, expires_at = %(expires_at)s::float8
WHERE scope = %(scope)s AND key = %(state)s AND version = %(expected)s
  AND (expires_at IS NULL OR expires_at > %(now)s)
"""

#: The swap as a CTE (``st``) that a save's chunk insert (``ch``) follows.
_SAVE_STATE_FIRST: LiteralString = "WITH st AS (" + _SAVE_STATE + "    RETURNING 1\n),\n"

#: A save with new chunk parts: inserted only if the fenced swap matched.
_SAVE: LiteralString = (
    _SAVE_STATE_FIRST
    + """ch AS (
    INSERT INTO {kv} (scope, key, value, version, expires_at)
    SELECT %(scope)s::text, u.k, u.v, u.ver, u.e
    FROM unnest(%(keys)s::text[], %(values)b::bytea[], %(versions)s::text[],
                %(expiries)s::float8[]) AS u(k, v, ver, e)
    WHERE EXISTS (SELECT 1 FROM st)
    RETURNING 1
)
SELECT (SELECT count(*) FROM st), (SELECT count(*) FROM ch)
"""
)

#: A save that spilled one chunk of one part (most spills): as ``_SAVE``, with the part's
#: fields as plain parameters (psycopg dumps arrays in Python, item by item).
_SAVE_ONE_PART: LiteralString = (
    _SAVE_STATE_FIRST
    + """ch AS (
    INSERT INTO {kv} (scope, key, value, version, expires_at)
    SELECT %(scope)s::text, %(part_key)s::text, %(part)s::bytea, %(part_version)s::text,
           %(part_expires_at)s::float8
    WHERE EXISTS (SELECT 1 FROM st)
    RETURNING 1
)
SELECT (SELECT count(*) FROM st), (SELECT count(*) FROM ch)
"""
)


def _acquire_params(
    request: AcquireRequest,
    warm: bytes | None,
    fresh: bytes,
    version: str,
    expires_at: float | None,
    max_bytes: int,
) -> dict[str, Any]:
    """The parameters of the acquire statement (:data:`_ACQUIRE`) for ``request``."""
    middle, end = _acquired_header_around_fence(request.owner, request.lease_end, request.now)
    return {
        "scope": request.scope,
        "state": STATE_KEY,
        "waiter": WAITER_KEY,
        "now": request.now,
        "owner": request.owner,
        "store_id": request.store_id,
        "store_id_b": request.store_id.encode(),
        "courtesy": request.courtesy_seconds,
        "horizon": request.refresh_horizon,
        "format": FORMAT,
        "lease_end": request.lease_end,
        "version": version,
        "expires_at": expires_at,
        "fresh": fresh,
        "load": request.load_history,
        # A JSON array, not a text[]: psycopg dumps a list item by item in Python.
        "cached": json.dumps(sorted(request.held_chunks)),
        "start": HEADER_START,
        "start_len": len(HEADER_START),
        "kept": KEPT_FIELDS,
        "middle": middle,
        "end": end,
        "fixed_len": len(middle) + len(end),
        "max_bytes": max_bytes,
        "known": None if warm is None or request.known is None else request.known.version,
        "warm": warm,
    }


class PostgresSessionPort:
    """:class:`~agent_stores.sessions.SessionPort` on :class:`PostgresKV`: one statement per step."""

    def __init__(self, kv: PostgresKV) -> None:
        if not isinstance(kv, PostgresKV):
            raise ConfigError(
                detail=f"PostgresSessionPort needs a PostgresKV, got {type(kv).__name__}"
            )
        self.kv = kv
        # Over psycopg's 4 KiB cache limit for converted statements: converted once here.
        self._acquire = NumberedStatement(sql.SQL(_ACQUIRE).format(kv=kv.names.kv).as_bytes(None))
        self._acquire_warm_sql = sql.SQL(_ACQUIRE_WARM).format(kv=kv.names.kv).as_bytes(None)
        # The sessions whose last acquire here was warm: the next sends the warm statement
        # alone, falling back to the full one when another client wrote since. Any other
        # session's sends the full statement at once, so a session that passes between
        # clients keeps its one statement per acquire.
        self._warm_last: LRU[str, bool] = LRU(_WARM_LAST_ENTRIES)
        self._save_sql = sql.SQL(_SAVE).format(kv=kv.names.kv).as_bytes(None)
        self._save_state_sql = sql.SQL(_SAVE_STATE).format(kv=kv.names.kv).as_bytes(None)
        self._save_one_part_sql = sql.SQL(_SAVE_ONE_PART).format(kv=kv.names.kv).as_bytes(None)

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        """One statement: decide, take the lease (or create the session), return the
        state and the parts of the chunks not held."""
        kv = self.kv
        kv.check_open()
        # The KV reads and writes the generic acquire makes: state and hint, then the state.
        kv.check_ids(request.scope, STATE_KEY)
        kv.check_ids(request.scope, WAITER_KEY)
        now, scope = request.now, request.scope
        expires_at = kv.expires_at(request.ttl_seconds, now)
        warm = known_acquired_state(request, kv.limits.max_value_bytes)
        version = new_version()
        if (
            warm is not None
            and self._warm_last.get(scope) is not None
            and await self._acquire_warm(request, warm, version, expires_at)
        ):
            return AcquireReply("acquired", version=version, state=warm)
        self._warm_last.pop(scope)
        fresh = request.fresh_state()
        if len(fresh) > kv.limits.max_value_bytes:
            return GENERIC  # the generic create refuses it (an owner id of many kilobytes)
        params = _acquire_params(
            request, warm, fresh, version, expires_at, kv.limits.max_value_bytes
        )

        async def run(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]] | None:
            try:
                cur = await self._acquire.execute(conn, params, binary=True)
            except psycopg.errors.DataError:
                return None  # a header the server cannot read: the generic path reports it
            return await cur.fetchall()

        rows = await kv.run_native_write("session acquire", run)
        return self._acquire_reply(scope, rows or [], warm, version)

    def _acquire_reply(
        self, scope: str, rows: Sequence[tuple[Any, ...]], warm: bytes | None, version: str
    ) -> AcquireReply:
        """What the acquire statement's rows (its decision in the ``state`` row, the parts
        not held in ``chunk`` rows) answer; :data:`GENERIC` for what only the generic
        acquire decides or reports."""
        state = next((r for r in rows if r[0] == "state"), None)
        if state is None:
            return GENERIC
        _, decision, _, value, lease_expires_at, holder, waiter, retry_after = state
        if decision == "busy":
            return AcquireReply(
                "busy", lease_expires_at=lease_expires_at, holder=holder, waiter_hinted=waiter
            )
        if decision == "courtesy":
            return AcquireReply("courtesy", retry_after=max(float(retry_after), 0.0))
        if decision == "known" and value is not None:
            assert warm is not None  # "known" is only decided when it was sent
            self._warm_last.set(scope, True)
            return AcquireReply("acquired", version=version, state=warm)
        if decision not in (None, "acquire"):
            return GENERIC
        if value is None:
            # Lost a race for an absent session (or the row changed under the lock): the
            # winner holds it, so wait as for any busy session (the hint goes out at once).
            return AcquireReply("busy")
        parts = {r[2]: bytes(r[3]) for r in rows if r[0] == "chunk"}
        return AcquireReply("acquired", version=version, state=bytes(value), parts=parts)

    async def _acquire_warm(
        self, request: AcquireRequest, warm: bytes, version: str, expires_at: float | None
    ) -> bool:
        """The warm acquire's statement alone (:data:`_ACQUIRE_WARM`); False when the
        stored state is not ``request.known`` any more, or a client waits."""
        assert request.known is not None
        params = {
            "warm": warm,
            "version": version,
            "expires_at": expires_at,
            "scope": request.scope,
            "state": STATE_KEY,
            "known": request.known.version,
            "now": request.now,
            "waiter": WAITER_KEY,
        }
        statement = self._acquire_warm_sql

        async def run(conn: AsyncConnection[Any]) -> int:
            return (await write_cursor(conn).execute(statement, params)).rowcount

        return await self.kv.run_native_write("session acquire", run) == 1

    async def save(self, request: SaveRequest) -> str:
        """The chunk parts and the fenced state swap in one statement (one commit); the swap
        alone when there are no parts."""
        kv = self.kv
        check_save(kv, request)
        keys: list[str] = []
        values: list[bytes] = []
        expiries: list[float | None] = []
        for chunk in request.chunks:
            for i, part in enumerate(chunk.parts):
                keys.append(f"{chunk.key}/{i}")
                values.append(bytes(part))
                expiries.append(chunk.expires_at)
        now = kv.clock()
        version = new_version()
        params: dict[str, Any] = {
            "scope": request.scope,
            "state": STATE_KEY,
            "value": request.state,
            "version": version,
            "expected": request.expected_version,
            "expires_at": kv.expires_at(request.ttl_seconds, now),
            "now": now,
        }
        statement = self._save_state_sql
        if len(keys) == 1:
            statement = self._save_one_part_sql
            params.update(
                part_key=keys[0],
                part=values[0],
                part_version=new_version(),
                part_expires_at=expiries[0],
            )
        elif keys:
            statement = self._save_sql
            params.update(
                keys=keys,
                values=values,
                versions=[new_version() for _ in keys],
                expiries=expiries,
            )

        async def run(conn: AsyncConnection[Any]) -> tuple[int, int]:
            cur = await write_cursor(conn).execute(statement, params)
            if not keys:
                return cur.rowcount, 0
            row = await cur.fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

        async def confirm() -> tuple[int, int] | None:
            # The new state version there means this very statement applied (with its chunks).
            found = await kv.version_of("session save", request.scope, STATE_KEY)
            return (1, len(keys)) if found == version else None

        swapped, inserted = await kv.run_native_write("session save", run, confirm=confirm)
        if not swapped:
            raise ConflictError("state version changed", scope=request.scope, key=STATE_KEY)
        assert inserted == len(keys)
        return version
