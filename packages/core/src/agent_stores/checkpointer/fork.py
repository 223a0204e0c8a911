"""Fork a run: a new run from a point of an old one, inheriting what it knew of its effects.

:meth:`Checkpointer.fork_run(run_id, new_run_id=None, at=None)
<agent_stores.checkpointer.Checkpointer.fork_run>` copies the source's state up to a
point into a new run and records the lineage. The fork holds:

* the journal entries up to the point (``at=`` a step id: through that step's last
  entry), at the source's positions, so :class:`~.replay.Replay` on the fork answers as
  it answered on the source: a done step is ``DONE`` (its recorded result is reused), an
  intent without a result is ``UNCERTAIN`` (resolving it raises
  :class:`~.errors.UncertainEffect`);
* the harness snapshots up to the point (``at=`` a snapshot position), and, for every
  tool call in those histories, the source's effect record and stored result, *whenever*
  the source learnt them: a call the fork's history made was made once, in the world,
  and its outcome is a fact the fork must respect. :func:`~.resume.plan_resume` on the
  fork therefore replays a done call's result and refuses an uncertain one until someone
  decides, with the very function it applies to the source
  (:func:`~.resume.effect_knowledge`). A call made after the point is not the fork's:
  should the forked run decide to call the tool again, that is a new decision and runs.

Nothing of the source is written. The fork's ``fork`` record (its lineage) is created
first and marked complete last, so a fork cut off midway is recognisable: resuming it
raises :class:`~.errors.ForkIncompleteError`, and ``fork_run`` called again with the same
arguments finishes it. Step events (the source's audit log) are not copied.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, CorruptRecordError
from ..kv.base import KVStore
from ..subjects import SubjectEntry
from .codec import canonical, decode_record, digest
from .errors import ForkIncompleteError, ForkPointError, RunExistsError, RunNotFoundError
from .replay import Replay, ReplayState
from .space import MAX_ATTEMPTS, RunSpace, backoff, bounded_gather
from .types import RunState

if TYPE_CHECKING:
    from pydantic_ai_harness.step_persistence import ContinuableSnapshot

    from .journal import Checkpointer
    from .resume import ResumedCall
    from .step_store import KVStepStore

_logger = logging.getLogger(__name__)

#: The key, in a fork's scope, of its lineage record.
FORK_KEY = "fork"
#: Keys, in a run's scope, naming the subjects it was bound to (see ``bind_subject``).
SUBJECT_MARK_PREFIX = "subject/"
_JOURNAL_LOG = "j"
_POINTER = "sp"
_RUN = "run"
_SUBJECT_METADATA_KEY = "subject"


@dataclass(frozen=True, slots=True)
class ForkPoint:
    """How much of its source a fork holds."""

    snapshot: int | None = None
    """Position, in the source's snapshot log, of the snapshot whose history is the fork's
    (earlier snapshots are copied too); None when no snapshot was copied."""
    journal_seq: int | None = None
    """The source's journal entries at positions up to this one are the fork's; None: none."""
    step_id: str | None = None
    """The journal step ``at=`` named, when it named one."""

    def describe(self) -> str:
        """``snapshot 4``, ``step 000003-tool``, ``journal 12, snapshot 4`` or ``start``."""
        parts = []
        if self.step_id is not None:
            parts.append(f"step {self.step_id}")
        elif self.journal_seq is not None:
            parts.append(f"journal {self.journal_seq}")
        if self.snapshot is not None:
            parts.append(f"snapshot {self.snapshot}")
        return ", ".join(parts) or "start"

    def to_record(self) -> dict[str, Any]:
        return {"snapshot": self.snapshot, "journal_seq": self.journal_seq, "step_id": self.step_id}

    @classmethod
    def from_record(cls, data: Any) -> ForkPoint:
        if not isinstance(data, dict):
            raise ValueError("the fork point is not an object")
        snapshot, seq, step = data.get("snapshot"), data.get("journal_seq"), data.get("step_id")
        if not (snapshot is None or isinstance(snapshot, int)):
            raise ValueError(f"bad snapshot position {snapshot!r}")
        if not (seq is None or isinstance(seq, int)):
            raise ValueError(f"bad journal position {seq!r}")
        if not (step is None or isinstance(step, str)):
            raise ValueError(f"bad step id {step!r}")
        return cls(snapshot, seq, step)


@dataclass(frozen=True, slots=True)
class ForkLineage:
    """Where a fork came from (its ``fork`` record)."""

    run_id: str
    """The fork."""
    source_run_id: str
    point: ForkPoint
    created_at: float
    """When the fork began (the store's clock)."""
    complete: bool
    """False while the copy runs, or when it was cut off (run ``fork_run`` again)."""
    subjects: tuple[str, ...] = ()
    """The subjects the fork inherited from its source."""
    requested: int | str | None = None
    """The ``at=`` the fork was asked for (``point`` is what it resolved to)."""


@dataclass(frozen=True, slots=True)
class RunFork:
    """What :meth:`Checkpointer.fork_run` made."""

    run_id: str
    """The new run."""
    source_run_id: str
    point: ForkPoint
    journal_entries: int
    """Journal entries copied."""
    snapshots: int
    """Snapshots copied (the fork's history is the newest)."""
    tool_effects: int
    """Tool effect records copied (calls of the copied histories)."""
    calls: tuple[ResumedCall, ...] = ()
    """The calls open at the fork point, with what the fork knows of them (as resume
    sees them): ``done`` ones are replayed, ``uncertain`` ones latch the fork."""
    uncertain_steps: tuple[str, ...] = ()
    """Journal steps attempted without a result (not idempotent): they latch the fork."""

    @property
    def latched(self) -> tuple[str, ...]:
        """Tool call ids and journal step ids whose outcome is uncertain: resuming the fork
        raises :class:`~.errors.UncertainEffect` for each until someone decides."""
        uncertain = (c.tool_call_id for c in self.calls if c.state is ReplayState.UNCERTAIN)
        return (*uncertain, *self.uncertain_steps)


def subject_mark_key(subject: str) -> str:
    """The key, in a run's scope, recording that the run is bound to ``subject``."""
    return SUBJECT_MARK_PREFIX + digest(subject.encode("utf-8", "surrogatepass"))


async def mark_subject(kv: KVStore, space: RunSpace, run_id: str, subject: str) -> None:
    """Record in the run itself that it belongs to ``subject`` (a fork reads it to inherit
    the subject; the subject's own scope lists the run for erasure)."""
    scope = space.scope(run_id)
    try:
        await kv.create(
            scope,
            subject_mark_key(subject),
            canonical({"subject": subject}),
            ttl=await space.write_ttl(run_id),
        )
    except ConflictError:
        pass  # bound already


async def run_subjects(kv: KVStore, space: RunSpace, run_id: str) -> tuple[str, ...]:
    """The subjects ``run_id`` belongs to: its registration's and the ones it was bound to."""
    scope = space.scope(run_id)
    subjects: dict[str, None] = {}
    entry = await kv.get(scope, _RUN)
    if entry is not None:
        record = decode_record(entry.value, what=f"run record of {run_id!r}").get("record")
        metadata = record.get("metadata") if isinstance(record, dict) else None
        subject = metadata.get(_SUBJECT_METADATA_KEY) if isinstance(metadata, dict) else None
        if isinstance(subject, str) and subject:
            subjects[subject] = None
    async for item in kv.iter_scan(scope, prefix=SUBJECT_MARK_PREFIX):
        assert item.entry is not None
        bound = decode_record(item.entry.value, what=f"subject of run {run_id!r}").get("subject")
        if isinstance(bound, str) and bound:
            subjects[bound] = None
    return tuple(subjects)


def _lineage_from(run_id: str, data: dict[str, Any]) -> ForkLineage:
    try:
        source = data["source"]
        if not isinstance(source, str):
            raise ValueError("the source is not a run id")
        subjects = data.get("subjects") or []
        requested = data.get("at")
        if isinstance(requested, bool) or not (
            requested is None or isinstance(requested, int | str)
        ):
            raise ValueError(f"bad requested point {requested!r}")
        return ForkLineage(
            run_id=run_id,
            source_run_id=source,
            point=ForkPoint.from_record(data.get("point")),
            created_at=float(data["created_at"]),
            complete=bool(data.get("complete")),
            subjects=tuple(str(s) for s in subjects),
            requested=requested,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecordError(
            detail=f"fork record of run {run_id!r} cannot be decoded: {exc}"
        ) from exc


async def fork_lineage(kv: KVStore, space: RunSpace, run_id: str) -> ForkLineage | None:
    """The lineage of ``run_id`` when it is a fork, else None (one read)."""
    entry = await kv.get(space.scope(run_id), FORK_KEY)
    if entry is None:
        return None
    return _lineage_from(run_id, decode_record(entry.value, what=f"fork record of {run_id!r}"))


async def list_forks(kv: KVStore, space: RunSpace, run_id: str) -> list[ForkLineage]:
    """The forks of ``run_id`` in the order they began; each index entry is verified
    against the fork's own record (an entry left by a deleted fork is skipped)."""
    ids = [item.key async for item in kv.iter_scan(space.forks_scope(run_id), values=False)]

    async def readable(fork_id: str) -> ForkLineage | None:
        try:
            return await fork_lineage(kv, space, fork_id)
        except CorruptRecordError:
            _logger.warning("skipping unreadable fork record of run %r", fork_id, exc_info=True)
            return None

    found = await bounded_gather([partial(readable, f) for f in ids], 16)
    forks = [f for f in found if f is not None and f.source_run_id == run_id]
    return sorted(forks, key=lambda f: (f.created_at, f.run_id))


async def fork_run(
    checkpointer: Checkpointer,
    run_id: str,
    *,
    new_run_id: str | None = None,
    at: int | str | None = None,
) -> RunFork:
    """Fork ``run_id``; see :meth:`Checkpointer.fork_run`."""
    if isinstance(at, bool) or not (at is None or isinstance(at, int | str)):
        raise TypeError(
            f"at= is a snapshot position (int), a journal step id (str) or None, got {at!r}"
        )
    kv, space = checkpointer.kv, checkpointer.space
    fork_id = await _fork_id(checkpointer, run_id, new_run_id)
    steps = _step_store(checkpointer)
    reads = _SourceReads()
    # The fork's claim is its plan: a retry of an interrupted fork finds it and copies
    # what it names, so it never plans twice (the source may have moved on since).
    lineage = await fork_lineage(kv, space, fork_id)
    if lineage is None:
        lineage = await _plan_fork(checkpointer, steps, run_id, fork_id, at, reads)
    _check_same_fork(lineage, run_id, at)
    point = lineage.point
    journal = await _copy_fork_journal(checkpointer, run_id, fork_id, point, reads)
    snapshots, effects, calls = await _copy_fork_snapshots(
        checkpointer, steps, run_id, fork_id, point, reads
    )
    await _finish_fork(checkpointer, steps, run_id, fork_id, lineage)
    uncertain: tuple[str, ...] = ()
    if reads.state is not None and point.journal_seq is not None:
        uncertain = _uncertain_steps(fork_id, reads.state, point.journal_seq)
    return RunFork(
        run_id=fork_id,
        source_run_id=run_id,
        point=point,
        journal_entries=journal,
        snapshots=snapshots,
        tool_effects=effects,
        calls=calls,
        uncertain_steps=uncertain,
    )


@dataclass
class _SourceReads:
    """What a fork read of its source run so far, so that no step of it reads it twice."""

    state: RunState | None = None
    numbered: list[tuple[int, ContinuableSnapshot]] | None = None


async def _fork_id(checkpointer: Checkpointer, run_id: str, new_run_id: str | None) -> str:
    """The id of a fork of ``run_id`` (``new_run_id``, else a fresh one), once both ids
    are checked and the source is found to be a run that can be forked."""
    kv, space = checkpointer.kv, checkpointer.space
    space.scope(run_id)  # validates the id
    fork_id = new_run_id if new_run_id is not None else f"{run_id}.fork-{uuid.uuid4().hex[:12]}"
    space.scope(fork_id)
    if fork_id == run_id:
        raise RunExistsError(detail=f"a fork of {run_id!r} needs a run id of its own")
    if await checkpointer.get_run_info(run_id) is None:
        raise RunNotFoundError(detail=f"there is no run {run_id!r} to fork")
    source = await fork_lineage(kv, space, run_id)
    if source is not None and not source.complete:
        # Its effect knowledge may be partial: a fork of it would pass for complete.
        raise ForkIncompleteError(
            detail=f"run {run_id!r} is a fork of {source.source_run_id!r} whose copy did not "
            "finish: run fork_run on it again with the same arguments first"
        )
    return fork_id


async def _plan_fork(
    checkpointer: Checkpointer,
    steps: KVStepStore | None,
    run_id: str,
    fork_id: str,
    at: int | str | None,
    reads: _SourceReads,
) -> ForkLineage:
    """Resolve ``at`` in the source and claim ``fork_id`` for the fork (its first write)."""
    kv, space = checkpointer.kv, checkpointer.space
    if await checkpointer.get_run_info(fork_id) is not None:
        raise RunExistsError(detail=f"run {fork_id!r} already exists; a fork needs a new run id")
    if at is None or isinstance(at, str):
        reads.state = await checkpointer.load(run_id)
    if at is None or isinstance(at, int):
        reads.numbered = await _numbered(checkpointer, steps, run_id)
    point = _resolve(run_id, at, reads.state, reads.numbered)
    subjects = await run_subjects(kv, space, run_id)
    # Before the fork's first write: an erase of the subject under way refuses the
    # fork, and one that starts later finds it.
    for subject in subjects:
        await space.subjects.record(subject, SubjectEntry("run", space.scope_prefix, fork_id))
    return await _claim(checkpointer, fork_id, run_id, at, point, subjects)


async def _copy_fork_journal(
    checkpointer: Checkpointer, run_id: str, fork_id: str, point: ForkPoint, reads: _SourceReads
) -> int:
    """Copy the source's journal up to the fork point; the entries copied."""
    if point.journal_seq is None:
        return 0
    if reads.state is None:
        reads.state = await checkpointer.load(run_id)
    return await _copy_journal(checkpointer, fork_id, reads.state, point.journal_seq)


async def _copy_fork_snapshots(
    checkpointer: Checkpointer,
    steps: KVStepStore | None,
    run_id: str,
    fork_id: str,
    point: ForkPoint,
    reads: _SourceReads,
) -> tuple[int, int, tuple[ResumedCall, ...]]:
    """Copy the source's snapshots up to the fork point: (snapshots, tool effects, calls)."""
    if point.snapshot is None:
        return 0, 0, ()
    if reads.numbered is None:
        reads.numbered = await _numbered(checkpointer, steps, run_id)
    assert steps is not None  # _numbered raised otherwise
    if point.snapshot not in {n for n, _ in reads.numbered}:  # pruned since the fork began
        raise ForkPointError(
            detail=f"snapshot {point.snapshot} of run {run_id!r} is gone; delete the "
            f"incomplete fork {fork_id!r} and fork again"
        )
    return await _copy_steps(steps, run_id, fork_id, reads.numbered, point.snapshot)


async def _finish_fork(
    checkpointer: Checkpointer,
    steps: KVStepStore | None,
    run_id: str,
    fork_id: str,
    lineage: ForkLineage,
) -> None:
    """Once everything is copied: mark the fork's subjects, list it under its source and
    register it with the step store, then mark its record complete (last, so an
    interrupted fork is never taken for a finished one)."""
    kv, space = checkpointer.kv, checkpointer.space
    for subject in lineage.subjects:
        await mark_subject(kv, space, fork_id, subject)
    try:
        await kv.create(
            space.forks_scope(run_id),
            fork_id,
            canonical({"created_at": lineage.created_at}),
            ttl=await space.write_ttl(fork_id),
        )
    except ConflictError:
        pass  # listed by an earlier attempt
    if steps is not None:
        await _register(steps, run_id, fork_id, lineage)
    await _complete(kv, space, fork_id)


def _step_store(checkpointer: Checkpointer) -> KVStepStore | None:
    try:
        return checkpointer.step_store()
    except ImportError:  # the harness extra is not installed: a journal-only run
        return None


async def _numbered(
    checkpointer: Checkpointer, steps: KVStepStore | None, run_id: str
) -> list[tuple[int, ContinuableSnapshot]]:
    if steps is None:
        if await checkpointer.kv.get(checkpointer.space.scope(run_id), _POINTER) is not None:
            raise ImportError(
                f"run {run_id!r} has snapshots: forking it needs the harness extra "
                "(pip install 'agent-stores[harness]')"
            )
        return []
    return await steps.numbered_snapshots(run_id=run_id, include_interrupted=True)


def _resolve(
    run_id: str,
    at: int | str | None,
    state: RunState | None,
    numbered: Sequence[tuple[int, ContinuableSnapshot]] | None,
) -> ForkPoint:
    """The concrete point ``at`` names in the source (None: its latest)."""
    if isinstance(at, str):
        assert state is not None
        seqs = [e.seq for e in state.entries if e.step_id == at]
        if not seqs:
            raise ForkPointError(detail=f"run {run_id!r} has no journal step {at!r}")
        return ForkPoint(journal_seq=max(seqs), step_id=at)
    assert numbered is not None
    positions = [n for n, _ in numbered]
    if isinstance(at, int):
        if at not in positions:
            raise ForkPointError(
                detail=f"run {run_id!r} has no snapshot at position {at} "
                f"(it has {positions or 'none'}; `agent-stores runs URL show RUN` lists them)"
            )
        return ForkPoint(snapshot=at)
    assert state is not None
    return ForkPoint(
        snapshot=positions[-1] if positions else None,
        journal_seq=state.entries[-1].seq if state.entries else None,
    )


async def _claim(
    checkpointer: Checkpointer,
    fork_id: str,
    source: str,
    at: int | str | None,
    point: ForkPoint,
    subjects: tuple[str, ...],
) -> ForkLineage:
    """Create the fork's ``fork`` record, incomplete: its first write. Another fork racing
    for the id is found by the create's conflict."""
    record = {
        "v": 1,
        "source": source,
        "at": at,
        "point": point.to_record(),
        "subjects": list(subjects),
        "created_at": checkpointer.kv.clock(),
        "complete": False,
    }
    space = checkpointer.space
    scope = space.scope(fork_id)
    for attempt in range(MAX_ATTEMPTS):
        try:
            await checkpointer.kv.create(
                scope, FORK_KEY, canonical(record), ttl=await space.write_ttl(fork_id)
            )
            return _lineage_from(fork_id, record)
        except ConflictError:
            found = await fork_lineage(checkpointer.kv, space, fork_id)
            if found is not None:
                return found
            await backoff(attempt)  # deleted in between: claim it again
    raise ConflictError(  # pragma: no cover
        detail=f"could not claim run id {fork_id!r} for a fork", scope=scope, key=FORK_KEY
    )


def _check_same_fork(lineage: ForkLineage, source: str, at: int | str | None) -> None:
    """A claim found in place must be this fork's (a retry), not another one's."""
    if lineage.source_run_id != source or lineage.requested != at:
        raise RunExistsError(
            detail=f"run {lineage.run_id!r} is already a fork of {lineage.source_run_id!r} at "
            f"{lineage.point.describe()}; a fork needs a new run id"
        )


async def _copy_journal(
    checkpointer: Checkpointer, fork_id: str, state: RunState, through: int
) -> int:
    """The source's entries up to position ``through``, at their own positions."""
    entries = [e for e in state.entries if e.seq <= through]
    # The counter first: an append to the fork lands after the copied entries.
    await checkpointer.space.ensure_next(fork_id, _JOURNAL_LOG, through + 1)
    await bounded_gather(
        [partial(checkpointer.append_at, fork_id, e.event, e.seq) for e in entries], 16
    )
    return len(entries)


def _uncertain_steps(fork_id: str, state: RunState, through: int) -> tuple[str, ...]:
    """Steps of the copied prefix that resume would refuse (Replay's own rule)."""
    prefix = RunState(fork_id, tuple(e for e in state.entries if e.seq <= through))
    replay = Replay(prefix)
    return tuple(
        step
        for step in prefix.uncertain_steps()
        if replay.classify(step).state is ReplayState.UNCERTAIN
    )


async def _copy_steps(
    steps: KVStepStore,
    source: str,
    fork_id: str,
    numbered: Sequence[tuple[int, ContinuableSnapshot]],
    through: int,
) -> tuple[int, int, tuple[ResumedCall, ...]]:
    """Snapshots up to position ``through``, and the effect knowledge of their calls.

    Returns (snapshots, effect records copied, the open calls at the point as the fork
    knows them).
    """
    from pydantic_ai.messages import ModelResponse

    from .resume import effect_knowledge, frontier, load_tool_result, save_tool_result

    chosen = [(n, s) for n, s in numbered if n <= through]
    call_ids = {
        call.tool_call_id: None
        for _, snapshot in chosen
        for message in snapshot.messages
        if isinstance(message, ModelResponse)
        for call in message.tool_calls
    }

    async def copy_call(tool_call_id: str) -> bool:
        result = await load_tool_result(steps, source, tool_call_id)
        if result is not None:
            await save_tool_result(steps, fork_id, result)
        effect = await steps.get_tool_effect(run_id=source, tool_call_id=tool_call_id)
        if effect is None:
            return False
        await steps.record_tool_effect(replace(effect, run_id=fork_id))
        return True

    # The knowledge first: no snapshot of the fork names a call before the fork knows
    # what the source knows of it.
    effects = sum(await bounded_gather([partial(copy_call, c) for c in call_ids], 16))
    for position, snapshot in chosen:
        # In order, one at a time: a retry after a failure rewrites from there on, and
        # suppresses what had landed by the snapshot's idempotency key.
        key = snapshot.idempotency_key or f"fork:{position}"
        await steps.save_snapshot(replace(snapshot, run_id=fork_id, idempotency_key=key))
    if not chosen:
        return 0, effects, ()
    at = frontier(chosen[-1][1].messages)
    calls = await effect_knowledge(steps, fork_id, at.open) if at is not None else ()
    return len(chosen), effects, calls


async def _register(steps: KVStepStore, source: str, fork_id: str, lineage: ForkLineage) -> None:
    """Register the fork as its source was registered (conversation, parent, agent,
    metadata), with its lineage in the metadata."""
    from pydantic_ai_harness.step_persistence import RunRecord

    record = await steps.get_run(run_id=source)
    metadata = dict(record.metadata) if record is not None else {}
    metadata["forked_from"] = source
    metadata["fork_point"] = lineage.point.describe()
    if lineage.subjects and _SUBJECT_METADATA_KEY not in metadata:
        metadata[_SUBJECT_METADATA_KEY] = lineage.subjects[0]
    await steps.register_run(
        RunRecord(
            run_id=fork_id,
            conversation_id=record.conversation_id if record is not None else None,
            parent_run_id=record.parent_run_id if record is not None else None,
            agent_name=record.agent_name if record is not None else None,
            metadata=metadata,
            # The claim's: a retried fork is the same registration.
            registration_id=f"fork:{source}:{lineage.created_at!r}",
        )
    )


async def _complete(kv: KVStore, space: RunSpace, fork_id: str) -> None:
    """Mark the fork's record complete: the fork is usable from here on."""
    scope = space.scope(fork_id)
    for attempt in range(MAX_ATTEMPTS):
        entry = await kv.get(scope, FORK_KEY)
        if entry is None:
            raise ConflictError(
                detail=f"the fork record of {fork_id!r} disappeared while forking "
                "(was the run deleted?)",
                scope=scope,
                key=FORK_KEY,
            )
        record = decode_record(entry.value, what=f"fork record of {fork_id!r}")
        if record.get("complete"):
            return
        try:
            await kv.replace(
                scope,
                FORK_KEY,
                canonical({**record, "complete": True}),
                expected_version=entry.version,
                ttl=await space.write_ttl(fork_id),
            )
            return
        except ConflictError:
            await backoff(attempt)
    raise ConflictError(  # pragma: no cover
        detail=f"could not complete the fork {fork_id!r}", scope=scope, key=FORK_KEY
    )
