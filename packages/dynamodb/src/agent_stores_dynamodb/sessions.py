"""The native session port on DynamoDB: a warm turn in two requests.

A warm turn is one this process saved last. The store sends the state bytes and
version it saved last (``AcquireRequest.known``, while it still caches every chunk they
name), so the acquire needs no read:

* **acquire + load** — one TransactWriteItems: a ConditionCheck that no waiting hint
  ``w`` is live, and a Put of :func:`~agent_stores.backend.acquired_state_if_takeable` of the
  known bytes conditioned on ``version`` still being the known one. The version is the
  fencing token, so the condition proves the known bytes *are* the stored state; the
  lease decision (free, expired or ours; no recovery marker; no chunk due for re-copy)
  is made on those bytes before sending. Chunks come from the process's cache.
* **save + release** — one TransactWriteItems with the new chunk parts (create if absent)
  and the state CAS; one conditional PutItem when no chunk is new.

When another process wrote the session since, the transaction fails and returns the
state as it stands (``ReturnValuesOnConditionCheckFailure=ALL_OLD``, surfaced as
:class:`~agent_stores_dynamodb.StaleConditionError`): the decision is made again on those
bytes and a second transaction, fenced by their version, takes the lease — a cold turn
in three requests, no read. Anything else — no known state (a process's first turn on
the session, or its chunks evicted from the cache), a client waiting, a lease held by someone else, a recovery marker, a
second failed condition — answers ``GENERIC`` and the core runs its KV algorithm
(BatchGetItem, then a conditional PutItem): same guarantees, one request more. Built on the public port
(:class:`agent_stores.sessions.SessionPort`), through :meth:`DynamoDBKV.commit`; nothing
of the core is overridden. Each of :meth:`~DynamoDBSessionPort.acquire` and
:meth:`~DynamoDBSessionPort.save` runs within the store's deadline as a whole
(:func:`agent_stores.backend.within_deadline`), retries and fall-backs included.
"""

from __future__ import annotations

from agent_stores.backend import (
    GENERIC,
    STATE_KEY,
    WAITER_KEY,
    AcquireReply,
    AcquireRequest,
    Check,
    Create,
    KVSessionPort,
    Operation,
    Replace,
    SaveRequest,
    StateHeader,
    acquired_state_if_takeable,
    within_deadline,
)
from agent_stores.errors import ConflictError, ValueTooLargeError

from .kv import TRANSACTION_MAX_ITEMS, DynamoDBKV, StaleConditionError

#: Default ``handover_courtesy_seconds`` of session stores on DynamoDB: how long a store
#: that just released a session lets a waiting client take it (core default: 0.1 s, sized
#: for sub-millisecond backends; a waiter here needs a few requests of milliseconds each).
HANDOVER_COURTESY_SECONDS = 0.5


class DynamoDBSessionPort:
    """:class:`~agent_stores.sessions.SessionPort` on a :class:`DynamoDBKV` (see the module doc)."""

    def __init__(self, kv: DynamoDBKV) -> None:
        self.kv = kv
        self._generic = KVSessionPort(kv)

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        """One TransactWriteItems on a warm session; ``GENERIC`` otherwise."""
        return await within_deadline(self.kv, self._acquire(request))

    async def _acquire(self, request: AcquireRequest) -> AcquireReply:
        known = request.known
        if known is None:
            return GENERIC
        try:
            return await self._take(request, known.version, known.value, request.known_header)
        except StaleConditionError as stale:
            # Another process wrote the session: the failed transaction returned the state
            # as it stands, so decide again on it, fenced by its version (no read).
            if stale.key != STATE_KEY or stale.stored is None:
                return GENERIC
            try:
                return await self._take(request, stale.stored.version, stale.stored.value)
            except ConflictError:
                return GENERIC
        except ConflictError:
            return GENERIC  # a client is waiting

    async def _take(
        self,
        request: AcquireRequest,
        version: str,
        stored: bytes,
        header: StateHeader | None = None,
    ) -> AcquireReply:
        """Take the lease on the state ``stored`` at ``version`` (``header``: decoded
        already, or None), in one transaction; a ConflictError when the version moved or a
        client waits."""
        new_state = acquired_state_if_takeable(
            stored, request, self.kv.limits.max_value_bytes, header=header
        )
        if new_state is None:
            return GENERIC  # the core decides: who holds it, recovery, re-copy, damage
        versions = await self.kv.commit(
            request.scope,
            [
                Check(WAITER_KEY, None),
                Replace(STATE_KEY, new_state, version, ttl=request.ttl_seconds),
            ],
        )
        new_version = versions[1]
        assert new_version is not None
        return AcquireReply("acquired", version=new_version, state=new_state)

    async def save(self, request: SaveRequest) -> str:
        """Chunks and the fenced state in one TransactWriteItems (one PutItem without chunks)."""
        return await within_deadline(self.kv, self._save(request))

    async def _save(self, request: SaveRequest) -> str:
        ops: list[Operation] = [
            Create(f"{chunk.key}/{i}", bytes(part), ttl=request.chunk_ttl_seconds)
            for chunk in request.chunks
            for i, part in enumerate(chunk.parts)
        ]
        if not ops:
            version = await self.kv.replace(
                request.scope,
                STATE_KEY,
                request.state,
                expected_version=request.expected_version,
                ttl=request.ttl_seconds,
            )
        elif len(ops) + 1 > TRANSACTION_MAX_ITEMS:
            version = await self._generic.save(request)
        else:
            ops.append(
                Replace(STATE_KEY, request.state, request.expected_version, ttl=request.ttl_seconds)
            )
            try:
                versions = await self.kv.commit(request.scope, ops)
            except ValueTooLargeError:
                # Over the 4 MB of one transaction: chunks first, then the CAS.
                version = await self._generic.save(request)
            else:
                last = versions[-1]
                assert last is not None
                version = last
        return version
