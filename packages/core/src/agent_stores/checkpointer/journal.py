"""``Checkpointer``: a durable run journal with idempotent appends, on any backend.

``append(run_id, event)`` creates the entry ``j/<step_id>/<phase>`` in the run's scope,
so the idempotency key *is* the storage key: a repeated append is a create conflict that
is read back, reported as a duplicate with the original position, and compared on a
canonical serialization (``payload_diverged``). Positions come from a per-run counter
advanced by one CAS, so an append costs the same few operations at any run length and
concurrent appenders never share a position.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import telemetry
from ..errors import CorruptRecordError
from ..kv.base import KVStore
from ..lifecycle import KVBackedStore
from ..options import UNSET, renamed_option
from ..subjects import DEFAULT_SUBJECT_PREFIX, SubjectEntry
from . import fork as _fork
from .codec import decode_record
from .fork import ForkLineage, RunFork
from .port import JournalPort
from .space import (
    DEFAULT_RUN_TTL_SECONDS,
    DEFAULT_SCOPE_PREFIX,
    Created,
    RunSpace,
    bounded_gather,
    scope_prefix_option,
)
from .types import AppendResult, JournalEntry, JournalEvent, RunInfo, RunRetention, RunState

if TYPE_CHECKING:
    from .step_store import KVStepStore
    from .writer import JournalWriter

JOURNAL_LOG = "j"
_ENTRY_KEEP = ("v", "seq", "fp", "step_id", "phase", "kind")


def journal_key(event: JournalEvent) -> str:
    """The storage key of an event: positional ids make byte order execution order."""
    return f"{JOURNAL_LOG}/{event.step_id}/{event.phase.value}"


class Checkpointer(KVBackedStore):
    """A durable run journal (and, through :meth:`step_store`, a harness ``StepStore``).

    ``Checkpointer(kv, *, owns_kv=False, scope_prefix="cp/", ttl_seconds=30 days)``. Use it
    as an async context manager (entering runs the backend's ``setup``); with
    ``owns_kv=True`` closing it closes the KV store. ``ttl_seconds`` makes every run expire,
    whole, that long after its first write (default
    :data:`~agent_stores.checkpointer.space.DEFAULT_RUN_TTL_SECONDS`, 30 days; None keeps
    runs until deleted). ``namespace="x"`` (``scope_prefix="x/"``) and ``ttl`` are
    the deprecated names of these options. ``port`` is the backend's native
    :class:`~agent_stores.checkpointer.port.JournalPort` (an append in one transaction),
    from its ``journal_port`` hook (asked when None is given), else the generic two-step append.
    ``subject_prefix`` names the per-subject scopes (:meth:`bind_subject`).
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        owns_kv: bool = False,
        scope_prefix: str = DEFAULT_SCOPE_PREFIX,
        ttl_seconds: float | None = DEFAULT_RUN_TTL_SECONDS,
        max_snapshots_per_run: int | None = None,
        namespace: str = UNSET,
        ttl: float | None = UNSET,
        port: JournalPort | None = None,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
    ) -> None:
        self.kv = kv
        self.owns_kv = owns_kv
        self.space = RunSpace(
            kv,
            scope_prefix=scope_prefix_option("Checkpointer", scope_prefix, namespace),
            ttl=renamed_option("Checkpointer", "ttl", ttl, "ttl_seconds", ttl_seconds),
            port=port,
            subject_prefix=subject_prefix,
        )
        self._max_snapshots_per_run = max_snapshots_per_run
        self._step_store: KVStepStore | None = None
        if max_snapshots_per_run is not None:
            self.step_store()  # validates the bound now rather than on first use

    def __repr__(self) -> str:
        return f"<Checkpointer {self.kv.describe()} scope_prefix={self.space.scope_prefix!r}>"

    @property
    def port(self) -> JournalPort:
        """The port appends go through: the backend's native one, or the generic one."""
        return self.space.port

    # -- lifecycle ------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create the backend's tables or schema if it needs them. Idempotent."""
        await self.kv.setup()

    async def aclose(self) -> None:
        """Close the KV store when this checkpointer owns it. Idempotent."""
        if self.owns_kv:
            await self.kv.aclose()

    # -- the journal --------------------------------------------------------------------------

    @telemetry.traced("journal.append")
    async def append(self, run_id: str, event: JournalEvent) -> AppendResult:
        """Append ``event`` to the run's journal; idempotent by ``(run_id, step_id, phase)``.

        A repeat is a no-op reporting the original position (``duplicate=True``), with
        ``payload_diverged=True`` when its payload differs from the stored one. The cost
        does not depend on the run's length: nothing of the run is read.
        """
        if not isinstance(event, JournalEvent):
            raise TypeError(f"append expects a JournalEvent, got {type(event).__name__}")
        fingerprint = event.fingerprint()
        fields = event.to_record()
        created, seq = await self.space.append_entry(
            run_id,
            JOURNAL_LOG,
            journal_key(event),
            lambda at: {"v": 1, "seq": at, "fp": fingerprint, **fields},
            _ENTRY_KEEP,
        )
        return self._result(run_id, event, fingerprint, created, seq)

    @telemetry.traced("journal.append_many")
    async def append_many(self, run_id: str, events: Sequence[JournalEvent]) -> list[AppendResult]:
        """Append several events in order with one position reservation.

        Positions are reserved for all events first, in order, then written concurrently,
        so the journal's order is ``events``' order however the writes land. A position
        reserved by an event that turns out to be a duplicate stays unused (a gap).
        """
        reserved = await self.reserve(run_id, len(events))
        return list(
            await bounded_gather(
                [
                    partial(self.append_at, run_id, e, s)
                    for e, s in zip(events, reserved, strict=True)
                ],
                16,
            )
        )

    async def reserve(self, run_id: str, count: int) -> range:
        """Reserve ``count`` consecutive journal positions for :meth:`append_at`.

        A reserved position is never handed to anyone else; one that is never written is a
        gap in ``seq`` (entries keep their relative order).
        """
        if count < 0:
            raise ValueError("count must be >= 0")
        if count == 0:
            return range(0)
        first = await self.space.allocate(run_id, JOURNAL_LOG, count)
        return range(first, first + count)

    @telemetry.traced("journal.append_at")
    async def append_at(self, run_id: str, event: JournalEvent, seq: int) -> AppendResult:
        """Append ``event`` at a position obtained from :meth:`reserve`.

        Retrying with the same position after a failure is safe: the entry is written at
        most once, and a retry whose first attempt did land reports a duplicate at ``seq``.
        """
        if not isinstance(event, JournalEvent):
            raise TypeError(f"append expects a JournalEvent, got {type(event).__name__}")
        return await self._write_at(run_id, event, seq)

    async def _write_at(self, run_id: str, event: JournalEvent, seq: int) -> AppendResult:
        fingerprint = event.fingerprint()
        record: dict[str, Any] = {"v": 1, "seq": seq, "fp": fingerprint, **event.to_record()}
        created = await self.space.create_entry(run_id, journal_key(event), record, _ENTRY_KEEP)
        return self._result(run_id, event, fingerprint, created, seq)

    @staticmethod
    def _result(
        run_id: str, event: JournalEvent, fingerprint: str, created: Created, seq: int
    ) -> AppendResult:
        if created.created:
            return AppendResult(seq=seq)
        stored = created.record
        stored_seq = stored.get("seq")
        if not isinstance(stored_seq, int):
            raise CorruptRecordError(
                detail=f"journal entry {journal_key(event)!r} of run {run_id!r} has no position"
            )
        return AppendResult(
            seq=stored_seq, duplicate=True, payload_diverged=stored.get("fp") != fingerprint
        )

    @telemetry.traced("journal.load")
    async def load(self, run_id: str) -> RunState:
        """The run's journal in write order (empty for an unknown run)."""
        records = await self.space.scan_records(run_id, f"{JOURNAL_LOG}/")
        entries: list[JournalEntry] = []
        for key, record, _ in records:
            full = await self.space.unpack(run_id, record, what=f"journal entry {key!r}")
            try:
                entries.append(JournalEntry(int(full["seq"]), JournalEvent.from_record(full)))
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptRecordError(
                    detail=f"journal entry {key!r} of run {run_id!r} cannot be decoded: {exc}"
                ) from exc
        entries.sort(key=lambda e: e.seq)
        return RunState(run_id, tuple(entries))

    def writer(self, run_id: str) -> JournalWriter:
        """A :class:`JournalWriter` for ``run_id`` honouring each event's durability."""
        from .writer import JournalWriter

        return JournalWriter(self, run_id)

    # -- the harness step store ------------------------------------------------------------

    def step_store(self) -> KVStepStore:
        """The harness ``StepStore`` on the same KV and layout (one per checkpointer)."""
        if self._step_store is None:
            from .step_store import KVStepStore

            self._step_store = KVStepStore(
                self.kv, space=self.space, max_snapshots_per_run=self._max_snapshots_per_run
            )
        return self._step_store

    # -- retention ------------------------------------------------------------------------

    @telemetry.traced("journal.list_runs")
    async def list_runs(self, *, start_after: str | None = None, limit: int = 100) -> list[RunInfo]:
        """Runs in run-id byte order, paginated (``start_after`` the last id of a page)."""
        items = await self.kv.scan(self.space.runs_scope, start_after=start_after, limit=limit)
        out: list[RunInfo] = []
        for item in items:
            assert item.entry is not None
            try:
                created = float(_decode_index(item.entry.value).get("created_at", 0.0))
            except (TypeError, ValueError):
                created = 0.0
            out.append(RunInfo(item.key, created, item.entry.expires_at))
        return out

    async def get_run_info(self, run_id: str) -> RunInfo | None:
        """The listing entry of one run, or None when the run is unknown."""
        entry = await self.kv.get(self.space.runs_scope, run_id)
        if entry is None:
            return None
        created = _decode_index(entry.value).get("created_at", 0.0)
        return RunInfo(
            run_id, float(created) if isinstance(created, int | float) else 0.0, entry.expires_at
        )

    @telemetry.traced("journal.delete_run")
    async def delete_run(self, run_id: str) -> bool:
        """Erase a run: journal, step events, snapshots, tool effects and index entries.

        Returns True when anything was deleted. Index entries go last, so a crash midway
        leaves at worst a listed run with no data, which deleting again removes.
        """
        scope = self.space.scope(run_id)
        lineage = await self._lineage(run_id)
        try:
            forked = await _fork.fork_lineage(self.kv, self.space, run_id)
        except CorruptRecordError:
            forked = None  # an unreadable lineage must not keep the run from being erased
        removed = await self.kv.drop_scope(scope)
        conversation_id, parent_run_id = lineage
        if conversation_id is not None:
            await self.kv.delete(self.space.conversation_scope(conversation_id), run_id)
        if parent_run_id is not None:
            await self.kv.delete(self.space.parent_scope(parent_run_id), run_id)
        if forked is not None:
            await self.kv.delete(self.space.forks_scope(forked.source_run_id), run_id)
        indexed = await self.kv.delete(self.space.runs_scope, run_id)
        self.space.forget(run_id)
        if self._step_store is not None:
            self._step_store.forget(run_id)
        return removed > 0 or indexed

    @telemetry.traced("journal.bind_subject")
    async def bind_subject(self, run_id: str, subject: str) -> None:
        """Record that ``run_id`` belongs to ``subject``, so ``erase_subject`` deletes it.

        Call it before the run's first write. Raises
        :class:`~agent_stores.subjects.SubjectErasingError` while the subject is being
        erased. A step store's ``register_run`` does the same for a record whose
        ``metadata["subject"]`` is set; a run whose conversation id is one of the subject's
        sessions needs neither.
        """
        self.space.scope(run_id)  # validates the id
        await self.space.subjects.record(
            subject, SubjectEntry("run", self.space.scope_prefix, run_id)
        )
        # Also in the run itself, so a fork of it inherits the subject.
        await _fork.mark_subject(self.kv, self.space, run_id, subject)

    @telemetry.traced("journal.keep_latest_runs")
    async def keep_latest_runs(self, keep: int, *, conversation_prefix: str = "") -> RunRetention:
        """Retention: in every conversation keep its ``keep`` most recent runs, delete the rest.

        Runs are ordered by their first write (ties by id); runs registered without a
        conversation are left alone, so are conversations whose id does not start with
        ``conversation_prefix``. One walk over the run listing (a read per run for its
        conversation), then :meth:`delete_run` for each run past the limit: running it
        again after a crash finishes the work, and a second run deletes nothing.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1 (the latest run may still be running)")
        runs: dict[str, list[tuple[float, str]]] = {}
        start_after: str | None = None
        while True:
            page = await self.list_runs(start_after=start_after, limit=_RETENTION_PAGE)
            lineages = await bounded_gather(
                [partial(self._lineage, info.run_id) for info in page], 16
            )
            for info, (conversation_id, _) in zip(page, lineages, strict=True):
                if conversation_id is not None and conversation_id.startswith(conversation_prefix):
                    runs.setdefault(conversation_id, []).append((info.created_at, info.run_id))
            if len(page) < _RETENTION_PAGE:
                break
            start_after = page[-1].run_id
        removed: list[str] = []
        for listed in runs.values():
            for _, run_id in sorted(listed)[:-keep]:
                await self.delete_run(run_id)
                removed.append(run_id)
        kept = sum(min(len(listed), keep) for listed in runs.values())
        return RunRetention(tuple(removed), len(runs), kept)

    # -- forks ----------------------------------------------------------------------------

    @telemetry.traced("journal.fork_run")
    async def fork_run(
        self, run_id: str, *, new_run_id: str | None = None, at: int | str | None = None
    ) -> RunFork:
        """Start a new run from a point of ``run_id``, inheriting its effect knowledge.

        ``at`` is a snapshot position (as :meth:`KVStepStore.numbered_snapshots` and
        ``agent-stores runs URL show`` list them), a journal step id (the journal through
        that step's last entry), or None: the latest point (the newest snapshot,
        interrupted ones included, and the whole journal). ``new_run_id`` defaults to
        ``<run_id>.fork-<random>``. The fork holds the source's journal entries, snapshots,
        and the effect records and stored results of every tool call in its histories, so
        resuming it (``resume_run``, ``Replay``) replays done calls and stays latched on an
        uncertain one until someone decides, by the same rules as the source. Its lineage
        is recorded (:meth:`fork_of`, :meth:`list_forks`, the registration's metadata
        ``forked_from`` / ``fork_point``), and so are the source's subject, conversation
        and parent. The source is only read.

        Raises :class:`RunNotFoundError` for an unknown source,
        :class:`ForkPointError` for a point it does not have, :class:`RunExistsError` when
        ``new_run_id`` is taken, ``SubjectErasingError`` while the source's subject is
        being erased. Cut off midway, the fork is incomplete (``resume_run`` refuses it):
        call again with the same arguments to finish it.
        """
        return await _fork.fork_run(self, run_id, new_run_id=new_run_id, at=at)

    async def fork_of(self, run_id: str) -> ForkLineage | None:
        """Where ``run_id`` was forked from, or None when it is not a fork."""
        return await _fork.fork_lineage(self.kv, self.space, run_id)

    @telemetry.traced("journal.list_forks")
    async def list_forks(self, run_id: str) -> list[ForkLineage]:
        """The forks of ``run_id``, oldest first (incomplete ones included, flagged)."""
        return await _fork.list_forks(self.kv, self.space, run_id)

    async def _lineage(self, run_id: str) -> tuple[str | None, str | None]:
        """``(conversation_id, parent_run_id)`` of a registered run (read without the harness)."""
        entry = await self.kv.get(self.space.scope(run_id), "run")
        if entry is None:
            return None, None
        record = _decode_index(entry.value).get("record")
        if not isinstance(record, dict):
            return None, None
        conversation_id, parent_run_id = record.get("conversation_id"), record.get("parent_run_id")
        return (
            conversation_id if isinstance(conversation_id, str) else None,
            parent_run_id if isinstance(parent_run_id, str) else None,
        )


#: Runs listed per page by :meth:`Checkpointer.keep_latest_runs`.
_RETENTION_PAGE = 500


def _decode_index(value: bytes) -> dict[str, Any]:
    try:
        return decode_record(value, what="run record")
    except CorruptRecordError:
        return {}
