"""Workloads run while faults are injected: memory writes with receipts, journal appends and
session turns, then a check that nothing was lost, applied twice or left corrupt.

Every operation either succeeds or raises a typed "unavailable" error
(BackendUnavailableError; for sessions its session form TransientStoreError), never a
configuration error; then the caller does what an application does: retries the same
operation (the same receipt, the same journal key), or for a turn first reads whether it
landed. Anything else fails the workload with the error itself.

For a backend's own fault tests (the Redis and PostgreSQL packages use it); the contract's
``FaultContract`` runs its own workloads.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent_stores import BackendUnavailableError, KVStore, open_checkpointer, open_memory
from agent_stores import open_sessions as open_session_store
from agent_stores.checkpointer.types import JournalEvent
from agent_stores.errors import ConfigError
from agent_stores.memory._harness import MemoryOperation
from agent_stores.sessions.errors import TransientStoreError
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

T = TypeVar("T")

#: How often one operation is tried before the workload gives up on it.
ATTEMPTS = 12


@dataclass
class Tally:
    """Outcomes of one workload: successes, and unavailable errors by type (retried)."""

    ok: int = 0
    unavailable: Counter[str] = field(default_factory=Counter)
    describe: str = ""

    def failed(self, exc: BaseException) -> None:
        assert not isinstance(exc, ConfigError), f"a transient fault became a ConfigError: {exc!r}"
        assert self.describe.split("://")[0] in str(exc) or "session" in str(exc).lower(), (
            f"the error does not name the backend: {exc}"
        )
        self.unavailable[type(exc).__name__] += 1


UNAVAILABLE = (BackendUnavailableError, TransientStoreError)


async def retried(tally: Tally, call: Callable[[], Awaitable[T]]) -> T:
    """``call()`` until it succeeds; only the unavailable errors are retried."""
    for _ in range(ATTEMPTS):
        try:
            result = await call()
        except UNAVAILABLE as exc:
            tally.failed(exc)
            continue
        tally.ok += 1
        return result
    raise AssertionError(f"still failing after {ATTEMPTS} attempts: {tally}")


async def memory_workload(kv: KVStore, tally: Tally, *, files: int = 6, edits: int = 6) -> None:
    """New files, and one file edited in a chain, each write with its own receipt; then every
    receipt answers with the version the file holds and every file has its last content."""
    memory = open_memory(kv)
    try:
        created: dict[str, str] = {}
        for i in range(files):
            path = f"notes/f{i}.md"
            op = MemoryOperation(f"create-{i}", f"fp-create-{i}")
            create = functools.partial(
                memory.write, path, f"file {i}", expected_version=None, operation=op
            )
            done = await retried(tally, create)
            created[path] = done.version
        version: str | None = None
        for i in range(edits):
            op = MemoryOperation(f"edit-{i}", f"fp-edit-{i}")
            expected = version
            edit = functools.partial(
                memory.write, "notes/chain.md", f"edit {i}", expected_version=expected, operation=op
            )
            done = await retried(tally, edit)
            version = done.version
        for i, (path, file_version) in enumerate(sorted(created.items())):
            read = await retried(tally, functools.partial(memory.read, path, max_chars=100))
            assert read is not None and read.content == f"file {i}", (path, read)
            operation = MemoryOperation(f"create-{i}", f"fp-create-{i}")
            found = await retried(tally, functools.partial(memory.get_operation, operation))
            assert found is not None and found.version == file_version
        chain = await retried(tally, lambda: memory.read("notes/chain.md", max_chars=100))
        assert chain is not None and chain.content == f"edit {edits - 1}", chain
        last = await retried(
            tally,
            lambda: memory.get_operation(
                MemoryOperation(f"edit-{edits - 1}", f"fp-edit-{edits - 1}")
            ),
        )
        assert last is not None and last.version == version
    finally:
        await memory.aclose()


async def journal_workload(kv: KVStore, tally: Tally, *, events: int = 10) -> None:
    """Appends retried with the same event: each lands once, in order, positions 0..n-1."""
    checkpointer = open_checkpointer(kv)
    try:
        run_id = "run-1"
        for i in range(events):
            event = JournalEvent(step_id=f"step-{i}", kind="tool", payload={"i": i})
            await retried(tally, functools.partial(checkpointer.append, run_id, event))
        state = await retried(tally, lambda: checkpointer.load(run_id))
        steps = [entry.step_id for entry in state.entries]
        assert steps == [f"step-{i}" for i in range(events)], steps
        seqs = [entry.seq for entry in state.entries]
        assert seqs == sorted(set(seqs)), seqs
    finally:
        await checkpointer.aclose()


def pair(text: str) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f"q:{text}")]),
        ModelResponse(parts=[TextPart(f"a:{text}")]),
    ]


def texts(messages: list[ModelMessage] | None) -> list[str]:
    return [str(getattr(m.parts[0], "content", "")) for m in messages or []]


async def session_workload(kv: KVStore, tally: Tally, *, turns: int = 8) -> None:
    """Turns on one session; a turn that failed is retried only if it did not land. The
    history ends as every turn once, in order."""
    store = open_session_store(kv, lease_seconds=4.0)
    sid = "faulty-session"
    try:
        for i in range(turns):
            text = f"t{i}"
            for _ in range(ATTEMPTS):
                try:
                    async with store.turn(sid, timeout_seconds=15.0) as session:
                        session.replace([*session.messages, *pair(text)])
                except UNAVAILABLE as exc:
                    tally.failed(exc)
                    history = await retried(tally, lambda: store.read_messages(sid))
                    if f"q:{text}" in texts(history):
                        break  # it landed: the reply was lost, not the turn
                    continue
                tally.ok += 1
                break
            else:
                raise AssertionError(f"turn {i} kept failing: {tally}")
        history = await retried(tally, lambda: store.read_messages(sid))
        expected: list[str] = []
        for i in range(turns):
            expected += [f"q:t{i}", f"a:t{i}"]
        assert texts(history) == expected
    finally:
        await store.aclose()


WORKLOADS: dict[str, Callable[[KVStore, Tally], Awaitable[None]]] = {
    "memory": memory_workload,
    "journal": journal_workload,
    "sessions": session_workload,
}


def describe(kv: Any) -> str:
    return str(kv.describe())
