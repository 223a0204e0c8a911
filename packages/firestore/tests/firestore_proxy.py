"""A TCP proxy in front of the Firestore emulator that can go silent (a blackhole) and heal,
or go down (connections refused, as a server restarting) and come back.

``silent = True``: every connection, new or open, is accepted and kept, and nothing is
forwarded either way (bytes are read and dropped), as a peer that accepts and never
answers. ``silent = False``: new connections are forwarded again; a connection that was
silenced stays dead (bytes were lost in the middle of its HTTP/2 stream), so a client must
notice that and connect anew, as after a real network failure.
"""

from __future__ import annotations

import asyncio
import contextlib


class SilentProxy:
    """Forward 127.0.0.1:``port`` to ``target``; ``silent`` turns it into a blackhole."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.silent = False
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> SilentProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def down(self) -> None:
        """Stop listening and drop every connection: new ones are refused (a restart)."""
        await self.aclose()
        self._server = None

    async def up(self) -> SilentProxy:
        """Listen again, on the same port."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        return self

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        # Closed sockets end every handler (a cancelled one would be logged by asyncio).
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.connections += 1
        self._writers.add(client_w)
        dead = self.silent  # a connection made while silent never carries anything
        server_w: asyncio.StreamWriter | None = None
        try:
            if dead:
                while await client_r.read(65536):
                    pass
                return
            server_r, server_w = await asyncio.open_connection(*self.target)
            self._writers.add(server_w)
            silenced = False

            async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                nonlocal silenced
                while data := await src.read(65536):
                    silenced = silenced or self.silent
                    if not silenced:
                        dst.write(data)
                        await dst.drain()
                dst.close()

            await asyncio.gather(pump(client_r, server_w), pump(server_r, client_w))
        except (ConnectionError, OSError):
            pass
        finally:
            client_w.close()
            self._writers.discard(client_w)
            if server_w is not None:
                server_w.close()
                self._writers.discard(server_w)
