"""The native session port on Redis: every turn in two round trips, warm or cold.

:class:`RedisSessionPort` implements :class:`~agent_stores.sessions.SessionPort`; the
store is the core's :class:`~agent_stores.sessions.SessionStore` with this port (same
stored layout, fencing and guarantees, the contract unchanged):

* **acquire + load: one script** (:data:`agent_stores_redis.lua.SESSION_ACQUIRE`). It
  reads ``state`` and the waiting hint, decides as the generic code does (held by
  another owner → busy; this store just released and someone waits → courtesy),
  rewrites the lease fields of the stored bytes (the mirror of
  :func:`~agent_stores.sessions.acquired_state`), drops this store's own hint, and
  returns the chunk parts the request does not list as held. The client lists the chunk
  keys it has cached for the session, so a cold turn (the session last written by
  another process) costs the same single round trip as a warm one and receives only the
  chunks it lacks. When the state is still the one the store saved last
  (``AcquireRequest.known``), the script does not send it back: the client rebuilds the
  same bytes. Unusual states (a recovery marker,
  chunks due for re-copy, an unreadable header) are left to the generic code.
* **save + release: one script**: the new chunk parts are created by the same atomic
  ``commit`` as the fenced state replace, so chunks never exist referenced-but-unwritten
  and a fenced-out save writes nothing. A save with no new chunk (most turns) is the
  fenced ``replace`` script alone.
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any

from agent_stores.backend import (
    GENERIC,
    STATE_KEY,
    WAITER_KEY,
    AcquireReply,
    AcquireRequest,
    Create,
    KVSessionPort,
    Operation,
    Replace,
    SaveRequest,
    acquired_state,
    new_version,
)

from . import lua
from .kv import RedisKV


class RedisSessionPort:
    """:class:`~agent_stores.sessions.SessionPort` on :class:`RedisKV`: one script per step."""

    def __init__(self, kv: RedisKV) -> None:
        if not isinstance(kv, RedisKV):
            raise TypeError(f"RedisSessionPort needs a RedisKV, got {type(kv).__name__}")
        self.kv = kv
        # A save without chunks is the generic port's: the KV's fenced replace alone.
        self._state_alone = KVSessionPort(kv)

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        """One script: decide, take the lease, return the state (unless known) and missing chunks."""
        kv = self.kv
        scope = request.scope
        now = request.now
        # The public API's checks, before the script: a closed client, an invalid scope (on
        # a cluster it would not even hash to one slot) or a bad TTL never reach Redis.
        kv.check_open()
        kv.check_ids(scope, STATE_KEY)
        expires_at = kv.expires_at(request.ttl_seconds, now)
        known = request.known  # the state the store saved last, when it still has it all
        version = new_version()
        owner_json = json.dumps(request.owner)
        args: list[Any] = [
            repr(float(request.now)),
            request.owner,
            owner_json,
            repr(float(request.lease_end)),
            request.store_id,
            repr(float(request.courtesy_seconds)),
            "" if request.refresh_horizon is None else repr(float(request.refresh_horizon)),
            "1" if request.load_history else "0",
            version,
            kv.expiry_text(expires_at),
            kv.gc_milliseconds(expires_at, now),
            kv.layout.entry_prefix(scope),
            known.version if known is not None else "",
            str(kv.limits.max_value_bytes),
            *sorted(request.held_chunks),
        ]
        keys = [
            kv.layout.index(scope),
            kv.layout.entry(scope, STATE_KEY),
            kv.layout.entry(scope, WAITER_KEY),
        ]
        reply = await kv.eval_script(lua.SESSION_ACQUIRE, keys, args)
        outcome = reply[0]
        if outcome == b"acquired":
            state = bytes(reply[1])
            if not state:
                assert known is not None
                rebuilt = acquired_state(
                    known.value, owner=request.owner, lease_end=request.lease_end, now=request.now
                )
                if rebuilt is None:  # pragma: no cover - the script read the same bytes
                    return GENERIC
                state = rebuilt
            parts = {bytes(reply[i]).decode(): bytes(reply[i + 1]) for i in range(2, len(reply), 2)}
            return AcquireReply("acquired", version=version, state=state, parts=parts)
        if outcome == b"busy":
            return AcquireReply(
                "busy",
                lease_expires_at=float(reply[1]),
                holder=bytes(reply[2]).decode(),
                waiter_hinted=reply[3] == b"1",
            )
        if outcome == b"courtesy":
            return AcquireReply("courtesy", retry_after=float(reply[1]))
        return GENERIC

    def save(self, request: SaveRequest) -> Coroutine[Any, Any, str]:
        """Chunk parts and the fenced state in one atomic ``commit`` script; the state
        alone (most saves: nothing spilled) in the ``replace`` script, which is the same
        write with less to pack, send and run.

        Not a coroutine function: it hands back the save's own coroutine, one level less
        between the turn and its socket (each is resumed on every reply)."""
        if not request.chunks:
            return self._state_alone.save(request)
        return self._save_with_chunks(request)

    async def _save_with_chunks(self, request: SaveRequest) -> str:
        ops: list[Operation] = [
            Create(f"{chunk.key}/{i}", part, request.chunk_ttl_seconds)
            for chunk in request.chunks
            for i, part in enumerate(chunk.parts)
        ]
        ops.append(Replace(STATE_KEY, request.state, request.expected_version, request.ttl_seconds))
        versions = await self.kv.commit(request.scope, ops)
        version = versions[-1]
        assert version is not None
        return version
