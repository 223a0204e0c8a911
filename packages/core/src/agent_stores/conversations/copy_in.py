"""Moving in: every conversation of any ``ConversationStore`` copied into a KV one, whole.

For a team whose conversations live in a store of its own (written against Pydantic AI's
``ConversationStore``, like ``InMemoryConversationStore``): each record is copied with
its revision, usage, deferred tool requests, scope, title, metadata, fork origin and
branches, and each entry with its id, so a client holding a revision or an entry id goes
on working. Entries a fork shares with its source are written once, as the source's; a
fork is copied after the conversation it was forked from. A conversation the target has
already (a rerun) is left as it is and counted, so a copy cut short is finished by
running it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)

from .store import KVConversationStore


@dataclass(slots=True)
class CopyInReport:
    """What :func:`copy_conversations` copied, found already there, and could not copy."""

    copied: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    entries: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed


def _forks_last(records: Sequence[ConversationRecord]) -> list[ConversationRecord]:
    """Sources before their forks (a fork of a fork after both), oldest first otherwise."""
    by_id = {record.conversation_id: record for record in records}

    def depth(record: ConversationRecord) -> int:
        seen: set[str] = set()
        while record.forked_from in by_id and record.conversation_id not in seen:
            seen.add(record.conversation_id)
            record = by_id[record.forked_from]
        return len(seen)

    return sorted(records, key=lambda r: (depth(r), r.updated_at))


async def copy_conversations(
    source: ConversationStore, target: KVConversationStore
) -> CopyInReport:
    """Copy every conversation of ``source`` (all scopes) into ``target``."""
    report = CopyInReport()
    written: set[str] = set()
    for record in _forks_last(list(await source.read_records())):
        conversation_id = record.conversation_id
        if await target.read_record(conversation_id) is not None:
            # Copied by an earlier run: its entries are read once, so its forks share them.
            for tip in [record.head_id, *record.branches]:
                written.update(entry.id for entry in await target.read_history(tip))
            report.present.append(conversation_id)
            continue
        try:
            new_entries = await _unwritten_history(source, record, written)
            await target.write_record(record, new_entries=new_entries, expected_revision=None)
        except (ConversationConflict, LookupError, ValueError) as exc:
            report.failed.append((conversation_id, f"{type(exc).__name__}: {exc}"))
            continue
        written.update(entry.id for entry in new_entries)
        report.entries += len(new_entries)
        report.copied.append(conversation_id)
    return report


async def _unwritten_history(
    source: ConversationStore, record: ConversationRecord, written: set[str]
) -> list[ConversationEntry]:
    """The entries of the record's history and branches the target does not hold yet,
    each after the one it points at."""
    new: dict[str, ConversationEntry] = {}
    for tip in [record.head_id, *record.branches]:
        for entry in await source.read_history(tip):
            if entry.id in written or entry.id in new:
                continue
            new[entry.id] = entry
    return list(new.values())
