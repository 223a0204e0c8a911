"""``agent-stores copy`` of 4 MB records from SQLite into a backend with smaller items.

Shared by the cloud backends' tests: a session history, a memory file and a journal
entry of 4 MB each are re-chunked to the destination's item limit on the way,
``--verify`` finds both sides equal, and the stores read them back there.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agent_stores import connect, doctor
from agent_stores.checkpointer import JournalEvent
from agent_stores.cli import cli
from click.testing import CliRunner
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

MB = 1 << 20


async def populate(url: str) -> dict[str, Any]:
    history: list[ModelMessage] = [
        ModelRequest(parts=[UserPromptPart(content="read: " + "é" * (2 * MB))]),
        ModelResponse(parts=[TextPart(content="done")]),
    ]
    content = "ñ" * (2 * MB - 4096)  # 4 MB of UTF-8, one inline record on SQLite
    payload = "p" * (4 * MB - 4096)
    async with connect(url) as conn:
        await conn.kv.setup()
        async with conn.sessions().turn("big") as session:
            session.replace(history)
        written = await conn.memory().write("notes/big.md", content, expected_version=None)
        await conn.checkpointer().append("run", JournalEvent(step_id="000001-a", payload=payload))
    return {
        "history": ModelMessagesTypeAdapter.dump_json(history),
        "content": content,
        "version": written.version,
        "payload": payload,
    }


async def check(url: str, facts: dict[str, Any], min_parts: int) -> None:
    async with connect(url) as conn:
        limit = conn.kv.limits.max_value_bytes
        for scope in ("session:big", "memory:notes", "cp/run/run"):
            sizes = [len(i.entry.value) async for i in conn.kv.iter_scan(scope) if i.entry]
            assert len(sizes) > min_parts and max(sizes) <= limit  # re-cut to the item limit
        messages = await conn.sessions().read_messages("big")
        assert messages is not None
        assert ModelMessagesTypeAdapter.dump_json(messages) == facts["history"]
        found = await conn.memory().read("notes/big.md", max_chars=8 * MB)
        assert found is not None and found.content == facts["content"]
        assert found.version == facts["version"]
        state = await conn.checkpointer().load("run")
        assert [e.payload for e in state.events] == [facts["payload"]]
        report = await doctor.scan(conn.kv)
        assert report.healthy, [f.as_dict() for f in report.findings]
        # The session continues there: a turn reads the re-cut history and saves more.
        async with conn.sessions().turn("big") as session:
            session.replace([*session.messages, ModelRequest(parts=[UserPromptPart("more")])])
        after = await conn.sessions().read_messages("big")
        assert after is not None and len(after) == 3


def copy_4mb_records_from_sqlite(tmp_path: Path, url: str, *, min_parts: int) -> None:
    """Copy into ``url`` with ``--verify --json`` and check the result there; each unit's
    scope must hold more than ``min_parts`` entries, none over the item limit."""
    src = f"sqlite:///{tmp_path}/src.db"
    facts = asyncio.run(populate(src))
    result = CliRunner().invoke(
        cli, ["copy", src, url, "--verify", "--json"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["verify"]["ok"] and not doc["failed"] and not doc["too_large"]
    rows = {r["kind"]: r for r in doc["kinds"]}
    assert all(rows[k]["rechunked"] == 1 for k in ("sessions", "memory", "runs"))
    checked = {r["kind"]: r for r in doc["verify"]["kinds"]}
    assert all(r["mismatches"] == 0 and r["only_in_destination"] == 0 for r in checked.values())
    asyncio.run(check(url, facts, min_parts))
