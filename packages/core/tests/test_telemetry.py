"""OpenTelemetry: store spans nest under Pydantic AI's agent-run span, with no secret in any
attribute; metrics are recorded; without a provider (or without the API) nothing is done.

The SDK is configured as the *global* provider, as an application would; OpenTelemetry
allows that once per process, so the providers are set up once for this module.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agent_stores import StoreURL, connect, telemetry
from agent_stores.capabilities import session_checkpoints
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.capabilities import Instrumentation
from pydantic_ai.models.test import TestModel
from pydantic_ai_harness.step_persistence import StepPersistence

SECRET = "s3cret-Pw-" + uuid.uuid4().hex[:6]


@pytest.fixture(scope="module")
def otel() -> Iterator[tuple[InMemorySpanExporter, InMemoryMetricReader]]:
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    reader = InMemoryMetricReader()
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # another module already set one up
        current.add_span_processor(processor)
    else:
        provider = TracerProvider()
        provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
    meter_provider = MeterProvider(metric_readers=[reader])
    metrics.set_meter_provider(meter_provider)
    telemetry._instruments.cache_clear()  # instruments made under an earlier provider
    yield exporter, reader
    # The global providers stay for the rest of the process; stop keeping what they record.
    processor.shutdown()
    exporter.clear()
    meter_provider.shutdown()
    telemetry._instruments.cache_clear()


def _postgres_servers() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "scripts" / "servers" / "postgres.py"
    spec = importlib.util.spec_from_file_location("agent_stores_servers_postgres_otel", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def postgres_base() -> Iterator[str]:
    """``AGENT_STORES_TEST_POSTGRES_URL``, else a private database (never skipped)."""
    url = os.environ.get("AGENT_STORES_TEST_POSTGRES_URL")
    if url:
        yield url
        return
    with _postgres_servers().postgres_server() as urls:
        yield urls["postgres"]


@pytest.fixture
def secret_url(postgres_base: str) -> Iterator[str]:
    """The PostgreSQL URL with a password added (the test servers trust loopback, so it is
    sent and ignored) and a schema of its own, dropped afterwards."""
    schema = f"otel_{uuid.uuid4().hex[:8]}"
    parsed = StoreURL.parse(postgres_base)
    yield (
        parsed.set(username=parsed.username or "postgres", password=SECRET)
        .with_query(schema=schema)
        .render_with_secrets()
    )
    import psycopg
    from agent_stores_postgres.config import PostgresConfig
    from psycopg.conninfo import make_conninfo

    conninfo = make_conninfo("", **PostgresConfig.from_url(postgres_base).conninfo)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _chain(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[ReadableSpan]:
    out = []
    parent = span.parent
    while parent is not None and parent.span_id in by_id:
        current = by_id[parent.span_id]
        out.append(current)
        parent = current.parent
    return out


async def _one_agent_turn_on_every_store(url: str) -> None:
    """One agent run inside a session turn, writing memory and steps from a tool."""
    async with connect(url) as conn:
        await conn.kv.setup()
        sessions = conn.sessions()
        memory = conn.memory()
        steps = conn.checkpointer().step_store()

        async def remember(fact: str) -> str:
            """Keep a fact."""
            await memory.write(f"facts/{uuid.uuid4().hex[:6]}.md", fact, expected_version=None)
            found = await memory.search(
                "facts/", fact, limit=3, max_files=10, max_chars=200, max_file_chars=200
            )
            return f"kept ({found.scanned} scanned)"

        agent: Any = Agent(
            TestModel(call_tools=["remember"], custom_output_text="done"),
            tools=[remember],
            capabilities=[Instrumentation()],  # Pydantic AI's spans, on the global provider
        )
        async with sessions.turn("user-1") as session:
            result = await agent.run(
                "remember this",
                message_history=session.messages,
                capabilities=[
                    session_checkpoints(session),
                    StepPersistence(store=steps, run_id=f"run-{uuid.uuid4().hex[:6]}"),
                ],
            )
            session.replace(result.all_messages())


def _assert_client_spans_of(system: str, store_spans: list[ReadableSpan]) -> None:
    """Every store span is a CLIENT span naming the database, operation and server; those
    through the KV API report their round trips and bytes (a backend's native statements,
    like PostgreSQL's memory writes, are not counted)."""
    for span in store_spans:
        attrs = dict(span.attributes or {})
        assert attrs["db.system"] == system and attrs["db.operation.name"]
        assert span.kind == trace.SpanKind.CLIENT
        assert attrs["server.address"] and isinstance(attrs.get("server.port"), int)
    searches = [s for s in store_spans if s.name == "agent_stores.memory.search"]
    assert searches and all(
        (s.attributes or {})["agent_stores.round_trips"] >= 1
        and (s.attributes or {})["agent_stores.bytes"] > 0
        for s in searches
    )


def _store_metric_names(reader: InMemoryMetricReader) -> set[str]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if sm.scope.name == "agent_stores"
    }


async def test_store_spans_nest_under_the_agent_run(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], secret_url: str
) -> None:
    exporter, reader = otel
    exporter.clear()
    await _one_agent_turn_on_every_store(secret_url)
    spans = list(exporter.get_finished_spans())
    by_id = {s.context.span_id: s for s in spans}
    runs = [s for s in spans if s.name.startswith(("invoke_agent", "agent run"))]
    assert len(runs) == 1, [s.name for s in spans]
    run = runs[0]
    store_spans = [s for s in spans if s.name.startswith("agent_stores.")]
    under_run = {s.name for s in store_spans if run in _chain(s, by_id)}
    assert {
        "agent_stores.memory.write",
        "agent_stores.memory.search",
        "agent_stores.session.checkpoint",
        "agent_stores.steps.append_event",
    } <= under_run, under_run
    # The turn's own spans wrap the run, outside it.
    names = {s.name for s in store_spans}
    assert {"agent_stores.session.acquire", "agent_stores.session.release"} <= names
    _assert_client_spans_of("postgresql", store_spans)
    for span in spans:
        text = repr(dict(span.attributes or {})) + span.name + repr(span.events)
        assert SECRET not in text, span.name
    assert {
        "agent_stores.operation.duration",
        "agent_stores.session.turn.duration",
        "agent_stores.session.lease.wait",
    } <= _store_metric_names(reader)


async def test_failed_operation_has_error_type_and_counts_a_conflict(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], tmp_path: Path
) -> None:
    from pydantic_ai_harness.memory import MemoryConflictError

    exporter, reader = otel
    exporter.clear()
    async with connect(f"sqlite:///{tmp_path}/c.db") as conn:
        memory = conn.memory()
        await memory.write("a.md", "one", expected_version=None)
        with pytest.raises(MemoryConflictError):
            await memory.write("a.md", "two", expected_version=None)
    failed = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "agent_stores.memory.write" and not s.status.is_ok
    ]
    assert len(failed) == 1
    assert failed[0].status.status_code == trace.StatusCode.ERROR
    assert (failed[0].attributes or {})["error.type"] == "MemoryConflictError"
    data = reader.get_metrics_data()
    assert data is not None
    conflicts = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "agent_stores.conflicts"
    ]
    assert conflicts and sum(p.value for p in conflicts[0].data.data_points) >= 1


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_without_a_provider_nothing_is_created() -> None:
    out = _run(
        """
        import asyncio
        from agent_stores import telemetry
        from opentelemetry import trace

        async def op(x):
            return x * 2

        traced = telemetry.traced("memory.read")(op)
        assert not telemetry.enabled()
        with telemetry.span("memory.read") as span:
            assert span is None
        assert asyncio.run(traced(21)) == 42
        print("ok")
        """
    )
    assert out == "ok"


def test_the_provider_globals_read_for_the_fast_check_exist() -> None:
    """``enabled()`` reads the API's provider globals to skip its environment lookup per
    call; if a release renames them, this fails (and the check falls back to the API)."""
    import opentelemetry.metrics._internal as metrics_internal

    assert hasattr(trace, telemetry._PROVIDER_ATTRIBUTE)
    assert metrics_internal.__name__ == telemetry._METER_MODULE
    assert hasattr(metrics_internal, telemetry._METER_ATTRIBUTE)


def test_a_provider_named_in_the_environment_is_used() -> None:
    env = {**os.environ, "OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from agent_stores import telemetry; import opentelemetry.trace; "
            "print(telemetry.enabled(), telemetry.recording())",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True True"


def test_a_meter_provider_alone_records_turn_metrics() -> None:
    """Turns skip telemetry entirely while no provider is configured, and record their
    metrics as soon as an application sets only a meter provider (no tracer)."""
    out = _run(
        """
        import asyncio
        from agent_stores import open_sessions, telemetry
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        async def turns(store, n):
            for i in range(n):
                async with store.turn("s") as session:
                    session.replace(session.messages)

        async def main():
            store = open_sessions("memory://")
            assert not telemetry.recording()
            await turns(store, 2)
            reader = InMemoryMetricReader()
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
            assert telemetry.recording() and not telemetry.enabled()
            await turns(store, 3)
            await store.aclose()
            names = {
                m.name: sum(p.count for p in m.data.data_points)
                for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
            }
            print(names["agent_stores.session.turn.duration"],
                  names["agent_stores.session.lease.wait"])

        asyncio.run(main())
        """
    )
    assert out == "3 3"


def test_without_the_api_installed_helpers_are_the_identity() -> None:
    out = _run(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
        from agent_stores import telemetry

        async def op():
            return 1

        assert telemetry.traced("memory.read")(op) is op
        assert telemetry.turn_enter(op) is op
        assert not telemetry.enabled()
        telemetry.record_retry("x")
        print("ok")
        """
    )
    assert out == "ok"


async def test_handover_between_two_clients_is_counted(
    otel: tuple[InMemorySpanExporter, InMemoryMetricReader], tmp_path: Path
) -> None:
    import asyncio

    _, reader = otel

    def handovers() -> float:
        data = reader.get_metrics_data()
        return sum(
            p.value
            for rm in (data.resource_metrics if data else [])
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "agent_stores.session.handovers"
            for p in m.data.data_points
        )

    from agent_stores.sessions.records import WAITER_KEY

    before = handovers()
    async with connect(f"sqlite:///{tmp_path}/h.db") as conn:
        first, second = conn.sessions(), conn.sessions()  # two clients of one database
        held = asyncio.Event()
        release = asyncio.Event()

        async def hold() -> None:
            async with first.turn("shared"):
                held.set()
                await release.wait()

        async def wait_for_it() -> str:
            async with second.turn("shared", timeout_seconds=30) as session:
                return session.session_id

        holder = asyncio.create_task(hold())
        await held.wait()
        waiter = asyncio.create_task(wait_for_it())
        # Release only once the second client has seen the session busy (its hint is there).
        while await conn.kv.get("session:shared", WAITER_KEY) is None:
            assert not waiter.done()
            await asyncio.sleep(0.005)
        release.set()
        await holder
        assert await waiter == "shared"
    assert handovers() >= before + 1
