"""The native session port on Firestore: a warm turn in two requests.

A warm turn is one this process saved last. The store sends the state bytes and version
it saved last (``AcquireRequest.known``, while it still caches every chunk they name), so
the acquire needs no read:

* **acquire + load** — one ``Commit``: the state replaced by
  :func:`~agent_stores.backend.known_acquired_state` of the known bytes, on the
  precondition that its update time is still the known version's (the version is the
  fencing token, so the precondition proves the known bytes *are* the stored state), and
  a delete of the waiting hint ``w`` on the precondition that it does not exist (a no-op
  that fails the commit when a client waits). The lease decision (free, expired or ours;
  no recovery marker; no chunk due for re-copy) is made on the known bytes before
  sending. Chunks come from the process's cache.
* **save + release** — the core's generic save: the new chunk parts and the state CAS in
  one ``Commit`` already.

When the commit fails (another client wrote since, or one waits, or a hint that expired
is still stored), nothing was written and nothing is read: the port answers ``GENERIC``
and the core runs its KV algorithm (read, then a conditional write) — one request more
than the generic path alone for that turn. So that a session passed between clients does
not pay it every turn, a session whose warm commit failed goes straight to the generic
path for its next acquire in this store, then two, four, up to sixteen after further
failures in a row; a warm commit that succeeds ends the backoff. A commit that fails
again with no success since also deletes the waiting hint if it is stored but expired
(:meth:`FirestoreKV.delete_expired`: one read, and the delete): a waiter that died
leaves one, which would fail every warm commit of the session until Firestore's TTL
policy, if the deployment has one, removed it.

Built on the public port (:class:`agent_stores.sessions.SessionPort`) through
:meth:`FirestoreKV.commit_as_expected`; nothing of the core is overridden.
"""

from __future__ import annotations

from agent_stores.backend import (
    GENERIC,
    LRU,
    STATE_KEY,
    WAITER_KEY,
    AcquireReply,
    AcquireRequest,
    Check,
    KVSessionPort,
    Operation,
    Replace,
    SaveRequest,
    known_acquired_state,
)
from agent_stores.errors import ConflictError

from .kv import FirestoreKV

#: Sessions whose warm-commit backoff a port remembers (the least recently used go first).
_BACKOFF_ENTRIES = 4096
#: The longest run of acquires sent straight to the generic path after failed warm commits.
MAX_SKIPPED_ACQUIRES = 16


class FirestoreSessionPort:
    """:class:`~agent_stores.sessions.SessionPort` on a :class:`FirestoreKV` (see the
    module doc)."""

    def __init__(self, kv: FirestoreKV) -> None:
        self.kv = kv
        self._generic = KVSessionPort(kv)
        # By scope: (acquires still to send to the generic path, the length of that run).
        self._backoff: LRU[str, tuple[int, int]] = LRU(_BACKOFF_ENTRIES)

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        """One ``Commit`` on a warm session; ``GENERIC`` otherwise."""
        if request.known is None:
            return GENERIC
        scope = request.scope
        backoff = self._backoff.get(scope)
        if backoff is not None and backoff[0] > 0:
            self._backoff.set(scope, (backoff[0] - 1, backoff[1]))
            return GENERIC
        state = known_acquired_state(request, self.kv.limits.max_value_bytes)
        if state is None:
            return GENERIC
        ops: list[Operation] = [
            Check(WAITER_KEY, None),
            Replace(STATE_KEY, state, request.known.version, ttl=request.ttl_seconds),
        ]
        try:
            versions = await self.kv.commit_as_expected(scope, ops)
        except ConflictError:
            if backoff is not None:
                # Failed again since the last success: a hint left by a waiter that died
                # may be stored, expired, and fail every warm commit (deleted here; one
                # read when there is none).
                await self.kv.delete_expired(scope, WAITER_KEY)
            run = 1 if backoff is None else min(2 * backoff[1], MAX_SKIPPED_ACQUIRES)
            self._backoff.set(scope, (run, run))
            return GENERIC
        if backoff is not None:
            self._backoff.pop(scope)
        version = versions[1]
        assert version is not None
        return AcquireReply("acquired", version=version, state=state)

    async def save(self, request: SaveRequest) -> str:
        """The generic save: chunk parts and the state CAS in one ``Commit``."""
        return await self._generic.save(request)
