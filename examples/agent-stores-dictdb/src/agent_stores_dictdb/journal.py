"""The native journal port: a log's counter advanced and its entry created in one request."""

from __future__ import annotations

from agent_stores.backend import (
    AppendOutcome,
    AppendRequest,
    ConflictError,
    check_append,
    within_deadline,
)

from .kv import Database, DictKV


class DictJournalPort:
    # The counter and the entry commit together, so the core hands every append to us.
    atomic = True

    def __init__(self, kv: DictKV) -> None:
        self.kv = kv

    async def append(self, request: AppendRequest) -> AppendOutcome:
        kv = self.kv
        check_append(kv, request)
        now = kv.clock()
        expires_at = kv.expires_at(request.ttl, now)
        return await within_deadline(
            kv,
            kv.execute(
                "journal.append", lambda db: append(db, request, now, expires_at), writes=True
            ),
        )


def append(
    db: Database, request: AppendRequest, now: float, expires_at: float | None
) -> AppendOutcome:
    """Runs inside the database, under its lock."""
    scope = request.scope
    existing = db.live(scope, request.key, now)
    if existing is not None:  # a retried step: nothing written, no position taken
        return AppendOutcome(created_version=None, head_version=None, existing=existing)
    head = db.live(scope, request.head_key, now)
    if (None if head is None else head.version) != request.head_version:
        raise ConflictError("the log's counter moved on", scope=scope, key=request.head_key)
    head_version = db.put(scope, request.head_key, request.head_value, expires_at)
    created = db.put(scope, request.key, request.value, expires_at)
    return AppendOutcome(created_version=created, head_version=head_version, existing=None)
