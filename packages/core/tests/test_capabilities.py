"""The two capabilities, with scripted FunctionModel agents (details beyond the contract suite)."""

from __future__ import annotations

import asyncio

import pytest
from agent_stores.backends.memory import MemoryKV
from agent_stores.capabilities import (
    LastToolResultFallback,
    last_tool_result_fallback,
    session_checkpoints,
)
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import EffectCall, SessionStore
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel


def test_names_must_be_collections() -> None:
    with pytest.raises(TypeError):
        last_tool_result_fallback("confirm")
    with pytest.raises(TypeError):
        session_checkpoints(object(), effect_tools="pay")  # type: ignore[arg-type]


async def test_parallel_effect_calls_are_all_marked_before_any_runs() -> None:
    """Two effect calls in one response are both marked before the first tool body starts."""
    seen: list[tuple[EffectCall, ...]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("pay", {"n": 1}, tool_call_id="p1"),
                    ToolCallPart("pay", {"n": 2}, tool_call_id="p2"),
                ]
            )
        return ModelResponse(parts=[TextPart("paid")])

    agent = Agent(FunctionModel(model))
    async with SessionStore(MemoryKV()) as store:

        @agent.tool_plain
        async def pay(n: int) -> str:
            info = await store.inspect("s")
            assert info is not None
            seen.append(info.pending_effects)
            await asyncio.sleep(0)
            return "ok"

        async with store.turn("s") as session:
            result = await agent.run(
                "pay both", capabilities=[session_checkpoints(session, effect_tools={"pay"})]
            )
            session.replace(result.all_messages())
            assert session.pending_effects == ()
    assert seen[0] == (EffectCall("pay", "p1"), EffectCall("pay", "p2"))


async def test_plain_tools_write_no_marker_and_one_checkpoint_per_tool_node() -> None:
    """Without effect tools nothing is marked; each tool node costs one state write."""
    calls: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        if len(calls) <= 3:
            return ModelResponse(parts=[ToolCallPart("look", {}, tool_call_id=f"l{len(calls)}")])
        return ModelResponse(parts=[TextPart("seen")])

    agent = Agent(FunctionModel(model))

    @agent.tool_plain
    def look() -> str:
        return "a view"

    counting = CountingKV(MemoryKV())
    async with SessionStore(counting) as store:
        async with store.turn("s") as session:
            counting.reset_counts()
            result = await agent.run(
                "look", capabilities=[session_checkpoints(session, effect_tools={"pay"})]
            )
            # 3 tool nodes + the final node: one checkpoint each, no marker writes.
            assert counting.calls["replace"] == 4
            session.replace(result.all_messages())
        info = await store.inspect("s")
        assert info is not None and info.pending_effects == () and info.message_count == 8


def _model_failing_after_tools(*rounds: list[ToolCallPart]) -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        index = sum(isinstance(m, ModelResponse) for m in messages)
        if index < len(rounds):
            return ModelResponse(parts=list(rounds[index]))
        raise ModelHTTPError(status_code=502, model_name="scripted")

    return FunctionModel(model)


async def test_fallback_marks_its_answer_and_isolates_runs() -> None:
    """The fallback answer names the tool result it reused; state never leaks from one run to the next."""
    capability = last_tool_result_fallback({"confirm"})
    agent = Agent(
        _model_failing_after_tools([ToolCallPart("confirm", {}, tool_call_id="k1")]),
        capabilities=[capability],
    )

    @agent.tool_plain
    def confirm() -> dict[str, str]:
        return {"booking": "AB-1"}

    result = await agent.run("x")
    assert result.output == '{"booking":"AB-1"}'
    last = result.all_messages()[-1]
    assert isinstance(last, ModelResponse)
    assert last.provider_details == {
        "agent_stores_fallback": {
            "tool_name": "confirm",
            "tool_call_id": "k1",
            "error": "ModelHTTPError",
        }
    }
    assert isinstance(capability, LastToolResultFallback) and capability._eligible == {}

    def always_fail(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise ModelHTTPError(status_code=503, model_name="scripted")

    with pytest.raises(ModelHTTPError):
        await agent.run(
            "again", model=FunctionModel(always_fail), message_history=result.all_messages()
        )


async def test_fallback_ignores_results_superseded_by_newer_tool_calls() -> None:
    """An eligible result followed by another tool round is not what the failed request carried: the error propagates."""
    agent = Agent(
        _model_failing_after_tools(
            [ToolCallPart("confirm", {}, tool_call_id="c")],
            [ToolCallPart("other", {}, tool_call_id="o")],
        ),
        capabilities=[last_tool_result_fallback({"confirm"})],
    )

    @agent.tool_plain
    def confirm() -> str:
        return "confirmed"

    @agent.tool_plain
    def other() -> str:
        return "other"

    with pytest.raises(ModelHTTPError):
        await agent.run("x")


async def test_fallback_does_not_hide_non_provider_errors() -> None:
    """Only provider failures are recovered: a bug in the model function propagates."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        if isinstance(last, ModelRequest) and any(
            isinstance(p, ToolReturnPart) for p in last.parts
        ):
            raise ValueError("a bug")
        return ModelResponse(parts=[ToolCallPart("confirm", {})])

    agent = Agent(FunctionModel(model), capabilities=[last_tool_result_fallback({"confirm"})])

    @agent.tool_plain
    def confirm() -> str:
        return "confirmed"

    with pytest.raises(ValueError, match="a bug"):
        await agent.run("x")
