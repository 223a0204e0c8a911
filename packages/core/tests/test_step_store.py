"""The KV step store beyond the contract: harness helpers, odd ids, TTL, lost pointer updates."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import open_checkpointer, open_kv
from agent_stores.checkpointer import Checkpointer, KVStepStore
from agent_stores_contract.checkpointer import FlakyKV, offset_clock, tool_call_messages
from pydantic_ai_harness.step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    StepEvent,
    StepPersistence,
    ToolEffectRecord,
    continue_run,
    fork_run,
)
from pydantic_ai_harness.step_persistence.recovery import inspect_recovery


@pytest_asyncio.fixture
async def steps() -> AsyncIterator[KVStepStore]:
    async with open_checkpointer(f"memory://steps-{uuid.uuid4().hex[:8]}") as cp:
        yield cp.step_store()


def snapshot(
    run_id: str, step: int, key: str | None, state: Any = "complete"
) -> ContinuableSnapshot:
    return ContinuableSnapshot(
        run_id=run_id,
        step_index=step,
        messages=tool_call_messages(f"prompt {step}"),
        state=state,
        idempotency_key=key,
    )


async def test_standalone_store_owns_its_kv(tmp_path: Path) -> None:
    kv = open_kv(f"sqlite:///{tmp_path}/s.db")
    async with KVStepStore(kv, owns_kv=True, scope_prefix="own/") as store:
        await store.register_run(RunRecord(run_id="r"))
        assert (await store.get_run(run_id="r")) is not None
        assert "own" in repr(store)
    assert kv.closed
    with pytest.raises(ValueError):
        KVStepStore(kv, max_snapshots_per_run=0)
    with pytest.raises(ValueError):
        KVStepStore(kv, max_snapshots_per_run=True)  # type: ignore[arg-type]


async def test_checkpointer_gives_one_step_store() -> None:
    async with open_checkpointer("memory://") as cp:
        assert cp.step_store() is cp.step_store()
        assert cp.step_store().space is cp.space


async def test_long_and_odd_keys(steps: KVStepStore) -> None:
    """Idempotency keys and tool call ids of any length and content work (hashed when long)."""
    long_key = "k" * 5000
    event = StepEvent(run_id="r", kind="run_started", step_index=0, idempotency_key=long_key)
    await steps.append_event(event)
    await steps.append_event(event)
    assert await steps.list_events(run_id="r") == [event]
    odd_call = "call/with:odd chars é " + "x" * 600
    record = ToolEffectRecord(tool_call_id=odd_call, tool_name="t", run_id="r", status="started")
    await steps.record_tool_effect(record)
    assert await steps.get_tool_effect(run_id="r", tool_call_id=odd_call) == record
    await steps.save_snapshot(snapshot("r", 1, long_key))
    await steps.save_snapshot(snapshot("r", 1, long_key))
    assert len(await steps.list_snapshots(run_id="r")) == 1


async def test_messages_stored_once_per_run(steps: KVStepStore) -> None:
    """Each message is stored once per run however many snapshots repeat it."""
    history = tool_call_messages()
    for step in range(1, 5):
        await steps.save_snapshot(
            ContinuableSnapshot(run_id="r", step_index=step, messages=history[:step])
        )
    stored = [
        item.key
        async for item in steps.kv.iter_scan(steps.space.scope("r"), prefix="m/", values=False)
    ]
    assert len(stored) == len(history)
    restored = await steps.list_snapshots(run_id="r")
    assert [s.messages for s in restored] == [history[:step] for step in range(1, 5)]


async def test_lost_pointer_update_repaired_by_retry() -> None:
    """A save whose pointer update failed is invisible to latest_snapshot until its retry, which
    is suppressed as a duplicate and repairs the pointer."""
    flaky = FlakyKV(open_kv(f"memory://ptr-{uuid.uuid4().hex[:6]}"))
    async with Checkpointer(flaky, owns_kv=True) as cp:
        steps = cp.step_store()
        flaky.fail_before.add("sp")
        with pytest.raises(ConnectionError):
            await steps.save_snapshot(snapshot("r", 1, "0:1:complete"))
        assert await steps.latest_snapshot(run_id="r") is None
        await steps.save_snapshot(snapshot("r", 1, "0:1:complete"))
        latest = await steps.latest_snapshot(run_id="r")
        assert latest is not None and latest.idempotency_key == "0:1:complete"
        assert len(await steps.list_snapshots(run_id="r")) == 1


async def test_concurrent_snapshot_saves_keep_newest(tmp_path: Path) -> None:
    """Snapshots saved concurrently from several clients: all kept, the pointer names the newest."""
    url = f"sqlite:///{tmp_path}/snaps.db"
    clients = [Checkpointer(open_kv(url), owns_kv=True) for _ in range(3)]
    try:
        await asyncio.gather(
            *(
                clients[i % 3].step_store().save_snapshot(snapshot("r", i, f"{i}:{i}:complete"))
                for i in range(12)
            )
        )
        store = clients[0].step_store()
        listed = await store.list_snapshots(run_id="r")
        assert sorted(s.step_index for s in listed) == list(range(12))
        latest = await store.latest_snapshot(run_id="r")
        assert latest is not None and latest.step_index == listed[-1].step_index
    finally:
        for client in clients:
            await client.aclose()


async def test_ttl_covers_step_store_records() -> None:
    kv = open_kv(f"memory://ttl-{uuid.uuid4().hex[:6]}")
    async with Checkpointer(kv, owns_kv=True, ttl_seconds=50) as cp:
        steps = cp.step_store()
        await steps.register_run(RunRecord(run_id="r", conversation_id="c"))
        await steps.append_event(StepEvent(run_id="r", kind="run_started", step_index=0))
        await steps.save_snapshot(snapshot("r", 1, None))
        await steps.record_tool_effect(
            ToolEffectRecord(tool_call_id="c1", tool_name="t", run_id="r", status="started")
        )
        offset_clock(kv, 51)
        assert await steps.get_run(run_id="r") is None
        assert await steps.list_runs(conversation_id="c") == []
        assert await steps.list_events(run_id="r") == []
        assert await steps.latest_snapshot(run_id="r") is None
        assert await steps.list_unresolved_tool_effects(run_id="r") == []


async def test_harness_helpers_work_unchanged(steps: KVStepStore) -> None:
    """continue_run, fork_run and inspect_recovery read our store like the harness's own."""
    settled, interrupted = (
        snapshot("r", 1, "0:1:complete"),
        snapshot("r", 2, "1:2:interrupted", state="interrupted"),
    )
    await steps.save_snapshot(settled)
    await steps.save_snapshot(interrupted)
    await steps.record_tool_effect(
        ToolEffectRecord(tool_call_id="c9", tool_name="pay", run_id="r", status="started")
    )
    await steps.append_event(
        StepEvent(run_id="r", kind="tool_call_completed", step_index=1, tool_name="read")
    )
    assert await continue_run(steps, run_id="r") == settled.messages
    assert await fork_run(steps, run_id="r", include_interrupted=True) == interrupted.messages
    report = await inspect_recovery(store=steps, run_id="r")
    assert report.settled is not None and report.settled.step_index == 1
    assert report.latest is not None and report.latest.step_index == 2
    assert [r.tool_call_id for r in report.unresolved] == ["c9"]
    assert report.completed_tools == ("read",)
    with pytest.raises(LookupError):
        await continue_run(steps, run_id="unknown")


async def test_step_persistence_capture_frontier_and_reuse_guard(steps: KVStepStore) -> None:
    """StepPersistence with capture_frontier writes on our store; reusing an explicit run_id is refused."""
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    agent: Any = Agent(TestModel(custom_output_text="ok"))
    result = await agent.run(
        "hi", capabilities=[StepPersistence(store=steps, run_id="front", capture_frontier=True)]
    )
    assert result.output == "ok"
    kinds = [e.kind for e in await steps.list_events(run_id="front")]
    assert kinds[0] == "run_started" and kinds[-1] == "run_completed"
    latest = await steps.latest_snapshot(run_id="front")
    assert latest is not None and latest.messages == result.all_messages()
    with pytest.raises(ValueError, match="single-shot"):
        await agent.run("again", capabilities=[StepPersistence(store=steps, run_id="front")])


async def test_delegate_lineage_by_parent(steps: KVStepStore) -> None:
    """A delegate run inside a tool records its parent; list_runs(parent_run_id=...) finds it."""
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    child: Any = Agent(TestModel(custom_output_text="child done"))
    parent: Any = Agent(TestModel(call_tools=["delegate"], custom_output_text="parent done"))

    async def delegate() -> str:
        result = await child.run("sub task", capabilities=[StepPersistence(store=steps)])
        return str(result.output)

    parent.tool_plain(delegate)
    await parent.run(
        "go", conversation_id="conv-1", capabilities=[StepPersistence(store=steps, run_id="boss")]
    )
    children = await steps.list_runs(parent_run_id="boss")
    assert len(children) == 1 and children[0].parent_run_id == "boss"
    assert [r.run_id for r in await steps.list_runs(conversation_id="conv-1")] == ["boss"]


async def test_long_lineage_ids(steps: KVStepStore) -> None:
    """Conversation and parent ids longer than a scope name allows still index and list."""
    conversation, parent = "c" * 3000, "p" * 3000
    await steps.register_run(
        RunRecord(run_id="r", conversation_id=conversation, parent_run_id=parent)
    )
    assert [r.run_id for r in await steps.list_runs(conversation_id=conversation)] == ["r"]
    assert [r.run_id for r in await steps.list_runs(parent_run_id=parent)] == ["r"]
    assert await steps.list_runs(conversation_id="c" * 2999) == []
