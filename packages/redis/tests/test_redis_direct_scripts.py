"""Script calls on the store's own connections (agent_stores_redis.direct), on a private server.

What the pooled path guaranteed must hold here too: ``max_connections`` bounds the
connections in use, a closed store leaves no connection open, and scripts the server
forgot are sent again (the restart test in test_redis_faults.py covers a dead socket).
"""

from __future__ import annotations

import asyncio

from agent_stores import open_kv
from redis_test_support import PrivateServer, load_servers_module

servers = load_servers_module()


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
