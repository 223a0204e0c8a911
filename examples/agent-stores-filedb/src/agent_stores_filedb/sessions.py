"""The native session port: a turn's acquire and its save, each one transaction on the folder."""

from __future__ import annotations

from agent_stores.backend import (
    GENERIC,
    STATE_KEY,
    WAITER_KEY,
    AcquireReply,
    AcquireRequest,
    ConflictError,
    Entry,
    SaveRequest,
    StateHeader,
    acquired_state,
    check_save,
    decide_acquire,
    within_deadline,
)

from .kv import FileKV, Transaction


class FileSessionPort:
    def __init__(self, kv: FileKV) -> None:
        self.kv = kv

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        kv = self.kv
        kv.check_open()
        kv.check_ids(request.scope, STATE_KEY)
        expires_at = kv.expires_at(request.ttl_seconds, request.now)  # refuses a TTL <= 0
        limit = kv.limits.max_value_bytes  # read now: the contract lowers it on a live client

        def run(tx: Transaction) -> AcquireReply:
            return take_lease(tx, request, expires_at, limit)

        return await within_deadline(kv, kv.execute("sessions.acquire", run, writes=True))

    async def save(self, request: SaveRequest) -> str:
        kv = self.kv
        check_save(kv, request)
        now = kv.clock()
        expires_at = kv.expires_at(request.ttl_seconds, now)

        def run(tx: Transaction) -> str:
            return fenced_save(tx, request, expires_at, now)

        return await within_deadline(kv, kv.execute("sessions.save", run, writes=True))


def take_lease(
    tx: Transaction, request: AcquireRequest, expires_at: float | None, limit: int
) -> AcquireReply:
    """The acquire, inside the transaction: busy, courtesy, or the lease taken."""
    scope, now = request.scope, request.now
    stored = tx.live(scope, STATE_KEY, now)
    hint = tx.live(scope, WAITER_KEY, now)
    parts: dict[str, bytes] = {}
    if stored is None:  # a new session, or one that expired whole
        state: bytes | None = request.fresh_state()
    else:
        decided = decide_acquire(stored.value, hint, request)
        if not isinstance(decided, StateHeader):
            return decided  # busy, courtesy, or GENERIC
        state = acquired_state(
            stored.value, owner=request.owner, lease_end=request.lease_end, now=now
        )
        if request.load_history:
            parts = missing_parts(tx, request, decided)
    if state is None or len(state) > limit:
        return GENERIC
    version = tx.put(scope, STATE_KEY, state, expires_at)
    if _is_own_hint(hint, request):
        tx.remove(scope, WAITER_KEY)
    return AcquireReply("acquired", version=version, state=state, parts=parts)


def _is_own_hint(hint: Entry | None, request: AcquireRequest) -> bool:
    return hint is not None and hint.value == request.store_id.encode()


def missing_parts(
    tx: Transaction, request: AcquireRequest, header: StateHeader
) -> dict[str, bytes]:
    """The live parts of the chunks the process does not hold (a missing one left out)."""
    parts: dict[str, bytes] = {}
    for chunk in header.chunks:
        if chunk.key in request.held_chunks:
            continue
        for key in chunk.part_keys():
            entry = tx.live(request.scope, key, request.now)
            if entry is not None:
                parts[key] = entry.value
    return parts


def fenced_save(tx: Transaction, request: SaveRequest, expires_at: float | None, now: float) -> str:
    """The save, inside the transaction: every condition checked, then the parts and the state."""
    scope = request.scope
    current = tx.live(scope, STATE_KEY, now)
    if current is None or current.version != request.expected_version:
        raise ConflictError("the session moved on", scope=scope, key=STATE_KEY)
    writes: list[tuple[str, bytes, float | None]] = []
    for chunk in request.chunks:
        for number, part in enumerate(chunk.parts):
            key = f"{chunk.key}/{number}"
            existing = tx.live(scope, key, now)
            if existing is None:
                writes.append((key, part, chunk.expires_at))
            elif existing.value != part:  # the same bytes: this very save, sent again
                raise ConflictError("a chunk part holds other bytes", scope=scope, key=key)
    for key, part, part_expires_at in writes:
        tx.put(scope, key, part, part_expires_at)
    return tx.put(scope, STATE_KEY, request.state, expires_at)
