"""``KVStepStore``: the harness ``StepStore`` protocol on the KV CAS base class.

Every method of ``pydantic_ai_harness.step_persistence.StepStore`` (plus the
``list_snapshots`` the ``conversation_search`` capability reads), so
``StepPersistence(store=KVStepStore(...))`` and ``continue_run(store, run_id=...)`` work
unchanged on every backend. Layout (see :mod:`agent_stores.checkpointer.space`): all of a
run lives in the run's scope; lineage indexes live in their own scopes.

* ``append_event`` — one create under ``ev/<idempotency key>`` plus one CAS on the event
  counter: a retried event is suppressed by the store itself, concurrent appends are all
  kept, and the cost does not grow with the run.
* ``save_snapshot`` — each message is stored once per run (``m/<sha256>``) and a snapshot
  holds references; the snapshot record is created under its idempotency key (kept when the
  snapshot is pruned, so a replayed save stays suppressed); the ``sp`` pointer names the
  newest snapshot and the newest ``complete`` one, so ``latest_snapshot`` is three reads.
* ``record_tool_effect`` — an upsert of ``t/<tool_call_id>`` by CAS.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import datetime
from functools import partial
from typing import Any

from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai_harness.step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    StepEvent,
    ToolEffectRecord,
)

from .. import telemetry
from ..damage import ProblemLog
from ..errors import ConflictError, CorruptRecordError
from ..kv.base import KVStore
from ..lifecycle import KVBackedStore
from ..lru import LRU
from ..options import UNSET, renamed_option
from ..subjects import SubjectEntry
from .codec import canonical, decode_record, digest
from .errors import RunExistsError
from .port import JournalPort
from .space import (
    _BATCH,
    _CACHE_RUNS,
    DEFAULT_RUN_TTL_SECONDS,
    DEFAULT_SCOPE_PREFIX,
    MAX_ATTEMPTS,
    RunSpace,
    backoff,
    bounded_gather,
    scope_prefix_option,
)

_logger = logging.getLogger(__name__)

EVENTS_LOG = "ev"
SNAPSHOTS_LOG = "sn"
_POINTER = "sp"
_RUN = "run"
_MAX_IDENT = 200


#: The run metadata key naming the run's subject (see :mod:`agent_stores.subjects`).
SUBJECT_METADATA_KEY = "subject"


def _ident(key: str | None) -> str:
    """A key-safe identity: the caller's key (hashed when long), or a fresh random one."""
    if key is None:
        return f"u/{uuid.uuid4().hex}"
    if len(key) > _MAX_IDENT or "\x00" in key:
        return f"h/{digest(key.encode('utf-8', 'surrogatepass'))}"
    return f"k/{key}"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _dt(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"expected an ISO timestamp, got {value!r}")
    return datetime.fromisoformat(value)


def _opt(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"expected str|None, got {type(value).__name__}")
    return value


def _validate_max_snapshots(value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_snapshots_per_run must be an int >= 1 or None, got {value!r}")


# -- record <-> dict ----------------------------------------------------------------------


def run_to_dict(record: RunRecord) -> dict[str, Any]:
    return {
        "run_id": record.run_id,
        "conversation_id": record.conversation_id,
        "parent_run_id": record.parent_run_id,
        "agent_name": record.agent_name,
        "metadata": dict(record.metadata),
        "started_at": record.started_at.isoformat(),
        "registration_id": record.registration_id,
    }


def run_from_dict(data: dict[str, Any]) -> RunRecord:
    return RunRecord(
        run_id=str(data["run_id"]),
        conversation_id=_opt(data.get("conversation_id")),
        parent_run_id=_opt(data.get("parent_run_id")),
        agent_name=_opt(data.get("agent_name")),
        metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
        started_at=_dt(data["started_at"]),
        registration_id=_opt(data.get("registration_id")),
    )


def event_to_dict(event: StepEvent) -> dict[str, Any]:
    return {
        "run_id": event.run_id,
        "kind": event.kind,
        "step_index": event.step_index,
        "timestamp": event.timestamp.isoformat(),
        "conversation_id": event.conversation_id,
        "parent_run_id": event.parent_run_id,
        "agent_name": event.agent_name,
        "tool_call_id": event.tool_call_id,
        "tool_name": event.tool_name,
        "error": event.error,
        "metadata": dict(event.metadata),
        "idempotency_key": event.idempotency_key,
    }


def event_from_dict(data: dict[str, Any]) -> StepEvent:
    step_index = data["step_index"]
    if not isinstance(step_index, int):
        raise ValueError("step_index is not an int")
    return StepEvent(
        run_id=str(data["run_id"]),
        kind=data["kind"],
        step_index=step_index,
        timestamp=_dt(data["timestamp"]),
        conversation_id=_opt(data.get("conversation_id")),
        parent_run_id=_opt(data.get("parent_run_id")),
        agent_name=_opt(data.get("agent_name")),
        tool_call_id=_opt(data.get("tool_call_id")),
        tool_name=_opt(data.get("tool_name")),
        error=_opt(data.get("error")),
        metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
        idempotency_key=_opt(data.get("idempotency_key")),
    )


def effect_to_dict(record: ToolEffectRecord) -> dict[str, Any]:
    return {
        "tool_call_id": record.tool_call_id,
        "tool_name": record.tool_name,
        "run_id": record.run_id,
        "status": record.status,
        "started_at": record.started_at.isoformat(),
        "ended_at": _iso(record.ended_at),
        "idempotency_key": record.idempotency_key,
        "effect_summary": record.effect_summary,
    }


def effect_from_dict(data: dict[str, Any]) -> ToolEffectRecord:
    status = data["status"]
    if status not in ("started", "completed", "failed"):
        raise ValueError(f"unknown tool effect status {status!r}")
    ended = data.get("ended_at")
    return ToolEffectRecord(
        tool_call_id=str(data["tool_call_id"]),
        tool_name=str(data["tool_name"]),
        run_id=str(data["run_id"]),
        status=status,
        started_at=_dt(data["started_at"]),
        ended_at=_dt(ended) if ended is not None else None,
        idempotency_key=_opt(data.get("idempotency_key")),
        effect_summary=_opt(data.get("effect_summary")),
    )


def retained_seqs(live: list[tuple[int, str, str]], keep: int) -> set[int]:
    """The newest ``keep`` by position, plus the newest overall and the newest ``complete``.

    The last two keep both read modes of ``latest_snapshot`` served even when the newest
    ``keep`` snapshots are all interrupted (the harness's own retention rule).
    """
    if not live:
        return set()
    ordered = sorted(live)
    retained = {seq for seq, _, _ in ordered[-keep:]}
    retained.add(ordered[-1][0])
    complete = [seq for seq, _, state in ordered if state == "complete"]
    if complete:
        retained.add(complete[-1])
    return retained


class KVStepStore(KVBackedStore):
    """The harness ``StepStore`` (every method) on any agent-stores backend.

    ``KVStepStore(kv, *, owns_kv=False, scope_prefix="cp/", ttl_seconds=30 days,
    max_snapshots_per_run=None)``,
    or ``checkpointer.step_store()`` to share a :class:`Checkpointer`'s KV and caches.
    ``max_snapshots_per_run`` bounds retained snapshots per run with the harness's rule
    (use the same bound in every writer of a run).
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        owns_kv: bool = False,
        scope_prefix: str = DEFAULT_SCOPE_PREFIX,
        ttl_seconds: float | None = DEFAULT_RUN_TTL_SECONDS,
        max_snapshots_per_run: int | None = None,
        space: RunSpace | None = None,
        namespace: str = UNSET,
        ttl: float | None = UNSET,
        port: JournalPort | None = None,
    ) -> None:
        _validate_max_snapshots(max_snapshots_per_run)
        self.kv = kv
        self.owns_kv = owns_kv
        self.space = (
            space
            if space is not None
            else RunSpace(
                kv,
                scope_prefix=scope_prefix_option("KVStepStore", scope_prefix, namespace),
                ttl=renamed_option("KVStepStore", "ttl", ttl, "ttl_seconds", ttl_seconds),
                port=port,
            )
        )
        self.max_snapshots_per_run = max_snapshots_per_run
        self._known_messages: LRU[str, set[str]] = LRU(64)
        self._pointers: LRU[str, tuple[dict[str, Any], str]] = LRU(_CACHE_RUNS)
        self._effect_versions: LRU[tuple[str, str], str] = LRU(_CACHE_RUNS * 4)
        #: Records listings skipped because they cannot be decoded.
        self.problems = ProblemLog("runs")

    def __repr__(self) -> str:
        return f"<KVStepStore {self.kv.describe()} scope_prefix={self.space.scope_prefix!r}>"

    async def aclose(self) -> None:
        """Close the KV store when this store owns it."""
        if self.owns_kv:
            await self.kv.aclose()

    def forget(self, run_id: str) -> None:
        """Drop cached facts about ``run_id`` (after it was deleted)."""
        self._known_messages.pop(run_id)
        self._pointers.pop(run_id)
        self._effect_versions.discard_where(lambda key: key[0] == run_id)

    # -- runs ---------------------------------------------------------------------------

    @telemetry.traced("steps.register_run")
    async def register_run(self, record: RunRecord) -> None:
        """Record a run's lineage. Run ids are single-shot: a second registration raises
        :class:`RunExistsError` (a ``ValueError``); a retry of the same registration
        (same ``registration_id``, or an identical record) is a no-op."""
        run_id = record.run_id
        scope = self.space.scope(run_id)
        subject = record.metadata.get(SUBJECT_METADATA_KEY)
        if subject:
            # Before anything of the run is written (its listing entry too): an erase of
            # the subject finds it, and one under way refuses it.
            await self.space.subjects.record(
                subject, SubjectEntry("run", self.space.scope_prefix, run_id)
            )
        ttl = await self.space.write_ttl(run_id)
        data = run_to_dict(record)
        # Indexes first: a crash before the run record leaves an entry readers skip.
        marker = canonical({"started_at": data["started_at"]})
        for index_scope in self._index_scopes(record):
            try:
                await self.kv.create(index_scope, run_id, marker, ttl=ttl)
            except ConflictError:
                pass
        value = canonical({"v": 1, "record": data})
        for attempt in range(MAX_ATTEMPTS):
            try:
                await self.kv.create(scope, _RUN, value, ttl=ttl)
                return
            except ConflictError:
                entry = await self.kv.get(scope, _RUN)
                if entry is None:
                    await backoff(attempt)
                    continue
                existing = self._decode_run(entry.value, run_id)
                same_registration = (
                    record.registration_id is not None
                    and existing.registration_id == record.registration_id
                )
                if same_registration or run_to_dict(existing) == data:
                    return
                raise RunExistsError(
                    detail=(
                        f"run_id {run_id!r} is already registered; run ids are single-shot "
                        "(pass conversation_id= to Agent.run to group runs)"
                    )
                ) from None
        raise ConflictError(detail=f"could not register run {run_id!r}")  # pragma: no cover

    def _index_scopes(self, record: RunRecord) -> list[str]:
        scopes = []
        if record.conversation_id is not None:
            scopes.append(self.space.conversation_scope(record.conversation_id))
        if record.parent_run_id is not None:
            scopes.append(self.space.parent_scope(record.parent_run_id))
        return scopes

    @staticmethod
    def _decode_run(value: bytes, run_id: str) -> RunRecord:
        data = decode_record(value, what=f"run record of {run_id!r}")
        try:
            return run_from_dict(data["record"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(
                detail=f"run record of {run_id!r} cannot be decoded: {exc}"
            ) from exc

    @telemetry.traced("steps.get_run")
    async def get_run(self, *, run_id: str) -> RunRecord | None:
        """The registered run, or None."""
        entry = await self.kv.get(self.space.scope(run_id), _RUN)
        return self._decode_run(entry.value, run_id) if entry is not None else None

    @telemetry.traced("steps.list_runs")
    async def list_runs(
        self, *, parent_run_id: str | None = None, conversation_id: str | None = None
    ) -> list[RunRecord]:
        """Registered runs matching both filters, sorted by ``started_at`` ascending.

        Index entries are verified against each run's record, so dangling entries (a run
        deleted or a registration that crashed) are skipped.
        """
        if conversation_id is not None:
            index = self.space.conversation_scope(conversation_id)
        elif parent_run_id is not None:
            index = self.space.parent_scope(parent_run_id)
        else:
            index = self.space.runs_scope
        run_ids = [item.key async for item in self.kv.iter_scan(index, page_size=500, values=False)]

        async def readable(run_id: str) -> RunRecord | None:
            try:
                return await self.get_run(run_id=run_id)
            except CorruptRecordError as exc:
                self.problems.report(f"{self.space.scope(run_id)}/{_RUN}", exc)
                return None

        records = await bounded_gather([partial(readable, r) for r in run_ids], 16)
        matching = [
            r
            for r in records
            if r is not None
            and (parent_run_id is None or r.parent_run_id == parent_run_id)
            and (conversation_id is None or r.conversation_id == conversation_id)
        ]
        return sorted(matching, key=lambda r: r.started_at)

    # -- events -------------------------------------------------------------------------

    @telemetry.traced("steps.append_event")
    async def append_event(self, event: StepEvent) -> None:
        """Append an event; a repeated ``idempotency_key`` within the run is suppressed."""
        data = event_to_dict(event)
        await self.space.append_entry(
            event.run_id,
            EVENTS_LOG,
            f"{EVENTS_LOG}/{_ident(event.idempotency_key)}",
            lambda seq: {"v": 1, "seq": seq, "event": data},
            ("v", "seq"),
        )

    @telemetry.traced("steps.list_events")
    async def list_events(self, *, run_id: str) -> list[StepEvent]:
        """The run's events in append order (an undecodable one is skipped and reported)."""
        out: list[tuple[int, StepEvent]] = []
        scope = self.space.scope(run_id)
        async for item in self.kv.iter_scan(scope, prefix=f"{EVENTS_LOG}/", page_size=200):
            assert item.entry is not None
            what = f"step event {item.key!r} of run {run_id!r}"
            try:
                record = decode_record(item.entry.value, what=what)
                full = await self.space.unpack(run_id, record, what=what)
                out.append((int(full["seq"]), event_from_dict(full["event"])))
            except CorruptRecordError as exc:
                self.problems.report(f"{scope}/{item.key}", exc)
            except (KeyError, TypeError, ValueError) as exc:
                self.problems.report(f"{scope}/{item.key}", f"{what} cannot be decoded: {exc}")
        out.sort(key=lambda pair: pair[0])
        return [event for _, event in out]

    # -- snapshots ----------------------------------------------------------------------

    @telemetry.traced("steps.save_snapshot")
    async def save_snapshot(self, snapshot: ContinuableSnapshot) -> None:
        """Save a continuable snapshot; a repeated ``idempotency_key`` is suppressed,
        also after the first save was pruned."""
        run_id = snapshot.run_id
        messages_json: list[Any] = json.loads(ModelMessagesTypeAdapter.dump_json(snapshot.messages))
        refs = await self._store_messages(run_id, messages_json)
        ident = _ident(snapshot.idempotency_key)
        seq = await self.space.allocate(run_id, SNAPSHOTS_LOG)
        state = snapshot.state
        record = {
            "v": 1,
            "seq": seq,
            "state": state,
            "step_index": snapshot.step_index,
            "conversation_id": snapshot.conversation_id,
            "parent_run_id": snapshot.parent_run_id,
            "agent_name": snapshot.agent_name,
            "timestamp": snapshot.timestamp.isoformat(),
            "idempotency_key": snapshot.idempotency_key,
            "refs": refs,
        }
        created = await self.space.create_entry(
            run_id, f"{SNAPSHOTS_LOG}/{ident}", record, ("v", "seq", "state", "pruned")
        )
        if not created.created:
            await self.space.give_back(run_id, SNAPSHOTS_LOG, seq)
            if created.record.get("pruned"):
                return
            seq, state = int(created.record["seq"]), str(created.record["state"])
        # Also on a duplicate: a save whose pointer update was lost is repaired by its retry.
        await self._advance_pointer(run_id, seq, ident, state)

    async def _store_messages(self, run_id: str, messages: list[Any]) -> list[str]:
        known = self._known_messages.get(run_id)
        if known is None:
            known = set()
            self._known_messages.set(run_id, known)
        refs: list[str] = []
        new: dict[str, Any] = {}
        for message in messages:
            ref = digest(canonical(message))
            refs.append(ref)
            if ref not in known:
                new[ref] = message
        if new:
            scope = self.space.scope(run_id)
            ttl = await self.space.write_ttl(run_id)

            async def put(ref: str, message: Any) -> None:
                value = await self.space.pack(run_id, {"msg": message}, (), ttl)
                try:
                    await self.kv.create(scope, f"m/{ref}", value, ttl=ttl)
                except ConflictError:
                    pass  # content-addressed: already stored

            await bounded_gather([partial(put, r, m) for r, m in new.items()], 16)
            known.update(new)
        return refs

    async def _load_messages(self, run_id: str, refs: list[str]) -> dict[str, Any]:
        scope = self.space.scope(run_id)
        unique = list(dict.fromkeys(refs))
        keys = [f"m/{ref}" for ref in unique]
        found = {}
        for start in range(0, len(keys), _BATCH):
            found.update(await self.kv.get_many(scope, keys[start : start + _BATCH]))
        out: dict[str, Any] = {}
        for ref, key in zip(unique, keys, strict=True):
            entry = found.get(key)
            if entry is None:
                raise CorruptRecordError(
                    detail=f"run {run_id!r}: snapshot message {ref[:12]}… is missing"
                )
            record = decode_record(entry.value, what=f"message {ref[:12]}…")
            out[ref] = (await self.space.unpack(run_id, record, what=f"message {ref[:12]}…"))["msg"]
        return out

    async def _read_pointer(self, run_id: str) -> tuple[dict[str, Any], str | None]:
        entry = await self.kv.get(self.space.scope(run_id), _POINTER)
        if entry is None:
            return {"latest": None, "complete": None, "live": None}, None
        return decode_record(entry.value, what=f"snapshot pointer of {run_id!r}"), entry.version

    async def _advance_pointer(self, run_id: str, seq: int, ident: str, state: str) -> None:
        """Point the run's ``sp`` pointer at snapshot ``seq`` where it is newer, by CAS;
        then prune the snapshots the retention bound no longer keeps."""
        for attempt in range(MAX_ATTEMPTS):
            pointer, version = await self._known_pointer(run_id)
            new, dropped = self._advanced(pointer, seq, ident, state)
            if new == pointer and version is not None:
                return
            try:
                new_version = await self._write_pointer(run_id, new, version)
            except ConflictError:
                self._pointers.pop(run_id)
                await backoff(attempt)
                continue
            self._pointers.set(run_id, (new, new_version))
            for item in dropped:
                await self._prune(run_id, item)
            return
        raise ConflictError(
            detail=f"could not update the snapshot pointer of run {run_id!r}"
        )  # pragma: no cover

    async def _known_pointer(self, run_id: str) -> tuple[dict[str, Any], str | None]:
        """The pointer this store last wrote (a lost CAS drops it), else the stored one."""
        cached = self._pointers.get(run_id)
        if cached is None:
            return await self._read_pointer(run_id)
        return cached

    def _advanced(
        self, pointer: dict[str, Any], seq: int, ident: str, state: str
    ) -> tuple[dict[str, Any], list[tuple[int, str, str]]]:
        """``pointer`` with snapshot ``seq`` taken in, and the snapshots it no longer retains."""
        live_raw = pointer.get("live")
        live: list[tuple[int, str, str]] | None = (
            [(int(s), str(i), str(st)) for s, i, st in live_raw] if live_raw is not None else None
        )
        new = dict(pointer)
        latest = pointer.get("latest")
        if latest is None or seq > int(latest[0]):
            new["latest"] = [seq, ident, state]
        complete = pointer.get("complete")
        if state == "complete" and (complete is None or seq > int(complete[0])):
            new["complete"] = [seq, ident]
        retained, dropped = self._retain(live, (seq, ident, state))
        if retained is not None:
            new["live"] = [list(item) for item in sorted(retained)]
        return new, dropped

    def _retain(
        self, live: list[tuple[int, str, str]] | None, added: tuple[int, str, str]
    ) -> tuple[list[tuple[int, str, str]] | None, list[tuple[int, str, str]]]:
        """The live snapshots with ``added`` among them, split into retained and dropped.

        Unbounded runs whose pointer never listed live snapshots keep no list (None).
        """
        bound = self.max_snapshots_per_run
        if bound is None and live is None:
            return None, []
        live = list(live or [])
        if added[0] not in {s for s, _, _ in live}:
            live.append(added)
        if bound is None:
            return live, []
        keep = retained_seqs(live, bound)
        return [item for item in live if item[0] in keep], [
            item for item in live if item[0] not in keep
        ]

    async def _write_pointer(
        self, run_id: str, pointer: dict[str, Any], version: str | None
    ) -> str:
        """Create the pointer (``version`` None) or replace that version of it; its new version."""
        scope = self.space.scope(run_id)
        value = canonical(pointer)
        ttl = await self.space.write_ttl(run_id)
        if version is None:
            return await self.kv.create(scope, _POINTER, value, ttl=ttl)
        return await self.kv.replace(scope, _POINTER, value, expected_version=version, ttl=ttl)

    async def _prune(self, run_id: str, item: tuple[int, str, str]) -> None:
        """Replace a snapshot by a tombstone that keeps its idempotency key claimed."""
        scope = self.space.scope(run_id)
        key = f"{SNAPSHOTS_LOG}/{item[1]}"
        entry = await self.kv.get(scope, key)
        if entry is None:
            return
        tombstone = canonical({"v": 1, "seq": item[0], "state": item[2], "pruned": True})
        try:
            await self.kv.replace(
                scope,
                key,
                tombstone,
                expected_version=entry.version,
                ttl=await self.space.write_ttl(run_id),
            )
        except ConflictError:
            pass  # pruned concurrently

    async def _snapshot_from(self, run_id: str, record: dict[str, Any]) -> ContinuableSnapshot:
        refs = [str(r) for r in record["refs"]]
        stored = await self._load_messages(run_id, refs)
        messages = ModelMessagesTypeAdapter.validate_python([stored[r] for r in refs])
        return ContinuableSnapshot(
            run_id=run_id,
            step_index=int(record["step_index"]),
            messages=messages,
            conversation_id=_opt(record.get("conversation_id")),
            parent_run_id=_opt(record.get("parent_run_id")),
            agent_name=_opt(record.get("agent_name")),
            timestamp=_dt(record["timestamp"]),
            state=record["state"],
            idempotency_key=_opt(record.get("idempotency_key")),
        )

    @telemetry.traced("steps.latest_snapshot")
    async def latest_snapshot(
        self, *, run_id: str, include_interrupted: bool = False
    ) -> ContinuableSnapshot | None:
        """The newest ``complete`` snapshot (newest of any state with ``include_interrupted``)."""
        scope = self.space.scope(run_id)
        for attempt in range(8):
            pointer, version = await self._read_pointer(run_id)
            target = pointer.get("latest") if include_interrupted else pointer.get("complete")
            if version is None or target is None:
                return None
            entry = await self.kv.get(scope, f"{SNAPSHOTS_LOG}/{target[1]}")
            if entry is None:
                return None
            record = decode_record(entry.value, what=f"snapshot of {run_id!r}")
            if record.get("pruned"):  # pruned after we read the pointer: read it again
                await backoff(attempt)
                continue
            record = await self.space.unpack(run_id, record, what=f"snapshot of {run_id!r}")
            return await self._snapshot_from(run_id, record)
        return None  # pragma: no cover

    @telemetry.traced("steps.list_snapshots")
    async def list_snapshots(
        self, *, run_id: str, include_interrupted: bool = False
    ) -> list[ContinuableSnapshot]:
        """Retained snapshots in write order (``complete`` only unless ``include_interrupted``).

        Not part of the ``StepStore`` protocol: the ``conversation_search`` capability reads
        it. A snapshot that cannot be decoded is skipped and logged.
        """
        numbered = await self.numbered_snapshots(
            run_id=run_id, include_interrupted=include_interrupted
        )
        return [snapshot for _, snapshot in numbered]

    @telemetry.traced("steps.numbered_snapshots")
    async def numbered_snapshots(
        self, *, run_id: str, include_interrupted: bool = False
    ) -> list[tuple[int, ContinuableSnapshot]]:
        """:meth:`list_snapshots` with each snapshot's position in the run's snapshot log.

        A position never changes and is never reused, so it names a point of the run
        (``Checkpointer.fork_run(run_id, at=position)``); pruning leaves gaps.
        """
        pointer, _ = await self._read_pointer(run_id)
        live = pointer.get("live")
        live_seqs = {int(item[0]) for item in live} if live is not None else None
        candidates: list[tuple[int, dict[str, Any]]] = []
        for key, record, _ in await self.space.scan_records(run_id, f"{SNAPSHOTS_LOG}/"):
            if record.get("pruned"):
                continue
            seq = int(record["seq"])
            if live_seqs is not None and seq not in live_seqs:
                continue
            if record.get("state") != "complete" and not include_interrupted:
                continue
            try:
                record = await self.space.unpack(run_id, record, what=f"snapshot {key!r}")
            except CorruptRecordError:
                _logger.warning(
                    "skipping unreadable snapshot %r of run %r", key, run_id, exc_info=True
                )
                continue
            candidates.append((seq, record))
        candidates.sort(key=lambda pair: pair[0])
        out: list[tuple[int, ContinuableSnapshot]] = []
        for seq, record in candidates:
            try:
                out.append((seq, await self._snapshot_from(run_id, record)))
            except Exception:
                _logger.warning("skipping unparsable snapshot of run %r", run_id, exc_info=True)
        return out

    # -- tool effects -------------------------------------------------------------------

    @telemetry.traced("steps.record_tool_effect")
    async def record_tool_effect(self, record: ToolEffectRecord) -> None:
        """Insert or replace the effect record of ``(run_id, tool_call_id)``."""
        run_id = record.run_id
        scope = self.space.scope(run_id)
        key = f"t/{_ident(record.tool_call_id)}"
        cache_key = (run_id, record.tool_call_id)
        ttl = await self.space.write_ttl(run_id)
        value = await self.space.pack(run_id, {"v": 1, "effect": effect_to_dict(record)}, (), ttl)
        for attempt in range(MAX_ATTEMPTS):
            version = self._effect_versions.get(cache_key)
            try:
                if version is None:
                    new_version = await self.kv.create(scope, key, value, ttl=ttl)
                else:
                    new_version = await self.kv.replace(
                        scope, key, value, expected_version=version, ttl=ttl
                    )
            except ConflictError:
                entry = await self.kv.get(scope, key)
                if entry is None:
                    self._effect_versions.pop(cache_key)
                else:
                    self._effect_versions.set(cache_key, entry.version)
                if attempt:
                    await backoff(attempt)
                continue
            self._effect_versions.set(cache_key, new_version)
            return
        raise ConflictError(
            detail=f"could not record tool effect in run {run_id!r}"
        )  # pragma: no cover

    async def _decode_effect(self, run_id: str, value: bytes) -> ToolEffectRecord:
        record = decode_record(value, what=f"tool effect of {run_id!r}")
        record = await self.space.unpack(run_id, record, what=f"tool effect of {run_id!r}")
        try:
            return effect_from_dict(record["effect"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptRecordError(
                detail=f"tool effect of {run_id!r} cannot be decoded: {exc}"
            ) from exc

    @telemetry.traced("steps.get_tool_effect")
    async def get_tool_effect(self, *, run_id: str, tool_call_id: str) -> ToolEffectRecord | None:
        """The latest effect record of a tool call, or None."""
        entry = await self.kv.get(self.space.scope(run_id), f"t/{_ident(tool_call_id)}")
        if entry is None:
            return None
        self._effect_versions.set((run_id, tool_call_id), entry.version)
        return await self._decode_effect(run_id, entry.value)

    @telemetry.traced("steps.list_unresolved_tool_effects")
    async def list_unresolved_tool_effects(self, *, run_id: str) -> list[ToolEffectRecord]:
        """Effect records whose latest status is ``started`` (in flight at the last write)."""
        out: list[ToolEffectRecord] = []
        async for item in self.kv.iter_scan(self.space.scope(run_id), prefix="t/", page_size=200):
            assert item.entry is not None
            effect = await self._decode_effect(run_id, item.entry.value)
            if effect.status == "started":
                out.append(effect)
        return out
