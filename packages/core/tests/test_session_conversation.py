"""``turn()`` keeps the whole Pydantic AI ``Conversation``: ``session.conversation`` and
``session.save(result)`` carry usage and deferred tool requests across turns and processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import agent_stores
import pytest
from agent_stores.sessions import SessionStore
from agent_stores.sessions.errors import InvalidSessionError
from agent_stores.sessions.info import SessionInfo
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, ToolReturnPart) for p in last.parts):
        return ModelResponse(parts=[TextPart("booked it")])
    prompt = str(last.parts[-1].content) if isinstance(last, ModelRequest) else ""  # type: ignore[union-attr]
    if "book" in prompt:
        return ModelResponse(parts=[ToolCallPart("book", {"day": "friday"}, tool_call_id="b1")])
    return ModelResponse(parts=[TextPart("hello")])


def _agent() -> Agent[None, str | DeferredToolRequests]:
    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(_model), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True)
    def book(day: str) -> str:
        return f"booked {day}"

    return agent


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 's.db'}"


@pytest.fixture
async def sessions(url: str) -> AsyncIterator[SessionStore]:
    async with agent_stores.open_sessions(url, scope_prefix="conv-state:") as store:
        yield store


async def test_a_paused_run_resumes_on_the_next_turn_with_usage_accumulated(
    sessions: SessionStore,
) -> None:
    agent = _agent()
    async with sessions.turn("trip") as session:
        assert session.conversation.usage.requests == 0
        result = await agent.run("hi", conversation=session.conversation)
        session.save(result)
    async with sessions.turn("trip") as session:
        result = await agent.run("book friday", conversation=session.conversation)
        assert isinstance(result.output, DeferredToolRequests)
        session.save(result)
    # A new store: nothing cached (another process on sqlite).
    async with agent_stores.open_sessions(sessions.kv, scope_prefix="conv-state:") as again:
        async with again.turn("trip") as session:
            conversation = session.conversation
            pending = conversation.deferred_tool_requests
            assert pending is not None and [c.tool_call_id for c in pending.approvals] == ["b1"]
            assert conversation.usage.requests == 2
            assert conversation.conversation_id == "trip"
            answers = DeferredToolResults(approvals={"b1": True})
            result = await agent.run(conversation=conversation, deferred_tool_results=answers)
            assert result.output == "booked it"
            session.save(result)
        async with again.turn("trip") as session:
            assert session.conversation.deferred_tool_requests is None
            assert session.conversation.usage.requests == 3
            assert session.conversation.messages == result.all_messages()


async def test_a_session_saved_with_replace_reads_as_zero_usage_and_upgrades_on_save(
    sessions: SessionStore,
) -> None:
    """A record as today's code writes it (``replace`` only) reads unchanged."""
    agent = _agent()
    async with sessions.turn("old") as session:
        result = await agent.run("hi", message_history=session.messages)
        session.replace(result.all_messages())
    async with sessions.turn("old") as session:
        conversation = session.conversation
        assert conversation.usage.requests == 0 and conversation.deferred_tool_requests is None
        assert conversation.messages == result.all_messages()
        session.save(await agent.run("hi again", conversation=conversation))
    async with sessions.turn("old") as session:
        assert session.conversation.usage.requests == 1
        assert len(session.messages) == 4


async def test_another_conversation_cannot_be_saved_as_the_session(sessions: SessionStore) -> None:
    agent = _agent()
    async with sessions.turn("mine") as session:
        result = await agent.run("hi")
        with pytest.raises(InvalidSessionError, match="cannot be saved as session 'mine'"):
            session.save(result)
        assert not session.changed


async def _paused_session(url: str) -> SessionInfo | None:
    agent = _agent()
    async with agent_stores.open_sessions(url) as sessions:
        async with sessions.turn("shown") as session:
            session.save(await agent.run("book friday", conversation=session.conversation))
        return await sessions.inspect("shown")


def test_inspect_and_the_cli_show_usage_and_pending_deferred_calls(tmp_path: Path) -> None:
    import asyncio

    from agent_stores.cli import cli
    from click.testing import CliRunner

    url = f"sqlite:///{tmp_path / 'shown.db'}"
    info = asyncio.run(_paused_session(url))
    assert info is not None and info.usage["requests"] == 1
    assert info.pending_deferred == (("book", "b1", "approval"),)
    shown = CliRunner().invoke(cli, ["sessions", url, "show", "shown"])
    assert shown.exit_code == 0, shown.output
    assert "usage        1 requests" in shown.output
    assert "deferred     book (call b1) waits for approval" in shown.output
    assert "friday" not in shown.output  # never a call's arguments
