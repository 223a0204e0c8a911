"""``dynamodb://`` — the KV CAS contract on one DynamoDB table.

Layout: partition key ``scope`` = ``<prefix>/<scope>`` (the prefix has no ``/``, so the
split is unambiguous), sort key ``key``, then ``value`` (binary), ``version`` (string),
``expires_at`` (number, unix seconds, absent = never) and ``ttl`` (number, whole seconds,
only for DynamoDB's TTL garbage collection: an hour after ``expires_at``, so a clock skew
between this process and AWS never lets TTL delete an entry the core still sees live).

Every conditional primitive is one request whose ConditionExpression the server checks:

* create — PutItem if ``attribute_not_exists(scope) OR expires_at <= :now``;
* replace / versioned delete — PutItem / DeleteItem if ``version = :expected`` and live;
* commit — TransactWriteItems (≤ 100 operations, ≤ 4 MB), Check = ConditionCheck;
* scan — Query (``begins_with`` or ``key > :start_after``) paginated by LastEvaluatedKey:
  DynamoDB orders string sort keys by their UTF-8 bytes, which is the contract's order;
* get_many — BatchGetItem (100 keys a request, unprocessed keys re-sent with backoff);
* drop_scope — Query + BatchWriteItem; scopes — a paginated Scan (admin only).

Reads are strongly consistent. Throttling (ThrottlingException,
ProvisionedThroughputExceededException, RequestLimitExceeded), InternalServerError, HTTP
5xx and broken connections are retried by botocore (``standard`` retry mode: jittered
exponential backoff, ``max_attempts`` from the URL), except that a connection which cannot
be opened (refused, unknown host) to an endpoint that has not yet answered this client is
tried only :data:`CONNECT_ATTEMPTS` times and then named in a BackendUnavailableError: a
wrong ``endpoint_url`` or a stopped server is reported in about a second, not after 15 s
of backoff. Transaction contention, which botocore
does not retry — TransactionConflictException, and a TransactionCanceledException whose
CancellationReasons are only TransactionConflict / ThrottlingError /
ProvisionedThroughputExceeded / None — is retried here with full-jitter exponential backoff
within a budget of half the deadline. A cancellation naming ConditionalCheckFailed is a
:class:`~agent_stores.errors.ConflictError` naming the first failing operation. Whatever
transient fault outlives its budget surfaces as
:class:`~agent_stores.errors.BackendUnavailableError` with the SDK's error as its cause,
never as a configuration error. Every request is bounded by the store's
``deadline_seconds`` (``?deadline=``). A condition that fails on botocore's re-send
after an attempt that may have been applied (a 5xx, a reply that could not be read) is an
unknown outcome, never a conflict; after a throttling rejection, which AWS documents as
not applied (:data:`NOT_APPLIED_CODES`), it stays a conflict. A retried conditional write
whose first attempt landed fails its condition on the retry; ``ReturnValuesOnConditionCheckFailure
=ALL_OLD`` returns the stored item in that same reply, so when it carries the version this
write generated the write is reported as done, without another read. Transactions carry
botocore's idempotency token, so their retries are applied at most once by DynamoDB; where
a re-sent transaction runs again anyway (an emulator, or past the token's 10 minutes), its
conditions return ALL_OLD too, and a Put whose stored item holds the version this very
transaction generated proves it was applied (see ``DynamoDBKV._landed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import random
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any, ClassVar

from agent_stores.backend import (
    Clock,
    Create,
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
    new_version,
    within_deadline,
)
from agent_stores.errors import (
    AppError,
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
    InvalidIdError,
    ValueTooLargeError,
)

from .config import (
    DEFAULT_PREFIX,
    MIN_DEADLINE,
    PROFILE_REGION,
    URL_OPTIONS,
    DynamoDBSettings,
    check_prefix,
    check_table,
    parse_url,
    resolve_region,
)

log = logging.getLogger("agent_stores.dynamodb")

#: DynamoDB's item size limit (400 KB), attribute names included.
ITEM_LIMIT_BYTES = 400 * 1024
#: Everything but the value takes at most about 3.2 KB: attribute names (33 bytes), the
#: partition key (≤ 2,048 bytes), the sort key (≤ 1,024), the version and two numbers.
#: 400,000 bytes of value leave room for that in DynamoDB and in moto, which refuses
#: items over 405,000 bytes.
MAX_VALUE_BYTES = 400_000
ITEM_OVERHEAD_BYTES = ITEM_LIMIT_BYTES - MAX_VALUE_BYTES
MAX_PARTITION_KEY_BYTES = 2048
MAX_SORT_KEY_BYTES = 1024
TRANSACTION_MAX_ITEMS = 100
TRANSACTION_MAX_BYTES = 4 * 1024 * 1024
BATCH_GET_MAX = 100
BATCH_WRITE_MAX = 25
#: Seconds after ``expires_at`` at which DynamoDB's TTL may collect an item.
TTL_GRACE_SECONDS = 3600
SETUP_COMMAND = "agent-stores setup"

A_SCOPE = "scope"
A_KEY = "key"
A_VALUE = "value"
A_VERSION = "version"
A_EXPIRES = "expires_at"
A_TTL = "ttl"

_LIVE = "(attribute_not_exists(#exp) OR #exp > :now)"
_ABSENT_OR_EXPIRED = "(attribute_not_exists(#s) OR #exp <= :now)"
_AT_VERSION = "#ver = :ver AND " + _LIVE
_THROTTLED = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "LimitExceededException",
        "InternalServerError",
        "ServiceUnavailable",
        "TransactionInProgressException",
        "TransactionConflictException",
        "InternalFailure",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
_AUTH_FAILED = frozenset(
    {
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "AccessDeniedException",
        "ExpiredTokenException",
        "MissingAuthenticationTokenException",
        "IncompleteSignatureException",
    }
)
#: Cancellation reasons a real service reports for contention or load: retried.
_RETRIABLE_REASONS = frozenset(
    {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
)
_BATCH_RETRIES = 8
#: Contention retries (TransactionConflictException, retriable cancellations) per request,
#: and the share of the deadline they may spend.
CONFLICT_RETRIES = 10
CONFLICT_BUDGET_SHARE = 0.5
#: Attempts of a request whose TCP connection could not be established (refused, no such
#: host, unreachable network) while the endpoint has never answered this client: a wrong
#: endpoint_url or a server that is not running is not worth botocore's 15 s of backoff.
#: Once the endpoint has answered, such failures (a restart, a DNS blip) get botocore's
#: full schedule within the deadline, as every other transient fault does.
CONNECT_ATTEMPTS = 2


class TableMissingError(ConfigError):
    """The table does not exist; ``agent-stores setup URL`` creates it."""


#: The requests of :meth:`DynamoDBKV.setup`: a missing table is their answer to handle,
#: never a reason to run setup again.
_SETUP_OPERATIONS = frozenset(
    {"describe_table", "create_table", "describe_time_to_live", "update_time_to_live"}
)


class StaleConditionError(ConflictError):
    """A transaction's condition on a stored item failed, and DynamoDB returned that item.

    ``stored`` is the item as it stands (``ReturnValuesOnConditionCheckFailure=ALL_OLD``),
    ``None`` when the key is absent or expired. A caller that decided on stale bytes can
    decide again on these, fenced by their version, without another read: the session
    port's cold turn does (three requests instead of four).
    """

    def __init__(
        self, detail: str, *, scope: str, key: str, index: int, stored: Entry | None
    ) -> None:
        super().__init__(detail, scope=scope, key=key, index=index)
        self.stored = stored


class _ConditionFailed(Exception):
    """Internal: a ConditionExpression was false; ``item`` is the stored item (ALL_OLD).

    For a cancelled transaction, ``reasons`` and ``items`` are its CancellationReasons,
    operation by operation (the stored item of each failed condition, ALL_OLD).
    """

    def __init__(
        self,
        item: Mapping[str, Any] | None,
        retried: bool,
        reasons: list[str],
        items: list[Mapping[str, Any] | None] | None = None,
    ) -> None:
        super().__init__("condition failed")
        self.item = item
        self.retried = retried
        self.reasons = reasons
        self.items = items or []


def _num(value: float) -> dict[str, str]:
    return {"N": repr(float(value))}


async def _close_with_loop(context: Any, scrub: Callable[[str], str]) -> None:
    """Sleep until cancelled, then close the client ``context`` opened, in the same loop.

    A store may outlive its event loop (two ``asyncio.run`` calls, a test framework's loop
    per test); ``asyncio.run`` cancels every task as its loop shuts down, so this closes
    the client's connections there instead of leaving them to the garbage collector (with
    aiohttp's "unclosed client session" warnings), and the store's :meth:`aclose` ends it.
    """
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        try:
            await context.__aexit__(None, None, None)
        except BaseException as exc:  # closing must not fail a loop's shutdown
            log.debug("closing the DynamoDB client failed: %s", scrub(repr(exc)))


class DynamoDBKV(KVStore):
    """KV store on one DynamoDB table (see the module docstring for the layout)."""

    backend_name: ClassVar[str] = "dynamodb"
    url_options: ClassVar[URLOptions] = URL_OPTIONS
    limits = KVLimits(max_value_bytes=MAX_VALUE_BYTES)
    capabilities = KVCapabilities(commit=True)

    def __init__(
        self,
        settings: DynamoDBSettings,
        *,
        client: Any | None = None,
        clock: Clock | None = None,
        on_client: Callable[[Any], None] | None = None,
    ) -> None:
        super().__init__(clock=clock)
        self.settings = settings
        self.deadline_seconds = settings.deadline
        self._on_client = on_client
        self.table = settings.table
        self.prefix = settings.prefix
        self._pk_prefix = settings.prefix + "/"
        self._owns_client = client is None
        self._client: Any | None = client
        self._client_context: Any | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        # Closes the owned client when its loop shuts down (see _close_with_loop).
        self._client_guard: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        #: where the region of the owned client came from (for messages)
        self._region_source = PROFILE_REGION
        # Strings that must never reach a message (explicit credentials from the URL).
        self._secrets = [v for v in settings.credentials.values() if v]

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: StoreURL | str, **options: Any) -> DynamoDBKV:
        """Open ``url`` (see :mod:`agent_stores_dynamodb.config`).

        Options: ``clock``; ``on_client``, called with every aiobotocore client the store
        creates, before its first request (to register botocore event handlers: metrics,
        the fault injector of :mod:`agent_stores_dynamodb.faults`).
        """
        settings = parse_url(url)
        clock = options.pop("clock", None)
        on_client = options.pop("on_client", None)
        if options:
            raise ConfigError(detail=f"unknown option(s) for dynamodb://: {sorted(options)}")
        return cls(settings, clock=clock, on_client=on_client)

    @classmethod
    def from_client(cls, client: Any, **options: Any) -> DynamoDBKV:
        """Wrap a ready aiobotocore DynamoDB client; the store never closes it.

        Options: ``table`` (required), ``prefix``, ``clock``, ``deadline`` (seconds per
        call, retries included; the client's own timeouts and retries are the caller's),
        ``auto_setup`` (default False: create the table on first use, as the URL option).
        """
        options = dict(options)
        auto_setup = options.pop("auto_setup", False)
        if not isinstance(auto_setup, bool):
            raise ConfigError(detail=f"auto_setup must be True or False, got {auto_setup!r}")
        table = options.pop("table", None)
        if not table:
            raise ConfigError(detail="a DynamoDB client needs table='…' to know where to store")
        prefix = check_prefix(str(options.pop("prefix", DEFAULT_PREFIX)))
        clock = options.pop("clock", None)
        deadline = options.pop("deadline", None)
        if options:
            raise ConfigError(detail=f"unknown option(s) for a DynamoDB client: {sorted(options)}")
        settings = DynamoDBSettings(
            url=None, table=check_table(str(table)), prefix=prefix, auto_setup=auto_setup
        )
        if deadline is not None:
            if not isinstance(deadline, int | float) or not deadline >= MIN_DEADLINE:
                raise ConfigError(detail=f"deadline must be a number of seconds >= {MIN_DEADLINE}")
            settings = dataclasses.replace(settings, deadline=float(deadline))
        return cls(settings, client=client, clock=clock)

    def describe(self) -> str:
        """``dynamodb://TABLE?…`` with credentials masked."""
        return self.settings.describe()

    # -- client ---------------------------------------------------------------------------

    async def _get_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is not None and (not self._owns_client or self._client_loop is loop):
            return self._client
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        async with self._lock:
            if self._client is not None and self._client_loop is loop:
                return self._client
            # An owned client is bound to the loop that made it (aiohttp); a store used
            # from a new loop gets a new one; the old one was closed as its loop shut down.
            self._client = None
            self._client_context = None
            context = self._new_client_context()
            try:
                client = await context.__aenter__()
            except Exception as exc:
                raise self._translate(exc, "connect") from None
            if self._on_client is not None:
                self._on_client(client)
            self._client, self._client_context, self._client_loop = client, context, loop
            self._client_guard = loop.create_task(
                _close_with_loop(context, self._scrub), name="agent-stores-dynamodb-client-guard"
            )
            return client

    def _new_client_context(self) -> Any:
        from aiobotocore.config import AioConfig  # type: ignore[import-untyped]
        from aiobotocore.session import AioSession  # type: ignore[import-untyped]

        settings = self.settings
        session = AioSession(profile=settings.profile) if settings.profile else AioSession()
        config = AioConfig(
            retries={"mode": "standard", "max_attempts": settings.max_attempts},
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            max_pool_connections=64,
        )
        kwargs = settings.client_kwargs()
        # Passed explicitly rather than written to os.environ: botocore alone would skip
        # AWS_REGION, and the process environment belongs to the application.
        region, self._region_source = resolve_region(settings.region, os.environ)
        if region is not None:
            kwargs["region_name"] = region
        return session.create_client("dynamodb", config=config, **kwargs)

    def _region(self) -> str:
        """The region the client talks to, and where it came from, for messages."""
        client = self._client
        region = getattr(getattr(client, "meta", None), "region_name", None)
        if client is None or not self._owns_client:
            return f"region {region or '?'}"
        return f"region {region or '?'} (from {self._region_source})"

    async def _aclose(self) -> None:
        context, self._client_context = self._client_context, None
        self._client = None
        guard, self._client_guard = self._client_guard, None
        if guard is not None and not guard.done():
            try:
                same_loop = guard.get_loop() is asyncio.get_running_loop()
            except RuntimeError:
                same_loop = False
            if same_loop:
                guard.cancel()  # the guard closes the client: once, in its own loop
                await asyncio.wait({guard})
                return
        if context is not None and self._owns_client:
            try:
                await context.__aexit__(None, None, None)
            except Exception as exc:  # closing must not fail the caller's cleanup
                log.debug("closing the DynamoDB client failed: %s", self._scrub(repr(exc)))

    # -- requests and errors ------------------------------------------------------------

    async def _call(self, operation: str, **request: Any) -> dict[str, Any]:
        """One DynamoDB request (botocore's retries included), bounded by the deadline.

        Errors become the core's typed errors. Transaction contention is retried here
        (see the module doc). A failed condition raises :class:`_ConditionFailed` for the
        caller to interpret: ``reasons`` are a cancelled transaction's, item by item.
        """
        # Public calls are bounded by the core already; this bounds the others (setup's).
        started = asyncio.get_running_loop().time()
        try:
            return await within_deadline(self, self._call_retrying(operation, request, started))
        except TableMissingError:
            if not self.settings.auto_setup or operation in _SETUP_OPERATIONS:
                raise
        # auto_setup: the request found no table, so nothing of it was applied; create the
        # table (idempotent, so concurrent first calls may all do it) and send it again.
        await self.setup()
        started = asyncio.get_running_loop().time()
        return await within_deadline(self, self._call_retrying(operation, request, started))

    async def _call_retrying(
        self, operation: str, request: dict[str, Any], started: float
    ) -> dict[str, Any]:
        client = await self._get_client()
        _guard_writes(client)
        retried = False  # did an attempt that may have been applied precede this one?
        for attempt in range(CONFLICT_RETRIES + 1):
            attempts = _Attempts()
            token = _ATTEMPTS.set(attempts)
            try:
                response: dict[str, Any] = await getattr(client, operation)(**request)
            except _AmbiguousWrite as ambiguous:
                raise BackendUnavailableError(
                    detail=f"{self.describe()}: the outcome of {operation} is unknown (the "
                    "connection broke after the request was sent)"
                ) from ambiguous.__cause__
            except _Unreachable as unreachable:
                raise self._unreachable(operation, unreachable) from unreachable.__cause__
            except Exception as exc:
                code = _error_code(exc)
                meta = getattr(exc, "response", None)
                meta = meta if isinstance(meta, Mapping) else {}
                retried = retried or attempts.resent_after_maybe_applied()
                if code == "ConditionalCheckFailedException":
                    raise _ConditionFailed(meta.get("Item"), retried, []) from None
                if code == "TransactionCanceledException":
                    reasons = _reasons(meta)
                    if not _contention_only(reasons):
                        raise _ConditionFailed(
                            None, retried, reasons, _reason_items(meta)
                        ) from None
                    cause = f"TransactionCanceledException {reasons}"
                elif code == "TransactionConflictException":
                    cause = "TransactionConflictException"
                else:
                    raise self._translate(exc, operation) from _kept_cause(exc)
                delay = _jitter(attempt)
                spent = asyncio.get_running_loop().time() - started
                if attempt == CONFLICT_RETRIES or spent + delay > self._conflict_budget():
                    raise BackendUnavailableError(
                        detail=f"{self.describe()}: {operation} kept meeting contention "
                        f"({cause}) through {attempt + 1} attempts in {spent:.1f} s; "
                        "nothing was written by them"
                    ) from exc
                log.debug("%s: %s, retrying in %.3f s", operation, cause, delay)
                await asyncio.sleep(delay)
            else:
                return response
            finally:
                _ATTEMPTS.reset(token)
        raise AssertionError("unreachable")  # pragma: no cover

    def _unreachable(self, operation: str, unreachable: _Unreachable) -> BackendUnavailableError:
        cause = unreachable.__cause__
        kwargs = getattr(cause, "kwargs", {})
        endpoint = kwargs.get("endpoint_url") or "the DynamoDB endpoint"
        reason = self._scrub(str(kwargs.get("error") or cause))[:300]
        return BackendUnavailableError(
            detail=f"{self.describe()}: {operation} could not connect to {endpoint} in "
            f"{unreachable.attempts} attempts: {reason}. Is the server running, and is that "
            f"the endpoint for {self._region()}?"
        )

    def _conflict_budget(self) -> float:
        deadline = self.deadline_seconds
        return CONFLICT_BUDGET_SHARE * (deadline if deadline is not None else 20.0)

    def _translate(self, exc: BaseException, operation: str) -> AppError:
        if isinstance(exc, AppError):
            return exc
        code = _error_code(exc)
        where = self.describe()
        message = self._scrub(_message(exc))
        if code == "ResourceNotFoundException":
            return TableMissingError(
                detail=f"DynamoDB table {self.table!r} does not exist in {self._region()} at "
                f"{where}; create it there (once, with on-demand billing and TTL) with: "
                f"{SETUP_COMMAND} '{where}' (or call `await kv.setup()`), or add "
                "?auto_setup=true to let the first use create it; without that, reads and "
                "writes never create a table"
            )
        if code == "ValidationException" and "size" in message.lower():
            return ValueTooLargeError(
                f"{where}: DynamoDB refused the item as too large ({message})",
                size=-1,
                limit=ITEM_LIMIT_BYTES,
            )
        if code in _AUTH_FAILED:
            return BackendUnavailableError(
                detail=f"{where}: AWS refused the credentials for {operation} ({code}); "
                "check the credential chain (environment, profile, role)"
            )
        if code is not None and code not in _THROTTLED and not _is_server_fault(exc):
            return ConfigError(detail=f"{where}: {operation} failed: {code}: {message}")
        name = type(exc).__name__
        if name == "NoRegionError":
            return ConfigError(
                detail=f"{where}: no AWS region; add ?region=… to the URL, set AWS_REGION (or "
                "AWS_DEFAULT_REGION), or give the profile a region"
            )
        if name in {"NoCredentialsError", "PartialCredentialsError"}:
            return ConfigError(
                detail=f"{where}: no AWS credentials found (environment, ~/.aws, role, or ?profile=)"
            )
        if name == "ProfileNotFound":
            return ConfigError(detail=f"{where}: {message}")
        return BackendUnavailableError(
            detail=f"{where}: {operation} failed after retries: {code or name}: {message}"
        )

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    # -- ids and items --------------------------------------------------------------------

    def _pk(self, scope: str) -> str:
        pk = self._pk_prefix + scope
        if len(pk.encode()) > MAX_PARTITION_KEY_BYTES:
            raise InvalidIdError(
                detail=f"scope {scope[:40]!r}… is too long for DynamoDB: prefix and scope take "
                f"{len(pk.encode())} UTF-8 bytes, the partition key holds {MAX_PARTITION_KEY_BYTES}"
            )
        return pk

    @staticmethod
    def _sk(key: str) -> str:
        size = len(key.encode())
        if size > MAX_SORT_KEY_BYTES:
            raise InvalidIdError(
                detail=f"key {key[:40]!r}… is {size} UTF-8 bytes; a DynamoDB sort key holds "
                f"{MAX_SORT_KEY_BYTES}"
            )
        return key

    def _item_key(self, scope: str, key: str) -> dict[str, Any]:
        return {A_SCOPE: {"S": self._pk(scope)}, A_KEY: {"S": self._sk(key)}}

    def _item(
        self, scope: str, key: str, value: bytes, version: str, expires_at: float | None
    ) -> dict[str, Any]:
        item = self._item_key(scope, key)
        item[A_VALUE] = {"B": bytes(value)}
        item[A_VERSION] = {"S": version}
        if expires_at is not None:
            item[A_EXPIRES] = _num(expires_at)
            item[A_TTL] = {"N": str(math.ceil(expires_at) + TTL_GRACE_SECONDS)}
        return item

    def _entry(self, item: Mapping[str, Any]) -> Entry:
        try:
            expires = item.get(A_EXPIRES)
            return Entry(
                value=bytes(item[A_VALUE]["B"]),
                version=str(item[A_VERSION]["S"]),
                expires_at=float(expires["N"]) if expires is not None else None,
            )
        except (KeyError, TypeError, ValueError):
            raise CorruptRecordError(
                detail=f"{self.describe()}: an item of table {self.table!r} lacks value/version; "
                "is the table shared with something else?"
            ) from None

    @staticmethod
    def _expired(item: Mapping[str, Any], now: float) -> bool:
        expires = item.get(A_EXPIRES)
        return expires is not None and float(expires["N"]) <= now

    # -- setup ----------------------------------------------------------------------------

    @property
    def auto_setup(self) -> bool:
        """``?auto_setup=`` (default false): create the table on first use, and when a store
        is entered. Off by default because a table is billable: a typo in its name or
        region must fail (naming ``agent-stores setup URL``), not create a new table."""
        return self.settings.auto_setup

    async def setup(self) -> None:
        """Create the table (on-demand billing) and enable TTL on ``ttl``. Idempotent."""
        self.check_open()
        try:
            description = (await self._call("describe_table", TableName=self.table))["Table"]
        except TableMissingError:
            description = await self._create_table()
        await self._wait_active(description)
        schema = {k["AttributeName"]: k["KeyType"] for k in description.get("KeySchema", [])}
        if schema != {A_SCOPE: "HASH", A_KEY: "RANGE"}:
            raise ConfigError(
                detail=f"{self.describe()}: table {self.table!r} has key schema {schema}; "
                f"agent-stores needs partition key {A_SCOPE!r} and sort key {A_KEY!r} (strings)"
            )
        await self._enable_ttl()

    async def _create_table(self) -> dict[str, Any]:
        try:
            response = await self._call(
                "create_table",
                TableName=self.table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[
                    {"AttributeName": A_SCOPE, "AttributeType": "S"},
                    {"AttributeName": A_KEY, "AttributeType": "S"},
                ],
                KeySchema=[
                    {"AttributeName": A_SCOPE, "KeyType": "HASH"},
                    {"AttributeName": A_KEY, "KeyType": "RANGE"},
                ],
            )
            description: dict[str, Any] = response["TableDescription"]
            return description
        except ConfigError as exc:
            if "ResourceInUseException" not in exc.detail:
                raise
            # Another process created it in between: fine.
            described: dict[str, Any] = (await self._call("describe_table", TableName=self.table))[
                "Table"
            ]
            return described

    async def _wait_active(self, description: dict[str, Any]) -> None:
        delay = 0.2
        for _ in range(120):
            if description.get("TableStatus") == "ACTIVE":
                return
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 5.0)
            description = (await self._call("describe_table", TableName=self.table))["Table"]
        raise BackendUnavailableError(
            detail=f"{self.describe()}: table {self.table!r} did not become ACTIVE"
        )

    async def _enable_ttl(self) -> None:
        for _ in range(3):
            ttl = (await self._call("describe_time_to_live", TableName=self.table))[
                "TimeToLiveDescription"
            ]
            status = ttl.get("TimeToLiveStatus")
            if status in ("ENABLED", "ENABLING"):
                if ttl.get("AttributeName", A_TTL) != A_TTL:
                    raise ConfigError(
                        detail=f"{self.describe()}: TTL of table {self.table!r} is on attribute "
                        f"{ttl.get('AttributeName')!r}; agent-stores needs {A_TTL!r}"
                    )
                return
            try:
                await self._call(
                    "update_time_to_live",
                    TableName=self.table,
                    TimeToLiveSpecification={"Enabled": True, "AttributeName": A_TTL},
                )
                return
            except ConfigError as exc:
                # Enabled concurrently ("already enabled"), or still DISABLING: look again.
                log.debug("enabling TTL: %s", exc.detail)
                await asyncio.sleep(0.5)
        raise ConfigError(detail=f"{self.describe()}: could not enable TTL on {A_TTL!r}")

    # -- primitives ---------------------------------------------------------------------

    async def _get(self, scope: str, key: str) -> Entry | None:
        response = await self._call(
            "get_item",
            TableName=self.table,
            Key=self._item_key(scope, key),
            ConsistentRead=True,
        )
        item = response.get("Item")
        return None if item is None else self._entry(item)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        batches = [keys[i : i + BATCH_GET_MAX] for i in range(0, len(keys), BATCH_GET_MAX)]
        results = await asyncio.gather(*(self._batch_get(scope, batch) for batch in batches))
        found: dict[str, Entry] = {}
        for result in results:
            found.update(result)
        return found

    async def _batch_get(self, scope: str, keys: Sequence[str]) -> dict[str, Entry]:
        request: dict[str, Any] = {
            self.table: {"Keys": [self._item_key(scope, k) for k in keys], "ConsistentRead": True}
        }
        found: dict[str, Entry] = {}
        for attempt in range(_BATCH_RETRIES + 1):
            response = await self._call("batch_get_item", RequestItems=request)
            for item in response.get("Responses", {}).get(self.table, []):
                found[item[A_KEY]["S"]] = self._entry(item)
            unprocessed = response.get("UnprocessedKeys") or {}
            if not unprocessed.get(self.table, {}).get("Keys"):
                return found
            request = unprocessed
            await _backoff(attempt)
        raise BackendUnavailableError(
            detail=f"{self.describe()}: BatchGetItem kept returning unprocessed keys (throttled)"
        )

    async def _put(
        self, item: dict[str, Any], condition: str, names: dict[str, str], values: dict[str, Any]
    ) -> None:
        await self._call(
            "put_item",
            TableName=self.table,
            Item=item,
            ConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        version = new_version()
        item = self._item(scope, key, value, version, expires_at)
        try:
            await self._put(
                item,
                _ABSENT_OR_EXPIRED,
                {"#s": A_SCOPE, "#exp": A_EXPIRES},
                {":now": _num(now)},
            )
        except _ConditionFailed as failed:
            if _version_of(failed.item) == version:
                return version  # our own first attempt landed; this was botocore's retry
            self._raise_if_ambiguous(failed, f"creating {key[:80]!r}")
            raise ConflictError(
                detail=f"{key[:80]!r} already exists in scope {scope[:80]!r}", scope=scope, key=key
            ) from None
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
        item = self._item(scope, key, value, version, expires_at)
        try:
            await self._put(
                item,
                _AT_VERSION,
                {"#ver": A_VERSION, "#exp": A_EXPIRES},
                {":ver": {"S": expected_version}, ":now": _num(now)},
            )
        except _ConditionFailed as failed:
            if _version_of(failed.item) == version:
                return version
            self._raise_if_ambiguous(failed, f"replacing {key[:80]!r}")
            raise ConflictError(
                detail=f"{key[:80]!r} in scope {scope[:80]!r} is not at the expected version",
                scope=scope,
                key=key,
            ) from None
        return version

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        if expected_version is not None:
            return await self._delete_at(scope, key, expected_version, now)
        # botocore re-sends a request whose reply was lost, and an unconditional delete
        # re-sent would delete whatever another client wrote in between (found by the
        # contract's linearizability check under faults). Deleting at the version just
        # read makes a re-send harmless: its condition fails on anything newer.
        for _ in range(CONFLICT_RETRIES + 1):
            entry = await self._get(scope, key)
            if entry is None or entry.expired(now):
                return False
            if await self._delete_at(scope, key, entry.version, now):
                return True
        raise BackendUnavailableError(
            detail=f"{self.describe()}: {key[:80]!r} kept changing while it was being deleted"
        )

    async def _delete_at(self, scope: str, key: str, expected_version: str, now: float) -> bool:
        """Delete the live item at ``expected_version``; False when it is not at it."""
        item_key = self._item_key(scope, key)
        try:
            await self._call(
                "delete_item",
                TableName=self.table,
                Key=item_key,
                ConditionExpression=_AT_VERSION,
                ExpressionAttributeNames={"#ver": A_VERSION, "#exp": A_EXPIRES},
                ExpressionAttributeValues={":ver": {"S": expected_version}, ":now": _num(now)},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except _ConditionFailed as failed:
            self._raise_if_ambiguous(failed, f"deleting {key[:80]!r}")
            return False
        return True

    async def _scan(
        self,
        scope: str,
        prefix: str,
        start_after: str | None,
        limit: int,
        values: bool,
        now: float,
    ) -> list[ScanItem]:
        names = {"#s": A_SCOPE}
        expression_values: dict[str, Any] = {":p": {"S": self._pk(scope)}}
        if start_after is not None and start_after >= prefix:
            if not start_after.startswith(prefix):
                return []  # past every key under the prefix
            condition = "#s = :p AND #k > :after"
            names["#k"] = A_KEY
            expression_values[":after"] = {"S": start_after}
        elif prefix:
            # start_after (if any) sorts before the prefix: every key under it qualifies.
            condition = "#s = :p AND begins_with(#k, :prefix)"
            names["#k"] = A_KEY
            expression_values[":prefix"] = {"S": prefix}
        else:
            condition = "#s = :p"
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": condition,
            "ConsistentRead": True,
        }
        if not values:
            names["#k"], names["#exp"] = A_KEY, A_EXPIRES
            request["ProjectionExpression"] = "#k, #exp"
        request["ExpressionAttributeNames"] = names
        request["ExpressionAttributeValues"] = expression_values
        items: list[ScanItem] = []
        while True:
            request["Limit"] = limit - len(items)
            response = await self._call("query", **request)
            for raw in response.get("Items", []):
                key = str(raw[A_KEY]["S"])
                if not key.startswith(prefix):
                    return items  # ``key > :after`` ran past the prefix range
                if self._expired(raw, now):
                    continue
                items.append(ScanItem(key, self._entry(raw) if values else None))
                if len(items) >= limit:
                    return items
            last = response.get("LastEvaluatedKey")
            if not last:
                return items
            request["ExclusiveStartKey"] = last

    def _scopes_request(self, prefix: str) -> dict[str, Any]:
        """A Scan of the partition (scope) keys and expiries of items under ``prefix``."""
        return {
            "TableName": self.table,
            "ProjectionExpression": "#s, #exp",
            "ExpressionAttributeNames": {"#s": A_SCOPE, "#exp": A_EXPIRES},
            "FilterExpression": "begins_with(#s, :p)",
            "ExpressionAttributeValues": {":p": {"S": self._pk_prefix + prefix}},
            "ConsistentRead": True,
        }

    async def _scope_pages(
        self, prefix: str, page_size: int, now: float
    ) -> AsyncGenerator[list[str], None]:
        # One Scan through the table, a page per request: linear, where paging _scopes
        # scans the whole table for every page. A partition's items come together, so a
        # scope repeats only across a page boundary (the caller drops repeats).
        request = self._scopes_request(prefix)
        while True:
            response = await self._call("scan", **request)
            live: dict[str, None] = {}
            for raw in response.get("Items", []):
                scope = str(raw[A_SCOPE]["S"])[len(self._pk_prefix) :]
                if scope.startswith(prefix) and not self._expired(raw, now):
                    live[scope] = None
            if live:
                yield list(live)
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            request["ExclusiveStartKey"] = last

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        found: set[str] = set()
        request = self._scopes_request(prefix)
        while True:
            response = await self._call("scan", **request)
            for raw in response.get("Items", []):
                scope = str(raw[A_SCOPE]["S"])[len(self._pk_prefix) :]
                if not scope.startswith(prefix) or (
                    start_after is not None and scope <= start_after
                ):
                    continue
                if not self._expired(raw, now):
                    found.add(scope)
            last = response.get("LastEvaluatedKey")
            if not last:
                break
            request["ExclusiveStartKey"] = last
        return sorted(found)[:limit]

    async def _drop_scope(self, scope: str) -> int:
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#s = :p",
            "ProjectionExpression": "#s, #k",
            "ExpressionAttributeNames": {"#s": A_SCOPE, "#k": A_KEY},
            "ExpressionAttributeValues": {":p": {"S": self._pk(scope)}},
            "ConsistentRead": True,
        }
        deleted = 0
        while True:
            response = await self._call("query", **request)
            keys = [{A_SCOPE: i[A_SCOPE], A_KEY: i[A_KEY]} for i in response.get("Items", [])]
            for start in range(0, len(keys), BATCH_WRITE_MAX):
                await self._batch_delete(keys[start : start + BATCH_WRITE_MAX])
            deleted += len(keys)
            last = response.get("LastEvaluatedKey")
            if not last:
                return deleted
            request["ExclusiveStartKey"] = last

    async def _batch_delete(self, keys: list[dict[str, Any]]) -> None:
        request: dict[str, Any] = {self.table: [{"DeleteRequest": {"Key": k}} for k in keys]}
        for attempt in range(_BATCH_RETRIES + 1):
            response = await self._call("batch_write_item", RequestItems=request)
            unprocessed = response.get("UnprocessedItems") or {}
            if not unprocessed.get(self.table):
                return
            request = unprocessed
            await _backoff(attempt)
        raise BackendUnavailableError(
            detail=f"{self.describe()}: BatchWriteItem kept returning unprocessed items (throttled)"
        )

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        return await self._transact([(scope, op) for op in ops], (), now)

    async def transact(
        self,
        ops: Sequence[tuple[str, Operation]],
        *,
        ensure: Sequence[tuple[str, str, bytes]] = (),
    ) -> list[str | None]:
        """``commit`` across scopes: ``(scope, operation)`` pairs all-or-nothing in one
        TransactWriteItems, plus ``ensure``: ``(scope, key, value)`` items created when
        absent and left as they are when present (directory markers), which never fail it.

        For this package's native ports (the memory port's record, receipt and markers):
        the caller has checked ids and values (``check_file_write``). Returns each
        operation's new version (None for Delete and Check); a failed condition raises
        :class:`~agent_stores.errors.ConflictError` (``index`` into ``ops``), one on a
        Replace a :class:`StaleConditionError` carrying the stored item.
        """
        self.check_open()
        return await self._transact(list(ops), list(ensure), self.clock())

    async def _transact(
        self,
        ops: list[tuple[str, Operation]],
        ensure: Sequence[tuple[str, str, bytes]],
        now: float,
    ) -> list[str | None]:
        count = len(ops) + len(ensure)
        if count > TRANSACTION_MAX_ITEMS:
            raise ValueTooLargeError(
                f"commit of {count} operations: a DynamoDB transaction holds at most "
                f"{TRANSACTION_MAX_ITEMS}; nothing was written",
                size=count,
                limit=TRANSACTION_MAX_ITEMS,
            )
        size = sum(
            len(op.value) + ITEM_OVERHEAD_BYTES if isinstance(op, Create | Replace) else 0
            for _, op in ops
        ) + sum(len(value) + ITEM_OVERHEAD_BYTES for _, _, value in ensure)
        if size > TRANSACTION_MAX_BYTES:
            raise ValueTooLargeError(
                f"commit of about {size} bytes: a DynamoDB transaction holds at most "
                f"{TRANSACTION_MAX_BYTES} bytes; nothing was written",
                size=size,
                limit=TRANSACTION_MAX_BYTES,
            )
        versions: list[str | None] = []
        items: list[dict[str, Any]] = []
        for scope, op in ops:
            version = new_version() if isinstance(op, Create | Replace) else None
            versions.append(version)
            items.append(self._transact_item(scope, op, version, now))
        items += [self._ensure_item(scope, key, value) for scope, key, value in ensure]
        try:
            await self._call("transact_write_items", TransactItems=items)
        except _ConditionFailed as failed:
            if self._landed(ops, versions, failed):
                return versions  # our own first attempt landed; this was botocore's retry
            self._raise_if_ambiguous(failed, f"committing {len(ops)} operations")
            raise self._cancelled(ops, failed.reasons, failed.items, now) from None
        return versions

    def _ensure_item(self, scope: str, key: str, value: bytes) -> dict[str, Any]:
        """An Update that creates the item when absent and changes nothing when present."""
        return {
            "Update": {
                "TableName": self.table,
                "Key": self._item_key(scope, key),
                "UpdateExpression": "SET #v = if_not_exists(#v, :v), #ver = if_not_exists(#ver, :ver)",
                "ExpressionAttributeNames": {"#v": A_VALUE, "#ver": A_VERSION},
                "ExpressionAttributeValues": {
                    ":v": {"B": bytes(value)},
                    ":ver": {"S": new_version()},
                },
            }
        }

    def _raise_if_ambiguous(self, failed: _ConditionFailed, what: str) -> None:
        """A condition that failed on botocore's re-send, after an attempt that may have
        been applied (a 500, a reply that could not be read), proves nothing: that attempt
        may have landed and the item changed since (a delete leaves nothing to recognise, a
        later write overwrites our version). The outcome is unknown, never a conflict:
        found by the linearizability check. A re-send after an attempt AWS documents as
        rejected (throttling: see :data:`NOT_APPLIED_CODES`) keeps the definite answer."""
        if failed.retried:
            raise BackendUnavailableError(
                detail=f"{self.describe()}: the outcome of {what} is unknown "
                "(the reply to an earlier attempt was lost)"
            )

    def _landed(
        self,
        ops: list[tuple[str, Operation]],
        versions: list[str | None],
        failed: _ConditionFailed,
    ) -> bool:
        """Did an earlier attempt of this very transaction apply it?

        botocore re-sends a transaction whose reply was lost with the same
        ClientRequestToken, which DynamoDB answers as the first time; a server that does
        not (an emulator, or a re-send after the token's 10 minutes) re-runs it, and its
        conditions fail on our own writes. ALL_OLD returns the stored items: a Create or
        Replace whose item carries the version generated for it proves the transaction
        was applied (the version is random and written by this transaction only).
        """
        for (scope, op), version, reason, item in zip(
            ops, versions, failed.reasons, failed.items, strict=False
        ):
            if reason != "ConditionalCheckFailed" or version is None or not item:
                continue
            key = item.get(A_KEY)
            part = item.get(A_SCOPE)
            if (
                isinstance(key, Mapping)
                and isinstance(part, Mapping)
                and key.get("S") == op.key
                and part.get("S") == self._pk(scope)
                and _version_of(item) == version
            ):
                return True
        return False

    def _cancelled(
        self,
        ops: list[tuple[str, Operation]],
        reasons: list[str],
        items: list[Mapping[str, Any] | None],
        now: float,
    ) -> AppError:
        """The typed error of a cancelled transaction, from its reasons item by item."""
        if "ConditionalCheckFailed" in reasons:
            index = reasons.index("ConditionalCheckFailed")
            scope, key = (ops[index][0], ops[index][1].key) if index < len(ops) else ("?", "?")
            detail = (
                f"commit: the condition on {key[:80]!r} in scope {scope[:80]!r} "
                f"(operation {index}) failed; nothing was written"
            )
            if index < len(ops) and isinstance(ops[index][1], Replace):
                item = items[index] if index < len(items) else None
                stored = None
                if item and not self._expired(item, now):
                    with contextlib.suppress(CorruptRecordError):
                        stored = self._entry(item)
                return StaleConditionError(detail, scope=scope, key=key, index=index, stored=stored)
            return ConflictError(detail=detail, scope=scope, key=key, index=index)
        if "ValidationError" in reasons:
            return ConfigError(
                detail=f"{self.describe()}: DynamoDB refused the transaction as invalid: {reasons}"
            )
        if "ItemCollectionSizeLimitExceeded" in reasons:
            index = reasons.index("ItemCollectionSizeLimitExceeded")
            scope = ops[index][0] if index < len(ops) else "?"
            return ValueTooLargeError(
                f"{self.describe()}: scope {scope[:80]!r} is over DynamoDB's 10 GB item "
                f"collection limit; nothing was written ({reasons})",
                size=-1,
                limit=-1,
            )
        return BackendUnavailableError(
            detail=f"{self.describe()}: transaction cancelled, nothing written: {reasons}"
        )

    def _transact_item(
        self, scope: str, op: Operation, version: str | None, now: float
    ) -> dict[str, Any]:
        base: dict[str, Any] = {"TableName": self.table}
        if isinstance(op, Create):
            assert version is not None
            return {
                "Put": {
                    **base,
                    "Item": self._item(
                        scope, op.key, op.value, version, self.expires_at(op.ttl, now)
                    ),
                    "ConditionExpression": _ABSENT_OR_EXPIRED,
                    "ExpressionAttributeNames": {"#s": A_SCOPE, "#exp": A_EXPIRES},
                    "ExpressionAttributeValues": {":now": _num(now)},
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
        if isinstance(op, Replace):
            assert version is not None
            return {
                "Put": {
                    **base,
                    "Item": self._item(
                        scope, op.key, op.value, version, self.expires_at(op.ttl, now)
                    ),
                    "ConditionExpression": _AT_VERSION,
                    "ExpressionAttributeNames": {"#ver": A_VERSION, "#exp": A_EXPIRES},
                    "ExpressionAttributeValues": {
                        ":ver": {"S": op.expected_version},
                        ":now": _num(now),
                    },
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }
        key = self._item_key(scope, op.key)
        if isinstance(op, Delete) and op.expected_version is None:
            return {"Delete": {**base, "Key": key}}
        expected = op.expected_version
        if expected is None:  # Check of absence
            return {
                "ConditionCheck": {
                    **base,
                    "Key": key,
                    "ConditionExpression": _ABSENT_OR_EXPIRED,
                    "ExpressionAttributeNames": {"#s": A_SCOPE, "#exp": A_EXPIRES},
                    "ExpressionAttributeValues": {":now": _num(now)},
                }
            }
        kind = "Delete" if isinstance(op, Delete) else "ConditionCheck"
        return {
            kind: {
                **base,
                "Key": key,
                "ConditionExpression": _AT_VERSION,
                "ExpressionAttributeNames": {"#ver": A_VERSION, "#exp": A_EXPIRES},
                "ExpressionAttributeValues": {":ver": {"S": expected}, ":now": _num(now)},
            }
        }


def _version_of(item: Mapping[str, Any] | None) -> str | None:
    if not item:
        return None
    version = item.get(A_VERSION)
    return str(version["S"]) if isinstance(version, Mapping) and "S" in version else None


def _error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def _reasons(response: Mapping[str, Any]) -> list[str]:
    """A cancelled transaction's CancellationReasons codes, one per operation."""
    reasons = response.get("CancellationReasons") or []
    return [str(r.get("Code") or "None") if isinstance(r, Mapping) else "None" for r in reasons]


def _reason_items(response: Mapping[str, Any]) -> list[Mapping[str, Any] | None]:
    """The stored item (ALL_OLD) of each operation of a cancelled transaction, if returned."""
    reasons = response.get("CancellationReasons") or []
    return [r.get("Item") if isinstance(r, Mapping) else None for r in reasons]


def _contention_only(reasons: list[str]) -> bool:
    """True when a cancellation is only contention or load (retry it), not a verdict."""
    return all(r == "None" or r in _RETRIABLE_REASONS for r in reasons)


def _kept_cause(exc: BaseException) -> BaseException | None:
    """The SDK error kept as ``__cause__`` of a transient failure (it names no secret:
    botocore messages carry the operation, code and message, never credentials)."""
    name = type(exc).__name__
    if name in {"NoCredentialsError", "PartialCredentialsError", "ProfileNotFound"}:
        return None
    code = _error_code(exc)
    if code in _AUTH_FAILED:
        return None
    return exc


def _jitter(attempt: int) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(1 s, 25 ms * 2**attempt)]."""
    return random.uniform(0, min(1.0, 0.025 * (2**attempt)))


def _is_server_fault(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    if not isinstance(response, Mapping):
        return False
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return isinstance(status, int) and status >= 500


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        message = response.get("Error", {}).get("Message")
        if message:
            return str(message)[:300]
    return str(exc)[:300]


async def _backoff(attempt: int) -> None:
    # Full jitter, capped: unprocessed batches and cancelled transactions only.
    await asyncio.sleep(random.uniform(0, min(2.0, 0.05 * (2**attempt))))


#: Writes botocore must never re-send after a broken connection: the first attempt may have
#: been applied, and a re-send would apply it again over whatever was written in between
#: (a create re-created after a delete; found by the contract's linearizability check).
_WRITE_OPERATIONS = frozenset(
    {"PutItem", "DeleteItem", "UpdateItem", "TransactWriteItems", "BatchWriteItem"}
)
_GUARD_MARK = "_agent_stores_no_blind_resend"


class _AmbiguousWrite(Exception):
    """Raised from botocore's needs-retry event instead of a blind re-send of a write."""


def _no_blind_resend(
    caught_exception: BaseException | None = None, operation: Any = None, **_: Any
) -> None:
    """A ``needs-retry`` handler run before botocore's own: a write whose connection broke
    after it was sent (its reply lost) is not re-sent; its outcome is unknown."""
    if caught_exception is None or getattr(operation, "name", None) not in _WRITE_OPERATIONS:
        return
    from botocore.exceptions import (  # type: ignore[import-untyped]
        ConnectionClosedError,
        ReadTimeoutError,
    )

    if isinstance(caught_exception, ConnectionClosedError | ReadTimeoutError):
        raise _AmbiguousWrite() from caught_exception


class _Unreachable(Exception):
    """Raised from botocore's needs-retry event to end the retries of a request that could
    not connect to an endpoint that never answered; the connect error is its cause."""

    def __init__(self, attempts: int) -> None:
        super().__init__(f"could not connect in {attempts} attempts")
        self.attempts = attempts


#: Set on a botocore endpoint once any reply (an error reply too) came back through it.
_ANSWERED_MARK = "_agent_stores_answered"


def _never_connected(exc: BaseException) -> bool:
    """True when ``exc`` is a failure to open the TCP connection (refused, unknown host,
    unreachable): no request was sent. A reset of an established connection is not one."""
    import socket

    from botocore.exceptions import EndpointConnectionError

    if not isinstance(exc, EndpointConnectionError):
        return False
    # aiobotocore wraps every aiohttp connection error in EndpointConnectionError, a reset
    # of a pooled connection (ClientOSError) too; only ClientConnectorError (and a bare
    # DNS failure) say the connection was never opened.
    error = getattr(exc, "kwargs", {}).get("error")
    if isinstance(error, socket.gaierror):
        return True
    try:
        import aiohttp  # aiobotocore's transport; another one keeps botocore's retries
    except ImportError:  # pragma: no cover
        return False
    return isinstance(error, aiohttp.ClientConnectorError)


def _fail_fast_unreachable(
    caught_exception: BaseException | None = None,
    response: Any = None,
    endpoint: Any = None,
    attempts: int = 1,
    **_: Any,
) -> None:
    """A ``needs-retry`` handler run before botocore's own: see :data:`CONNECT_ATTEMPTS`."""
    if endpoint is None:
        return
    if response is not None:
        setattr(endpoint, _ANSWERED_MARK, True)
        return
    if (
        caught_exception is not None
        and attempts >= CONNECT_ATTEMPTS
        and not getattr(endpoint, _ANSWERED_MARK, False)
        and _never_connected(caught_exception)
    ):
        raise _Unreachable(attempts) from caught_exception


#: Errors DynamoDB answers with HTTP 400 when it rejected the request without applying it:
#: throttling, which botocore retries. AWS documents them as rejections ("your request
#: rate is too high", "rate of requests exceeds the allowed throughput"; 400 errors are
#: problems with the request, to be resent as they are). A 500 (InternalServerError) is
#: not one: AWS documents that a write answered 500 "may have succeeded or failed".
NOT_APPLIED_CODES = frozenset(
    {"ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded"}
)


class _Attempts:
    """What each botocore attempt of one request may have done (its ``needs-retry``)."""

    __slots__ = ("maybe_applied",)

    def __init__(self) -> None:
        self.maybe_applied: list[bool] = []

    def resent_after_maybe_applied(self) -> bool:
        """Did botocore re-send this request after an attempt that may have been applied?
        (The last attempt is the one whose answer the caller got.)"""
        return any(self.maybe_applied[:-1])


#: The attempts of the request the current task is sending (see :func:`_note_attempt`).
_ATTEMPTS: ContextVar[_Attempts | None] = ContextVar("agent_stores_dynamodb_attempts", default=None)


def _never_sent(exc: BaseException) -> bool:
    """True when ``exc`` proves the request never left: the connection was never opened
    (or a connection error with no cause, as botocore raises before sending)."""
    from botocore.exceptions import EndpointConnectionError

    if not isinstance(exc, EndpointConnectionError):
        return False
    return getattr(exc, "kwargs", {}).get("error") is None or _never_connected(exc)


def _attempt_maybe_applied(response: Any, caught_exception: BaseException | None) -> bool:
    """Could the attempt that ended with ``response`` / ``caught_exception`` have been
    applied? Only a throttling rejection or a request that never left says no."""
    if caught_exception is not None:
        return not _never_sent(caught_exception)
    if not isinstance(response, tuple) or len(response) != 2:
        return True
    http, parsed = response
    status = getattr(http, "status_code", 500)
    code = parsed.get("Error", {}).get("Code") if isinstance(parsed, Mapping) else None
    return not (status == 400 and code in NOT_APPLIED_CODES)


def _note_attempt(
    response: Any = None, caught_exception: BaseException | None = None, **_: Any
) -> None:
    """A ``needs-retry`` handler (it decides nothing): records, for the request being sent,
    whether this attempt may have been applied, so that a condition failing on a re-send is
    judged by what the earlier attempts were (see :meth:`DynamoDBKV._raise_if_ambiguous`)."""
    attempts = _ATTEMPTS.get()
    if attempts is not None:
        attempts.maybe_applied.append(_attempt_maybe_applied(response, caught_exception))


def _guard_writes(client: Any) -> None:
    """Install :func:`_no_blind_resend`, :func:`_fail_fast_unreachable` and
    :func:`_note_attempt` on ``client`` once (owned and given clients alike)."""
    if getattr(client, _GUARD_MARK, False):
        return
    client.meta.events.register_first("needs-retry.dynamodb", _note_attempt)
    client.meta.events.register_first("needs-retry.dynamodb", _no_blind_resend)
    client.meta.events.register_first("needs-retry.dynamodb", _fail_fast_unreachable)
    setattr(client, _GUARD_MARK, True)
