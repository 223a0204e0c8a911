"""The storage layout shared by the journal and the step store, on the KV CAS base class.

Scopes (``P`` is the scope prefix, ``cp/`` by default):

* ``Prun/<run_id>`` — everything about one run, so erasing a run is one ``drop_scope``:
  ``head/<log>`` position counters, ``j/<step_id>/<phase>`` journal entries,
  ``ev/…`` step events, ``sn/…`` snapshots and ``sp`` their pointer, ``m/<sha256>``
  snapshot messages (each stored once per run), ``t/<tool_call_id>`` tool effects,
  ``run`` the harness run record, ``x/<sha256>/<n>`` chunks of large records,
  ``fork`` the lineage of a fork, ``subject/<sha256>`` the subjects it is bound to.
* ``Pruns`` — one entry per run (key = run id), written at a run's first write; it
  anchors the run's TTL and makes runs listable without scanning scopes.
* ``Pconv/<conversation_id>`` and ``Pparent/<parent_run_id>`` — lineage indexes,
  written before the run record; readers verify against the run record, so a dangling
  entry (a crash in between, a deleted run) is skipped, never trusted.
* ``Pforks/<source_run_id>`` — the forks of a run (key = the fork's id); readers verify
  against the fork's own ``fork`` record.

Logs (the journal, step events, snapshots) share one algorithm: an entry is *created*
under its idempotency key, so a duplicate is a conflict that is read back and compared,
and its position comes from a per-log counter advanced by one CAS. An append therefore
costs the same number of operations whatever the run's length.
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from ..errors import ConflictError, CorruptRecordError
from ..kv.base import Entry, KVStore
from ..lru import LRU
from ..options import UNSET, renamed_option
from ..subjects import DEFAULT_SUBJECT_PREFIX, SubjectIndex
from .codec import canonical, decode_record, digest
from .port import AppendRequest, JournalPort, KVJournalPort

V = TypeVar("V")

#: Records above this share of the backend's item limit are chunked.
_INLINE_MARGIN = 512
#: Keys per get_many call when fetching chunks or messages.
_BATCH = 100
#: Concurrent writes when storing chunks or messages.
_WRITE_CONCURRENCY = 16
#: Give up a CAS loop after this many lost races (something is badly wrong by then).
MAX_ATTEMPTS = 500
#: Seconds after which a run's index entry is checked again when one of its logs starts.
_ANCHOR_RECHECK = 5.0
#: A run's anchored expiry when the store keeps runs for ever (no TTL).
_NEVER = float("inf")


class _Unanchored:
    """:meth:`RunSpace._anchored_ttl`'s answer when the anchor must be read or written."""


_NOT_ANCHORED = _Unanchored()
#: Per-run cache entries kept per store instance.
_CACHE_RUNS = 1024


def _head_value(position: int) -> bytes:
    """``canonical({"next": position})``, without the encoder (written on every append)."""
    return b'{"next":%d}' % position


@dataclass(frozen=True, slots=True)
class Created:
    """Outcome of :meth:`RunSpace.create_entry`."""

    created: bool
    record: dict[str, Any]
    """On success the record written; on a duplicate the record already stored (stub form)."""
    version: str


def _short(identifier: str) -> str:
    if len(identifier) > 200 or "\x00" in identifier:
        return "h/" + digest(identifier.encode("utf-8", "surrogatepass"))
    return identifier


async def backoff(attempt: int) -> None:
    """Sleep a jittered, growing delay after a lost CAS race."""
    await asyncio.sleep(random.random() * min(0.05, 0.0005 * (2 ** min(attempt, 10))))


async def bounded_gather(calls: Iterable[Callable[[], Awaitable[V]]], limit: int) -> list[V]:
    """Run the calls concurrently, at most ``limit`` at a time, results in order."""
    semaphore = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[V]]) -> V:
        async with semaphore:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


DEFAULT_SCOPE_PREFIX = "cp/"
#: Default retention of a run: 30 days after its first write, then it expires whole.
#: Runs are working state, not an archive; kept forever they grow a billed table without
#: anyone deciding so. ``ttl_seconds=None`` keeps runs until deleted.
DEFAULT_RUN_TTL_SECONDS: float = 30 * 86_400


def scope_prefix_option(owner: str, scope_prefix: str, namespace: Any) -> str:
    """``scope_prefix``, or the deprecated ``namespace`` it replaces (``"cp"`` is ``"cp/"``)."""
    if namespace is UNSET:
        return scope_prefix
    namespace = renamed_option(owner, "namespace", namespace, "scope_prefix", scope_prefix)
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        raise ValueError(f"namespace must be non-empty and contain no '/', got {namespace!r}")
    return f"{namespace}/"


class RunSpace:
    """Layout, TTL anchoring, position counters and chunked records for runs on one KV."""

    def __init__(
        self,
        kv: KVStore,
        *,
        scope_prefix: str = DEFAULT_SCOPE_PREFIX,
        ttl: float | None = None,
        port: JournalPort | None = None,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
    ) -> None:
        if not isinstance(scope_prefix, str) or not scope_prefix:
            raise ValueError(f"scope_prefix must be a non-empty string, got {scope_prefix!r}")
        if ttl is not None and ttl <= 0:
            raise ValueError("ttl_seconds must be positive (or None for no expiry)")
        self.kv = kv
        self.scope_prefix = scope_prefix
        self.ttl = ttl
        #: the backend's native journal port, or the generic one
        self.port: JournalPort = port or kv.ports.journal or KVJournalPort()
        #: where runs are recorded under their subject (see :mod:`agent_stores.subjects`)
        self.subjects = SubjectIndex(kv, prefix=subject_prefix)
        # run_id -> (absolute expiry or inf, monotonic time it was checked): presence means
        # "indexed, as far as this process knows".
        self._anchors: LRU[str, tuple[float, float]] = LRU(_CACHE_RUNS)
        # (run_id, log) -> (next position, head version)
        self._heads: LRU[tuple[str, str], tuple[int, str]] = LRU(_CACHE_RUNS * 4)
        # One lock per (run_id, log) while anyone holds or awaits it; the logs written lately
        # keep theirs (an append would otherwise make, register and drop a lock each time).
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._recent_locks: LRU[tuple[str, str], asyncio.Lock] = LRU(_CACHE_RUNS * 4)

    # -- names --------------------------------------------------------------------------

    def scope(self, run_id: str) -> str:
        """The scope holding everything about ``run_id``."""
        if not isinstance(run_id, str) or not run_id:
            raise ValueError("run_id must be a non-empty string")
        return f"{self.scope_prefix}run/{run_id}"

    @property
    def runs_scope(self) -> str:
        return f"{self.scope_prefix}runs"

    def conversation_scope(self, conversation_id: str) -> str:
        """The lineage index of a conversation (long ids hashed; readers verify records)."""
        return f"{self.scope_prefix}conv/{_short(conversation_id)}"

    def parent_scope(self, parent_run_id: str) -> str:
        """The lineage index of a parent run (long ids hashed; readers verify records)."""
        return f"{self.scope_prefix}parent/{_short(parent_run_id)}"

    def forks_scope(self, source_run_id: str) -> str:
        """The lineage index of the forks of a run (long ids hashed; readers verify records)."""
        return f"{self.scope_prefix}forks/{_short(source_run_id)}"

    def forget(self, run_id: str) -> None:
        """Drop every cached fact about ``run_id`` (after deleting it)."""
        self._anchors.pop(run_id)
        self._heads.discard_where(lambda key: key[0] == run_id)

    # -- TTL anchoring --------------------------------------------------------------------

    async def write_ttl(self, run_id: str) -> float | None:
        """The TTL to give a record written now for ``run_id`` (None: no expiry).

        The first write of a run in this process creates (or reads) the run's entry in
        the runs index; with a TTL configured its expiry is the run's expiry, and every
        record of the run is written to expire at that same instant, so a run never
        expires piecemeal.
        """
        anchored = self._anchored_ttl(self._anchors.get(run_id))
        if not isinstance(anchored, _Unanchored):
            return anchored
        now = self.kv.clock()
        expires = await self._anchor(run_id, now)
        if expires == _NEVER:
            return None
        remaining = expires - now
        if remaining <= 0:  # pragma: no cover - anchor was just renewed
            remaining = 0.001
        return remaining

    def _anchored_ttl(self, cached: tuple[float, float] | None) -> float | _Unanchored | None:
        """:meth:`write_ttl` from the run's cached anchor ``cached``, without awaiting,
        when it is not due (every append of a busy run); else ``_NOT_ANCHORED`` (the
        anchor must be written or read first)."""
        if cached is None:
            return _NOT_ANCHORED
        expires, now = cached[0], self.kv.clock()
        if expires == _NEVER:
            return None
        if expires <= now:
            return _NOT_ANCHORED
        return expires - now

    async def _anchor(self, run_id: str, now: float) -> float:
        self.scope(run_id)  # validates the id before anything is written
        value = canonical({"created_at": now})
        for attempt in range(MAX_ATTEMPTS):
            try:
                await self.kv.create(self.runs_scope, run_id, value, ttl=self.ttl)
                expires = now + self.ttl if self.ttl is not None else _NEVER
                break
            except ConflictError:
                entry = await self.kv.get(self.runs_scope, run_id)
                if entry is None:  # deleted or expired in between: claim it again
                    await backoff(attempt)
                    continue
                expires = entry.expires_at if entry.expires_at is not None else _NEVER
                break
        else:  # pragma: no cover
            raise ConflictError(detail=f"could not anchor run {run_id!r}")
        self._anchors.set(run_id, (expires, time.monotonic()))
        return expires

    # -- position counters ------------------------------------------------------------------

    def _lock(self, run_id: str, log: str) -> asyncio.Lock:
        key = (run_id, log)
        lock = self._recent_locks.get(key)
        if lock is None:
            lock = self._locks.get(key)
            if lock is None:
                lock = asyncio.Lock()
                self._locks[key] = lock
            self._recent_locks.set(key, lock)
        return lock

    async def allocate(self, run_id: str, log: str, count: int = 1) -> int:
        """Reserve ``count`` consecutive positions of ``log``; returns the first.

        One CAS on the log's counter when this process wrote it last; a lost race re-reads
        it. Positions are never handed out twice, across tasks, clients and processes.
        """
        scope = self.scope(run_id)
        head_key = f"head/{log}"
        async with self._lock(run_id, log):
            anchor = self._anchors.get(run_id)
            # A log that starts long after this process indexed the run is re-indexed: the
            # run may have been deleted meanwhile (by another process), and must stay listed.
            stale = anchor is not None and time.monotonic() - anchor[1] > _ANCHOR_RECHECK
            for attempt in range(MAX_ATTEMPTS):
                ttl = await self.write_ttl(run_id)
                cached = self._heads.get((run_id, log))
                if cached is None:
                    entry = await self.kv.get(scope, head_key)
                    if entry is None:
                        if stale:
                            stale = False
                            self._anchors.pop(run_id)
                            ttl = await self.write_ttl(run_id)
                        try:
                            version = await self.kv.create(
                                scope, head_key, _head_value(count), ttl=ttl
                            )
                        except ConflictError:
                            await backoff(attempt)
                            continue
                        self._heads.set((run_id, log), (count, version))
                        return 0
                    cached = (self._decode_head(entry, scope), entry.version)
                first, version = cached
                try:
                    new_version = await self.kv.replace(
                        scope,
                        head_key,
                        _head_value(first + count),
                        expected_version=version,
                        ttl=ttl,
                    )
                except ConflictError:
                    self._heads.pop((run_id, log))
                    await backoff(attempt)
                    continue
                self._heads.set((run_id, log), (first + count, new_version))
                return first
        raise ConflictError(  # pragma: no cover - needs hundreds of lost races in a row
            detail=f"could not allocate a position in run {run_id!r} after {MAX_ATTEMPTS} attempts",
            scope=scope,
            key=head_key,
        )

    async def ensure_next(self, run_id: str, log: str, position: int) -> None:
        """Move ``log``'s counter up to ``position`` unless it is there already (never back).

        For entries written at positions of their own (a fork copies its source's journal
        at the source's positions): every later append lands after them.
        """
        scope = self.scope(run_id)
        head_key = f"head/{log}"
        async with self._lock(run_id, log):
            for attempt in range(MAX_ATTEMPTS):
                ttl = await self.write_ttl(run_id)
                entry = await self.kv.get(scope, head_key)
                try:
                    if entry is None:
                        version = await self.kv.create(
                            scope, head_key, _head_value(position), ttl=ttl
                        )
                    else:
                        current = self._decode_head(entry, scope)
                        if current >= position:
                            self._heads.set((run_id, log), (current, entry.version))
                            return
                        version = await self.kv.replace(
                            scope,
                            head_key,
                            _head_value(position),
                            expected_version=entry.version,
                            ttl=ttl,
                        )
                except ConflictError:
                    self._heads.pop((run_id, log))
                    await backoff(attempt)
                    continue
                self._heads.set((run_id, log), (position, version))
                return
        raise ConflictError(  # pragma: no cover - needs hundreds of lost races in a row
            detail=f"could not move the {log!r} counter of run {run_id!r}",
            scope=scope,
            key=head_key,
        )

    async def append_entry(
        self,
        run_id: str,
        log: str,
        key: str,
        make_record: Callable[[int], dict[str, Any]],
        keep: Sequence[str],
    ) -> tuple[Created, int]:
        """Append the record ``make_record(position)`` to ``log`` under ``key`` unless ``key``
        exists; returns the outcome and the position used (meaningless for a duplicate).

        Generic: allocate a position (one CAS on the counter), create the entry, give the
        position back on a duplicate. With an atomic port: counter and entry in one
        transaction, one round trip when this process wrote the counter last.
        """
        if not self.port.atomic:
            seq = await self.allocate(run_id, log)
            created = await self.create_entry(run_id, key, make_record(seq), keep)
            if not created.created:
                await self.give_back(run_id, log, seq)
            return created, seq
        scope = self.scope(run_id)
        head_key = f"head/{log}"
        async with self._lock(run_id, log):
            anchor = self._anchors.get(run_id)
            stale = anchor is not None and time.monotonic() - anchor[1] > _ANCHOR_RECHECK
            for attempt in range(MAX_ATTEMPTS):
                anchored = self._anchored_ttl(anchor if attempt == 0 else self._anchors.get(run_id))
                ttl = (
                    await self.write_ttl(run_id) if isinstance(anchored, _Unanchored) else anchored
                )
                cached = self._heads.get((run_id, log))
                version: str | None
                if cached is None:
                    entry = await self.kv.get(scope, head_key)
                    if entry is None:
                        if stale:
                            # See allocate: a log starting long after the run was indexed
                            # re-indexes it (another process may have deleted the run).
                            stale = False
                            self._anchors.pop(run_id)
                            ttl = await self.write_ttl(run_id)
                        first, version = 0, None
                    else:
                        first, version = self._decode_head(entry, scope), entry.version
                else:
                    first, version = cached
                record = make_record(first)
                value = canonical(record)
                if len(value) > self.inline_limit:
                    value = await self.pack(run_id, record, keep, ttl, encoded=value)
                try:
                    outcome = await self.port.append(
                        AppendRequest(
                            scope,
                            head_key,
                            _head_value(first + 1),
                            version,
                            key,
                            value,
                            ttl,
                        )
                    )
                except ConflictError:
                    self._heads.pop((run_id, log))
                    await backoff(attempt)
                    continue
                if outcome.head_version is not None:
                    self._heads.set((run_id, log), (first + 1, outcome.head_version))
                if outcome.created_version is not None:
                    return Created(True, record, outcome.created_version), first
                existing = outcome.existing
                if existing is None:
                    existing = await self.kv.get(scope, key)  # appeared concurrently: read it
                    if existing is None:  # pragma: no cover - deleted in between
                        await backoff(attempt)
                        continue
                stored = decode_record(existing.value, what=f"{key!r} in run {run_id!r}")
                return Created(False, stored, existing.version), first
        raise ConflictError(  # pragma: no cover - needs hundreds of lost races in a row
            detail=f"could not append to {log!r} of run {run_id!r}", scope=scope, key=head_key
        )

    async def give_back(self, run_id: str, log: str, first: int, count: int = 1) -> None:
        """Return positions that turned out unused, if nobody allocated after them.

        Keeps positions contiguous when a duplicate append consumed none; when another
        writer moved the counter meanwhile, the positions stay a gap (never reused).
        """
        async with self._lock(run_id, log):
            cached = self._heads.get((run_id, log))
            if cached is None or cached[0] != first + count:
                return
            try:
                version = await self.kv.replace(
                    self.scope(run_id),
                    f"head/{log}",
                    _head_value(first),
                    expected_version=cached[1],
                    ttl=await self.write_ttl(run_id),
                )
            except ConflictError:
                self._heads.pop((run_id, log))
                return
            self._heads.set((run_id, log), (first, version))

    @staticmethod
    def _decode_head(entry: Entry, scope: str) -> int:
        value = decode_record(entry.value, what=f"position counter in {scope!r}").get("next")
        if not isinstance(value, int) or value < 0:
            raise CorruptRecordError(detail=f"position counter in {scope!r} is not a count")
        return value

    # -- records, chunked when large ----------------------------------------------------------

    @property
    def inline_limit(self) -> int:
        return max(1024, self.kv.limits.max_value_bytes - _INLINE_MARGIN)

    async def pack(
        self,
        run_id: str,
        record: dict[str, Any],
        keep: Sequence[str],
        ttl: float | None,
        *,
        encoded: bytes | None = None,
    ) -> bytes:
        """Encode ``record``; when too large, store it as chunks and return a stub.

        The stub holds the fields named in ``keep`` (small ones a reader needs without the
        chunks) and a reference to the chunks. Chunks are content-addressed, written
        before the stub (the stub's write is the commit point), and collected with the run.
        ``encoded``: ``canonical(record)``, when the caller made it already.
        """
        data = canonical(record) if encoded is None else encoded
        if len(data) <= self.inline_limit:
            return data
        scope = self.scope(run_id)
        full = digest(data)
        size = max(1024, self.kv.limits.max_value_bytes - 64)
        pieces = [data[i : i + size] for i in range(0, len(data), size)]

        conflicted = False

        async def put(index: int, piece: bytes) -> None:
            nonlocal conflicted
            try:
                await self.kv.create(scope, f"x/{full}/{index:06d}", piece, ttl=ttl)
            except ConflictError:
                conflicted = True  # same address: these bytes are stored already

        await bounded_gather([partial(put, i, p) for i, p in enumerate(pieces)], _WRITE_CONCURRENCY)
        count = len(pieces)
        if conflicted:
            count = await self._stored_pieces(scope, full, data)
        stub = {name: record[name] for name in keep if name in record}
        stub["blob"] = {"sha256": full, "chunks": count, "size": len(data)}
        return canonical(stub)

    async def _stored_pieces(self, scope: str, full: str, data: bytes) -> int:
        """How many pieces hold ``data`` where it was stored already, maybe cut at another
        size (written by a backend with other limits, then copied here): the stub must
        name the stored layout, not the one this store would have cut."""
        joined = bytearray()
        count = 0
        async for item in self.kv.iter_scan(scope, prefix=f"x/{full}/"):
            if item.entry is None or item.key != f"x/{full}/{count:06d}":
                break
            joined += item.entry.value
            count += 1
            if len(joined) >= len(data):
                break
        if bytes(joined) != data:
            raise CorruptRecordError(
                detail=f"run chunks x/{full[:12]}…: the stored pieces do not hold the bytes "
                "they are addressed by"
            )
        return count

    async def unpack(self, run_id: str, record: dict[str, Any], *, what: str) -> dict[str, Any]:
        """The full record behind a stub written by :meth:`pack` (other records unchanged)."""
        blob = record.get("blob")
        if not isinstance(blob, dict):
            return record
        scope = self.scope(run_id)
        try:
            full, count, size = str(blob["sha256"]), int(blob["chunks"]), int(blob["size"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(detail=f"{what}: malformed chunk reference") from exc
        keys = [f"x/{full}/{i:06d}" for i in range(count)]
        found: dict[str, Entry] = {}
        for start in range(0, len(keys), _BATCH):
            found.update(await self.kv.get_many(scope, keys[start : start + _BATCH]))
        missing = [k for k in keys if k not in found]
        if missing:
            raise CorruptRecordError(detail=f"{what}: {len(missing)} of {count} chunks are missing")
        data = b"".join(found[k].value for k in keys)
        if len(data) != size or digest(data) != full:
            raise CorruptRecordError(detail=f"{what}: chunks do not match their checksum")
        return decode_record(data, what=what)

    async def create_entry(
        self, run_id: str, key: str, record: dict[str, Any], keep: Sequence[str]
    ) -> Created:
        """Create ``key`` holding ``record`` unless it exists; on a duplicate read it back.

        The returned record of a duplicate is the stored *stub* form (the ``keep`` fields
        are always there); call :meth:`unpack` for the rest.
        """
        scope = self.scope(run_id)
        ttl = await self.write_ttl(run_id)
        value = await self.pack(run_id, record, keep, ttl)
        for attempt in range(MAX_ATTEMPTS):
            try:
                version = await self.kv.create(scope, key, value, ttl=ttl)
                return Created(True, record, version)
            except ConflictError:
                entry = await self.kv.get(scope, key)
                if entry is None:  # deleted or expired in between: try again
                    await backoff(attempt)
                    continue
                stored = decode_record(entry.value, what=f"{key!r} in run {run_id!r}")
                return Created(False, stored, entry.version)
        raise ConflictError(  # pragma: no cover
            detail=f"could not write {key!r} in run {run_id!r}", scope=scope, key=key
        )

    async def scan_records(
        self, run_id: str, prefix: str, *, page_size: int = 200
    ) -> list[tuple[str, dict[str, Any], str]]:
        """``(key, record, version)`` for every live key under ``prefix``, in key order."""
        scope = self.scope(run_id)
        out: list[tuple[str, dict[str, Any], str]] = []
        async for item in self.kv.iter_scan(scope, prefix=prefix, page_size=page_size):
            assert item.entry is not None
            out.append(
                (
                    item.key,
                    decode_record(item.entry.value, what=f"{item.key!r} in run {run_id!r}"),
                    item.entry.version,
                )
            )
        return out
