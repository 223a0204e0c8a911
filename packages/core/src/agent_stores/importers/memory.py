"""Import memory files from a pydantic-ai-harness memory store into a :class:`KVMemoryStore`.

The source is read through the harness ``MemoryStore`` protocol it implements
(``list_paths`` / ``read``), so the same code serves the harness ``SqliteMemoryStore``
and ``PostgresMemoryStore`` and every pydantic-ai-memory-core backend. What maps to what:

* content and write metadata: copied unchanged;
* the version: the harness numbers versions per file (``1``, ``2`` …) and memory-core
  uses UUIDs; agent-stores issues its own opaque version on import, so a caller holding
  an old version gets a conflict, as after any other write;
* the receipt of the operation that wrote the current version (``operation_id``): carried
  over when the source's receipt table tells its fingerprint (SQLite, PostgreSQL and
  memory-core do), so retrying that operation replays on agent-stores;
* older receipts (of earlier versions and of deletions) record no path in the anchors'
  formats, so they cannot be attached to a file: counted in the report, not carried.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from .report import ImportReport

#: ``operation_id -> fingerprint`` (None when unknown), read from the source's receipts.
FingerprintLookup = Callable[[str], Awaitable[str | None]]

_ALL = 10_000_000
#: The longest file imported, in characters: the largest ``max_chars`` every source reads
#: whole. pydantic-ai-harness 0.75's ``SqliteMemoryStore`` reads ``substr(content, 1,
#: 4 * (max_chars + 1))`` bytes, and SQLite returns an empty string for a length of 2**31
#: or more, so a larger bound (this was 2**31 - 1) read every file as empty. A longer file
#: is reported as failed, never imported cut short.
_MAX_CHARS = (2**31 - 1) // 4 - 1


async def import_memory(
    source: Any,
    target: Any,
    *,
    prefix: str = "",
    fingerprint_of: FingerprintLookup | None = None,
    receipts_total: int | None = None,
    label: str = "memory",
) -> ImportReport:
    """Copy every file under ``prefix`` from the harness store ``source`` into ``target``.

    ``target`` is an agent-stores memory store (``connect(url).memory()``). A file already
    identical in ``target`` (content and metadata) is left alone, a different one is
    overwritten (the source wins), so the import can be rerun after an interruption.
    """
    report = ImportReport(label)
    carried = 0
    for path in await source.list_paths(prefix, limit=_ALL):
        carried += await _import_file(source, target, path, fingerprint_of, report)
    if receipts_total is not None and receipts_total > carried:
        report.not_carried.append(
            f"{receipts_total - carried} operation receipt(s) of earlier versions or deletions "
            "(the source does not record which path they changed); retrying such an "
            "operation runs it again"
        )
    if report.imported or report.updated:
        report.not_carried.append(
            "version numbers: agent-stores gives each imported file a new version"
        )
    return report


async def _import_file(
    source: Any,
    target: Any,
    path: str,
    fingerprint_of: FingerprintLookup | None,
    report: ImportReport,
) -> int:
    """Import one file, counted in ``report``; 1 when its operation receipt was carried."""
    found = await source.read(path, max_chars=_MAX_CHARS)
    if found is None:
        return 0  # deleted while listing
    if found.truncated:
        report.failed.append(f"{path}: longer than {_MAX_CHARS:,} characters; not imported")
        return 0
    metadata = dict(found.metadata or {}) or None
    current = await target.read(path, max_chars=_MAX_CHARS)
    if (
        current is not None
        and current.content == found.content
        and (dict(current.metadata or {}) or None) == metadata
    ):
        report.identical += 1
        return int(bool(found.operation_id) and current.operation_id == found.operation_id)
    operation = await _operation_of(found, path, fingerprint_of, report)
    try:
        await target.write_with_metadata(
            path,
            found.content,
            expected_version=None if current is None else current.version,
            metadata=metadata,
            operation=operation,
        )
    except Exception as exc:  # one bad file must not stop the others
        report.failed.append(f"{path}: {type(exc).__name__}: {exc}")
        # Counted as carried as before: the receipt was resolved, the write failed.
        return int(operation is not None)
    if current is None:
        report.imported += 1
    else:
        report.updated += 1
    return int(operation is not None)


async def _operation_of(
    found: Any, path: str, fingerprint_of: FingerprintLookup | None, report: ImportReport
) -> Any:
    """The source file's operation receipt to carry over, or None (noted in ``report``)."""
    from pydantic_ai_harness.memory import MemoryOperation

    if not found.operation_id:
        return None
    fingerprint = await fingerprint_of(found.operation_id) if fingerprint_of else None
    if fingerprint is None:
        report.not_carried.append(
            f"{path}: the receipt of operation {found.operation_id!r} (its fingerprint "
            "is not readable from this source)"
        )
        return None
    return MemoryOperation(found.operation_id, fingerprint)


# -- sources ----------------------------------------------------------------------------


def sqlite_fingerprints(database: str | Path) -> tuple[FingerprintLookup, int]:
    """Fingerprint lookup and receipt count from a harness ``SqliteMemoryStore`` file
    (table ``memory_operations``: ``id, fingerprint, version, existed``)."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        rows = dict(conn.execute("SELECT id, fingerprint FROM memory_operations").fetchall())

    async def lookup(operation_id: str) -> str | None:
        value = rows.get(operation_id)
        return str(value) if value is not None else None

    return lookup, len(rows)


async def postgres_fingerprints(
    pool: Any, table: str = "agent_memory"
) -> tuple[FingerprintLookup, int]:
    """The same from a harness ``PostgresMemoryStore`` (table ``<table>_operations``,
    completed receipts only)."""
    async with pool.acquire() as conn:
        records = await conn.fetch(
            f"SELECT id, fingerprint FROM {table}_operations WHERE completed"
        )
    rows = {str(r["id"]): str(r["fingerprint"]) for r in records}

    async def lookup(operation_id: str) -> str | None:
        return rows.get(operation_id)

    return lookup, len(rows)


def memory_core_fingerprints(store: Any) -> FingerprintLookup:
    """From a pydantic-ai-memory-core store: its documented ``_get_receipt(op_id)`` primitive
    returns ``{"fingerprint", "version", "existed", "completed"}``."""

    async def lookup(operation_id: str) -> str | None:
        import anyio.to_thread

        receipt = await anyio.to_thread.run_sync(store._get_receipt, operation_id)
        if not receipt or not receipt.get("completed", True):
            return None
        fingerprint = receipt.get("fingerprint")
        return str(fingerprint) if fingerprint is not None else None

    return lookup
