"""Every store group of the CLI takes --scope-prefix and reaches data stored under it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_stores import open_checkpointer, open_sessions
from agent_stores.checkpointer import JournalEvent
from agent_stores.cli import cli
from click.testing import CliRunner
from pydantic_ai.messages import ModelRequest, UserPromptPart


async def _populate(url: str) -> None:
    sessions = open_sessions(url, scope_prefix="app:")
    async with sessions, sessions.turn("alice") as session:
        session.replace([ModelRequest(parts=[UserPromptPart("hi")])])
    async with open_checkpointer(url, scope_prefix="app/") as runs:
        await runs.append("run-1", JournalEvent(step_id="000001-model"))


def test_sessions_and_runs_under_a_custom_prefix(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    asyncio.run(_populate(url))
    runner = CliRunner()
    default = runner.invoke(cli, ["sessions", url, "list"])
    assert default.exit_code == 0 and "alice" not in default.output
    custom = runner.invoke(cli, ["sessions", "--scope-prefix", "app:", url, "list"])
    assert custom.exit_code == 0 and "alice" in custom.output
    runs = runner.invoke(cli, ["runs", "--scope-prefix", "app/", url, "list"])
    assert runs.exit_code == 0 and "run-1" in runs.output
    assert "run-1" not in runner.invoke(cli, ["runs", url, "list"]).output


@pytest.mark.parametrize("group", ["sessions", "memory", "runs"])
def test_every_store_group_documents_the_same_flag(group: str) -> None:
    shown = CliRunner().invoke(cli, [group, "--help"])
    assert shown.exit_code == 0 and "--scope-prefix" in shown.output


def test_runs_namespace_still_works_and_warns(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    asyncio.run(_populate(url))
    result = CliRunner().invoke(cli, ["runs", "--namespace", "app", url, "list"])
    assert result.exit_code == 0 and "run-1" in result.output
    assert "deprecated" in result.output
