"""The contract's TCP proxy loses a reply after the server handled the request (issue 59)."""

from __future__ import annotations

import asyncio

import pytest
from agent_stores_contract.proxy import TCPProxy

pytestmark = pytest.mark.asyncio


async def test_lose_reply_drops_the_chosen_answer_after_the_server_handled_it() -> None:
    """Replies let through, then one lost: the server saw the request, the client gets a
    closed connection and no byte of the answer; later connections are forwarded again."""
    handled: list[bytes] = []

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(100):
            handled.append(data)
            writer.write(b"re:" + data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with TCPProxy("127.0.0.1", port) as proxy:
            reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
            proxy.lose_reply(skip=1)
            writer.write(b"a")
            assert await reader.read(100) == b"re:a"
            writer.write(b"b")
            assert await asyncio.wait_for(reader.read(100), 5) == b""  # closed, answer lost
            writer.close()
            assert handled == [b"a", b"b"] and proxy.lost_replies == 1
            reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
            writer.write(b"d")
            assert await reader.read(100) == b"re:d"
            writer.close()
    finally:
        server.close()
