"""Subprocess entry points of the checkpointer contract's multi-process tests.

``python -m agent_stores_contract.checkpointer_workers COMMAND ARGS...``:

* ``journal-append URL NAMESPACE RUN WORKER N [--barrier DIR K]`` — append N journal events with step ids
  ``<WORKER>-<i>`` and print one JSON line per append (``seq``, ``duplicate``).
* ``step-fail URL NAMESPACE RUN_ID COUNTER_FILE`` — run an agent (``FunctionModel``) with
  ``StepPersistence`` on the store: it calls the ``work`` tool (which appends a line to
  COUNTER_FILE) and then the provider fails with HTTP 503. Prints ``{"failed": 503}``.
* ``step-resume URL NAMESPACE RUN_ID COUNTER_FILE`` — ``continue_run`` on the same store
  and finish the run with a model that answers; prints ``{"output": ..., "run_id": ...}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from agent_stores import open_checkpointer
from agent_stores.checkpointer import JournalEvent

from .workers import barrier_args, file_barrier


async def journal_append(*raw: str) -> None:
    """``URL NAMESPACE RUN WORKER N [--barrier DIR K]``: append N events, one JSON line each."""
    (url, namespace, run_id, worker, count), barrier = barrier_args(raw)
    async with open_checkpointer(url, scope_prefix=f"{namespace}/") as checkpointer:
        await checkpointer.load(run_id)  # connected before the barrier
        if barrier is not None:
            await file_barrier(*barrier)
        for i in range(int(count)):
            result = await checkpointer.append(
                run_id, JournalEvent.completed(f"{worker}-{i:04d}", {"worker": worker, "i": i})
            )
            print(
                json.dumps({"seq": result.seq, "duplicate": result.duplicate, "worker": worker}),
                flush=True,
            )


def _tool_returned(messages: list[Any]) -> bool:
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    return any(
        isinstance(part, ToolReturnPart)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
    )


def build_agent(counter_file: str, *, fail_after_tool: bool) -> Any:
    """An agent whose model calls ``work`` once, then fails with 503 or answers."""
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if not _tool_returned(messages):
            return ModelResponse(parts=[ToolCallPart("work", {"n": 7}, tool_call_id="call-1")])
        if fail_after_tool:
            raise ModelHTTPError(503, "function-model", {"error": "overloaded"})
        return ModelResponse(parts=[TextPart("finished after the tool")])

    agent: Any = Agent(FunctionModel(model))

    def work(n: int) -> str:
        """Do the side effect (counted in COUNTER_FILE)."""
        with Path(counter_file).open("a", encoding="utf-8") as fh:
            fh.write(f"{n}\n")
        return f"worked on {n}"

    agent.tool_plain(work)
    return agent


async def step_fail(url: str, namespace: str, run_id: str, counter_file: str) -> None:
    """Run until the provider fails with 503 after the tool ran."""
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai_harness.step_persistence import StepPersistence

    agent = build_agent(counter_file, fail_after_tool=True)
    async with open_checkpointer(url, scope_prefix=f"{namespace}/") as checkpointer:
        store = checkpointer.step_store()
        try:
            await agent.run(
                "do the work", capabilities=[StepPersistence(store=store, run_id=run_id)]
            )
        except ModelHTTPError as exc:
            print(json.dumps({"failed": exc.status_code}), flush=True)
            return
    raise SystemExit("the run did not fail")


async def step_resume(url: str, namespace: str, run_id: str, counter_file: str) -> None:
    """Continue ``run_id`` from its latest snapshot and finish it."""
    from pydantic_ai_harness.step_persistence import StepPersistence, continue_run

    agent = build_agent(counter_file, fail_after_tool=False)
    async with open_checkpointer(url, scope_prefix=f"{namespace}/") as checkpointer:
        store = checkpointer.step_store()
        history = await continue_run(store, run_id=run_id)
        resumed_id = f"{run_id}-resumed"
        result = await agent.run(
            None,
            message_history=history,
            capabilities=[StepPersistence(store=store, run_id=resumed_id)],
        )
        print(json.dumps({"output": result.output, "run_id": resumed_id}), flush=True)


WORKERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "journal-append": journal_append,
    "step-fail": step_fail,
    "step-resume": step_resume,
}


def main(argv: list[str] | None = None) -> None:
    """Run the worker named by the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in WORKERS:
        raise SystemExit(
            "usage: python -m agent_stores_contract.checkpointer_workers "
            f"{{{','.join(WORKERS)}}} ARGS..."
        )
    asyncio.run(WORKERS[args[0]](*args[1:]))


if __name__ == "__main__":
    main()
