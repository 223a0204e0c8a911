"""``dictdb://NAME``: the example's KV store, a Python dict standing in for a database server.

Every client opened on the same NAME in one process shares one :class:`Database` (the
"server"). A request to it, :meth:`DictKV.execute`, runs a function on the database under
its lock, in one step, as a server runs a statement or a script: that is what makes each
KV primitive, and each native port operation, atomic. ``execute`` is also the client's
transport: the fault injector (``faults.py``) breaks requests there, and the client
retries what was never applied, as a real client retries a throttled or reset request.
"""

from __future__ import annotations

import asyncio
import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from agent_stores.backend import (
    DEFAULT_DEADLINE_SECONDS,
    BackendUnavailableError,
    BaseFaultInjector,
    ConfigError,
    ConflictError,
    Create,
    Delete,
    Entry,
    FaultKind,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
    StoreURL,
    check_options,
    new_version,
)

T = TypeVar("T")

DEFAULT_MAX_VALUE_BYTES = 1 << 20
#: How often a request that was never applied (unavailable, reset) is sent before the
#: call fails with BackendUnavailableError.
ATTEMPTS = 6


class Database:
    """One database: scope -> key -> :class:`Entry`, plus sorted key and scope lists for
    ordered scans. Touched only under ``lock``, through :meth:`DictKV.execute`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, dict[str, Entry]] = {}
        self.sorted_keys: dict[str, list[str]] = {}
        self.sorted_scopes: list[str] = []

    def stored(self, scope: str, key: str) -> Entry | None:
        """The entry as stored, expired or not."""
        entries = self.entries.get(scope)
        return None if entries is None else entries.get(key)

    def live(self, scope: str, key: str, now: float) -> Entry | None:
        """The entry unless it is absent or expired at ``now``."""
        entry = self.stored(scope, key)
        return None if entry is None or entry.expired(now) else entry

    def put(self, scope: str, key: str, value: bytes, expires_at: float | None) -> str:
        """Write unconditionally (callers check their conditions first); the new version."""
        entries = self.entries.get(scope)
        if entries is None:
            entries = self.entries[scope] = {}
            self.sorted_keys[scope] = []
            insort(self.sorted_scopes, scope)
        if key not in entries:
            insort(self.sorted_keys[scope], key)
        version = new_version()
        entries[key] = Entry(bytes(value), version, expires_at)
        return version

    def remove(self, scope: str, key: str) -> None:
        entries = self.entries.get(scope)
        if entries is None or entries.pop(key, None) is None:
            return
        keys = self.sorted_keys[scope]
        del keys[bisect_left(keys, key)]
        if not entries:
            self.drop(scope)

    def drop(self, scope: str) -> int:
        entries = self.entries.pop(scope, None)
        if entries is None:
            return 0
        del self.sorted_keys[scope]
        del self.sorted_scopes[bisect_left(self.sorted_scopes, scope)]
        return len(entries)

    def scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[tuple[str, Entry]]:
        """Up to ``limit`` live entries from where the range starts, never the whole scope."""
        keys = self.sorted_keys.get(scope, [])
        entries = self.entries.get(scope, {})
        position = bisect_left(keys, prefix)
        if start_after is not None:
            position = max(position, bisect_right(keys, start_after))
        found: list[tuple[str, Entry]] = []
        while position < len(keys) and len(found) < limit:
            key = keys[position]
            if not key.startswith(prefix):
                break
            entry = entries[key]
            if not entry.expired(now):
                found.append((key, entry))
            position += 1
        return found

    def scopes(self, prefix: str, start_after: str | None, limit: int, now: float) -> list[str]:
        position = bisect_left(self.sorted_scopes, prefix)
        if start_after is not None:
            position = max(position, bisect_right(self.sorted_scopes, start_after))
        found: list[str] = []
        while position < len(self.sorted_scopes) and len(found) < limit:
            scope = self.sorted_scopes[position]
            if not scope.startswith(prefix):
                break
            if any(not entry.expired(now) for entry in self.entries[scope].values()):
                found.append(scope)
            position += 1
        return found


_DATABASES: dict[str, Database] = {}
_DATABASES_LOCK = threading.Lock()


def database(name: str) -> Database:
    """The database called ``name`` in this process (made on first use)."""
    with _DATABASES_LOCK:
        return _DATABASES.setdefault(name, Database())


def _holds(op: Operation, current: Entry | None) -> bool:
    """Does a commit operation's condition hold on the key's live entry?"""
    version = None if current is None else current.version
    if isinstance(op, Create):
        return current is None
    if isinstance(op, Replace):
        return version is not None and version == op.expected_version
    if isinstance(op, Delete):
        return op.expected_version is None or version == op.expected_version
    return version == op.expected_version  # Check: None means "absent"


class DictKV(KVStore):
    """A client of the database named by the URL's host."""

    backend_name = "dictdb"
    # A dict lives in one process: a second process opening the same URL sees other data,
    # so the contract skips its multi-process tests, as it does for memory://.
    capabilities = KVCapabilities(commit=True, shared_across_processes=False)

    def __init__(self, name: str, *, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        super().__init__()
        self.name = name
        self.database = database(name)
        self.limits = KVLimits(max_value_bytes=max_value_bytes)
        #: the fault injector breaking this client's requests (set by DictFaultInjector.open_kv)
        self.injector: BaseFaultInjector | None = None

    @classmethod
    def from_url(cls, url: StoreURL, **options: object) -> DictKV:
        """``dictdb://NAME[?max_value_bytes=N&deadline=SECONDS]``."""
        check_options("dictdb://", options)
        url.check_query("max_value_bytes", "deadline")
        if not url.host or url.path.strip("/"):
            raise ConfigError(detail=f"{url}: expected dictdb://NAME (a database name, no path)")
        max_value = url.int_option("max_value_bytes", DEFAULT_MAX_VALUE_BYTES)
        kv = cls(url.host, max_value_bytes=max_value)
        kv.deadline_seconds = url.float_option("deadline", DEFAULT_DEADLINE_SECONDS, minimum=0.001)
        return kv

    def describe(self) -> str:
        return f"dictdb://{self.name}"

    async def execute(self, request: str, operation: Callable[[Database], T], *, writes: bool) -> T:
        """One request to the database: ``operation`` runs under its lock, in one step.

        ``request`` names it (the fault injector's operation names); ``writes`` says whether
        it may change anything (only a write can lose its reply after it was applied).
        Like a network round trip, a request first lets other tasks run, so clients'
        requests interleave as they would against a server.
        """
        for attempt in range(ATTEMPTS):
            await asyncio.sleep(0 if attempt == 0 else 0.001 * 2**attempt)
            fault = self.fault(request, writes)
            if fault in (FaultKind.TRANSIENT, FaultKind.RESET):
                continue  # never applied: safe to send again
            with self.database.lock:
                result = operation(self.database)
            if fault is FaultKind.LOST_REPLY:
                # Applied, but the client cannot know: the caller must find out (never resent).
                raise BackendUnavailableError(
                    detail=f"{self.describe()}: the reply to {request} was lost"
                )
            return result
        raise BackendUnavailableError(
            detail=f"{self.describe()}: {request} failed {ATTEMPTS} times (unavailable)"
        )

    def fault(self, request: str, writes: bool) -> FaultKind | None:
        """The kind of fault the injector (if any) puts on this request."""
        injector = self.injector
        if injector is None:
            return None
        eligible = (
            None
            if writes
            else [
                name for name, kind in injector.faults.items() if kind is not FaultKind.LOST_REPLY
            ]
        )
        name = injector.next_fault(request, eligible=eligible)
        return None if name is None else injector.faults[name]

    # -- the KV primitives (docs/kv.md) ----------------------------------------------------

    async def _get(self, scope: str, key: str) -> Entry | None:
        return await self.execute("get", lambda db: db.stored(scope, key), writes=False)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        def read(db: Database) -> dict[str, Entry]:
            found = {key: db.stored(scope, key) for key in keys}
            return {key: entry for key, entry in found.items() if entry is not None}

        return await self.execute("get_many", read, writes=False)

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        def create(db: Database) -> str:
            if db.live(scope, key, now) is not None:
                raise ConflictError("the key exists", scope=scope, key=key)
            return db.put(scope, key, value, expires_at)

        return await self.execute("create", create, writes=True)

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        def replace(db: Database) -> str:
            current = db.live(scope, key, now)
            if current is None or current.version != expected_version:
                raise ConflictError("the key is not at the expected version", scope=scope, key=key)
            return db.put(scope, key, value, expires_at)

        return await self.execute("replace", replace, writes=True)

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        def delete(db: Database) -> bool:
            current = db.live(scope, key, now)
            if current is None:
                db.remove(scope, key)  # an expired leftover goes, but counts as absent
                return False
            if expected_version is not None and current.version != expected_version:
                return False
            db.remove(scope, key)
            return True

        return await self.execute("delete", delete, writes=True)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        found = await self.execute(
            "scan", lambda db: db.scan(scope, prefix, start_after, limit, now), writes=False
        )
        return [ScanItem(key, entry if values else None) for key, entry in found]

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        return await self.execute(
            "scopes", lambda db: db.scopes(prefix, start_after, limit, now), writes=False
        )

    async def _drop_scope(self, scope: str) -> int:
        return await self.execute("drop_scope", lambda db: db.drop(scope), writes=True)

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        # Every TTL is turned into an expiry (which refuses a bad one) before anything is
        # written, so a refused commit writes nothing.
        expiries = [
            self.expires_at(op.ttl, now) if isinstance(op, Create | Replace) else None for op in ops
        ]

        def commit(db: Database) -> list[str | None]:
            for index, op in enumerate(ops):
                if not _holds(op, db.live(scope, op.key, now)):
                    raise ConflictError(
                        f"operation {index} ({type(op).__name__}) failed",
                        scope=scope,
                        key=op.key,
                        index=index,
                    )
            versions: list[str | None] = []
            for op, expires_at in zip(ops, expiries, strict=True):
                if isinstance(op, Create | Replace):
                    versions.append(db.put(scope, op.key, op.value, expires_at))
                    continue
                if isinstance(op, Delete):
                    db.remove(scope, op.key)
                versions.append(None)
            return versions

        return await self.execute("commit", commit, writes=True)

    async def purge_expired(self) -> int:
        now = self.clock()

        def purge(db: Database) -> int:
            expired = [
                (scope, key)
                for scope, entries in db.entries.items()
                for key, entry in entries.items()
                if entry.expired(now)
            ]
            for scope, key in expired:
                db.remove(scope, key)
            return len(expired)

        return await self.execute("purge_expired", purge, writes=True)
