"""The native memory port: record, receipt index entry and directory markers in one transaction."""

from __future__ import annotations

from agent_stores.backend import (
    MARKER_VALUE,
    ConflictError,
    Entry,
    FileWrite,
    check_file_write,
    within_deadline,
)

from .kv import FileKV, Transaction


class FileMemoryPort:
    #: every scope a write touches is in the one folder, under its one lock
    atomic = True

    def __init__(self, kv: FileKV) -> None:
        self.kv = kv

    async def read(self, scope: str, key: str) -> Entry | None:
        kv = self.kv
        kv.check_open()
        kv.check_ids(scope, key)
        now = kv.clock()

        def run(tx: Transaction) -> Entry | None:
            return tx.live(scope, key, now)

        return await within_deadline(kv, kv.execute("memory.read", run, writes=False))

    async def write(self, write: FileWrite) -> str:
        kv = self.kv
        check_file_write(kv, write)
        now = kv.clock()
        record_expires_at = kv.expires_at(write.ttl, now)
        index_expires_at = None if write.index is None else kv.expires_at(write.index.ttl, now)

        def run(tx: Transaction) -> str:
            return write_file(tx, write, now, record_expires_at, index_expires_at)

        return await within_deadline(kv, kv.execute("memory.write", run, writes=True))


def write_file(
    tx: Transaction,
    write: FileWrite,
    now: float,
    record_expires_at: float | None,
    index_expires_at: float | None,
) -> str:
    """Inside the transaction: both conditions, then markers, record and receipt."""
    current = tx.live(write.scope, write.key, now)
    held = None if current is None else current.version
    if held != write.expected_version:
        raise ConflictError("the record moved on", scope=write.scope, key=write.key)
    index = write.index
    if index is not None and tx.live(index.scope, index.key, now) is not None:
        raise ConflictError("the receipt exists", scope=index.scope, key=index.key)
    for scope, key in write.markers:
        if tx.live(scope, key, now) is None:
            tx.put(scope, key, MARKER_VALUE, None)
    version = tx.put(write.scope, write.key, write.value, record_expires_at)
    if index is not None:
        tx.put(index.scope, index.key, index.value, index_expires_at)
    return version
