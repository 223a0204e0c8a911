"""Pydantic AI's ConversationStore on every backend: requests, bytes and time per operation.

Usage: ``python benchmarks/conversations.py [--quick] [--markdown docs/benchmarks.md]
[--only sqlite redis …]``
(``--markdown`` may be given twice: docs/benchmarks.md and docs/requests.md), with the servers' URLs in ``AGENT_STORES_BENCH_<NAME>`` (``nox -s
bench`` sets them); SQLite always runs.

Per backend, under a fresh prefix: a conversation of 1,000 messages is loaded by a store
that has cached nothing (another process), a turn is run on it and saved; conversations
of 10 and 10,000 messages are forked half-way; one scope's 25 conversations are listed 20
at a time. Requests are counted where the client sends them (``catalog.Target``); bytes
written are the KV values written (``CountingKV``). Beside them, a turn (load, run, save)
timed on the same backend with the session store's ``turn()`` and with Pydantic AI's
``InMemoryConversationStore``, as references.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agent_stores import connect
from agent_stores.conversations import KVConversationStore
from agent_stores.kv.counting import CountingKV
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationStore, InMemoryConversationStore
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

try:  # run as a script (python benchmarks/conversations.py) or imported as a module
    from catalog import (  # type: ignore[import-not-found,unused-ignore]
        Target,
        backend_urls,
        drop_everything,
    )
    from pages import load_line, replace_or_add_section  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - imported from the repository root
    from benchmarks.catalog import Target, backend_urls, drop_everything
    from benchmarks.pages import load_line, replace_or_add_section

START, END = "<!-- conversations:start -->", "<!-- conversations:end -->"
FORK_SIZES = (10, 10_000)
LOADED = 1_000
LISTED = 25


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart(content=f"answer to {len(messages)} " + "a" * 60)])


AGENT = Agent(FunctionModel(_reply))


def history(messages: int) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for i in range(messages // 2):
        out.append(ModelRequest(parts=[UserPromptPart(content=f"question {i} " + "q" * 60)]))
        out.append(ModelResponse(parts=[TextPart(content=f"answer {i} " + "a" * 60)]))
    return out


async def turn_ms(store: ConversationStore, conversation_id: str, turns: int) -> float:
    """Median time of a turn: load, run (scripted model), save."""
    times = []
    for i in range(turns):
        started = time.perf_counter()
        loaded = await store.load(conversation_id)
        assert loaded is not None
        result = await AGENT.run(f"turn {i}", conversation=loaded)
        await store.save(result)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def session_turn_ms(kv: Any, turns: int) -> float:
    store = connect(kv).sessions(scope_prefix="bench-conv-session:")
    async with store.turn("ref") as session:
        session.replace(history(LOADED))
    times = []
    for i in range(turns):
        started = time.perf_counter()
        async with store.turn("ref") as session:
            result = await AGENT.run(f"turn {i}", message_history=session.messages)
            session.replace(result.all_messages())
        times.append(time.perf_counter() - started)
    await store.storage.drain()
    return statistics.median(times) * 1000


async def measure(target: Target, turns: int) -> dict[str, float]:
    kv = await target.open()
    counting = CountingKV(kv)
    store = KVConversationStore(counting, scope_prefix="bench-conv:")
    row: dict[str, float] = {}
    try:
        await kv.setup()
        await store.save(Conversation(conversation_id="long", messages=history(LOADED)))
        cold = KVConversationStore(counting, scope_prefix="bench-conv:")
        loaded: list[Conversation] = []

        async def load() -> None:
            conversation = await cold.load("long")
            assert conversation is not None and len(conversation.messages) == LOADED
            loaded.append(conversation)

        row["load"] = await target.count(load)
        result = await AGENT.run("one more", conversation=loaded[0])

        async def save() -> None:
            await cold.save(result)

        counting.reset_counts()
        row["save"] = await target.count(save)
        row["save_bytes"] = counting.bytes_written
        for size in FORK_SIZES:
            source = f"src-{size}"
            await store.save(Conversation(conversation_id=source, messages=history(size)))
            counting.reset_counts()

            async def fork(source: str = source, size: int = size) -> None:
                await cold.fork(source, at=size // 2, new_conversation_id=f"fork-{size}")

            row[f"fork{size}"] = await target.count(fork)
            row[f"fork{size}_bytes"] = counting.bytes_written
        for i in range(LISTED):
            await store.save(
                Conversation(conversation_id=f"listed-{i}", messages=history(2)), scope="owner"
            )

        async def listing() -> None:
            assert len(await cold.list_conversations(scope="owner", limit=20)) == 20

        row["list"] = await target.count(listing)
        row["turn_ms"] = await turn_ms(store, "long", turns)
        row["session_turn_ms"] = await session_turn_ms(kv, turns)
    finally:
        await store.aclose()
        await drop_everything(target)
        await kv.aclose()
    print(f"{target.name}: {row}", flush=True)
    return row


def table(results: dict[str, dict[str, float]], reference_ms: float) -> str:
    lines = [
        "Pydantic AI's `ConversationStore` (`agent_stores.open_conversations`): requests "
        "counted at the client (redis-py's command packing; the cloud SDKs' transport; KV "
        f"calls on SQLite and PostgreSQL) of a cold `load` of {LOADED:,} messages, the "
        "`save` of the turn after it, a `fork` half-way through 10 and 10,000 messages (with "
        "the bytes it wrote) and `list_conversations(scope=…, limit=20)`; then the median "
        f"time of a turn (load, scripted run, save) on a {LOADED:,}-message conversation, "
        "beside the session store's `turn()` on the same backend and history:",
        "",
        "| backend | load h1000 | save | fork h10: requests, bytes | fork h10,000: requests, "
        "bytes | list | save bytes | turn ms | session `turn()` ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in results.items():
        lines.append(
            f"| {name} | {row['load']:.0f} | {row['save']:.0f} | "
            f"{row['fork10']:.0f}, {row['fork10_bytes']:,.0f} | "
            f"{row['fork10000']:.0f}, {row['fork10000_bytes']:,.0f} | {row['list']:.0f} | "
            f"{row['save_bytes']:,.0f} | {row['turn_ms']:.2f} | {row['session_turn_ms']:.2f} |"
        )
    lines += [
        "",
        f"Reference: Pydantic AI's `InMemoryConversationStore`, the same turn: "
        f"{reference_ms:.2f} ms (in memory, one entry read per message on load). Targets: "
        "load ≤ 3 requests, save ≤ 2, fork bytes flat from 10 to 10,000 messages, list ≤ 2 "
        "per page. A fork writes its record and one pin in its source's owner scope, "
        "whatever the history; a save writes the record and one segment of the new "
        "entries, whatever came before.",
        "",
        f"_{load_line()}; `python benchmarks/conversations.py`._",
    ]
    return "\n".join(lines)


async def reference(turns: int) -> float:
    store = InMemoryConversationStore()
    await store.save(Conversation(conversation_id="long", messages=history(LOADED)))
    return await turn_ms(store, "long", turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 timed turns, not 30")
    parser.add_argument(
        "--markdown",
        type=Path,
        action="append",
        default=[],
        help="replace the table in these pages",
    )
    parser.add_argument("--only", nargs="*", default=None, help="only these backends")
    args = parser.parse_args()
    turns = 5 if args.quick else 30
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, url in backend_urls(tmp, "conversations.db").items():
            if args.only and name not in args.only:
                continue
            results[name] = asyncio.run(measure(Target(name, url), turns))
    text = table(results, asyncio.run(reference(turns)))
    print(text)
    for page in args.markdown:
        replace_or_add_section(page, "Pydantic AI ConversationStore", START, END, text)


if __name__ == "__main__":
    main()
