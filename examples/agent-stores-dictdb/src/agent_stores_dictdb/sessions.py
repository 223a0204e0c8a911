"""The native session port: a turn's acquire and its save, each one request to the database."""

from __future__ import annotations

from agent_stores.backend import (
    GENERIC,
    STATE_KEY,
    WAITER_KEY,
    AcquireReply,
    AcquireRequest,
    ConflictError,
    SaveRequest,
    StateHeader,
    acquired_state,
    check_save,
    decide_acquire,
    within_deadline,
)

from .kv import Database, DictKV


class DictSessionPort:
    def __init__(self, kv: DictKV) -> None:
        self.kv = kv

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        kv = self.kv
        kv.check_open()
        kv.check_ids(request.scope, STATE_KEY)
        expires_at = kv.expires_at(request.ttl_seconds, request.now)  # refuses a TTL <= 0
        limit = kv.limits.max_value_bytes
        return await within_deadline(
            kv,
            kv.execute(
                "sessions.acquire",
                lambda db: acquire(db, request, expires_at, limit),
                writes=True,
            ),
        )

    async def save(self, request: SaveRequest) -> str:
        kv = self.kv
        check_save(kv, request)
        now = kv.clock()
        expires_at = kv.expires_at(request.ttl_seconds, now)
        return await within_deadline(
            kv,
            kv.execute("sessions.save", lambda db: save(db, request, expires_at, now), writes=True),
        )


# -- what runs inside the database, under its lock ---------------------------------------------


def acquire(
    db: Database, request: AcquireRequest, expires_at: float | None, limit: int
) -> AcquireReply:
    scope, now = request.scope, request.now
    hint = db.live(scope, WAITER_KEY, now)
    stored = db.live(scope, STATE_KEY, now)
    parts: dict[str, bytes] = {}
    if stored is None:  # absent or expired: a new session
        state: bytes | None = request.fresh_state()
    else:
        decided = decide_acquire(stored.value, hint, request)
        if isinstance(decided, AcquireReply):
            return decided
        state = acquired_state(
            stored.value, owner=request.owner, lease_end=request.lease_end, now=now
        )
        if request.load_history:
            parts = parts_not_held(db, request, decided)
    if state is None or len(state) > limit:
        return GENERIC  # a layout we cannot splice, or too big: the core decides and reports
    version = db.put(scope, STATE_KEY, state, expires_at)
    if hint is not None and hint.value == request.store_id.encode():
        db.remove(scope, WAITER_KEY)  # this store waits no longer: room for the next hint
    return AcquireReply("acquired", version=version, state=state, parts=parts)


def parts_not_held(db: Database, request: AcquireRequest, header: StateHeader) -> dict[str, bytes]:
    """The bytes of every part of every chunk the process does not hold."""
    parts: dict[str, bytes] = {}
    for chunk in header.chunks:
        if chunk.key in request.held_chunks:
            continue
        for key in chunk.part_keys():
            entry = db.live(request.scope, key, request.now)
            if entry is not None:  # a missing part is left out: the core finds it missing
                parts[key] = entry.value
    return parts


def save(db: Database, request: SaveRequest, expires_at: float | None, now: float) -> str:
    scope = request.scope
    current = db.live(scope, STATE_KEY, now)
    if current is None or current.version != request.expected_version:
        raise ConflictError(
            "the session state is not at the expected version", scope=scope, key=STATE_KEY
        )
    new_parts: list[tuple[str, bytes, float | None]] = []
    for chunk in request.chunks:
        for number, part in enumerate(chunk.parts):
            key = f"{chunk.key}/{number}"
            existing = db.live(scope, key, now)
            if existing is None:
                new_parts.append((key, part, chunk.expires_at))
            elif existing.value != part:  # the same bytes: this very save, sent again
                raise ConflictError("a chunk part exists with other bytes", scope=scope, key=key)
    for key, part, part_expires_at in new_parts:
        db.put(scope, key, part, part_expires_at)
    return db.put(scope, STATE_KEY, request.state, expires_at)
