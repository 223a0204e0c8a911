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


CONCEPTS = "python:agent_stores_contract.embedding:ConceptEmbeddingModel"


def test_search_by_meaning_and_reindex(tmp_path: Path) -> None:
    """``search --mode semantic`` finds a file sharing no word with the query; ``reindex``
    embeds the files written without an embedder, then nothing on a second run."""
    url = f"sqlite:///{tmp_path}/m.db"

    async def seed() -> None:
        async with open_memory(url) as store:
            await store.write("u/a.md", "The user's daughter is Maya.", expected_version=None)
            await store.write("u/b.md", "Spicy ramen.", expected_version=None)

    asyncio.run(seed())
    runner = CliRunner()
    first = runner.invoke(cli, ["memory", url, "reindex", "--embedder", CONCEPTS])
    assert first.exit_code == 0, first.output
    assert "reindexed 2 file(s): 2 embedded, 0 up to date" in first.output
    again = runner.invoke(cli, ["memory", url, "reindex", "--embedder", CONCEPTS])
    assert "reindexed 2 file(s): 0 embedded, 2 up to date" in again.output
    found = runner.invoke(
        cli, ["memory", url, "search", "u/", "family", "--mode", "semantic", "--embedder", CONCEPTS]
    )
    assert found.exit_code == 0, found.output
    assert found.output.splitlines()[:2] == ["1.0000  u/a.md", "    The user's daughter is Maya."]
    lexical = runner.invoke(cli, ["memory", url, "search", "u/", "family"])
    assert lexical.exit_code == 0 and "0 match(es) among 2 file(s)" in lexical.output


def test_search_by_meaning_needs_an_embedder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    runner = CliRunner()
    result = runner.invoke(cli, ["memory", url, "search", "u/", "x", "--mode", "hybrid"])
    assert result.exit_code == 2 and "--mode hybrid needs --embedder" in result.output
    result = runner.invoke(cli, ["memory", url, "reindex", "--embedder", "python:nowhere:x"])
    assert result.exit_code == 2 and "No module named 'nowhere'" in result.output
