"""``agent-stores memory URL ls | cat | rm``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_stores import open_memory
from agent_stores.cli import cli
from click.testing import CliRunner


def _seed(url: str) -> None:
    async def seed() -> None:
        async with open_memory(url) as store:
            await store.write_with_metadata(
                "alice/main/MEMORY.md",
                "- likes tea\n",
                expected_version=None,
                metadata={"by": "me"},
            )
            await store.write("alice/main/notes.md", "x" * 70_000, expected_version=None)
            await store.write("bob/main/MEMORY.md", "b\n", expected_version=None)

    asyncio.run(seed())


def test_ls_cat_rm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db?max_value_bytes=16384"
    _seed(url)
    runner = CliRunner()
    listed = runner.invoke(cli, ["memory", url, "ls"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.split() == [
        "alice/main/MEMORY.md",
        "alice/main/notes.md",
        "bob/main/MEMORY.md",
    ]
    assert runner.invoke(cli, ["memory", url, "ls", "bob/"]).output.split() == [
        "bob/main/MEMORY.md"
    ]
    assert runner.invoke(cli, ["memory", url, "ls", "alice/", "--limit", "1"]).output.split() == [
        "alice/main/MEMORY.md"
    ]
    shown = runner.invoke(cli, ["memory", url, "cat", "alice/main/notes.md"])
    assert shown.exit_code == 0 and shown.output == "x" * 70_000, "cat prints the whole file"
    meta = runner.invoke(cli, ["memory", url, "cat", "--metadata", "alice/main/MEMORY.md"])
    assert "# by: me" in meta.output and meta.output.endswith("- likes tea\n")
    removed = runner.invoke(cli, ["memory", url, "rm", "alice/main/notes.md"])
    assert removed.exit_code == 0 and "deleted alice/main/notes.md" in removed.output
    assert runner.invoke(cli, ["memory", url, "ls", "alice/"]).output.split() == [
        "alice/main/MEMORY.md"
    ]


def test_errors_are_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    runner = CliRunner()
    missing = runner.invoke(cli, ["memory", url, "cat", "nobody/main/MEMORY.md"])
    assert missing.exit_code == 1 and "no memory file" in missing.output
    gone = runner.invoke(cli, ["memory", url, "rm", "nobody/main/MEMORY.md"])
    assert gone.exit_code == 1 and "no memory file" in gone.output
    bad = runner.invoke(cli, ["memory", url, "cat", "../etc/passwd"])
    assert bad.exit_code == 1 and "invalid memory path" in bad.output
    assert "Traceback" not in bad.output


def test_scope_prefix_option(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"

    async def seed() -> None:
        async with open_memory(url, scope_prefix="team:") as store:
            await store.write("t/main/MEMORY.md", "x", expected_version=None)

    asyncio.run(seed())
    runner = CliRunner()
    assert runner.invoke(cli, ["memory", url, "ls"]).output == ""
    found = runner.invoke(cli, ["memory", "--scope-prefix", "team:", url, "ls"])
    assert found.output.split() == ["t/main/MEMORY.md"]
