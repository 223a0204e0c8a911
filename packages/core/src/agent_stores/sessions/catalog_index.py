"""Reads and writes of the per-owner session index (layout in ``catalog.py``), on KV only."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

from ..errors import ConflictError
from ..kv.base import Check, Create, Delete, Entry, KVStore, Operation, Replace, ScanItem
from .catalog import (
    ERASING_KEY,
    POINTER_PREFIX,
    RECENT_PREFIX,
    SessionPage,
    SessionSummary,
    check_owner_text,
    decode_cursor,
    encode_cursor,
    entry_value,
    erased_key,
    key_overhead,
    pointed_key,
    pointer_key,
    pointer_value,
    recent_key,
    summary_of,
)
from .errors import InvalidSessionError, OwnerErasingError

log = logging.getLogger("agent_stores.sessions")

#: Attempts at an index write that keeps meeting concurrent changes (a zombie turn).
_WRITE_ATTEMPTS = 3


class _EntryWrite(NamedTuple):
    """One index write: the session's new ``r/`` entry in its owner's scope."""

    session_id: str
    scope: str
    key: str
    value: bytes
    ttl: float | None


class CatalogIndex:
    """The owners' indexes of one session store: one KV scope per owner.

    ``call(label, awaitable)`` runs every KV call (the storage's error translation).
    """

    def __init__(
        self,
        kv: KVStore,
        prefix: str,
        call: Callable[[str, Awaitable[Any]], Awaitable[Any]],
        spawn: Callable[[Awaitable[Any]], None],
    ) -> None:
        self.kv = kv
        self.prefix = prefix
        self._call = call
        self._spawn = spawn

    def scope_for(self, owner: str) -> str:
        """The owner's index scope; ``InvalidSessionError`` for an owner the backend cannot hold."""
        check_owner_text(owner)
        limit = self.kv.limits.max_scope_chars - len(self.prefix)
        if len(owner) > limit:
            raise InvalidSessionError(
                f"owner {owner[:40]!r}… is {len(owner)} characters; "
                f"{self.kv.backend_name} allows at most {limit}"
            )
        return self.prefix + owner

    def check_session_id(self, session_id: str) -> None:
        """A session with an owner needs index keys the backend can hold."""
        limit = self.kv.limits.max_key_chars - key_overhead()
        if len(session_id) > limit:
            raise InvalidSessionError(
                f"session id {session_id[:40]!r}… is too long to be listed by owner: "
                f"{len(session_id)} characters, {self.kv.backend_name} allows at most {limit}",
                session_id=session_id[:80],
            )

    async def write(
        self,
        session_id: str,
        catalog: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        *,
        created_at: float,
        ttl: float | None,
    ) -> dict[str, Any]:
        """Index ``catalog`` (with ``at`` set) for its owner; returns it with ``key`` and ``v``.

        One commit on the owner's scope in the usual case: the previous entry deleted, the
        new one and the pointer written. When the pointer is not at the version the previous
        write left (that write's outcome was unknown, or a turn that lost its lease wrote
        after it), the stored pointer is read and whatever it names is replaced too.
        """
        owner = catalog["owner"]
        scope = self.scope_for(owner)
        key = recent_key(catalog["at"], session_id)
        value = entry_value(session_id, catalog, created_at)
        pointer = pointer_key(session_id)
        same_owner = previous is not None and previous.get("owner") == owner
        old_key = previous.get("key") if previous is not None and same_owner else None
        pointer_version = previous.get("v") if previous is not None and same_owner else None
        if previous is not None and previous.get("owner") not in (None, owner):
            self._spawn(self.remove(session_id, previous))
        if not self.kv.capabilities.commit:
            version = await self._write_stepwise(
                _EntryWrite(session_id, scope, key, value, ttl), old_key, pointer_version
            )
            return {**catalog, "key": key, "v": version}
        # Refused while the owner is being erased, or the session was erased moments ago.
        ops: list[Operation] = [Check(ERASING_KEY, None), Check(erased_key(session_id), None)]
        if old_key and old_key != key:
            ops.append(Delete(old_key))
        ops.append(Create(key, value, ttl))
        ops.append(
            Create(pointer, pointer_value(key), ttl)
            if pointer_version is None
            else Replace(pointer, pointer_value(key), pointer_version, ttl)
        )
        for _ in range(_WRITE_ATTEMPTS):
            try:
                versions = await self._call(session_id, self.kv.commit(scope, ops))
            except ConflictError:
                ops = await self._reconciled(
                    _EntryWrite(session_id, scope, key, value, ttl), old_key
                )
                continue
            return {**catalog, "key": key, "v": versions[-1]}
        raise ConflictError(
            detail=f"session {session_id!r}: the owner's index kept changing under the write"
        )

    async def _write_stepwise(
        self, write: _EntryWrite, old_key: str | None, pointer_version: str | None
    ) -> str:
        """The write on a backend without an atomic commit, one key at a time, in an order
        that keeps every intermediate state correct for a listing: the new entry (not yet
        named by the pointer, so not listed), then the pointer (now the new entry is listed
        and the old one stale), then the old entry's deletion. Returns the pointer's version.
        """
        session_id, scope, key, value, ttl = write
        call = self._call
        # Without a commit to check the marker in, read it first. An erase that starts
        # after this read finds what this write adds on its next pass over the index.
        if await call(session_id, self.kv.get_many(scope, [ERASING_KEY, erased_key(session_id)])):
            raise self._erasing(session_id, scope)
        try:
            await call(session_id, self.kv.create(scope, key, value, ttl=ttl))
        except ConflictError:  # a retried write left it: write it over
            existing = await call(session_id, self.kv.get(scope, key))
            if existing is None:
                await call(session_id, self.kv.create(scope, key, value, ttl=ttl))
            else:
                await call(
                    session_id,
                    self.kv.replace(scope, key, value, expected_version=existing.version, ttl=ttl),
                )
        pointer, named = pointer_key(session_id), pointer_value(key)
        stale = {old_key}
        for _ in range(_WRITE_ATTEMPTS):
            try:
                version: str = await call(
                    session_id,
                    self.kv.create(scope, pointer, named, ttl=ttl)
                    if pointer_version is None
                    else self.kv.replace(
                        scope, pointer, named, expected_version=pointer_version, ttl=ttl
                    ),
                )
                break
            except ConflictError:
                stored = await call(session_id, self.kv.get(scope, pointer))
                pointer_version = None if stored is None else stored.version
                stale.add(None if stored is None else pointed_key(stored.value))
        else:
            raise ConflictError(
                detail=f"session {session_id!r}: the owner's index kept changing under the write"
            )
        for old in stale - {None, key}:
            assert old is not None
            await call(session_id, self.kv.delete(scope, old))
        return version

    async def _reconciled(self, write: _EntryWrite, old_key: str | None) -> list[Operation]:
        """The commit that writes ``key`` over whatever the stored pointer names now."""
        session_id, scope, key, value, ttl = write
        pointer = pointer_key(session_id)
        fences = [ERASING_KEY, erased_key(session_id)]
        current = await self._call(session_id, self.kv.get_many(scope, [pointer, key, *fences]))
        if any(k in current for k in fences):
            raise self._erasing(session_id, scope)
        stored_pointer = current.get(pointer)
        named = pointed_key(stored_pointer.value) if stored_pointer is not None else None
        ops: list[Operation] = [Check(k, None) for k in fences]
        ops += [Delete(k) for k in dict.fromkeys((old_key, named)) if k and k != key]
        existing = current.get(key)
        ops.append(
            Create(key, value, ttl)
            if existing is None
            else Replace(key, value, existing.version, ttl)
        )
        ops.append(
            Create(pointer, pointer_value(key), ttl)
            if stored_pointer is None
            else Replace(pointer, pointer_value(key), stored_pointer.version, ttl)
        )
        return ops

    def _erasing(self, session_id: str, scope: str) -> OwnerErasingError:
        owner = scope[len(self.prefix) :]
        return OwnerErasingError(
            f"session {session_id!r}: the sessions of owner {owner!r} are being (or were "
            "moments ago) erased; the turn was not saved",
            session_id=session_id,
        )

    async def remove(self, session_id: str, catalog: Mapping[str, Any]) -> None:
        """Take the session out of its owner's index (its entry and pointer)."""
        owner = catalog.get("owner")
        if not owner:
            return
        scope = self.scope_for(owner)
        pointer = pointer_key(session_id)
        stored = await self._call(session_id, self.kv.get(scope, pointer))
        named = pointed_key(stored.value) if stored is not None else None
        entries = [k for k in dict.fromkeys((catalog.get("key"), named)) if k]
        if not self.kv.capabilities.commit:
            # The pointer first: from then on its entries are stale, never listed.
            if stored is not None:
                await self._call(
                    session_id, self.kv.delete(scope, pointer, expected_version=stored.version)
                )
            for key in entries:
                await self._call(session_id, self.kv.delete(scope, key))
            return
        ops: list[Operation] = [Delete(k) for k in entries]
        if stored is not None:
            ops.append(Delete(pointer, stored.version))
        if ops:
            try:
                await self._call(session_id, self.kv.commit(scope, ops))
            except ConflictError:
                log.info("session %r: re-indexed while being removed; left as is", session_id)

    async def page(
        self,
        owner: str,
        *,
        limit: int,
        cursor: str | None,
        tags: Sequence[str] | None,
    ) -> SessionPage:
        """Up to ``limit`` of the owner's sessions, most recent first, after ``cursor``.

        Two requests when no entry is stale and no tag filter skips entries: one range
        read of ``r/`` (``limit + 1`` entries, to know whether more follow) and one batched
        read of their pointers.
        """
        if limit < 1:
            raise ValueError("limit must be >= 1")
        scope = self.scope_for(owner)
        start_after = decode_cursor(cursor) if cursor is not None else None
        wanted = set(tags or ())
        out: list[SessionSummary] = []
        # Walk the index in reads of what is still wanted (plus one, to know whether more
        # follow) until the page is full or the index ends; each entry is judged by
        # :meth:`_listed` (stale or filtered out entries make another read necessary).
        while True:
            want = limit - len(out)
            page = await self._call(
                owner,
                self.kv.scan(scope, prefix=RECENT_PREFIX, start_after=start_after, limit=want + 1),
            )
            if not page:
                return SessionPage(out, None)
            if want == 0:  # the page filled up exactly at the end of the previous read
                return SessionPage(out, encode_cursor(start_after or ""))
            pointers = await self._call(
                owner,
                self.kv.get_many(
                    scope, [pointer_key(i) for i in dict.fromkeys(map(_session_of, page))]
                ),
            )
            for item in page:
                if len(out) == limit:
                    # An entry follows the last one returned: there may be more.
                    return SessionPage(out, encode_cursor(start_after or ""))
                start_after = item.key
                summary = self._listed(owner, scope, item, pointers, wanted)
                if summary is not None:
                    out.append(summary)
            if len(page) <= want:
                return SessionPage(out, None)

    def _listed(
        self,
        owner: str,
        scope: str,
        item: ScanItem,
        pointers: Mapping[str, Entry],
        wanted: set[str],
    ) -> SessionSummary | None:
        """The summary an index entry lists, or None when it is not listed: stale (its
        session's pointer names another entry, or none; deleted in the background), not
        decodable (logged) or without every tag in ``wanted``."""
        assert item.entry is not None
        stored = pointers.get(pointer_key(_session_of(item)))
        if stored is None or pointed_key(stored.value) != item.key:
            self._spawn(self.kv.delete(scope, item.key, expected_version=item.entry.version))
            return None
        summary = summary_of(owner, item.entry.value)
        if summary is None:
            log.warning("owner index %r: entry %r does not decode; skipped", scope, item.key)
            return None
        if wanted and not wanted.issubset(summary.tags):
            return None
        return summary

    async def named(self, owner: str) -> dict[str, list[str]]:
        """Every session the owner's index names (by a pointer or an entry) -> its keys there."""
        scope = self.scope_for(owner)
        found: dict[str, list[str]] = {}
        async for item in self.kv.iter_scan(scope, page_size=500, values=False):
            if item.key.startswith(POINTER_PREFIX):
                session_id = item.key[len(POINTER_PREFIX) :]
            elif item.key.startswith(RECENT_PREFIX) and item.key.count("/") >= 2:
                session_id = item.key.split("/", 2)[2]
            else:
                continue
            found.setdefault(session_id, []).append(item.key)
        return found


def _session_of(item: ScanItem) -> str:
    """The session id an index entry (``r/<at>/<session id>``) is for."""
    return item.key.split("/", 2)[2]
