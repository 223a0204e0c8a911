"""How the conversation contract gets its store, the agent it runs, and its worker processes.

A target is either a URL (``agent_stores.open_conversations(url)``) or a third party's
factory named ``module:attribute`` (``--conversation-store``): a zero-argument callable
returning a :class:`~pydantic_ai.conversation_store.ConversationStore`, an awaitable of one,
or an async context manager yielding one (closed when the test ends). Each call opens a new
client; a factory whose clients share their data with other processes says so with a
``shared_across_processes = True`` attribute (on the factory or on the store it returns).

``python -m agent_stores_contract.conversation_workers COMMAND TARGET ...`` (TARGET:
``url=URL`` or ``factory=module:attribute``):

``resume TARGET CONVERSATION``
    Loads the conversation (paused on a deferred tool), approves every pending call, runs the
    approval agent with ``deferred_tool_results`` and saves the result; prints
    ``{"output", "requests", "pending"}``.
``race TARGET CONVERSATION PREFIX N [--barrier DIR K]``
    Loads the conversation, waits at the barrier, then forks it N times (``PREFIX<i>``, at
    ``i % 7`` messages) and saves one turn on the copy it loaded; prints one JSON line per
    fork ``{"fork", "at", "outcome"}`` and one for the save ``{"save": outcome}``.
``save-race TARGET CONVERSATION TAG [--barrier DIR K]``
    Loads the conversation, waits at the barrier, appends two messages tagged ``TAG`` and
    saves; prints ``{"tag", "outcome"}``.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.conversation_store import ConversationConflict, ConversationStore
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests

from .session_workers import pair
from .workers import barrier_args, file_barrier

#: ``--conversation-store``'s environment variable.
CONVERSATION_STORE_ENV = "AGENT_STORES_CONTRACT_CONVERSATION_STORE"

StoreFactory = Callable[[], Any]


def load_factory(spec: str) -> StoreFactory:
    """The callable ``module:attribute`` names (``attribute`` may be dotted)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(
            f"--conversation-store takes module:attribute (a callable returning a "
            f"ConversationStore or an async context manager yielding one), not {spec!r}"
        )
    found: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        found = getattr(found, name)
    if not callable(found):
        raise ValueError(f"--conversation-store {spec!r} names {found!r}, which is not callable")
    factory: StoreFactory = found
    return factory


def url_factory(url: str) -> StoreFactory:
    """Our own stores: ``agent_stores.open_conversations(url)`` (a new client per call)."""
    import agent_stores

    opener = agent_stores.open_conversations
    return lambda: opener(url)


@asynccontextmanager
async def opened(factory: StoreFactory) -> AsyncIterator[ConversationStore]:
    """The store one call of ``factory`` gives, closed on the way out if it is a context manager."""
    made = factory()
    if inspect.isawaitable(made):
        made = await made
    if hasattr(made, "__aenter__"):
        async with made as store:
            if not isinstance(store, ConversationStore):
                raise TypeError(
                    f"the factory's context manager yielded {store!r}, not a ConversationStore"
                )
            yield store
        return
    if not isinstance(made, ConversationStore):
        raise TypeError(f"the factory returned {made!r}, not a ConversationStore")
    yield made


def target_factory(target: str) -> StoreFactory:
    """The factory a worker's ``url=...`` / ``factory=...`` argument names."""
    kind, _, value = target.partition("=")
    if kind == "url":
        return url_factory(value)
    if kind == "factory":
        return load_factory(value)
    raise SystemExit(f"target must be url=URL or factory=module:attribute, not {target!r}")


# -- the scripted agent of Pydantic AI's docstring example ------------------------------------


def _approval_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Asks to delete a file when told ``delete NAME``; answers tool results and other prompts in text."""
    last = messages[-1]
    returns = (
        [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if isinstance(last, ModelRequest)
        else []
    )
    if returns:
        return ModelResponse(
            parts=[TextPart("done: " + "; ".join(str(p.content) for p in returns))]
        )
    prompts = [str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)]
    prompt = prompts[-1] if prompts else ""
    if prompt.startswith("delete "):
        return ModelResponse(
            parts=[
                ToolCallPart(
                    "delete_file", {"path": prompt.removeprefix("delete ")}, tool_call_id="del-1"
                )
            ]
        )
    return ModelResponse(parts=[TextPart(f"noted: {prompt}")])


def approval_agent() -> Agent[None, str | DeferredToolRequests]:
    """A real ``Agent`` on a ``FunctionModel`` whose ``delete_file`` tool requires approval."""
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(_approval_model), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True)
    def delete_file(path: str) -> str:
        return f"deleted {path}"

    return agent


# -- workers ----------------------------------------------------------------------------------


async def resume(target: str, conversation_id: str) -> None:
    async with opened(target_factory(target)) as store:
        conversation = await store.load(conversation_id)
        if conversation is None or conversation.deferred_tool_requests is None:
            raise SystemExit(f"{conversation_id} is not stored paused on a deferred tool")
        results = conversation.deferred_tool_requests.build_results(approve_all=True)
        result = await approval_agent().run(
            conversation=conversation, deferred_tool_results=results
        )
        await store.save(result)
        print(
            json.dumps(
                {
                    "output": str(result.output),
                    "requests": result.conversation.usage.requests,
                    "pending": result.conversation.deferred_tool_requests is not None,
                }
            ),
            flush=True,
        )


def outcome_of(exc: BaseException | None) -> str:
    """``ok``, ``conflict`` (ConversationConflict), ``missing`` (another UserError) or the error."""
    if exc is None:
        return "ok"
    if isinstance(exc, ConversationConflict):
        return "conflict"
    if isinstance(exc, UserError):
        return "missing"
    return f"error: {exc!r}"


async def race(*raw: str) -> None:
    (target, conversation_id, prefix, count), barrier = barrier_args(raw)
    async with opened(target_factory(target)) as store:
        loaded = await store.load(conversation_id)
        if loaded is None:
            raise SystemExit(f"{conversation_id} missing before the race")
        if barrier is not None:
            await file_barrier(*barrier)
        for i in range(int(count)):
            at = i % 7
            try:
                await store.fork(conversation_id, at=at, new_conversation_id=f"{prefix}{i}")
                error: BaseException | None = None
            except Exception as exc:
                error = exc
            print(
                json.dumps({"fork": f"{prefix}{i}", "at": at, "outcome": outcome_of(error)}),
                flush=True,
            )
        loaded.messages.extend(pair(f"{prefix}save"))
        try:
            await store.save(loaded)
            error = None
        except Exception as exc:
            error = exc
        print(json.dumps({"save": outcome_of(error)}), flush=True)


async def save_race(*raw: str) -> None:
    (target, conversation_id, tag), barrier = barrier_args(raw)
    async with opened(target_factory(target)) as store:
        loaded = await store.load(conversation_id)
        if loaded is None:
            raise SystemExit(f"{conversation_id} missing before the race")
        if barrier is not None:
            await file_barrier(*barrier)
        loaded.messages.extend(pair(tag))
        try:
            await store.save(loaded)
            error: BaseException | None = None
        except Exception as exc:
            error = exc
        print(json.dumps({"tag": tag, "outcome": outcome_of(error)}), flush=True)


WORKERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "resume": resume,
    "race": race,
    "save-race": save_race,
}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in WORKERS:
        raise SystemExit(
            f"usage: python -m agent_stores_contract.conversation_workers {{{','.join(WORKERS)}}} ARGS..."
        )
    asyncio.run(WORKERS[args[0]](*args[1:]))


if __name__ == "__main__":
    main()
