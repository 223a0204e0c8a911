# The exception under test comes out of the ``async with store.turn()`` block itself,
# so pytest.raises must enclose the whole block.
# ruff: noqa: PT012
"""The native session fast path: chosen by the hook, two round trips per turn, no orphan chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import StoreURL, connect, open_kv, open_sessions
from agent_stores.sessions import KVSessionPort, LeaseLostError, SessionStore
from agent_stores.sessions.records import CHUNK_PREFIX, STATE_KEY
from agent_stores_postgres.kv import PostgresKV
from agent_stores_postgres.sessions import PostgresSessionPort
from pg_faultproxy import FaultProxy
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart


def pair(tag: str, pad: int = 200) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(content=f"q:{tag}" + "." * pad)]),
        ModelResponse(parts=[TextPart(content=f"a:{tag}" + "." * pad)]),
    ]


def texts(messages: list[ModelMessage]) -> list[str]:
    out = []
    for message in messages:
        part = message.parts[0]
        content = getattr(part, "content", "")
        out.append(str(content).rstrip("."))
    return out


async def test_hook_returns_the_native_store(schema_url: str) -> None:
    """open_sessions and connect().sessions() on a PostgreSQL URL get the native port; other KVs do not."""
    async with open_sessions(schema_url) as sessions:
        assert isinstance(sessions.storage.port, PostgresSessionPort)
    async with connect(schema_url) as conn:
        assert isinstance(conn.sessions().storage.port, PostgresSessionPort)
    async with open_sessions("memory://native-check") as other:
        assert not isinstance(other.storage.port, PostgresSessionPort)


@pytest_asyncio.fixture
async def proxy(postgres_url: str) -> AsyncIterator[FaultProxy]:
    target = StoreURL.parse(postgres_url)
    running = await FaultProxy(target.host or "127.0.0.1", target.port or 5432).start()
    yield running
    await running.aclose()


def proxied_url(schema_url: str, proxy: FaultProxy) -> str:
    url = StoreURL.parse(schema_url).set(host="127.0.0.1", port=proxy.port)
    # Unnamed statements only: a statement's first server-side preparation costs an extra
    # round trip, which would blur the count.
    url = url.with_query(sslmode="disable", min_size="1", max_size="1", prepare_threshold="none")
    return url.render_with_secrets()


@pytest.mark.parametrize("native", [True, False])
async def test_round_trips_per_turn(schema_url: str, proxy: FaultProxy, native: bool) -> None:
    """Every turn (enter, read, replace +2 messages, exit) costs exactly 2 round trips with the
    native store, chunk spills included; the generic store needs at least 3."""
    kv = open_kv(proxied_url(schema_url, proxy))
    await kv.setup()
    options: dict[str, Any] = {"owns_kv": True, "fanout": 64}  # no merges: nothing to delete
    port = PostgresSessionPort(kv) if native else KVSessionPort(kv)
    store = SessionStore(kv, port=port, **options)
    per_turn: list[int] = []
    async with store:
        async with store.turn("rt") as session:
            session.replace([m for i in range(50) for m in pair(f"h{i}")])
        for i in range(20):
            before = proxy.requests
            async with store.turn("rt") as session:
                assert len(session.messages) == 100 + 2 * i
                session.replace([*session.messages, *pair(f"n{i}", 500)])
            per_turn.append(proxy.requests - before)
        info = await store.inspect("rt")
        assert info is not None and info.chunk_count >= 3  # spills happened in the window
    if native:
        assert per_turn == [2] * 20
    else:
        assert min(per_turn) >= 3


async def test_cold_turn_is_two_round_trips(schema_url: str, proxy: FaultProxy) -> None:
    """Turns alternating between two store objects (two processes): each turn finds the
    session last written by the other, and still costs exactly 2 round trips, receiving
    only the chunks it lacks; a store that never saw the session costs the same."""
    stores = []
    for _ in range(3):
        kv = open_kv(proxied_url(schema_url, proxy))
        await kv.setup()
        stores.append(SessionStore(kv, owns_kv=True, fanout=64, tail_bytes=600))
    a, b, fresh = stores
    per_turn: list[int] = []
    try:
        async with a.turn("cold") as session:
            session.replace([m for i in range(20) for m in pair(f"h{i}")])
        expected = 40
        for store in [b, a, b, a, fresh]:
            before = proxy.requests
            async with store.turn("cold") as session:
                assert len(session.messages) == expected
                session.replace([*session.messages, *pair(f"n{expected}", 500)])
            per_turn.append(proxy.requests - before)
            expected += 2
    finally:
        for store in stores:
            await store.aclose()
    assert per_turn == [2] * 5


async def test_warm_acquire_overtaken_costs_one_round_trip_more_once(
    schema_url: str, proxy: FaultProxy
) -> None:
    """A store whose last acquire of a session was warm sends the warm write alone first;
    when another store wrote in between, that matches nothing and the full statement
    follows (3 round trips for that turn, the other store's messages read), and the
    session's next acquires there send the full statement at once (2 round trips)."""
    stores = []
    for _ in range(2):
        kv = open_kv(proxied_url(schema_url, proxy))
        await kv.setup()
        stores.append(SessionStore(kv, owns_kv=True, fanout=64, tail_bytes=600))
    a, b = stores
    per_turn: list[int] = []
    try:
        async with a.turn("overtaken") as session:
            session.replace(pair("h0"))
        expected = 2
        for store in [a, a, a, b, a, b, a, a, a]:
            before = proxy.requests
            async with store.turn("overtaken") as session:
                assert len(session.messages) == expected
                assert texts(session.messages)[-1] == f"a:{'h0' if expected == 2 else expected - 2}"
                session.replace([*session.messages, *pair(str(expected))])
            per_turn.append(proxy.requests - before)
            expected += 2
    finally:
        for store in stores:
            await store.aclose()
    # a: full (found warm), warm, warm; b: full; a: the warm write misses, then full;
    # b, a, a: full (the last of them found it warm); a: warm
    assert per_turn == [2, 2, 2, 2, 3, 2, 2, 2, 2]


async def test_cold_store_loads_chunked_history(schema_url: str) -> None:
    """A history spilled into many chunks (small tail, merges) written by one store is read whole by a fresh one."""
    options: dict[str, Any] = {"tail_bytes": 600, "fanout": 3}
    async with open_sessions(schema_url, **options) as writer:
        for i in range(40):
            async with writer.turn("cold") as session:
                session.replace([*session.messages, *pair(f"t{i}")])
        info = await writer.inspect("cold")
        assert info is not None and info.chunk_count >= 2
    async with open_sessions(schema_url, **options) as reader, reader.turn("cold") as session:
        assert texts(session.messages) == [t for i in range(40) for t in (f"q:t{i}", f"a:t{i}")]
        session.replace([*session.messages, *pair("last")])
    async with open_sessions(schema_url) as third:
        messages = await third.read_messages("cold")
        assert messages is not None and texts(messages)[-2:] == ["q:last", "a:last"]


async def test_fenced_out_save_writes_no_chunk(schema_url: str) -> None:
    """A save whose fence lost writes nothing at all: its new chunks go in only with the state."""
    async with open_sessions(schema_url, tail_bytes=600) as sessions:
        kv = sessions.kv
        assert isinstance(kv, PostgresKV)
        scope = sessions.storage.scope_for("fenced")
        with pytest.raises(LeaseLostError):
            async with sessions.turn("fenced") as session:
                state = await kv.get(scope, STATE_KEY)
                assert state is not None
                # Someone else's write moves the fence under this turn.
                await kv.replace(scope, STATE_KEY, state.value, expected_version=state.version)
                session.replace([m for i in range(30) for m in pair(f"big{i}")])
        assert await kv.scan(scope, prefix=CHUNK_PREFIX) == []


async def test_corrupted_header_falls_back_to_generic_errors(schema_url: str) -> None:
    """A state the server cannot parse is handed to the generic path, which reports SESSION_INVALID; reset clears it."""
    from agent_stores.sessions import InvalidSessionError

    async with open_sessions(schema_url) as sessions:
        async with sessions.turn("bad") as session:
            session.replace(pair("x"))
        scope = sessions.storage.scope_for("bad")
        state = await sessions.kv.get(scope, STATE_KEY)
        assert state is not None
        await sessions.kv.replace(
            scope, STATE_KEY, b"{not json\n[]", expected_version=state.version
        )
        with pytest.raises(InvalidSessionError):
            async with sessions.turn("bad"):
                pass
        assert await sessions.reset("bad") is True
        async with sessions.turn("bad") as session:
            assert session.messages == []
