"""Copy sessions, memory, runs and conversations between two backends, record by record.

The unit of copying is a KV *scope*: one session, one memory directory, one run (plus the
run listing and lineage indexes), one owner scope of Pydantic AI conversations (then the
conversations' pointers). Every store keeps all the records of such a unit in its
scope and builds them only on the public :class:`~agent_stores.kv.KVStore` contract, so
copying the entries of a scope through that contract (``scan`` on the source,
``create`` / ``replace`` on the destination) carries everything a store wrote, byte for
byte: histories and recovery latches, memory versions, metadata and operation receipts,
journals, snapshots and tool effects. It works for every backend that implements the
contract, third-party ones included.

A unit holding an entry larger than the destination's ``max_value_bytes`` (SQLite holds
4 MB, DynamoDB 400 KB) is *re-chunked* on the way (:mod:`.rechunk`): the stores' chunk
layouts are cut again at the destination's size and the part or chunk counts in the
records that reference them rewritten, which changes no version, receipt, latch or
expiry. ``verify`` compares such a unit by content instead of key by key. A record that
cannot be split (a session state, a run record) fails its unit before anything is
written, and :meth:`Transfer.copy` lists it (also in a dry run).

Why this is safe while the source is in use:

* a scope is read twice; it counts as copied only when both reads saw the same entry
  versions (versions are never reused, so nothing changed in between), else it is
  copied again;
* a session whose lease is held (a turn is running) is not copied; it is retried later,
  and reported as busy when the lease is still held after ``busy_timeout`` seconds;
* chunks are written before the head records that reference them;
* a unit that fails midway is taken back out: the entries this copy created for it in
  the destination are deleted again (never entries that were there before), and a run
  that failed leaves no entry in the run listing or lineage indexes, so a failed unit
  leaves nothing half-copied behind.

Why a rerun resumes: a destination entry equal to the source one (value, and expiry to
within a second) is left alone, a different one is replaced, a missing one created. The
destination is never deleted from, so copying into a store that has other data loses
nothing of it (the source wins for records present on both sides).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import AppError, ConflictError
from ..kv.base import Entry, KVStore
from .rechunk import TooLarge, content_view, fit, oversized

if TYPE_CHECKING:
    from ..sessions import SessionStore

#: The kinds of data, in the order they are copied.
KINDS: tuple[str, ...] = ("sessions", "memory", "runs", "conversations")

#: Expiries closer than this count as equal (backends keep them at different precisions).
EXPIRY_TOLERANCE = 1.0
_PAGE = 500
# Keys of immutable chunks (sessions ``h/``, memory ``~c/``, runs ``x/``) go first, then
# snapshot messages ``m/`` (records that may reference ``x/`` chunks, referenced by
# snapshots), head records last: a copy cut short never leaves a head without its chunks.
_CHUNK_PREFIXES = ("~", "h/", "x/")
_MESSAGE_PREFIX = "m/"
_HEAD_KEYS = frozenset({"state", "run", "sp"})


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each kind lives: the scope prefixes of the stores' default options."""

    sessions: str = "session:"
    memory: str = "memory:"
    runs_namespace: str = "cp"
    #: the owners' session indexes (copied with the sessions, after them)
    session_owners: str = "session-owner:"
    #: Pydantic AI conversations (``open_conversations``): owner scopes, then pointers
    conversations: str = "conversation:"

    def prefix(self, kind: str) -> str:
        if kind == "sessions":
            return self.sessions
        if kind == "memory":
            return self.memory
        if kind == "runs":
            return f"{self.runs_namespace}/"
        if kind == "conversations":
            return self.conversations
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")


@dataclass(slots=True)
class KindStats:
    """What a copy (or a dry run, or a verification) did for one kind."""

    scopes: int = 0
    records: int = 0
    bytes: int = 0
    created: int = 0
    updated: int = 0
    identical: int = 0
    busy: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    mismatches: list[tuple[str, str, str]] = field(default_factory=list)
    extra: int = 0
    """Verification: records present only in the destination (not an error)."""
    rechunked: int = 0
    """Units re-chunked for the destination's value limit (copy) or compared by content
    because of it (verify)."""
    too_large: list[TooLarge] = field(default_factory=list)
    """Records larger than the destination holds that cannot be split (their units fail)."""


@dataclass(slots=True)
class TransferReport:
    """The outcome per kind; ``ok`` is False when anything was busy, failed or differs."""

    kinds: dict[str, KindStats]
    dry_run: bool = False
    verified: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(s.busy or s.failed or s.mismatches for s in self.kinds.values())


@dataclass(frozen=True, slots=True)
class Progress:
    """One unit done: sent to the ``progress`` callback."""

    kind: str
    scope: str
    records: int
    bytes: int


ProgressCallback = Callable[[Progress], None]


class _Busy(Exception):
    """The session is held by a turn; try again later."""


class _Changing(Exception):
    """The scope kept changing while it was read."""


class _TooLarge(Exception):
    """The unit holds records the destination cannot hold, even re-chunked."""

    def __init__(self, records: list[TooLarge]) -> None:
        super().__init__(records)
        self.records = records


class _UnitFailed(Exception):
    """The unit's copy failed; the message says why and what was taken back out."""


@dataclass(frozen=True, slots=True)
class _Copied:
    """One consistent pass over a unit: what the source held, what was written, and how."""

    source: dict[str, Entry]
    wanted: dict[str, Entry]
    """The fitted entries the destination should hold (index entries of failed runs left out)."""
    plan: dict[str, str]
    """``key -> "create" | "replace"``: the entries that were (or in a dry run would be) written."""
    rechunked: bool


class Transfer:
    """Copies (or counts, or verifies) the data of ``src`` into ``dst``.

    ``src_sessions`` is the source's session store, used only to see whether a session is
    leased (``inspect``); without it sessions are copied without that check.
    """

    def __init__(
        self,
        src: KVStore,
        dst: KVStore,
        *,
        kinds: Sequence[str] = KINDS,
        layout: Layout | None = None,
        src_sessions: SessionStore | None = None,
        jobs: int = 8,
        busy_timeout: float = 30.0,
        progress: ProgressCallback | None = None,
        describe_error: Callable[[str], str] = str,
    ) -> None:
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown kind(s) {unknown}; expected some of {', '.join(KINDS)}")
        if jobs < 1:
            raise ValueError("jobs must be >= 1")
        self.src = src
        self.dst = dst
        self.kinds = [k for k in KINDS if k in kinds]
        self.layout = layout or Layout()
        self.src_sessions = src_sessions
        self.jobs = jobs
        self.busy_timeout = busy_timeout
        self.progress = progress
        self._describe_error = describe_error

    # -- planning -------------------------------------------------------------------------

    async def plan(self) -> dict[str, list[str]]:
        """The source scopes of every selected kind, in copy order."""
        out: dict[str, list[str]] = {}
        for kind in self.kinds:
            # One linear walk of the source (paging scopes() is quadratic on some backends).
            walk = self.src.iter_scopes(prefix=self.layout.prefix(kind), page_size=_PAGE)
            scopes = sorted([scope async for scope in walk])
            if kind == "sessions":
                # Each owner's index after the sessions it names.
                owners = self.src.iter_scopes(prefix=self.layout.session_owners, page_size=_PAGE)
                scopes += sorted([scope async for scope in owners])
            if kind == "runs":
                # A run's own scope before the listing and lineage entries that point at it.
                run_prefix = f"{self.layout.runs_namespace}/run/"
                scopes.sort(key=lambda s: (not s.startswith(run_prefix), s))
            out[kind] = scopes
        return out

    # -- copy -----------------------------------------------------------------------------

    async def copy(
        self, *, dry_run: bool = False, plan: dict[str, list[str]] | None = None
    ) -> TransferReport:
        """Copy every scope of the plan (``dry_run``: only count what would change)."""
        started = time.monotonic()
        plan = plan if plan is not None else await self.plan()
        report = TransferReport({k: KindStats() for k in plan}, dry_run=dry_run)
        for kind, scopes in plan.items():
            stats = report.kinds[kind]
            for phase in self._phases(kind, scopes):
                # The run listing and lineage indexes come after every run, so the entries
                # of runs that failed (or stayed busy) can be left out of them.
                skip = self._failed_runs(stats) if kind == "runs" else frozenset()
                deferred = await self._run_all(kind, phase, stats, dry_run, skip)
                deadline = time.monotonic() + self.busy_timeout
                delay = 0.05
                while deferred and time.monotonic() < deadline:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    deferred = await self._run_all(kind, deferred, stats, dry_run, skip)
                stats.busy.extend(deferred)
            stats.too_large.sort(key=lambda t: (t.scope, t.key))
        report.seconds = time.monotonic() - started
        return report

    def _phases(self, kind: str, scopes: Sequence[str]) -> list[list[str]]:
        if kind == "sessions":
            owners = [s for s in scopes if s.startswith(self.layout.session_owners)]
            indexes = set(owners)
            return [[s for s in scopes if s not in indexes], owners]
        if kind != "runs":
            return [list(scopes)]
        run_prefix = self._run_prefix
        runs = [s for s in scopes if s.startswith(run_prefix)]
        return [runs, [s for s in scopes if not s.startswith(run_prefix)]]

    @property
    def _run_prefix(self) -> str:
        return f"{self.layout.runs_namespace}/run/"

    def _failed_runs(self, stats: KindStats) -> frozenset[str]:
        """Ids of the runs not copied (failed or busy): index entries naming them are skipped."""
        prefix = self._run_prefix
        scopes = [s for s, _ in stats.failed] + stats.busy
        return frozenset(s[len(prefix) :] for s in scopes if s.startswith(prefix))

    async def _run_all(
        self,
        kind: str,
        scopes: Sequence[str],
        stats: KindStats,
        dry_run: bool,
        skip: frozenset[str] = frozenset(),
    ) -> list[str]:
        """Copy ``scopes`` ``jobs`` at a time; returns the busy ones."""
        semaphore = asyncio.Semaphore(self.jobs)
        busy: list[str] = []

        async def one(scope: str) -> None:
            async with semaphore:
                try:
                    await self._copy_scope(kind, scope, stats, dry_run, skip)
                except (_Busy, _Changing):
                    busy.append(scope)
                except _TooLarge as exc:
                    stats.too_large.extend(exc.records)
                    stats.failed.append((scope, self._describe_error(_too_large_message(exc))))
                except _UnitFailed as exc:
                    stats.failed.append((scope, self._describe_error(f"{exc}")))

        await asyncio.gather(*(one(s) for s in scopes))
        return sorted(busy)

    async def _copy_scope(
        self, kind: str, scope: str, stats: KindStats, dry_run: bool, skip: frozenset[str]
    ) -> None:
        # What this copy created in the destination for this unit (key -> version), and
        # creates whose outcome is unknown (key -> value): taken back out if the unit fails.
        created: dict[str, str] = {}
        unsure: dict[str, bytes] = {}
        try:
            for _ in range(5):
                copied = await self._copy_once(kind, scope, dry_run, skip, created, unsure)
                if copied is not None:
                    self._count(kind, scope, stats, copied)
                    return
            raise _Changing(scope)
        except (_Busy, _Changing, _TooLarge):
            if created or unsure:
                await self._undo(scope, created, unsure)
            raise
        except (AppError, ValueError, OSError) as exc:
            message = f"{exc}"
            if created or unsure:
                message += await self._take_back(scope, created, unsure)
            raise _UnitFailed(message) from exc

    async def _copy_once(
        self,
        kind: str,
        scope: str,
        dry_run: bool,
        skip: frozenset[str],
        created: dict[str, str],
        unsure: dict[str, bytes],
    ) -> _Copied | None:
        """One pass over the unit; None when the source changed while it was copied."""
        await self._check_lease(kind, scope)
        source = await _snapshot(self.src, scope)
        target = await _snapshot(self.dst, scope)
        fitted = fit(
            kind,
            scope,
            source,
            self.dst.limits.max_value_bytes,
            now=self.dst.clock(),
            existing=target,
        )
        if fitted.too_large:
            raise _TooLarge(fitted.too_large)
        wanted = {k: e for k, e in fitted.entries.items() if k not in skip}
        plan = _diff(wanted, target)
        if not dry_run:
            await self._apply(scope, wanted, target, plan, created, unsure)
        again = await _snapshot(self.src, scope)
        await self._check_lease(kind, scope)
        if _versions(again) != _versions(source):
            return None
        return _Copied(source, wanted, plan, fitted.rechunked)

    def _count(self, kind: str, scope: str, stats: KindStats, copied: _Copied) -> None:
        """Add a copied unit to ``stats`` and report it to the progress callback."""
        source, plan = copied.source, copied.plan
        stats.scopes += 1
        stats.records += len(source)
        size = sum(len(e.value) for e in source.values())
        stats.bytes += size
        stats.created += sum(1 for a in plan.values() if a == "create")
        stats.updated += sum(1 for a in plan.values() if a == "replace")
        stats.identical += len(copied.wanted) - len(plan)
        stats.rechunked += copied.rechunked
        if self.progress is not None:
            self.progress(Progress(kind, scope, len(source), size))

    async def _take_back(
        self, scope: str, created: dict[str, str], unsure: dict[str, bytes]
    ) -> str:
        """Undo what a failed unit wrote; what the failure message adds about it."""
        removed, left = await self._undo(scope, created, unsure)
        if left:
            return (
                f"; {left} entr{'y' if left == 1 else 'ies'} it created could not be "
                "removed from the destination (copy again to complete the unit)"
            )
        if removed:
            return (
                f"; the {removed} entr{'y' if removed == 1 else 'ies'} it had created "
                "in the destination were removed"
            )
        return ""

    async def _check_lease(self, kind: str, scope: str) -> None:
        if (
            kind != "sessions"
            or self.src_sessions is None
            or not scope.startswith(self.layout.sessions)
        ):
            return
        session_id = scope[len(self.layout.sessions) :]
        try:
            info = await self.src_sessions.inspect(session_id)
        except ValueError:
            return  # not a session id the store accepts: copy the scope as data
        if info is not None and info.lease_active(self.src.clock()):
            raise _Busy(scope)

    async def _apply(
        self,
        scope: str,
        wanted: dict[str, Entry],
        target: dict[str, Entry],
        plan: dict[str, str],
        created: dict[str, str],
        unsure: dict[str, bytes],
    ) -> None:
        for key in sorted(plan, key=_write_order):
            entry = wanted[key]
            ttl = _ttl(entry, self.dst.clock())
            if ttl is not None and ttl <= 0:
                continue  # expired on the way: the source no longer has it either
            current = target.get(key)
            for _ in range(3):
                try:
                    if current is None:
                        unsure[key] = entry.value
                        version = await self.dst.create(scope, key, entry.value, ttl=ttl)
                        created[key] = version
                    else:
                        version = await self.dst.replace(
                            scope, key, entry.value, expected_version=current.version, ttl=ttl
                        )
                        if key in created:  # ours, from an earlier attempt at this unit
                            created[key] = version
                    unsure.pop(key, None)
                    break
                except ConflictError:
                    unsure.pop(key, None)
                    # Someone wrote the destination meanwhile: take its current version.
                    # (Or a client library re-sent our own create after a lost reply.)
                    mine = current is None and key not in target
                    current = await self.dst.get(scope, key)
                    if current is not None and _same(entry, current):
                        if mine and key not in created:
                            created[key] = current.version
                        break
            else:
                raise ConflictError(
                    detail=f"{scope!r}/{key!r} kept changing in the destination", key=key
                )

    async def _undo(
        self, scope: str, created: dict[str, str], unsure: dict[str, bytes]
    ) -> tuple[int, int]:
        """Delete what this copy created for the unit, heads first; ``(removed, left)``.

        Each delete is conditional on the version written, so an entry someone rewrote
        since is theirs and stays. A create whose reply was lost counts as ours when the
        key (absent before the copy) holds exactly the bytes sent.
        """
        removed = left = 0
        for key, value in list(unsure.items()):
            try:
                entry = await self.dst.get(scope, key)
            except (AppError, OSError):
                left += 1
                continue
            if entry is not None and entry.value == value:
                created[key] = entry.version
        for key in sorted(created, key=_write_order, reverse=True):
            try:
                if await self.dst.delete(scope, key, expected_version=created[key]):
                    removed += 1
            except ConflictError:
                pass  # rewritten by someone else meanwhile: no longer ours to remove
            except (AppError, OSError):
                left += 1
        created.clear()
        unsure.clear()
        return removed, left

    # -- verification ---------------------------------------------------------------------

    async def verify(self, *, plan: dict[str, list[str]] | None = None) -> TransferReport:
        """Compare every source record with the destination's (value and expiry).

        A unit holding records larger than the destination holds was re-chunked by the
        copy, so it is compared by content (:func:`~.rechunk.content_view`): records
        with the data their chunks hold, chunk parts joined, however they are cut.
        """
        started = time.monotonic()
        plan = plan if plan is not None else await self.plan()
        report = TransferReport({k: KindStats() for k in plan}, verified=True)
        for kind, scopes in plan.items():
            stats = report.kinds[kind]
            semaphore = asyncio.Semaphore(self.jobs)

            async def one(
                scope: str,
                kind: str = kind,
                stats: KindStats = stats,
                semaphore: asyncio.Semaphore = semaphore,
            ) -> None:
                async with semaphore:
                    try:
                        source = await _snapshot(self.src, scope)
                        target = await _snapshot(self.dst, scope)
                    except (AppError, ValueError, OSError) as exc:
                        stats.failed.append((scope, self._describe_error(f"{exc}")))
                        return
                    size = sum(len(e.value) for e in source.values())
                    if oversized(source, self.dst.limits.max_value_bytes):
                        stats.rechunked += 1
                        source = content_view(kind, source)
                        target = content_view(kind, target)
                    stats.scopes += 1
                    stats.records += len(source)
                    stats.bytes += size
                    for key, entry in source.items():
                        other = target.get(key)
                        if other is None:
                            stats.mismatches.append((scope, key, "missing in destination"))
                        elif other.value != entry.value:
                            stats.mismatches.append((scope, key, "different value"))
                        elif not _same_expiry(entry, other):
                            stats.mismatches.append((scope, key, "different expiry"))
                        else:
                            stats.identical += 1
                    stats.extra += sum(1 for key in target if key not in source)
                    if self.progress is not None:
                        self.progress(Progress(kind, scope, len(source), size))

            await asyncio.gather(*(one(s) for s in scopes))
            stats.mismatches.sort()
        report.seconds = time.monotonic() - started
        return report


# -- helpers ----------------------------------------------------------------------------


async def _snapshot(kv: KVStore, scope: str) -> dict[str, Entry]:
    out: dict[str, Entry] = {}
    async for item in kv.iter_scan(scope, page_size=_PAGE, values=True):
        if item.entry is not None:
            out[item.key] = item.entry
    return out


def _versions(entries: dict[str, Entry]) -> dict[str, str]:
    return {k: e.version for k, e in entries.items()}


def _diff(source: dict[str, Entry], target: dict[str, Entry]) -> dict[str, str]:
    """``key -> "create" | "replace"`` for every source entry the destination lacks or differs in."""
    plan: dict[str, str] = {}
    for key, entry in source.items():
        other = target.get(key)
        if other is None:
            plan[key] = "create"
        elif not _same(entry, other):
            plan[key] = "replace"
    return plan


def _same(a: Entry, b: Entry) -> bool:
    return a.value == b.value and _same_expiry(a, b)


def _same_expiry(a: Entry, b: Entry) -> bool:
    if a.expires_at is None or b.expires_at is None:
        return a.expires_at is None and b.expires_at is None
    return abs(a.expires_at - b.expires_at) <= EXPIRY_TOLERANCE


def _ttl(entry: Entry, now: float) -> float | None:
    return None if entry.expires_at is None else entry.expires_at - now


def _write_order(key: str) -> tuple[int, str]:
    if key.startswith(_CHUNK_PREFIXES):
        return (0, key)
    if key.startswith(_MESSAGE_PREFIX):
        return (1, key)
    if key in _HEAD_KEYS or key.startswith("head/"):
        return (3, key)
    return (2, key)


def _too_large_message(exc: _TooLarge) -> str:
    first = exc.records[0]
    more = f" (and {len(exc.records) - 1} more)" if len(exc.records) > 1 else ""
    return (
        f"{first.key!r} is {first.size} bytes, more than the destination holds "
        f"({first.limit} bytes per entry): {first.reason}{more}; the unit was not copied"
    )


def parse_kinds(values: Iterable[str]) -> list[str]:
    """``["sessions,memory", "runs"]`` -> the kinds, validated; empty means all."""
    kinds: list[str] = []
    for value in values:
        for part in value.split(","):
            name = part.strip().lower()
            if not name:
                continue
            if name not in KINDS:
                raise ValueError(f"unknown kind {name!r}; expected some of {', '.join(KINDS)}")
            if name not in kinds:
                kinds.append(name)
    return kinds or list(KINDS)


def summary_rows(report: TransferReport) -> list[dict[str, Any]]:
    """One plain row per kind, for tables and JSON."""
    rows = []
    for kind, s in report.kinds.items():
        rows.append(
            {
                "kind": kind,
                "units": s.scopes,
                "records": s.records,
                "bytes": s.bytes,
                "created": s.created,
                "updated": s.updated,
                "identical": s.identical,
                "busy": len(s.busy),
                "failed": len(s.failed),
                "mismatches": len(s.mismatches),
                "only_in_destination": s.extra,
                "rechunked": s.rechunked,
                "too_large": len(s.too_large),
            }
        )
    return rows
