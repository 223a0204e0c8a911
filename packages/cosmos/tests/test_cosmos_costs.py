"""Requests per operation, as documented in docs/cosmos.md (counted by ``kv.stats``).

Counts, not times: each figure is the number of HTTP requests the Azure SDK sent, so a
change that adds a round trip to a hot path fails here.
"""

from __future__ import annotations

import uuid

from agent_stores import open_kv
from agent_stores.checkpointer import Checkpointer
from agent_stores.memory import KVMemoryStore
from agent_stores.sessions import SessionStore
from agent_stores_cosmos.kv import CosmosKV
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart


def pair(i: int) -> list[ModelMessage]:
    text = f"message {i} " + "lorem ipsum dolor sit amet " * 14
    return [
        ModelRequest(parts=[UserPromptPart(content=text[:380])]),
        ModelResponse(parts=[TextPart(content=text[:400])], model_name="costs"),
    ]


async def test_requests_per_warm_turn_memory_write_and_step_append(cosmos_url: str) -> None:
    """Warm turn: 3-4 requests; memory write 3-4, read 1; step append 2."""
    kv = open_kv(cosmos_url)
    assert isinstance(kv, CosmosKV)
    stats = kv.stats
    await kv.setup()

    sessions = SessionStore(kv)
    sid = f"costs-{uuid.uuid4().hex[:8]}"
    async with sessions.turn(sid) as s:
        s.replace([m for i in range(5) for m in pair(i)])
    turns = []
    for i in range(6):
        before = stats.requests
        async with sessions.turn(sid) as s:
            s.replace([*s.messages, *pair(100 + i)])
        turns.append(stats.requests - before)
    assert max(turns) <= 4 and min(turns) == 3, turns

    from pydantic_ai_harness.memory import MemoryOperation

    memory = KVMemoryStore(kv)
    path = f"costs/{uuid.uuid4().hex[:6]}/notes.md"
    version = None
    writes, reads = [], []
    for i in range(4):
        before = stats.requests
        mutation = await memory.write(
            path,
            f"note {i}\n" * 20,
            expected_version=version,
            operation=MemoryOperation(id=f"op-{uuid.uuid4().hex}", fingerprint=f"fp{i}"),
        )
        version = mutation.version
        writes.append(stats.requests - before)
        before = stats.requests
        await memory.read(path, max_chars=10_000)
        reads.append(stats.requests - before)
    assert max(writes) <= 4 and writes[1:] == [3, 3, 3], writes
    assert reads == [1, 1, 1, 1], reads

    from pydantic_ai_harness.step_persistence import RunRecord, StepEvent

    steps = Checkpointer(kv).step_store()
    run_id = f"costs-{uuid.uuid4().hex[:6]}"
    await steps.register_run(RunRecord(run_id=run_id))
    appends = []
    for i in range(5):
        before = stats.requests
        await steps.append_event(
            StepEvent(
                run_id=run_id, kind="model_request", step_index=i, idempotency_key=f"{run_id}-{i}"
            )
        )
        appends.append(stats.requests - before)
    assert appends == [2] * 5, appends
    assert stats.request_charge > 0  # the header is read (1 RU per request on the test server)
    await kv.aclose()
