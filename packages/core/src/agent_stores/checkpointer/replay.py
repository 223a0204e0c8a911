"""Replay: deciding, step by step on resume, whether to run a step or reuse its result.

Five answers, from the journal alone:

* ``DONE`` — a result is recorded: return it, run nothing (a paid inference is not paid again);
* ``NEW`` — no trace (or an intent of an idempotent step): run it;
* ``DENIED_RETRY`` — the recorded outcome says the effect did not happen and may be tried
  again (a policy denial, an approval that expired);
* ``DENIED_CLOSED`` — a person said no: do not run it, do not ask again;
* ``UNCERTAIN`` — an intent without a result for a step that is not idempotent: the
  effect may have happened. :meth:`Replay.resolve` raises :class:`UncertainEffect`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .errors import ReplayMismatchError, UncertainEffect
from .types import JournalEntry, Phase, RunState, parse_step_id


class ReplayState(StrEnum):
    """How a step resolves against the journal."""

    DONE = "done"
    NEW = "new"
    DENIED_RETRY = "denied_retry"
    DENIED_CLOSED = "denied_closed"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True, slots=True)
class Resolution:
    """The answer for one step: its state and the journal entry that decided it."""

    step_id: str
    state: ReplayState
    entry: JournalEntry | None = None
    """The recorded result (done / denied), the intent (uncertain), or None (new)."""

    @property
    def should_run(self) -> bool:
        """True when the caller must execute the step (new, or denied and retryable)."""
        return self.state in (ReplayState.NEW, ReplayState.DENIED_RETRY)


class Replay:
    """Resolves steps against a loaded :class:`RunState` (in memory, O(1) per step)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.replayed = 0
        """Steps skipped because their result was recorded."""
        self.denied = 0
        """Steps to retry because they were denied before."""
        self.closed_by_decision = 0
        """Steps closed because a person said no."""
        self._positions: dict[int, JournalEntry] = {}
        for entry in state.entries:
            parsed = parse_step_id(entry.step_id)
            if parsed is not None and entry.phase is Phase.COMPLETED:
                self._positions.setdefault(parsed[0], entry)

    @property
    def active(self) -> bool:
        """True when the journal holds anything to replay."""
        return bool(self.state.entries)

    @property
    def closed(self) -> JournalEntry | None:
        """The run's closing entry, if it already finished."""
        return self.state.final

    def occupied_by_other(self, step_id: str) -> JournalEntry | None:
        """The completed entry at the same position as ``step_id`` but of another kind.

        Only positional ids are checked. A gap is normal (deferred writes are batched); a
        position taken by another kind of step is not, and means the journal was written
        by a different sequence of steps.
        """
        parsed = parse_step_id(step_id)
        if parsed is None:
            return None
        other = self._positions.get(parsed[0])
        if other is not None and other.kind != parsed[1]:
            return other
        return None

    def classify(self, step_id: str, *, idempotent: bool | None = None) -> Resolution:
        """The replay state of ``step_id``, without raising for the uncertain case.

        ``idempotent`` defaults to what the step's recorded intent declared. Raises
        :class:`ReplayMismatchError` when another kind of step holds the position.
        """
        result = self.state.result_of(step_id)
        if result is not None:
            event = result.event
            if event.outcome.final:
                return Resolution(step_id, ReplayState.DENIED_CLOSED, result)
            if event.denied or not event.outcome.happened:
                return Resolution(step_id, ReplayState.DENIED_RETRY, result)
            return Resolution(step_id, ReplayState.DONE, result)
        intruder = self.occupied_by_other(step_id)
        if intruder is not None:
            raise ReplayMismatchError(
                detail=(
                    f"run {self.state.run_id!r} has step {intruder.step_id!r} where this loop asks "
                    f"for {step_id!r}: the journal was written by another sequence of steps; "
                    "give the run a new id or resume it with the version that wrote it"
                )
            )
        intent = self.state.intent_of(step_id)
        if intent is not None:
            safe = intent.event.idempotent if idempotent is None else idempotent
            if not safe:
                return Resolution(step_id, ReplayState.UNCERTAIN, intent)
        return Resolution(step_id, ReplayState.NEW, None)

    def resolve(self, step_id: str, *, idempotent: bool | None = None) -> Resolution:
        """Like :meth:`classify`, counting, and raising :class:`UncertainEffect` when uncertain."""
        resolution = self.classify(step_id, idempotent=idempotent)
        if resolution.state is ReplayState.UNCERTAIN:
            raise UncertainEffect(
                step_id,
                detail="the harness or a person must decide whether to retry it or fail the run",
                intent=resolution.entry,
            )
        if resolution.state is ReplayState.DONE:
            self.replayed += 1
        elif resolution.state is ReplayState.DENIED_RETRY:
            self.denied += 1
        elif resolution.state is ReplayState.DENIED_CLOSED:
            self.closed_by_decision += 1
        return resolution
