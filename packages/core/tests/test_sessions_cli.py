"""``agent-stores sessions URL list | show | reset | clear-recovery`` on a real SQLite file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent_stores import open_sessions
from agent_stores.cli import cli
from agent_stores.sessions.records import STATE_KEY
from click.testing import CliRunner
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart


async def _populate(url: str) -> None:
    async with open_sessions(url) as store:
        for sid in ("alice", "bob", "carol"):
            async with store.turn(sid) as session:
                session.replace(
                    [
                        ModelRequest(parts=[UserPromptPart(f"hello from {sid}")]),
                        ModelResponse(parts=[TextPart("hi")]),
                    ]
                )
                if sid == "bob":
                    await session.mark_effects([("send_money", "call-7")])
        scope = store.storage.scope_for("carol")
        entry = await store.kv.get(scope, STATE_KEY)
        assert entry is not None
        await store.kv.replace(scope, STATE_KEY, b"broken", expected_version=entry.version)


def test_sessions_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    asyncio.run(_populate(url))
    runner = CliRunner()

    listed = runner.invoke(cli, ["sessions", url, "list"])
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["alice", "bob", "carol"]
    assert "RECOVERY (1 pending)" in lines[1] and "INVALID" in lines[2]

    latched = runner.invoke(cli, ["sessions", url, "list", "--latched", "--json"])
    rows = [json.loads(line) for line in latched.output.splitlines()]
    assert [r["session_id"] for r in rows] == ["bob", "carol"]
    assert rows[0]["pending_effects"] == [["send_money", "call-7"]]

    shown = runner.invoke(cli, ["sessions", url, "show", "bob", "--messages"])
    assert shown.exit_code == 0, shown.output
    assert "send_money (call call-7)" in shown.output and "user: hello from bob" in shown.output
    assert "INVALID" in runner.invoke(cli, ["sessions", url, "show", "carol"]).output
    missing = runner.invoke(cli, ["sessions", url, "show", "nobody"])
    assert missing.exit_code != 0 and "no session" in missing.output

    as_json = json.loads(
        runner.invoke(cli, ["sessions", url, "show", "alice", "--json", "--messages"]).output
    )
    assert as_json["message_count"] == 2 and len(as_json["messages"]) == 2

    cleared = runner.invoke(cli, ["sessions", url, "clear-recovery", "bob"])
    assert cleared.exit_code == 0 and "send_money (call-7)" in cleared.output
    assert (
        "no recovery marker"
        in runner.invoke(cli, ["sessions", url, "clear-recovery", "bob"]).output
    )

    invalid = runner.invoke(cli, ["sessions", url, "clear-recovery", "carol"])
    assert invalid.exit_code != 0 and "SESSION_INVALID" in invalid.output

    reset = runner.invoke(cli, ["sessions", url, "reset", "carol"])
    assert reset.exit_code == 0 and "reset carol" in reset.output
    after = runner.invoke(cli, ["sessions", url, "list"])
    assert [line.split("\t")[0] for line in after.output.splitlines()] == ["alice", "bob"]
    assert "RECOVERY" not in after.output
