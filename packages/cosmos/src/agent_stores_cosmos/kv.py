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

Failures: 429 (request rate too large) is retried by the Azure SDK, honouring
``x-ms-retry-after-ms``, up to ``?throttle_retries=`` / ``?throttle_wait=``; what remains,
and every connection error, timeout or 5xx, becomes
:class:`~agent_stores.errors.BackendUnavailableError` with no key in it. The SDK never
re-sends a write whose reply was lost (``retry_write`` stays off in clients the store
builds). A ready client may re-send: every item carries a random write token ``w``, so
a create that meets its own earlier attempt (409) recognises it and succeeds.

``emulator=cosmosdb-server`` (the npm test server): point reads carry the cross-partition
header, without which that server answers 500 instead of 404 for a missing item, and
endpoint discovery is off by default.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from agent_stores.errors import (
    AppError,
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
)
from agent_stores.kv.base import (
    Clock,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    ScanItem,
    new_version,
)
from agent_stores.url import StoreURL

from . import layout
from .config import CosmosSettings, check_prefix, parse_url

if TYPE_CHECKING:
    from azure.cosmos.aio import ContainerProxy, CosmosClient

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


class RequestStats:
    """Requests and request units (``x-ms-request-charge``) this store spent."""

    def __init__(self) -> None:
        self.requests = 0
        self.request_charge = 0.0

    def hook(self, headers: Mapping[str, Any], _body: Any = None) -> None:
        """An Azure SDK ``response_hook``: counts one response."""
        self.requests += 1
        with contextlib.suppress(TypeError, ValueError):
            self.request_charge += float(headers.get("x-ms-request-charge", 0) or 0)


class CosmosKV(KVStore):
    """KV store in one Cosmos DB for NoSQL container.

    Build it from a URL (:meth:`from_url`) or around a ready ``azure.cosmos.aio``
    ``CosmosClient`` or ``ContainerProxy`` (:meth:`from_client`; never closed by the
    store). The database and container are created on first use unless ``?create=false``.
    """

    backend_name: ClassVar[str] = "cosmos"
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
        emulator: str | None = None,
        display: str = "cosmos",
        clock: Clock | None = None,
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
        self.emulator = emulator
        self._display = display
        self._ready_lock: asyncio.Lock | None = None
        self._credential: Any = None  # an Entra ID credential the store created
        self._secrets = [s for s in (settings.key if settings else None,) if s]
        self.stats = RequestStats()
        # The test server runs batches one operation at a time: never call that atomic.
        self.capabilities = KVCapabilities(commit=False, shared_across_processes=True)
        self._read_headers: dict[str, str] = {_CROSS_PARTITION: "true"} if emulator else {}

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
            emulator=settings.emulator,
            display=settings.describe(),
            clock=clock,
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
        emulator: str | None = None,
        clock: Clock | None = None,
    ) -> CosmosKV:
        """Wrap a ready ``azure.cosmos.aio.CosmosClient`` (give ``database`` and ``container``)
        or ``ContainerProxy``. The client stays yours: the store never closes it.
        """
        from azure.cosmos.aio import ContainerProxy, CosmosClient

        if isinstance(client, ContainerProxy):
            return cls(
                prefix=prefix,
                container=client,
                emulator=emulator,
                display=f"cosmos (container {client.id!r})",
                clock=clock,
            )
        if isinstance(client, CosmosClient):
            if not database or not container:
                raise ConfigError(
                    detail="a CosmosClient needs database=… and container=… options "
                    "(or pass a ContainerProxy)"
                )
            return cls(
                prefix=prefix,
                client=client,
                database=database,
                container_name=container,
                create=create,
                emulator=emulator,
                display=f"cosmos (client, {database}/{container})",
                clock=clock,
            )
        raise ConfigError(
            detail=f"expected an azure.cosmos.aio CosmosClient or ContainerProxy, got "
            f"{type(client).__module__}.{type(client).__name__} (the synchronous "
            "azure.cosmos client is not supported: use azure.cosmos.aio)"
        )

    def describe(self) -> str:
        return f"{self._display} [prefix {self.prefix}]"

    # -- plumbing -----------------------------------------------------------------------

    def _build_client(self) -> CosmosClient:
        from azure.cosmos.aio import CosmosClient

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
        return CosmosClient(
            settings.endpoint,
            credential=credential,
            enable_endpoint_discovery=settings.endpoint_discovery,
            connection_timeout=settings.timeout,
            retry_throttle_total=max(1, settings.throttle_retries),
            retry_throttle_backoff_max=max(1, int(settings.throttle_wait)),
            user_agent_suffix="agent-stores",
        )

    async def _ready(self) -> ContainerProxy:
        """The container, creating client, database and container on first use."""
        self._check_open()
        if self._container is not None:
            return self._container
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            ready: ContainerProxy | None = self._container
            if ready is not None:  # another task finished while this one waited
                return ready
            if self._client is None:
                self._client = self._build_client()
            assert self._database_name is not None and self._container_name is not None
            try:
                container = await self._open_container(self._client)
            except Exception as exc:
                raise self._failure("setup", exc) from exc
            self._container = container
            return container

    async def _open_container(self, client: CosmosClient) -> ContainerProxy:
        from azure.cosmos import PartitionKey
        from azure.cosmos.exceptions import CosmosResourceNotFoundError

        assert self._database_name is not None and self._container_name is not None
        if self._create_missing:
            database = await client.create_database_if_not_exists(
                self._database_name, response_hook=self.stats.hook
            )
            container = await database.create_container_if_not_exists(
                self._container_name,
                partition_key=PartitionKey(path=_PARTITION_PATH, kind="Hash", version=2),
                default_ttl=-1,
                indexing_policy=INDEXING_POLICY,
                response_hook=self.stats.hook,
            )
        else:
            container = client.get_database_client(self._database_name).get_container_client(
                self._container_name
            )
        try:
            properties = await container.read(response_hook=self.stats.hook)
        except CosmosResourceNotFoundError:
            raise ConfigError(
                detail=f"{self.describe()}: container {self._database_name}/"
                f"{self._container_name} does not exist (create it with partition key "
                f"{_PARTITION_PATH}, or drop ?create=false)"
            ) from None
        self._check_layout(properties)
        return container

    def _check_layout(self, properties: Mapping[str, Any]) -> None:
        paths = list((properties.get("partitionKey") or {}).get("paths") or [])
        if paths != [_PARTITION_PATH]:
            raise ConfigError(
                detail=f"{self.describe()}: the container is partitioned on {paths}; "
                f"agent-stores needs partition key path {_PARTITION_PATH}"
            )

    async def setup(self) -> None:
        """Connect, create database and container if allowed, and check the partition key."""
        container = await self._ready()
        if self._settings is None and self._client is None:
            # A ContainerProxy handed in: check its layout once.
            try:
                properties = await container.read(response_hook=self.stats.hook)
            except Exception as exc:
                raise self._failure("setup", exc) from exc
            self._check_layout(properties)

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
        if isinstance(exc, CosmosHttpResponseError):
            status = exc.status_code
            if status == 429:
                return BackendUnavailableError(
                    detail=f"{where}: request rate too large (HTTP 429) after the SDK's "
                    "throttling retries; raise the container's throughput or ?throttle_wait="
                )
            if status in (401, 403):
                return BackendUnavailableError(
                    detail=f"{where}: the account refused the credentials (HTTP {status}); "
                    "check the key, or the RBAC role 'Cosmos DB Built-in Data Contributor'"
                )
            message = self._scrub(str(exc.message or "").splitlines()[0] if exc.message else "")
            return BackendUnavailableError(
                detail=f"{where}: HTTP {status} {message[:200]}".rstrip()
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
            # Unique per write: lets a create recognise its own item.
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
            item = await container.read_item(
                layout.item_id(key),
                partition_key=self._pk(scope),
                headers=self._read_headers,
                response_hook=self.stats.hook,
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

    async def _get(self, scope: str, key: str) -> Entry | None:
        item = await self._read_item(scope, key)
        if item is None:
            return None
        return self._entry(item, scope, item["k"])

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        container = await self._ready()
        pk = self._pk(scope)
        wanted = {layout.to_hex(k): k for k in keys}
        try:
            items = await container.read_items(
                [(layout.item_id(k), pk) for k in keys], response_hook=self.stats.hook
            )
        except Exception as exc:
            raise self._failure("get_many", exc) from exc
        out: dict[str, Entry] = {}
        for item in items:
            key = wanted.get(item.get("k", ""))
            if key is not None and item.get("pk") == pk:
                out[key] = self._entry(item, scope, item["k"])
        return out

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
        for _ in range(CREATE_ATTEMPTS):
            try:
                created = await container.create_item(doc, response_hook=self.stats.hook)
                return self._version(created)
            except CosmosResourceExistsError:
                pass
            except Exception as exc:
                raise self._failure("create", exc) from exc
            existing = await self._read_item(scope, key)
            if existing is None:
                continue  # deleted since the 409: create again
            if existing.get("w") == doc["w"]:
                return self._version(existing)
            if self._live(existing, now):
                raise ConflictError("key exists", scope=scope, key=key)
            # Expired: take it over only while it is still exactly the item we judged.
            try:
                replaced = await container.replace_item(
                    doc["id"],
                    doc,
                    etag=existing["_etag"],
                    match_condition=MatchConditions.IfNotModified,
                    response_hook=self.stats.hook,
                )
                return self._version(replaced)
            except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError):
                continue
            except Exception as exc:
                raise self._failure("create", exc) from exc
        raise ConflictError("key keeps changing", scope=scope, key=key)

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
        try:
            replaced = await container.replace_item(
                doc["id"],
                doc,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
                response_hook=self.stats.hook,
            )
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError):
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
        try:
            await container.delete_item(
                layout.item_id(key),
                partition_key=self._pk(scope),
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
                response_hook=self.stats.hook,
            )
        except (CosmosAccessConditionFailedError, CosmosResourceNotFoundError):
            return False
        except Exception as exc:
            raise self._failure("delete", exc) from exc
        return True

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
        try:
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
        except Exception as exc:
            raise self._failure(action, exc) from exc

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

    async def _drop_scope(self, scope: str) -> int:
        from azure.cosmos.exceptions import CosmosResourceNotFoundError

        container = await self._ready()
        pk = self._pk(scope)
        gate = asyncio.Semaphore(DROP_CONCURRENCY)

        async def remove(item_id: str) -> int:
            async with gate:
                try:
                    await container.delete_item(
                        item_id, partition_key=pk, response_hook=self.stats.hook
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


def _pop_clock(options: dict[str, Any]) -> Clock | None:
    clock: Any = options.pop("clock", None)
    if options:
        raise ConfigError(detail=f"unknown option(s) for the cosmos backend: {sorted(options)}")
    if clock is not None and not callable(clock):
        raise ConfigError(detail="clock must be a callable returning unix seconds")
    return cast("Clock | None", clock)


__all__ = ["INDEXING_POLICY", "CosmosKV", "RequestStats"]
