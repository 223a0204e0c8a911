"""A loopback TCP proxy the fault contract puts in front of a server to make it go silent.

The backend says how to reach its server through the proxy (the ``proxied_url`` hook)
and, when it is not the URL's own ``host:port``, where the server is (``server_address``).
The proxy forwards bytes both ways until :meth:`TCPProxy.go_silent`: from then on it
accepts connections and reads requests but never answers — what a dead peer behind a
live load balancer, or a network partition, looks like to a client. :meth:`heal` drops
the stalled connections (the client sees them break and reconnects) and forwards again.

:meth:`lose_reply` breaks a connection after the server has answered a request, before the
client hears the answer: the server applied the request, and the client sees only a
dropped connection. It happens below every SDK, so whatever the client stack does next (a
re-send by its HTTP library, say) is what the store under test gets.
"""

from __future__ import annotations

import asyncio
import contextlib

_CHUNK = 65536


class TCPProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port`` until told to go silent."""

    def __init__(self, target_host: str, target_port: int, *, silent: bool = False) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = "127.0.0.1"
        self.port = 0
        self.silent = silent
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: replies still to lose, and replies to let through before the first of them
        self._lose = 0
        self._skip = 0
        #: replies lost so far
        self.lost_replies = 0

    async def start(self) -> TCPProxy:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def go_silent(self) -> None:
        """Accept and read, never answer: every request from now on waits forever."""
        self.silent = True

    def heal(self) -> None:
        """Forward again; connections that went silent are closed (their data is gone)."""
        self.silent = False
        for writer in list(self._writers):
            writer.close()

    def lose_reply(self, *, skip: int = 0, times: int = 1) -> None:
        """Let ``skip`` replies through, then lose the next ``times``: when a reply's first
        bytes arrive from the server (so it has handled the request), they are dropped and
        the client's connection is closed. A reply is the server's first data after the
        client sent some (one request, one answer, as HTTP/1.1 and RESP clients do)."""
        self._skip = skip
        self._lose = times

    def disarm(self) -> None:
        """Lose no more replies."""
        self._lose = self._skip = 0

    def _reply_lost(self) -> bool:
        """Called at the start of each reply: True when this one is to be lost."""
        if self._lose <= 0:
            return False
        if self._skip > 0:
            self._skip -= 1
            return False
        self._lose -= 1
        self.lost_replies += 1
        return True

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def __aenter__(self) -> TCPProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            if self.silent:
                await self._swallow(reader)
                return
            try:
                up_reader, upstream = await asyncio.open_connection(
                    self.target_host, self.target_port
                )
            except OSError:
                return
            self._writers.add(upstream)
            asked = [False]  # the client sent data the server has not answered yet
            await asyncio.gather(
                self._pump(reader, upstream, asked=asked),
                self._pump(up_reader, writer, asked=asked, reply=True),
                return_exceptions=True,
            )
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._writers.discard(w)
                    w.close()
            if task is not None:
                self._tasks.discard(task)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        while await reader.read(_CHUNK):
            pass

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        *,
        asked: list[bool],
        reply: bool = False,
    ) -> None:
        try:
            while data := await source.read(_CHUNK):
                if self.silent:
                    continue  # dropped: the other side never hears of it
                if not reply:
                    asked[0] = True
                elif asked[0]:
                    asked[0] = False
                    if self._reply_lost():
                        return  # the reply dropped, both connections closed (finally)
                sink.write(data)
                await sink.drain()
        finally:
            sink.close()
