"""The memory command line with one damaged record: ``ls`` lists the rest, ``rm`` removes it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_stores import open_kv
from agent_stores.cli import cli
from agent_stores.damage import list_quarantined
from agent_stores.memory import KVMemoryStore
from click.testing import CliRunner

GARBAGE = b"\xff garbage"


async def _plant(url: str) -> None:
    kv = open_kv(url)
    async with KVMemoryStore(kv, owns_kv=True) as memory:
        for path in ("dave/main/MEMORY.md", "dave/main/notes.md", "erin/main/MEMORY.md"):
            await memory.write(path, f"text of {path}", expected_version=None)
        scope = memory.directory_scope("dave/main")
        entry = await kv.get(scope, "notes.md")
        assert entry is not None
        await kv.replace(scope, "notes.md", GARBAGE, expected_version=entry.version)


async def _quarantined(url: str) -> list[bytes]:
    kv = open_kv(url)
    async with kv:
        return [q.raw for q in await list_quarantined(kv)]


def test_ls_skips_and_reports_rm_removes_damaged_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    asyncio.run(_plant(url))
    runner = CliRunner()
    listed = runner.invoke(cli, ["memory", url, "ls"])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.split() == ["dave/main/MEMORY.md", "erin/main/MEMORY.md"]
    assert "skipped damaged record dave/main/notes.md" in listed.stderr

    removed = runner.invoke(cli, ["memory", url, "rm", "dave/main/notes.md"])
    assert removed.exit_code == 0, removed.output
    assert asyncio.run(_quarantined(url)) == [GARBAGE]
    again = runner.invoke(cli, ["memory", url, "ls"])
    assert again.stdout.split() == ["dave/main/MEMORY.md", "erin/main/MEMORY.md"]
    assert again.stderr == ""
