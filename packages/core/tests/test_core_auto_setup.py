"""``?auto_setup=`` on the embedded backends: the stores may create what the backend needs
on first use. SQLite creates its file and table unless told not to; memory:// has nothing
to create and accepts the option all the same."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from agent_stores import ConfigError, open_checkpointer, open_kv, open_memory, open_sessions
from agent_stores.backends.memory import URL_OPTIONS as MEMORY_OPTIONS
from agent_stores.backends.sqlite import URL_OPTIONS as SQLITE_OPTIONS
from agent_stores.cli import cli
from click.testing import CliRunner

OPENERS: list[Any] = [open_sessions, open_memory, open_checkpointer]


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


@pytest.mark.parametrize("opener", OPENERS)
async def test_sqlite_auto_setup_off_creates_nothing_and_first_use_names_setup(
    opener: Any, tmp_path: Path
) -> None:
    db = tmp_path / "folder" / "agent.db"
    url = f"sqlite:///{db}?auto_setup=false"
    async with opener(url):
        pass  # entering creates nothing
    kv = open_kv(url)
    try:
        assert kv.auto_setup is False
        with pytest.raises(ConfigError, match=r"does not exist.*agent-stores setup"):
            await kv.get("s", "k")
        with pytest.raises(ConfigError, match="agent-stores setup"):
            await kv.create("s", "k", b"v")
    finally:
        await kv.aclose()
    assert not db.parent.exists()


async def test_sqlite_auto_setup_off_refuses_a_file_without_the_table(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE unrelated (x)")
    async with open_kv(f"sqlite:///{db}?auto_setup=false") as kv:
        with pytest.raises(ConfigError, match=r"no agent_stores_kv table.*agent-stores setup"):
            await kv.get("s", "k")
    assert _tables(db) == {"unrelated"}


async def test_sqlite_setup_creates_what_auto_setup_off_refused(tmp_path: Path) -> None:
    """`agent-stores setup URL` creates file and table whatever auto_setup says; the store
    then works with auto_setup off, and setup on an open store is idempotent."""
    db = tmp_path / "set" / "up.db"
    url = f"sqlite:///{db}?auto_setup=false"
    # The command runs its own event loop: give it a thread of its own.
    result = await asyncio.to_thread(CliRunner().invoke, cli, ["setup", url])
    assert result.exit_code == 0, result.output
    assert "agent_stores_kv" in _tables(db)
    async with open_sessions(url) as sessions:
        assert sessions.kv.auto_setup is False
        version = await sessions.kv.create("s", "k", b"v")
        await sessions.kv.setup()
        entry = await sessions.kv.get("s", "k")
        assert entry is not None and entry.version == version


@pytest.mark.parametrize("query", ["", "?auto_setup=true"])
@pytest.mark.parametrize("opener", OPENERS)
async def test_sqlite_auto_setup_on_creates_file_and_table_on_enter(
    opener: Any, query: str, tmp_path: Path
) -> None:
    db = tmp_path / "new" / "agent.db"
    async with opener(f"sqlite:///{db}{query}"):
        pass
    assert "agent_stores_kv" in _tables(db)


def test_the_declared_defaults_are_the_ones_used(tmp_path: Path) -> None:
    assert open_kv(f"sqlite:///{tmp_path}/d.db").auto_setup is SQLITE_OPTIONS["auto_setup"].default
    assert open_kv("memory://declared").auto_setup is MEMORY_OPTIONS["auto_setup"].default
    with pytest.raises(ConfigError, match="auto_setup must be true or false"):
        open_kv("memory://declared?auto_setup=maybe")


async def test_memory_has_nothing_to_create_either_way() -> None:
    for flag in ("false", "true"):
        url = f"memory://auto-setup-{flag}?auto_setup={flag}"
        async with open_sessions(url) as sessions:
            assert sessions.kv.auto_setup is (flag == "true")
            version = await sessions.kv.create("s", "k", b"v")
            entry = await sessions.kv.get("s", "k")
            assert entry is not None and entry.version == version
