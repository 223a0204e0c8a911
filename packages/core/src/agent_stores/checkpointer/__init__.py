"""The checkpointer: a durable run journal with replay, and the harness ``StepStore``.

``Checkpointer(kv)`` (or ``agent_stores.open_checkpointer(url)``) keeps each run's
journal: ``append(run_id, event)`` is idempotent by ``(run_id, step_id, phase)`` and
returns ``AppendResult(seq, duplicate, payload_diverged)``; ``load(run_id)`` returns the
ordered :class:`RunState`; :class:`Replay` resolves each step on resume (done / new /
denied-retry / denied-closed / uncertain → :class:`UncertainEffect`); a
:class:`JournalWriter` honours each event's durability; ``fork_run`` starts a new run from
a point of an old one, inheriting what it knew of its effects. ``checkpointer.step_store()``
is a :class:`KVStepStore` implementing ``pydantic_ai_harness.step_persistence.StepStore``
on the same backend. See ``docs/checkpointer.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    ForkIncompleteError,
    ForkPointError,
    ReplayMismatchError,
    RunExistsError,
    RunNotFoundError,
    UncertainEffect,
)
from .fork import ForkLineage, ForkPoint, RunFork
from .journal import Checkpointer
from .replay import Replay, ReplayState, Resolution
from .types import (
    AppendResult,
    Durability,
    JournalEntry,
    JournalEvent,
    Outcome,
    Phase,
    RunInfo,
    RunRetention,
    RunState,
    make_step_id,
    parse_step_id,
)
from .writer import JournalWriter

if TYPE_CHECKING:
    from .step_store import KVStepStore
    from .synaptum_adapter import SynaptumCheckpointer

__all__ = [
    "AppendResult",
    "Checkpointer",
    "Durability",
    "ForkIncompleteError",
    "ForkLineage",
    "ForkPoint",
    "ForkPointError",
    "JournalEntry",
    "JournalEvent",
    "JournalWriter",
    "KVStepStore",
    "Outcome",
    "Phase",
    "Replay",
    "ReplayMismatchError",
    "ReplayState",
    "Resolution",
    "RunExistsError",
    "RunFork",
    "RunInfo",
    "RunNotFoundError",
    "RunRetention",
    "RunState",
    "SynaptumCheckpointer",
    "UncertainEffect",
    "make_step_id",
    "parse_step_id",
]

# Imported on first use: the step store needs the ``harness`` extra (Pydantic AI), the
# adapter needs ``synaptum``; the journal needs neither.
_LAZY = {
    "KVStepStore": "agent_stores.checkpointer.step_store",
    "SynaptumCheckpointer": "agent_stores.checkpointer.synaptum_adapter",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
