"""Forks of runs beyond the contract suite: subjects carried to forks (and erased with
them), retries, and the tool-call frontier that resume and fork read alike."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from agent_stores import open_checkpointer
from agent_stores.checkpointer import Checkpointer, JournalEvent, ReplayState, UncertainEffect
from agent_stores.checkpointer.resume import (
    frontier,
    plan_resume,
    resume_run,
    save_tool_result,
)
from agent_stores.erasure import erase_subject
from agent_stores_contract.checkpointer import PAID, ToolCrash, effect_agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai_harness.step_persistence import (
    ContinuableSnapshot,
    RunRecord,
    ToolEffectRecord,
)


@pytest_asyncio.fixture
async def cp() -> AsyncIterator[Checkpointer]:
    async with open_checkpointer(f"memory://fork-{uuid.uuid4().hex[:8]}") as checkpointer:
        yield checkpointer


def _parallel_call() -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart("go")]),
        ModelResponse(
            parts=[
                ToolCallPart("alpha", {"x": 1}, tool_call_id="a"),
                ToolCallPart("beta", {"x": 2}, tool_call_id="b"),
            ]
        ),
    ]


# -- subjects ---------------------------------------------------------------------------------


async def test_fork_inherits_a_registered_subject_and_is_erased_with_it(
    cp: Checkpointer,
) -> None:
    steps = cp.step_store()
    await steps.register_run(RunRecord(run_id="src", metadata={"subject": "alice"}))
    await cp.append("src", JournalEvent.completed("000000-model", {"a": 1}))
    await steps.register_run(RunRecord(run_id="other", metadata={"subject": "bob"}))
    await cp.append("other", JournalEvent.completed("000000-model", {"b": 1}))
    fork = await cp.fork_run("src", new_run_id="f")
    nested = await cp.fork_run("f", new_run_id="ff")
    lineage = await cp.fork_of("ff")
    assert lineage is not None and lineage.subjects == ("alice",)
    record = await steps.get_run(run_id=fork.run_id)
    assert record is not None and record.metadata["subject"] == "alice"
    report = await erase_subject("alice", checkpointer=cp)
    assert set(report.runs) == {"src", "f", nested.run_id} and report.entries_left == 0
    for run_id in ("src", "f", "ff"):
        assert await cp.get_run_info(run_id) is None
    assert await cp.list_forks("src") == [] and await cp.list_forks("f") == []
    assert await cp.get_run_info("other") is not None


async def test_fork_inherits_a_bound_subject(cp: Checkpointer) -> None:
    await cp.bind_subject("src", "carol")
    await cp.append("src", JournalEvent.completed("000000-model", {"a": 1}))
    await cp.fork_run("src", new_run_id="f")
    lineage = await cp.fork_of("f")
    assert lineage is not None and lineage.subjects == ("carol",)
    report = await erase_subject("carol", checkpointer=cp)
    assert set(report.runs) == {"src", "f"} and report.entries_left == 0
    assert await cp.get_run_info("f") is None


# -- retries and odd sources ------------------------------------------------------------------


async def test_repeating_a_finished_fork_changes_nothing(cp: Checkpointer) -> None:
    steps = cp.step_store()
    effects: list[int] = []
    await effect_agent(steps, effects).run("pay", run_id="src")
    first = await cp.fork_run("src", new_run_id="f")
    state = [s.idempotency_key for s in await steps.list_snapshots(run_id="f")]
    again = await cp.fork_run("src", new_run_id="f")
    assert again == first
    assert [s.idempotency_key for s in await steps.list_snapshots(run_id="f")] == state
    assert [f.run_id for f in await cp.list_forks("src")] == ["f"]


async def test_default_fork_id_names_the_source(cp: Checkpointer) -> None:
    await cp.append("src", JournalEvent.completed("000000-model"))
    one, two = await cp.fork_run("src"), await cp.fork_run("src")
    assert one.run_id.startswith("src.fork-") and one.run_id != two.run_id
    assert [f.run_id for f in await cp.list_forks("src")] == [one.run_id, two.run_id]


async def test_fork_of_a_run_with_nothing_recorded_yet(cp: Checkpointer) -> None:
    steps = cp.step_store()
    await steps.register_run(RunRecord(run_id="src", conversation_id="c"))
    fork = await cp.fork_run("src", new_run_id="f")
    assert fork.point.describe() == "start" and fork.snapshots == fork.journal_entries == 0
    record = await steps.get_run(run_id="f")
    assert record is not None and record.conversation_id == "c"


async def test_latched_fork_can_be_retried_by_decision(cp: Checkpointer) -> None:
    steps = cp.step_store()
    effects: list[int] = []
    with pytest.raises(ToolCrash):
        await effect_agent(steps, effects, crash=True).run("pay", run_id="src")
    fork = await cp.fork_run("src")
    assert fork.latched == ("pay-1",)
    result = await resume_run(
        effect_agent(steps, effects), steps, fork.run_id, decisions={"pay-1": "retry"}
    )
    assert result.output == f"paid: {PAID}" and effects == [5, 5]


# -- the frontier resume and fork read --------------------------------------------------------


def test_frontier_of_a_settled_history_has_no_open_call() -> None:
    settled = [
        *_parallel_call(),
        ModelRequest(
            parts=[
                ToolReturnPart("alpha", "A", tool_call_id="a"),
                ToolReturnPart("beta", "again", tool_call_id="b", outcome="retried"),
            ]
        ),
    ]
    at = frontier(settled)
    assert at is not None and at.open == () and set(at.answered) == {"a", "b"}
    assert frontier([ModelRequest(parts=[UserPromptPart("hi")])]) is None
    later = [*settled, ModelResponse(parts=[TextPart("done")]), ModelRequest([UserPromptPart("x")])]
    after = frontier(later)
    assert after is not None and after.open == () and after.index == 3


def test_frontier_after_a_failure_inside_a_tool_cycle() -> None:
    partial = [*_parallel_call(), ModelRequest(parts=[ToolReturnPart("alpha", "A", "a")])]
    at = frontier(partial)
    assert at is not None and [c.tool_call_id for c in at.open] == ["b"]
    empty = frontier([*_parallel_call(), ModelRequest(parts=[])])
    assert empty is not None and [c.tool_call_id for c in empty.open] == ["a", "b"]
    # A return synthesized for an interrupted call says no result was produced: still open.
    repaired = ModelRequest(
        parts=[ToolReturnPart("beta", "interrupted", tool_call_id="b", outcome="interrupted")]
    )
    synthesized = frontier([*_parallel_call(), repaired])
    assert synthesized is not None and [c.tool_call_id for c in synthesized.open] == ["a", "b"]


def _returns(message: ModelMessage) -> list[ToolReturnPart]:
    """The parts of a request, every one of them a tool return."""
    assert isinstance(message, ModelRequest)
    parts = [p for p in message.parts if isinstance(p, ToolReturnPart)]
    assert len(parts) == len(message.parts)
    return parts


async def _saved(cp: Checkpointer, messages: list[ModelMessage]) -> None:
    await cp.step_store().save_snapshot(
        ContinuableSnapshot(run_id="r", step_index=1, messages=messages, state="interrupted")
    )


async def test_resume_sees_a_call_left_open_by_a_failure_inside_a_tool(cp: Checkpointer) -> None:
    """The history a failing run saves ends in a request holding the returns captured so
    far (here none): the missing ones are open calls, judged like a frontier's."""
    steps = cp.step_store()
    await _saved(cp, [*_parallel_call(), ModelRequest(parts=[])])
    for call, name in (("a", "alpha"), ("b", "beta")):
        await steps.record_tool_effect(
            ToolEffectRecord(tool_call_id=call, tool_name=name, run_id="r", status="started")
        )
    with pytest.raises(UncertainEffect) as info:
        await plan_resume(steps, "r")
    assert info.value.step_id == "a"
    plan = await plan_resume(steps, "r", decisions={"a": "A", "b": "deny"})
    assert [type(m) for m in plan.messages] == [ModelRequest, ModelResponse, ModelRequest]
    assert [(p.tool_call_id, p.content) for p in _returns(plan.messages[-1])] == [
        ("a", "A"),
        ("b", "The tool call was not run: it was refused while resuming the run."),
    ]
    assert [c.state for c in plan.calls] == [ReplayState.DONE, ReplayState.DENIED_CLOSED]


async def test_resume_keeps_returns_captured_before_the_failure(cp: Checkpointer) -> None:
    steps = cp.step_store()
    captured = ToolReturnPart("alpha", "A", tool_call_id="a")
    await _saved(cp, [*_parallel_call(), ModelRequest(parts=[captured])])
    await save_tool_result(steps, "r", ToolReturnPart("beta", "B", tool_call_id="b"))
    plan = await plan_resume(steps, "r")
    assert len(plan.messages) == 3
    contents = [(p.tool_call_id, p.content) for p in _returns(plan.messages[-1])]
    assert contents == [("a", "A"), ("b", "B")]
    assert [c.tool_call_id for c in plan.calls] == ["b"]
