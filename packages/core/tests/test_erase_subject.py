"""Erasing a subject: the command line, the API's typed refusals, and subject_of."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agent_stores import ConfigError, InvalidIdError, connect, open_kv, open_memory
from agent_stores.cli import cli
from agent_stores.erasure import erase_subject
from agent_stores.subjects import namespace_subject
from click.testing import CliRunner
from pydantic_ai.messages import ModelRequest, UserPromptPart


def test_namespace_subject_takes_the_namespace_and_its_last_segment() -> None:
    first = namespace_subject()
    assert first("alice/main/MEMORY.md") == ("alice/", "alice")
    assert first("MEMORY.md") is None
    assert namespace_subject(2)("acme/alice/notes.md") == ("acme/alice/", "alice")
    assert namespace_subject(2)("acme/notes.md") is None
    with pytest.raises(ValueError, match="depth"):
        namespace_subject(0)


async def test_a_subject_of_that_is_not_a_path_prefix_is_refused() -> None:
    async with open_memory("memory://subject-of", subject_of=lambda p: ("other/", "x")) as memory:
        with pytest.raises(ValueError, match="prefix of the path"):
            await memory.write("alice/a.md", "x", expected_version=None)
        assert await memory.list_paths("", limit=10) == []


async def test_erase_subject_refuses_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="needs a store"):
        await erase_subject("alice")
    async with connect("memory://erase-args") as connection:
        with pytest.raises(InvalidIdError):
            await erase_subject("", kv=connection.kv)
        with pytest.raises(ConfigError, match="different prefixes"):
            await erase_subject(
                "alice",
                memory=connection.memory(subject_prefix="a:"),
                checkpointer=connection.checkpointer(subject_prefix="b:"),
            )


def test_erase_command_prints_a_report_to_keep(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"

    async def populate() -> None:
        async with connect(url) as connection:
            async with connection.sessions().turn("s-1", owner="alice") as session:
                session.replace([ModelRequest(parts=[UserPromptPart(content="hi")])])
            memory = connection.memory(subject_of=namespace_subject())
            await memory.write("alice/MEMORY.md", "tea", expected_version=None)
            await memory.write("bob/MEMORY.md", "coffee", expected_version=None)
            await connection.checkpointer().bind_subject("run-1", "alice")

    async def left() -> list[str]:
        async with open_kv(url) as kv:
            return sorted(await kv.scopes(limit=100))

    asyncio.run(populate())
    result = CliRunner().invoke(cli, ["erase", url, "--subject", "alice", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["complete"] and report["entries_left"] == 0
    assert report["sessions"] == ["s-1"] and report["namespaces"] == ["memory:alice/"]
    assert report["runs"] == ["run-1"]
    scopes = asyncio.run(left())
    assert "memory:bob" in scopes and "memory:alice" not in scopes
    text = CliRunner().invoke(cli, ["erase", url, "--subject", "alice"])
    assert text.exit_code == 0 and "0 entries left" in text.output, text.output
    missing = CliRunner().invoke(cli, ["erase", url])
    assert missing.exit_code == 2 and "--subject" in missing.output


async def test_erasing_an_owner_spares_a_session_given_to_another_owner() -> None:
    """A session given to another owner leaves the old owner's index in the background,
    best effort. An erase of the old owner that still finds it listed there removes the
    stale entry only: the session, another owner's now, is kept whole."""
    async with connect("memory://erase-moved") as connection:
        store = connection.sessions()
        async with store.turn("s", owner="alice") as session:
            session.replace([ModelRequest(parts=[UserPromptPart("hello")])])
        alice_index = store.storage.catalog.scope_for("alice")
        listed = {i.key: i.entry async for i in store.kv.iter_scan(alice_index) if i.entry}
        assert listed
        assert await store.set_catalog("s", owner="bob")
        await store.storage.drain()
        for key, entry in listed.items():  # as when the background removal did not happen
            if await store.kv.get(alice_index, key) is None:
                await store.kv.create(alice_index, key, entry.value)
        assert "s" in await store.storage.catalog.named("alice")

        report = await erase_subject("alice", sessions=store)

        assert report.sessions == ()
        assert report.entries_left == 0
        assert "s" not in await store.storage.catalog.named("alice")
        messages = await store.read_messages("s")
        assert messages is not None and len(messages) == 1
        info = await store.inspect("s")
        assert info is not None and info.owner == "bob"
