"""``agent-stores copy``: SQLite -> Redis -> PostgreSQL -> SQLite, on real servers.

The Redis and PostgreSQL servers come from ``AGENT_STORES_TEST_REDIS_URL`` /
``AGENT_STORES_TEST_POSTGRES_URL`` (set by nox and .ci/run); without them the private
servers of ``scripts/servers`` are started, as the backends' own tests do. A missing
server binary fails the tests: it never skips them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agent_stores import StoreURL, connect
from agent_stores.cli import cli
from agent_stores.sessions import RecoveryRequiredError
from agent_stores.transfer import Transfer
from click.testing import CliRunner
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai_harness.memory import MemoryConflictError, MemoryOperation
from pydantic_ai_harness.step_persistence import StepPersistence, continue_run

REPO_ROOT = Path(__file__).resolve().parents[3]
REDIS_ENV = "AGENT_STORES_TEST_REDIS_URL"
POSTGRES_ENV = "AGENT_STORES_TEST_POSTGRES_URL"


def _servers(name: str) -> ModuleType:
    path = REPO_ROOT / "scripts" / "servers" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"agent_stores_servers_{name}_copy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def redis_base() -> Iterator[str]:
    url = os.environ.get(REDIS_ENV)
    if url:
        yield url
        return
    if shutil.which("redis-server") is None:
        pytest.fail(f"set {REDIS_ENV} or install redis-server so the tests can start one")
    with _servers("redis").redis_servers(cluster=False) as urls:
        yield urls["redis"]


@pytest.fixture(scope="module")
def postgres_base() -> Iterator[str]:
    url = os.environ.get(POSTGRES_ENV)
    if url:
        yield url
        return
    with _servers("postgres").postgres_server() as urls:
        yield urls["postgres"]


@pytest.fixture
def redis_url(redis_base: str) -> str:
    parsed = StoreURL.parse(redis_base)
    return parsed.with_query(prefix=f"copy-{uuid.uuid4().hex[:8]}").render_with_secrets()


@pytest.fixture
def postgres_url(postgres_base: str) -> Iterator[str]:
    schema = f"copy_{uuid.uuid4().hex[:10]}"
    yield StoreURL.parse(postgres_base).with_query(schema=schema).render_with_secrets()
    import psycopg
    from agent_stores_postgres.config import PostgresConfig
    from psycopg.conninfo import make_conninfo

    conninfo = make_conninfo("", **PostgresConfig.from_url(postgres_base).conninfo)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- data ---------------------------------------------------------------------------------


def history(i: int, turns: int = 3) -> list[Any]:
    out: list[Any] = []
    for t in range(turns):
        out.append(ModelRequest(parts=[UserPromptPart(content=f"question {i}.{t} " + "x" * t)]))
        out.append(ModelResponse(parts=[TextPart(content=f"answer {i}.{t} ñ ✓")]))
    return out


LATCHED = [
    ModelRequest(parts=[UserPromptPart(content="pay the bill")]),
    ModelResponse(parts=[ToolCallPart(tool_name="pay", args={"amount": 3}, tool_call_id="c1")]),
]


async def populate(url: str, sessions: int = 3) -> dict[str, Any]:
    """Sessions (one latched), memory (versions, metadata, receipts, chunks, a tombstone) and
    runs (a journal and a harness step-persistence run) written through the public stores."""
    from agent_stores.checkpointer import JournalEvent
    from agent_stores.memory import KVMemoryStore
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    facts: dict[str, Any] = {}
    conn = connect(url)
    try:
        await conn.kv.setup()
        store = conn.sessions()
        facts["histories"] = {}
        for i in range(sessions):
            messages = history(i)
            facts["histories"][i] = ModelMessagesTypeAdapter.dump_json(messages)
            async with store.turn(f"s{i}") as session:
                session.replace(messages)
        async with store.turn("latched") as session:
            session.replace(LATCHED)
            await session.mark_effects([("pay", "c1")])
        memory = conn.memory()
        first = await memory.write_with_metadata(
            "notes/a.md",
            "v1",
            expected_version=None,
            metadata={"topic": "bills"},
            operation=MemoryOperation("op-1", "fp-1"),
        )
        second = await memory.write_with_metadata(
            "notes/a.md",
            "v2 ✓",
            expected_version=first.version,
            metadata={"topic": "bills", "n": "2"},
            operation=MemoryOperation("op-2", "fp-2"),
        )
        facts["a_versions"] = (first.version, second.version)
        # A small record size forces the content into chunks.
        small = KVMemoryStore(conn.kv, max_record_bytes=1024)
        await small.write("notes/big.md", "big " * 5000, expected_version=None)
        await memory.write("deep/er/c.md", "nested", expected_version=None)
        gone = await memory.write("tmp.md", "bye", expected_version=None)
        await memory.delete(
            "tmp.md", expected_version=gone.version, operation=MemoryOperation("op-del", "fp-del")
        )
        checkpointer = conn.checkpointer()
        await checkpointer.append("journal-1", JournalEvent(step_id="000001-model", payload=[1]))
        await checkpointer.append("journal-1", JournalEvent(step_id="000002-tool", payload="ok"))
        steps = checkpointer.step_store()
        agent: Any = Agent(TestModel(custom_output_text="done"))
        result = await agent.run("hi", capabilities=[StepPersistence(store=steps, run_id="run-1")])
        facts["run_messages"] = ModelMessagesTypeAdapter.dump_json(result.all_messages())
    finally:
        await conn.aclose()
    return facts


async def check_destination(
    url: str, facts: dict[str, Any], sessions: int = 3, *, take_turns: bool = True
) -> None:
    """Everything copied behaves on the destination: continues, latches, replays.

    ``take_turns=False`` reads sessions without a turn, leaving them exactly as copied.
    """
    conn = connect(url)
    try:
        store = conn.sessions()
        for i in range(sessions):
            if take_turns:
                async with store.turn(f"s{i}") as session:
                    saved = ModelMessagesTypeAdapter.dump_json(session.messages)
            else:
                messages = await store.read_messages(f"s{i}")
                assert messages is not None
                saved = ModelMessagesTypeAdapter.dump_json(messages)
            assert saved == facts["histories"][i]
        if take_turns:
            with pytest.raises(RecoveryRequiredError):
                async with store.turn("latched", timeout_seconds=1):
                    pass
        info = await store.inspect("latched")
        assert info is not None and [c.tool_call_id for c in info.pending_effects] == ["c1"]
        memory = conn.memory()
        a = await memory.read("notes/a.md", max_chars=1000)
        assert a is not None and a.content == "v2 ✓" and a.version == facts["a_versions"][1]
        assert a.metadata == {"topic": "bills", "n": "2"}
        replay = await memory.write_with_metadata(
            "notes/a.md",
            "v2 ✓",
            expected_version=facts["a_versions"][0],
            metadata={"topic": "bills", "n": "2"},
            operation=MemoryOperation("op-2", "fp-2"),
        )
        assert replay.replayed and replay.version == facts["a_versions"][1]
        deleted = await memory.get_operation(MemoryOperation("op-del", "fp-del"))
        assert deleted is not None and deleted.existed
        with pytest.raises(MemoryConflictError):
            await memory.write("notes/a.md", "stale", expected_version=facts["a_versions"][0])
        big = await memory.read("notes/big.md", max_chars=100_000)
        assert big is not None and big.content == "big " * 5000
        assert await memory.list_paths("", limit=10) == [
            "deep/er/c.md",
            "notes/a.md",
            "notes/big.md",
        ]
        checkpointer = conn.checkpointer()
        state = await checkpointer.load("journal-1")
        assert [e.payload for e in state.events] == [[1], "ok"]
        steps = checkpointer.step_store()
        continued = await continue_run(steps, run_id="run-1")
        assert ModelMessagesTypeAdapter.dump_json(continued) == facts["run_messages"]
    finally:
        await conn.aclose()


def run_cli(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result


# -- tests --------------------------------------------------------------------------------


def test_round_trip_sqlite_redis_postgres_sqlite(
    tmp_path: Path, redis_url: str, postgres_url: str
) -> None:
    sqlite_a = f"sqlite:///{tmp_path}/a.db"
    sqlite_b = f"sqlite:///{tmp_path}/b.db"
    facts = asyncio.run(populate(sqlite_a))
    for src, dst in [(sqlite_a, redis_url), (redis_url, postgres_url), (postgres_url, sqlite_b)]:
        result = run_cli("copy", src, dst, "--verify", "--json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.output)
        assert doc["verify"]["ok"]
        rows = {r["kind"]: r for r in doc["verify"]["kinds"]}
        assert rows["sessions"]["units"] == 4 and rows["sessions"]["mismatches"] == 0
        assert rows["memory"]["records"] > 0 and rows["runs"]["records"] > 0
        # A second run finds everything in place: nothing written, all identical.
        again = json.loads(run_cli("copy", src, dst, "--json").output)
        assert all(r["created"] == 0 and r["updated"] == 0 for r in again["kinds"])
        asyncio.run(check_destination(dst, facts, take_turns=False))
    # And back: the final SQLite file equals the first, record by record ...
    back = run_cli("copy", sqlite_b, sqlite_a, "--dry-run", "--json")
    assert all(r["created"] == 0 and r["updated"] == 0 for r in json.loads(back.output)["kinds"])
    # ... and its sessions continue (turns), latch and replay.
    asyncio.run(check_destination(sqlite_b, facts))


async def _scopes(url: str) -> list[str]:
    async with connect(url) as conn:
        await conn.kv.setup()
        return await conn.kv.scopes(limit=1000)


def test_dry_run_writes_nothing_and_only_selects(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    dst = f"sqlite:///{tmp_path}/dst.db"
    asyncio.run(populate(src, sessions=2))
    counted = json.loads(run_cli("copy", src, dst, "--dry-run", "--json").output)
    rows = {r["kind"]: r for r in counted["kinds"]}
    assert rows["sessions"]["units"] == 3 and rows["sessions"]["created"] > 0
    assert asyncio.run(_scopes(dst)) == []
    only = json.loads(run_cli("copy", src, dst, "--only", "memory", "--json").output)
    assert [r["kind"] for r in only["kinds"]] == ["memory"]
    scopes = asyncio.run(_scopes(dst))
    assert scopes and all(s.startswith("memory:") for s in scopes)
    bad = run_cli("copy", src, dst, "--only", "bogus")
    assert bad.exit_code == 2 and "bogus" in bad.output


def test_verify_reports_a_changed_record(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    dst = f"sqlite:///{tmp_path}/dst.db"
    asyncio.run(populate(src, sessions=1))
    assert run_cli("copy", src, dst, "-q").exit_code == 0

    async def change_and_verify() -> Any:
        async with connect(dst) as conn:
            memory = conn.memory()
            current = await memory.read("deep/er/c.md", max_chars=100)
            assert current is not None
            await memory.write("deep/er/c.md", "changed", expected_version=current.version)
        async with connect(src) as a, connect(dst) as b:
            return await Transfer(a.kv, b.kv).verify()

    report = asyncio.run(change_and_verify())
    assert not report.ok
    assert [m[2] for m in report.kinds["memory"].mismatches] == ["different value"]
    result = run_cli("copy", src, dst, "--verify")  # copying again repairs it
    assert result.exit_code == 0, result.output
    assert "verify: equal" in result.output


async def test_session_under_an_active_turn_is_retried_then_copied(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    dst = f"sqlite:///{tmp_path}/dst.db"
    await populate(src, sessions=1)
    async with connect(src) as a, connect(dst) as b:
        store = a.sessions()
        entered = asyncio.Event()
        release = asyncio.Event()

        async def hold() -> None:
            async with store.turn("s0") as session:
                session.replace([*session.messages, *history(9, turns=1)])
                entered.set()
                await release.wait()

        holder = asyncio.create_task(hold())
        await entered.wait()
        busy = await Transfer(a.kv, b.kv, src_sessions=store, busy_timeout=0.2).copy()
        assert busy.kinds["sessions"].busy == ["session:s0"] and not busy.ok
        assert await b.kv.get("session:s0", "state") is None  # never half-copied

        async def finish_soon() -> None:
            await asyncio.sleep(0.3)
            release.set()

        finisher = asyncio.create_task(finish_soon())
        done = await Transfer(a.kv, b.kv, src_sessions=store, busy_timeout=10).copy()
        await holder
        await finisher
        assert done.ok and not done.kinds["sessions"].busy
        copied = await b.sessions().read_messages("s0")
        assert copied is not None and len(copied) == 8  # the turn's save was copied whole


def test_secrets_never_printed(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    dst = "redis://user:hunter2-secret@127.0.0.1:1/0?socket_timeout=0.2"
    result = CliRunner().invoke(cli, ["copy", src, dst, "--jobs", "1"])
    assert result.exit_code != 0
    assert "hunter2-secret" not in result.output
    assert "hunter2-secret" not in repr(result.exception)


def _count_scopes(url: str) -> int:
    async def count() -> int:
        async with connect(url) as conn:
            return len(await conn.kv.scopes(prefix="session:", limit=10_000))

    return asyncio.run(count())


def test_killed_copy_rerun_completes_without_duplicates(tmp_path: Path, postgres_url: str) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    n = 200
    facts = asyncio.run(populate(src, sessions=n))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "agent_stores.cli", "copy", src, postgres_url, "--jobs", "1"]
    proc = subprocess.Popen(
        [*argv, "-q"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        # Kill it once part of the sessions landed (polled, not timed).
        deadline = time.monotonic() + 120
        copied = 0
        while time.monotonic() < deadline and proc.poll() is None:
            copied = _count_scopes(postgres_url)
            if copied >= 20:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the copy finished before it could be interrupted"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert 20 <= _count_scopes(postgres_url) < n + 1
    rerun = subprocess.run(
        [*argv, "--verify", "--json"], env=env, capture_output=True, text=True, check=False
    )
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    doc = json.loads(rerun.stdout)
    sessions = {r["kind"]: r for r in doc["kinds"]}["sessions"]
    assert sessions["identical"] > 0  # what the killed run copied was kept, not rewritten
    verify = {r["kind"]: r for r in doc["verify"]["kinds"]}
    assert all(r["mismatches"] == 0 and r["only_in_destination"] == 0 for r in verify.values())
    assert _count_scopes(postgres_url) == n + 1
    asyncio.run(check_destination(postgres_url, facts, sessions=n))
