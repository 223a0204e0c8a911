"""``agent-stores conversations URL list | show``: usage and pending deferred calls shown."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import agent_stores
from agent_stores.cli import cli
from click.testing import CliRunner
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests


def _book(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[ToolCallPart("book", {"when": "friday"}, tool_call_id="call-1")])


async def _seed(url: str) -> None:
    agent = Agent(FunctionModel(_book), output_type=[str, DeferredToolRequests])

    @agent.tool_plain(requires_approval=True)
    def book(when: str) -> str:
        return "booked"

    async with agent_stores.open_conversations(url) as store:
        result = await agent.run("book friday", conversation=Conversation(conversation_id="trip"))
        await store.save(result, scope="user:1")
        await store.update("trip", title="Trip", scope="user:1")


def test_list_and_show_give_usage_and_pending_deferred_calls(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    asyncio.run(_seed(url))
    runner = CliRunner()
    listed = runner.invoke(cli, ["conversations", url, "list", "--json"])
    assert listed.exit_code == 0, listed.output
    row = json.loads(listed.output)
    assert row["conversation_id"] == "trip" and row["scope"] == "user:1"
    assert row["usage"]["requests"] == 1
    assert row["pending_deferred"] == [
        {"tool_name": "book", "tool_call_id": "call-1", "kind": "approval"}
    ]
    assert "friday" not in listed.output  # arguments are never shown
    shown = runner.invoke(cli, ["conversations", url, "show", "trip"])
    assert shown.exit_code == 0, shown.output
    assert "title: Trip" in shown.output and "[tool-call] book" in shown.output
    missing = runner.invoke(cli, ["conversations", url, "show", "nope"])
    assert missing.exit_code == 1 and "no conversation 'nope'" in missing.output
    other = runner.invoke(cli, ["conversations", url, "list", "--scope", "user:2"])
    assert other.exit_code == 0 and other.output == ""
