"""A loopback TCP proxy in front of a real server that can go silent and come back.

While ``silent`` is set, the proxy keeps accepting connections and reading what clients
send, but forwards nothing and answers nothing: a blackholed server, as seen by a client.
A connection that went silent stays silent (its protocol stream is broken); connections
made after :meth:`heal` are forwarded again. (A uniquely named module: ``conftest`` names
collide across packages.)
"""

from __future__ import annotations

import asyncio
import contextlib


class SilentProxy:
    """Forward 127.0.0.1:``port`` to ``target``; :meth:`go_silent` / :meth:`heal` switch it."""

    def __init__(self, target_host: str, target_port: int, *, silent: bool = False) -> None:
        self.target = (target_host, target_port)
        self.silent = silent
        self.port = 0
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> SilentProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def go_silent(self) -> None:
        self.silent = True

    def heal(self) -> None:
        self.silent = False

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        self.accepted += 1
        self._writers.add(client_w)
        poisoned = self.silent
        server_w: asyncio.StreamWriter | None = None
        try:
            if poisoned:
                while await client_r.read(65536):
                    pass  # swallowed: a blackhole
                return
            server_r, server_w = await asyncio.open_connection(*self.target)
            self._writers.add(server_w)

            async def upstream() -> None:
                nonlocal poisoned
                while data := await client_r.read(65536):
                    if poisoned or self.silent:
                        poisoned = True
                        continue
                    assert server_w is not None
                    server_w.write(data)
                    await server_w.drain()
                if server_w is not None:
                    server_w.close()

            async def downstream() -> None:
                nonlocal poisoned
                while data := await server_r.read(65536):
                    if poisoned or self.silent:
                        poisoned = True
                        continue
                    client_w.write(data)
                    await client_w.drain()
                if not poisoned:
                    client_w.close()

            await asyncio.gather(upstream(), downstream())
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            client_w.close()
            self._writers.discard(client_w)
            if server_w is not None:
                server_w.close()
                self._writers.discard(server_w)
