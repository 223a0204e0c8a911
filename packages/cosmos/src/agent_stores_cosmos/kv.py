"""``CosmosKV``: the KV CAS contract on Azure Cosmos DB for NoSQL (``azure.cosmos.aio``).

Layout: one container partitioned on ``/pk`` (the scope), one item per entry; see
:mod:`agent_stores_cosmos.layout`. Version = the item's ``_etag`` (plus the expiry of
that write, so liveness needs no extra read). Every conditional primitive is one
server-side conditional request:

* create — ``POST`` (409 when an item exists); only if the existing item is expired
  (by the core's clock) is it replaced under ``If-Match`` on its ETag;
* replace / conditional delete — ``If-Match`` on the expected ETag (412 = conflict);
* unconditional delete — read, then delete under ``If-Match`` on what was read, so the
  answer "a live entry was deleted" is exact;
* get_many — ``read_items``; scan — a parameterised ``TOP … ORDER BY c.k`` query on one
  partition; scopes — an admin-only cross-partition query; drop_scope — query + deletes.

``commit`` is not offered: correctness needs only single-key CAS + scan, and no server
the tests can run here executes a transactional batch atomically (see ``docs/cosmos.md``).

**Retries.** Every request (reads, writes, queries, setup) goes through one retry loop
here, :meth:`CosmosKV._request`: 429 (waiting the ``x-ms-retry-after-ms`` the service
asks for), 449, 408, 410 (any substatus), 500/502/503/504, 404/1002 and connection errors
are retried with jittered exponential backoff, at most ``?retries=`` times and never past
the call's deadline (``?deadline=``, :attr:`KVStore.deadline_seconds`); then the call
raises :class:`~agent_stores.errors.BackendUnavailableError` with the last failure as its
cause — never a configuration error. Until the service has answered once, a refused
connection or an unknown host gets 0.5 s of retries only (nothing is there: a wrong URL,
an emulator not running), and an untrusted TLS certificate none (``ca_file=``,
``verify=false``). The SDK's own throttling and connection retries are
off in clients the store builds (they retried 429 only, 408/5xx once and only with endpoint
discovery on, and 449 never), so there is one budget, not two nested ones; and so is
aiohttp's own re-send of a PUT or DELETE whose connection broke before the reply (see
:func:`no_resend_session`): nothing below the store sends a request again.

**Re-sent writes.** A write whose reply is lost may have been applied. azure-core cannot
tell: when the server drops the connection after receiving a request, aiohttp reports
``ServerDisconnectedError`` and azure-core maps it to ``ServiceRequestError`` ("request not
sent"). In clients built with the SDK's defaults (a ready client handed to
:meth:`CosmosKV.from_client` keeps those) aiohttp itself sends a PUT or DELETE again at
once, and azure-cosmos's connection retry policy re-sends any request — writes included —
so the store sees only the second attempt's answer (a 412 for a replace or delete that
was applied). In clients the store builds neither re-sends: the store sees the lost
reply and re-sends itself, knowing the first outcome is unknown. Either way a re-sent conditional write can meet its own earlier
success: every item carries a random write token ``w`` generated for that one write, so
a create answered 409, or a replace answered 412, reads the item back and, if it holds
our token, returns that write's version. When the item holds someone else's write (or a
delete re-sent after a lost reply finds the item gone) the outcome is unknown, and the
call raises ``BackendUnavailableError`` saying so — never a conflict that may be a lie.

``emulator=cosmosdb-server`` (the npm test server): point reads carry the cross-partition
header, without which that server answers 500 instead of 404 for a missing item, and
endpoint discovery is off by default. ``emulator=microsoft`` (Microsoft's emulator):
endpoint discovery off by default, and ``verify=false`` accepted for any host.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, ParamSpec, TypeVar, cast

from agent_stores.backend import (
    DEFAULT_DEADLINE_SECONDS,
    Clock,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    ScanItem,
    StoreURL,
    URLOptions,
    new_version,
    within_deadline,
)
from agent_stores.errors import (
    AppError,
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
)

from . import layout
from .config import DEFAULT_RETRIES, URL_OPTIONS, CosmosSettings, check_prefix, parse_url

if TYPE_CHECKING:
    from azure.cosmos.aio import ContainerProxy, CosmosClient

P = ParamSpec("P")
T = TypeVar("T")

#: How many times create re-tries when the item keeps changing under it.
CREATE_ATTEMPTS = 8
#: Items deleted per drop_scope round, and deletes in flight at once.
DROP_PAGE = 500
DROP_CONCURRENCY = 16
#: Rows fetched per scopes() query (duplicates of one scope collapse client-side).
SCOPES_PAGE = 200
#: Header that makes the npm test server answer 404 (not 500) for a missing item.
_CROSS_PARTITION = "x-ms-documentdb-query-enablecrosspartition"
_PARTITION_PATH = "/pk"
#: The command that creates database and container (named in every "missing" error).
SETUP_COMMAND = "agent-stores setup URL"
#: Only the fields queries filter and order on are indexed: never the base64 value.
INDEXING_POLICY: dict[str, Any] = {
    "indexingMode": "consistent",
    "automatic": True,
    "includedPaths": [
        {"path": "/pk/?"},
        {"path": "/a/?"},
        {"path": "/s/?"},
        {"path": "/k/?"},
        {"path": "/x/?"},
    ],
    "excludedPaths": [{"path": "/*"}],
}

#: HTTP statuses retried: throttling (429), "retry with" (449, a concurrent update in the
#: service), timeout (408), gone (410: a partition moved or split), and server errors.
TRANSIENT_STATUSES = frozenset({408, 410, 429, 449, 500, 502, 503, 504})
#: 404 with this substatus: the replica has not caught up with the session token yet.
READ_SESSION_NOT_AVAILABLE = 1002
#: Statuses after which a write may have been applied although it reported failure.
MAYBE_APPLIED_STATUSES = frozenset({408, 500, 502, 504})
#: Exponential backoff between retries: base, cap (seconds); "equal jitter" on top.
BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0
#: Consistency levels under which a reader can see a state before what it references.
WEAK_CONSISTENCY = frozenset({"eventual", "consistentprefix"})
#: Until the service has answered once, a refused connection (or a host name that does
#: not resolve) is retried for this long only: it means nothing is there, almost always a
#: wrong URL or a server that is not running, and waiting out the deadline helps nobody.
#: Once the service has answered, the same failure is a restart or failover: retried in
#: full, like any transient fault.
NOTHING_THERE_GRACE_SECONDS = 0.5

#: The absolute (loop-time) end of the retry budget of the KV call this task is in.
_CALL_END: ContextVar[float | None] = ContextVar("agent_stores_cosmos_call_end", default=None)


class ContainerMissingError(ConfigError):
    """The database or container does not exist; ``agent-stores setup URL`` creates them."""


class _MaybeApplied(Exception):
    """A create's attempt failed after it may have been applied (its reply was lost)."""


class _Outcome:
    """What a write's earlier attempts did: ``maybe_applied`` once a reply was lost."""

    __slots__ = ("maybe_applied",)

    def __init__(self) -> None:
        self.maybe_applied = False


def _budgeted(
    fn: Callable[Concatenate[CosmosKV, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[CosmosKV, P], Coroutine[Any, Any, T]]:
    """Give a primitive the retry budget of its call: the store's deadline, less a margin.

    The core bounds every public call by ``deadline_seconds`` and cancels what is still
    running then; the retry loop stops a little earlier, so the error it raises keeps
    its cause. Nested primitives (create reading back) share the outer budget.
    """

    @functools.wraps(fn)
    async def wrapper(self: CosmosKV, /, *args: P.args, **kwargs: P.kwargs) -> T:
        deadline = self.deadline_seconds
        if _CALL_END.get() is not None or deadline is None:
            return await fn(self, *args, **kwargs)
        margin = min(0.25, deadline / 10)
        token = _CALL_END.set(asyncio.get_running_loop().time() + deadline - margin)
        try:
            return await fn(self, *args, **kwargs)
        finally:
            _CALL_END.reset(token)

    return wrapper


def no_resend_session(connector: Any = None) -> Any:
    """An ``aiohttp.ClientSession`` as azure-core makes one, that never re-sends a request.

    aiohttp re-sends a PUT or DELETE once when a pooled connection breaks before the reply
    (``ServerDisconnectedError``, ``ClientOSError``), although the server may have applied
    it: below the store, that turns a lost reply into a 412 on the second attempt.
    ``ClientSession._retry_connection`` (the flag ``aiohttp.test_utils`` clears for the
    same reason) turns it off; an aiohttp without it must not be used unknowingly, so
    this fails loudly instead (``tests/test_cosmos_faults.py`` proves the re-send gone).
    """
    import aiohttp

    session = aiohttp.ClientSession(
        connector=connector,
        trust_env=True,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
    )
    if not hasattr(session, "_retry_connection"):  # pragma: no cover - checked by a test
        raise RuntimeError(
            f"aiohttp {aiohttp.__version__} has no ClientSession._retry_connection: the "
            "store cannot turn off its re-send of PUT and DELETE after a broken connection"
        )
    session._retry_connection = False
    return session


class RequestStats:
    """Requests and request units (``x-ms-request-charge``) this store spent."""

    def __init__(self) -> None:
        self.requests = 0
        self.request_charge = 0.0
        #: transient failures retried (by status code, or "connection")
        self.retries: dict[str, int] = {}

    def hook(self, headers: Mapping[str, Any], _body: Any = None) -> None:
        """An Azure SDK ``response_hook``: counts one response."""
        self.requests += 1
        with contextlib.suppress(TypeError, ValueError):
            self.request_charge += float(headers.get("x-ms-request-charge", 0) or 0)

    def retried(self, reason: str) -> None:
        """Count one retry."""
        self.retries[reason] = self.retries.get(reason, 0) + 1


class CosmosKV(KVStore):
    """KV store in one Cosmos DB for NoSQL container.

    Build it from a URL (:meth:`from_url`) or around a ready ``azure.cosmos.aio``
    ``CosmosClient`` or ``ContainerProxy`` (:meth:`from_client`; never closed by the
    store). Nothing billable is created implicitly: the database and container are
    created by :meth:`setup` (``agent-stores setup URL``), or on first use only with
    ``?auto_setup=true``. The container is checked when first used: partition key
    ``/pk``, TTL on with ``defaultTtl = -1``, and an account with one write region and
    Session (or stronger) consistency.
    """

    backend_name: ClassVar[str] = "cosmos"
    url_options: ClassVar[URLOptions] = URL_OPTIONS
    limits = KVLimits(max_value_bytes=layout.MAX_VALUE_BYTES)

    def __init__(
        self,
        *,
        prefix: str,
        settings: CosmosSettings | None = None,
        client: CosmosClient | None = None,
        container: ContainerProxy | None = None,
        owns_client: bool = False,
        database: str | None = None,
        container_name: str | None = None,
        create: bool = False,
        auto_setup: bool = False,
        emulator: str | None = None,
        display: str = "cosmos",
        clock: Clock | None = None,
        deadline: float | None = DEFAULT_DEADLINE_SECONDS,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        super().__init__(clock=clock)
        self.prefix = check_prefix(prefix)
        self._settings = settings
        self._client = client
        self._container = container
        self._owns_client = owns_client
        self._database_name = database
        self._container_name = container_name
        self._create_missing = create
        self._auto_setup = auto_setup
        self.emulator = emulator
        self._display = display
        self.deadline_seconds = deadline
        self.retries = retries
        self._ready_lock: asyncio.Lock | None = None
        self._verified = False
        self._credential: Any = None  # an Entra ID credential the store created
        #: an azure-core transport for clients the store builds (the fault injector's)
        self._transport: Any = None
        self._secrets = [s for s in (settings.key if settings else None,) if s]
        #: True once the service has answered a request (any HTTP status)
        self._answered = False
        self.stats = RequestStats()
        # The test server runs batches one operation at a time: never call that atomic.
        self.capabilities = KVCapabilities(commit=False, shared_across_processes=True)
        self._read_headers: dict[str, str] = (
            {_CROSS_PARTITION: "true"} if emulator == "cosmosdb-server" else {}
        )

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: StoreURL | str, **options: Any) -> CosmosKV:
        """Open a store for a ``cosmos://`` URL (see :mod:`agent_stores_cosmos.config`).

        ``options``: ``clock`` only. Nothing connects until the first operation.
        """
        clock = _pop_clock(options)
        settings = parse_url(url)
        return cls(
            prefix=settings.prefix,
            settings=settings,
            owns_client=True,
            database=settings.database,
            container_name=settings.container,
            create=settings.create,
            auto_setup=settings.auto_setup,
            emulator=settings.emulator,
            display=settings.describe(),
            clock=clock,
            deadline=settings.deadline,
            retries=settings.retries,
        )

    @classmethod
    def from_client(
        cls,
        client: Any,
        *,
        prefix: str = "agent-stores",
        database: str | None = None,
        container: str | None = None,
        create: bool = False,
        auto_setup: bool = False,
        emulator: str | None = None,
        clock: Clock | None = None,
        deadline: float | None = DEFAULT_DEADLINE_SECONDS,
        retries: int = DEFAULT_RETRIES,
    ) -> CosmosKV:
        """Wrap a ready ``azure.cosmos.aio.CosmosClient`` (give ``database`` and ``container``)
        or ``ContainerProxy``. The client stays yours: the store never closes it.

        ``create``: :meth:`setup` may create database and container (a ``CosmosClient``
        only); ``auto_setup``: also on first use.
        """
        from azure.cosmos.aio import ContainerProxy, CosmosClient

        common: dict[str, Any] = {
            "prefix": prefix,
            "emulator": emulator,
            "clock": clock,
            "deadline": deadline,
            "retries": retries,
            "auto_setup": auto_setup,
        }
        if isinstance(client, ContainerProxy):
            return cls(container=client, display=f"cosmos (container {client.id!r})", **common)
        if isinstance(client, CosmosClient):
            if not database or not container:
                raise ConfigError(
                    detail="a CosmosClient needs database=… and container=… options "
                    "(or pass a ContainerProxy)"
                )
            return cls(
                client=client,
                database=database,
                container_name=container,
                create=create,
                display=f"cosmos (client, {database}/{container})",
                **common,
            )
        raise ConfigError(
            detail=f"expected an azure.cosmos.aio CosmosClient or ContainerProxy, got "
            f"{type(client).__module__}.{type(client).__name__} (the synchronous "
            "azure.cosmos client is not supported: use azure.cosmos.aio)"
        )

    def describe(self) -> str:
        return f"{self._display} [prefix {self.prefix}]"

    @property
    def auto_setup(self) -> bool:
        """``?auto_setup=`` (default false): create database and container on first use.

        Off by default because they are billable: a typo in a database name must fail
        (naming ``agent-stores setup URL``), not create a new database.
        """
        return self._auto_setup

    # -- plumbing -----------------------------------------------------------------------

    def _build_client(self) -> CosmosClient:
        from azure.cosmos._retry_options import RetryOptions
        from azure.cosmos.aio import CosmosClient
        from azure.cosmos.documents import ConnectionPolicy

        settings = self._settings
        assert settings is not None
        credential: Any
        if settings.auth == "entra":
            try:
                from azure.identity.aio import DefaultAzureCredential  # type: ignore[import-untyped]
            except ImportError:
                raise ConfigError(
                    detail="auth=entra needs azure-identity: pip install 'agent-stores-cosmos[identity]'"
                ) from None
            credential = DefaultAzureCredential()
            self._credential = credential
        else:
            credential = settings.key
        # One retry budget, the store's (see the module docstring): the SDK's throttling
        # retries and its connection-level re-sends are off. Its regional failover (with
        # endpoint discovery on) stays: that one is right, and bounded by the regions.
        policy = ConnectionPolicy()
        policy.RetryOptions = RetryOptions(
            max_retry_attempt_count=0,
            fixed_retry_interval_in_milliseconds=None,
            max_wait_time_in_seconds=0,
        )
        extra: dict[str, Any] = {}
        own = self._own_transport(settings.ca_file)
        transport = self._transport
        if transport is None:
            transport = own
        else:
            # The fault injector's wrapper (faults.FaultTransport): ours goes underneath.
            transport.inner = own
        extra["transport"] = transport
        if not settings.verify:
            # azure-cosmos's own switch; it never verifies localhost and 127.0.0.1 anyway.
            extra["connection_verify"] = False
        return CosmosClient(
            settings.endpoint,
            credential=credential,
            connection_policy=policy,
            enable_endpoint_discovery=settings.endpoint_discovery,
            connection_timeout=settings.timeout,
            read_timeout=settings.timeout,
            retry_total=0,
            retry_connect=0,
            retry_read=0,
            retry_status=0,
            user_agent_suffix="agent-stores",
            **extra,
        )

    def _own_transport(self, ca_file: str | None) -> Any:
        """The azure-core aiohttp transport of a client the store builds.

        The session azure-core would make itself (proxy settings from the environment, no
        cookies, bodies decompressed by azure-core), with two changes:

        * aiohttp's own re-send is off. aiohttp sends a PUT or DELETE again, once, when
          the connection drops before the reply (RFC 9112's retry of an idempotent
          request): a conditional replace or delete the server had applied then meets 412
          on that second attempt, and the store, which never saw the first, would report a
          conflict for a write that was applied. With it off the store sees the broken
          connection, knows the outcome is unknown, and settles it itself (see
          :meth:`CosmosKV._request`). aiohttp has no public switch for it: the session's
          ``_retry_connection`` flag is the one its own test client turns off
          (``aiohttp.test_utils``); :func:`no_resend_session` checks that it exists.
        * with ``ca_file``, TLS trusts the certificates in that file. azure-cosmos takes a
          CA file only with a client certificate (``ssl_config`` without one makes
          azure-core load an empty certificate chain), so the trust goes into the aiohttp
          connector: requests the SDK sends with verification on use its context.
        """
        import ssl

        import aiohttp
        from azure.core.pipeline.transport import AioHttpTransport

        connector: aiohttp.TCPConnector | None = None
        if ca_file is not None:
            try:
                context = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    detail=f"{self.describe()}: ca_file {ca_file} is not a readable PEM file "
                    f"of certificates ({type(exc).__name__}: {str(exc)[:200]})"
                ) from None
            connector = aiohttp.TCPConnector(ssl=context)
        return AioHttpTransport(session=no_resend_session(connector), session_owner=True)

    @property
    def _sdk_resends_writes(self) -> bool:
        """True for a ready client: its SDK may re-send a write whose reply was lost."""
        return not self._owns_client

    # -- the retry loop -----------------------------------------------------------------

    @staticmethod
    def _is_transient(exc: BaseException) -> bool:
        from azure.core.exceptions import (
            IncompleteReadError,
            ServiceRequestError,
            ServiceResponseError,
        )
        from azure.cosmos.exceptions import CosmosHttpResponseError

        if isinstance(exc, CosmosHttpResponseError):
            status = exc.status_code
            return status in TRANSIENT_STATUSES or (
                status == 404 and exc.sub_status == READ_SESSION_NOT_AVAILABLE
            )
        if _untrusted_certificate(exc) is not None:
            return False  # the same certificate again: trust is configuration, not luck
        if isinstance(exc, ServiceRequestError | ServiceResponseError | IncompleteReadError):
            return True
        import aiohttp

        return isinstance(exc, aiohttp.ClientError | ConnectionError | asyncio.TimeoutError)

    @staticmethod
    def _maybe_applied(exc: BaseException) -> bool:
        """Could the request that failed with ``exc`` have been applied?

        Only a connection that was never made proves it was not: a dropped connection
        after the request was written is reported by azure-core as "request not sent"
        too (``ServiceRequestError`` around aiohttp's ``ServerDisconnectedError``).
        """
        from azure.core.exceptions import ServiceRequestError, ServiceRequestTimeoutError
        from azure.cosmos.exceptions import CosmosHttpResponseError

        if isinstance(exc, CosmosHttpResponseError):
            return exc.status_code in MAYBE_APPLIED_STATUSES
        if isinstance(exc, ServiceRequestTimeoutError):
            return False  # the connection was never made
        if isinstance(exc, ServiceRequestError):
            import aiohttp

            return not isinstance(exc.inner_exception, aiohttp.ClientConnectorError)
        return True

    @staticmethod
    def _nothing_there(exc: BaseException) -> str | None:
        """What says no service is at the endpoint at all: a refused connection or a host
        name that does not exist (never a temporary DNS failure), naming the endpoint tried;
        None for any other failure."""
        import socket

        import aiohttp

        missing_host = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
        seen: set[int] = set()
        todo: list[BaseException | None] = [exc]
        while todo:
            err = todo.pop()
            if err is None or id(err) in seen:
                continue
            seen.add(id(err))
            if isinstance(err, aiohttp.ClientConnectorError):
                where = f"{err.host}:{err.port}"
                cause = err.os_error
                if isinstance(cause, ConnectionRefusedError):
                    return f"connection refused by {where}"
                if isinstance(cause, socket.gaierror) and cause.errno in missing_host:
                    return f"host {err.host} not found ({cause.strerror}), tried {where}"
                return None
            if isinstance(err, ConnectionRefusedError):
                return "connection refused"
            inner = getattr(err, "inner_exception", None)
            todo += [inner if isinstance(inner, BaseException) else None]
            todo += [err.__cause__, err.__context__]
        return None

    def _endpoint_hint(self) -> str:
        if self._settings is not None:
            return f" (endpoint {self._settings.endpoint})"
        return ""

    @staticmethod
    def _retry_reason(exc: BaseException) -> str:
        from azure.cosmos.exceptions import CosmosHttpResponseError

        if isinstance(exc, CosmosHttpResponseError):
            sub = exc.sub_status
            return f"{exc.status_code}/{sub}" if sub else str(exc.status_code)
        return "connection"

    @staticmethod
    def _delay(exc: BaseException, attempt: int) -> float:
        """Seconds to wait before the next attempt: what a 429 asks for, else backoff."""
        from azure.cosmos.exceptions import CosmosHttpResponseError

        if isinstance(exc, CosmosHttpResponseError) and exc.headers is not None:
            raw = exc.headers.get("x-ms-retry-after-ms")
            if raw is not None:
                with contextlib.suppress(TypeError, ValueError):
                    asked = max(0.0, float(raw) / 1000)
                    return asked + random.uniform(0, asked / 10 + 0.005)
        step: float = min(BACKOFF_CAP, BACKOFF_BASE * 2.0**attempt)
        return step / 2 + random.uniform(0, step / 2)

    async def _request(
        self,
        action: str,
        send: Callable[[], Awaitable[T]],
        *,
        outcome: _Outcome | None = None,
        resend_maybe_applied: bool = True,
    ) -> T:
        """Run one SDK request, retrying transient failures within the call's budget.

        Non-transient failures (404, 409, 412, 400, …) propagate unchanged for the caller
        to interpret. ``outcome`` (writes) records whether a failed attempt may have been
        applied, so a conflict met by a re-send is not taken at face value. With
        ``resend_maybe_applied=False`` (a create, which no condition stops from landing
        twice) an attempt that may have been applied is not sent again: :class:`_MaybeApplied`
        is raised for the caller to find out from what is stored.
        """
        from azure.cosmos.exceptions import CosmosHttpResponseError

        loop = asyncio.get_running_loop()
        end = _CALL_END.get()
        attempt = 0
        first_absent: float | None = None
        while True:
            scope = asyncio.timeout(None if end is None else end - loop.time())
            try:
                async with scope:
                    result = await send()
                self._answered = True
                return result
            except Exception as exc:
                if isinstance(exc, CosmosHttpResponseError):
                    self._answered = True
                if scope.expired():
                    if outcome is not None:
                        outcome.maybe_applied = True
                    raise BackendUnavailableError(
                        detail=f"{self.describe()}: {action}: no answer within the call's "
                        f"deadline of {self.deadline_seconds:g} s (?deadline=, ?timeout=)"
                    ) from exc
                if not self._is_transient(exc):
                    raise
                if outcome is not None and self._maybe_applied(exc):
                    outcome.maybe_applied = True
                    if not resend_maybe_applied:
                        raise _MaybeApplied from exc
                delay = self._delay(exc, attempt)
                absent = None if self._answered else self._nothing_there(exc)
                if absent is not None:
                    now = loop.time()
                    first_absent = now if first_absent is None else first_absent
                    if now + delay - first_absent > NOTHING_THERE_GRACE_SECONDS:
                        tries = "1 attempt" if attempt == 0 else f"{attempt + 1} attempts"
                        raise BackendUnavailableError(
                            detail=f"{self.describe()}: {action}: {absent}"
                            f"{self._endpoint_hint()}: no Cosmos DB service there ({tries} "
                            f"in {now - first_absent:.1f} s); check the host and port of the "
                            "URL, and that the account or emulator is running"
                        ) from exc
                if attempt >= self.retries or (end is not None and loop.time() + delay >= end):
                    failure = self._failure(action, exc)
                    tried = "no retry" if attempt == 0 else f"{attempt + 1} attempts"
                    raise BackendUnavailableError(
                        detail=f"{failure.detail} ({tried}; the retry budget is ?retries= "
                        "within ?deadline=)"
                    ) from exc
                self.stats.retried(self._retry_reason(exc))
                attempt += 1
                await asyncio.sleep(delay)

    def _unknown(self, action: str, scope: str, key: str) -> BackendUnavailableError:
        return BackendUnavailableError(
            detail=f"{self.describe()}: {action} of key {key[:80]!r} in scope {scope[:80]!r}: "
            "the reply to an earlier attempt was lost and the item has changed since; "
            "whether this write was applied is unknown"
        )

    # -- opening and setup --------------------------------------------------------------

    async def _ready(self) -> ContainerProxy:
        """The container, opened and checked on first use (created only with auto_setup)."""
        self.check_open()
        if self._container is not None and self._verified:
            return self._container
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            ready: ContainerProxy | None = self._container
            if ready is not None and self._verified:  # another task finished meanwhile
                return ready
            return await self._open(create=self._auto_setup and self._create_missing)

    async def _open(self, *, create: bool) -> ContainerProxy:
        """Connect, create database and container when ``create``, and check them."""
        from azure.cosmos import PartitionKey
        from azure.cosmos.exceptions import CosmosResourceNotFoundError

        try:
            container = self._container
            if container is None:
                if self._client is None:
                    self._client = self._build_client()
                client = self._client
                database_name, container_name = self._database_name, self._container_name
                assert database_name is not None and container_name is not None
                if create:
                    database = await self._request(
                        "setup",
                        lambda: client.create_database_if_not_exists(
                            database_name, response_hook=self.stats.hook
                        ),
                    )
                    container = await self._request(
                        "setup",
                        lambda: database.create_container_if_not_exists(
                            container_name,
                            partition_key=PartitionKey(
                                path=_PARTITION_PATH, kind="Hash", version=2
                            ),
                            default_ttl=-1,
                            indexing_policy=INDEXING_POLICY,
                            response_hook=self.stats.hook,
                        ),
                    )
                else:
                    container = client.get_database_client(database_name).get_container_client(
                        container_name
                    )
            found = container
            await self._check_account(getattr(found, "client_connection", None))
            try:
                properties = await self._request(
                    "open", lambda: found.read(response_hook=self.stats.hook)
                )
            except CosmosResourceNotFoundError:
                names = (
                    f"database {self._database_name!r} or its container {self._container_name!r}"
                    if self._database_name
                    else f"container {found.id!r}"
                )
                raise ContainerMissingError(
                    detail=f"{self.describe()}: {names} does not exist; create them with "
                    f'`{SETUP_COMMAND}` (billable: see docs/cosmos.md, "Operating on '
                    'Azure"), or add ?auto_setup=true to create them on first use'
                ) from None
            self._check_layout(properties)
        except AppError:
            raise
        except Exception as exc:
            raise self._failure("open", exc) from exc
        self._container = container
        self._verified = True
        return container

    async def _check_account(self, connection: Any) -> None:
        """Refuse accounts whose guarantees the store cannot keep (see docs/cosmos.md).

        Weak consistency (Eventual, Consistent Prefix): a reader can see a new session
        state before the history chunk it references, or miss its own last write. Several
        write regions: ``If-Match`` is checked in one region only, and concurrent writes
        are merged by last-writer-wins, so two turns could both win a lease.
        """
        get_account = getattr(connection, "GetDatabaseAccount", None)
        if get_account is None:
            return
        account = await self._request("open", lambda: get_account())
        headers = getattr(connection, "default_headers", None) or {}
        asked = headers.get("x-ms-consistency-level")
        policy = getattr(account, "ConsistencyPolicy", None) or {}
        level = asked or policy.get("defaultConsistencyLevel")
        if isinstance(level, str) and level.lower() in WEAK_CONSISTENCY:
            source = "the client asks for" if asked else "the account's default consistency is"
            raise ConfigError(
                detail=f"{self.describe()}: {source} {level}; agent-stores needs Session, "
                "Bounded Staleness or Strong (under weaker levels a reader can see a new "
                "state before the records it references). Set the account's default "
                "consistency to Session (az cosmosdb update --default-consistency-level "
                "Session), and give the client no weaker consistency_level"
            )
        writable = list(getattr(account, "WritableLocations", None) or [])
        if getattr(account, "_EnableMultipleWritableLocations", False) or len(writable) > 1:
            raise ConfigError(
                detail=f"{self.describe()}: the account accepts writes in several regions "
                "(multi-region writes); agent-stores does not support that: If-Match is "
                "checked in one region only and conflicting writes are merged last-writer-"
                "wins, so two clients could both win one lease. Use an account with a "
                "single write region (read regions are fine)"
            )

    def _check_layout(self, properties: Mapping[str, Any]) -> None:
        paths = list((properties.get("partitionKey") or {}).get("paths") or [])
        if paths != [_PARTITION_PATH]:
            raise ConfigError(
                detail=f"{self.describe()}: the container is partitioned on {paths}; "
                f"agent-stores needs partition key path {_PARTITION_PATH}"
            )
        ttl = properties.get("defaultTtl")
        fix = (
            "turn Time to Live on with no default expiry: defaultTtl = -1 (portal: the "
            "container's Settings, Time to Live: On (no default); or az cosmosdb sql "
            "container update … --ttl -1)"
        )
        if ttl is None:
            raise ConfigError(
                detail=f"{self.describe()}: Time to Live is off on the container, so entries "
                f"with a TTL are never collected; {fix}"
            )
        if ttl != -1:
            raise ConfigError(
                detail=f"{self.describe()}: the container's defaultTtl is {ttl!r}: every "
                f"item would be deleted {ttl} s after its last write, sessions and memory "
                f"included; {fix}"
            )

    async def setup(self) -> None:
        """Create database and container if allowed (``create``, default true for a URL),
        then check the partition key, TTL and account. Idempotent; bounded by the deadline.
        """
        self.check_open()
        await within_deadline(self, self._setup())

    @_budgeted
    async def _setup(self) -> None:
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            # A ContainerProxy handed in has no client to create with: it is only checked.
            await self._open(create=self._create_missing and self._container is None)

    async def _aclose(self) -> None:
        if self._owns_client and self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                await client.close()
        if self._credential is not None:
            credential, self._credential = self._credential, None
            with contextlib.suppress(Exception):
                await credential.close()

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _failure(self, action: str, exc: BaseException) -> AppError:
        """The typed error for an SDK or network failure; never carries a secret."""
        if isinstance(exc, AppError):
            return exc
        from azure.core.exceptions import AzureError
        from azure.cosmos.exceptions import CosmosHttpResponseError

        where = f"{self.describe()}: {action}"
        untrusted = _untrusted_certificate(exc)
        if untrusted is not None:
            return BackendUnavailableError(
                detail=f"{where}: the endpoint's TLS certificate is not trusted "
                f"({self._scrub(untrusted)[:200]}); for Microsoft's Cosmos DB emulator add "
                "ca_file=PATH (its exported certificate) or emulator=microsoft&verify=false "
                "(see docs/cosmos.md)"
            )
        if isinstance(exc, CosmosHttpResponseError):
            status = exc.status_code
            if status == 429:
                return BackendUnavailableError(
                    detail=f"{where}: request rate too large (HTTP 429); raise the "
                    "container's throughput, or ?deadline= / ?retries="
                )
            if status in (401, 403):
                return BackendUnavailableError(
                    detail=f"{where}: the account refused the credentials (HTTP {status}); "
                    "check the key, or the RBAC role 'Cosmos DB Built-in Data Contributor'"
                )
            sub = f"/{exc.sub_status}" if exc.sub_status else ""
            message = self._scrub(str(exc.message or "").splitlines()[0] if exc.message else "")
            return BackendUnavailableError(
                detail=f"{where}: HTTP {status}{sub} {message[:200]}".rstrip()
            )
        if isinstance(exc, AzureError | OSError | asyncio.TimeoutError):
            reason = self._scrub(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return BackendUnavailableError(
                detail=f"{where}: cannot reach the Cosmos endpoint ({reason[:200]})"
            )
        try:
            import aiohttp
        except ImportError:  # pragma: no cover - aiohttp is a dependency
            aiohttp = None  # type: ignore[assignment]
        if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
            return BackendUnavailableError(
                detail=f"{where}: cannot reach the Cosmos endpoint ({type(exc).__name__})"
            )
        return BackendUnavailableError(
            detail=f"{where}: unexpected {type(exc).__name__}: {self._scrub(str(exc))[:200]}"
        )

    # -- items --------------------------------------------------------------------------

    def _pk(self, scope: str) -> str:
        return layout.partition_value(self.prefix, scope)

    def _document(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": layout.item_id(key),
            "pk": self._pk(scope),
            "a": self.prefix,
            "s": layout.to_hex(scope),
            "k": layout.to_hex(key),
            "v": layout.encode_value(value),
            "x": None if expires_at is None else float(expires_at),
            # Unique per write: lets a re-sent create or replace recognise its own write.
            "w": new_version(),
        }
        if expires_at is not None:
            doc["ttl"] = layout.gc_ttl(expires_at, now)
        return doc

    @staticmethod
    def _expiry(item: Mapping[str, Any]) -> float | None:
        raw = item.get("x")
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ValueError("expiry field is not a number")
        return float(raw)

    def _version(self, item: Mapping[str, Any]) -> str:
        etag = item.get("_etag")
        if not isinstance(etag, str) or not etag:
            raise CorruptRecordError(detail=f"{self.describe()}: an item has no _etag")
        return layout.make_version(etag, self._expiry(item))

    def _entry(self, item: Mapping[str, Any], scope: str, key_hex: str) -> Entry:
        try:
            expires_at = self._expiry(item)
            return Entry(layout.decode_value(item.get("v")), self._version(item), expires_at)
        except ValueError as exc:
            raise CorruptRecordError(
                detail=f"{self.describe()}: item {key_hex[:40]!r} in scope {scope[:80]!r} "
                f"cannot be decoded ({exc}); left untouched"
            ) from None

    def _live(self, item: Mapping[str, Any], now: float) -> bool:
        try:
            expires_at = self._expiry(item)
        except ValueError:
            return True  # never treat a record we cannot read as free to overwrite
        return expires_at is None or expires_at > now

    async def _read_item(self, scope: str, key: str) -> dict[str, Any] | None:
        """The raw item, or None when absent."""
        from azure.cosmos.exceptions import CosmosResourceNotFoundError

        container = await self._ready()
        try:
            item = await self._request(
                "read",
                lambda: container.read_item(
                    layout.item_id(key),
                    partition_key=self._pk(scope),
                    headers=self._read_headers,
                    response_hook=self.stats.hook,
                ),
            )
        except CosmosResourceNotFoundError:
            return None
        except Exception as exc:
            raise self._failure("read", exc) from exc
        result = dict(item)
        if result.get("k") != layout.to_hex(key):
            raise CorruptRecordError(
                detail=f"{self.describe()}: item {layout.item_id(key)!r} in scope "
                f"{scope[:80]!r} holds another key; left untouched"
            )
        return result

    # -- primitives ---------------------------------------------------------------------

    @_budgeted
    async def _get(self, scope: str, key: str) -> Entry | None:
        item = await self._read_item(scope, key)
        if item is None:
            return None
        return self._entry(item, scope, item["k"])

    @_budgeted
    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        container = await self._ready()
        pk = self._pk(scope)
        wanted = {layout.to_hex(k): k for k in keys}
        try:
            items = await self._request(
                "get_many",
                lambda: container.read_items(
                    [(layout.item_id(k), pk) for k in keys], response_hook=self.stats.hook
                ),
            )
        except Exception as exc:
            raise self._failure("get_many", exc) from exc
        out: dict[str, Entry] = {}
        for item in items:
            key = wanted.get(item.get("k", ""))
            if key is not None and item.get("pk") == pk:
                out[key] = self._entry(item, scope, item["k"])
        return out

    @_budgeted
    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        from azure.core import MatchConditions
        from azure.cosmos.exceptions import (
            CosmosAccessConditionFailedError,
            CosmosResourceExistsError,
            CosmosResourceNotFoundError,
        )

        container = await self._ready()
        doc = self._document(scope, key, value, expires_at, now)
        outcome = _Outcome()
        for _ in range(CREATE_ATTEMPTS):
            try:
                created = await self._request(
                    "create",
                    lambda: container.create_item(doc, response_hook=self.stats.hook),
                    outcome=outcome,
                    # Re-sent after it landed and another client deleted the item, a
                    # create would land a second time: look at what is stored instead.
                    resend_maybe_applied=False,
                )
                return self._version(created)
            except (CosmosResourceExistsError, _MaybeApplied):
                pass
            except Exception as exc:
                raise self._failure("create", exc) from exc
            existing = await self._read_item(scope, key)
            if existing is None:
                if outcome.maybe_applied:
                    # Never applied, or applied and deleted since: which is unknown.
                    raise self._unknown("create", scope, key)
                continue  # deleted since the 409: create again
            if existing.get("w") == doc["w"]:
                return self._version(existing)  # our own earlier attempt: it was applied
            if self._live(existing, now):
                if outcome.maybe_applied:
                    raise self._unknown("create", scope, key)
                raise ConflictError("key exists", scope=scope, key=key)
            # Expired: take it over only while it is still exactly the item we judged.
            etag = str(existing["_etag"])
            try:
                replaced = await self._request(
                    "create",
                    functools.partial(
                        container.replace_item,
                        doc["id"],
                        doc,
                        etag=etag,
                        match_condition=MatchConditions.IfNotModified,
                        response_hook=self.stats.hook,
                    ),
                    outcome=outcome,
                )
                return self._version(replaced)
            except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError):
                continue
            except Exception as exc:
                raise self._failure("create", exc) from exc
        raise ConflictError("key keeps changing", scope=scope, key=key)

    @_budgeted
    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        from azure.core import MatchConditions
        from azure.cosmos.exceptions import (
            CosmosAccessConditionFailedError,
            CosmosResourceNotFoundError,
        )

        expected = layout.parse_version(expected_version)
        if expected is None:
            raise ConflictError("version mismatch", scope=scope, key=key)
        etag, expected_expiry = expected
        if expected_expiry is not None and expected_expiry <= now:
            # That write has expired: if its ETag still matches, the entry is expired.
            raise ConflictError("entry expired", scope=scope, key=key)
        container = await self._ready()
        doc = self._document(scope, key, value, expires_at, now)
        outcome = _Outcome()
        try:
            replaced = await self._request(
                "replace",
                lambda: container.replace_item(
                    doc["id"],
                    doc,
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                    response_hook=self.stats.hook,
                ),
                outcome=outcome,
            )
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError):
            if outcome.maybe_applied or self._sdk_resends_writes:
                # A re-send may have met our own earlier, applied attempt: look for our token.
                current = await self._read_item(scope, key)
                if current is not None and current.get("w") == doc["w"]:
                    return self._version(current)
                if outcome.maybe_applied:
                    raise self._unknown("replace", scope, key) from None
            raise ConflictError("version mismatch", scope=scope, key=key) from None
        except Exception as exc:
            raise self._failure("replace", exc) from exc
        return self._version(replaced)

    async def _delete_at(self, scope: str, key: str, etag: str) -> bool:
        """Delete under ``If-Match: etag``; False when the item changed or is gone."""
        from azure.core import MatchConditions
        from azure.cosmos.exceptions import (
            CosmosAccessConditionFailedError,
            CosmosResourceNotFoundError,
        )

        container = await self._ready()
        outcome = _Outcome()
        try:
            await self._request(
                "delete",
                lambda: container.delete_item(
                    layout.item_id(key),
                    partition_key=self._pk(scope),
                    etag=etag,
                    match_condition=MatchConditions.IfNotModified,
                    response_hook=self.stats.hook,
                ),
                outcome=outcome,
            )
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError):
            if outcome.maybe_applied:
                # Gone or changed after a lost reply: ours, or someone else's? A delete
                # leaves nothing to recognise.
                raise self._unknown("delete", scope, key) from None
            return False
        except Exception as exc:
            raise self._failure("delete", exc) from exc
        return True

    @_budgeted
    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        if expected_version is not None:
            expected = layout.parse_version(expected_version)
            if expected is None:
                return False
            etag, expected_expiry = expected
            if expected_expiry is not None and expected_expiry <= now:
                return False  # that write has expired: it counts as absent
            return await self._delete_at(scope, key, etag)
        for _ in range(CREATE_ATTEMPTS):
            item = await self._read_item(scope, key)
            if item is None:
                return False
            if await self._delete_at(scope, key, str(item["_etag"])):
                return self._live(item, now)
        # Rewritten between every read and its delete: the caller asked for an unconditional
        # delete, so delete what is there now; liveness is the last one read.
        item = await self._read_item(scope, key)
        if item is None or not await self._delete_at(scope, key, str(item["_etag"])):
            return False
        return self._live(item, now)

    async def _query(
        self,
        action: str,
        query: str,
        parameters: list[dict[str, Any]],
        *,
        partition_key: str | None,
        page: int,
    ) -> list[dict[str, Any]]:
        container = await self._ready()

        async def run() -> list[dict[str, Any]]:
            if partition_key is not None:
                iterator = container.query_items(
                    query,
                    parameters=parameters,
                    partition_key=partition_key,
                    max_item_count=page,
                    response_hook=self.stats.hook,
                )
            else:
                # Cross-partition is the default in the aio SDK when no partition key is given.
                iterator = container.query_items(
                    query,
                    parameters=parameters,
                    max_item_count=page,
                    response_hook=self.stats.hook,
                )
            return [dict(row) async for row in iterator]

        try:
            return await self._request(action, run)
        except Exception as exc:
            raise self._failure(action, exc) from exc

    @_budgeted
    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        pk = self._pk(scope)
        # The test server ignores the partition key of a query: filter on it too.
        conditions = ["c.pk = @pk"]
        params: list[dict[str, Any]] = [
            {"name": "@pk", "value": pk},
            {"name": "@n", "value": limit},
            {"name": "@now", "value": now},
        ]
        if prefix:
            low = layout.to_hex(prefix)
            conditions += ["c.k >= @lo", "c.k < @hi"]
            params += [
                {"name": "@lo", "value": low},
                {"name": "@hi", "value": low + layout.HEX_END},
            ]
        if start_after is not None:
            conditions.append("c.k > @after")
            params.append({"name": "@after", "value": layout.to_hex(start_after)})
        conditions.append("(IS_NULL(c.x) OR c.x > @now)")
        fields = "c.k, c.v, c.x, c._etag" if values else "c.k"
        query = f"SELECT TOP @n {fields} FROM c WHERE {' AND '.join(conditions)} ORDER BY c.k"
        rows = await self._query("scan", query, params, partition_key=pk, page=limit)
        items: list[ScanItem] = []
        for row in rows[:limit]:
            key_hex = row.get("k")
            try:
                key = layout.from_hex(str(key_hex))
            except ValueError:
                raise CorruptRecordError(
                    detail=f"{self.describe()}: an item in scope {scope[:80]!r} has a bad key "
                    f"field {str(key_hex)[:40]!r}"
                ) from None
            entry = self._entry(row, scope, str(key_hex)) if values else None
            items.append(ScanItem(key, entry))
        return items

    @_budgeted
    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        conditions = ["c.a = @a", "(IS_NULL(c.x) OR c.x > @now)"]
        params: list[dict[str, Any]] = [
            {"name": "@a", "value": self.prefix},
            {"name": "@now", "value": now},
            {"name": "@n", "value": SCOPES_PAGE},
        ]
        if prefix:
            low = layout.to_hex(prefix)
            conditions += ["c.s >= @lo", "c.s < @hi"]
            params += [
                {"name": "@lo", "value": low},
                {"name": "@hi", "value": low + layout.HEX_END},
            ]
        after = layout.to_hex(start_after) if start_after is not None else None
        found: list[str] = []
        while len(found) < limit:
            where = list(conditions)
            page_params = list(params)
            if after is not None:
                where.append("c.s > @after")
                page_params.append({"name": "@after", "value": after})
            query = f"SELECT TOP @n c.s FROM c WHERE {' AND '.join(where)} ORDER BY c.s"
            rows = await self._query(
                "scopes", query, page_params, partition_key=None, page=SCOPES_PAGE
            )
            for row in rows:
                value = str(row.get("s"))
                if after is not None and value <= after:
                    continue
                try:
                    found.append(layout.from_hex(value))
                except ValueError:
                    raise CorruptRecordError(
                        detail=f"{self.describe()}: an item has a bad scope field {value[:40]!r}"
                    ) from None
                after = value
                if len(found) >= limit:
                    break
            if len(rows) < SCOPES_PAGE:
                break
        return found

    @_budgeted
    async def _drop_scope(self, scope: str) -> int:
        from azure.cosmos.exceptions import CosmosResourceNotFoundError

        container = await self._ready()
        pk = self._pk(scope)
        gate = asyncio.Semaphore(DROP_CONCURRENCY)

        async def remove(item_id: str) -> int:
            async with gate:
                try:
                    await self._request(
                        "drop_scope",
                        lambda: container.delete_item(
                            item_id, partition_key=pk, response_hook=self.stats.hook
                        ),
                    )
                except CosmosResourceNotFoundError:
                    return 0
                except Exception as exc:
                    raise self._failure("drop_scope", exc) from exc
                return 1

        total = 0
        while True:
            rows = await self._query(
                "drop_scope",
                "SELECT TOP @n c.id FROM c WHERE c.pk = @pk",
                [{"name": "@pk", "value": pk}, {"name": "@n", "value": DROP_PAGE}],
                partition_key=pk,
                page=DROP_PAGE,
            )
            if not rows:
                return total
            done = await asyncio.gather(*(remove(str(row["id"])) for row in rows))
            total += sum(done)


def _untrusted_certificate(exc: BaseException) -> str | None:
    """The reason when ``exc`` (or what it wraps) is a failed TLS certificate check."""
    import ssl

    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo:
        err = todo.pop()
        if not isinstance(err, BaseException) or id(err) in seen:
            continue
        seen.add(id(err))
        # aiohttp's ClientConnectorCertificateError is one too, wrapping ssl's own.
        inner = getattr(err, "certificate_error", None)
        if isinstance(inner, ssl.SSLCertVerificationError):
            err = inner
        if isinstance(err, ssl.SSLCertVerificationError):
            return str(getattr(err, "verify_message", None) or err)
        todo += [getattr(err, "inner_exception", None), err.__cause__, err.__context__]
    return None


def _pop_clock(options: dict[str, Any]) -> Clock | None:
    clock: Any = options.pop("clock", None)
    if options:
        raise ConfigError(detail=f"unknown option(s) for the cosmos backend: {sorted(options)}")
    if clock is not None and not callable(clock):
        raise ConfigError(detail="clock must be a callable returning unix seconds")
    return cast("Clock | None", clock)


__all__ = ["INDEXING_POLICY", "ContainerMissingError", "CosmosKV", "RequestStats"]
