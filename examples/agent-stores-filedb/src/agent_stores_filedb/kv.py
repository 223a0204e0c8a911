"""The KV store: ``filedb:///PATH``, a folder of files on disk, one file per scope.

The storage model: the folder ``PATH`` holds one file per *scope* (named by the SHA-256 of
the scope's name, which the file holds too), with that scope's entries as a dict ``key ->
(value, version, expires_at)``. Every request (a KV primitive, a port operation) is one
:class:`Transaction`: it takes the folder's lock (``flock`` on ``PATH/lock``), reads the
scopes it needs, and writes back the scopes it changed (each to a temporary file, then
``os.replace``) only if the operation returned, so an operation that raises writes
nothing. Any number of clients in any number of processes share one folder: the lock
orders their requests, and the operating system releases it when a process dies.

The lock and the files are blocking calls, so each request runs in a worker thread
(``asyncio.to_thread``); a cancelled call (its deadline passed) may still be applied, as
a request whose reply was lost.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import pickle
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

from agent_stores.backend import (
    DEFAULT_DEADLINE_SECONDS,
    BackendUnavailableError,
    ConfigError,
    ConflictError,
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
    URLOption,
    URLOptions,
    check_options,
    new_version,
)

T = TypeVar("T")

#: One stored entry: its value, version and absolute expiry (None: never expires).
Record = tuple[bytes, str, float | None]

URL_OPTIONS = URLOptions(
    URLOption("deadline", "float", DEFAULT_DEADLINE_SECONDS, "the most one call may take, s"),
    URLOption.auto_setup(True, "the folder (free: a local folder)"),
)

#: A scope's file: ``scopes/<sha256 of the name>``.
SUFFIX = ".scope"


class Transaction:
    """One request's view of the folder, under its lock.

    A scope is read whole (one file) the first time the operation asks for it;
    :meth:`flush` writes back the scopes it changed, deleting the files of those left empty.
    """

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._loaded: dict[str, dict[str, Record]] = {}
        self._changed: set[str] = set()

    def _file(self, scope: str) -> Path:
        return self._folder / (hashlib.sha256(scope.encode()).hexdigest() + SUFFIX)

    def entries(self, scope: str) -> dict[str, Record]:
        """Every stored entry of ``scope`` (expired ones too), as a dict the operation may
        change through :meth:`put` and :meth:`remove`."""
        found = self._loaded.get(scope)
        if found is None:
            found = self._loaded[scope] = _read(self._file(scope))[1]
        return found

    def live(self, scope: str, key: str, now: float) -> Entry | None:
        """The entry at ``(scope, key)`` unless absent or expired at ``now``."""
        record = self.entries(scope).get(key)
        if record is None or (record[2] is not None and record[2] <= now):
            return None
        return Entry(record[0], record[1], record[2])

    def put(self, scope: str, key: str, value: bytes, expires_at: float | None) -> str:
        """Write ``value`` under a fresh version; returns the version."""
        version = new_version()
        self.entries(scope)[key] = (bytes(value), version, expires_at)
        self._changed.add(scope)
        return version

    def remove(self, scope: str, key: str) -> None:
        if self.entries(scope).pop(key, None) is not None:
            self._changed.add(scope)

    def drop(self, scope: str) -> int:
        """Remove every entry of ``scope``; how many there were."""
        count = len(self.entries(scope))
        self._loaded[scope] = {}
        self._changed.add(scope)
        return count

    def scope_names(self) -> list[str]:
        """Every scope holding a stored entry, in code point (= UTF-8 byte) order. Reads every
        scope's file: for the admin listing only."""
        names = []
        for path in self._folder.glob(f"*{SUFFIX}"):
            scope, entries = _read(path)
            if entries:
                names.append(scope)
                self._loaded.setdefault(scope, entries)
        return sorted(names)

    def flush(self) -> None:
        for scope in self._changed:
            path, entries = self._file(scope), self._loaded[scope]
            if not entries:
                path.unlink(missing_ok=True)
                continue
            temporary = path.with_suffix(".tmp")
            temporary.write_bytes(pickle.dumps((scope, entries), pickle.HIGHEST_PROTOCOL))
            os.replace(temporary, path)  # readers see the old file or the new one, whole


def _read(path: Path) -> tuple[str, dict[str, Record]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return "", {}
    return cast("tuple[str, dict[str, Record]]", pickle.loads(data))


class Folder:
    """The "server": the folder at ``path`` and its lock, one request at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path / "lock"

    def run(self, operation: Callable[[Transaction], T]) -> T:
        """``operation`` in one transaction: all of its writes, or none if it raises."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            with open(self.lock_path, "ab") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released by close, or by the process' death
                transaction = Transaction(self.path)
                result = operation(transaction)
                transaction.flush()
                return result
        except OSError as exc:
            raise BackendUnavailableError(detail=f"filedb://{self.path}: {exc}") from exc


#: How often a request refused as busy is sent again before BackendUnavailableError.
BUSY_RETRIES = 4


class FolderBusyError(Exception):
    """The request was refused before it was applied (the lock could not be had in time):
    the client sends it again, within its budget."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request a client sends: what a fault injector sees."""

    #: ``kv.get``, ``kv.create``, …, ``sessions.acquire``, ``memory.write``, …
    operation: str
    #: False for a request that only reads
    writes: bool


class Transport(Protocol):
    """Sees each request on its way: ``send()`` runs it; a fault injector wraps it."""

    def __call__(self, request: Request, send: Callable[[], Awaitable[T]]) -> Awaitable[T]: ...


class FileKV(KVStore):
    """A KV store in the folder ``path``, shared by every process that opens it."""

    backend_name = "filedb"
    url_options = URL_OPTIONS
    limits = KVLimits(max_value_bytes=1 << 20)
    capabilities = KVCapabilities(commit=True, shared_across_processes=True)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        deadline_seconds: float | None = DEFAULT_DEADLINE_SECONDS,
        auto_setup: bool = True,
        transport: Transport | None = None,
    ) -> None:
        super().__init__()
        self.folder = Folder(Path(path))
        self.deadline_seconds = deadline_seconds
        self._auto_setup = auto_setup
        self.transport = transport

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> FileKV:
        check_options("filedb", options, "transport")
        URL_OPTIONS.check(url)
        if url.host or not url.path.startswith("/") or url.path.endswith("/"):
            raise ConfigError(
                detail=f"{url}: expected filedb:///ABSOLUTE/PATH/OF/A/FOLDER (no host)"
            )
        return cls(
            url.path,
            deadline_seconds=url.float_option("deadline", DEFAULT_DEADLINE_SECONDS, minimum=0.1),
            auto_setup=url.bool_option("auto_setup", True),
            **options,
        )

    def describe(self) -> str:
        return f"filedb://{self.folder.path}"

    @property
    def auto_setup(self) -> bool:
        return self._auto_setup

    async def setup(self) -> None:
        await asyncio.to_thread(self.folder.run, lambda transaction: None)

    async def execute(self, operation: str, run: Callable[[Transaction], T], *, writes: bool) -> T:
        """One request: ``run`` inside one transaction, in a worker thread (through the
        transport, when one is set)."""

        async def send() -> T:
            return await asyncio.to_thread(self.folder.run, run)

        if self.transport is None:
            return await send()
        for attempt in range(BUSY_RETRIES):
            try:
                return await self.transport(Request(operation, writes), send)
            except FolderBusyError:  # refused before it was applied: safe to send again
                await asyncio.sleep(0.005 * 2**attempt)
        try:
            return await self.transport(Request(operation, writes), send)
        except FolderBusyError as exc:
            raise BackendUnavailableError(detail=f"{self.describe()}: {exc}") from exc

    # -- the KV primitives: one request each -----------------------------------------------

    async def _get(self, scope: str, key: str) -> Entry | None:
        def get(tx: Transaction) -> Entry | None:
            record = tx.entries(scope).get(key)
            return None if record is None else Entry(*record)

        return await self.execute("kv.get", get, writes=False)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        def get_many(tx: Transaction) -> dict[str, Entry]:
            entries = tx.entries(scope)
            return {key: Entry(*entries[key]) for key in keys if key in entries}

        return await self.execute("kv.get_many", get_many, writes=False)

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        def create(tx: Transaction) -> str:
            if tx.live(scope, key, now) is not None:
                raise ConflictError("the key exists", scope=scope, key=key)
            return tx.put(scope, key, value, expires_at)

        return await self.execute("kv.create", create, writes=True)

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        def replace(tx: Transaction) -> str:
            current = tx.live(scope, key, now)
            if current is None or current.version != expected_version:
                raise ConflictError("the key is not at the expected version", scope=scope, key=key)
            return tx.put(scope, key, value, expires_at)

        return await self.execute("kv.replace", replace, writes=True)

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        def delete(tx: Transaction) -> bool:
            current = tx.live(scope, key, now)
            if current is None:
                tx.remove(scope, key)  # an expired leftover goes, but counts as absent
                return False
            if expected_version is not None and current.version != expected_version:
                return False
            tx.remove(scope, key)
            return True

        return await self.execute("kv.delete", delete, writes=True)

    async def _scan(
        self,
        scope: str,
        prefix: str,
        start_after: str | None,
        limit: int,
        values: bool,
        now: float,
    ) -> list[ScanItem]:
        def scan(tx: Transaction) -> list[ScanItem]:
            keys = sorted(
                key
                for key, (_, _, expires_at) in tx.entries(scope).items()
                if key.startswith(prefix)
                and (start_after is None or key > start_after)
                and (expires_at is None or expires_at > now)
            )[:limit]
            if not values:
                return [ScanItem(key, None) for key in keys]
            return [ScanItem(key, tx.live(scope, key, now)) for key in keys]

        return await self.execute("kv.scan", scan, writes=False)

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        def scopes(tx: Transaction) -> list[str]:
            found: list[str] = []
            for scope in tx.scope_names():
                if len(found) >= limit:
                    break
                if not scope.startswith(prefix) or (
                    start_after is not None and scope <= start_after
                ):
                    continue
                if any(e is None or e > now for _, _, e in tx.entries(scope).values()):
                    found.append(scope)
            return found

        return await self.execute("kv.scopes", scopes, writes=False)

    async def _drop_scope(self, scope: str) -> int:
        return await self.execute("kv.drop_scope", lambda tx: tx.drop(scope), writes=True)

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        # Relative TTLs (the commit contract): absolute expiries computed before sending.
        expiries = [
            self.expires_at(op.ttl, now) if isinstance(op, Create | Replace) else None for op in ops
        ]

        def commit(tx: Transaction) -> list[str | None]:
            for index, op in enumerate(ops):  # every condition first
                current = tx.live(scope, op.key, now)
                if isinstance(op, Create):
                    failed = current is not None
                elif isinstance(op, Replace):
                    failed = current is None or current.version != op.expected_version
                elif isinstance(op, Delete) and op.expected_version is None:
                    failed = False
                else:  # a Check, or a conditional Delete
                    held = None if current is None else current.version
                    failed = held != op.expected_version
                if failed:
                    raise ConflictError("a condition failed", scope=scope, key=op.key, index=index)
            results: list[str | None] = []
            for op, expires_at in zip(ops, expiries, strict=True):
                if isinstance(op, Create | Replace):
                    results.append(tx.put(scope, op.key, op.value, expires_at))
                else:
                    if isinstance(op, Delete):
                        tx.remove(scope, op.key)
                    results.append(None)
            return results

        return await self.execute("kv.commit", commit, writes=True)

    async def purge_expired(self) -> int:
        self.check_open()
        now = self.clock()

        def purge(tx: Transaction) -> int:
            removed = 0
            for scope in tx.scope_names():
                for key, (_, _, expires_at) in list(tx.entries(scope).items()):
                    if expires_at is not None and expires_at <= now:
                        tx.remove(scope, key)
                        removed += 1
            return removed

        return await self.execute("kv.purge_expired", purge, writes=True)


__all__ = ["FileKV", "Folder", "FolderBusyError", "Request", "Transaction", "Transport"]
