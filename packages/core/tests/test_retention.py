"""Retention policies: the text a user declares once, the API and ``purge --policy``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_stores import open_kv, open_memory, open_sessions
from agent_stores.cli import cli
from agent_stores.damage import list_quarantined, quarantine
from agent_stores.kv.base import Entry
from agent_stores.retention import POLICY_ENV, RetentionPolicy, apply_retention
from click.testing import CliRunner
from pydantic_ai.messages import ModelRequest, UserPromptPart


def test_a_policy_reads_back_what_it_says() -> None:
    policy = RetentionPolicy.parse("sessions-idle=90d, runs-keep=20 quarantine=12h include-latched")
    assert policy == RetentionPolicy(90 * 86_400, True, 20, 12 * 3_600)
    assert RetentionPolicy.parse("memory-age=365d").memory_age_seconds == 365 * 86_400
    assert RetentionPolicy.parse("").empty
    assert RetentionPolicy.parse("runs-keep=3").merged(RetentionPolicy(quarantine_seconds=5)) == (
        RetentionPolicy(runs_keep=3, quarantine_seconds=5)
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("sessions-idle=90", "duration"),
        ("sessions-idle=0d", "duration"),
        ("runs-keep=0", "runs-keep"),
        ("runs-keep=two", "runs-keep"),
        ("memory-age=1y", "duration"),
        ("files-age=1d", "unknown retention item"),
        ("include-latched", "needs sessions-idle"),
    ],
)
def test_a_bad_policy_names_its_item(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        RetentionPolicy.parse(text)


async def test_apply_retention_runs_each_part_on_its_store() -> None:
    async with open_sessions("memory://retention-api", ttl_seconds=None) as sessions:
        async with sessions.turn("old") as session:
            session.replace([ModelRequest(parts=[UserPromptPart(content="hi")])])
        base = sessions.kv.clock
        sessions.kv.clock = lambda: base() + 10 * 86_400  # type: ignore[method-assign]
        await quarantine(sessions.kv, "s", "k", Entry(b"raw", "v"), reason="test")
        sessions.kv.clock = lambda: base() + 40 * 86_400  # type: ignore[method-assign]
        policy = RetentionPolicy.parse("sessions-idle=30d quarantine=20d")
        report = await apply_retention(policy, kv=sessions.kv, sessions=sessions)
        assert report.sessions is not None and report.sessions.removed == ("old",)
        assert report.quarantined is not None and len(report.quarantined) == 1
        assert report.runs is None
        with pytest.raises(ValueError, match="checkpointer"):
            await apply_retention(RetentionPolicy(runs_keep=1), sessions=sessions)


async def test_memory_age_deletes_files_not_written_for_that_long() -> None:
    """A file's age is its current version's: rewriting renews it; the prefix bounds the walk."""
    async with open_memory("memory://retention-memory") as memory:
        base = memory.kv.clock
        for path in ("alice/old.md", "alice/renewed.md", "bob/old.md"):
            await memory.write(path, "v1", expected_version=None)
        memory.kv.clock = lambda: base() + 40 * 86_400  # type: ignore[method-assign]
        renewed = await memory.read("alice/renewed.md", max_chars=10)
        assert renewed is not None
        await memory.write("alice/renewed.md", "v2", expected_version=renewed.version)
        await memory.write("alice/new.md", "v1", expected_version=None)
        report = await memory.purge_older_than(30 * 86_400, prefix="alice/")
        assert report.removed == ("alice/old.md",) and report.scanned == 3
        assert report.undated == 0
        assert await memory.list_paths("", limit=10) == [
            "alice/new.md",
            "alice/renewed.md",
            "bob/old.md",
        ]
        policy = RetentionPolicy.parse("memory-age=30d")
        applied = await apply_retention(policy, memory=memory)
        assert applied.memory is not None and applied.memory.removed == ("bob/old.md",)
        with pytest.raises(ValueError, match="memory="):
            await apply_retention(policy)


def test_purge_memory_age_days(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"

    async def write() -> None:
        async with open_memory(url) as memory:
            await memory.write("alice/a.md", "x", expected_version=None)

    asyncio.run(write())
    kept = CliRunner().invoke(cli, ["purge", url, "--memory-age-days", "1"])
    assert "deleted 0 of 1 memory files not written for 1 days" in kept.output, kept.output
    refused = CliRunner().invoke(cli, ["purge", url, "--memory-prefix", "alice/"])
    assert refused.exit_code == 2 and "--memory-age-days" in refused.output


async def quarantined(url: str, count: int) -> int:
    """Quarantine ``count`` records at ``url``; how many are quarantined then."""
    async with open_kv(url) as kv:
        for i in range(count):
            await quarantine(kv, "s", f"k{i}", Entry(b"raw", "v"), reason="test")
        return len(await list_quarantined(kv))


def test_purge_quarantine_days(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    assert asyncio.run(quarantined(url, 2)) == 2
    kept = CliRunner().invoke(cli, ["purge", url, "--quarantine-days", "1"])
    assert "deleted 0 records quarantined more than 1 days ago" in kept.output, kept.output
    gone = CliRunner().invoke(cli, ["purge", url, "--quarantine-days", "0"])
    assert "deleted 2 records quarantined" in gone.output, gone.output
    assert asyncio.run(quarantined(url, 0)) == 0


def test_purge_policy_from_the_option_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    asyncio.run(quarantined(url, 2))
    runner = CliRunner()
    kept = runner.invoke(cli, ["purge", url, "--policy", "quarantine=1d runs-keep=5"])
    assert kept.exit_code == 0, kept.output
    assert "deleted 0 records quarantined more than 1 days ago" in kept.output
    assert "deleted 0 runs" in kept.output
    monkeypatch.setenv(POLICY_ENV, "quarantine=1s")
    asyncio.run(asyncio.sleep(1.1))
    gone = runner.invoke(cli, ["purge", url])
    assert gone.exit_code == 0, gone.output
    assert "deleted 2 records quarantined" in gone.output
    bad = runner.invoke(cli, ["purge", url, "--policy", "files-age=1y"])
    assert bad.exit_code == 2 and "unknown retention item" in bad.output
