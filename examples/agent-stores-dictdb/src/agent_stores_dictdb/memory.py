"""The native memory port: a file record, its receipt and its directory markers in one request."""

from __future__ import annotations

from agent_stores.backend import (
    MARKER_VALUE,
    ConflictError,
    Entry,
    FileWrite,
    check_file_write,
    within_deadline,
)

from .kv import Database, DictKV


class DictMemoryPort:
    # The record, its receipt index entry and the markers commit together or not at all.
    atomic = True

    def __init__(self, kv: DictKV) -> None:
        self.kv = kv

    async def read(self, scope: str, key: str) -> Entry | None:
        kv = self.kv
        kv.check_open()
        kv.check_ids(scope, key)
        now = kv.clock()
        return await within_deadline(
            kv, kv.execute("memory.read", lambda db: db.live(scope, key, now), writes=False)
        )

    async def write(self, write: FileWrite) -> str:
        kv = self.kv
        check_file_write(kv, write)
        now = kv.clock()
        record_expires_at = kv.expires_at(write.ttl, now)
        index_expires_at = None if write.index is None else kv.expires_at(write.index.ttl, now)
        return await within_deadline(
            kv,
            kv.execute(
                "memory.write",
                lambda db: apply(db, write, now, record_expires_at, index_expires_at),
                writes=True,
            ),
        )


def apply(
    db: Database,
    write: FileWrite,
    now: float,
    record_expires_at: float | None,
    index_expires_at: float | None,
) -> str:
    """Runs inside the database, under its lock: every condition first, then every write."""
    current = db.live(write.scope, write.key, now)
    if write.expected_version is None:
        if current is not None:
            raise ConflictError("the record exists", scope=write.scope, key=write.key)
    elif current is None or current.version != write.expected_version:
        raise ConflictError(
            "the record is not at the expected version", scope=write.scope, key=write.key
        )
    index = write.index
    if index is not None and db.live(index.scope, index.key, now) is not None:
        raise ConflictError("the operation's receipt exists", scope=index.scope, key=index.key)
    for scope, key in write.markers:
        if db.live(scope, key, now) is None:
            db.put(scope, key, MARKER_VALUE, None)  # markers never expire
    version = db.put(write.scope, write.key, write.value, record_expires_at)
    if index is not None:
        db.put(index.scope, index.key, index.value, index_expires_at)
    return version
