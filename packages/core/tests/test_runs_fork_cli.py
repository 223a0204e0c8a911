"""``agent-stores runs URL fork RUN [--at POINT] [--new-id ID] [--json]``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agent_stores import open_checkpointer
from agent_stores.checkpointer import JournalEvent
from agent_stores.cli import cli
from agent_stores_contract.checkpointer import ToolCrash, calls_pay, effect_agent
from click.testing import CliRunner, Result


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A store with a finished agent run ``paid`` (it called ``pay``), one stopped inside
    ``pay`` (``crashed``), and a journal run ``journal``."""
    url = f"sqlite:///{tmp_path}/runs.db"

    async def seed() -> None:
        async with open_checkpointer(url) as cp:
            steps = cp.step_store()
            await effect_agent(steps, []).run("pay", run_id="paid")
            try:
                await effect_agent(steps, [], crash=True).run("pay", run_id="crashed")
            except ToolCrash:
                pass
            await cp.append("journal", JournalEvent.completed("000000-model", {"a": 1}))
            await cp.append("journal", JournalEvent.attempted("000001-tool", {"pay": 5}))

    asyncio.run(seed())
    return url


def runs(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["runs", url, *args])


def show(url: str, run_id: str) -> dict[str, Any]:
    result = runs(url, "show", run_id, "--json")
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.output)
    return report


def test_fork_at_the_latest_point_and_lineage_in_show(url: str) -> None:
    result = runs(url, "fork", "paid", "--new-id", "f")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("forked run paid at snapshot ")
    assert "into f" in result.output and "LATCHED" not in result.output
    source = runs(url, "show", "paid")
    assert "forks: f" in source.output and "#0" in source.output
    fork = runs(url, "show", "f")
    assert "forked from paid at snapshot" in fork.output
    assert show(url, "f")["forked_from"]["complete"] is True
    assert show(url, "paid")["forks"] == ["f"]


def test_fork_at_a_snapshot_position_reports_the_replayed_call(url: str) -> None:
    positions = [s["position"] for s in show(url, "paid")["snapshots"]]

    async def open_call_position() -> int:
        async with open_checkpointer(url) as cp:
            numbered = await cp.step_store().numbered_snapshots(
                run_id="paid", include_interrupted=True
            )
        return next(n for n, s in numbered if calls_pay(s.messages))

    at = asyncio.run(open_call_position())
    assert at in positions
    result = runs(url, "fork", "paid", "--at", str(at), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["point"] == f"snapshot {at}" and report["run_id"].startswith("paid.fork-")
    assert report["calls"] == [{"tool_call_id": "pay-1", "tool_name": "pay", "state": "done"}]
    assert report["latched"] == [] and report["tool_effects"] == 1


def test_fork_of_an_uncertain_call_is_reported_latched(url: str) -> None:
    result = runs(url, "fork", "crashed", "--new-id", "f")
    assert result.exit_code == 0, result.output
    assert "open call pay (pay-1): uncertain" in result.output
    assert "LATCHED: the outcome of pay-1 is uncertain" in result.output
    assert show(url, "f")["unresolved_tool_effects"] == [
        {"tool_call_id": "pay-1", "tool_name": "pay"}
    ]


def test_fork_of_a_journal_at_a_step(url: str) -> None:
    done = runs(url, "fork", "journal", "--at", "000000-model", "--new-id", "j1", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["journal_entries"] == 1
    assert [e["step_id"] for e in show(url, "j1")["journal"]] == ["000000-model"]
    latched = runs(url, "fork", "journal", "--new-id", "j2")
    assert latched.exit_code == 0 and "LATCHED: the outcome of 000001-tool" in latched.output


def test_fork_errors_fail_cleanly(url: str) -> None:
    unknown = runs(url, "fork", "nope")
    assert unknown.exit_code == 1 and "no run 'nope' to fork" in unknown.output
    point = runs(url, "fork", "paid", "--at", "9999")
    assert point.exit_code == 1 and "no snapshot at position 9999" in point.output
    step = runs(url, "fork", "journal", "--at", "000007-tool")
    assert step.exit_code == 1 and "no journal step '000007-tool'" in step.output
    taken = runs(url, "fork", "paid", "--new-id", "journal")
    assert taken.exit_code == 1 and "already exists" in taken.output
    assert "Traceback" not in unknown.output + point.output + step.output + taken.output
    assert [line.split("\t")[0] for line in runs(url, "list").output.splitlines()] == [
        "crashed",
        "journal",
        "paid",
    ]
