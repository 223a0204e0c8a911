"""How often the busiest Firestore documents are written: ``python measure_hot_documents.py URL``.

Counts, at the gRPC channel, every document each ``Commit`` writes while running session
turns on one session and journal appends on one run, and prints the writes per operation
of the most written documents and the rates the emulator reached. The counts per
operation are the store's logic and hold on the real service; the rates are the
emulator's (one local process, no replication, no per-document write limit) and say
nothing about production: see docs/firestore.md, "Hot documents".
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections import Counter
from typing import Any

import grpc  # type: ignore[import-untyped]
from agent_stores import open_sessions
from agent_stores.checkpointer import Checkpointer, JournalEvent, make_step_id
from agent_stores.url import StoreURL
from agent_stores_firestore.kv import FirestoreKV
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart


class CommitCounter(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.writes: Counter[str] = Counter()

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method.endswith("/Commit"):
            for write in request.writes:
                name = write.update.name or write.delete
                self.writes[name.rsplit("/scopes/", 1)[-1]] += 1
        return await continuation(details, request)


async def main(url: str, count: int = 50) -> None:
    url = StoreURL.parse(url).with_query(prefix=f"hot-{uuid.uuid4().hex[:8]}").render_with_secrets()
    counter = CommitCounter()
    kv = FirestoreKV.from_url(url, interceptors=[counter])
    async with open_sessions(kv) as sessions:
        started = time.perf_counter()
        for t in range(count):
            async with sessions.turn("hot") as s:
                s.replace(
                    [
                        *s.messages,
                        ModelRequest(parts=[UserPromptPart(f"q{t}")]),
                        ModelResponse(parts=[TextPart(f"a{t}")]),
                    ]
                )
        took = time.perf_counter() - started
    report("session turns on one session", counter, count, took)
    counter.writes.clear()
    kv = FirestoreKV.from_url(url, interceptors=[counter])
    journal = Checkpointer(kv)
    started = time.perf_counter()
    for i in range(1, count + 1):
        await journal.append("run", JournalEvent(step_id=make_step_id(i, "model"), payload=i))
    took = time.perf_counter() - started
    report("journal appends on one run", counter, count, took)
    await kv.aclose()


def report(what: str, counter: CommitCounter, count: int, took: float) -> None:
    print(f"{what}: {count} in {took:.2f} s on the emulator ({count / took:.0f}/s)")
    for name, writes in counter.writes.most_common(3):
        print(f"  {writes / count:.2f} writes per operation to …/{name[:90]}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
