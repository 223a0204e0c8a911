"""Deliberately broken backends: each one realistic bug planted on top of ``memory://``.

``test_mutation.py`` runs the KV part of the contract (with the model-based test) on every
one of them and requires each to fail it, and the unbroken store to pass. A bug class the
suite cannot catch shows up there as a surviving mutant.

Each class overrides the ``_`` primitives a backend writes, the way a backend author
could get them wrong; every bug names the kind of backend code that makes it.
"""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence

from agent_stores.backends.memory import MemoryKV
from agent_stores.errors import ConflictError
from agent_stores.kv import Create, Entry, Operation, Replace, ScanItem
from agent_stores.kv.base import new_version


class Correct(MemoryKV):
    """The control: memory:// unchanged. It must pass everything."""


class NonAtomicCAS(MemoryKV):
    """replace reads, compares in the client, then writes: a GET + SET instead of a conditional write."""

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        current = await self._get(scope, key)
        if current is None or current.expired(now) or current.version != expected_version:
            raise ConflictError("version mismatch", scope=scope, key=key)
        await asyncio.sleep(0)  # the round trip between the read and the write
        version = new_version()
        with self._space.lock:
            self._put(scope, key, Entry(bytes(value), version, expires_at))
        return version


class CreateOverwrites(MemoryKV):
    """create is an upsert (SET without NX): it replaces a live entry instead of conflicting."""

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        with self._space.lock:
            self._remove(scope, key)
        return await super()._create(scope, key, value, expires_at, now)


class VersionCounterRestarts(MemoryKV):
    """Versions are a per-key counter kept in the entry, so delete + create starts again at 1."""

    def _next(self, scope: str, key: str) -> str:
        s = self._space.scopes.get(scope)
        current = s.entries.get(key) if s else None
        return str(int(current.version) + 1) if current is not None else "1"

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        with self._space.lock:
            if self._live(scope, key, now) is not None:
                raise ConflictError("key exists", scope=scope, key=key)
            version = self._next(scope, key)
            self._put(scope, key, Entry(bytes(value), version, expires_at))
            return version

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        with self._space.lock:
            current = self._live(scope, key, now)
            if current is None or current.version != expected_version:
                raise ConflictError("version mismatch", scope=scope, key=key)
            version = self._next(scope, key)
            self._put(scope, key, Entry(bytes(value), version, expires_at))
            return version


class ExpiredVisibleInScan(MemoryKV):
    """scan forgets the expiry filter (it relied on native TTL, which deletes late)."""

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        return await super()._scan(scope, prefix, start_after, limit, values, float("-inf"))


class ExpiredBlocksCreate(MemoryKV):
    """create conflicts with an entry that is still stored but expired (SETNX before native TTL ran)."""

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        with self._space.lock:
            s = self._space.scopes.get(scope)
            if s is not None and key in s.entries:
                raise ConflictError("key exists", scope=scope, key=key)
        return await super()._create(scope, key, value, expires_at, now)


class ExpiredReplaceable(MemoryKV):
    """replace matches the version of an expired entry (the condition ignores expiry)."""

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        return await super()._replace(
            scope, key, value, expected_version, expires_at, float("-inf")
        )


class ScanUTF16Order(MemoryKV):
    """scan sorts by UTF-16 code units (a JavaScript or SQL Server collation), not by bytes."""

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        def order(k: str) -> bytes:
            return k.encode("utf-16-be", "surrogatepass")

        with self._space.lock:
            s = self._space.scopes.get(scope)
            if s is None:
                return []
            keys = sorted((k for k in s.keys if k.startswith(prefix)), key=order)
            if start_after is not None:
                keys = [k for k in keys if order(k) > order(start_after)]
            out = [
                ScanItem(k, s.entries[k] if values else None)
                for k in keys
                if not s.entries[k].expired(now)
            ]
            return out[:limit]


class ScanStartAfterInclusive(MemoryKV):
    """start_after is inclusive (>= instead of >): the last key of a page comes again."""

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        items = await super()._scan(scope, prefix, None, 1 << 30, values, now)
        if start_after is not None:
            items = [i for i in items if i.key >= start_after]
        return items[:limit]


class GetManyDropsUnprocessed(MemoryKV):
    """get_many sends one batch and ignores the rest (DynamoDB's UnprocessedKeys not retried)."""

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        return await super()._get_many(scope, keys[:16])


class DeleteIgnoresVersion(MemoryKV):
    """delete drops the expected_version condition and deletes whatever is there."""

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        return await super()._delete(scope, key, None, now)


class TruncatesValues(MemoryKV):
    """The declared limit is larger than the column: values past 64 KiB are cut silently."""

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        return await super()._create(scope, key, bytes(value)[: 64 << 10], expires_at, now)

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        return await super()._replace(
            scope, key, bytes(value)[: 64 << 10], expected_version, expires_at, now
        )


class DropScopeFirstPageOnly(MemoryKV):
    """drop_scope deletes one page of keys (100) and stops: entries are left behind."""

    async def _drop_scope(self, scope: str) -> int:
        with self._space.lock:
            s = self._space.scopes.get(scope)
            if s is None:
                return 0
            doomed = list(s.keys[:100])
            for key in doomed:
                self._remove(scope, key)
            return len(doomed)


class DropScopeByPrefix(MemoryKV):
    """drop_scope matches scope names by prefix (``KEYS scope*`` without a delimiter): neighbours vanish."""

    async def _drop_scope(self, scope: str) -> int:
        with self._space.lock:
            names = [n for n in self._space.scope_names if n.startswith(scope)]
            return sum(self._drop(name) for name in names)


class ScanLeaksAcrossScopes(MemoryKV):
    """Keys are stored flat as ``scope:key``: scanning scope ``a`` also returns scope ``a:b``'s keys."""

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        items = await super()._scan(scope, prefix, start_after, limit, values, now)
        with self._space.lock:
            for name in self._space.scope_names:
                if name != scope and name.startswith(scope + ":"):
                    rest = name[len(scope) + 1 :]
                    for key, entry in self._space.scopes[name].entries.items():
                        flat = f"{rest}:{key}"
                        if flat.startswith(prefix) and not entry.expired(now):
                            items.append(ScanItem(flat, entry if values else None))
        items.sort(key=lambda i: i.key.encode())
        if start_after is not None:
            items = [i for i in items if i.key.encode() > start_after.encode()]
        return items[:limit]


class ReplaceDropsTTL(MemoryKV):
    """replace writes without an expiry (SET without PX): a ttl given to replace is lost."""

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        return await super()._replace(scope, key, value, expected_version, None, now)


class ReplaceKeepsOldTTL(MemoryKV):
    """replace keeps the old entry's expiry (KEEPTTL) instead of the one it was given."""

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        current = self._live(scope, key, now)
        kept = current.expires_at if current is not None else expires_at
        return await super()._replace(scope, key, value, expected_version, kept, now)


class CommitNotAtomic(MemoryKV):
    """commit applies operations one by one and stops at the first failure: earlier ones stay written."""

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        results: list[str | None] = []
        for index, op in enumerate(ops):
            try:
                if isinstance(op, Create):
                    expires_at = self.expires_at(op.ttl, now)
                    results.append(await self._create(scope, op.key, op.value, expires_at, now))
                    continue
                if isinstance(op, Replace):
                    expires_at = self.expires_at(op.ttl, now)
                    results.append(
                        await self._replace(
                            scope, op.key, op.value, op.expected_version, expires_at, now
                        )
                    )
                    continue
                await super()._commit(scope, [op], now)
                results.append(None)
            except ConflictError as exc:
                raise ConflictError("failed", scope=scope, key=op.key, index=index) from exc
        return results


class ScopesListExpired(MemoryKV):
    """scopes lists every scope that still holds rows, also those whose entries all expired."""

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        with self._space.lock:
            names = self._space.scope_names
            lo = bisect_left(names, prefix)
            out = [
                n
                for n in names[lo:]
                if n.startswith(prefix) and (start_after is None or n > start_after)
            ]
            return out[:limit]


class DeleteReportsExpired(MemoryKV):
    """delete reports True when it removes an expired leftover (it counts rows, not live entries)."""

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        with self._space.lock:
            s = self._space.scopes.get(scope)
            current = s.entries.get(key) if s else None
            if current is None:
                return False
            if expected_version is not None and current.version != expected_version:
                return False
            self._remove(scope, key)
            return True


class ConditionOutsideWrite(MemoryKV):
    """Every condition is checked outside the write: read, a round trip, then an unconditional write.

    create, replace and delete each do GET, compare in the client, then SET / DEL (what a
    backend without conditional writes, or an emulator racing its own threads, does). Each
    call is right alone; concurrent ones both pass their check. The linearizability check
    (``contract-tests/tests/test_linearizability_checker.py``) must report it.
    """

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        if self._live(scope, key, now) is not None:
            raise ConflictError("key exists", scope=scope, key=key)
        await asyncio.sleep(0)  # the round trip between the read and the write
        version = new_version()
        with self._space.lock:
            self._put(scope, key, Entry(bytes(value), version, expires_at))
        return version

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        current = self._live(scope, key, now)
        if current is None or current.version != expected_version:
            raise ConflictError("version mismatch", scope=scope, key=key)
        await asyncio.sleep(0)
        version = new_version()
        with self._space.lock:
            self._put(scope, key, Entry(bytes(value), version, expires_at))
        return version

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        current = self._live(scope, key, now)
        if current is None or (
            expected_version is not None and current.version != expected_version
        ):
            return False
        await asyncio.sleep(0)
        with self._space.lock:
            self._remove(scope, key)
        return True


def _one_tick_early(now: float) -> float:
    """The largest float below ``now``: ``expired(_one_tick_early(now))`` is ``expires_at < now``."""
    return math.nextafter(now, -math.inf)


class CreateExpiryBoundary(MemoryKV):
    """create's condition is ``expires_at < :now`` (< written for <=): an entry expiring exactly now still blocks it."""

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        return await super()._create(scope, key, value, expires_at, _one_tick_early(now))


class ScanExpiryBoundary(MemoryKV):
    """scan keeps rows with ``expires_at >= :now`` (>= written for >): an entry expiring exactly now is listed."""

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        return await super()._scan(scope, prefix, start_after, limit, values, _one_tick_early(now))


class CommitExpiryBoundary(MemoryKV):
    """commit's conditions take an entry expiring exactly now as live: Check and Create see it, Replace matches it."""

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        return await super()._commit(scope, ops, _one_tick_early(now))


MUTANTS: dict[str, type[MemoryKV]] = {
    "non-atomic-cas": NonAtomicCAS,
    "create-overwrites-live-key": CreateOverwrites,
    "version-reused-after-delete": VersionCounterRestarts,
    "expired-visible-in-scan": ExpiredVisibleInScan,
    "expired-blocks-create": ExpiredBlocksCreate,
    "expired-replaceable": ExpiredReplaceable,
    "delete-reports-expired": DeleteReportsExpired,
    "scan-utf16-order": ScanUTF16Order,
    "scan-start-after-inclusive": ScanStartAfterInclusive,
    "get-many-omits-keys": GetManyDropsUnprocessed,
    "delete-ignores-version": DeleteIgnoresVersion,
    "silent-truncation": TruncatesValues,
    "drop-scope-leftovers": DropScopeFirstPageOnly,
    "drop-scope-by-prefix": DropScopeByPrefix,
    "scan-leaks-across-scopes": ScanLeaksAcrossScopes,
    "replace-drops-ttl": ReplaceDropsTTL,
    "replace-keeps-old-ttl": ReplaceKeepsOldTTL,
    "commit-not-atomic": CommitNotAtomic,
    "scopes-lists-expired": ScopesListExpired,
    "expiry-boundary-create": CreateExpiryBoundary,
    "expiry-boundary-scan": ScanExpiryBoundary,
    "expiry-boundary-commit": CommitExpiryBoundary,
}
