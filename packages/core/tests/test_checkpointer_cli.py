"""``agent-stores runs URL list | show RUN | delete RUN``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agent_stores import open_checkpointer
from agent_stores.checkpointer import JournalEvent
from agent_stores.cli import cli
from click.testing import CliRunner
from pydantic_ai_harness.step_persistence import RunRecord, StepEvent, ToolEffectRecord


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/runs.db"

    async def seed() -> None:
        async with open_checkpointer(url) as cp:
            await cp.append("journal-run", JournalEvent.attempted("000000-model", {"q": 1}))
            await cp.append("journal-run", JournalEvent.completed("000000-model", {"a": 1}))
            await cp.append("journal-run", JournalEvent.attempted("000001-tool", {"pay": 5}))
            steps = cp.step_store()
            await steps.register_run(RunRecord(run_id="harness-run", agent_name="bot"))
            await steps.append_event(
                StepEvent(
                    run_id="harness-run", kind="tool_call_started", step_index=1, tool_name="pay"
                )
            )
            await steps.record_tool_effect(
                ToolEffectRecord(
                    tool_call_id="c1", tool_name="pay", run_id="harness-run", status="started"
                )
            )

    asyncio.run(seed())
    return url


def test_list(url: str) -> None:
    result = CliRunner().invoke(cli, ["runs", url, "list"])
    assert result.exit_code == 0, result.output
    assert [line.split("\t")[0] for line in result.output.splitlines()] == [
        "harness-run",
        "journal-run",
    ]
    paged = CliRunner().invoke(cli, ["runs", url, "list", "--json", "--after", "harness-run"])
    assert [json.loads(line)["run_id"] for line in paged.output.splitlines()] == ["journal-run"]


def test_show_journal_and_step_store(url: str) -> None:
    result = CliRunner().invoke(cli, ["runs", url, "show", "journal-run"])
    assert result.exit_code == 0, result.output
    assert "journal: 3 entries" in result.output
    assert "uncertain steps: 000001-tool" in result.output
    report = json.loads(
        CliRunner().invoke(cli, ["runs", url, "show", "harness-run", "--json"]).output
    )
    assert report["record"]["agent_name"] == "bot"
    assert report["events"][0]["tool_name"] == "pay"
    assert report["unresolved_tool_effects"] == [{"tool_call_id": "c1", "tool_name": "pay"}]


def test_show_unknown_run_fails_cleanly(url: str) -> None:
    result = CliRunner().invoke(cli, ["runs", url, "show", "nope"])
    assert result.exit_code == 1 and "no run 'nope'" in result.output


def test_delete(url: str) -> None:
    aborted = CliRunner().invoke(cli, ["runs", url, "delete", "journal-run"], input="n\n")
    assert aborted.exit_code == 1
    result = CliRunner().invoke(cli, ["runs", url, "delete", "journal-run", "--yes"])
    assert result.exit_code == 0 and "deleted run journal-run" in result.output
    listed = CliRunner().invoke(cli, ["runs", url, "list"]).output
    assert "journal-run" not in listed and "harness-run" in listed
    again = CliRunner().invoke(cli, ["runs", url, "delete", "journal-run", "-y"])
    assert again.exit_code == 1 and "no run" in again.output


def test_bad_url_hides_secrets() -> None:
    result = CliRunner().invoke(cli, ["runs", "redis://u:s3cret@127.0.0.1:1/0", "list"])
    assert result.exit_code != 0
    assert "s3cret" not in result.output
