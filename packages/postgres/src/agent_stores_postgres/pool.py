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

A caller waiting for a connection does not sit out ``pool_timeout`` when the server
cannot be connected to: every generation's connections are opened through a class that
reports each failed connect, and that failure (connection refused, unknown host, a
missing role, a rejected password, a bad ``sslmode``) is raised to every caller waiting
at that moment, within libpq's ``connect_timeout``. A caller arriving while the last
attempt failed and no connection is open makes one fresh attempt itself (one at a time),
so it gets the current cause rather than waiting for the pool's next backoff retry; so
does a caller that sees an attempt fail which began before it arrived (begun while the
server was away, it says nothing of the server now). A connection such a fresh attempt
opens serves that caller and is closed afterwards, so a server that came back is used at
once rather than after the pool's backoff.

Calls one after another skip the pool: the last caller keeps its connection back
(:meth:`LoopBoundPool.release`) for the next, who takes it without the pool's lock,
queue and statistics (:meth:`LoopBoundPool.acquire`), after the same liveness check. It
is kept back only while no caller is waiting for the pool, never for longer than
:data:`HOLD_SECONDS` at a stretch (so the pool's lifetime checks still see it), and only
on this package's own pools.

A statement cut off by a deadline (its task cancelled) closes its connection at once
(:meth:`WriteCursorConnection.wait`): the pool then discards it, so a connection with a
statement still in flight is never handed out again, and a silent server cannot hold the
cancelled call (psycopg's own handling first asks the server to cancel the statement and
waits for it, up to 10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
import traceback
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

import psycopg
from psycopg import AsyncConnection, AsyncCursor, pq, waiting
from psycopg.abc import PQGen
from psycopg_pool import AsyncConnectionPool

RV = TypeVar("RV")

#: psycopg's own polling interval for its waits.
WAIT_INTERVAL = 0.1

#: Seconds a connection may go from caller to caller outside the pool before it is
#: returned there once (where its lifetime and idle checks apply).
HOLD_SECONDS = 30.0


def connection_is_dead(conn: AsyncConnection[Any]) -> bool:
    """True when an idle connection was closed, or is being closed, by the server (no round trip).

    An idle backend sends nothing unless it is going away (``LISTEN`` is never used on
    these connections), so anything readable on the socket of an idle connection condemns
    it: a terminated backend writes its FATAL error before its socket closes, and a check
    made between the two would otherwise hand out a connection that fails on first use.
    The rare harmless case, an asynchronous notice, only costs one reconnect.
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
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


class ConnectFailures:
    """The connect failures of one pool, handed to the callers waiting for a connection.

    ``last`` is the most recent failure since the last successful connect (None when the
    last attempt worked). Waiters :meth:`watch` a future that resolves with the next
    failure and the (monotonic) time its attempt began.
    """

    def __init__(self) -> None:
        self.last: BaseException | None = None
        self._waiters: set[asyncio.Future[tuple[BaseException, float]]] = set()
        self.probe_lock = asyncio.Lock()

    def report(self, exc: BaseException, started: float) -> None:
        self.last = exc
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result((exc, started))
        self._waiters.clear()

    def connected(self) -> None:
        self.last = None

    def watch(self) -> asyncio.Future[tuple[BaseException, float]]:
        waiter: asyncio.Future[tuple[BaseException, float]] = (
            asyncio.get_running_loop().create_future()
        )
        self._waiters.add(waiter)
        return waiter

    def unwatch(self, waiter: asyncio.Future[tuple[BaseException, float]]) -> None:
        self._waiters.discard(waiter)


#: A kept read cursor is closed after a reply larger than this (the next read makes a new
#: one), so no connection holds a large value after its caller is done with it.
KEPT_READ_BYTES = 64 << 10


class WriteCursorConnection(AsyncConnection[Any]):
    """An ``AsyncConnection`` that keeps one cursor for agent-stores' native writes, and
    one for reads of a single entry.

    A native write is one statement with a one-row reply, read at once; building a new
    cursor for each costs about as much client time as sending the statement. So does a
    read of one entry; its cursor is closed after a reply over :data:`KEPT_READ_BYTES`.
    Other reads take fresh cursors.
    """

    _write_cursor: AsyncCursor[Any] | None = None
    _read_cursor: AsyncCursor[Any] | None = None

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = WAIT_INTERVAL,
        timeout: float | None = None,  # noqa: ASYNC109 (psycopg's signature)
    ) -> RV:
        """psycopg's wait for a request's reply, except when the caller is cancelled.

        Cancelled (a deadline ran out), the connection is closed at once: its statement's
        outcome is unknown, the pool discards a closed connection, and a server that went
        silent cannot hold the caller (psycopg would ask the server to cancel, then wait).
        """
        try:
            return await waiting.wait_async(
                gen, self.pgconn.socket, interval=interval, timeout=timeout
            )
        except (asyncio.CancelledError, KeyboardInterrupt):
            self.pgconn.finish()
            raise

    def write_cursor(self) -> AsyncCursor[Any]:
        cursor = self._write_cursor
        if cursor is None or cursor.closed:
            cursor = self._write_cursor = self.cursor()
        return cursor

    def read_cursor(self) -> AsyncCursor[Any]:
        cursor = self._read_cursor
        if cursor is None or cursor.closed:
            cursor = self._read_cursor = self.cursor()
        return cursor


def write_cursor(conn: AsyncConnection[Any]) -> AsyncCursor[Any]:
    """The cursor to send a native write on ``conn`` with (reused on this package's own
    connections; a new one on a borrowed pool's)."""
    if isinstance(conn, WriteCursorConnection):
        return conn.write_cursor()
    return conn.cursor()


def read_cursor(conn: AsyncConnection[Any]) -> AsyncCursor[Any]:
    """The cursor to read one entry on ``conn`` with (reused on this package's own
    connections, until a reply over :data:`KEPT_READ_BYTES`; a new one on a borrowed
    pool's)."""
    if isinstance(conn, WriteCursorConnection):
        return conn.read_cursor()
    return conn.cursor()


def reporting_connection_class(
    failures: ConnectFailures, base: type[WriteCursorConnection] = WriteCursorConnection
) -> type[AsyncConnection[Any]]:
    """An ``AsyncConnection`` (a subclass of ``base``) whose failed ``connect`` is reported
    to ``failures``.

    Passed to the pool as its documented ``connection_class``; the pool itself only logs
    these errors, which is why they are captured here.
    """

    class ReportingConnection(base):  # type: ignore[valid-type,misc]
        @classmethod
        async def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            started = time.monotonic()
            try:
                conn: Self = await super().connect(conninfo, **kwargs)
            except psycopg.Error as exc:
                failures.report(exc, started)
                raise
            except asyncio.CancelledError as exc:
                # Cancelled mid-handshake (its loop shutting down): the half-open socket
                # lives in the finished frames of this traceback, which the pool keeps
                # with its cancelled task; clearing them closes the socket now.
                traceback.clear_frames(exc.__traceback__)
                raise
            failures.connected()
            return conn

    return ReportingConnection


def _fresh_error(exc: BaseException) -> psycopg.OperationalError:
    # One failure can reach several waiters: each gets its own exception object (raising
    # one instance from several tasks would splice their tracebacks together).
    return psycopg.OperationalError(str(exc))


@dataclass
class _Generation:
    loop: asyncio.AbstractEventLoop
    pool: AsyncConnectionPool[AsyncConnection[Any]]
    connections: weakref.WeakSet[AsyncConnection[Any]] = field(default_factory=weakref.WeakSet)
    guard: asyncio.Task[None] | None = None
    failures: ConnectFailures = field(default_factory=ConnectFailures)
    #: the connection the last caller kept back for the next (see :meth:`LoopBoundPool.release`)
    held: AsyncConnection[Any] | None = None
    #: the kept-back connection now lent to a caller, and when it must go back to the pool
    lent: AsyncConnection[Any] | None = None
    hold_until: float = 0.0


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
        connection_class: type[WriteCursorConnection] = WriteCursorConnection,
    ) -> None:
        self._connection_class = connection_class
        self._conninfo = conninfo
        self._kwargs = dict(kwargs or {})
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = timeout
        self._name = name
        self._external = external
        self._generation: _Generation | None = None
        self._closed = False
        #: connections opened by a fresh attempt outside the pool: closed after use
        self._unpooled: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()
        #: a borrowed pool's connections switched to autocommit: switched back on release
        self._switched: weakref.WeakSet[AsyncConnection[Any]] = weakref.WeakSet()
        #: callers between arriving and getting a connection from the pool
        self._acquiring = 0

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
        failures = ConnectFailures()
        fresh = _Generation(
            loop=loop,
            pool=self._new_pool(tracked, failures),
            connections=tracked,
            failures=failures,
        )
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
        self, tracked: weakref.WeakSet[AsyncConnection[Any]], failures: ConnectFailures
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
            connection_class=reporting_connection_class(failures, self._connection_class),
            open=False,
        )
        return pool

    async def _retire(self, generation: _Generation, current: asyncio.AbstractEventLoop) -> None:
        old_loop = generation.loop
        if generation.pool.closed:
            return
        if old_loop is current:
            await _close_held(generation)
            await generation.pool.close()
        elif old_loop.is_running() and not old_loop.is_closed():
            # That loop still runs (another thread): let it close its own pool.
            asyncio.run_coroutine_threadsafe(generation.pool.close(), old_loop)
            if generation.held is not None:
                asyncio.run_coroutine_threadsafe(generation.held.close(), old_loop)
        else:
            # The loop is gone: nothing can await the pool's close() any more, so close the
            # sockets themselves; the pool object and its dead tasks are then dropped.
            for conn in list(generation.connections):
                if not conn.closed:
                    conn.pgconn.finish()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A live autocommit connection, released afterwards (:meth:`acquire`, :meth:`release`)."""
        pool, conn = await self.acquire()
        try:
            yield conn
        finally:
            await self.release(pool, conn)

    async def acquire(self) -> tuple[AsyncConnectionPool[Any], AsyncConnection[Any]]:
        """A live autocommit connection and the pool to :meth:`release` it to: the one the
        last caller kept back when it is still alive, else one from the pool."""
        generation = self._generation
        if (
            generation is not None
            and generation.held is not None
            and generation.loop is asyncio.get_running_loop()
        ):
            # (Another loop's generation is retired by ``_pool`` below, its held one with it.)
            conn, generation.held = generation.held, None
            if not connection_is_dead(conn):
                generation.lent = conn
                return generation.pool, conn
            if not conn.closed:
                await conn.close()
            await generation.pool.putconn(conn)  # closed: the pool replaces it
        self._acquiring += 1
        try:
            pool = await self._pool()
            conn = await self._get_live(pool)
        finally:
            self._acquiring -= 1
        if not conn.autocommit:
            # A borrowed pool may hand out transactional connections; every statement
            # here is meant to commit on its own (multi-statement work opens its own
            # transaction explicitly).
            try:
                await conn.set_autocommit(True)
            except BaseException:
                await self._give_back(pool, conn)
                raise
            self._switched.add(conn)
        return pool, conn

    async def release(self, pool: AsyncConnectionPool[Any], conn: AsyncConnection[Any]) -> None:
        """Keep ``conn`` back for the next caller (no one is waiting for the pool, it is
        idle, not held for :data:`HOLD_SECONDS` yet), or return it to ``pool``."""
        generation = self._generation
        kept_before = generation is not None and generation.lent is conn
        if generation is not None and kept_before:
            generation.lent = None
        if conn in self._switched:
            self._switched.discard(conn)
            if not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    await conn.set_autocommit(False)
        elif (
            generation is not None
            and generation.pool is pool
            and generation.held is None
            and self._acquiring == 0
            and not self._closed
            and not conn.closed
            and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
            and conn not in self._unpooled
        ):
            now = time.monotonic()
            if not kept_before:  # a stretch of keeping back begins
                generation.hold_until = now + HOLD_SECONDS
            if now < generation.hold_until:
                generation.held = conn
                return
        await self._give_back(pool, conn)

    async def _give_back(self, pool: AsyncConnectionPool[Any], conn: AsyncConnection[Any]) -> None:
        if conn in self._unpooled:
            self._unpooled.discard(conn)
            await conn.close()
        else:
            await pool.putconn(conn)

    async def _get_live(self, pool: AsyncConnectionPool[Any]) -> AsyncConnection[Any]:
        # Bounded: each failed check discards one dead connection; a restarted server
        # leaves at most max_size of them.
        for _ in range(self.max_size + 1):
            conn: AsyncConnection[Any] = await self._getconn(pool)
            if not connection_is_dead(conn):
                return conn
            # Closed, the pool drops the connection and opens a new one.
            if not conn.closed:
                await conn.close()
            await self._give_back(pool, conn)
        conn = await self._getconn(pool)
        return conn

    async def _getconn(self, pool: AsyncConnectionPool[Any]) -> AsyncConnection[Any]:
        """``pool.getconn()``, cut short by a connect failure (raised with its cause)."""
        generation = self._generation
        if generation is None or generation.pool is not pool:
            # A borrowed pool: its connect errors are not ours to see.
            conn: AsyncConnection[Any] = await pool.getconn()
            return conn
        failures = generation.failures
        if failures.last is None and pool.get_stats().get("pool_available", 0) > 0:
            # An idle connection is there: getconn returns it without waiting, so there is
            # no connect failure to watch for (and no task, no extra loop iterations).
            conn_idle: AsyncConnection[Any] = await pool.getconn()
            return conn_idle
        arrived = time.monotonic()
        failed = failures.watch()
        getting = asyncio.ensure_future(pool.getconn())
        probed: AsyncConnection[Any] | None = None
        try:
            if failures.last is not None and not _any_open(generation.connections):
                # The last attempt failed and nothing is open: the pool retries only after
                # its backoff, so find out now whether the server is reachable again.
                probed = await self._probe(pool, failures)
            while probed is None:
                await asyncio.wait({getting, failed}, return_when=asyncio.FIRST_COMPLETED)
                if getting.done() or failed.result()[1] >= arrived:
                    break
                # An attempt begun before this call failed: it may have met the server
                # while it was away. Only an attempt of this call's own time decides.
                failures.unwatch(failed)
                failed = failures.watch()
                probed = await self._probe(pool, failures)
        except BaseException:
            if probed is not None:
                await probed.close()
            await _abandon(pool, getting)
            raise
        finally:
            failures.unwatch(failed)
        if probed is not None:
            conn_pooled = await _abandon(pool, getting, keep=True)
            if conn_pooled is not None:
                await probed.close()
                return conn_pooled
            self._unpooled.add(probed)
            generation.connections.add(probed)
            return probed
        if getting.done():
            got: AsyncConnection[Any] = getting.result()
            return got
        conn_late = await _abandon(pool, getting, keep=True)
        if conn_late is not None:
            return conn_late
        raise _fresh_error(failed.result()[0])

    async def _probe(
        self, pool: AsyncConnectionPool[Any], failures: ConnectFailures
    ) -> AsyncConnection[Any] | None:
        """One connect attempt outside the pool (its failure goes to ``failures``): the
        connection, or None (failed, or someone is probing already: their result reaches
        every waiter)."""
        if failures.probe_lock.locked():
            return None
        async with failures.probe_lock:
            kwargs = dict(self._kwargs)
            try:
                conn: AsyncConnection[Any] = await pool.connection_class.connect(
                    self._conninfo, **kwargs
                )
            except psycopg.Error:
                return None  # reported by the connection class
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
            await _close_held(generation)
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


async def _close_held(generation: _Generation) -> None:
    """Close the kept-back connection: checked out of the pool, its close would not reach it."""
    held, generation.held = generation.held, None
    if held is not None and not held.closed:
        with contextlib.suppress(psycopg.Error):
            await held.close()


def _any_open(connections: weakref.WeakSet[AsyncConnection[Any]]) -> bool:
    return any(not conn.closed for conn in list(connections))


async def _abandon(
    pool: AsyncConnectionPool[Any],
    getting: asyncio.Future[AsyncConnection[Any]],
    *,
    keep: bool = False,
) -> AsyncConnection[Any] | None:
    """Cancel a pending ``getconn``; a connection it obtained anyway is kept or returned."""
    getting.cancel()
    await asyncio.wait({getting})
    if getting.cancelled() or getting.exception() is not None:
        return None
    conn = getting.result()
    if keep:
        return conn
    await pool.putconn(conn)
    return None
