"""Script calls on connections of their own, for a client the store built (standalone Redis).

Nearly every store call is one ``EVALSHA``. Sent through ``Redis.execute_command``, each
pays for redis-py's general machinery around the two socket operations: a pool checkout
that probes the socket for stale data, the retry wrapper (this store retries itself),
argument-deprecation checks and redis-py's own metrics hooks. On a 2-core machine serving
64 concurrent turns that was about a third of a command's client CPU. Here a command is
packed by the same connection class, written and its reply read by redis-py's own
``send_packed_command`` / ``read_response`` (which parse the reply, raise server errors
such as ``NOSCRIPT`` as redis-py exceptions and disconnect on any I/O failure or
cancellation), on connections made by the client's pool with its settings and connection
class — so TLS, authentication, RESP3 and the fault injector of :mod:`.faults` behave
exactly as on the pooled path.

redis-py bounds each send and each read of a connection with ``socket_timeout`` by
``asyncio.wait_for`` (a task per send) and ``asyncio.timeout``: about a tenth of a turn's
client CPU. These connections leave those off; one bound, ``socket_timeout`` for the send
and its reply together, is kept on the store's shared deadline timer
(:class:`agent_stores.backend.TimeBound`). A reply that does not come in time
disconnects the connection (redis-py does on any cancelled read) and is a redis-py
``TimeoutError``, retried like one.

With the ``hiredis`` extra installed, a command is packed by hiredis's ``pack_command`` (in
C, the same bytes: about 1.5 µs against redis-py's 14 µs for a session script's 20
arguments; redis-py 8 packs asynchronous commands in Python even with hiredis). Only
when the connection class packs as redis-py's own does (a subclass or an instrumented
``pack_command``, such as :mod:`.faults`' or a request counter's, is called instead) and
the client encodes text as strict UTF-8, as hiredis does.

Connections are kept in a last-in-first-out free list; at most ``limit`` are in use at
once (a call waits for one, bounded by the call's deadline). A connection that failed was
already disconnected by redis-py and reconnects on its next command; one the server closed
while it was idle is found out before a command is written to it.
"""

from __future__ import annotations

import asyncio
import codecs
from collections import deque
from collections.abc import Callable
from typing import Any

from agent_stores.backend import TimeBound

#: redis-py's own ``pack_command``, known by name: a class or test that replaces it (to
#: inject faults or count requests) is then called, not bypassed by hiredis.
_REDIS_PY_PACK = ("redis.asyncio.connection", "AbstractConnection.pack_command")


def hiredis_pack(connection_kwargs: dict[str, Any]) -> Callable[[tuple[Any, ...]], bytes] | None:
    """hiredis's ``pack_command`` when it is installed and packs as the client would: text
    encoded as strict UTF-8 (redis-py's default ``encoding`` / ``encoding_errors``)."""
    encoding = connection_kwargs.get("encoding", "utf-8")
    if codecs.lookup(encoding).name != "utf-8":
        return None
    if connection_kwargs.get("encoding_errors", "strict") != "strict":
        return None
    try:
        from hiredis import pack_command
    except ImportError:  # the extra agent-stores-redis[hiredis] is not installed
        return None
    return pack_command


def packs_as_redis_py(conn: Any) -> bool:
    """Whether ``conn``'s class packs commands with redis-py's own method."""
    method = type(conn).pack_command
    return (getattr(method, "__module__", None), getattr(method, "__qualname__", None)) == (
        _REDIS_PY_PACK
    )


class DirectScripts:
    """``EVALSHA`` / ``EVAL`` sent on connections made by ``pool`` (see the module doc)."""

    def __init__(self, pool: Any, limit: int) -> None:
        self._pool = pool
        #: the bound of one command's send and reply (redis-py's own per operation is off)
        self._timeout: float | None = pool.connection_kwargs.get("socket_timeout")
        self._pack = hiredis_pack(pool.connection_kwargs)
        self._idle: deque[Any] = deque()
        # Bound to the running loop on its first wait, not here.
        self._slots = asyncio.Semaphore(limit)
        self._closed = False

    async def call(self, *args: Any) -> Any:
        """Send one command (``args`` as for ``execute_command``); its raw reply."""
        slots = self._slots
        await slots.acquire()
        try:
            conn = await self._checked_out()
            try:
                with TimeBound(self._timeout):
                    return await self._exchange(conn, args)
            except TimeoutError:
                from redis.exceptions import TimeoutError as RedisTimeoutError

                raise RedisTimeoutError(
                    f"Timeout reading from the server: no reply within {self._timeout:g} s"
                ) from None
            finally:
                await self._put_back(conn)
        finally:
            slots.release()

    async def _exchange(self, conn: Any, args: tuple[Any, ...]) -> Any:
        packed: Any = None
        pack = self._pack
        if pack is not None and packs_as_redis_py(conn):
            try:
                packed = pack(args)
            except TypeError:
                pass  # a type hiredis does not take (bytearray, memoryview): redis-py packs it
        if packed is None:
            packed = conn.pack_command(*args)
        await conn.send_packed_command(packed, check_health=False)
        return await conn.read_response(disable_decoding=True)

    async def _checked_out(self) -> Any:
        """An idle connection, disconnected first if the server closed it meanwhile (a
        restart) or it holds unread bytes — as redis-py's pool checks before handing one
        out — so no command is written to a dead socket; else a new one."""
        if not self._idle:
            conn = self._pool.make_connection()
            conn.socket_timeout = None  # bounded per command in call()
            return conn
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        conn = self._idle.pop()
        if conn.is_connected:
            try:
                stale = await conn.can_read()  # reads nothing: the stream's buffer and EOF
            except (RedisConnectionError, RedisTimeoutError, OSError):
                stale = True
            if stale:
                await conn.disconnect()
        return conn

    async def _put_back(self, conn: Any) -> None:
        if self._closed:
            await conn.disconnect()
        else:
            self._idle.append(conn)

    async def aclose(self) -> None:
        """Disconnect the idle connections; those in use disconnect when their call ends."""
        self._closed = True
        while self._idle:
            await self._idle.pop().disconnect()
