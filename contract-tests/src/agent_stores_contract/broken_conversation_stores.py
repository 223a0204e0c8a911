"""Deliberately broken conversation stores: the conversation contract's self-test.

:class:`YieldingStore` is Pydantic AI's ``InMemoryConversationStore`` suspending before every
primitive, as a store on a network does, while keeping each primitive atomic: it must pass the
whole conversation contract. Every other class here is it with one realistic bug, the kind a
careful author of a ``ConversationStore`` still writes. The self-test
(``contract-tests/tests/test_broken_conversation_stores.py``) runs
:class:`~agent_stores_contract.conversations.ConversationContract` on each (through
:func:`store_factory`, as ``--conversation-store`` would) and requires the reference to pass
and every broken store to fail a behaviour :data:`BROKEN` names for it.

They show a store author what each rule guards against; they are not meant to be used.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

from pydantic_ai._uuid import uuid7
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationDetails,
    ConversationEntry,
    ConversationRecord,
    InMemoryConversationStore,
)


class YieldingStore(InMemoryConversationStore):
    """The reference: each primitive suspends once (a round trip), then runs atomically."""

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        await asyncio.sleep(0)
        return await super().read_record(conversation_id)

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        await asyncio.sleep(0)
        return await super().read_records(scope=scope, limit=limit)

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        await asyncio.sleep(0)
        await super().write_record(
            record, new_entries=new_entries, expected_revision=expected_revision
        )

    async def write_details(
        self,
        conversation_id: str,
        details: ConversationDetails,
        *,
        expected_revision: str,
        expected: ConversationDetails | None = None,
    ) -> ConversationRecord:
        await asyncio.sleep(0)
        return await super().write_details(
            conversation_id, details, expected_revision=expected_revision, expected=expected
        )

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        await asyncio.sleep(0)
        await super().delete_record(conversation_id, expected_revision=expected_revision)

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        await asyncio.sleep(0)
        return await super().read_entry(entry_id)

    # -- helpers for the broken stores ----------------------------------------------------

    def _check(
        self,
        record: ConversationRecord,
        new_entries: Sequence[ConversationEntry],
        expected: str | None,
    ) -> ConversationRecord | None:
        stored = self._records.get(record.conversation_id)
        if (stored.revision if stored is not None else None) != expected:
            raise ConversationConflict(record.conversation_id)
        ids = {entry.id for entry in new_entries}
        if (
            record.head_id is not None
            and record.head_id not in self._entries
            and record.head_id not in ids
        ):
            raise ConversationConflict(record.conversation_id)
        return stored

    def _store_record(self, record: ConversationRecord, stored: ConversationRecord | None) -> None:
        if stored is not None:
            record = dataclasses.replace(record, title=stored.title, metadata=stored.metadata)
        self._records[record.conversation_id] = deepcopy(record)

    def _store_entries(self, new_entries: Sequence[ConversationEntry]) -> None:
        for entry in new_entries:
            self._entries[entry.id] = deepcopy(entry)


class RecordBeforeEntries(YieldingStore):
    """A save that is not atomic: the record (its new head) is written first, then the entries
    one request each."""

    async def write_record(self, record, *, new_entries=(), expected_revision):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        stored = self._check(record, new_entries, expected_revision)
        self._store_record(record, stored)
        for entry in new_entries:
            await asyncio.sleep(0)
            self._store_entries([entry])


class RevisionCheckedApartFromWrite(YieldingStore):
    """The revision is compared, then (another round trip later) the record written: not one step."""

    async def write_record(self, record, *, new_entries=(), expected_revision):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        stored = self._check(record, new_entries, expected_revision)
        await asyncio.sleep(0)
        self._store_entries(new_entries)
        self._store_record(record, stored)


class RevisionNotChecked(YieldingStore):
    """``write_record`` ignores ``expected_revision`` (last writer wins)."""

    async def write_record(self, record, *, new_entries=(), expected_revision):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        stored = self._records.get(record.conversation_id)
        self._store_entries(new_entries)
        self._store_record(record, stored)


class HeadNotChecked(YieldingStore):
    """``write_record`` stores a head naming an entry nobody has (released by a delete)."""

    async def write_record(self, record, *, new_entries=(), expected_revision):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        stored = self._records.get(record.conversation_id)
        if (stored.revision if stored is not None else None) != expected_revision:
            raise ConversationConflict(record.conversation_id)
        self._store_entries(new_entries)
        self._store_record(record, stored)


class ListIgnoresScope(YieldingStore):
    """``read_records`` lists every scope's conversations (a scope leak)."""

    async def read_records(self, *, scope=None, limit=None):  # type: ignore[no-untyped-def]
        return await super().read_records(scope=None, limit=limit)


class DeleteIgnoresScope(YieldingStore):
    """``delete`` made one request cheaper: it deletes whatever record has the id, whatever its scope."""

    async def delete(self, conversation_id: str, *, scope: str | None = None) -> None:
        while (record := await self.read_record(conversation_id)) is not None:
            try:
                await self.delete_record(conversation_id, expected_revision=record.revision)
            except ConversationConflict:
                continue
            return


class DeleteFreesForkedEntries(YieldingStore):
    """``delete_record`` releases every entry of the deleted history, also those a fork uses."""

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        await asyncio.sleep(0)
        stored = self._records.get(conversation_id)
        if stored is None or stored.revision != expected_revision:
            raise ConversationConflict(conversation_id)
        del self._records[conversation_id]
        for tip in [stored.head_id, *stored.branches]:
            while tip is not None and tip in self._entries:
                tip = self._entries.pop(tip).parent_id


class DeleteIgnoresBranches(YieldingStore):
    """``delete_record`` keeps only what remaining records' heads reach, not their left branches."""

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        await asyncio.sleep(0)
        stored = self._records.get(conversation_id)
        if stored is None or stored.revision != expected_revision:
            raise ConversationConflict(conversation_id)
        del self._records[conversation_id]
        reachable: set[str] = set()
        for record in self._records.values():
            entry_id = record.head_id
            while entry_id is not None and entry_id not in reachable:
                reachable.add(entry_id)
                entry_id = self._entries[entry_id].parent_id
        self._entries = {k: v for k, v in self._entries.items() if k in reachable}


class EntriesNeverReleased(YieldingStore):
    """``delete_record`` removes the record and keeps every entry."""

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        await asyncio.sleep(0)
        stored = self._records.get(conversation_id)
        if stored is None or stored.revision != expected_revision:
            raise ConversationConflict(conversation_id)
        del self._records[conversation_id]


class HistoryOutOfOrder(YieldingStore):
    """``read_history`` (overridden to read a history in one go) returns it newest first."""

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        entries: list[ConversationEntry] = []
        entry_id = head_id
        while entry_id is not None and (limit is None or len(entries) < limit):
            entry = await self.read_entry(entry_id)
            entries.append(entry)
            entry_id = entry.parent_id
        return entries


class HistoryLimitFromTheStart(YieldingStore):
    """``read_history`` with ``limit`` returns the first messages instead of the last."""

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        whole = await super().read_history(head_id)
        return whole if limit is None else whole[:limit]


class UpdateChangesRevision(YieldingStore):
    """``write_details`` gives the record a new revision (a later save of a loaded copy conflicts)."""

    async def write_details(self, conversation_id, details, *, expected_revision, expected=None):  # type: ignore[no-untyped-def]
        record = await super().write_details(
            conversation_id, details, expected_revision=expected_revision, expected=expected
        )
        self._records[conversation_id].revision = str(uuid7())
        return dataclasses.replace(record, revision=self._records[conversation_id].revision)


class SaveUndoesUpdate(YieldingStore):
    """``write_record`` writes the record as given, dropping the title and metadata an update set."""

    async def write_record(self, record, *, new_entries=(), expected_revision):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        self._check(record, new_entries, expected_revision)
        self._store_entries(new_entries)
        self._records[record.conversation_id] = deepcopy(record)


class ListOldestFirst(YieldingStore):
    """``read_records`` sorts by ``updated_at`` ascending."""

    async def read_records(self, *, scope=None, limit=None):  # type: ignore[no-untyped-def]
        records = [r for r in self._records.values() if scope is None or r.scope == scope]
        records.sort(key=lambda r: r.updated_at)
        return [deepcopy(r) for r in records[:limit]]


class ListIgnoresLimit(YieldingStore):
    """``read_records`` returns every record whatever ``limit``."""

    async def read_records(self, *, scope=None, limit=None):  # type: ignore[no-untyped-def]
        return await super().read_records(scope=scope)


class SharesStoredObjects(YieldingStore):
    """``read_record`` returns the stored record itself, so a caller's change changes the store."""

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        await asyncio.sleep(0)
        return self._records.get(conversation_id)


class DropsDeferredRequests(YieldingStore):
    """``write_record`` does not keep ``deferred_tool_requests`` (a paused run cannot be resumed)."""

    async def write_record(self, record, *, new_entries=(), expected_revision):  # type: ignore[no-untyped-def]
        await super().write_record(
            dataclasses.replace(record, deferred_tool_requests=None),
            new_entries=new_entries,
            expected_revision=expected_revision,
        )


@dataclass(frozen=True)
class Broken:
    """One broken store: its class, and the behaviours that must fail on it."""

    store: Callable[[], Any]
    caught_by: tuple[str, ...]


BROKEN: Mapping[str, Broken] = {
    "record-before-entries": Broken(
        RecordBeforeEntries, ("conversations.loads_during_saves_read_whole_histories",)
    ),
    "revision-checked-apart-from-write": Broken(
        RevisionCheckedApartFromWrite, ("conversations.concurrent_saves_of_one_revision_one_wins",)
    ),
    "revision-not-checked": Broken(
        RevisionNotChecked,
        (
            "conversations.stale_revision_conflicts",
            "conversations.recreating_an_existing_conversation_conflicts",
            "conversations.primitives_check_revisions",
        ),
    ),
    "head-not-checked": Broken(
        HeadNotChecked, ("conversations.a_head_whose_entry_was_released_conflicts",)
    ),
    "list-ignores-scope": Broken(
        ListIgnoresScope, ("conversations.another_scope_is_a_conversation_the_store_does_not_have",)
    ),
    "delete-ignores-scope": Broken(
        DeleteIgnoresScope,
        ("conversations.another_scope_is_a_conversation_the_store_does_not_have",),
    ),
    "delete-frees-forked-entries": Broken(
        DeleteFreesForkedEntries, ("conversations.delete_never_releases_an_entry_a_fork_uses",)
    ),
    "delete-ignores-branches": Broken(
        DeleteIgnoresBranches, ("conversations.delete_never_releases_an_entry_a_fork_uses",)
    ),
    "entries-never-released": Broken(
        EntriesNeverReleased, ("conversations.delete_releases_entries_no_record_reaches",)
    ),
    "history-out-of-order": Broken(
        HistoryOutOfOrder,
        ("conversations.history_loads_in_order_and_limit_takes_the_last_messages",),
    ),
    "history-limit-from-the-start": Broken(
        HistoryLimitFromTheStart,
        ("conversations.history_loads_in_order_and_limit_takes_the_last_messages",),
    ),
    "update-changes-revision": Broken(
        UpdateChangesRevision,
        ("conversations.update_never_changes_the_revision_and_a_save_never_undoes_it",),
    ),
    "save-undoes-update": Broken(
        SaveUndoesUpdate,
        ("conversations.update_never_changes_the_revision_and_a_save_never_undoes_it",),
    ),
    "list-oldest-first": Broken(
        ListOldestFirst, ("conversations.list_is_newest_first_and_limited",)
    ),
    "list-ignores-limit": Broken(
        ListIgnoresLimit, ("conversations.list_is_newest_first_and_limited",)
    ),
    "shares-stored-objects": Broken(
        SharesStoredObjects, ("conversations.stored_copies_are_independent_of_the_callers_objects",)
    ),
    "drops-deferred-requests": Broken(
        DropsDeferredRequests,
        (
            "conversations.save_then_load_round_trips_the_whole_conversation",
            "conversations.docstring_example_with_an_agent_paused_and_resumed",
        ),
    ),
}


def store_factory(name: str) -> Callable[[], Any]:
    """The factory of the store ``name`` (``reference`` or a :data:`BROKEN` name)."""
    return YieldingStore if name == "reference" else BROKEN[name].store
