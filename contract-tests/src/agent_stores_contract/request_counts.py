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

import contextlib
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


class Operations:
    """The measured operations on clients opened by ``open_client``, each repeatable.

    ``async with Operations(open_client, prefix) as ops:`` then, per operation,
    ``await ops.prepare(name)`` (what must happen first and is not measured: the other
    client's turn before a cold one) and ``await ops.run(name)``. Used by :func:`measure`
    to count requests and by ``benchmarks/latency.py`` to time them behind a delay proxy.
    """

    def __init__(self, open_client: Callable[[], Awaitable[KVStore]], prefix: str) -> None:
        self.open_client = open_client
        self.prefix = prefix
        self.stack = contextlib.AsyncExitStack()
        self.turns = 0
        self.writes = 0
        self.steps = 0
        self.memory_version: str | None = None

    async def __aenter__(self) -> Operations:
        try:
            await self._open()
        except BaseException:
            await self.stack.aclose()
            raise
        return self

    async def _open(self) -> None:
        prefix = self.prefix
        self.a = connect(await self.open_client()).sessions(owns_kv=True, scope_prefix=prefix)
        self.stack.push_async_callback(self.a.aclose)
        self.b = connect(await self.open_client()).sessions(owns_kv=True, scope_prefix=prefix)
        self.stack.push_async_callback(self.b.aclose)
        self.memory = KVMemoryStore(await self.open_client(), scope_prefix=prefix, owns_kv=True)
        self.stack.push_async_callback(self.memory.aclose)
        self.checkpointer = Checkpointer(
            await self.open_client(), scope_prefix=prefix, owns_kv=True
        )
        self.stack.push_async_callback(self.checkpointer.aclose)
        self.step_store = self.checkpointer.step_store()
        await self.step_store.register_run(RunRecord(run_id="steps"))
        for _ in range(5):  # a history of 10 messages, written by a
            await self._turn(self.a)
        await self.run("memory write with receipt")  # the file "memory read" reads

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()

    async def _turn(self, store: SessionStore) -> None:
        self.turns += 1
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair(self.turns)])

    async def prepare(self, operation: str) -> None:
        """What must come before ``operation`` and is not part of it."""
        if operation == "turn, cold (another client wrote last)":
            await self._turn(self.b)

    async def run(self, operation: str) -> None:
        """One ``operation`` (a key of :data:`OPERATIONS`)."""
        if operation.startswith("turn, "):
            await self._turn(self.a)
        elif operation == "memory write with receipt":
            self.writes += 1
            op = MemoryOperation(f"{self.prefix}w{self.writes}", f"fp{self.writes}")
            done = await self.memory.write(
                "u/notes.md",
                f"note {self.writes}",
                expected_version=self.memory_version,
                operation=op,
            )
            self.memory_version = done.version
        elif operation == "memory read":
            await self.memory.read("u/notes.md", max_chars=1000)
        elif operation == "step append (harness step store)":
            self.steps += 1
            event = StepEvent(
                run_id="steps",
                kind="model_request",
                step_index=self.steps,
                idempotency_key=f"k{self.steps}",
            )
            await self.step_store.append_event(event)
        elif operation == "journal append (checkpointer)":
            self.steps += 1
            journal = JournalEvent(step_id=f"step-{self.steps}", kind="tool", payload={})
            await self.checkpointer.append("journal", journal)
        else:
            raise ValueError(f"unknown operation {operation!r}; known: {', '.join(OPERATIONS)}")


async def prepare_backend(url: str) -> None:
    """Create the backend's tables or containers, as a deployment does once."""
    setup = open_kv(url)
    try:
        await setup.setup()
    finally:
        await setup.aclose()


async def measure(url: str) -> dict[str, dict[str, int]]:
    """operation -> requests by SDK operation, on one backend: each operation once to warm
    up, then once counted."""
    await prepare_backend(url)
    meter = Meter(url)
    found: dict[str, dict[str, int]] = {}
    async with Operations(meter.client, f"req-{uuid.uuid4().hex[:8]}:") as ops:
        for operation in OPERATIONS:
            await ops.prepare(operation)
            await ops.run(operation)
            await ops.prepare(operation)
            found[operation] = await meter.count(functools.partial(ops.run, operation))
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
    """The totals a page's first table (as :func:`table` writes it) lists for ``backend``
    (later tables, such as the latency table, may name the same operations)."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in lines[start:end]
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
