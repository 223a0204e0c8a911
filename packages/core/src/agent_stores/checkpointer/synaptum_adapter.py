"""Synaptum's ``Checkpointer`` protocol (``append`` / ``load``) on any agent-stores backend.

``SynaptumCheckpointer(checkpointer)`` is what a Synaptum ``Session`` takes as its
``checkpointer``: Synaptum's events are stored through :meth:`Checkpointer.append` (so
appends are idempotent by ``(run_id, step_id, phase)``, concurrent appenders never share a
position and the cost does not grow with the run) and rebuilt by Synaptum's own codec on
``load``. Needs the ``synaptum`` extra (``pip install "agent-stores[synaptum]"``), which
requires Python >= 3.13; ``synaptum`` is imported only when an adapter is created.
"""

from __future__ import annotations

import importlib
import json
from types import ModuleType
from typing import Any

from .journal import Checkpointer
from .types import Durability, JournalEvent, Outcome, Phase


def _synaptum() -> tuple[ModuleType, ModuleType, ModuleType]:
    try:
        return (
            importlib.import_module("synaptum.core.types"),
            importlib.import_module("synaptum.core.codec"),
            importlib.import_module("synaptum.core.protocols"),
        )
    except ImportError as exc:  # pragma: no cover - exercised where synaptum is absent
        raise ImportError(
            "SynaptumCheckpointer needs synaptum (Python >= 3.13): "
            'pip install "agent-stores[synaptum]"'
        ) from exc


class SynaptumCheckpointer:
    """Adapter: Synaptum's ``Checkpointer`` protocol over an agent-stores :class:`Checkpointer`.

    Replaces ``synaptum.MemoryCheckpointer`` / ``synaptum.SqliteCheckpointer``::

        async with open_checkpointer("redis://…") as cp:
            session = Session(run_id, gateway, SynaptumCheckpointer(cp))

    ``at`` and ``meta`` (timestamp, trace context) are kept but, unlike Synaptum's
    reference stores, do not count as a divergent payload on a retried append.
    """

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer
        self._types, self._codec, self._protocols = _synaptum()

    def _to_journal(self, event: Any) -> JournalEvent:
        data: dict[str, Any] = json.loads(self._types.dumps(event))
        at = data.pop("at", None)
        meta = data.pop("meta", None) or {}
        decision = getattr(event, "decision", None)
        return JournalEvent(
            step_id=event.step_id,
            phase=Phase(event.phase.value),
            kind=str(event.kind),
            payload=data,
            durability=Durability(event.durability.value),
            outcome=Outcome(event.outcome.value),
            denied=decision is not None and not decision.allowed,
            reason=str(getattr(event, "reason", "") or ""),
            idempotent=bool(getattr(event, "idempotent", False)),
            at=at,
            meta=meta,
        )

    async def append(self, run_id: str, event: Any) -> Any:
        """Append a Synaptum ``StepEvent``; returns Synaptum's ``AppendResult``."""
        result = await self.checkpointer.append(run_id, self._to_journal(event))
        return self._protocols.AppendResult(
            seq=result.seq, duplicate=result.duplicate, payload_diverged=result.payload_diverged
        )

    async def load(self, run_id: str) -> Any:
        """The run's journal as Synaptum's ``RunState`` (empty for an unknown run)."""
        state = await self.checkpointer.load(run_id)
        events = []
        for entry in state.entries:
            data = dict(entry.payload)
            if entry.event.at is not None:
                data["at"] = entry.event.at
            if entry.event.meta:
                data["meta"] = dict(entry.event.meta)
            events.append(self._codec.decode_event(data))
        return self._protocols.RunState(run_id, tuple(events))
