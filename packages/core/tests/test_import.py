"""Importers, on data written by the anchors' own packages: pydantic-ai-harness's SQLite and
PostgreSQL memory and step stores (through its Memory and StepPersistence capabilities
in real agent runs) and pydantic-ai-memory-core."""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import connect
from agent_stores.importers.memory import (
    import_memory,
    memory_core_fingerprints,
    postgres_fingerprints,
    sqlite_fingerprints,
)
from agent_stores.importers.steps import import_steps
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai_harness.memory import Memory, MemoryOperation, PostgresMemoryStore
from pydantic_ai_harness.memory._sqlite import SqliteMemoryStore
from pydantic_ai_harness.step_persistence import (
    PostgresStepStore,
    SqliteStepStore,
    StepPersistence,
    continue_run,
)

POSTGRES_ENV = "AGENT_STORES_TEST_POSTGRES_URL"


def _postgres_servers() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "scripts" / "servers" / "postgres.py"
    spec = importlib.util.spec_from_file_location("agent_stores_servers_postgres_import", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def postgres_base() -> Iterator[str]:
    url = os.environ.get(POSTGRES_ENV)
    if url:
        yield url
        return
    with _postgres_servers().postgres_server() as urls:
        yield urls["postgres"]


@pytest_asyncio.fixture
async def pg_pool(postgres_base: str) -> AsyncIterator[Any]:
    """An asyncpg pool in a schema of its own (the harness Postgres stores take a pool)."""
    import asyncpg
    from agent_stores_postgres.config import PostgresConfig

    info = PostgresConfig.from_url(postgres_base).conninfo
    params = {
        "host": info.get("host"),
        "port": int(info.get("port") or 5432),
        "user": info.get("user"),
        "password": info.get("password"),
        "database": info.get("dbname"),
    }
    schema = f"imp_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(**params)
    await admin.execute(f'CREATE SCHEMA "{schema}"')
    pool = await asyncpg.create_pool(
        **params, min_size=1, max_size=4, server_settings={"search_path": schema}
    )
    try:
        yield pool
    finally:
        await pool.close()
        await admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await admin.close()


# -- scripted models ----------------------------------------------------------------------


def writer_model(file: str, content: str) -> FunctionModel:
    """Calls write_memory once, then answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart("noted")])
        return ModelResponse(
            parts=[ToolCallPart("write_memory", {"content": content, "file": file})]
        )

    return FunctionModel(respond)


def reader_model(file: str) -> FunctionModel:
    """Calls read_memory, then answers with what the tool returned."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(str(returns[-1].content))])
        return ModelResponse(parts=[ToolCallPart("read_memory", {"file": file})])

    return FunctionModel(respond)


async def write_with_harness(store: Any) -> None:
    """Real harness data: two Memory-capability runs, plus direct protocol writes with
    metadata, receipts and a deletion."""
    for content in ("likes green tea", "works late on Fridays"):
        agent: Any = Agent(writer_model("prefs.md", content))
        await agent.run("remember", capabilities=[Memory(store=store, namespace="acme")])
    if hasattr(store, "write_with_metadata"):
        first = await store.write_with_metadata(
            "acme/main/projects.md",
            "apollo: launch in May",
            expected_version=None,
            metadata={"source": "crm"},
            operation=MemoryOperation("op-a", "fp-a"),
        )
    else:  # pydantic-ai-memory-core keeps no metadata
        first = await store.write(
            "acme/main/projects.md",
            "apollo: launch in May",
            expected_version=None,
            operation=MemoryOperation("op-a", "fp-a"),
        )
    await store.write(
        "acme/main/projects.md",
        "apollo: launch in June",
        expected_version=first.version,
        operation=MemoryOperation("op-b", "fp-b"),
    )
    gone = await store.write("acme/main/tmp.md", "scratch", expected_version=None)
    await store.delete(
        "acme/main/tmp.md", expected_version=gone.version, operation=MemoryOperation("op-c", "fp-c")
    )


async def check_imported_memory(source: Any, url: str) -> None:
    async with connect(url) as conn:
        ours = conn.memory()
        assert await ours.list_paths("", limit=100) == await source.list_paths("", limit=100)
        for path in await source.list_paths("", limit=100):
            theirs = await source.read(path, max_chars=100_000)
            mine = await ours.read(path, max_chars=100_000)
            assert mine is not None and theirs is not None
            assert (mine.content, mine.metadata) == (theirs.content, theirs.metadata)
        # Served unchanged through the harness Memory capability on our store.
        agent: Any = Agent(reader_model("prefs.md"))
        result = await agent.run(
            "what do I like?", capabilities=[Memory(store=ours, namespace="acme")]
        )
        assert "likes green tea" in result.output and "works late on Fridays" in result.output
        # The receipt of the current version replays on agent-stores.
        replay = await ours.write(
            "acme/main/projects.md",
            "apollo: launch in June",
            expected_version="anything",
            operation=MemoryOperation("op-b", "fp-b"),
        )
        assert replay.replayed


async def test_harness_sqlite_memory(tmp_path: Path) -> None:
    source = SqliteMemoryStore(database=tmp_path / "harness.db")
    await write_with_harness(source)
    url = f"sqlite:///{tmp_path}/ours.db"
    lookup, receipts = sqlite_fingerprints(tmp_path / "harness.db")
    async with connect(url) as conn:
        report = await import_memory(
            source, conn.memory(), fingerprint_of=lookup, receipts_total=receipts
        )
    assert report.ok and report.imported == 2
    assert any("earlier versions or deletions" in line for line in report.not_carried)
    await check_imported_memory(source, url)
    async with connect(url) as conn:  # idempotent
        again = await import_memory(source, conn.memory(), fingerprint_of=lookup)
    assert (again.imported, again.updated, again.identical) == (0, 0, 2)


async def test_harness_postgres_memory(tmp_path: Path, pg_pool: Any) -> None:
    source = PostgresMemoryStore(pg_pool)
    await write_with_harness(source)
    url = f"sqlite:///{tmp_path}/ours.db"
    lookup, receipts = await postgres_fingerprints(pg_pool)
    async with connect(url) as conn:
        report = await import_memory(
            source, conn.memory(), fingerprint_of=lookup, receipts_total=receipts
        )
    assert report.ok and report.imported == 2
    await check_imported_memory(source, url)


async def test_memory_core_store(tmp_path: Path) -> None:
    from pydantic_ai_memory_core.testing import InMemoryKVMemoryStore

    source = InMemoryKVMemoryStore()
    await write_with_harness(source)
    url = f"sqlite:///{tmp_path}/ours.db"
    async with connect(url) as conn:
        report = await import_memory(
            source, conn.memory(), fingerprint_of=memory_core_fingerprints(source)
        )
    assert report.ok and report.imported == 2
    await check_imported_memory(source, url)


async def run_on_harness(store: Any) -> list[ModelMessage]:
    """A real harness run, checkpointed by StepPersistence (tool call included)."""
    agent: Any = Agent(TestModel(call_tools=["lookup"], custom_output_text="all done"))

    @agent.tool_plain
    def lookup(city: str) -> str:
        return f"sunny in {city}"

    result = await agent.run(
        "weather?",
        conversation_id="conv-9",
        capabilities=[StepPersistence(store=store, run_id="harness-run")],
    )
    return list(result.all_messages())


async def check_imported_run(source: Any, url: str, expected: list[ModelMessage]) -> None:
    async with connect(url) as conn:
        ours = conn.checkpointer().step_store()
        continued = await continue_run(ours, run_id="harness-run")
        assert ModelMessagesTypeAdapter.dump_json(continued) == ModelMessagesTypeAdapter.dump_json(
            await continue_run(source, run_id="harness-run")
        )
        assert ModelMessagesTypeAdapter.dump_json(continued) == ModelMessagesTypeAdapter.dump_json(
            expected
        )
        assert [e.kind for e in await ours.list_events(run_id="harness-run")] == [
            e.kind for e in await source.list_events(run_id="harness-run")
        ]
        assert [r.run_id for r in await ours.list_runs(conversation_id="conv-9")] == ["harness-run"]
        # And the conversation goes on, on agent-stores.
        agent: Any = Agent(TestModel(custom_output_text="continued"))
        result = await agent.run(
            "and tomorrow?",
            message_history=continued,
            capabilities=[StepPersistence(store=ours, run_id="next-run")],
        )
        assert result.output == "continued"
        assert len(result.all_messages()) == len(continued) + 2


async def test_harness_sqlite_steps(tmp_path: Path) -> None:
    source = SqliteStepStore(database=tmp_path / "steps.db")
    expected = await run_on_harness(source)
    url = f"sqlite:///{tmp_path}/ours.db"
    async with connect(url) as conn:
        report = await import_steps(source, conn.checkpointer().step_store())
    assert report.ok and report.imported == 1, report.lines()
    await check_imported_run(source, url, expected)
    async with connect(url) as conn:  # idempotent
        again = await import_steps(source, conn.checkpointer().step_store())
    assert (again.imported, again.updated, again.identical) == (0, 0, 1)


async def test_harness_postgres_steps(tmp_path: Path, pg_pool: Any) -> None:
    source = PostgresStepStore(pg_pool)
    expected = await run_on_harness(source)
    url = f"sqlite:///{tmp_path}/ours.db"
    async with connect(url) as conn:
        report = await import_steps(
            source, conn.checkpointer().step_store(), run_ids=["harness-run"]
        )
    assert report.ok and report.imported == 1, report.lines()
    await check_imported_run(source, url, expected)


def test_cli_imports_harness_sqlite_memory_and_steps(tmp_path: Path) -> None:
    import asyncio

    from agent_stores.cli import cli
    from click.testing import CliRunner

    memory_db, steps_db = tmp_path / "memory.db", tmp_path / "steps.db"
    asyncio.run(write_with_harness(SqliteMemoryStore(database=memory_db)))
    expected = asyncio.run(run_on_harness(SqliteStepStore(database=steps_db)))
    dst = f"sqlite:///{tmp_path}/ours.db"
    runner = CliRunner()
    first = runner.invoke(cli, ["import", "harness-memory", f"sqlite:///{memory_db}", dst])
    assert first.exit_code == 0, first.output
    assert "2 imported" in first.output and "not carried over" in first.output
    again = runner.invoke(cli, ["import", "harness-memory", f"sqlite:///{memory_db}", dst])
    assert "0 imported, 0 updated, 2 already identical" in again.output
    runs = runner.invoke(cli, ["import", "harness-steps", f"sqlite:///{steps_db}", dst])
    assert runs.exit_code == 0 and "1 imported" in runs.output, runs.output
    asyncio.run(check_imported_run(SqliteStepStore(database=steps_db), dst, expected))


async def test_a_file_the_source_reads_cut_short_is_not_imported(tmp_path: Path) -> None:
    """A source whose longest read still says ``truncated`` is reported as failed and
    nothing of it is written (never a file cut short), while the other files import."""
    from agent_stores.importers import memory as importer
    from pydantic_ai_harness.memory import InMemoryMemoryStore

    source = InMemoryMemoryStore()
    await source.write("u/short.md", "short", expected_version=None)
    await source.write("u/long.md", "x" * 50, expected_version=None)
    real_read = source.read

    async def read(path: str, *, max_chars: int) -> Any:
        assert max_chars == importer._MAX_CHARS
        # A file longer than the importer's bound, as the source reports it.
        return await real_read(path, max_chars=10 if path == "u/long.md" else max_chars)

    source.read = read  # type: ignore[method-assign]
    async with connect(f"sqlite:///{tmp_path}/ours.db") as conn:
        report = await import_memory(source, conn.memory())
        assert report.imported == 1
        assert report.failed == [
            f"u/long.md: longer than {importer._MAX_CHARS:,} characters; not imported"
        ]
        assert await conn.memory().list_paths("", limit=10) == ["u/short.md"]
