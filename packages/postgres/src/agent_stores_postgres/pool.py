"""Connections for a store: a bounded psycopg pool that follows the running event loop.

An ``AsyncConnectionPool`` belongs to the event loop it was opened in (its lock, queue
and worker tasks live there). A store object, however, may outlive a loop: scripts call
``asyncio.run`` twice, test frameworks give every test a fresh loop. So the store keeps
one *generation* (loop, pool) at a time:

* each generation runs a small guard task in its loop; when the loop shuts down
  (``asyncio.run`` cancels every task on exit) the guard closes the pool there, cleanly;
* if the store is then used from another loop, the old generation is retired — closed in
  its loop if that loop still runs elsewhere, otherwise its sockets are closed directly,
  since a dead loop can no longer run ``close()`` — and a new pool is opened;
* the pool is bounded by ``max_size``; callers wait (up to ``pool_timeout``) rather than
  open more connections.

Before handing out a pooled connection, a zero-round-trip liveness check looks at its
socket: an idle connection has nothing to read unless the server closed it (for
``pg_terminate_backend``, a restart or a crash the server sends a FATAL message and/or
EOF). Dead connections are discarded before any statement is sent on them, which is what
makes a write after a killed connection unambiguous.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import AsyncConnection, pq
from psycopg_pool import AsyncConnectionPool


def connection_is_dead(conn: AsyncConnection[Any]) -> bool:
    """True when an idle connection was closed by the server (no round trip).

    An idle backend sends nothing unless it is going away (``LISTEN`` is never used on
    these connections, and parameter/notice messages are consumed harmlessly), so a
    readable socket is drained with ``PQconsumeInput`` until libpq sees EOF or nothing
    is left.
    """
    if conn.closed:
        return True
    pgconn = conn.pgconn
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return True
    try:
        fileno = pgconn.socket
    except psycopg.OperationalError:
        return True
    for _ in range(4):
        poller = select.poll()
        poller.register(fileno, select.POLLIN | select.POLLERR | select.POLLHUP)
        if not poller.poll(0):
            return False
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return True
        if pgconn.status != pq.ConnStatus.OK:
            return True
    # Still readable after several drains: something is streaming at an idle connection.
    return True


@dataclass
class _Generation:
    loop: asyncio.AbstractEventLoop
    pool: AsyncConnectionPool[AsyncConnection[Any]]
    connections: weakref.WeakSet[AsyncConnection[Any]] = field(default_factory=weakref.WeakSet)
    guard: asyncio.Task[None] | None = None


class LoopBoundPool:
    """Owns (or borrows) the psycopg pool of one store; see the module docstring.

    ``conninfo``/``kwargs`` describe the connections of a pool this object creates.
    ``external`` is a ready pool passed in by the user: it is used as is (it stays bound
    to the loop its owner opened it in) and never closed here.
    """

    def __init__(
        self,
        *,
        conninfo: str = "",
        kwargs: dict[str, Any] | None = None,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 10.0,
        name: str = "agent-stores",
        external: AsyncConnectionPool[Any] | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._kwargs = dict(kwargs or {})
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = timeout
        self._name = name
        self._external = external
        self._generation: _Generation | None = None
        self._closed = False

    @property
    def owns_pool(self) -> bool:
        """False when the pool was passed in by the caller."""
        return self._external is None

    @property
    def max_size(self) -> int:
        """Upper bound of connections this store opens."""
        if self._external is not None:
            return self._external.max_size
        return self._max_size

    @property
    def timeout(self) -> float:
        """Seconds a caller waits for a pooled connection."""
        if self._external is not None:
            return self._external.timeout
        return self._timeout

    def current_pool(self) -> AsyncConnectionPool[Any] | None:
        """The pool in use right now (None before first use)."""
        if self._external is not None:
            return self._external
        return self._generation.pool if self._generation is not None else None

    async def _pool(self) -> AsyncConnectionPool[Any]:
        if self._external is not None:
            return self._external
        loop = asyncio.get_running_loop()
        generation = self._generation
        if generation is not None and generation.loop is loop and not generation.pool.closed:
            return generation.pool
        if generation is not None:
            self._generation = None
            await self._retire(generation, loop)
        tracked: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()
        fresh = _Generation(loop=loop, pool=self._new_pool(tracked), connections=tracked)
        await fresh.pool.open(wait=False)
        if self._generation is not None and self._generation.loop is loop:
            # Another task opened one while we awaited: keep theirs.
            await fresh.pool.close()
            return self._generation.pool
        fresh.guard = loop.create_task(
            _close_on_loop_shutdown(fresh.pool, tracked), name=f"{self._name}-guard"
        )
        self._generation = fresh
        return fresh.pool

    def _new_pool(
        self, tracked: weakref.WeakSet[AsyncConnection[Any]]
    ) -> AsyncConnectionPool[AsyncConnection[Any]]:
        async def configure(conn: AsyncConnection[Any]) -> None:
            tracked.add(conn)

        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            self._conninfo,
            kwargs=self._kwargs,
            min_size=self._min_size,
            max_size=self._max_size,
            timeout=self._timeout,
            name=self._name,
            configure=configure,
            open=False,
        )
        return pool

    async def _retire(self, generation: _Generation, current: asyncio.AbstractEventLoop) -> None:
        old_loop = generation.loop
        if generation.pool.closed:
            return
        if old_loop is current:
            await generation.pool.close()
        elif old_loop.is_running() and not old_loop.is_closed():
            # That loop still runs (another thread): let it close its own pool.
            asyncio.run_coroutine_threadsafe(generation.pool.close(), old_loop)
        else:
            # The loop is gone: nothing can await the pool's close() any more, so close the
            # sockets themselves; the pool object and its dead tasks are then dropped.
            for conn in list(generation.connections):
                if not conn.closed:
                    conn.pgconn.finish()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A live autocommit connection, returned to the pool afterwards."""
        pool = await self._pool()
        conn = await self._get_live(pool)
        restore_autocommit = False
        try:
            if not conn.autocommit:
                # A borrowed pool may hand out transactional connections; every statement
                # here is meant to commit on its own (multi-statement work opens its own
                # transaction explicitly).
                await conn.set_autocommit(True)
                restore_autocommit = True
            yield conn
        finally:
            if restore_autocommit and not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    await conn.set_autocommit(False)
            await pool.putconn(conn)

    async def _get_live(self, pool: AsyncConnectionPool[Any]) -> AsyncConnection[Any]:
        # Bounded: each failed check discards one dead connection; a restarted server
        # leaves at most max_size of them.
        for _ in range(self.max_size + 1):
            conn: AsyncConnection[Any] = await pool.getconn()
            if not connection_is_dead(conn):
                return conn
            # The pool sees the broken status, drops the connection and opens a new one.
            await pool.putconn(conn)
        conn = await pool.getconn()
        return conn

    async def aclose(self) -> None:
        """Close the pool this object created (never a borrowed one). Idempotent."""
        self._closed = True
        generation, self._generation = self._generation, None
        if generation is None:
            return
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is generation.loop:
            await generation.pool.close()
            if generation.guard is not None:
                generation.guard.cancel()
        elif current is not None:
            await self._retire(generation, current)


async def _close_on_loop_shutdown(
    pool: AsyncConnectionPool[Any], connections: weakref.WeakSet[AsyncConnection[Any]]
) -> None:
    """Sleep until cancelled (normally by the loop shutting down), then close ``pool``.

    At shutdown the pool's own worker tasks are being cancelled too, which makes
    ``pool.close()`` give up before it closes its connections; so every connection the
    pool made is closed here as well.
    """
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        if not pool.closed:
            with contextlib.suppress(BaseException):
                await pool.close(timeout=1.0)
        for conn in list(connections):
            if not conn.closed:
                with contextlib.suppress(BaseException):
                    await conn.close()
