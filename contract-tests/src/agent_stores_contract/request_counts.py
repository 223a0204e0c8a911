"""Requests per store operation, counted at the SDK transport by the backend's injector.

On a real cloud a round trip costs 5-20 ms, so the number of requests an operation sends
decides its speed. Each backend's fault injector sits at its SDK's transport (a botocore
event hook, an azure-core transport, a gRPC interceptor) and counts every request it
sees, retries included; at fault rate 0 it is a meter. Every operation is measured in its
steady state (the same operation once before, so a client's one-time metadata reads are
not counted against it), except that the cold turn's client last saw the session before
another client wrote to it.

``benchmarks/request_counts.py`` prints the table for the cloud backends (``nox -s bench``);
the backends' own tests hold each operation to its budget with :func:`measure`. Any backend
whose ``fault_injector`` hook returns a :class:`~agent_stores.backend.BaseFaultInjector`
that calls ``count_request`` can be measured the same way.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar

import pytest
from agent_stores import KVStore, StoreURL, connect, open_kv
from agent_stores.backend import BaseFaultInjector, FaultInjector
from agent_stores.checkpointer import Checkpointer
from agent_stores.checkpointer.types import JournalEvent
from agent_stores.memory import KVMemoryStore
from agent_stores.plugins import get_registry
from agent_stores.sessions import SessionStore
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai_harness.memory import MemoryOperation
from pydantic_ai_harness.step_persistence import RunRecord, StepEvent

#: operation -> the fewest requests it can take (one to read a session and take its
#: lease, one to save and release; one for any single write or read)
OPERATIONS: dict[str, int] = {
    "turn, warm (this client wrote last)": 2,
    "turn, cold (another client wrote last)": 2,
    "memory write with receipt": 1,
    "memory read": 1,
    "step append (harness step store)": 1,
    "journal append (checkpointer)": 1,
}


def pair(i: int) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(content=f"question {i}")]),
        ModelResponse(parts=[TextPart(content=f"answer {i}")]),
    ]


class Meter:
    """Clients whose requests the backend's injector counts."""

    def __init__(self, url: str) -> None:
        self.url = url
        found = get_registry().hook.fault_injector(url=StoreURL.parse(url))
        if not (isinstance(found, BaseFaultInjector) and isinstance(found, FaultInjector)):
            raise TypeError(f"{StoreURL.parse(url).scheme}: no request-counting fault injector")
        self.injector: FaultInjector = found
        self.counter: BaseFaultInjector = found

    async def client(self) -> KVStore:
        return await self.injector.open_kv(StoreURL.parse(self.url))

    async def count(self, call: Callable[[], Awaitable[object]]) -> dict[str, int]:
        self.counter.requests(reset=True)
        await call()
        return self.counter.requests(reset=True)


async def measure(url: str) -> dict[str, dict[str, int]]:
    """operation -> requests by SDK operation, on one backend."""
    setup = open_kv(url)
    try:
        await setup.setup()
    finally:
        await setup.aclose()
    meter = Meter(url)
    prefix = f"req-{uuid.uuid4().hex[:8]}:"
    found: dict[str, dict[str, int]] = {}
    a = connect(await meter.client()).sessions(owns_kv=True, scope_prefix=prefix)
    b = connect(await meter.client()).sessions(owns_kv=True, scope_prefix=prefix)
    turn_number = 0

    async def turn(store: SessionStore) -> None:
        nonlocal turn_number
        turn_number += 1
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair(turn_number)])

    try:
        for _ in range(5):  # history of 10 messages, written by a
            await turn(a)
        found["turn, warm (this client wrote last)"] = await meter.count(lambda: turn(a))
        await turn(b)
        found["turn, cold (another client wrote last)"] = await meter.count(lambda: turn(a))
    finally:
        await a.aclose()
        await b.aclose()

    memory = KVMemoryStore(await meter.client(), scope_prefix=prefix, owns_kv=True)
    try:
        version: str | None = None
        for i in range(2):
            op = MemoryOperation(f"{prefix}w{i}", f"fp{i}")

            async def write(i: int = i, op: MemoryOperation = op) -> None:
                nonlocal version
                done = await memory.write(
                    "u/notes.md", f"note {i}", expected_version=version, operation=op
                )
                version = done.version

            counted = await meter.count(write)
        found["memory write with receipt"] = counted
        await memory.read("u/notes.md", max_chars=1000)
        found["memory read"] = await meter.count(lambda: memory.read("u/notes.md", max_chars=1000))
    finally:
        await memory.aclose()

    checkpointer = Checkpointer(await meter.client(), scope_prefix=prefix, owns_kv=True)
    try:
        steps = checkpointer.step_store()
        await steps.register_run(RunRecord(run_id="steps"))
        for i in range(2):
            event = StepEvent(
                run_id="steps", kind="model_request", step_index=i, idempotency_key=f"k{i}"
            )
            counted = await meter.count(functools.partial(steps.append_event, event))
        found["step append (harness step store)"] = counted
        for i in range(2):
            journal = JournalEvent(step_id=f"step-{i}", kind="tool", payload={"i": i})
            counted = await meter.count(functools.partial(checkpointer.append, "journal", journal))
        found["journal append (checkpointer)"] = counted
    finally:
        await checkpointer.aclose()
    return found


def table(results: dict[str, dict[str, dict[str, int]]]) -> str:
    names = list(results)
    lines = [
        "| operation | minimum | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for operation, minimum in OPERATIONS.items():
        cells = []
        for name in names:
            counted = results[name][operation]
            detail = ", ".join(f"{op} {n}" for op, n in sorted(counted.items()))
            cells.append(f"**{sum(counted.values())}** ({detail})")
        lines.append(f"| {operation} | {minimum} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def documented_totals(page: str, backend: str) -> dict[str, int]:
    """The totals a page's table (as :func:`table` writes it) lists for ``backend``."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in page.splitlines()
        if line.startswith("| ")
    ]
    header, body = rows[0], rows[1:]
    column = header.index(backend)
    return {row[0]: int(row[column].split("**")[1]) for row in body if row[0] in OPERATIONS}


class RequestBudgetTests:
    """A backend's request budget as tests: subclass it with ``backend`` (its column in the
    page), ``budget`` (operation -> requests), ``page`` (the page listing them) and a
    ``store_url`` fixture. A change that adds a request fails; one that saves a request
    updates the budget and the page together."""

    backend: ClassVar[str]
    budget: ClassVar[dict[str, int]]
    page: ClassVar[Path]

    @pytest.mark.asyncio
    async def test_each_operation_sends_its_budgeted_requests(self, store_url: str) -> None:
        assert set(self.budget) == set(OPERATIONS)
        counted = await measure(store_url)
        totals = {operation: sum(requests.values()) for operation, requests in counted.items()}
        assert totals == self.budget, counted

    def test_the_page_lists_these_budgets(self) -> None:
        assert documented_totals(self.page.read_text(), self.backend) == self.budget
