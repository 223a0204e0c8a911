"""The journal's vocabulary: events, entries, append results and the loaded run state.

The shapes follow Synaptum's checkpointer contract (``append`` / ``load``, ``AppendResult``,
``RunState`` with ``next_seq``, ``final``, ``result_of``, ``completed``, ``attempted``) so
that its loop, or any loop written the same way, can run on top of any backend.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .codec import JSONValue, canonical, digest

_POSITIONAL = re.compile(r"^(\d{6,})-(.+)$")


class Phase(StrEnum):
    """The two phases of a step: the intent (before the effect) and the result (after)."""

    ATTEMPTED = "attempted"
    COMPLETED = "completed"


class Durability(StrEnum):
    """How urgently an event must reach storage.

    ``DURABLE`` events are written before the caller goes on (losing one after a crash
    makes it impossible to know whether an effect happened). ``DEFERRABLE`` events may be
    batched; losing one costs at most repeating work without external consequences.
    """

    DURABLE = "durable"
    DEFERRABLE = "deferrable"


class Outcome(StrEnum):
    """How a completed step ended.

    Every outcome but ``RESULT`` and ``APPROVAL_GRANTED`` means the effect did not happen.
    ``APPROVAL_DENIED`` closes the step (a person said no: never ask again);
    ``DENIED_BY_POLICY`` and ``APPROVAL_EXPIRED`` may be retried on resume.
    """

    RESULT = "result"
    DENIED_BY_POLICY = "denied_by_policy"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_EXPIRED = "approval_expired"

    @property
    def final(self) -> bool:
        """True when the outcome closes the step for good."""
        return self is Outcome.APPROVAL_DENIED

    @property
    def happened(self) -> bool:
        """True when the step's effect took place."""
        return self in (Outcome.RESULT, Outcome.APPROVAL_GRANTED)


def make_step_id(seq: int, kind: str) -> str:
    """A deterministic, positional step id: ``make_step_id(1, "model") == "000001-model"``.

    Derived from the step's position in the run, never from a clock or a UUID, so a
    replayed run mints the same ids and can recognise what is already done. The fixed
    width keeps byte order equal to numeric order, so the journal's keys sort in
    execution order.
    """
    if not isinstance(seq, int) or seq < 0:
        raise ValueError(f"seq must be a non-negative int, got {seq!r}")
    if not kind or "/" in kind:
        raise ValueError(f"kind must be a non-empty string without '/', got {kind!r}")
    return f"{seq:06d}-{kind}"


def parse_step_id(step_id: str) -> tuple[int, str] | None:
    """``(ordinal, kind)`` of a positional step id, or None for any other id."""
    match = _POSITIONAL.match(step_id)
    if match is None:
        return None
    return int(match.group(1)), match.group(2)


def _empty_meta() -> dict[str, JSONValue]:
    return {}


@dataclass(frozen=True, kw_only=True)
class JournalEvent:
    """One event of a run's journal, as the caller hands it to ``append``.

    The idempotency key is ``(run_id, step_id, phase)``. ``payload`` is any JSON value
    (the request, the response, the tool call ...). ``at`` and ``meta`` (a timestamp and
    trace context) are kept but are not part of the identity nor of the divergence check:
    a retry with another clock or trace id is the same event.
    """

    step_id: str
    phase: Phase = Phase.COMPLETED
    kind: str = ""
    """Step class (``model``, ``tool``, ``approval``, ``final`` ...); from the step id when empty."""
    payload: JSONValue = None
    durability: Durability = Durability.DURABLE
    outcome: Outcome = Outcome.RESULT
    denied: bool = False
    """True on a completed step the enforcement seam refused to run (the effect did not happen)."""
    reason: str = ""
    idempotent: bool = False
    """Declared by the step's owner: whether the effect may be repeated without consequences."""
    at: float | None = None
    meta: Mapping[str, JSONValue] = field(default_factory=_empty_meta)

    def __post_init__(self) -> None:
        if not isinstance(self.step_id, str) or not self.step_id:
            raise ValueError("step_id must be a non-empty string")
        if "\x00" in self.step_id:
            raise ValueError("step_id must not contain NUL")
        object.__setattr__(self, "phase", Phase(self.phase))
        object.__setattr__(self, "durability", Durability(self.durability))
        object.__setattr__(self, "outcome", Outcome(self.outcome))
        if not self.kind:
            parsed = parse_step_id(self.step_id)
            object.__setattr__(self, "kind", parsed[1] if parsed else "step")

    # -- constructors -----------------------------------------------------------------

    @classmethod
    def attempted(
        cls,
        step_id: str,
        payload: JSONValue = None,
        *,
        idempotent: bool = False,
        durability: Durability | None = None,
        **extra: Any,
    ) -> JournalEvent:
        """The intent of a step. Deferrable only when the step is idempotent."""
        if durability is None:
            durability = Durability.DEFERRABLE if idempotent else Durability.DURABLE
        return cls(
            step_id=step_id,
            phase=Phase.ATTEMPTED,
            payload=payload,
            idempotent=idempotent,
            durability=durability,
            **extra,
        )

    @classmethod
    def completed(
        cls,
        step_id: str,
        payload: JSONValue = None,
        *,
        outcome: Outcome = Outcome.RESULT,
        **extra: Any,
    ) -> JournalEvent:
        """The result of a step (durable by default)."""
        return cls(
            step_id=step_id, phase=Phase.COMPLETED, payload=payload, outcome=outcome, **extra
        )

    # -- identity -----------------------------------------------------------------------

    @property
    def key(self) -> tuple[str, str]:
        """``(step_id, phase)``: the identity inside a run."""
        return (self.step_id, self.phase.value)

    def identity_fields(self) -> dict[str, JSONValue]:
        """The fields compared to tell a retried append from a diverged one."""
        return {
            "step_id": self.step_id,
            "phase": self.phase.value,
            "kind": self.kind,
            "payload": self.payload,
            "durability": self.durability.value,
            "outcome": self.outcome.value,
            "denied": self.denied,
            "reason": self.reason,
            "idempotent": self.idempotent,
        }

    def fingerprint(self) -> str:
        """SHA-256 of the canonical serialization of :meth:`identity_fields`."""
        return digest(canonical(self.identity_fields()))

    def to_record(self) -> dict[str, JSONValue]:
        """The JSON form stored in the journal."""
        record = self.identity_fields()
        record["at"] = self.at
        record["meta"] = dict(self.meta)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> JournalEvent:
        """Rebuild an event from :meth:`to_record`'s form."""
        return cls(
            step_id=str(record["step_id"]),
            phase=Phase(record["phase"]),
            kind=str(record.get("kind") or ""),
            payload=record.get("payload"),
            durability=Durability(record.get("durability", Durability.DURABLE.value)),
            outcome=Outcome(record.get("outcome", Outcome.RESULT.value)),
            denied=bool(record.get("denied", False)),
            reason=str(record.get("reason") or ""),
            idempotent=bool(record.get("idempotent", False)),
            at=record.get("at"),
            meta=dict(record.get("meta") or {}),
        )


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What ``append`` reports.

    ``seq`` is the entry's position in the journal; on a duplicate, the position of the
    entry already there. ``payload_diverged`` flags a duplicate whose payload differs from
    the stored one: a real non-determinism made visible instead of silently swallowed.
    """

    seq: int
    duplicate: bool = False
    payload_diverged: bool = False


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A stored event with its position."""

    seq: int
    event: JournalEvent

    @property
    def step_id(self) -> str:
        return self.event.step_id

    @property
    def phase(self) -> Phase:
        return self.event.phase

    @property
    def kind(self) -> str:
        return self.event.kind

    @property
    def payload(self) -> JSONValue:
        return self.event.payload

    @property
    def outcome(self) -> Outcome:
        return self.event.outcome


@dataclass(frozen=True)
class RunState:
    """What ``load`` returns: a run's journal in write order, with O(1) step queries.

    An unknown run is an empty journal, not an error: asking "where was I?" before the
    first checkpoint is the normal call.
    """

    run_id: str
    entries: tuple[JournalEntry, ...] = ()
    _results: dict[str, JournalEntry] = field(default_factory=dict, init=False, repr=False)
    _intents: dict[str, JournalEntry] = field(default_factory=dict, init=False, repr=False)
    _final: JournalEntry | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        results: dict[str, JournalEntry] = {}
        intents: dict[str, JournalEntry] = {}
        final: JournalEntry | None = None
        for entry in self.entries:
            if entry.phase is Phase.COMPLETED:
                results[entry.step_id] = entry
            else:
                intents[entry.step_id] = entry
            if entry.kind == "final":
                final = entry
        object.__setattr__(self, "_results", results)
        object.__setattr__(self, "_intents", intents)
        object.__setattr__(self, "_final", final)

    @property
    def events(self) -> tuple[JournalEvent, ...]:
        """The events, in write order (without their positions)."""
        return tuple(entry.event for entry in self.entries)

    @property
    def next_seq(self) -> int:
        """The position after the last entry (0 for an empty journal)."""
        return self.entries[-1].seq + 1 if self.entries else 0

    @property
    def final(self) -> JournalEntry | None:
        """The closing entry (kind ``final``), if the run finished."""
        return self._final

    def result_of(self, step_id: str) -> JournalEntry | None:
        """The recorded result of a step, if any."""
        return self._results.get(step_id)

    def intent_of(self, step_id: str) -> JournalEntry | None:
        """The recorded intent of a step, if any."""
        return self._intents.get(step_id)

    def completed(self, step_id: str) -> bool:
        """True when a result is recorded."""
        return step_id in self._results

    def attempted(self, step_id: str) -> bool:
        """True when an intent is recorded *and no result*: the uncertain case.

        Exclusive with :meth:`completed` on purpose: a finished step is done, not attempted.
        """
        return step_id in self._intents and step_id not in self._results

    def uncertain_steps(self) -> list[str]:
        """Steps attempted without a result, in write order."""
        return [
            e.step_id
            for e in self.entries
            if e.phase is Phase.ATTEMPTED and self.attempted(e.step_id)
        ]

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A run as listed by :meth:`Checkpointer.list_runs`."""

    run_id: str
    created_at: float
    """Unix time of the run's first write (as seen by the store's clock)."""
    expires_at: float | None
    """When the run (all of it) expires; None without a TTL."""


@dataclass(frozen=True, slots=True)
class RunRetention:
    """What :meth:`Checkpointer.keep_latest_runs` deleted."""

    removed: tuple[str, ...]
    """Runs deleted (journal, events, snapshots, tool effects, index entries), by id."""
    conversations: int
    """Conversations looked at."""
    kept: int
    """Runs of those conversations kept."""
