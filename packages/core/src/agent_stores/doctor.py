"""``doctor``: find damaged records in sessions, memory, runs and conversations, and
quarantine them.

A scan reads every scope under the three stores' prefixes and reports each record that
cannot be used (a :class:`Finding`):

* sessions: a ``state`` record that does not decode; a state whose history chunks are
  missing, of the wrong size or do not decode as messages (the session cannot load);
* memory: a file record that does not decode; a live record whose content or metadata
  chunks are missing or undecodable; a receipt-index entry that does not decode;
* runs: a journal entry, step event, snapshot, message, tool effect, run record or
  position counter that does not decode, or whose chunks (``x/…``) are missing or fail
  their checksum; a runs-index entry whose run holds no data;
* conversations (Pydantic AI's ``ConversationStore``): a record that does not decode, or
  whose history cannot be read to its first entry; an entry segment that does not decode
  (``conversations/checkup.py``).

With ``repair=True`` every damaged record is first copied, raw bytes and origin, into
the quarantine scope (:mod:`agent_stores.damage`), then removed conditionally on the
version that was read, so a concurrent writer is never overwritten. What depends on it
goes with it, also quarantined: a session with a damaged state or chunk is reset
(its chunks kept aside, the next turn starts empty); a memory file with damaged chunks
is removed together with its chunks. Dangling index entries (derived data) are deleted.
Nothing healthy is touched, and nothing is deleted without its bytes being kept.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .checkpointer.codec import decode_record, digest
from .damage import QUARANTINE_SCOPE, quarantine
from .errors import ConflictError, CorruptRecordError
from .kv.base import Entry, KVStore
from .memory._records import (
    CHUNK_PREFIX as MEMORY_CHUNK_PREFIX,
)
from .memory._records import (
    INTERNAL_KEY_MARK,
    MARKER_SUFFIX,
    FileRecord,
    IndexEntry,
    decode_text,
)
from .memory.vectors import VECTOR_PREFIX, VectorRecord
from .sessions.records import (
    CHUNK_PREFIX as SESSION_CHUNK_PREFIX,
)
from .sessions.records import (
    STATE_KEY,
    RecordError,
    decode_messages,
    decode_state,
)

DEFAULT_SESSION_PREFIX = "session:"
DEFAULT_MEMORY_PREFIX = "memory:"
DEFAULT_RUNS_PREFIX = "cp/"
DEFAULT_CONVERSATION_PREFIX = "conversation:"

#: Called with (store, scope, index, total) before each scope is examined.
Progress = Callable[[str, str, int, int], None]


@dataclass(slots=True)
class Finding:
    """One damaged record (or group of records that only make sense together)."""

    store: str
    """``sessions``, ``memory``, ``runs`` or ``conversations``."""
    kind: str
    """``undecodable``, ``missing-chunk``, ``damaged-chunk`` or ``dangling-index``."""
    scope: str
    key: str
    detail: str
    repair: str
    """What ``--repair`` does about it."""
    related: list[str] = field(default_factory=list)
    """Other keys of the same scope that go with it on repair (chunks)."""
    repaired: bool = False
    quarantined_as: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class Report:
    """What a scan found (and, with repair, what it did)."""

    scanned: dict[str, int] = field(
        default_factory=lambda: {"sessions": 0, "memory": 0, "runs": 0, "conversations": 0}
    )
    findings: list[Finding] = field(default_factory=list)
    repaired: bool = False

    @property
    def healthy(self) -> bool:
        return not self.findings or all(f.repaired for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "scanned": dict(self.scanned),
            "repaired": self.repaired,
            "healthy": self.healthy,
            "quarantine_scope": QUARANTINE_SCOPE,
            "findings": [f.as_dict() for f in self.findings],
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False)


async def _all_scopes(kv: KVStore, prefix: str) -> list[str]:
    """The scopes under ``prefix`` in byte order, from one linear walk of the store."""
    return sorted([scope async for scope in kv.iter_scopes(prefix=prefix, page_size=500)])


async def _entries(kv: KVStore, scope: str, prefix: str = "") -> list[tuple[str, Entry]]:
    out: list[tuple[str, Entry]] = []
    async for item in kv.iter_scan(scope, prefix=prefix, page_size=200):
        assert item.entry is not None
        out.append((item.key, item.entry))
    return out


# -- sessions ---------------------------------------------------------------------------------


async def _check_session(kv: KVStore, scope: str) -> list[Finding]:
    state = await kv.get(scope, STATE_KEY)
    if state is None:
        return []
    chunk_keys = [k for k, _ in await _entries(kv, scope, SESSION_CHUNK_PREFIX)]
    reset = "quarantine the state and its chunks, reset the session (next turn starts empty)"
    try:
        header, tail = decode_state(state.value)
        decode_messages(tail, header.tail_count)
    except RecordError as exc:
        return [Finding("sessions", "undecodable", scope, STATE_KEY, str(exc), reset, chunk_keys)]
    for ref in header.chunks:
        # A fork's shared chunks are read where they live: the scope it was forked from.
        parts = await kv.get_many(ref.home or scope, ref.part_keys())
        missing = [k for k in ref.part_keys() if k not in parts]
        if missing:
            detail = f"history chunk {ref.key} is missing {len(missing)} of {ref.parts} parts"
            return [
                Finding("sessions", "missing-chunk", scope, STATE_KEY, detail, reset, chunk_keys)
            ]
        raw = b"".join(parts[k].value for k in ref.part_keys())
        try:
            if len(raw) != ref.size:
                raise RecordError(f"holds {len(raw)} bytes, the state says {ref.size}")
            decode_messages(raw, ref.count)
        except RecordError as exc:
            detail = f"history chunk {ref.key}: {exc}"
            return [
                Finding("sessions", "damaged-chunk", scope, STATE_KEY, detail, reset, chunk_keys)
            ]
    return []


# -- memory -----------------------------------------------------------------------------------


async def _check_memory(kv: KVStore, scope: str, prefix: str) -> list[Finding]:
    entries = await _entries(kv, scope)
    if scope.startswith(f"{prefix}~ops/"):
        return _check_receipt_index(scope, entries)
    by_key = dict(entries)
    found = []
    for key, entry in entries:
        if key.startswith(VECTOR_PREFIX):
            finding = _check_vector_record(scope, key, entry)
        elif key.startswith(INTERNAL_KEY_MARK) or key.endswith(MARKER_SUFFIX):
            continue
        else:
            finding = _check_memory_file(scope, key, entry, by_key)
        if finding is not None:
            found.append(finding)
    return found


def _check_vector_record(scope: str, key: str, entry: Entry) -> Finding | None:
    """A vector record that does not decode (it is derived data: a search recomputes it)."""
    try:
        VectorRecord.load(entry.value, where=repr(f"{scope}/{key}"))
    except ImportError:
        return None  # no numpy here: vectors cannot be checked, nor used
    except CorruptRecordError as exc:
        return Finding(
            "memory",
            "undecodable",
            scope,
            key,
            exc.detail,
            "quarantine the vector record (the next search or reindex computes it again)",
        )
    return None


def _check_receipt_index(scope: str, entries: list[tuple[str, Entry]]) -> list[Finding]:
    found = []
    for key, entry in entries:
        try:
            IndexEntry.load(entry.value, where=repr(f"{scope}/{key}"))
        except CorruptRecordError as exc:
            found.append(
                Finding(
                    "memory",
                    "undecodable",
                    scope,
                    key,
                    exc.detail,
                    "quarantine the index entry (the file record keeps the receipt)",
                )
            )
    return found


def _check_memory_file(
    scope: str, key: str, entry: Entry, by_key: dict[str, Entry]
) -> Finding | None:
    """What is wrong with one file record and its chunks, if anything."""
    chunks = [k for k in by_key if k.startswith(f"{MEMORY_CHUNK_PREFIX}{key}/")]
    action = "quarantine the file record and its chunks (the path becomes absent)"
    try:
        record = FileRecord.load(entry.value, where=repr(f"{scope}/{key}"))
    except CorruptRecordError as exc:
        return Finding("memory", "undecodable", scope, key, exc.detail, action, chunks)
    if not record.live:
        return None
    needed = (record.chunk_keys(key) if record.chunked else []) + record.metadata_keys(key)
    missing = [k for k in needed if k not in by_key]
    if missing:
        kind, detail = "missing-chunk", f"{len(missing)} of {len(needed)} chunks are missing"
    else:
        problem = _undecodable_chunks(record, key, by_key)
        if problem is None:
            return None
        kind, detail = "damaged-chunk", f"chunks do not decode: {problem}"
    return Finding("memory", kind, scope, key, f"memory file {key!r}: {detail}", action, chunks)


def _undecodable_chunks(record: FileRecord, key: str, by_key: dict[str, Entry]) -> str | None:
    try:
        text = "".join(decode_text(by_key[k].value) for k in record.chunk_keys(key))
        if record.chunked and len(text) != record.length:
            raise ValueError(f"chunks hold {len(text)} characters, the record says {record.length}")
        for k in record.metadata_keys(key):
            decode_text(by_key[k].value)
    except (UnicodeDecodeError, ValueError) as exc:
        return str(exc)
    return None


# -- runs -------------------------------------------------------------------------------------


async def _check_blob(kv: KVStore, scope: str, record: dict[str, Any]) -> str | None:
    blob = record.get("blob")
    if not isinstance(blob, dict):
        return None
    try:
        full, count, size = str(blob["sha256"]), int(blob["chunks"]), int(blob["size"])
    except (KeyError, TypeError, ValueError):
        return "malformed chunk reference"
    keys = [f"x/{full}/{i:06d}" for i in range(count)]
    found = await kv.get_many(scope, keys)
    missing = [k for k in keys if k not in found]
    if missing:
        return f"{len(missing)} of {count} chunks are missing"
    data = b"".join(found[k].value for k in keys)
    if len(data) != size or digest(data) != full:
        return "chunks do not match their checksum"
    try:
        decode_record(data, what="chunked record")
    except CorruptRecordError as exc:
        return exc.detail
    return None


async def _check_run(kv: KVStore, scope: str) -> list[Finding]:
    found = []
    for key, entry in await _entries(kv, scope):
        if key.startswith("x/"):
            continue  # raw chunk bytes, checked through the record that references them
        try:
            record = decode_record(entry.value, what=f"{key!r} in {scope!r}")
        except CorruptRecordError as exc:
            found.append(Finding("runs", "undecodable", scope, key, exc.detail, _run_repair(key)))
            continue
        problem = await _check_blob(kv, scope, record)
        if problem is not None:
            found.append(
                Finding(
                    "runs", "missing-chunk", scope, key, f"{key!r}: {problem}", _run_repair(key)
                )
            )
    return found


def _run_repair(key: str) -> str:
    if key.startswith("j/"):
        return (
            "quarantine the journal entry; the step then replays as not recorded, so "
            "reconcile an effect step from the quarantined bytes before resuming"
        )
    return "quarantine the record"


async def _check_runs_index(kv: KVStore, runs_prefix: str) -> list[Finding]:
    index = f"{runs_prefix}runs"
    found = []
    for key, _ in await _entries(kv, index):
        page = await kv.scan(f"{runs_prefix}run/{key}", limit=1, values=False)
        if not page:
            found.append(
                Finding(
                    "runs",
                    "dangling-index",
                    index,
                    key,
                    f"run {key!r} is listed but holds no data",
                    "delete the index entry (derived data; nothing is lost)",
                )
            )
    return found


# -- the scan -----------------------------------------------------------------------------------


async def scan(
    kv: KVStore,
    *,
    repair: bool = False,
    session_prefix: str = DEFAULT_SESSION_PREFIX,
    memory_prefix: str = DEFAULT_MEMORY_PREFIX,
    runs_prefix: str = DEFAULT_RUNS_PREFIX,
    stores: Sequence[str] = ("sessions", "memory", "runs", "conversations"),
    conversation_prefix: str = DEFAULT_CONVERSATION_PREFIX,
    progress: Progress | None = None,
) -> Report:
    """Examine every record of the selected stores; with ``repair``, quarantine the damaged ones."""
    report = Report(repaired=repair)
    plan: list[tuple[str, str]] = []
    if "sessions" in stores:
        plan += [("sessions", s) for s in await _all_scopes(kv, session_prefix)]
    if "memory" in stores:
        plan += [("memory", s) for s in await _all_scopes(kv, memory_prefix)]
    if "runs" in stores:
        plan += [("runs", s) for s in await _all_scopes(kv, f"{runs_prefix}run/")]
    if "conversations" in stores:
        plan += [("conversations", s) for s in await _all_scopes(kv, f"{conversation_prefix}o")]
    for index, (store, scope) in enumerate(plan):
        if progress is not None:
            progress(store, scope, index, len(plan))
        report.scanned[store] += 1
        if store == "sessions":
            report.findings += await _check_session(kv, scope)
        elif store == "memory":
            report.findings += await _check_memory(kv, scope, memory_prefix)
        elif store == "conversations":
            report.findings += await _check_conversations(kv, scope, conversation_prefix)
        else:
            report.findings += await _check_run(kv, scope)
    if "runs" in stores:
        report.findings += await _check_runs_index(kv, runs_prefix)
    if repair:
        for finding in report.findings:
            await _repair(kv, finding)
    return report


async def _check_conversations(kv: KVStore, scope: str, prefix: str) -> list[Finding]:
    try:
        from .conversations.checkup import REPAIR, check_owner_scope
    except ImportError:  # Pydantic AI is not installed: no conversation could be stored
        return []
    return [
        Finding("conversations", d.kind, scope, d.key, d.detail, REPAIR, d.related)
        for d in await check_owner_scope(kv, prefix, scope)
    ]


async def _repair(kv: KVStore, finding: Finding) -> None:
    """Quarantine, then remove conditionally; a record that changed meanwhile is left alone."""
    entry = await kv.get(finding.scope, finding.key)
    if entry is None:
        finding.repaired = True  # gone meanwhile
        return
    if finding.kind == "dangling-index":
        finding.repaired = await kv.delete(
            finding.scope, finding.key, expected_version=entry.version
        )
        return
    reason = f"{finding.store} {finding.kind}: {finding.detail}"
    finding.quarantined_as.append(
        await quarantine(kv, finding.scope, finding.key, entry, reason=reason)
    )
    related = await kv.get_many(finding.scope, finding.related) if finding.related else {}
    for key in finding.related:
        if key in related:
            finding.quarantined_as.append(
                await quarantine(
                    kv, finding.scope, key, related[key], reason=f"belongs to {finding.key}"
                )
            )
    try:
        removed = await kv.delete(finding.scope, finding.key, expected_version=entry.version)
    except ConflictError:
        removed = False
    if not removed:
        return  # rewritten meanwhile: the new record is someone's fresh write, keep it
    await asyncio.gather(
        *(kv.delete(finding.scope, k, expected_version=related[k].version) for k in related)
    )
    finding.repaired = True
