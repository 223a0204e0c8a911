"""The native journal port: a run's counter advanced and its entry created in one transaction."""

from __future__ import annotations

from agent_stores.backend import (
    AppendOutcome,
    AppendRequest,
    ConflictError,
    check_append,
    within_deadline,
)

from .kv import FileKV, Transaction


class FileJournalPort:
    atomic = True

    def __init__(self, kv: FileKV) -> None:
        self.kv = kv

    async def append(self, request: AppendRequest) -> AppendOutcome:
        kv = self.kv
        check_append(kv, request)
        now = kv.clock()
        expires_at = kv.expires_at(request.ttl, now)

        def run(tx: Transaction) -> AppendOutcome:
            return append_entry(tx, request, now, expires_at)

        return await within_deadline(kv, kv.execute("journal.append", run, writes=True))


def append_entry(
    tx: Transaction, request: AppendRequest, now: float, expires_at: float | None
) -> AppendOutcome:
    """Inside the transaction: a live entry is a duplicate; else the fenced advance."""
    scope = request.scope
    existing = tx.live(scope, request.key, now)
    if existing is not None:
        return AppendOutcome(created_version=None, head_version=None, existing=existing)
    head = tx.live(scope, request.head_key, now)
    if (None if head is None else head.version) != request.head_version:
        raise ConflictError("the counter moved on", scope=scope, key=request.head_key)
    head_version = tx.put(scope, request.head_key, request.head_value, expires_at)
    created = tx.put(scope, request.key, request.value, expires_at)
    return AppendOutcome(created_version=created, head_version=head_version, existing=None)
