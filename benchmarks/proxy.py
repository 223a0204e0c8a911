"""A delaying TCP proxy that counts round trips, for benchmarks.

Every chunk is forwarded after ``delay`` seconds (one way), so a client that needs N
sequential round trips per operation pays about ``2 * delay * N``. A round trip is
counted each time a connection's client starts sending after the server last spoke
(or for the first time): pipelined commands in one burst count once.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class ProxyStats:
    """Counters shared by every connection of one proxy."""

    round_trips: int = 0
    bytes_to_server: int = 0
    bytes_to_client: int = 0

    def reset(self) -> None:
        """Zero every counter."""
        self.round_trips = self.bytes_to_server = self.bytes_to_client = 0


@dataclass
class _Connection:
    client_turn: bool = False  # True while the client is sending its current burst


@dataclass
class DelayProxy:
    """``async with DelayProxy(host, port, delay) as proxy:`` then connect to ``proxy.port``."""

    target_host: str
    target_port: int
    delay: float = 0.0
    stats: ProxyStats = field(default_factory=ProxyStats)
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> DelayProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        server_reader, server_writer = await asyncio.open_connection(
            self.target_host, self.target_port
        )
        state = _Connection()
        up = asyncio.create_task(self._pump(client_reader, server_writer, state, to_server=True))
        down = asyncio.create_task(self._pump(server_reader, client_writer, state, to_server=False))
        self._tasks |= {up, down}
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            # One side hung up (an HTTP server that closes after its reply does): what is
            # still on its way is delivered before the other side sees the close.
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            pass  # the proxy is closing
        finally:
            for task in (up, down):
                task.cancel()
                self._tasks.discard(task)
            for writer in (client_writer, server_writer):
                writer.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        state: _Connection,
        *,
        to_server: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(65536)
            if not data:
                return
            if to_server:
                if not state.client_turn:
                    state.client_turn = True
                    self.stats.round_trips += 1
                self.stats.bytes_to_server += len(data)
            else:
                state.client_turn = False
                self.stats.bytes_to_client += len(data)
            if self.delay:
                # Deliver later without blocking the next read: latency, not bandwidth.
                loop.call_later(self.delay, _write, writer, data)
            else:
                writer.write(data)


def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.is_closing():
        writer.write(data)
