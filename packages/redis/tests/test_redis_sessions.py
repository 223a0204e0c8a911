"""The native session store on Redis: what it saves over the generic one, and that it stays safe.

Commands are counted by the server itself (``MONITOR`` on a private server), so "two
round trips per turn" is measured, not assumed: the store sends each command as one
request/response exchange.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from agent_stores import connect, open_sessions
from agent_stores.sessions import KVSessionPort, LeaseLostError, SessionStore
from agent_stores.sessions.records import CHUNK_PREFIX
from agent_stores_contract.kv import offset_clock
from agent_stores_redis import lua
from agent_stores_redis.sessions import RedisSessionPort
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from redis.asyncio import Redis
from redis_test_support import PrivateServer


def pair(text: str, pad: int = 0) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f"q:{text}" + " " * pad)]),
        ModelResponse(parts=[TextPart(f"a:{text}")]),
    ]


def texts(messages: list[ModelMessage]) -> list[str]:
    out: list[str] = []
    for message in messages:
        part = message.parts[0]
        content = getattr(part, "content", "")
        out.append(str(content).rstrip())
    return out


#: Commands of the background collection after a turn that merged chunks away (off the
#: turn's path): a scan for branches and forks' pins that may still name them, then
#: (after a state read, HMGET) the deletes, one commit for many parts.
BACKGROUND = frozenset({"EVALSHA:scan", "EVALSHA:delete", "EVALSHA:commit"})


def turn_commands(calls: list[str]) -> list[str]:
    """The scripts of the turn itself: those before the background collection starts (it
    runs after the turn's save; everything from its scan on is the collection's)."""
    scripts = [c for c in calls if c.startswith("EVAL")]
    if "EVALSHA:scan" in scripts:
        at = scripts.index("EVALSHA:scan")
        assert set(scripts[at:]) <= BACKGROUND, calls
        scripts = scripts[:at]
    return scripts


async def turn(store: SessionStore, sid: str, text: str, pad: int = 0) -> list[str]:
    async with store.turn(sid) as session:
        before = texts(session.messages)
        session.replace([*session.messages, *pair(text, pad)])
    return before


SCRIPTS = {script.sha: script.name for script in lua.ALL}


class CommandCounter:
    """Counts the commands clients send to a private server, read from ``MONITOR``.

    Commands run inside Lua scripts (client type ``lua``) are not requests and are not
    counted. A marker ``ECHO`` brackets each measurement, so nothing depends on timing.
    """

    def __init__(self, port: int) -> None:
        self.client = Redis(host="127.0.0.1", port=port)
        self.watcher = Redis(host="127.0.0.1", port=port)
        self.monitor = self.watcher.monitor()

    async def start(self) -> None:
        await self.monitor.__aenter__()

    async def _until_marker(self) -> list[str]:
        marker = f"marker-{uuid.uuid4().hex}"
        await self.client.echo(marker)
        seen: list[str] = []
        while True:
            info = await self.monitor.next_command()
            if marker in info["command"]:
                return seen
            if info["client_type"] != "lua":
                words = [w.strip('"') for w in info["command"].split()[:2]]
                name = words[0].upper()
                if name == "EVALSHA":
                    name += ":" + SCRIPTS.get(words[1], words[1])
                seen.append(name)

    async def reset(self) -> None:
        await self._until_marker()

    async def count(self) -> list[str]:
        return await self._until_marker()

    async def aclose(self) -> None:
        await self.monitor.__aexit__(None, None, None)
        await self.watcher.aclose()
        await self.client.aclose()


async def test_open_sessions_is_native_on_redis_only(redis_url: str) -> None:
    """The session_port hook gives Redis URLs the native port, other backends the generic one."""
    store = open_sessions(redis_url)
    try:
        assert isinstance(store.storage.port, RedisSessionPort)
    finally:
        await store.aclose()
    other = open_sessions("memory://")
    try:
        assert type(other) is SessionStore
    finally:
        await other.aclose()


async def test_warm_turn_is_two_commands(private_server: PrivateServer) -> None:
    """A turn on a session this store served before: one command to acquire+load, one to save+release.

    The generic store on the same server needs three for the same turn.
    """
    server = private_server()
    url = f"redis://127.0.0.1:{server.port}/0?prefix=rt"
    counter = CommandCounter(server.port)
    await counter.start()
    native = open_sessions(url)
    generic = SessionStore(native.kv, port=KVSessionPort(native.kv))  # same client, generic port
    try:
        assert isinstance(native.storage.port, RedisSessionPort)
        await turn(native, "n", "first")
        await turn(generic, "g", "first")
        for store, sid, expected in ((native, "n", 2), (generic, "g", 3)):
            await counter.reset()
            before = await turn(store, sid, "second")
            assert before == ["q:first", "a:first"]
            calls = await counter.count()
            assert len(calls) == expected, (store, calls)
            assert all(c.startswith("EVALSHA") for c in calls), calls
            if store is native:
                assert calls == ["EVALSHA:session_acquire", "EVALSHA:replace"]
    finally:
        await native.aclose()
        await counter.aclose()


async def test_cold_turn_is_two_commands(private_server: PrivateServer) -> None:
    """A turn on a session another store object (another process) wrote last: still one
    command to acquire + load, one to save; only the chunks this store lacks come back."""
    server = private_server()
    url = f"redis://127.0.0.1:{server.port}/0?prefix=cold"
    counter = CommandCounter(server.port)
    await counter.start()
    a = open_sessions(url, tail_bytes=600)
    b = open_sessions(url, tail_bytes=600)
    fresh = open_sessions(url, tail_bytes=600)
    try:
        await a.kv.setup()
        for i in range(6):
            await turn(a if i % 2 == 0 else b, "c", f"t{i}", pad=400)
        expected = [f"q:t{i}" for i in range(6)]
        for store in (a, b, fresh):
            await store.storage.drain()
            await counter.reset()
            before = await turn(store, "c", "next", pad=400)
            assert before[::2] == expected
            expected.append("q:next")
            await store.storage.drain()
            calls = await counter.count()
            # Merged-away chunks are deleted in the background, off the turn's path.
            assert turn_commands(calls) == ["EVALSHA:session_acquire", "EVALSHA:commit"], calls
    finally:
        for store in (a, b, fresh):
            await store.aclose()
        await counter.aclose()


async def test_acquire_sends_only_missing_chunks(redis_url: str) -> None:
    """The acquire script returns the parts of exactly the chunks the request does not hold."""
    from agent_stores.backend import AcquireRequest

    store = open_sessions(redis_url, tail_bytes=600)
    sid = f"m-{uuid.uuid4().hex}"
    try:
        for i in range(4):
            await turn(store, sid, f"t{i}", pad=400)
        info = await store.inspect(sid)
        assert info is not None and info.chunk_count >= 2
        scope = store.storage.scope_for(sid)
        held = store.storage.cache.keys(scope)
        assert len(held) == info.chunk_count
        port = store.storage.port
        now = store.kv.clock()

        def request(owner: str, chunks: frozenset[str]) -> AcquireRequest:
            return AcquireRequest(
                scope=scope,
                owner=owner,
                now=now,
                lease_end=now + 30,
                store_id="someone-else",
                courtesy_seconds=0.1,
                ttl_seconds=None,
                refresh_horizon=None,
                load_history=True,
                held_chunks=chunks,
            )

        reply = await port.acquire(request("o1", held))
        assert reply.outcome == "acquired" and dict(reply.parts) == {}
        one = sorted(held)[0]
        busy = await port.acquire(request("o2", frozenset({one})))
        assert busy.outcome == "busy" and busy.holder == "o1"
    finally:
        await store.aclose()


async def test_spilling_turns_stay_two_commands(private_server: PrivateServer) -> None:
    """Turns that spill the inline tail into new chunks still take two commands: chunks ride with the state."""
    server = private_server()
    counter = CommandCounter(server.port)
    await counter.start()
    store = open_sessions(f"redis://127.0.0.1:{server.port}/0?prefix=spill")
    try:
        await store.kv.setup()  # scripts loaded up front: no first-use EVAL below
        await turn(store, "s", "t0", pad=3000)
        for i in range(1, 12):
            await counter.reset()
            before = await turn(store, "s", f"t{i}", pad=3000)
            assert len(before) == 2 * i
            await store.storage.drain()
            calls = await counter.count()
            # Chunk merges delete what they replaced in the background (off the turn's path),
            # opening pooled connections for it (HELLO, CLIENT SETINFO) the first time.
            assert turn_commands(calls) == ["EVALSHA:session_acquire", "EVALSHA:commit"], calls
        info = await store.inspect("s")
        assert info is not None and info.chunk_count >= 1 and info.message_count == 24
        history = await store.read_messages("s")
        assert history is not None
        assert texts(history)[::2] == [f"q:t{i}" for i in range(12)]
    finally:
        await store.aclose()
        await counter.aclose()


async def test_other_client_in_between(redis_url: str) -> None:
    """When another client took a turn since our release, the next turn sees its messages."""
    sid = f"x-{uuid.uuid4().hex}"
    a = open_sessions(redis_url)
    b = open_sessions(redis_url)
    try:
        assert await turn(a, sid, "a1") == []
        assert await turn(b, sid, "b1") == ["q:a1", "a:a1"]
        assert await turn(a, sid, "a2") == ["q:a1", "a:a1", "q:b1", "a:b1"]
        assert await turn(a, sid, "a3") == ["q:a1", "a:a1", "q:b1", "a:b1", "q:a2", "a:a2"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_waiting_client_gets_the_courtesy(redis_url: str) -> None:
    """A waiting hint left by another client makes the script answer with the hand-over courtesy."""
    sid = f"w-{uuid.uuid4().hex}"
    from agent_stores.sessions.storage import Busy

    a = open_sessions(redis_url, handover_courtesy_seconds=5)
    # b's hint lives 2 x its courtesy: long enough to survive a loaded machine before a asks.
    b = open_sessions(redis_url, handover_courtesy_seconds=5)
    try:
        await turn(a, sid, "a1")
        await b.storage.note_waiting(sid)
        # The option plus a few round trips as a measures them, fixed when a asks.
        courtesy = a.storage.courtesy_seconds
        assert courtesy >= 5
        outcome = await a.storage.load_and_acquire(sid, owner="again")
        assert isinstance(outcome, Busy) and outcome.retry_after is not None
        assert 0 < outcome.retry_after <= courtesy
        assert await turn(b, sid, "b1") == ["q:a1", "a:a1"]
    finally:
        await a.aclose()
        await b.aclose()


async def test_lost_lease_writes_no_chunks(redis_url: str) -> None:
    """A stale owner's spilling save raises SESSION_LEASE_LOST and writes neither state nor chunks."""
    sid = f"l-{uuid.uuid4().hex}"
    owner = open_sessions(redis_url)
    thief = open_sessions(redis_url)
    offset_clock(thief.kv, 31)  # the thief sees the owner's 30 s lease as expired
    try:
        await turn(owner, sid, "warm")
        taken = asyncio.Event()

        async def steal() -> None:
            async with thief.turn(sid, timeout_seconds=5) as session:
                session.replace(pair("thief"))
            taken.set()

        with pytest.raises(LeaseLostError):  # noqa: PT012 (the error leaves the block itself)
            async with owner.turn(sid) as session:
                big = [m for i in range(20) for m in pair(f"stale{i}", pad=4000)]
                session.replace([*session.messages, *big])
                await asyncio.gather(steal(), asyncio.wait_for(taken.wait(), 30))
        await owner.storage.drain()
        scope = owner.storage.scope_for(sid)
        chunks = [i.key async for i in owner.kv.iter_scan(scope, prefix=CHUNK_PREFIX)]
        assert chunks == []
        assert texts(await thief.read_messages(sid) or []) == ["q:thief", "a:thief"]
    finally:
        await owner.aclose()
        await thief.aclose()


async def test_native_store_from_ready_client(standalone_url: str) -> None:
    """connect(ready_client).sessions() is native too, and leaves the client open."""
    sid = f"c-{uuid.uuid4().hex}"
    from agent_stores import StoreURL

    parsed = StoreURL.parse(standalone_url)
    client = Redis(host=parsed.host or "", port=parsed.port or 6379)
    try:
        conn = connect(client, prefix=parsed.query_get("prefix") or "p")
        store = conn.sessions()
        assert isinstance(store.storage.port, RedisSessionPort)
        await turn(store, sid, "one")
        assert await turn(store, sid, "two") == ["q:one", "a:one"]
        await store.aclose()
        await conn.aclose()
        assert await client.ping() is True
    finally:
        await client.aclose()
