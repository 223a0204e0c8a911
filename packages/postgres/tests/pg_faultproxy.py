"""A TCP proxy in front of a real PostgreSQL server that can lose one message on purpose.

Used to make the two ambiguous failures of a write happen on demand, against the real
server (no mock of the driver or the database):

* ``drop_request`` — the next bytes a client sends are not forwarded; both sides of that
  connection are closed. The server never sees the statement.
* ``drop_response`` — the next client bytes are forwarded; the server's answer is read and
  thrown away, then the connection is closed. The server executed (and, in autocommit,
  committed) the statement; the client never learns it.

Each arming fires once. Connect with ``sslmode=disable`` (the proxy does not speak TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

Fault = Literal["drop_request", "drop_response"]


class FaultProxy:
    """Forward 127.0.0.1:``port`` to ``target_host:target_port``, with one-shot faults."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.fired = 0
        #: round trips: client sends that follow a server answer (or open the connection)
        self.requests = 0
        self._armed: Fault | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._handlers:
            # Closed sockets end every handler; wait so none is left for the loop to cancel.
            await asyncio.wait(list(self._handlers), timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def arm(self, fault: Fault) -> None:
        """Apply ``fault`` to the next request any client sends."""
        self._armed = fault

    @property
    def armed(self) -> bool:
        """True until the armed fault has fired."""
        return self._armed is not None

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}
        swallow = asyncio.Event()
        answered = True  # the next client bytes start a new round trip

        def cut() -> None:
            client_w.close()
            server_w.close()

        async def upstream() -> None:
            nonlocal answered
            while data := await client_r.read(65536):
                if answered:
                    self.requests += 1
                    answered = False
                fault, self._armed = self._armed, None
                if fault == "drop_request":
                    self.fired += 1
                    cut()
                    return
                if fault == "drop_response":
                    self.fired += 1
                    swallow.set()
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def downstream() -> None:
            nonlocal answered
            while data := await server_r.read(65536):
                answered = True
                if swallow.is_set():
                    cut()
                    return
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        try:
            await asyncio.gather(upstream(), downstream())
        except (ConnectionError, OSError):
            cut()
        finally:
            self._writers -= {client_w, server_w}
