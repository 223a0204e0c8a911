"""Pydantic AI's ``ConversationStore`` on the KV contract, so every backend has it.

The storage rules are Pydantic AI's (``pydantic_ai.conversation_store``); this module only
decides where records and entries live (``layout.py``) and how each primitive maps onto
KV calls, so that a turn costs what the issue's request budget allows:

* ``save`` of a turn: the record read (none when this process saved or loaded the same
  revision last) and one ``commit`` of the record with the new entries' segment; on a
  backend without ``commit``, the segment first and the record as the commit point, so a
  conflict or a crash leaves nothing visible;
* ``load``: the record (and the pointer, once per process) and one scan of the segments of
  each home the history passes through;
* ``fork``: the source's pin and the fork's record, whatever the history's length;
* ``list_conversations(scope=…)``: one scan of the owner scope's records per page.

Deleting a conversation releases the entries no remaining record reaches (``release.py``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationDetails,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.run import AgentRunResult

from ..errors import ConflictError, UnsupportedError, ValueTooLargeError
from ..kv.base import Check, Create, KVStore, Operation, Replace, random_hex
from ..lifecycle import KVBackedStore
from ..lru import LRU
from .errors import ConversationDamagedError, ConversationEntryMissingError
from .layout import (
    POINTER_KEY,
    Home,
    Layout,
    StoredEntry,
    StoredRecord,
    decode_record,
    decode_record_named,
    decode_segment,
    encode_record,
    encode_segment,
    joined_segments,
    kv_name,
    part_key,
    split_parts,
)

log = logging.getLogger("agent_stores.conversations")

DEFAULT_SCOPE_PREFIX = "conversation:"

#: The conversation id and revision a ``save`` expects: its record read may come from
#: this process's cache when that revision is the cached one (the write's compare-and-swap
#: still checks it against the database).
_saving: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "agent_stores_conversation_saving", default=None
)

#: The largest save committed in one request: past it (a long history saved at once, a
#: large file), the entries go first and the record last. Well inside every backend's
#: transaction (DynamoDB: 100 items, 4 MB; Firestore's emulator: 4 MB a request).
_COMMIT_OPS = 50
_COMMIT_BYTES = 2 << 20

#: Attempts at a write whose KV version moved while its revision did not (an ``update``).
_ATTEMPTS = 8


class _Cached(NamedTuple):
    """A record as last read or written by this process: its owner scope, bytes and KV version."""

    owner: str
    raw: bytes
    version: str


class Located(NamedTuple):
    """Where an entry is: its home, and the segment holding it at a KV version."""

    home: Home
    key: str
    version: str


class ScopeErasure(NamedTuple):
    """What :meth:`KVConversationStore.erase_scope` deleted and found left."""

    conversations: tuple[str, ...]
    records_left: int
    kept_for_forks: int
    """Entry segments kept because a conversation of another scope forked from them."""


class ConversationPurge(NamedTuple):
    """What :meth:`KVConversationStore.purge_idle` examined and deleted."""

    scanned: int
    removed: tuple[str, ...]


class KVConversationStore(KVBackedStore, ConversationStore):
    """A Pydantic AI ``ConversationStore`` on any agent-stores backend (see docs/conversations.md).

    ``scope_prefix`` isolates applications sharing one database, as in the other stores.
    ``page_size`` is how many KV items one scan call asks for.
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        owns_kv: bool = False,
        scope_prefix: str = DEFAULT_SCOPE_PREFIX,
        page_size: int = 1000,
        cache_entries: int = 65536,
    ) -> None:
        self.kv = kv
        self.owns_kv = owns_kv
        self.layout = Layout(scope_prefix)
        self.page_size = page_size
        self._records: LRU[str, _Cached] = LRU(4096)
        self._pointers: LRU[str, str] = LRU(4096)
        self._located: LRU[str, Located] = LRU(cache_entries)

    def __repr__(self) -> str:
        return f"<KVConversationStore on {self.kv.describe()} prefix={self.layout.prefix!r}>"

    async def aclose(self) -> None:
        if self.owns_kv:
            await self.kv.aclose()

    # -- the public API: Pydantic AI's, with the save's record read served from the cache ----

    async def save(
        self, conversation: Conversation | AgentRunResult[Any], *, scope: str | None = None
    ) -> list[ConversationEntry]:
        carried = (
            conversation.conversation if isinstance(conversation, AgentRunResult) else conversation
        )
        token = _saving.set((carried.conversation_id, carried.revision))
        try:
            return await super().save(conversation, scope=scope)
        finally:
            _saving.reset(token)

    # -- records ---------------------------------------------------------------------------

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        saving = _saving.get()
        cached = self._records.get(conversation_id)
        if cached is not None and saving is not None and saving[0] == conversation_id:
            stored = self._decode(conversation_id, cached)
            if stored.record.revision == saving[1]:
                return stored.record
        found = await self._locate(conversation_id)
        return None if found is None else self._decode(conversation_id, found).record

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        if scope is not None:
            owners = [self.layout.owner_scope(scope)]
        else:
            owners = [o async for o in self.kv.iter_scopes(prefix=self.layout.owner_prefix)]
        records: list[ConversationRecord] = []
        for owner in owners:
            async for item in self.kv.iter_scan(owner, prefix="r/", page_size=self.page_size):
                assert item.entry is not None
                record = self._listed(owner, item.key, item.entry.value)
                if record is not None and (scope is None or record.scope == scope):
                    records.append(record)
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return records if limit is None else records[:limit]

    def _listed(self, owner: str, key: str, raw: bytes) -> ConversationRecord | None:
        try:
            return decode_record_named(key[len("r/") :], raw).record
        except ConversationDamagedError as exc:
            # One damaged record must not hide the others; doctor reports and quarantines it.
            log.warning("conversation record %s in %s skipped: %s", key, owner, exc)
            return None

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        if expected_revision is None:
            await self._create(record, new_entries)
        else:
            await self._replace(record, new_entries, expected_revision)

    async def write_details(
        self,
        conversation_id: str,
        details: ConversationDetails,
        *,
        expected_revision: str,
        expected: ConversationDetails | None = None,
    ) -> ConversationRecord:
        unknown = (set(details) | set(expected or {})) - {"title", "metadata"}
        if unknown:
            raise NotImplementedError(f"conversation details {sorted(unknown)} are not stored")
        current = await self._locate(conversation_id)
        for _ in range(_ATTEMPTS):
            if current is None:
                raise ConversationConflict(conversation_id)
            stored = self._decode(conversation_id, current)
            record = stored.record
            if record.revision != expected_revision or any(
                getattr(record, key) != value for key, value in (expected or {}).items()
            ):
                raise ConversationConflict(conversation_id)
            changed = dataclasses.replace(record, **details)
            new = dataclasses.replace(stored, record=changed)
            raw = encode_record(new)
            try:
                version = await self.kv.replace(
                    current.owner,
                    self.layout.record_key(kv_name(conversation_id)),
                    raw,
                    expected_version=current.version,
                )
            except ConflictError:
                current = await self._locate(conversation_id)
                continue
            self._records.set(conversation_id, _Cached(current.owner, raw, version))
            return changed  # a fresh object: the cache keeps bytes
        raise ConversationConflict(conversation_id)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        from .release import Releaser

        current = await self._locate(conversation_id)
        if current is None:
            raise ConversationConflict(conversation_id)
        stored = self._decode(conversation_id, current)
        if stored.record.revision != expected_revision:
            raise ConversationConflict(conversation_id)
        releaser = Releaser(self)
        home = Home(current.owner, kv_name(conversation_id), stored.inc)
        try:
            await releaser.mark_gone(home, current.version, stored.forked_home)
        except ConflictError:
            self._records.pop(conversation_id)
            raise ConversationConflict(conversation_id) from None
        self._records.pop(conversation_id)
        await releaser.release(home)

    # -- erasure ---------------------------------------------------------------------------

    async def conversations_of(self, scope: str) -> list[str]:
        """The ids of every conversation saved with ``scope`` (one scan of its owner scope)."""
        return [record.conversation_id for record in await self.read_records(scope=scope)]

    async def erase_scope(self, scope: str) -> ScopeErasure:
        """Delete every conversation of ``scope`` and its pointer, then read the scope back.

        What a fork saved under another scope still shares stays (its entries are part of
        that conversation now) and is counted in ``kept_for_forks``; ``records_left`` is 0
        once nothing of ``scope`` is readable.
        """
        owner = self.layout.owner_scope(scope)
        erased: list[str] = []
        for conversation_id in await self.conversations_of(scope):
            await self.delete(conversation_id, scope=scope)
            pointer_scope = self.layout.pointer_scope(conversation_id)
            pointer = await self.kv.get(pointer_scope, POINTER_KEY)
            if pointer is not None and pointer.value == owner.encode():
                await self.kv.delete(pointer_scope, POINTER_KEY, expected_version=pointer.version)
            self._pointers.pop(conversation_id)
            erased.append(conversation_id)
        left = [item.key async for item in self.kv.iter_scan(owner, values=False)]
        return ScopeErasure(
            conversations=tuple(erased),
            records_left=sum(key.startswith("r/") for key in left),
            kept_for_forks=sum(key.startswith("e/") for key in left),
        )

    async def purge_idle(self, seconds: float) -> ConversationPurge:
        """Delete the conversations not saved for ``seconds`` (retention, ``conversations-idle``).

        A conversation saved meanwhile is kept: each delete is checked against the revision
        that was judged idle. Run it again after an interruption.
        """
        # Pydantic AI stamps ``updated_at`` from the wall clock, so the horizon is too.
        horizon = datetime.now(UTC) - timedelta(seconds=seconds)
        records = await self.read_records()
        removed: list[str] = []
        for record in records:
            if record.updated_at >= horizon:
                continue
            try:
                await self.delete_record(record.conversation_id, expected_revision=record.revision)
            except ConversationConflict:
                continue  # saved or deleted since it was listed
            removed.append(record.conversation_id)
        return ConversationPurge(scanned=len(records), removed=tuple(removed))

    # -- entries ---------------------------------------------------------------------------

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        home = await self._home_of(entry_id)
        found = (await self._segments(home)).get(entry_id)
        if found is None:
            raise KeyError(entry_id)
        return found.entry

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        if head_id is None or limit == 0:
            return []
        home = await self._home_of(head_id)
        indexes: dict[Home, dict[str, StoredEntry]] = {}
        history: list[ConversationEntry] = []
        entry_id: str | None = head_id
        while entry_id is not None and (limit is None or len(history) < limit):
            if home not in indexes:
                indexes[home] = await self._segments(home)
            found = indexes[home].get(entry_id)
            if found is None:
                # Released by a concurrent delete, or damaged: the ABC re-reads the record.
                raise ConversationEntryMissingError(home.name, entry_id)
            history.append(found.entry)
            entry_id = found.entry.parent_id
            if found.parent_home is not None:
                home = found.parent_home
        history.reverse()
        return history

    # -- reads -----------------------------------------------------------------------------

    async def _locate(self, conversation_id: str) -> _Cached | None:
        """The record as stored now (the pointer read once per process), or None."""
        key = self.layout.record_key(kv_name(conversation_id))
        owner = self._pointers.get(conversation_id)
        if owner is not None:
            entry = await self.kv.get(owner, key)
            if entry is not None:
                return self._remember(conversation_id, _Cached(owner, entry.value, entry.version))
        pointer = await self.kv.get(self.layout.pointer_scope(conversation_id), POINTER_KEY)
        self._records.pop(conversation_id)
        if pointer is None:
            self._pointers.pop(conversation_id)
            return None
        pointed = pointer.value.decode()
        self._pointers.set(conversation_id, pointed)
        if pointed == owner:
            return None
        entry = await self.kv.get(pointed, key)
        if entry is None:
            return None
        return self._remember(conversation_id, _Cached(pointed, entry.value, entry.version))

    def _remember(self, conversation_id: str, cached: _Cached) -> _Cached:
        stored = self._decode(conversation_id, cached)
        for entry_id, home in stored.homes():
            known = self._located.get(entry_id)
            if known is None or known.home != home:
                self._located.set(entry_id, Located(home, "", ""))
        self._records.set(conversation_id, cached)
        return cached

    def _decode(self, conversation_id: str, cached: _Cached) -> StoredRecord:
        return decode_record(conversation_id, cached.raw)

    async def _segments(self, home: Home) -> dict[str, StoredEntry]:
        """Every entry of ``home`` by id (one scan per page), remembered with its segment."""
        prefix = self.layout.segments_prefix(home)
        items: list[tuple[str, bytes]] = []
        versions: dict[str, str] = {}
        async for item in self.kv.iter_scan(home.owner, prefix=prefix, page_size=self.page_size):
            assert item.entry is not None
            items.append((item.key, item.entry.value))
            versions[item.key] = item.entry.version
        found: dict[str, StoredEntry] = {}
        for key, raw in joined_segments(items):
            for stored in decode_segment(home.name, key, raw):
                found[stored.entry.id] = stored
                self._located.set(stored.entry.id, Located(home, key, versions[key]))
        return found

    async def _home_of(self, entry_id: str) -> Home:
        located = self._located.get(entry_id)
        if located is not None:
            return located.home
        return (await self.locate_entry(entry_id)).home

    async def locate_entry(self, entry_id: str) -> Located:
        """Where an entry is, found by walking every owner scope when no record named it here.

        The slow path: a history is always reached through its record, which names where
        it lives; only an entry id from elsewhere (another process's ``save`` return) is
        looked for this way. ``KeyError`` when no segment holds it.
        """
        located = self._located.get(entry_id)
        if located is not None and located.version:
            return located
        if located is not None and entry_id in await self._segments(located.home):
            located = self._located.get(entry_id)
            assert located is not None
            return located
        needle = entry_id.encode()
        async for owner in self.kv.iter_scopes(prefix=self.layout.owner_prefix):
            async for item in self.kv.iter_scan(owner, prefix="e/", page_size=self.page_size):
                assert item.entry is not None
                if needle not in item.entry.value and not item.entry.value.startswith(b"P"):
                    continue
                _, name, inc, _ = item.key.split("/", 3)
                if entry_id in await self._segments(Home(owner, name, inc)):
                    located = self._located.get(entry_id)
                    assert located is not None
                    return located
        raise KeyError(entry_id)

    # -- writes ----------------------------------------------------------------------------

    def _segment_ops(
        self, home: Home, new_entries: Sequence[ConversationEntry], parent_home: Home | None
    ) -> tuple[str, list[Create]]:
        """The creates that store ``new_entries`` as one segment (in parts if it is large)."""
        own = {entry.id for entry in new_entries}
        stored = [
            StoredEntry(
                entry,
                parent_home if entry.parent_id is not None and entry.parent_id not in own else None,
            )
            for entry in new_entries
        ]
        key = self.layout.segments_prefix(home) + new_entries[0].id
        values = split_parts(encode_segment(stored), self.kv.limits.max_value_bytes - 1024)
        if len(values) == 1:
            return key, [Create(key, values[0])]
        return key, [Create(key, values[0])] + [
            Create(part_key(key, index), value) for index, value in enumerate(values[1:], 1)
        ]

    async def _home_for(self, entry_id: str | None, stored: StoredRecord | None) -> Home | None:
        if entry_id is None:
            return None
        if stored is not None:
            for known_id, home in stored.homes():
                if known_id == entry_id:
                    return home
        return await self._home_of(entry_id)

    async def _stored_after(
        self,
        record: ConversationRecord,
        new_entries: Sequence[ConversationEntry],
        home: Home,
        previous: StoredRecord | None,
    ) -> tuple[StoredRecord, Home | None]:
        """The record to store, and the home of the first new entry's parent if not ``home``."""
        new_ids = {entry.id for entry in new_entries}

        async def home_of(entry_id: str | None) -> Home | None:
            if entry_id is not None and entry_id in new_ids:
                return home
            return await self._home_for(entry_id, previous)

        parent_home = await home_of(new_entries[0].parent_id) if new_entries else None
        branch_homes: dict[str, Home] = {}
        for tip in record.branches:
            tip_home = await home_of(tip)
            if tip_home is not None:
                branch_homes[tip] = tip_home
        if previous is not None:
            record = dataclasses.replace(
                record, title=previous.record.title, metadata=previous.record.metadata
            )
        stored = StoredRecord(
            record=record,
            inc=home.inc,
            head_home=await home_of(record.head_id),
            branch_homes=branch_homes,
            forked_home=(
                previous.forked_home
                if previous is not None
                else await home_of(record.forked_at)
                if record.forked_at is not None
                else None
            ),
        )
        return stored, parent_home if parent_home != home else None

    async def _commit(
        self, owner: str, record_op: Create | Replace, segment_ops: Sequence[Create]
    ) -> str:
        """Write the segment and the record: in one commit where the backend can, else
        the segment first and the record last (the commit point). The record's new version."""
        ops: list[Operation] = [record_op, *segment_ops]
        small = (
            len(ops) <= _COMMIT_OPS and sum(len(op.value) for op in segment_ops) <= _COMMIT_BYTES
        )
        if self.kv.capabilities.commit and small:
            try:
                versions = await self.kv.commit(owner, ops)
            except (ValueTooLargeError, UnsupportedError):
                pass  # more than one transaction holds: entries first, as below
            else:
                version = versions[0]
                assert version is not None
                return version
        for op in segment_ops:
            await self.kv.create(owner, op.key, op.value)
        if isinstance(record_op, Create):
            return await self.kv.create(owner, record_op.key, record_op.value)
        return await self.kv.replace(
            owner, record_op.key, record_op.value, expected_version=record_op.expected_version
        )

    async def _replace(
        self,
        record: ConversationRecord,
        new_entries: Sequence[ConversationEntry],
        expected_revision: str,
    ) -> None:
        conversation_id = record.conversation_id
        current = self._records.get(conversation_id)
        fresh = False
        written = False
        for _ in range(_ATTEMPTS):
            if current is None:
                current, fresh = await self._locate(conversation_id), True
                if current is None:
                    raise ConversationConflict(conversation_id)
            previous = self._decode(conversation_id, current)
            if previous.record.revision != expected_revision:
                if fresh:
                    raise ConversationConflict(conversation_id)
                current = None
                continue
            home = Home(current.owner, kv_name(conversation_id), previous.inc)
            stored, parent_home = await self._stored_after(record, new_entries, home, previous)
            segment_ops: list[Create] = []
            if new_entries and not written:
                _, segment_ops = self._segment_ops(home, new_entries, parent_home)
            raw = encode_record(stored)
            key = self.layout.record_key(kv_name(conversation_id))
            try:
                version = await self._commit(
                    current.owner, Replace(key, raw, current.version), segment_ops
                )
            except ConflictError as exc:
                # Without ``commit`` the segment may be written already: keep it, retry the record.
                written = written or (not self.kv.capabilities.commit and exc.key == key)
                current, fresh = None, False
                continue
            self._wrote(conversation_id, home, _Cached(current.owner, raw, version), new_entries)
            return
        raise ConversationConflict(conversation_id)

    async def _create(
        self, record: ConversationRecord, new_entries: Sequence[ConversationEntry]
    ) -> None:
        conversation_id = record.conversation_id
        owner = self.layout.owner_scope(record.scope)
        await self._point(conversation_id, owner)
        home = Home(owner, kv_name(conversation_id), random_hex(8))
        stored, parent_home = await self._stored_after(record, new_entries, home, None)
        pinned = await self._pin_reach(stored, home)
        _, segment_ops = (
            self._segment_ops(home, new_entries, parent_home) if new_entries else ("", [])
        )
        raw = encode_record(stored)
        try:
            version = await self._commit(
                owner, Create(self.layout.record_key(kv_name(conversation_id)), raw), segment_ops
            )
        except ConflictError:
            if pinned is not None:
                await self._unpin(pinned)
            raise ConversationConflict(conversation_id) from None
        self._wrote(conversation_id, home, _Cached(owner, raw, version), new_entries)

    async def _point(self, conversation_id: str, owner: str) -> None:
        """Make the pointer name ``owner``; ``ConversationConflict`` if the id lives elsewhere."""
        scope = self.layout.pointer_scope(conversation_id)
        if self._pointers.get(conversation_id) == owner:
            return
        try:
            await self.kv.create(scope, POINTER_KEY, owner.encode())
        except ConflictError:
            pointer = await self.kv.get(scope, POINTER_KEY)
            if pointer is None:
                raise ConversationConflict(conversation_id) from None
            pointed = pointer.value.decode()
            if pointed != owner:
                if await self.kv.get(pointed, self.layout.record_key(kv_name(conversation_id))):
                    raise ConversationConflict(conversation_id) from None
                try:
                    await self.kv.replace(
                        scope, POINTER_KEY, owner.encode(), expected_version=pointer.version
                    )
                except ConflictError:
                    raise ConversationConflict(conversation_id) from None
        self._pointers.set(conversation_id, owner)

    async def _pin_reach(self, stored: StoredRecord, home: Home) -> tuple[Home, str] | None:
        """Pin the entries a new record's history reaches in another home (a fork's source),
        so a delete of the source keeps them; ``ConversationConflict`` if already released."""
        record = stored.record
        reach_home = stored.head_home
        if record.head_id is None or reach_home is None or reach_home == home:
            return None
        located = await self.locate_entry(record.head_id)
        pin = self.layout.pin_key(reach_home, home)
        gone = self.layout.gone_key(reach_home)
        value = json.dumps({"at": record.head_id}).encode()
        conversation_id = record.conversation_id
        if self.kv.capabilities.commit:
            ops: list[Operation] = [
                Check(gone, None),
                Check(located.key, located.version),
                Create(pin, value),
            ]
            try:
                await self.kv.commit(reach_home.owner, ops)
            except ConflictError:
                raise ConversationConflict(conversation_id) from None
            return reach_home, pin
        # Pin first, then look: a delete marks ``gone`` first, then looks for pins, so one
        # of the two always sees the other.
        await self.kv.create(reach_home.owner, pin, value)
        segment = await self.kv.get(reach_home.owner, located.key)
        if await self.kv.get(reach_home.owner, gone) is not None or segment is None:
            await self.kv.delete(reach_home.owner, pin)
            raise ConversationConflict(conversation_id)
        return reach_home, pin

    async def _unpin(self, pinned: tuple[Home, str]) -> None:
        home, pin = pinned
        await self.kv.delete(home.owner, pin)

    def _wrote(
        self,
        conversation_id: str,
        home: Home,
        cached: _Cached,
        new_entries: Sequence[ConversationEntry],
    ) -> None:
        self._records.set(conversation_id, cached)
        self._pointers.set(conversation_id, cached.owner)
        if new_entries:
            key = self.layout.segments_prefix(home) + new_entries[0].id
            for entry in new_entries:
                # The segment's version is not known here: a fork of it reads it again.
                self._located.set(entry.id, Located(home, key, ""))
