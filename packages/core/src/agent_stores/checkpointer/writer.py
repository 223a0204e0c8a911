"""``JournalWriter``: writes a run's events honouring the durability each one declares.

* A ``DURABLE`` event is on storage before :meth:`JournalWriter.record` returns.
* ``DEFERRABLE`` events are held and written as one batch before the next durable one
  (and on :meth:`~JournalWriter.flush`), so the journal keeps execution order: a
  structural event never lands after the effect that followed it.
* A failed flush loses nothing. Each held event keeps the position reserved for it on its
  first attempt, so a retried flush writes every event exactly once and in its original
  order, whichever of the writes had landed before the failure. (Synaptum's reference
  journal pops events before writing them and drops them when a write fails.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Self

from .space import bounded_gather
from .types import AppendResult, Durability, JournalEvent

if TYPE_CHECKING:
    from .journal import Checkpointer


@dataclass
class _Held:
    event: JournalEvent
    seq: int | None = None


class JournalWriter:
    """Durability-aware writer for one run (one writer per run and process)."""

    def __init__(self, checkpointer: Checkpointer, run_id: str) -> None:
        self.checkpointer = checkpointer
        self.run_id = run_id
        self._held: list[_Held] = []
        self._lock = asyncio.Lock()

    @property
    def pending(self) -> tuple[JournalEvent, ...]:
        """Deferred events not yet known to be on storage, in order."""
        return tuple(h.event for h in self._held)

    async def record(self, event: JournalEvent) -> AppendResult | None:
        """Persist ``event`` (durable) or hold it for the next flush (deferrable).

        For a durable event the held ones are flushed first; if that flush fails the
        durable event is not written and the error propagates (call again to retry).
        Returns the durable event's :class:`AppendResult`, or None for a held event.
        """
        async with self._lock:
            if event.durability is Durability.DEFERRABLE:
                self._held.append(_Held(event))
                return None
            await self._flush_locked()
            return await self.checkpointer.append(self.run_id, event)

    async def flush(self) -> list[AppendResult]:
        """Write every held event, in order. On failure nothing is dropped: call again."""
        async with self._lock:
            return await self._flush_locked()

    async def _flush_locked(self) -> list[AppendResult]:
        if not self._held:
            return []
        fresh = [h for h in self._held if h.seq is None]
        if fresh:
            # Reserved once, kept across retries: a retry rewrites at the same positions.
            for held, seq in zip(
                fresh, await self.checkpointer.reserve(self.run_id, len(fresh)), strict=True
            ):
                held.seq = seq
        batch = list(self._held)
        outcomes = await bounded_gather([partial(self._write, h) for h in batch], 16)
        written = [
            h
            for h, result in zip(batch, outcomes, strict=True)
            if not isinstance(result, BaseException)
        ]
        self._held = [h for h in self._held if h not in written]
        for result in outcomes:
            if isinstance(result, BaseException):
                raise result
        return [r for r in outcomes if isinstance(r, AppendResult)]

    async def _write(self, held: _Held) -> AppendResult | BaseException:
        assert held.seq is not None
        try:
            return await self.checkpointer.append_at(self.run_id, held.event, held.seq)
        except Exception as exc:
            return exc

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Flushed on any exit; a flush error never hides the exception that ended the block.
        if exc is None:
            await self.flush()
        else:
            try:
                await self.flush()
            except Exception:
                pass
