"""Subprocess workers of the session contract, and the scripted agents it shares with them.

``python -m agent_stores_contract.session_workers COMMAND URL SESSION_ID ...``:

``turns URL SESSION N LEASE [--barrier DIR K] [--contend]``
    N turns on one session; each appends two messages tagged ``<pid>-<i>`` and prints
    ``{"tag", "start", "end", "seen"}`` (wall-clock ns inside the turn, messages seen).
    With ``--contend``, the session's very first turn is held until the K - 1 other
    processes wait in its queue.
``hold URL SESSION LEASE``
    One turn: checkpoint ``[checkpointed]``, replace with one more message (never saved),
    print ``{"ready": true}``, then sleep until killed.
``effect URL SESSION LEASE``
    One agent run with ``session_checkpoints``: the effect tool prints ``{"ready": true}``
    and sleeps until killed.
``agent-turn URL SESSION PROMPT``
    One agent run continuing the session's conversation; prints ``{"output": ...}``.
``forks URL SESSION PREFIX N``
    N forks of the session (whole, or at turn 1 or 2) named ``PREFIX<i>``, on a store with
    a small inline tail and fanout 2; prints ``{"fork": id, "texts": [...]}`` for each
    as read back right after it was made.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from agent_stores import KVStore, connect, open_sessions
from agent_stores.capabilities import session_checkpoints
from agent_stores.sessions import SessionStore
from pydantic_ai import Agent
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

from .workers import BARRIER_SECONDS, barrier_args, file_barrier

# -- shared helpers ---------------------------------------------------------------------------


def pair(tag: str, pad: int = 0) -> list[ModelMessage]:
    """A user prompt and a model answer carrying ``tag`` (plus ``pad`` filler characters each)."""
    filler = " " + "x" * pad if pad else ""
    return [
        ModelRequest(parts=[UserPromptPart(f"q:{tag}{filler}")]),
        ModelResponse(parts=[TextPart(f"a:{tag}{filler}")]),
    ]


def texts(messages: Sequence[ModelMessage]) -> list[str]:
    """The user prompts and model texts of ``messages``, in order (filler removed)."""
    out: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart | TextPart) and isinstance(part.content, str):
                out.append(part.content.split(" ", 1)[0])
    return out


def prompts_model() -> FunctionModel:
    """A model answering with every user prompt of the conversation so far, joined by ``|``."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts = [
            str(p.content)
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, UserPromptPart)
        ]
        return ModelResponse(parts=[TextPart("heard: " + " | ".join(prompts))])

    return FunctionModel(answer)


def one_call_model(tool_name: str, args: dict[str, Any], final: str = "done") -> FunctionModel:
    """A model that calls ``tool_name`` once per user prompt, retries after a retry, then answers ``final``."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest):
            if any(isinstance(p, UserPromptPart) for p in last.parts):
                return ModelResponse(parts=[ToolCallPart(tool_name, args)])
            if any(isinstance(p, ToolReturnPart) and p.outcome == "retried" for p in last.parts):
                return ModelResponse(parts=[ToolCallPart(tool_name, args)])
        return ModelResponse(parts=[TextPart(final)])

    return FunctionModel(answer)


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


# -- workers ----------------------------------------------------------------------------------


async def turns(*raw: str) -> None:
    """``URL SESSION N LEASE [--barrier DIR K] [--contend]``: run N turns, each appending two
    tagged messages.

    Prints one JSON line per turn (times in ns: asked for the session, got it, released
    it; messages seen). Behind the barrier, the processes start their turns
    together, connected already. ``--contend``: the first process to get the session
    holds it until the others queue behind it, so they compete from their first turn
    however late a loaded machine wakes them after the barrier.
    """
    contend = "--contend" in raw
    (url, session_id, count, lease), barrier = barrier_args(
        tuple(arg for arg in raw if arg != "--contend")
    )
    async with open_sessions(url, lease_seconds=float(lease)) as store:
        # Connected and warmed up (first-call costs: scripts, statements) before the barrier.
        async with store.turn(f"{session_id}.warm-up-{os.getpid()}") as warm:
            warm.replace(pair("warm-up"))
        if barrier is not None:
            await file_barrier(*barrier)
        for i in range(int(count)):
            asked = time.time_ns()
            async with store.turn(session_id, timeout_seconds=180) as session:
                start = time.time_ns()
                tag = f"{os.getpid()}-{i}"
                seen = len(session.messages)
                if contend and seen == 0 and barrier is not None:
                    await others_queued(store, session_id, int(barrier[1]) - 1)
                await asyncio.sleep(random.random() * 0.005)
                session.replace([*session.messages, *pair(tag)])
                end = time.time_ns()
            emit({"tag": tag, "asked": asked, "start": start, "end": end, "seen": seen})


async def others_queued(store: SessionStore, session_id: str, others: int) -> None:
    """Wait until ``others`` clients wait in the session's queue (at most
    :data:`~agent_stores_contract.workers.BARRIER_SECONDS`; then go on, and the test judges
    whether the processes competed)."""
    deadline = time.monotonic() + BARRIER_SECONDS
    # Remote state (other processes' tickets): nothing to await but polling.
    while len(await store.waiting(session_id)) < others and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.005)


async def hold(url: str, session_id: str, lease: str) -> None:
    """Checkpoint, mark an unsaved replacement, then wait to be killed inside the turn."""
    store = open_sessions(url, lease_seconds=float(lease))
    async with store, store.turn(session_id, timeout_seconds=30) as session:
        saved = [*session.messages, *pair("checkpointed")]
        await session.checkpoint(saved)
        session.replace([*saved, *pair("unsaved")])
        emit({"ready": True, "fence": session.fence})
        await asyncio.sleep(3600)


async def effect(url: str, session_id: str, lease: str) -> None:
    """Start an effect tool under ``session_checkpoints`` and wait to be killed inside it."""
    agent = Agent(one_call_model("charge_card", {"amount": 12}))

    @agent.tool_plain
    async def charge_card(amount: int) -> str:
        emit({"ready": True})
        await asyncio.sleep(3600)
        return "charged"

    store = open_sessions(url, lease_seconds=float(lease))
    async with store, store.turn(session_id, timeout_seconds=30) as session:
        result = await agent.run(
            "pay",
            message_history=session.messages,
            conversation_id=session.session_id,
            capabilities=[session_checkpoints(session, effect_tools={"charge_card"})],
        )
        session.replace(result.all_messages())


async def forks(url: str, session_id: str, prefix: str, count: str) -> None:
    """Fork the session ``count`` times and print what each fork holds."""
    from agent_stores.sessions import TurnOutOfRangeError

    rng = random.Random(os.getpid())
    store = open_sessions(url, tail_bytes=300, fanout=2)
    async with store:
        for i in range(int(count)):
            name = f"{prefix}{i}"
            try:
                await store.fork(session_id, name, at_turn=rng.choice([None, 1, 2]))
            except TurnOutOfRangeError:
                continue
            got = await store.read_messages(name)
            emit({"fork": name, "texts": texts(got or [])})
    emit({"done": True})


async def agent_turn(url: str, session_id: str, prompt: str) -> None:
    """Continue the conversation with one agent run through ``turn()``."""
    agent = Agent(prompts_model())
    store = open_sessions(url)
    async with store, store.turn(session_id, timeout_seconds=30) as session:
        result = await agent.run(
            prompt, message_history=session.messages, conversation_id=session.session_id
        )
        session.replace(result.all_messages())
    emit({"output": result.output, "messages": len(result.all_messages())})


def stop_dropping_after(kv: KVStore, stop_after: str) -> None:
    """Make ``kv`` stop for good before its ``stop_after + 1``-th ``drop_scope`` (printing
    ``{"dropped": N}``), so the test can kill the process there."""
    drop = kv.drop_scope
    dropped = 0

    async def counted(scope: str) -> int:
        nonlocal dropped
        if dropped >= int(stop_after):
            emit({"dropped": dropped})
            await asyncio.sleep(3600)
        dropped += 1
        return await drop(scope)

    kv.drop_scope = counted  # type: ignore[method-assign]


async def erase_owner(url: str, owner: str, stop_after: str) -> None:
    """Erase ``owner``'s sessions, stopping for good after ``stop_after`` sessions were
    dropped (it prints ``{"dropped": N}`` and waits to be killed)."""
    async with open_sessions(url) as store:
        stop_dropping_after(store.kv, stop_after)
        await store.erase_owner(owner)


async def erase_subject(
    url: str, subject: str, memory_prefix: str, runs_prefix: str, stop_after: str
) -> None:
    """Erase ``subject`` from the sessions, the memory store at ``memory_prefix`` and the
    checkpointer at ``runs_prefix``, stopping for good after ``stop_after`` scopes were
    dropped (it prints ``{"dropped": N}`` and waits to be killed)."""
    from agent_stores.erasure import erase_subject as erase

    async with connect(url) as connection:
        stop_dropping_after(connection.kv, stop_after)
        await erase(
            subject,
            sessions=connection.sessions(),
            memory=connection.memory(scope_prefix=memory_prefix),
            checkpointer=connection.checkpointer(scope_prefix=runs_prefix),
        )


WORKERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "turns": turns,
    "hold": hold,
    "effect": effect,
    "agent-turn": agent_turn,
    "forks": forks,
    "erase-owner": erase_owner,
    "erase-subject": erase_subject,
}


def main(argv: list[str] | None = None) -> None:
    """Run the worker named by the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in WORKERS:
        raise SystemExit(
            f"usage: python -m agent_stores_contract.session_workers {{{','.join(WORKERS)}}} ARGS..."
        )
    asyncio.run(WORKERS[args[0]](*args[1:]))


if __name__ == "__main__":
    main()
