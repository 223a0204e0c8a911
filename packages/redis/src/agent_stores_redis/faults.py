"""Redis's routine faults, injected at redis-py's transport (for the contract's fault mode).

:class:`RedisFaultInjector` opens :class:`~agent_stores_redis.kv.RedisKV` stores whose
redis-py clients use a subclass of redis-py's own connection class (its documented
``connection_class`` extension point; on Redis Cluster, every node's). Each command sent
on such a connection asks the injector for a fault; the real server answers every command
that is not faulted. The connection handshake (HELLO, AUTH, SELECT, CLIENT SETINFO) is
never faulted.

Faults (name → kind), standalone and cluster:

* ``connection_reset`` (reset) — half of the command's bytes reach the socket, then the
  connection breaks: the server discards the partial command, nothing runs;
* ``LOADING`` (transient) — the server answers ``-LOADING`` (a restarted server reading its
  data) instead of running the command;
* ``lost_reply`` (lost_reply, scripts only) — the script runs on the server, then the
  connection breaks before its reply is read;
* ``blackhole`` (blackhole) — the command is never answered: the read waits the socket
  timeout (forever without one), then fails as redis-py's own timeout does.

Redis Cluster only:

* ``TRYAGAIN`` (transient) — ``-TRYAGAIN`` (a multi-key command during a slot migration);
* ``MOVED`` (transient) — ``-MOVED <slot> <host:port>`` naming the node that owns the
  slot, as after a resharding: redis-py updates its slot map and re-sends.

Operations (for :meth:`~agent_stores.faults.BaseFaultInjector.arm`): a script's name for
``EVALSHA``/``EVAL`` (``create``, ``replace``, ``delete``, ``commit``, ``get_many``,
``scan``, ``scope_live``, ``drop``, ``session_acquire``, ``memory_write``), else the
command in lower case (``hmget``, ``scan``, ``script``, ``config``, ``cluster``).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from agent_stores.backend import BaseFaultInjector, FaultKind, KVStore, StoreURL

from . import lua
from .config import parse_url

STANDALONE_FAULTS: Mapping[str, FaultKind] = {
    "connection_reset": FaultKind.RESET,
    "LOADING": FaultKind.TRANSIENT,
    "lost_reply": FaultKind.LOST_REPLY,
    "blackhole": FaultKind.BLACKHOLE,
}
CLUSTER_FAULTS: Mapping[str, FaultKind] = {
    **STANDALONE_FAULTS,
    "TRYAGAIN": FaultKind.TRANSIENT,
    "MOVED": FaultKind.TRANSIENT,
}

_SCRIPT_COMMANDS = frozenset({"EVALSHA", "EVAL"})
#: Commands whose first key decides the slot (MOVED and TRYAGAIN need one).
_KEYED_COMMANDS = frozenset({"EVALSHA", "EVAL", "HMGET"})


def _script_names() -> dict[str, str]:
    from .memory import MEMORY_WRITE

    return {script.sha: script.name for script in (*lua.ALL, MEMORY_WRITE)}


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


class RedisFaultInjector(BaseFaultInjector):
    """Injects Redis's routine faults into the stores it opens (see the module doc)."""

    def __init__(self, url: StoreURL | str | None = None) -> None:
        super().__init__()
        cluster = url is not None and parse_url(url).cluster
        self.faults = dict(CLUSTER_FAULTS if cluster else STANDALONE_FAULTS)
        self._scripts = _script_names()
        self._classes: dict[type[Any], type[Any]] = {}

    async def open_kv(self, url: StoreURL, **options: Any) -> KVStore:
        """A :class:`~agent_stores_redis.kv.RedisKV` for ``url`` whose commands pass through this injector."""
        from .kv import RedisKV

        settings = parse_url(url)
        if settings.cluster and "MOVED" not in self.faults:
            self.faults = dict(CLUSTER_FAULTS)
        return RedisKV._from_settings(settings, dict(options), self.connection_class)

    def connection_class(self, base: type[Any]) -> type[Any]:
        """A subclass of redis-py's connection class ``base`` that asks this injector per command."""
        made = self._classes.get(base)
        if made is None:
            made = type(f"Faulty{base.__name__}", (_FaultyConnection, base), {"injector": self})
            self._classes[base] = made
        return made

    def operation_of(self, args: tuple[Any, ...]) -> tuple[str, str]:
        """``(command, operation)`` of a command's arguments."""
        command = _text(args[0]).upper() if args else ""
        if command == "EVALSHA" and len(args) > 1:
            return command, self._scripts.get(_text(args[1]), "evalsha")
        if command == "EVAL" and len(args) > 1:
            source = args[1] if isinstance(args[1], bytes) else _text(args[1]).encode()
            return command, self._scripts.get(hashlib.sha1(source).hexdigest(), "eval")
        return command, command.split(" ")[0].lower()

    def eligible(self, command: str) -> Iterable[str]:
        """The faults a command can carry."""
        for fault in self.faults:
            if fault == "lost_reply" and command not in _SCRIPT_COMMANDS:
                continue
            if fault in ("MOVED", "TRYAGAIN") and command not in _KEYED_COMMANDS:
                continue
            yield fault


class _FaultyConnection:
    """Mixin over a redis-py asyncio connection class; see :class:`RedisFaultInjector`."""

    injector: RedisFaultInjector
    _fault: str | None = None
    _handshake = False
    _args: tuple[Any, ...] = ()

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        self._handshake = True
        try:
            await super().on_connect_check_health(check_health)  # type: ignore[misc]
        finally:
            self._handshake = False

    def pack_command(self, *args: Any) -> Any:
        self._args = args
        return super().pack_command(*args)  # type: ignore[misc]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._fault = None
        fault: str | None = None
        if not self._handshake and self._args:
            name, operation = self.injector.operation_of(self._args)
            fault = self.injector.next_fault(operation, eligible=self.injector.eligible(name))
        if fault is None or fault == "lost_reply":
            self._fault = fault
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        if fault == "connection_reset":
            await self._send_half_and_break(command)
        # LOADING, TRYAGAIN, MOVED, blackhole: nothing is sent; the "reply" is the fault.
        self._fault = fault

    async def _send_half_and_break(self, command: Any) -> None:
        from redis.exceptions import ConnectionError as RedisConnectionError

        conn: Any = self
        if not conn.is_connected:
            await conn.connect_check_health(check_health=False)
        if isinstance(command, str):
            command = command.encode()
        data = command if isinstance(command, bytes) else b"".join(command)
        writer = conn._writer
        if writer is not None and len(data) > 1:
            writer.write(data[: len(data) // 2])
            await writer.drain()
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(
            "Error 104 while writing to socket. Connection reset by peer (fault injected)."
        )

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        fault, self._fault = self._fault, None
        if fault is None:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        from redis.exceptions import (
            BusyLoadingError,
            MovedError,
            ResponseError,
            TryAgainError,
        )
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        conn: Any = self
        if fault == "lost_reply":
            try:
                await super().read_response(*args, **kwargs)  # type: ignore[misc]
            except ResponseError:
                pass  # the reply (an error reply too) is lost all the same
            await conn.disconnect(nowait=True)
            raise RedisConnectionError("Connection closed by server (fault injected: lost reply).")
        if fault == "LOADING":
            raise BusyLoadingError("Redis is loading the dataset in memory")
        if fault == "TRYAGAIN":
            raise TryAgainError("Multiple keys request during rehashing of slot")
        if fault == "MOVED":
            from redis.crc import key_slot

            key = (
                self._args[3] if _text(self._args[0]).upper() in _SCRIPT_COMMANDS else self._args[1]
            )
            raw = key if isinstance(key, bytes) else _text(key).encode()
            raise MovedError(f"{key_slot(raw)} {conn.host}:{conn.port}")
        # blackhole: the peer never answers; redis-py's own read timeout decides.
        timeout = conn.socket_timeout
        if timeout:
            await asyncio.sleep(timeout)
        else:
            await asyncio.get_running_loop().create_future()
        await conn.disconnect(nowait=True)
        raise RedisTimeoutError(f"Timeout reading from {conn._host_error()} (fault injected)")


__all__ = ["CLUSTER_FAULTS", "STANDALONE_FAULTS", "RedisFaultInjector"]
