"""PostgreSQL's routine faults, injected at psycopg's transport (for the contract's fault mode).

:class:`PostgresFaultInjector` opens :class:`~agent_stores_postgres.kv.PostgresKV` stores
whose pooled connections are a subclass of this package's psycopg connection class (the
pool's documented ``connection_class``). Every request psycopg sends after the connection
is made goes through ``AsyncConnection.wait``; there each request asks the injector for a
fault, and the real server answers every request that is not faulted.

Faults (name → kind):

* ``40001`` (conflict) — ``serialization_failure``: the statement is rolled back, nothing
  applied (not injected inside a pipeline);
* ``40P01`` (conflict) — ``deadlock_detected``, likewise;
* ``57P01`` (reset) — ``admin_shutdown``: the server terminates the connection before the
  request runs (as ``pg_terminate_backend`` or a fast shutdown does);
* ``08006`` (reset) — ``connection_failure``: the connection breaks before the request
  reaches the server; in a transaction (``commit`` with several operations) it breaks the
  transaction midway, and the server rolls it back;
* ``lost_reply`` (lost_reply) — the request runs (an autocommit statement or a COMMIT
  commits), then the connection breaks before the reply is read;
* ``blackhole`` (blackhole) — the request is never answered: it waits until its caller is
  cancelled (the call's deadline), which closes the connection.

Operations (for :meth:`~agent_stores.faults.BaseFaultInjector.arm`): ``statement`` (an
autocommit statement: every primitive except ``commit``, a ``commit`` of unconditional
deletes only, and every native port statement), ``transaction`` (a request inside a
transaction block), ``pipeline`` (a request of a pipelined ``commit``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from agent_stores.backend import BaseFaultInjector, FaultKind, KVStore, StoreURL
from psycopg import pq
from psycopg.abc import PQGen

from .config import PostgresConfig
from .pool import WAIT_INTERVAL, WriteCursorConnection

RV = TypeVar("RV")

FAULTS: Mapping[str, FaultKind] = {
    "40001": FaultKind.CONFLICT,
    "40P01": FaultKind.CONFLICT,
    "57P01": FaultKind.RESET,
    "08006": FaultKind.RESET,
    "lost_reply": FaultKind.LOST_REPLY,
    "blackhole": FaultKind.BLACKHOLE,
}
_ROLLED_BACK = frozenset({"40001", "40P01"})
_INJECTED = " (fault injected)"


class PostgresFaultInjector(BaseFaultInjector):
    """Injects PostgreSQL's routine faults into the stores it opens (see the module doc)."""

    faults = FAULTS

    def __init__(self) -> None:
        super().__init__()
        injector = self

        class FaultyConnection(_FaultyConnection):
            pass

        FaultyConnection.injector = injector
        self.connection_class: type[WriteCursorConnection] = FaultyConnection

    async def open_kv(self, url: StoreURL, **options: Any) -> KVStore:
        """A :class:`~agent_stores_postgres.kv.PostgresKV` for ``url`` whose requests pass through this injector."""
        from .kv import PostgresKV, _split_options

        clock, overrides = _split_options(options)
        config = PostgresConfig.from_url(url, **overrides)
        return PostgresKV(config, clock=clock, connection_class=self.connection_class)


class _FaultyConnection(WriteCursorConnection):
    """A pooled connection whose requests may be faulted; see :class:`PostgresFaultInjector`."""

    injector: PostgresFaultInjector

    def _operation(self) -> str:
        if self._pipeline is not None:
            return "pipeline"
        if self.pgconn.transaction_status == pq.TransactionStatus.INTRANS:
            return "transaction"
        return "statement"

    async def wait(
        self,
        gen: PQGen[RV],
        interval: float = WAIT_INTERVAL,
        timeout: float | None = None,  # noqa: ASYNC109 (psycopg's signature)
    ) -> RV:
        operation = self._operation()
        eligible = [
            f for f in self.injector.faults if not (operation == "pipeline" and f in _ROLLED_BACK)
        ]
        fault = self.injector.next_fault(operation, eligible=eligible)
        if fault is None:
            return await super().wait(gen, interval, timeout)
        if fault == "lost_reply":
            await super().wait(gen, interval, timeout)
            self.pgconn.finish()
            raise psycopg.OperationalError(
                "consuming input failed: server closed the connection unexpectedly" + _INJECTED
            )
        gen.close()  # never sent
        if fault == "40001":
            raise psycopg.errors.SerializationFailure(
                "could not serialize access due to concurrent update" + _INJECTED
            )
        if fault == "40P01":
            raise psycopg.errors.DeadlockDetected("deadlock detected" + _INJECTED)
        if fault == "57P01":
            self.pgconn.finish()
            raise psycopg.errors.AdminShutdown(
                "terminating connection due to administrator command" + _INJECTED
            )
        if fault == "08006":
            self.pgconn.finish()
            raise psycopg.errors.ConnectionFailure(
                "server closed the connection unexpectedly" + _INJECTED
            )
        # blackhole: no answer, ever; the caller's deadline cancels the wait.
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            self.pgconn.finish()
        raise AssertionError("unreachable")


__all__ = ["FAULTS", "PostgresFaultInjector"]
