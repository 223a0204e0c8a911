"""Deleting a conversation, and releasing the entries no remaining record reaches.

A delete first marks the incarnation *gone* with its record's removal (one commit, or the
mark first where the backend has no ``commit``), so no fork can pin it from then on: a
fork pins its source with a check that the mark is absent, or, without ``commit``, pins
first and then looks for the mark. The release then reads the pins that were there:

* none: every segment of the incarnation and the mark are deleted, and the pin this
  incarnation held in the conversation it was forked from is removed, which may release
  that one in turn;
* some: the entries no pinned fork point leads back to are released (a segment holding
  none is deleted, one holding some is rewritten with those only); the rest stay until
  the last fork pinning them is deleted.

A release interrupted (a crash, the server gone) leaves only unreachable entries behind;
the next release of the same incarnation, or ``doctor``, finishes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ConflictError
from ..kv.base import Create, Delete, Operation, Replace
from .layout import (
    Home,
    StoredEntry,
    decode_segment,
    encode_segment,
    joined_segments,
    part_key,
    split_parts,
)

if TYPE_CHECKING:
    from .store import KVConversationStore

log = logging.getLogger("agent_stores.conversations")

#: Deletes per commit while releasing (well inside every backend's transaction limit).
_BATCH = 25
_ATTEMPTS = 4


class Releaser:
    """The delete side of one conversation store."""

    def __init__(self, store: KVConversationStore) -> None:
        self.kv = store.kv
        self.layout = store.layout

    async def mark_gone(self, home: Home, record_version: str, parent: Home | None) -> None:
        """Remove the record at ``record_version`` and mark its incarnation gone, together.

        ``ConflictError`` (nothing changed) when the record is no longer at that version.
        """
        record_key = self.layout.record_key(home.name)
        gone_key = self.layout.gone_key(home)
        value = json.dumps({"parent": parent.to_json() if parent is not None else None}).encode()
        if self.kv.capabilities.commit:
            await self.kv.commit(
                home.owner, [Delete(record_key, record_version), Create(gone_key, value)]
            )
            return
        await self.kv.create(home.owner, gone_key, value)
        if not await self.kv.delete(home.owner, record_key, expected_version=record_version):
            await self.kv.delete(home.owner, gone_key)
            raise ConflictError("the record changed", scope=home.owner, key=record_key)

    async def release(self, home: Home) -> None:
        """Release what no pin reaches in ``home`` and, once it is empty, in its source."""
        current: Home | None = home
        while current is not None:
            current = await self._release_home(current)

    async def _release_home(self, home: Home) -> Home | None:
        """Release ``home``; the source to release next when ``home`` was emptied."""
        for _ in range(_ATTEMPTS):
            try:
                return await self._release_once(home)
            except ConflictError:
                continue  # another release or a fork's pin moved on: look again
        log.warning("conversation entries of %s/%s left for doctor", home.owner, home.name)
        return None

    async def _release_once(self, home: Home) -> Home | None:
        gone_key = self.layout.gone_key(home)
        gone = await self.kv.get(home.owner, gone_key)
        if gone is None:
            return None  # not deleted, or released already
        parent_json = json.loads(gone.value).get("parent")
        parent = Home.from_json(parent_json) if parent_json is not None else None
        pins = [
            item
            async for item in self.kv.iter_scan(home.owner, prefix=self.layout.pins_prefix(home))
        ]
        segments = [
            (item.key, item.entry.value, item.entry.version)
            async for item in self.kv.iter_scan(
                home.owner, prefix=self.layout.segments_prefix(home)
            )
            if item.entry is not None
        ]
        if pins:
            reached = {
                str(json.loads(item.entry.value)["at"]) for item in pins if item.entry is not None
            }
            await self._write(home, self._unreached(home, segments, reached))
            return None
        await self._write(
            home,
            [[Delete(key, version)] for key, _, version in segments]
            + [[Delete(gone_key, gone.version)]],
        )
        if parent is None:
            return None
        await self.kv.delete(parent.owner, self.layout.pin_key(parent, home))
        return parent

    def _unreached(
        self, home: Home, segments: Sequence[tuple[str, bytes, str]], reached: set[str]
    ) -> list[list[Delete | Replace | Create]]:
        """The writes that release every entry ``reached`` does not lead back to: a segment
        holding none is deleted (with its parts), one holding some is rewritten with those
        only; one group of writes per segment, committed together."""
        versions = {key: version for key, _, version in segments}
        decoded: dict[str, list[StoredEntry]] = {
            key: decode_segment(home.name, key, raw)
            for key, raw in joined_segments([(key, raw) for key, raw, _ in segments])
        }
        parents = {
            item.entry.id: item.entry.parent_id for items in decoded.values() for item in items
        }
        kept: set[str] = set()
        for entry_id in reached:
            walk: str | None = entry_id
            while walk is not None and walk in parents and walk not in kept:
                kept.add(walk)
                walk = parents[walk]
        writes: list[list[Delete | Replace | Create]] = []
        for key, items in decoded.items():
            parts: list[str] = []
            while part_key(key, len(parts) + 1) in versions:
                parts.append(part_key(key, len(parts) + 1))
            staying = [item for item in items if item.entry.id in kept]
            if not staying:
                writes.append([Delete(k, versions[k]) for k in [key, *parts]])
            elif len(staying) < len(items):
                writes.append(self._rewritten(key, parts, versions, encode_segment(staying)))
        return [group for group in writes if group]

    def _rewritten(
        self, key: str, parts: list[str], versions: dict[str, str], value: bytes
    ) -> list[Delete | Replace | Create]:
        """The writes that store ``value`` as segment ``key`` (in parts if it is large).

        A segment in parts is rewritten only where one commit writes all its keys at once:
        without ``commit``, a reader could meet the new header beside old parts, so it is
        kept whole there (its other entries are released with it, later).
        """
        values = split_parts(value, self.kv.limits.max_value_bytes - 1024)
        if (parts or len(values) > 1) and not self.kv.capabilities.commit:
            return []
        writes: list[Delete | Replace | Create] = [Replace(key, values[0], versions[key])]
        for index in range(1, max(len(parts), len(values) - 1) + 1):
            name = part_key(key, index)
            if index < len(values) and index <= len(parts):
                writes.append(Replace(name, values[index], versions[name]))
            elif index < len(values):
                writes.append(Create(name, values[index]))
            else:
                writes.append(Delete(name, versions[name]))
        return writes

    async def _write(
        self, home: Home, groups: Sequence[Sequence[Delete | Replace | Create]]
    ) -> None:
        if self.kv.capabilities.commit:
            batch: list[Operation] = []
            for group in groups:
                if batch and len(batch) + len(group) > _BATCH:
                    await self.kv.commit(home.owner, batch)
                    batch = []
                batch += group  # a segment's writes never split across two commits
            if batch:
                await self.kv.commit(home.owner, batch)
            return
        for op in (op for group in groups for op in group):
            if isinstance(op, Replace):
                await self.kv.replace(
                    home.owner, op.key, op.value, expected_version=op.expected_version
                )
            elif isinstance(op, Create):
                await self.kv.create(home.owner, op.key, op.value)
            else:
                await self.kv.delete(home.owner, op.key, expected_version=op.expected_version)
