"""Script calls on the store's own connections (agent_stores_redis.direct), on a private server.

What the pooled path guaranteed must hold here too: ``max_connections`` bounds the
connections in use, a closed store leaves no connection open, and scripts the server
forgot are sent again (the restart test in test_redis_faults.py covers a dead socket).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from agent_stores import open_kv
from agent_stores_redis.direct import DirectScripts, hiredis_pack
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from redis_test_support import PrivateServer, load_servers_module

servers = load_servers_module()


def pair(tag: str) -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart(tag)]), ModelResponse(parts=[TextPart(tag)])]


def _clients(port: int) -> list[dict[str, str]]:
    """``CLIENT LIST`` of the server, without the connection asking."""
    text = str(servers.command(port, "CLIENT", "LIST"))
    rows = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in text.splitlines()]
    return [r for r in rows if r.get("cmd") != "client|list"]


async def test_concurrent_calls_use_at_most_max_connections(private_server: PrivateServer) -> None:
    server = private_server()
    kv = open_kv(f"redis://127.0.0.1:{server.port}/0?prefix=direct&max_connections=3")
    try:
        versions = await asyncio.gather(*(kv.create("s", f"k{i}", b"v") for i in range(60)))
        assert len(set(versions)) == 60
        scripted = [c for c in _clients(server.port) if c.get("cmd") in {"evalsha", "eval"}]
        assert 1 <= len(scripted) <= 3
        entries = await kv.get_many("s", [f"k{i}" for i in range(60)])
        assert len(entries) == 60
    finally:
        await kv.aclose()


async def test_a_closed_store_leaves_no_connection_open(private_server: PrivateServer) -> None:
    server = private_server()
    kv = open_kv(f"redis://127.0.0.1:{server.port}/0?prefix=direct")
    await asyncio.gather(*(kv.create("s", f"k{i}", b"v") for i in range(20)))
    assert _clients(server.port)
    # Calls in flight when the store closes, on both paths: scripts (create) and plain
    # commands (get); the connections they take after the close are closed too.
    in_flight = [
        asyncio.ensure_future(call)
        for i in range(20)
        for call in (kv.get("s", f"k{i}"), kv.create("s", f"n{i}", b"v"))
    ]
    await asyncio.sleep(0)
    await kv.aclose()
    await asyncio.gather(*in_flight, return_exceptions=True)
    for _ in range(50):  # the server notices closed sockets asynchronously
        if not _clients(server.port):
            break
        await asyncio.sleep(0.1)
    assert _clients(server.port) == []


async def test_scripts_the_server_forgot_are_sent_again(private_server: PrivateServer) -> None:
    server = private_server()
    kv = open_kv(f"redis://127.0.0.1:{server.port}/0?prefix=direct")
    try:
        version = await kv.create("s", "k", b"one")
        assert servers.command(server.port, "SCRIPT", "FLUSH") in {"OK", b"OK"}
        version = await kv.replace("s", "k", b"two", expected_version=version)
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"two" and entry.version == version
    finally:
        await kv.aclose()


async def test_scripts_are_packed_by_hiredis_into_redis_pys_bytes(
    private_server: PrivateServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the hiredis extra (installed in the dev environment), a session turn's scripts
    are packed by hiredis, byte for byte as redis-py's connection packs them."""
    import hiredis
    from agent_stores import open_sessions
    from redis.asyncio.connection import Connection

    packed: list[tuple[Any, ...]] = []
    real = hiredis.pack_command
    comparing: list[bool] = []

    def spy(args: tuple[Any, ...]) -> bytes:
        out = real(args)
        if comparing:
            # redis-py's own packing, under way (redis-py 8.2 packs with hiredis too)
            return out
        comparing.append(True)
        try:
            assert out == b"".join(Connection().pack_command(*args))
        finally:
            comparing.pop()
        packed.append(args)
        return out

    monkeypatch.setattr(hiredis, "pack_command", spy)
    server = private_server()
    store = open_sessions(f"redis://127.0.0.1:{server.port}/0?prefix=hiredis")
    try:
        # Only the scripts count: redis-py 8.2 packs its own commands (HELLO, CLIENT
        # SETINFO, ...) with hiredis too.
        def scripts() -> list[str]:
            return [str(a[0]) for a in packed if str(a[0]) in {"EVALSHA", "EVAL"}]

        async with store.turn("s") as session:
            session.replace(pair("one"))  # the server learns the scripts (EVAL after NOSCRIPT)
        assert scripts()
        packed.clear()
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair("two")])
        assert scripts() == ["EVALSHA", "EVALSHA"]  # acquire, save
        assert len(await store.read_messages("s") or []) == 4
    finally:
        await store.aclose()


async def test_an_instrumented_pack_command_is_called_not_bypassed(
    private_server: PrivateServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack_command replaced on the connection class (a request counter, the fault
    injector's subclass) packs every script: hiredis does not go around it."""
    from redis.asyncio.connection import AbstractConnection

    original = AbstractConnection.pack_command
    counted: list[str] = []

    def counting(conn: Any, *args: Any) -> Any:
        counted.append(str(args[0]))
        return original(conn, *args)

    monkeypatch.setattr(AbstractConnection, "pack_command", counting)
    server = private_server()
    kv = open_kv(f"redis://127.0.0.1:{server.port}/0?prefix=counted")
    try:
        await kv.create("s", "k", b"v")
        assert "EVALSHA" in counted
    finally:
        await kv.aclose()


def test_hiredis_packs_only_for_strict_utf8() -> None:
    assert hiredis_pack({}) is not None
    assert hiredis_pack({"encoding": "UTF8", "encoding_errors": "strict"}) is not None
    assert hiredis_pack({"encoding": "latin-1"}) is None
    assert hiredis_pack({"encoding_errors": "replace"}) is None


async def test_an_argument_hiredis_refuses_is_packed_by_redis_py(
    private_server: PrivateServer,
) -> None:
    """hiredis takes str, int, float and bytes only; anything else redis-py packs (and
    refuses with its own error, as on the pooled path)."""
    from redis.asyncio import Redis
    from redis.exceptions import DataError

    server = private_server()
    client = Redis(port=server.port)
    scripts = DirectScripts(client.connection_pool, 2)
    try:
        echo = "return ARGV[1]"
        assert await scripts.call("EVAL", echo, 0, bytearray(b"ba")) == b"ba"
        assert await scripts.call("EVAL", echo, 0, memoryview(b"mv")) == b"mv"
        assert await scripts.call("EVAL", echo, 0, "text") == b"text"
        with pytest.raises(DataError):
            await scripts.call("EVAL", echo, 0, None)
    finally:
        await scripts.aclose()
        await client.aclose()


def test_without_hiredis_the_store_works_as_with_it(private_server: PrivateServer) -> None:
    """The default install has no hiredis (the development environment has the extra):
    redis-py packs and parses in Python, and turns go on as with it."""
    server = private_server()
    code = f"""
import sys
sys.modules["hiredis"] = None  # as if not installed
import asyncio
from agent_stores import open_sessions
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
from redis.utils import HIREDIS_AVAILABLE

async def main():
    assert not HIREDIS_AVAILABLE
    store = open_sessions("redis://127.0.0.1:{server.port}/0?prefix=nohiredis")
    try:
        for i in range(3):
            async with store.turn("s") as session:
                session.replace([*session.messages, ModelRequest(parts=[UserPromptPart(str(i))]),
                                 ModelResponse(parts=[TextPart(str(i))])])
        print(len(await store.read_messages("s")))
    finally:
        await store.aclose()

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "6"
