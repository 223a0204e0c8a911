"""The checkpointer on Redis appends with the core's commit port: a log's counter and its
entry in one commit script, one round trip per append once the run's counter is known,
on a standalone server and on a cluster (one scope is one hash slot). Commands are
counted on the client, never timed."""

from __future__ import annotations

import pytest
from agent_stores import open_checkpointer
from agent_stores.backend import CommitJournalPort
from agent_stores.checkpointer import JournalEvent
from pydantic_ai_harness.step_persistence import RunRecord, StepEvent
from redis_test_support import Commands, with_fresh_prefix


@pytest.mark.parametrize("target", ["redis", "redis-cluster"])
async def test_an_append_is_one_script(
    target: str, redis_urls: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_checkpointer(with_fresh_prefix(redis_urls[target])) as cp:
        assert isinstance(cp.port, CommitJournalPort)
        # A run's first append also indexes the run and reads its counter: not counted.
        await cp.append("run", JournalEvent.attempted("000000-model", {"q": 0}))
        commands = Commands(monkeypatch)
        for i in range(1, 4):
            commands.sent.clear()
            await cp.append("run", JournalEvent.attempted(f"{i:06d}-model", {"q": i}))
            assert commands.sent == ["EVALSHA"], commands.sent
        commands.sent.clear()
        duplicate = await cp.append("run", JournalEvent.attempted("000003-model", {"q": 3}))
        assert duplicate.duplicate and duplicate.seq == 3
        state = await cp.load("run")
        assert [(e.seq, e.step_id) for e in state.entries] == [
            (i, f"{i:06d}-model") for i in range(4)
        ]
        steps = cp.step_store()
        await steps.register_run(RunRecord(run_id="harness", agent_name="bot"))
        await steps.append_event(
            StepEvent(run_id="harness", kind="model_request_started", step_index=0)
        )
        commands.sent.clear()
        await steps.append_event(
            StepEvent(run_id="harness", kind="model_request_completed", step_index=0)
        )
        assert commands.sent == ["EVALSHA"], commands.sent
