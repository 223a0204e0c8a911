"""``RedisKV``: the KV CAS contract on Redis and Redis Cluster.

Every conditional primitive is one Lua script (see :mod:`agent_stores_redis.lua`) run
atomically by the server, called by SHA. All keys of a scope share a hash tag (see
:mod:`agent_stores_redis.keys`), so the same scripts work unchanged on a cluster.

Connection errors and timeouts become :class:`~agent_stores.errors.BackendUnavailableError`
with the URL redacted. Pooled connections are checked before use and transient failures
are retried a few times (``?retries=``), so after a server restart the next operation
works without recreating the store. A write whose reply may have been lost is re-sent
only when the re-send cannot apply it twice: a replace (or a conditional delete, or a
commit holding one) names a version that its own first application removed, and it
carries its fresh version, which the script recognises as already stored. A create, an
unconditional delete and a commit of creates could be applied again after someone
deleted (or re-created) the key in between, so they are not re-sent: the key is read
back, and the store's own fresh version there means the write applied. Otherwise the
outcome is unknown, and the store says so (BackendUnavailableError) instead of guessing.

Deadline. Every call, retries included, ends within ``deadline_seconds`` (``?deadline=``,
20 s by default): the core bounds the public KV calls, and this module bounds the rest
(scripts of the native ports, ``setup``, ``health_warnings``). The socket timeouts default
to ``deadline / (retries + 1)`` (at most 5 s), so a healthy retry budget fits inside it.
A command cut off by the deadline leaves its connection disconnected (redis-py closes a
connection whose read was interrupted), never back in the pool with a reply pending.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from agent_stores.backend import (
    DEFAULT_DEADLINE_SECONDS,
    Check,
    Clock,
    Create,
    Deadline,
    Delete,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
    StoreURL,
    URLOptions,
    check_options,
    new_version,
    redact,
    within_deadline,
)
from agent_stores.errors import BackendUnavailableError, ConfigError, ConflictError

from . import lua
from .config import (
    DEFAULT_MAX_VALUE_BYTES,
    DEFAULT_PREFIX,
    DEFAULT_RETRIES,
    HARD_MAX_VALUE_BYTES,
    URL_OPTIONS,
    RedisSettings,
    parse_url,
)
from .direct import DirectScripts
from .keys import KeyLayout

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster

    RedisClient = Redis | RedisCluster

#: Native expiry fires this long after the entry's own expiry: margin for the round trip
#: and for clock drift. Native expiry is only garbage collection.
GC_GRACE_MS = 1000
#: Connections a client built from a URL opens at most (then commands wait for one).
DEFAULT_MAX_CONNECTIONS = 100
#: Entries deleted per ``drop_scope`` script call, so one erasure never blocks Redis long.
DROP_BATCH = 500
#: How many scopes ``scopes()`` checks for liveness at once.
SCOPE_CHECK_CONCURRENCY = 16
#: keys a SCAN call examines (a hint to the server; each call is one round trip)
SCAN_COUNT = 1000

T = TypeVar("T")

_NEVER_DECODE = "NEVER_DECODE"  # redis-py's execute_command option: return raw bytes


#: Maps redis-py's connection class to the one a client should use (a fault injector's).
ConnectionClassHook = Callable[[type[Any]], type[Any]]


def _build_client(
    settings: RedisSettings, connection_class: ConnectionClassHook | None = None
) -> Any:
    """A redis-py asyncio client for ``settings`` (imported only now).

    ``connection_class`` replaces redis-py's connection class (redis-py's own extension
    point), on every node of a cluster too: the fault injector of :mod:`.faults` uses it.
    """
    from redis.asyncio import Redis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    kwargs = dict(settings.client_kwargs)
    # RedisKV retries itself and tracks whether a failed write may have been applied;
    # a client that silently re-sent a write would turn a lost reply into a false conflict.
    retry = Retry(NoBackoff(), 0)
    if settings.cluster:
        first = (kwargs.pop("host"), kwargs.pop("port"))
        nodes = [ClusterNode(host, port) for host, port in (first, *settings.startup_nodes)]
        cluster = RedisCluster(startup_nodes=nodes, retry=retry, **kwargs)
        if connection_class is not None:
            # Nodes found later are built from the manager's connection_kwargs.
            manager = cluster.nodes_manager
            chosen = connection_class(manager.connection_kwargs["connection_class"])
            manager.connection_kwargs["connection_class"] = chosen
            for node in (*cluster.startup_nodes, *manager.startup_nodes.values()):
                node.connection_class = chosen
        return cluster
    from redis.asyncio import BlockingConnectionPool

    # A burst of concurrent turns (plus their background chunk deletes) must wait for a
    # pooled connection, not fail: redis-py's default pool raises "Too many connections".
    # The wait is bounded by the call's deadline.
    max_connections = kwargs.pop("max_connections", None) or DEFAULT_MAX_CONNECTIONS
    template = Redis(retry=retry, **kwargs).connection_pool
    base_class = template.connection_class
    pool = BlockingConnectionPool(
        connection_class=base_class if connection_class is None else connection_class(base_class),
        max_connections=max_connections,
        timeout=None,
        **template.connection_kwargs,
    )
    return Redis.from_pool(pool)


def _classify(exc: BaseException) -> tuple[bool | None, bool]:
    """``(retryable, maybe_sent)`` for an exception from redis-py; retryable None: not ours.

    Errors the server sends back instead of running the command (loading, cluster down,
    read-only replica after a failover) and failures to connect are retryable and
    certainly unsent; a broken connection or a timeout may have lost the reply of a
    command that ran.
    """
    from redis.exceptions import (
        AuthenticationError,
        BusyLoadingError,
        ClusterDownError,
        MaxConnectionsError,
        ReadOnlyError,
        RedisClusterException,
        RedisError,
        TryAgainError,
    )
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, AuthenticationError):
        return False, False
    if isinstance(
        exc,
        BusyLoadingError | ClusterDownError | TryAgainError | ReadOnlyError | MaxConnectionsError,
    ):
        return True, False
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError | TimeoutError):
        return True, "connecting to" not in str(exc).lower()
    if isinstance(exc, RedisClusterException):
        return True, False
    if isinstance(exc, RedisError):
        return False, False
    if _closed_under_the_command(exc):
        return True, True
    return None, False


def _closed_under_the_command(exc: BaseException) -> bool:
    """redis-py's asyncio cluster client closes the idle connections of a node after a
    connection error (``disconnect_free_connections``) while another task may just have
    taken one of them: that task's command then fails inside redis-py with
    ``AttributeError: 'NoneType' object has no attribute 'writelines'`` (or ``read``). It is
    a broken connection like any other, so it is retried like one — as possibly sent, so a
    write's outcome is read back, never guessed."""
    if not isinstance(exc, AttributeError) or "'NoneType' object has no attribute" not in str(exc):
        return False
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    where = frame.tb_frame.f_code.co_filename if frame is not None else ""
    return "/redis/asyncio/" in where.replace("\\", "/")


class _MaybeApplied(Exception):
    """Internal: a write that must not be re-sent failed after it may have reached the server."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _is_cluster(client: Any) -> bool:
    from redis.asyncio.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def _raw(name: Any) -> bytes:
    """A key name from SCAN as bytes (a client built with ``decode_responses`` gives str)."""
    return name.encode("utf-8") if isinstance(name, str) else bytes(name)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisKV(KVStore):
    """KV store on a Redis server or Redis Cluster.

    Build it with :meth:`from_url` (``redis://``, ``rediss://``, ``unix://``,
    ``redis+cluster://``, ``rediss+cluster://``) or :meth:`from_client` (a ready
    ``redis.asyncio.Redis`` / ``RedisCluster``, which the store never closes).
    """

    backend_name = "redis"
    capabilities = KVCapabilities(commit=True, shared_across_processes=True)
    url_options: ClassVar[URLOptions] = URL_OPTIONS

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        owns_client: bool = False,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        description: str | None = None,
        retries: int = DEFAULT_RETRIES,
        deadline: float | None = DEFAULT_DEADLINE_SECONDS,
        clock: Clock | None = None,
        auto_setup: bool = True,
    ) -> None:
        super().__init__(clock=clock)
        self._auto_setup = auto_setup
        self._retries = max(0, int(retries))
        if deadline is not None and not deadline > 0:
            raise ConfigError(detail=f"deadline must be > 0 seconds (or None), got {deadline}")
        self.deadline_seconds = deadline
        if not 1024 <= max_value_bytes <= HARD_MAX_VALUE_BYTES:
            raise ConfigError(
                detail=f"max_value_bytes must be between 1024 and {HARD_MAX_VALUE_BYTES}"
            )
        self._client: Any = client
        self._owns_client = owns_client
        self.layout = KeyLayout(prefix)
        self.cluster = _is_cluster(client)
        self.limits = KVLimits(max_value_bytes=max_value_bytes)
        self._description = description or self._describe_client(client)
        self._cluster_ready = not self.cluster
        self._init_lock: asyncio.Lock | None = None
        # Scripts skip execute_command on a standalone client built here (see .direct); a
        # client handed in by the application keeps its own pool and settings.
        self._direct: DirectScripts | None = None
        if owns_client and not self.cluster:
            standalone: Any = client  # a redis.asyncio.Redis
            pool = standalone.connection_pool
            self._direct = DirectScripts(pool, pool.max_connections)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: StoreURL | str, **options: Any) -> RedisKV:
        """Open ``url`` (see :mod:`agent_stores_redis.config` for the forms and options).

        The only keyword option is ``clock`` (a ``() -> float`` of unix seconds, for tests).
        """
        return cls._from_settings(parse_url(url), options)

    @classmethod
    def _from_settings(
        cls,
        settings: RedisSettings,
        options: dict[str, Any],
        connection_class: ConnectionClassHook | None = None,
    ) -> RedisKV:
        clock = _pop_clock(dict(options))
        client = _build_client(settings, connection_class)
        return cls(
            client,
            prefix=settings.prefix,
            owns_client=True,
            max_value_bytes=settings.max_value_bytes,
            description=settings.describe(),
            retries=settings.retries,
            deadline=settings.deadline,
            clock=clock,
            auto_setup=settings.auto_setup,
        )

    @classmethod
    def from_client(cls, client: Any, **options: Any) -> RedisKV:
        """Wrap a ready ``redis.asyncio.Redis`` or ``RedisCluster``; it is never closed by the store.

        Options: ``prefix``, ``max_value_bytes``, ``deadline`` (seconds a call may take,
        retries included; size the client's socket timeouts to fit), ``clock``. Clients created with
        ``decode_responses=True`` work too: the store always asks for raw bytes.
        """
        from redis import Redis as SyncRedis
        from redis.asyncio import Redis
        from redis.asyncio.cluster import RedisCluster
        from redis.cluster import RedisCluster as SyncRedisCluster

        if isinstance(client, SyncRedis | SyncRedisCluster):
            raise ConfigError(
                detail=f"agent-stores needs an asyncio client: pass a redis.asyncio."
                f"{'RedisCluster' if isinstance(client, SyncRedisCluster) else 'Redis'}, "
                f"not the synchronous {type(client).__name__}"
            )
        if not isinstance(client, Redis | RedisCluster):
            raise ConfigError(
                detail=f"expected a redis.asyncio.Redis or RedisCluster, got {type(client).__name__}"
            )
        options = dict(options)
        prefix = options.pop("prefix", DEFAULT_PREFIX)
        max_value = options.pop("max_value_bytes", DEFAULT_MAX_VALUE_BYTES)
        deadline = options.pop("deadline", DEFAULT_DEADLINE_SECONDS)
        clock = _pop_clock(options)
        return cls(
            client,
            prefix=str(prefix),
            owns_client=False,
            max_value_bytes=int(max_value),
            deadline=None if deadline is None else float(deadline),
            clock=clock,
        )

    @staticmethod
    def _describe_client(client: Any) -> str:
        """``redis://host:port/db (ready client)`` — built from connection settings, never a password."""
        if _is_cluster(client):
            manager = getattr(client, "nodes_manager", None)
            nodes: Mapping[str, Any] = getattr(manager, "startup_nodes", None) or {}
            first = next(iter(nodes), "?")  # keys are "host:port"
            return f"redis+cluster://{first} (ready client)"
        pool = getattr(client, "connection_pool", None)
        kw: Mapping[str, Any] = getattr(pool, "connection_kwargs", {}) or {}
        if kw.get("path"):
            return f"unix://{kw['path']}?db={kw.get('db', 0)} (ready client)"
        return (
            f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)} (ready client)"
        )

    def describe(self) -> str:
        return self._description

    @property
    def client(self) -> RedisClient:
        """The redis-py client (shared, not owned, when it was passed in)."""
        client: RedisClient = self._client
        return client

    @property
    def prefix(self) -> str:
        """The app namespace every key of this store starts with."""
        return self.layout.prefix

    # -- plumbing ---------------------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> BackendUnavailableError:
        reason = redact(str(exc)) or type(exc).__name__
        return BackendUnavailableError(detail=f"{self.describe()}: {type(exc).__name__}: {reason}")

    def _outcome_unknown(self, what: str, scope: str, key: str) -> BackendUnavailableError:
        return BackendUnavailableError(
            detail=f"{self.describe()}: the connection failed during {what} of {key[:80]!r} in "
            f"scope {scope[:80]!r} and a retry found the entry changed; the write may or may "
            "not have been applied (read it back)"
        )

    async def _ready(self) -> None:
        """Discover the cluster topology once, before any command.

        redis-py 8.1's asyncio ``RedisCluster`` fails with ``AttributeError`` ('NoneType'
        object has no attribute 'writelines') when several commands race on a client that
        has not discovered its nodes yet; initializing it first, under a lock, avoids that.
        """
        if self._cluster_ready:
            return
        if self._init_lock is None:
            self._init_lock = asyncio.Lock()
        async with self._init_lock:
            # Re-read after waiting: another task may have finished the discovery.
            if self._already_ready():
                return
            await self._attempts(self._client.initialize)
            self._cluster_ready = True

    def _already_ready(self) -> bool:
        return self._cluster_ready

    async def _attempts(
        self, call: Callable[..., Awaitable[T]], *args: Any, resend: bool = True
    ) -> tuple[T, bool]:
        """Run ``call(*args)``, retrying transient failures; returns ``(result, ambiguous)``.

        ``ambiguous`` is True when an earlier attempt failed after the command may have
        reached the server (a lost reply), so a write's "conflict" answer cannot be trusted:
        the first attempt may have applied it and someone else may have written since.
        The redis-py clients this store builds do not retry by themselves, so this is the
        only place a command is re-sent. With ``resend`` False, a failure after the command
        may have reached the server raises :class:`_MaybeApplied` instead of re-sending.
        """
        try:
            return await call(*args), False
        except BaseException as exc:
            return await self._after_failure(exc, resend, call, *args)

    async def _after_failure(
        self, failure: BaseException, resend: bool, call: Callable[..., Awaitable[T]], *args: Any
    ) -> tuple[T, bool]:
        """The retries of :meth:`_attempts` once ``call(*args)`` raised ``failure``."""
        ambiguous = False
        attempt = 0
        while True:
            retryable, maybe_sent = _classify(failure)
            if retryable is None:
                raise failure
            if maybe_sent and not resend:
                raise _MaybeApplied(failure) from failure
            if not retryable or attempt >= self._retries:
                raise self._unavailable(failure) from failure
            ambiguous = ambiguous or maybe_sent
            await asyncio.sleep(min(0.5, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
            attempt += 1
            try:
                return await call(*args), ambiguous
            except BaseException as exc:
                failure = exc

    async def _command(self, *args: Any, raw: bool = True, **options: Any) -> Any:
        """Run one read-only command, redis-py errors turned into typed ones.

        ``raw``: ask for undecoded bytes whatever the client's ``decode_responses`` (not for
        commands fanned out to several cluster nodes: their result merging rejects it).
        """
        await self._ready()
        if raw:
            options[_NEVER_DECODE] = True
        try:
            result, _ = await self._attempts(lambda: self._client.execute_command(*args, **options))
        finally:
            if self.closed and self._owns_client:
                # A call that took its connection after aclose() put it back into a pool
                # nobody closes any more.
                await self._client.aclose()
        return result

    async def _eval_once(self, script: lua.Script, argv: list[Any], numkeys: int) -> Any:
        from redis.exceptions import NoScriptError

        send = self._script_sender()
        try:
            return await send("EVALSHA", script.sha, numkeys, *argv)
        except NoScriptError:
            # The server lost its script cache (restart, failover, SCRIPT FLUSH): EVAL runs
            # the script and caches it again, so the next call by SHA works.
            return await send("EVAL", script.source, numkeys, *argv)

    def _script_sender(self) -> Callable[..., Awaitable[Any]]:
        """What sends a script command: the store's own connections when it has them (see
        .direct), else the client. Chosen by the caller, not in a forwarding coroutine:
        each level of the await chain is resumed on every reply."""
        return self._send_by_client if self._direct is None else self._direct.call

    async def _send_by_client(self, *args: Any) -> Any:
        """One script command, its raw reply, through the client's ``execute_command``."""
        return await self._client.execute_command(*args, **{_NEVER_DECODE: True})

    async def _eval(
        self,
        script: lua.Script,
        keys: Sequence[bytes],
        args: Sequence[Any],
        *,
        resend: bool = True,
    ) -> tuple[Any, bool]:
        """Call ``script`` by SHA (re-sent with EVAL on NOSCRIPT); returns ``(result, ambiguous)``.

        ``resend`` False: :class:`_MaybeApplied` when the reply may have been lost.
        """
        if not self._cluster_ready:
            await self._ready()
        send = self._script_sender()
        try:
            # The first attempt sent from here, not through _attempts and _eval_once: each
            # coroutine between a task and its socket is resumed on every reply, and held
            # (with its arguments) for the garbage collector to walk while it waits.
            return await send("EVALSHA", script.sha, len(keys), *keys, *args), False
        except BaseException as exc:
            from redis.exceptions import NoScriptError

            argv = [*keys, *args]
            if isinstance(exc, NoScriptError):
                # The script cache was lost (see _eval_once): straight to EVAL, not by
                # SHA again.
                return await self._attempts(
                    send, "EVAL", script.source, len(keys), *argv, resend=resend
                )
            return await self._after_failure(exc, resend, self._eval_once, script, argv, len(keys))

    async def _applied(
        self, what: str, scope: str, key: str, version: str, lost: _MaybeApplied
    ) -> None:
        """Return if ``(scope, key)`` holds ``version`` (the write applied); else raise
        BackendUnavailableError (outcome unknown), with the lost connection's error kept."""
        found = await self._command("HGET", self.layout.entry(scope, key), "ver")
        if found is not None and _text(found) == version:
            return
        raise BackendUnavailableError(
            detail=f"{self.describe()}: the connection failed during {what} of {key[:80]!r} "
            f"in scope {scope[:80]!r} ({type(lost.cause).__name__}: "
            f"{redact(str(lost.cause)) or 'no detail'}); it was not re-sent (it could apply "
            "twice) and its outcome is unknown (read it back)"
        ) from lost.cause

    async def _read_eval(
        self, script: lua.Script, keys: Sequence[bytes], args: Sequence[Any]
    ) -> Any:
        """:meth:`_eval` for scripts that are safe to repeat (reads, idempotent cleanups)."""
        result, _ = await self._eval(script, keys, args)
        return result

    # -- for the native ports of this package -------------------------------------------

    async def eval_script(
        self, script: lua.Script, keys: Sequence[bytes], args: Sequence[Any]
    ) -> Any:
        """Run one of this package's scripts (by SHA, re-sent on NOSCRIPT), transient
        failures retried; for scripts that may safely run twice (a session acquire does:
        the retry finds its own lease)."""
        self.check_open()
        with Deadline(self):
            result, _ = await self._eval(script, keys, args)
        return result

    @classmethod
    def expiry_text(cls, expires_at: float | None) -> str:
        """An absolute expiry as the scripts take it (``''``: none)."""
        return cls._exp(expires_at)

    @classmethod
    def gc_milliseconds(cls, expires_at: float | None, now: float) -> int:
        """The native-expiry (garbage collection) delay the scripts set for ``expires_at``."""
        return cls._gc_ms(expires_at, now)

    async def _aclose(self) -> None:
        if self._direct is not None:
            await self._direct.aclose()
        if self._owns_client:
            await self._client.aclose()

    @property
    def auto_setup(self) -> bool:
        """``?auto_setup=`` (default true). Redis has no schema: false only keeps entering a
        store from running :meth:`setup` (the scripts then load on first use)."""
        return self._auto_setup

    async def setup(self) -> None:
        """Check the connection and load every script (on every primary of a cluster)."""
        self.check_open()
        await within_deadline(self, self._load_scripts())

    async def _load_scripts(self) -> None:
        for script in lua.ALL:
            if self.cluster:
                from redis.asyncio.cluster import RedisCluster

                await self._command(
                    "SCRIPT LOAD", script.source, raw=False, target_nodes=RedisCluster.PRIMARIES
                )
            else:
                await self._command("SCRIPT LOAD", script.source, raw=False)

    async def health_warnings(self) -> list[str]:
        """Problems an operator should know about (printed by ``agent-stores check``).

        Warns when ``maxmemory-policy`` lets Redis evict keys: ``allkeys-*`` may delete any
        session, memory file or journal entry under memory pressure; ``volatile-*`` may
        delete entries that have a TTL before it passes.
        """
        self.check_open()
        return await within_deadline(self, self._health_warnings())

    async def _health_warnings(self) -> list[str]:
        policies: dict[str, str] = {}
        try:
            if self.cluster:
                await self._ready()  # the primaries are known only after discovery
                for node in self._client.get_primaries():
                    reply = await self._command(
                        "CONFIG GET", "maxmemory-policy", raw=False, target_nodes=node
                    )
                    policies[f"{node.host}:{node.port}"] = _config_value(reply)
            else:
                reply = await self._command("CONFIG GET", "maxmemory-policy", raw=False)
                policies["server"] = _config_value(reply)
        except BackendUnavailableError as exc:
            return [f"could not read maxmemory-policy ({exc.detail}); make sure it is noeviction"]
        if not policies:
            return ["found no primary to read maxmemory-policy from; make sure it is noeviction"]
        warnings: list[str] = []
        for where, policy in sorted(policies.items()):
            label = "" if where == "server" else f" on {where}"
            if policy.startswith("allkeys-"):
                warnings.append(
                    f"maxmemory-policy is {policy}{label}: under memory pressure Redis may evict "
                    "ANY key, losing sessions, memory files and run journals; set "
                    "maxmemory-policy noeviction (or use a Redis dedicated to agent-stores)"
                )
            elif policy.startswith("volatile-"):
                warnings.append(
                    f"maxmemory-policy is {policy}{label}: under memory pressure Redis may evict "
                    "entries that have a TTL before it passes; noeviction is safer"
                )
        return warnings

    # -- primitives -------------------------------------------------------------------------

    @staticmethod
    def _entry(value: Any, version: Any, exp: Any) -> Entry | None:
        if version is None:
            return None
        expires_at = float(exp) if exp not in (None, b"") else None
        return Entry(bytes(value) if value is not None else b"", _text(version), expires_at)

    @staticmethod
    def _gc_ms(expires_at: float | None, now: float) -> int:
        if expires_at is None:
            return 0
        return max(1, math.ceil((expires_at - now) * 1000)) + GC_GRACE_MS

    @staticmethod
    def _exp(expires_at: float | None) -> str:
        return "" if expires_at is None else repr(float(expires_at))

    async def _get(self, scope: str, key: str) -> Entry | None:
        reply = await self._command("HMGET", self.layout.entry(scope, key), "v", "ver", "exp")
        return self._entry(*reply)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        reply = await self._read_eval(lua.GET_MANY, [self.layout.entry(scope, k) for k in keys], [])
        out: dict[str, Entry] = {}
        for key, fields in zip(keys, reply, strict=True):
            entry = self._entry(*fields)
            if entry is not None:
                out[key] = entry
        return out

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        version = new_version()
        try:
            ok, ambiguous = await self._eval(
                lua.CREATE,
                [self.layout.entry(scope, key), self.layout.index(scope)],
                [
                    key.encode(),
                    bytes(value),
                    version,
                    repr(now),
                    self._exp(expires_at),
                    self._gc_ms(expires_at, now),
                ],
                resend=False,
            )
        except _MaybeApplied as lost:
            await self._applied("create", scope, key, version, lost)
            return version
        if ok != 1:
            if ambiguous:
                raise self._outcome_unknown("create", scope, key)
            raise ConflictError("key exists", scope=scope, key=key)
        return version

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        version = new_version()
        ok, ambiguous = await self._eval(
            lua.REPLACE,
            [self.layout.entry(scope, key), self.layout.index(scope)],
            [
                key.encode(),
                bytes(value),
                version,
                repr(now),
                self._exp(expires_at),
                self._gc_ms(expires_at, now),
                expected_version,
            ],
        )
        if ok != 1:
            if ambiguous:
                raise self._outcome_unknown("replace", scope, key)
            raise ConflictError("version mismatch", scope=scope, key=key)
        return version

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        try:
            ok, ambiguous = await self._eval(
                lua.DELETE,
                [self.layout.entry(scope, key), self.layout.index(scope)],
                [key.encode(), repr(now), expected_version or ""],
                # Re-sent, an unconditional delete could delete someone's new entry.
                resend=expected_version is not None,
            )
        except _MaybeApplied as lost:
            raise self._outcome_unknown("delete", scope, key) from lost.cause
        if ok != 1 and ambiguous:
            raise self._outcome_unknown("delete", scope, key)
        return bool(ok == 1)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        low = prefix.encode()
        lower = b"[" + low if low else b"-"
        if start_after is not None and start_after.encode() >= low:
            lower = b"(" + start_after.encode()
        upper = _bytes_upper_bound(low)
        reply = await self._read_eval(
            lua.SCAN,
            [self.layout.index(scope)],
            [
                self.layout.entry_prefix(scope),
                lower,
                b"+" if upper is None else b"(" + upper,
                limit,
                repr(now),
                "1" if values else "0",
            ],
        )
        if not values:
            return [ScanItem(_text(member), None) for member in reply]
        items: list[ScanItem] = []
        for i in range(0, len(reply), 4):
            member, version, exp, value = reply[i : i + 4]
            items.append(ScanItem(_text(member), self._entry(value, version, exp)))
        return items

    async def _scope_live(self, scope: str, now: float) -> bool:
        reply = await self._read_eval(
            lua.SCOPE_LIVE,
            [self.layout.index(scope)],
            [self.layout.entry_prefix(scope), repr(now)],
        )
        return bool(reply == 1)

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        await self._ready()

        async def collect() -> set[str]:
            found: set[str] = set()
            async for name in self._client.scan_iter(
                match=self.layout.index_pattern(), count=SCAN_COUNT, _type="ZSET"
            ):
                scope = self._candidate_scope(name, prefix, start_after)
                if scope is not None:
                    found.add(scope)
            return found

        candidates, _ = await self._attempts(collect)
        # Python orders str by code point, which is UTF-8 byte order.
        return await self._live_scopes(sorted(candidates), now, limit)

    def _candidate_scope(self, index_name: Any, prefix: str, start_after: str | None) -> str | None:
        """The scope an index key found by SCAN names, if it is under ``prefix`` and after
        ``start_after`` (None otherwise). Its liveness is not known yet."""
        scope = self.layout.scope_of_index(_raw(index_name))
        if scope is None or not scope.startswith(prefix):
            return None
        return None if start_after is not None and scope <= start_after else scope

    async def _live_scopes(self, ordered: list[str], now: float, limit: int | None) -> list[str]:
        """Those of ``ordered`` holding a live entry, in order, stopping at ``limit``.

        An index key outlives its entries' expiry, so each candidate is checked; a few at
        a time, in parallel.
        """
        live: list[str] = []
        for start in range(0, len(ordered), SCOPE_CHECK_CONCURRENCY):
            chunk = ordered[start : start + SCOPE_CHECK_CONCURRENCY]
            alive = await asyncio.gather(*(self._scope_live(s, now) for s in chunk))
            for scope, ok in zip(chunk, alive, strict=True):
                if ok:
                    live.append(scope)
                    if limit is not None and len(live) >= limit:
                        return live
        return live

    async def _scope_pages(
        self, prefix: str, page_size: int, now: float
    ) -> AsyncGenerator[list[str], None]:
        # One SCAN walk per primary, each page's candidates checked for a live entry: the
        # keyspace is read once, where paging _scopes would walk all of it for every page.
        await self._ready()
        nodes: list[Any] = list(self._client.get_primaries()) if self.cluster else [None]
        pattern = self.layout.index_pattern()
        for node in nodes:
            cursor = 0
            while True:
                target = {} if node is None else {"target_nodes": node}
                (cursor, names), _ = await self._attempts(
                    functools.partial(
                        self._client.scan,
                        cursor=cursor,
                        match=pattern,
                        count=max(page_size, SCAN_COUNT),
                        _type="ZSET",
                        **target,
                    )
                )
                if isinstance(cursor, dict):  # a cluster node's reply: {node name: cursor}
                    cursor = next(iter(cursor.values()))
                candidates = {
                    scope
                    for name in names
                    if (scope := self._candidate_scope(name, prefix, None)) is not None
                }
                live = await self._live_scopes(sorted(candidates), now, None)
                if live:
                    yield live
                if int(cursor) == 0:
                    break

    async def _drop_scope(self, scope: str) -> int:
        total = 0
        while True:
            deleted, remaining = await self._read_eval(
                lua.DROP,
                [self.layout.index(scope)],
                [self.layout.entry_prefix(scope), DROP_BATCH],
            )
            total += int(deleted)
            if int(remaining) == 0:
                return total

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        keys = [self.layout.index(scope)]
        args: list[Any] = [repr(now)]
        results: list[str | None] = []
        for op in ops:
            keys.append(self.layout.entry(scope, op.key))
            member = op.key.encode()
            if isinstance(op, Create | Replace):
                version = new_version()
                expires_at = self.expires_at(op.ttl, now)
                expected = op.expected_version if isinstance(op, Replace) else ""
                args += [
                    "c" if isinstance(op, Create) else "r",
                    member,
                    bytes(op.value),
                    version,
                    expected,
                    self._exp(expires_at),
                    self._gc_ms(expires_at, now),
                ]
                results.append(version)
            else:
                assert isinstance(op, Delete | Check)
                kind = "d" if isinstance(op, Delete) else "k"
                args += [kind, member, b"", "", op.expected_version or "", "", 0]
                results.append(None)
        # A replace or conditional delete in the batch names a version its own application
        # removes, so a re-send cannot apply the batch twice; without one it could.
        guarded = any(
            isinstance(op, Replace) or (isinstance(op, Delete) and op.expected_version)
            for op in ops
        )
        try:
            reply, ambiguous = await self._eval(lua.COMMIT, keys, args, resend=guarded)
        except _MaybeApplied as lost:
            written = next((i for i, v in enumerate(results) if v is not None), None)
            if written is None:
                raise self._outcome_unknown("commit", scope, ops[0].key) from lost.cause
            await self._applied("commit", scope, ops[written].key, str(results[written]), lost)
            return results
        failed = int(reply)
        if failed:
            index = failed - 1
            op = ops[index]
            if ambiguous:
                raise self._outcome_unknown("commit", scope, op.key)
            raise ConflictError(
                f"operation {index} ({type(op).__name__}) failed",
                scope=scope,
                key=op.key,
                index=index,
            )
        return results


def _bytes_upper_bound(prefix: bytes) -> bytes | None:
    """The smallest byte string above every string starting with ``prefix`` (None: no bound).

    UTF-8 never contains 0xFF, so incrementing the last byte always works for real keys;
    the result need not be valid UTF-8, it is only a ``ZRANGEBYLEX`` bound.
    """
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def _config_value(reply: Any) -> str:
    """The value out of a ``CONFIG GET`` reply (a dict or a flat list, bytes or str)."""
    values = list(reply.values()) if isinstance(reply, dict) else list(reply)[1::2]
    return _text(values[0]) if values else "unknown"


def _pop_clock(options: dict[str, Any]) -> Clock | None:
    check_options("the redis backend", options, "clock")
    clock: Any = options.pop("clock", None)
    if clock is not None and not callable(clock):
        raise ConfigError(detail="clock must be a callable returning unix seconds")
    return cast("Clock | None", clock)


__all__ = ["RedisKV"]
