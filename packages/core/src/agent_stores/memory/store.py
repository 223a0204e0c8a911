"""``KVMemoryStore``: the harness memory protocols on any KV CAS backend.

A write and its operation receipt are one compare-and-swap on the file's record, so a
write that landed is always known to have landed: retried with the same operation after
a lost acknowledgement, it is replayed, never reported as a conflict, and a crash
between any two steps leaves nothing half-reserved. The global receipt index, which
:meth:`KVMemoryStore.get_operation` reads, is written right after the CAS and repaired
by the next replay if that write was lost. On an atomic port (one transaction for record
and index) the receipt lives in the index entry alone. See ``_records`` for the layout.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import telemetry
from ..damage import ProblemLog, quarantine
from ..errors import (
    BackendUnavailableError,
    ConflictError,
    CorruptRecordError,
    ValueTooLargeError,
)
from ..kv.base import Entry, KVStore, new_version
from ..lifecycle import KVBackedStore
from ..options import UNSET, renamed_option
from ..subjects import DEFAULT_SUBJECT_PREFIX, SubjectEntry, SubjectIndex
from ..url import redact
from . import _harness
from ._harness import validate_store_path, validate_store_prefix
from ._records import (
    CHUNK_PREFIX,
    INTERNAL_KEY_MARK,
    MARKER_SUFFIX,
    FileRecord,
    IndexEntry,
    Receipt,
    content_chunk_key,
    decode_text,
    digest,
    encode_text,
    index_entry_value,
    metadata_chunk_key,
    parse_chunk_key,
    split_utf8,
)
from .port import FileWrite, IndexWrite, KVMemoryPort, MemoryPort
from .semantic import (
    IndexedFile,
    ReindexReport,
    SearchConfig,
    SearchMode,
    SemanticIndex,
    ToEmbed,
    cut_snippet,
    reciprocal_rank_fusion,
)
from .vector_port import NearestFiles, VectorEntry, VectorHit, VectorPort
from .vectors import VECTOR_PREFIX

if TYPE_CHECKING:
    # At run time these are looked up on ``_harness`` when used, which imports the
    # harness (and Pydantic AI) only then: listing paths needs neither.
    from ._harness import (
        MemoryFile,
        MemoryMutation,
        MemoryOperation,
        MemoryOperationConflictError,
        MemorySearchMatch,
        MemorySearchResult,
    )
    from .passages import Passage

logger = logging.getLogger(__name__)

DEFAULT_SCOPE_PREFIX = "memory:"
DEFAULT_RECEIPT_TTL = 7 * 24 * 3600.0
DEFAULT_MAX_RECEIPTS_PER_FILE = 32
DEFAULT_PAGE_SIZE = 256
DEFAULT_CHUNK_GRACE = 3600.0
MIN_RECORD_BYTES = 1024

# A CAS that loses to a concurrent writer re-reads; each lost round means the file changed,
# which the next round reports as MemoryConflictError unless only receipts on a tombstone moved.
_MAX_CAS_ROUNDS = 64
# A reader that finds the chunks of the version it read already replaced re-reads the record.
_MAX_READ_ROUNDS = 16
#: Indexings of written files one store runs at once (the others wait their turn).
_INDEXING_CONCURRENCY = 4
#: Times a native search brings the vector index up to date and asks it, before the
#: generic path answers (only concurrent writes to the files found make it ask again).
_NATIVE_ROUNDS = 3
# Paths whose last seen record a store remembers (for writes without a read first), and
# the bytes of those records' encodings at most: a store serving many users must not grow
# with them. A record larger than a sixteenth of the bytes is not kept (its write reads first).
_KNOWN_RECORDS = 4096
_KNOWN_BYTES = 16 << 20
# Directories whose markers a store remembers having written; past this many it starts
# over (a forgotten directory costs its marker checks once more, in the same commit).
_KNOWN_DIRS = 65536


@dataclass(frozen=True, slots=True)
class MemoryRetention:
    """What :meth:`KVMemoryStore.purge_older_than` deleted."""

    removed: tuple[str, ...]
    """Paths deleted."""
    scanned: int
    """Files looked at."""
    undated: int
    """Files kept because their record holds no write time (written by a version of this
    library before records carried one, inline and without receipts)."""


@dataclass(frozen=True, slots=True)
class NamespaceErasure:
    """What :meth:`KVMemoryStore.erase_namespace` removed and read back."""

    namespace: str
    scopes: int
    """Directory scopes dropped (the namespace's and every one below it)."""
    receipts: int
    """Receipt index entries of its paths deleted."""
    entries_left: int
    """Entries found in those scopes, and paths listed, afterwards; 0: complete."""


@dataclass(frozen=True, slots=True)
class _Location:
    path: str
    directory: str
    name: str
    scope: str


@dataclass(slots=True)
class _Staged:
    """Chunks of one write, created before the CAS and reused by its retries."""

    token: str
    content_sizes: list[int]
    content_pieces: list[bytes]
    metadata_pieces: list[bytes]
    content_written: bool = False
    metadata_written: bool = False


@dataclass(slots=True)  # not frozen: one per call, and frozen fields cost ~0.1 µs each to set
class _Request:
    """What a write or delete asks for."""

    content: str | None
    metadata: str | None
    expected_version: str | None
    operation: MemoryOperation | None
    delete: bool


@dataclass(slots=True)
class _Attempt:
    """The chunks a mutation staged and whether its record landed: a refused mutation
    deletes its chunks, a landed one must keep them."""

    staged: _Staged | None = None
    landed: bool = False


@dataclass(frozen=True, slots=True)
class _Shape:
    """Which parts of a file its record lists as chunks instead of holding inline."""

    content: bool
    metadata: bool

    @property
    def chunked(self) -> bool:
        return self.content or self.metadata


# Cheapest first: all inline, then the content in chunks, then the metadata too.
_SHAPES = (
    _Shape(content=False, metadata=False),
    _Shape(content=True, metadata=False),
    _Shape(content=True, metadata=True),
)


class KVMemoryStore(KVBackedStore):
    """A ``pydantic_ai_harness.memory`` store on a :class:`~agent_stores.kv.KVStore`.

    Satisfies ``MemoryStore``, ``SearchableMemoryStore`` and ``MetadataMemoryStore``, so
    ``Memory(store=KVMemoryStore(kv), namespace=...)`` works unchanged.

    Args:
        kv: the KV store holding the files.
        owns_kv: close ``kv`` in :meth:`aclose`.
        scope_prefix: prepended to every KV scope this store uses, so several memory stores
            (or other stores) can share one KV store.
        receipt_ttl_seconds: seconds an operation receipt is kept for replay; tombstones
            and index entries expire after it, and older receipts are dropped from file
            records (``receipt_ttl`` is its deprecated name).
        max_receipts_per_file: receipts a file record keeps (the newest ones).
        max_record_bytes: cap on one KV value, below the backend's own limit; larger files
            are split into chunks, never truncated.
        page_size: keys read per scan page.
        chunk_grace_seconds: seconds before an unreferenced chunk (left by a crash) may be
            collected by :meth:`collect_garbage` (``chunk_grace`` is its deprecated name).
        port: the backend's native :class:`~agent_stores.memory.port.MemoryPort` (record,
            receipt index and directory markers in one transaction). None: the one a
            plugin's ``memory_port`` hook offers for ``kv``, else the generic
            :class:`~agent_stores.memory.port.KVMemoryPort`.
        search: how :meth:`search` ranks files (:class:`~agent_stores.memory.SearchConfig`);
            None: lexically, as the harness's own stores do. With a semantic or hybrid
            mode, each written version's passages are embedded after its commit.
        subject_of: whose files these are (:mod:`agent_stores.subjects`): given a path,
            ``(namespace, subject)`` (the namespace a path prefix ending in ``/``) or None.
            Every write and delete of a path with a subject first checks the subject is
            not being erased (one read) and records the namespace under the subject, so
            ``erase_subject`` finds it. ``agent_stores.subjects.namespace_subject()``: the
            first path segment (the harness's namespace) is the subject.
        subject_prefix: the scope prefix of the per-subject scopes (shared with the other
            stores of the same KV store).
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        owns_kv: bool = False,
        scope_prefix: str = DEFAULT_SCOPE_PREFIX,
        receipt_ttl_seconds: float = DEFAULT_RECEIPT_TTL,
        max_receipts_per_file: int = DEFAULT_MAX_RECEIPTS_PER_FILE,
        max_record_bytes: int | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        chunk_grace_seconds: float = DEFAULT_CHUNK_GRACE,
        receipt_ttl: float = UNSET,
        chunk_grace: float = UNSET,
        port: MemoryPort | None = None,
        search: SearchConfig | None = None,
        subject_of: Callable[[str], tuple[str, str] | None] | None = None,
        subject_prefix: str = DEFAULT_SUBJECT_PREFIX,
    ) -> None:
        receipt_ttl = renamed_option(
            "KVMemoryStore", "receipt_ttl", receipt_ttl, "receipt_ttl_seconds", receipt_ttl_seconds
        )
        chunk_grace = renamed_option(
            "KVMemoryStore", "chunk_grace", chunk_grace, "chunk_grace_seconds", chunk_grace_seconds
        )
        if not isinstance(scope_prefix, str) or not scope_prefix:
            raise ValueError("scope_prefix must be a non-empty string")
        if receipt_ttl <= 0:
            raise ValueError("receipt_ttl_seconds must be positive")
        if max_receipts_per_file < 1:
            raise ValueError("max_receipts_per_file must be >= 1")
        if max_record_bytes is not None and max_record_bytes < MIN_RECORD_BYTES:
            raise ValueError(f"max_record_bytes must be >= {MIN_RECORD_BYTES}")
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if chunk_grace < 0:
            raise ValueError("chunk_grace_seconds must be >= 0")
        if search is not None and not isinstance(search, SearchConfig):
            raise TypeError(f"search must be a SearchConfig, got {type(search).__name__}")
        if subject_of is not None and not callable(subject_of):
            raise TypeError("subject_of must be a callable: path -> (namespace, subject) or None")
        self.kv = kv
        self._owns_kv = owns_kv
        self._prefix = scope_prefix
        self._receipt_ttl = float(receipt_ttl)
        self._max_receipts = max_receipts_per_file
        limit = kv.limits.max_value_bytes
        self._record_bytes = min(limit, max_record_bytes) if max_record_bytes else limit
        self._page_size = page_size
        self._chunk_grace = float(chunk_grace)
        # Directories whose markers this process has seen written: creating a file in one
        # costs no marker writes after the first time.
        self._known_dirs: set[str] = set()
        self._port: MemoryPort = port or kv.ports.memory or KVMemoryPort(kv)
        # The record last written or read per path, with its KV version: on an atomic port
        # a write that expects it goes straight to the one transaction (no read first).
        self._known: OrderedDict[str, tuple[str, FileRecord, int]] = OrderedDict()
        self._locations: dict[str, _Location] = {}
        self._known_bytes = 0
        #: Records listings and searches skipped because they cannot be decoded.
        self.problems = ProblemLog("memory")
        self._search = search or SearchConfig()
        self._semantic = (
            SemanticIndex(kv, self._search, self.problems) if self._search.semantic else None
        )
        # Indexing after a write runs beside the caller; a search waits for the ones of
        # its directory so it never embeds a version twice.
        self._indexing: dict[asyncio.Task[None], str] = {}
        self._indexing_gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        # Directory scopes whose native index lagged too far (said once each).
        self._backlogged: set[str] = set()
        self._subject_of = subject_of
        self.subjects = SubjectIndex(kv, prefix=subject_prefix)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kv.describe()} prefix={self._prefix!r}>"

    @property
    def port(self) -> MemoryPort:
        """The port reads and writes go through: the backend's native one, or the generic one."""
        return self._port

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Finish the indexing of written files, then close the KV store if this store
        owns it (``owns_kv=True``). Idempotent."""
        await self.wait_indexed()
        if self._owns_kv:
            await self.kv.aclose()

    @property
    def search_config(self) -> SearchConfig:
        """How :meth:`search` ranks files."""
        return self._search

    @property
    def semantic_index(self) -> SemanticIndex | None:
        """The vector index (None when search is lexical)."""
        return self._semantic

    async def wait_indexed(self) -> None:
        """Wait until every file this store wrote has its vectors stored (or its indexing
        failed, which is logged and repaired by the next search or :meth:`reindex`)."""
        while self._indexing:
            await asyncio.gather(*list(self._indexing), return_exceptions=True)

    # -- MemoryStore ----------------------------------------------------------------------

    @telemetry.traced("memory.read")
    async def read(self, path: str, *, max_chars: int) -> MemoryFile | None:
        """The file at ``path`` cut to ``max_chars`` characters (``truncated`` set), or None."""
        loc = self._checked_location(path)
        if max_chars <= 0:
            raise ValueError("max_chars must be positive")
        previous_token: str | None = None
        for _ in range(_MAX_READ_ROUNDS):
            entry = await self._port.read(loc.scope, loc.name)
            if entry is None:
                return None
            known = self._known.get(loc.path)
            if known is not None and known[0] == entry.version:
                # Versions are never reused: the record this store decoded or wrote before.
                record = known[1]
            else:
                decoded = self._decode(entry, loc)
                assert decoded is not None  # entry is not None
                record = decoded
                if record.live:
                    self._remember(loc.path, entry.version, record, len(entry.value))
            if not record.live:
                return None
            if record.content is not None and not record.metadata_chunks:
                # Content and metadata inside the record: nothing more to read.
                content, metadata = record.content[:max_chars], record.metadata
            else:
                fetched = await self._fetch(
                    loc.scope, [(loc.name, record)], max_chars, metadata=True
                )
                if loc.name not in fetched:
                    if record.token == previous_token:
                        raise CorruptRecordError(
                            detail=f"memory file {path!r} (version {record.version}): chunks "
                            f"of its current version are missing or damaged"
                        )
                    previous_token = record.token
                    continue
                content, metadata = fetched[loc.name]
            return _harness.MemoryFile(
                content=content,
                version=str(record.version),
                operation_id=record.operation_id,
                truncated=record.length > max_chars,
                metadata=_harness.decode_metadata(metadata),
            )
        raise BackendUnavailableError(detail=f"memory file {path!r} kept changing while being read")

    @telemetry.traced("memory.get_operation")
    async def get_operation(self, operation: MemoryOperation) -> MemoryMutation | None:
        """The result of a completed ``operation`` (``replayed=True``), or None if unknown.

        Raises ``MemoryOperationConflictError`` when the id was used with another fingerprint.
        """
        _check_operation(operation)
        entry = await self._get_index(operation)
        if entry is None:
            return None
        if entry.fingerprint != digest(operation.fingerprint):
            raise _reused(operation)
        return _harness.MemoryMutation(version=entry.version, replayed=True, existed=entry.existed)

    async def write(
        self,
        path: str,
        content: str,
        *,
        expected_version: str | None,
        operation: MemoryOperation | None = None,
    ) -> MemoryMutation:
        """Create or replace ``path`` if its version is ``expected_version`` (None: must not exist)."""
        return await self.write_with_metadata(
            path, content, expected_version=expected_version, metadata=None, operation=operation
        )

    @telemetry.traced("memory.write")
    async def write_with_metadata(
        self,
        path: str,
        content: str,
        *,
        expected_version: str | None,
        metadata: Mapping[str, str] | None,
        operation: MemoryOperation | None = None,
    ) -> MemoryMutation:
        """:meth:`write`, recording ``metadata`` with the new version (None or empty: none)."""
        loc = self._checked_location(path)
        encoded = _harness.encode_metadata(metadata)
        if not isinstance(content, str):
            raise TypeError(f"memory content must be a string, got {type(content).__name__}")
        _check_operation(operation)
        if self._subject_of is not None:
            await self._admit(path)
        mutation = await self._mutate(
            loc, _Request(content, encoded, expected_version, operation, delete=False)
        )
        if self._semantic is not None and mutation.version is not None:
            operation_id = operation.id if operation is not None else None
            self._in_background(
                loc.scope, self._index_version(loc, mutation.version, content, operation_id)
            )
        return mutation

    @telemetry.traced("memory.delete")
    async def delete(
        self,
        path: str,
        *,
        expected_version: str | None,
        operation: MemoryOperation | None = None,
    ) -> MemoryMutation:
        """Delete ``path`` if its version is ``expected_version``; deleting an absent path
        with ``expected_version=None`` succeeds with ``existed=False``."""
        loc = self._checked_location(path)
        _check_operation(operation)
        if self._subject_of is not None:
            await self._admit(path)
        mutation = await self._mutate(
            loc, _Request(None, None, expected_version, operation, delete=True)
        )
        if self._semantic is not None and mutation.existed and not mutation.replayed:
            self._in_background(loc.scope, self._semantic.drop(loc.scope, loc.name))
        return mutation

    @telemetry.traced("memory.list")
    async def list_paths(self, prefix: str = "", *, limit: int) -> list[str]:
        """Up to ``limit`` stored paths starting with ``prefix``, sorted (nested ones included).

        Reads only the directory of ``prefix`` and the directories below it.
        """
        validate_store_prefix(prefix)
        if limit <= 0:
            raise ValueError("limit must be positive")
        directory, _, key_prefix = prefix.rpartition("/")
        page = min(limit + 1, self._page_size)
        paths: list[str] = []
        async with aclosing(self._walk(directory, key_prefix, page)) as files:
            async for path, _, _ in files:
                paths.append(path)
                if len(paths) >= limit:
                    break
        return paths

    # -- subjects -------------------------------------------------------------------------

    def subject_namespace(self, path: str) -> tuple[str, str] | None:
        """``(namespace, subject)`` of ``path`` by ``subject_of`` (None: no subject)."""
        if self._subject_of is None:
            return None
        found = self._subject_of(path)
        if found is None:
            return None
        namespace, subject = found
        if not (namespace.endswith("/") and path.startswith(namespace)):
            raise ValueError(
                f"subject_of({path!r}) gave namespace {namespace!r}: it must be a prefix of "
                "the path ending in '/'"
            )
        return namespace, subject

    async def _admit(self, path: str) -> None:
        """Refuse a write of an erased subject's file; record the namespace under it."""
        found = self.subject_namespace(path)
        if found is None:
            return
        namespace, subject = found
        entry = SubjectEntry("memory", self._prefix, namespace)
        if await self.subjects.record(subject, entry):
            # New to the subject (perhaps erased before): markers this process saw
            # written under the namespace may be gone.
            self._forget_namespace(namespace)

    def _forget_namespace(self, namespace: str) -> None:
        directory = namespace.rstrip("/")
        self._known_dirs = {
            d for d in self._known_dirs if d != directory and not d.startswith(namespace)
        }
        for path in [p for p in self._known if p.startswith(namespace)]:
            self._forget(path)

    async def erase_namespace(self, namespace: str) -> NamespaceErasure:
        """Delete every file under ``namespace`` (a path prefix ending in ``/``) with all it
        holds — chunks, metadata, vector records and their native index rows, tombstones,
        directory markers, and the receipt index entries naming its paths — then read it back.

        Directories go deepest first, so an erase cut off anywhere leaves what remains
        reachable from the namespace, and running it again finishes it. Receipt index
        entries are found by walking the receipt index (every entry of this store, kept
        ``receipt_ttl_seconds``). Writes made meanwhile are not fenced here:
        ``erase_subject`` fences the writes of a subject's namespaces first.
        """
        validate_store_prefix(namespace)
        if not namespace.endswith("/"):
            raise ValueError(f"a namespace is a path prefix ending in '/', got {namespace!r}")
        directory = namespace[:-1]
        directories = [d async for d in self._directories(directory)]
        scopes = [self._scope(d) for d in reversed(directories)]
        vector_port = self.kv.ports.vector
        if vector_port is not None and await vector_port.unavailable() is not None:
            vector_port = None
        for scope in scopes:
            if vector_port is not None:
                await vector_port.drop_scope(scope)
            await self.kv.drop_scope(scope)
        parent, _, name = directory.rpartition("/")
        await self.kv.delete(self._scope(parent), name + MARKER_SUFFIX)
        receipts = await self._erase_receipts(namespace)
        self._forget_namespace(namespace)
        left = 0
        for scope in scopes:
            left += len(await self.kv.scan(scope, limit=100, values=False))
        left += len(await self.list_paths(namespace, limit=100))
        return NamespaceErasure(namespace, len(scopes), receipts, left)

    async def _erase_receipts(self, namespace: str) -> int:
        """Delete the receipt index entries of paths under ``namespace``."""
        removed = 0
        for scope in await self._receipt_scopes():
            async for item in self.kv.iter_scan(scope, page_size=self._page_size):
                assert item.entry is not None
                try:
                    path = IndexEntry.load(item.entry.value, where=f"{scope}/{item.key}").path
                except CorruptRecordError:
                    continue  # doctor reports it; it names no path we can read
                if path.startswith(namespace):
                    removed += await self.kv.delete(scope, item.key)
        return removed

    async def _receipt_scopes(self) -> list[str]:
        base = f"{self._prefix}~ops/"
        found: list[str] = []
        async for scope in self.kv.iter_scopes(prefix=base):
            found.append(scope)
        return found

    # -- retention --------------------------------------------------------------------------

    @telemetry.traced("memory.purge_older_than")
    async def purge_older_than(self, seconds: float, *, prefix: str = "") -> MemoryRetention:
        """Retention: delete the files under ``prefix`` not written for ``seconds``.

        A file's age is that of its current version (every write renews it). Each is
        deleted at the version read, so a file written meanwhile is kept. Files whose
        records predate write times and hold no other date are kept and counted
        (``undated``): their next write dates them. One walk over the namespace; run it
        again after an interruption to finish.
        """
        if seconds <= 0:
            raise ValueError("seconds must be positive")
        validate_store_prefix(prefix)
        cutoff = self.kv.clock() - seconds
        directory, _, key_prefix = prefix.rpartition("/")
        doomed: list[tuple[str, str]] = []
        scanned = undated = 0
        async with aclosing(self._walk(directory, key_prefix, self._page_size)) as files:
            async for path, _, record in files:
                scanned += 1
                written = _written_at(record)
                if written is None:
                    undated += 1
                elif written < cutoff and record.version is not None:
                    doomed.append((path, record.version))
        removed: list[str] = []
        for path, version in doomed:
            try:
                await self.delete(path, expected_version=version)
            except _harness.MemoryConflictError:
                continue  # written again meanwhile: young now
            removed.append(path)
        return MemoryRetention(tuple(removed), scanned, undated)

    # -- SearchableMemoryStore ------------------------------------------------------------

    @telemetry.traced("memory.search")
    async def search(
        self,
        prefix: str,
        query: str,
        *,
        limit: int,
        max_files: int,
        max_chars: int,
        max_file_chars: int,
        mode: SearchMode | None = None,
    ) -> MemorySearchResult:
        """Search the files directly below ``prefix`` (never nested scopes).

        Ranks lexically, by meaning or both, as the store's :class:`SearchConfig` says
        (``mode`` overrides it for this call; a semantic or hybrid mode needs the store's
        embedder). Reads at most ``max_files + 1`` records in scan pages, their chunks in
        one batched read, and, by meaning, their vectors in one batched read, so the
        cost does not grow with one round trip per file.
        """
        validate_store_prefix(prefix)
        mode = mode or self._search.mode
        if mode != "lexical" and self._semantic is None:
            raise ValueError(
                f"search mode {mode!r} needs a store opened with an embedder "
                "(search=SearchConfig(mode=..., embedder=...))"
            )
        if (
            not query.split()
            or limit <= 0
            or max_files <= 0
            or max_chars <= 0
            or max_file_chars <= 0
        ):
            return _harness.MemorySearchResult(matches=[], scanned=0, truncated=False)
        directory, _, key_prefix = prefix.rpartition("/")
        scope = self._scope(directory)
        base = f"{directory}/" if directory else ""
        if mode == "semantic":
            native = await self._search_native(
                scope,
                base,
                prefix,
                key_prefix,
                query,
                limit=limit,
                max_files=max_files,
                max_chars=max_chars,
                max_file_chars=max_file_chars,
            )
            if native is not None:
                return native
        selected = await self._search_candidates(scope, base, key_prefix, max_files)
        if mode != "lexical":
            return await self._search_by_meaning(
                scope,
                base,
                prefix,
                query,
                selected,
                hybrid=mode == "hybrid",
                limit=limit,
                max_files=max_files,
                max_chars=max_chars,
                max_file_chars=max_file_chars,
            )
        files, content_truncated = await self._search_texts(
            scope, base, selected[:max_files], max_file_chars
        )
        result = await _harness.lexical_search(
            files, query, limit=limit, max_files=max_files, max_chars=max_chars, score_prefix=prefix
        )
        return _harness.MemorySearchResult(
            matches=result.matches,
            scanned=result.scanned,
            truncated=result.truncated or content_truncated or len(selected) > max_files,
        )

    async def _search_candidates(
        self, scope: str, base: str, key_prefix: str, max_files: int
    ) -> list[tuple[str, FileRecord]]:
        """Live files of ``scope`` whose name starts with ``key_prefix``, in key order, with
        their records: up to ``max_files + 1``, the one beyond telling that more exist."""
        selected: list[tuple[str, FileRecord]] = []
        page_size = min(max_files + 1, self._page_size)
        start_after: str | None = None
        while len(selected) <= max_files:
            page = await self.kv.scan(
                scope, prefix=key_prefix, start_after=start_after, limit=page_size, values=True
            )
            finished = len(page) < page_size
            for item in page:
                if item.key.startswith(INTERNAL_KEY_MARK):
                    finished = True
                    break
                if item.key.endswith(MARKER_SUFFIX):
                    continue  # a subdirectory: search never descends into nested scopes
                record = self._live_file(scope, base, item.key, item.entry)
                if record is None:
                    continue
                selected.append((item.key, record))
                if len(selected) > max_files:
                    break
            if finished or not page:
                break
            start_after = page[-1].key
        return selected

    async def _search_texts(
        self, scope: str, base: str, files: list[tuple[str, FileRecord]], max_chars: int
    ) -> tuple[list[tuple[str, str]], bool]:
        """``(path, content cut to max_chars)`` of the files still there, their chunks in one
        batched read, and whether any content was cut."""
        fetched = await self._fetch(scope, files, max_chars, metadata=False)
        texts: list[tuple[str, str]] = []
        cut = False
        for name, record in files:
            if name in fetched:
                text = fetched[name][0]
                cut = cut or record.length > max_chars
            else:
                # Rewritten since the scan: read the current version on its own (rare).
                current = await self._reread(base + name, max_chars)
                if current is None:
                    continue
                text = current.content
                cut = cut or current.truncated
            texts.append((base + name, text))
        return texts, cut

    async def _search_by_meaning(
        self,
        scope: str,
        base: str,
        prefix: str,
        query: str,
        selected: list[tuple[str, FileRecord]],
        *,
        hybrid: bool,
        limit: int,
        max_files: int,
        max_chars: int,
        max_file_chars: int,
    ) -> MemorySearchResult:
        """Rank ``selected`` (the candidates, one beyond ``max_files``) by the cosine
        similarity of their best passage to ``query``; hybrid: fused with the lexical
        ranking. Vectors missing or computed from another version are recomputed first."""
        files = selected[:max_files]
        await self._settle_indexing(scope)
        if not files:
            return _harness.MemorySearchResult(matches=[], scanned=0, truncated=False)
        # The texts read on the way (to embed a file), so the matches read none twice.
        texts: dict[str, str] = {}
        semantic, passage_of = await self._ranked_by_meaning(scope, base, query, files, texts)
        scores = {path: score for score, path, _ in semantic}
        truncated = len(selected) > max_files
        if hybrid:
            scores, cut = await self._fused_with_lexical(
                scope,
                base,
                prefix,
                query,
                files,
                [path for _, path, _ in semantic],
                max_files=max_files,
                max_file_chars=max_file_chars,
            )
            truncated = truncated or cut
        ranked = sorted(scores, key=lambda path: (-scores[path], path))
        sources = await self._match_sources(
            scope, base, files, ranked[:limit], texts, passage_of, scores
        )
        matches, cut = _matches_within(sources, prefix, max_chars, max_file_chars)
        truncated = truncated or cut or len(ranked) > len(matches)
        return _harness.MemorySearchResult(matches=matches, scanned=len(files), truncated=truncated)

    async def _ranked_by_meaning(
        self,
        scope: str,
        base: str,
        query: str,
        files: list[tuple[str, FileRecord]],
        texts: dict[str, str],
    ) -> tuple[list[tuple[float, str, Passage]], dict[str, Passage]]:
        """``files`` more similar to ``query`` than the threshold, as (similarity, path,
        best passage), most similar first (ties by path), and the best passage of each
        file with vectors. The vectors missing (or of another dimension) are computed and
        stored first, their texts added to ``texts``."""
        index = self._semantic
        assert index is not None
        query_vector, (indexed, stored) = await asyncio.gather(
            index.embed_query(query), self._vectors_of(scope, files)
        )
        # Read before the first embedding told the dimension: another dimension's vectors
        # (same model, other settings) are recomputed, never compared.
        dimensions = int(query_vector.shape[1])
        indexed = {
            name: found
            for name, found in indexed.items()
            if found.record.dimensions == dimensions or not found.record.passages
        }
        missing = [(name, record) for name, record in files if name not in indexed]
        if missing:
            texts.update(await self._full_texts(scope, missing))
            await self._embed_and_store(scope, missing, texts, indexed, stored)
        similar = index.best_passages(query_vector, list(indexed.values()))
        threshold = index.config.min_similarity
        semantic = sorted(
            ((score, base + f.name, passage) for score, f, passage in similar if score > threshold),
            key=lambda item: (-item[0], item[1]),
        )
        return semantic, {base + f.name: passage for _, f, passage in similar}

    async def _fused_with_lexical(
        self,
        scope: str,
        base: str,
        prefix: str,
        query: str,
        files: list[tuple[str, FileRecord]],
        by_meaning: list[str],
        *,
        max_files: int,
        max_file_chars: int,
    ) -> tuple[dict[str, float], bool]:
        """A hybrid search's scores: the ranking by meaning (``by_meaning``, paths) fused
        with the lexical ranking of ``files``; and whether a text was cut for it."""
        index = self._semantic
        assert index is not None
        lexical_files, cut = await self._search_texts(scope, base, files, max_file_chars)
        lexical = await _harness.lexical_search(
            lexical_files,
            query,
            limit=len(lexical_files) or 1,
            max_files=max_files,
            max_chars=sys.maxsize,
            score_prefix=prefix,
        )
        fused = reciprocal_rank_fusion(
            [by_meaning, [m.path for m in lexical.matches]], index.config.rrf_k
        )
        return fused, cut

    async def _match_sources(
        self,
        scope: str,
        base: str,
        files: list[tuple[str, FileRecord]],
        top: list[str],
        texts: dict[str, str],
        passage_of: Mapping[str, Passage],
        scores: Mapping[str, float],
    ) -> list[tuple[str, str, float]]:
        """(path, text to cut a snippet from, score) of the ``top`` paths in order: the
        best passage, or the whole text of a file ranked without one; the texts not read
        yet are read in one batch, and a file rewritten since the scan is left out (its
        text is not the version ranked)."""
        records = dict(files)
        wanted = [
            (path.removeprefix(base), records[path.removeprefix(base)])
            for path in top
            if path.removeprefix(base) not in texts
        ]
        if wanted:
            texts.update(await self._full_texts(scope, wanted))
        sources = []
        for path in top:
            text = texts.get(path.removeprefix(base))
            if text is None:
                continue
            passage = passage_of.get(path)
            source = text[passage.start : passage.end] if passage is not None else text
            sources.append((path, source, scores[path]))
        return sources

    async def _search_native(
        self,
        scope: str,
        base: str,
        prefix: str,
        key_prefix: str,
        query: str,
        *,
        limit: int,
        max_files: int,
        max_chars: int,
        max_file_chars: int,
    ) -> MemorySearchResult | None:
        """:meth:`_search_by_meaning` answered by the backend's vector index; None when
        there is none, or it cannot be brought up to date within this search (more than
        ``max_files`` files to index, or it keeps disagreeing with the files under
        concurrent writes): the generic path then answers."""
        index = self._semantic
        assert index is not None
        port = await index.native()
        if port is None:
            return None
        await self._settle_indexing(scope)
        query_vector = await index.embed_query(query)
        for _ in range(_NATIVE_ROUNDS):
            if not await self._catch_up_native(port, scope, base, key_prefix, max_files):
                self._backlog(scope, port.name)
                return None
            nearest = await port.nearest(
                scope,
                index.model,
                query_vector,
                key_prefix=key_prefix,
                limit=limit + 1,
                max_files=max_files,
            )
            threshold = index.config.min_similarity
            hits = [hit for hit in nearest.hits if hit.similarity > threshold]
            confirmed = await self._confirmed_hits(port, scope, base, nearest, hits, limit)
            if confirmed is None:
                continue  # written since the index was brought up to date: ask again
            top, texts = confirmed
            sources = [
                (
                    base + hit.name,
                    texts[hit.name][hit.passage.start : hit.passage.end],
                    hit.similarity,
                )
                for hit in top
            ]
            matches, cut = _matches_within(sources, prefix, max_chars, max_file_chars)
            return _harness.MemorySearchResult(
                matches=matches,
                scanned=nearest.considered,
                truncated=nearest.more or len(hits) > limit or cut,
            )
        return None

    async def _catch_up_native(
        self, port: VectorPort, scope: str, base: str, key_prefix: str, max_files: int
    ) -> bool:
        """Index the files the native index lacks under ``key_prefix``, a page at a time;
        False (nothing more done) once more than one search should index (``max_files``
        and a page) were found."""
        index = self._semantic
        assert index is not None
        synced = 0
        while names := await port.unindexed(
            scope, index.model, key_prefix, INTERNAL_KEY_MARK, self._page_size
        ):
            synced += len(names)
            if synced > max_files + self._page_size:
                return False
            await self._sync_native(scope, base, names)
        return True

    async def _confirmed_hits(
        self,
        port: VectorPort,
        scope: str,
        base: str,
        nearest: NearestFiles,
        hits: list[VectorHit],
        limit: int,
    ) -> tuple[list[VectorHit], dict[str, str]] | None:
        """The first ``limit`` of ``hits`` and their texts, each checked against its file's
        live record; None when any hit (or a file the index found stale) was written since
        it was indexed: those are then removed from the index, for the search to ask again."""
        index = self._semantic
        assert index is not None
        entries = await self.kv.get_many(scope, [hit.name for hit in hits]) if hits else {}
        records: dict[str, FileRecord] = {}
        stale: list[str] = list(nearest.stale)
        for hit in hits:
            record = self._live_file(scope, base, hit.name, entries.get(hit.name))
            if record is None or record.version != hit.file_version:
                stale.append(hit.name)
            else:
                records[hit.name] = record
        top = [hit for hit in hits if hit.name in records][:limit]
        texts = await self._full_texts(scope, [(hit.name, records[hit.name]) for hit in top])
        stale += [hit.name for hit in top if hit.name not in texts]
        if stale:
            await port.remove(scope, index.model, stale)
            return None
        return top, texts

    def _backlog(self, scope: str, index_name: str) -> None:
        """Say once per directory that its native index lags too far for a search to fill
        it (a copied or imported namespace, files written without an embedder)."""
        if scope in self._backlogged:
            return
        self._backlogged.add(scope)
        logger.warning(
            "the %s index of memory directory scope %r lacks more files than one search "
            "indexes; searches there use the generic path until `agent-stores memory URL "
            "reindex` (or memory.reindex()) fills it",
            index_name,
            scope,
        )

    async def _sync_native(self, scope: str, base: str, names: Sequence[str]) -> None:
        """Bring the vector index's entries of ``names`` (keys of ``scope``) up to date
        with their records: reuse the stored vectors of a file's version, else embed and
        store them; a tombstone or directory marker is recorded as not searchable."""
        index = self._semantic
        assert index is not None
        entries = await self.kv.get_many(scope, [*names, *(index.key(name) for name in names)])
        ready: list[VectorEntry] = []
        missing: list[tuple[str, FileRecord]] = []
        kv_versions: dict[str, str] = {}
        stored: dict[str, str] = {}
        for name in names:
            entry = entries.get(name)
            if entry is None:
                continue  # gone since: no longer listed
            record = (
                None if name.endswith(MARKER_SUFFIX) else self._live_file(scope, base, name, entry)
            )
            if record is None:
                ready.append(VectorEntry(name, entry.version, None))
                continue
            vector_entry = entries.get(index.key(name))
            existing = (
                index.decode(scope, name, vector_entry.value) if vector_entry is not None else None
            )
            if index.usable(existing, record.version):
                assert existing is not None and vector_entry is not None
                ready.append(VectorEntry(name, entry.version, existing, vector_entry.version))
                continue
            kv_versions[name] = entry.version
            if vector_entry is not None:
                stored[name] = vector_entry.version
            missing.append((name, record))
        if missing:
            computed: dict[str, IndexedFile] = {}
            texts = await self._full_texts(scope, missing)
            await self._embed_and_store(scope, missing, texts, computed, stored)
            ready += [
                VectorEntry(name, kv_versions[name], found.record, found.entry_version)
                for name, found in computed.items()
            ]
        await index.mirror(scope, ready)

    async def _vectors_of(
        self, scope: str, files: Sequence[tuple[str, FileRecord]]
    ) -> tuple[dict[str, IndexedFile], dict[str, str]]:
        """The stored vectors of ``files`` computed from exactly their versions, and the KV
        version of every vector entry found (usable or not: what a new one replaces), in
        one batched read."""
        index = self._semantic
        assert index is not None
        keys = {index.key(name): (name, record) for name, record in files}
        entries = await self.kv.get_many(scope, list(keys)) if keys else {}
        found: dict[str, IndexedFile] = {}
        stored: dict[str, str] = {}
        for key, entry in entries.items():
            name, record = keys[key]
            stored[name] = entry.version
            vectors = index.decode(scope, name, entry.value)
            if vectors is not None and index.usable(vectors, record.version):
                found[name] = IndexedFile(name, vectors, entry.version)
        return found, stored

    async def _full_texts(
        self, scope: str, files: Sequence[tuple[str, FileRecord]]
    ) -> dict[str, str]:
        """The whole content of ``files`` at the versions given (a file rewritten since is
        left out)."""
        longest = max((record.length for _, record in files), default=0)
        fetched = await self._fetch(scope, files, max(longest, 1), metadata=False)
        return {name: content for name, (content, _) in fetched.items()}

    async def _embed_and_store(
        self,
        scope: str,
        files: Sequence[tuple[str, FileRecord]],
        texts: Mapping[str, str],
        indexed: dict[str, IndexedFile],
        stored: Mapping[str, str],
    ) -> None:
        """Embed the versions of ``files`` whose text is in ``texts``, store their vectors
        over the entries at the KV versions in ``stored`` (best effort: this search uses
        them either way) and add them to ``indexed``."""
        index = self._semantic
        assert index is not None
        plan = [
            ToEmbed(name, str(record.version), texts[name], record.operation_id)
            for name, record in files
            if name in texts and record.version is not None
        ]
        if not plan:
            return
        computed = await index.embed_files(plan)
        for file, vectors in zip(plan, computed, strict=True):
            indexed[file.name] = IndexedFile(file.name, vectors)
        outcomes = await asyncio.gather(
            *(
                index.store(scope, vectors, file.name, stored.get(file.name))
                for file, vectors in zip(plan, computed, strict=True)
            ),
            return_exceptions=True,
        )
        for file, outcome in zip(plan, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                indexed[file.name].entry_version = outcome[1]
            else:
                logger.warning(
                    "could not store the vectors of memory file %r (%s); they are recomputed "
                    "when next needed",
                    file.name,
                    redact(str(outcome)),
                )

    # -- indexing -------------------------------------------------------------------------

    def _in_background(self, scope: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._gated(work))
        self._indexing[task] = scope
        task.add_done_callback(self._indexing_done)

    async def _gated(self, work: Coroutine[Any, Any, None]) -> None:
        # A burst of writes must not start as many indexings at once: each holds a
        # connection of the client's pool for its reads, its write and the native
        # index's update, and the writes themselves need connections too.
        loop = asyncio.get_running_loop()
        if self._indexing_gate is None or self._indexing_gate[0] is not loop:
            self._indexing_gate = (loop, asyncio.Semaphore(_INDEXING_CONCURRENCY))
        async with self._indexing_gate[1]:
            await work

    def _indexing_done(self, task: asyncio.Task[None]) -> None:
        self._indexing.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.warning(
                "indexing a memory file failed (%s: %s); the next search or reindex repairs it",
                type(exc).__name__,
                redact(str(exc)),
            )

    async def _settle_indexing(self, scope: str) -> None:
        pending = [task for task, where in self._indexing.items() if where == scope]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _index_version(
        self, loc: _Location, version: str, content: str, operation_id: str | None
    ) -> None:
        """Store the vectors of ``version`` of ``loc``, unless it is no longer the file's
        version (its successor's writer indexes that one) or already indexed (a retried
        write): so a version is embedded once, by the write that made it."""
        index = self._semantic
        assert index is not None
        embedded = None
        for _ in range(_MAX_CAS_ROUNDS):
            entries = await self.kv.get_many(loc.scope, [loc.name, index.key(loc.name)])
            file_entry = entries.get(loc.name)
            record = self._decode(file_entry, loc) if file_entry is not None else None
            if record is None or not record.live or record.version != version:
                return
            vector_entry = entries.get(index.key(loc.name))
            existing = (
                index.decode(loc.scope, loc.name, vector_entry.value) if vector_entry else None
            )
            assert file_entry is not None
            if index.usable(existing, version):
                assert existing is not None and vector_entry is not None
                await index.mirror(
                    loc.scope,
                    [VectorEntry(loc.name, file_entry.version, existing, vector_entry.version)],
                )
                return
            if embedded is None:
                [embedded] = await index.embed_files(
                    [ToEmbed(loc.name, version, content, operation_id)]
                )
            replaces = vector_entry.version if vector_entry is not None else None
            outcome, stored_as = await index.store(loc.scope, embedded, loc.name, replaces)
            if outcome != "conflict":
                await index.mirror(
                    loc.scope, [VectorEntry(loc.name, file_entry.version, embedded, stored_as)]
                )
                return

    @telemetry.traced("memory.reindex")
    async def reindex(
        self,
        directory: str = "",
        *,
        batch_files: int = 32,
        progress: Callable[[ReindexReport], None] | None = None,
    ) -> ReindexReport:
        """Embed every file under ``directory`` whose vectors from the store's model are
        missing or stale (after a model change, a crash, or files written by a store
        without an embedder). Resumable: files already indexed are only read again.
        ``progress`` is called after each batch with the report so far."""
        index = self._semantic
        if index is None:
            raise ValueError("reindex needs a store opened with a semantic or hybrid search")
        if directory:
            validate_store_path(directory)
        report = ReindexReport()
        batch: list[tuple[str, FileRecord]] = []
        kv_versions: dict[str, str] = {}
        batch_scope: str | None = None

        async def flush() -> None:
            if not batch or batch_scope is None:
                return
            found, stored = await self._vectors_of(batch_scope, batch)
            missing = [(name, record) for name, record in batch if name not in found]
            texts = await self._full_texts(batch_scope, missing) if missing else {}
            await self._embed_and_store(batch_scope, missing, texts, found, stored)
            await index.mirror(
                batch_scope,
                [
                    VectorEntry(
                        name, kv_versions[name], found[name].record, found[name].entry_version
                    )
                    for name, _ in batch
                    if name in found
                ],
            )
            report.files += len(batch)
            report.embedded += sum(1 for name, _ in missing if name in texts)
            report.up_to_date += len(batch) - len(missing)
            report.skipped += [name for name, _ in missing if name not in texts]
            batch.clear()
            kv_versions.clear()
            if progress is not None:
                progress(report)

        async with aclosing(self._directories(directory)) as directories:
            async for current in directories:
                scope = self._scope(current)
                base = f"{current}/" if current else ""
                async for item in self.kv.iter_scan(scope, page_size=self._page_size, values=True):
                    if item.key.startswith(INTERNAL_KEY_MARK):
                        break
                    if item.key.endswith(MARKER_SUFFIX):
                        continue
                    record = self._live_file(scope, base, item.key, item.entry)
                    if record is None:
                        continue
                    if batch_scope != scope:
                        await flush()
                        batch_scope = scope
                    batch.append((item.key, record))
                    if item.entry is not None:
                        kv_versions[item.key] = item.entry.version
                    if len(batch) >= batch_files:
                        await flush()
        await flush()
        return report

    async def _reread(self, path: str, max_chars: int) -> MemoryFile | None:
        """The current version of a file; None when it is gone, or damaged (reported)."""
        try:
            return await self.read(path, max_chars=max_chars)
        except CorruptRecordError as exc:
            self.problems.report(path, exc)
            return None

    # -- maintenance ----------------------------------------------------------------------

    @telemetry.traced("memory.collect_garbage")
    async def collect_garbage(self, directory: str = "") -> int:
        """Delete chunks no record references (left by a crash mid-write) and vector records
        of deleted files under ``directory``.

        Only chunks older than ``chunk_grace`` are touched, so a write still in flight never
        loses the chunks it is about to reference. Returns how many entries were deleted.
        """
        if directory:
            validate_store_path(directory)
        now = self.kv.clock()
        removed = 0
        async with aclosing(self._directories(directory)) as directories:
            async for current in directories:
                removed += await self._collect_scope(self._scope(current), now)
        return removed

    # -- layout ---------------------------------------------------------------------------

    @property
    def scope_prefix(self) -> str:
        """The prefix of every KV scope this store uses."""
        return self._prefix

    def directory_scope(self, directory: str) -> str:
        """The KV scope holding the files of ``directory`` (``""``: top-level files)."""
        return self._scope(directory)

    def _scope(self, directory: str) -> str:
        scope = self._prefix + directory
        if len(scope) > self.kv.limits.max_scope_chars:
            # Deep paths may outgrow the backend's scope limit; "~" never occurs in a path,
            # so the hashed form cannot collide with a plain one.
            scope = f"{self._prefix}~h/{digest(directory)}"
        return scope

    def _checked_location(self, path: str) -> _Location:
        """:meth:`_locate` of a valid ``path`` (``ValueError`` otherwise), remembered: an
        agent reads and writes the same few files over and over."""
        loc = self._locations.get(path)
        if loc is None:
            validate_store_path(path)
            loc = self._locate(path)
            if len(self._locations) >= _KNOWN_RECORDS:
                self._locations.clear()
            self._locations[path] = loc
        return loc

    def _locate(self, path: str) -> _Location:
        directory, _, name = path.rpartition("/")
        return _Location(path, directory, name, self._scope(directory))

    def _index_key(self, operation: MemoryOperation) -> tuple[str, str]:
        key = digest(operation.id)
        # Spread over 256 scopes so no single partition takes every receipt.
        return f"{self._prefix}~ops/{key[:2]}", key

    def _decode(
        self, entry: Entry | None, loc: _Location | None, *, where: str = ""
    ) -> FileRecord | None:
        if entry is None:
            return None
        label = where or (f"{loc.scope}/{loc.name}" if loc else "?")
        return FileRecord.load(entry.value, where=repr(label))

    # -- mutations ------------------------------------------------------------------------

    async def _mutate(self, loc: _Location, request: _Request) -> MemoryMutation:
        attempt = _Attempt()
        try:
            if self._port.atomic and not request.delete:
                assert request.content is not None
                predicted, attempt.staged = await self._predicted_write(
                    loc,
                    request.content,
                    request.metadata,
                    request.expected_version,
                    request.operation,
                )
                if predicted is not None:
                    attempt.landed = True
                    return predicted
            for _ in range(_MAX_CAS_ROUNDS):
                mutation = await self._mutate_round(loc, request, attempt)
                if mutation is not None:
                    return mutation
            raise _harness.MemoryConflictError(f"memory path {loc.path!r} kept changing; giving up")
        except (_harness.MemoryConflictError, _harness.MemoryOperationConflictError):
            # A definite refusal: nothing landed, so the staged chunks are garbage now.
            if attempt.staged is not None and not attempt.landed:
                await self._discard(loc.scope, _staged_keys(loc.name, attempt.staged))
            raise

    async def _mutate_round(
        self, loc: _Location, request: _Request, attempt: _Attempt
    ) -> MemoryMutation | None:
        """Read the file, then answer a replay, refuse a conflict or write by CAS.

        None when another writer's CAS won: the next round reads and decides again.
        """
        entry, indexed = await self._load(loc, request.operation)
        record, quarantined = await self._decode_or_quarantine(loc, entry, request.expected_version)
        if quarantined and request.delete and request.operation is None:
            assert entry is not None
            # Delete needs no decodable body; a tombstone keeps no receipts.
            await self.kv.delete(loc.scope, loc.name, expected_version=entry.version)
            return _harness.MemoryMutation(version=None, replayed=False, existed=True)
        replay = await self._replay_landed(loc, request.operation, indexed, record)
        if replay is not None:
            return replay
        self._check_expected_version(loc, record, request)
        return await self._replace_record(loc, request, attempt, entry, record)

    async def _decode_or_quarantine(
        self, loc: _Location, entry: Entry | None, expected_version: str | None
    ) -> tuple[FileRecord | None, bool]:
        """The record in ``entry``, and whether it was damaged and set aside (then a tombstone).

        A damaged record's version is unknowable, so only an unconditional write or delete
        (``expected_version=None``) may replace it; its bytes are kept aside.
        """
        try:
            return self._decode(entry, loc), False
        except CorruptRecordError as exc:
            assert entry is not None
            if expected_version is not None:
                raise
            self.problems.report(loc.path, exc)
            await quarantine(self.kv, loc.scope, loc.name, entry, reason=exc.detail)
            return FileRecord(live=False), True

    async def _replay_landed(
        self,
        loc: _Location,
        operation: MemoryOperation | None,
        indexed: IndexEntry | None,
        record: FileRecord | None,
    ) -> MemoryMutation | None:
        """The result of ``operation`` if it landed already (a retry after a lost reply).

        Raises ``MemoryOperationConflictError`` when its id was used with other arguments.
        """
        if operation is None:
            return None
        replay = self._replay(operation, indexed, record)
        if replay is not None and indexed is None:
            # The index write after the original CAS was lost: repair it.
            await self._write_index(operation, loc.path, replay)
        return replay

    @staticmethod
    def _check_expected_version(
        loc: _Location, record: FileRecord | None, request: _Request
    ) -> None:
        current = record.version if record is not None and record.live else None
        if current != request.expected_version:
            verb = "deleted" if request.delete else "written"
            raise _harness.MemoryConflictError(
                f"memory path {loc.path!r} changed before it could be {verb}"
            )

    async def _replace_record(
        self,
        loc: _Location,
        request: _Request,
        attempt: _Attempt,
        entry: Entry | None,
        record: FileRecord | None,
    ) -> MemoryMutation | None:
        """Write the file's new record (or tombstone) over ``entry`` by CAS.

        None when another writer got there first.
        """
        live = record is not None and record.live
        now = self.kv.clock()
        version = None if request.delete else new_version()
        mutation = _harness.MemoryMutation(version=version, replayed=False, existed=live)
        receipts = self._receipts(record, request.operation, version, live, now)
        if request.delete:
            if not live and request.operation is None:
                return mutation  # nothing to remove and no receipt to keep
            new_record = FileRecord(live=False, receipts=receipts)
            new_record.receipts = self._fit_receipts(new_record)
            ttl: float | None = self._receipt_ttl
        else:
            assert request.content is not None and version is not None
            new_record, attempt.staged = await self._live_record(
                loc,
                request.content,
                request.metadata,
                version,
                request.operation,
                receipts,
                attempt.staged,
                now,
            )
            ttl = None
        markers = [] if live or request.delete else self._missing_markers(loc.directory)
        try:
            await self._write(
                loc,
                new_record,
                None if entry is None else entry.version,
                ttl,
                request.operation,
                mutation,
                markers,
            )
        except ConflictError:
            return None
        attempt.landed = True
        await self._after_landing(loc, record, new_record)
        return mutation

    async def _predicted_write(
        self,
        loc: _Location,
        content: str,
        metadata: str | None,
        expected_version: str | None,
        operation: MemoryOperation | None,
    ) -> tuple[MemoryMutation | None, _Staged | None]:
        """On an atomic port, write without reading first when the outcome is predictable:
        a create (nothing expected), or a replace of the record this store last saw.

        The port's transaction checks everything the read would have (the record's
        version, the index entry's absence); when the prediction was wrong it writes
        nothing and the caller reads and decides as usual. Returns the mutation (None:
        not attempted or refused) and the chunks staged for a large file (reused).
        """
        known = self._known.get(loc.path)
        if expected_version is None:
            record: FileRecord | None = None
            entry_version: str | None = None
            if known is not None and known[1].live:
                return None, None  # it exists: the usual path reports the conflict
        elif known is not None and known[1].live and known[1].version == expected_version:
            entry_version, record, _ = known
        else:
            return None, None
        if (
            operation is not None
            and record is not None
            and record.receipts
            and record.find_receipt(digest(operation.id)) is not None
        ):
            return None, None  # a replay: the usual path answers it
        now = self.kv.clock()
        version = new_version()
        live = record is not None
        mutation = _harness.MemoryMutation(version=version, replayed=False, existed=live)
        new_record: FileRecord | None = None
        staged: _Staged | None = None
        if record is not None and not record.receipts:
            # The common replace: no receipts to keep, content and metadata inline when they
            # fit (the cheapest shape, tried without planning the others).
            inline = _shaped_record(
                _SHAPES[0],
                content,
                metadata,
                None,
                version=version,
                operation_id=operation.id if operation is not None else None,
                receipts=[],
                written_at=int(now),
            )
            if self._fits(inline):
                new_record = inline
        if new_record is None:
            receipts = self._receipts(record, operation, version, live, now)
            new_record, staged = await self._live_record(
                loc, content, metadata, version, operation, receipts, None, now
            )
        markers = [] if live else self._missing_markers(loc.directory)
        try:
            await self._write(loc, new_record, entry_version, None, operation, mutation, markers)
        except ConflictError:
            self._forget(loc.path)
            return None, staged
        if record is not None and record.token:  # chunks of the replaced version to drop
            await self._after_landing(loc, record, new_record)
        return mutation, staged

    async def _write(
        self,
        loc: _Location,
        record: FileRecord,
        entry_version: str | None,
        ttl: float | None,
        operation: MemoryOperation | None,
        mutation: MemoryMutation,
        markers: list[tuple[str, str, str]],
    ) -> None:
        """The record, its receipt index entry and missing directory markers, through the port."""
        index = None if operation is None else self._index_write(operation, mutation, loc)
        version = await self._port.write(
            FileWrite(
                loc.scope,
                loc.name,
                record.encoded(),
                entry_version,
                ttl,
                index,
                [(scope, key) for _, scope, key in markers] if markers else [],
            )
        )
        if markers:
            if len(self._known_dirs) + len(markers) > _KNOWN_DIRS:
                self._known_dirs.clear()
            self._known_dirs.update(full for full, _, _ in markers)
        self._remember(loc.path, version, record, len(record.encoded()))

    def _index_write(
        self, operation: MemoryOperation, mutation: MemoryMutation, loc: _Location
    ) -> IndexWrite:
        """The receipt index entry of ``operation``, written with the record."""
        scope, key = self._index_key(operation)
        value = index_entry_value(
            digest(operation.fingerprint), mutation.version, mutation.existed, loc.path
        )
        return IndexWrite(scope, key, value, self._receipt_ttl)

    def _remember(self, path: str, version: str, record: FileRecord, size: int) -> None:
        self._forget(path)
        if size > _KNOWN_BYTES // 16:
            return
        self._known[path] = (version, record, size)
        self._known_bytes += size
        while len(self._known) > _KNOWN_RECORDS or self._known_bytes > _KNOWN_BYTES:
            _, (_, _, dropped) = self._known.popitem(last=False)
            self._known_bytes -= dropped

    def _forget(self, path: str) -> None:
        known = self._known.pop(path, None)
        if known is not None:
            self._known_bytes -= known[2]

    async def _load(
        self, loc: _Location, operation: MemoryOperation | None
    ) -> tuple[Entry | None, IndexEntry | None]:
        if operation is None:
            return await self.kv.get(loc.scope, loc.name), None
        entry, indexed = await asyncio.gather(
            self.kv.get(loc.scope, loc.name), self._get_index(operation)
        )
        return entry, indexed

    async def _get_index(self, operation: MemoryOperation) -> IndexEntry | None:
        scope, key = self._index_key(operation)
        entry = await self.kv.get(scope, key)
        if entry is None:
            return None
        try:
            return IndexEntry.load(entry.value, where=repr(f"{scope}/{key}"))
        except CorruptRecordError as exc:
            # The receipt in the file record stays authoritative; a damaged index entry
            # costs only the lookup through the index.
            self.problems.report(f"{scope}/{key}", exc)
            return None

    def _replay(
        self, operation: MemoryOperation, indexed: IndexEntry | None, record: FileRecord | None
    ) -> MemoryMutation | None:
        fingerprint = digest(operation.fingerprint)
        if indexed is not None:
            if indexed.fingerprint != fingerprint:
                raise _reused(operation)
            return _harness.MemoryMutation(
                version=indexed.version, replayed=True, existed=indexed.existed
            )
        receipt = record.find_receipt(digest(operation.id)) if record is not None else None
        # A receipt past its lifetime is forgotten, as get_operation says: the id is new
        # again and the write goes ahead (an expired receipt may linger in the record
        # until the next write drops it).
        if receipt is None or receipt.at <= self.kv.clock() - self._receipt_ttl:
            return None
        if receipt.fingerprint != fingerprint:
            raise _reused(operation)
        return _harness.MemoryMutation(
            version=receipt.version, replayed=True, existed=receipt.existed
        )

    def _receipts(
        self,
        record: FileRecord | None,
        operation: MemoryOperation | None,
        version: str | None,
        live: bool,
        now: float,
    ) -> list[Receipt]:
        """The receipts the new record keeps.

        Generic port: the unexpired ones plus this operation's (the index entry is written
        after the record, so the record's receipt is the authoritative one). Atomic port:
        the index entry commits with the record, so this operation's receipt goes to the
        index only; receipts a generic writer left in the record are kept until they expire
        (their index entry may be missing). A record written only through an atomic port
        therefore carries no receipts: no bytes, no encoding, no decoding for them.
        """
        receipts = self._kept_receipts(record, now)
        if operation is not None and not self._port.atomic:
            receipts.append(
                Receipt(digest(operation.id), digest(operation.fingerprint), version, live, now)
            )
        return receipts

    def _kept_receipts(self, record: FileRecord | None, now: float) -> list[Receipt]:
        if record is None or not record.receipts:
            return []
        fresh = [r for r in record.receipts if r.at > now - self._receipt_ttl]
        # Room for the receipt of the mutation being made.
        return fresh[-(self._max_receipts - 1) :] if self._max_receipts > 1 else []

    def _fits(self, record: FileRecord) -> bool:
        # The encoding is kept on the record: the write sends these very bytes.
        return len(record.encoded()) <= self._record_bytes

    def _fit_receipts(self, record: FileRecord) -> list[Receipt]:
        """Drop the oldest receipts until the record fits (the newest always stays)."""
        receipts = list(record.receipts)
        while len(receipts) > 1 and not self._fits(record):
            receipts.pop(0)
            record.receipts = receipts
            record.forget_encoding()
        return receipts

    async def _live_record(
        self,
        loc: _Location,
        content: str,
        metadata: str | None,
        version: str,
        operation: MemoryOperation | None,
        receipts: list[Receipt],
        staged: _Staged | None,
        now: float,
    ) -> tuple[FileRecord, _Staged | None]:
        """The record for this write, with content and metadata inline when they fit.

        Shapes are tried from cheapest to most split; receipts are only trimmed when no
        shape fits with all of them.
        """
        operation_id = operation.id if operation is not None else None
        shapes = self._shapes_worth_trying(content, metadata)
        for trim in (False, True):
            for shape in shapes:
                if shape.chunked:
                    staged = staged or self._stage(content, metadata, now)
                record = _shaped_record(
                    shape,
                    content,
                    metadata,
                    staged if shape.chunked else None,
                    version=version,
                    operation_id=operation_id,
                    receipts=receipts,
                    written_at=int(now),
                )
                if trim:
                    record.receipts = self._fit_receipts(record)
                if not self._fits(record):
                    continue
                if staged is not None:
                    await self._write_chunks(
                        loc, staged, content=shape.content, metadata=shape.metadata
                    )
                return record, staged
        raise ValueTooLargeError(
            f"memory file {loc.path!r} needs more chunks than one record of "
            f"{self._record_bytes} bytes can list; raise the backend's item limit",
            size=len(encode_text(content)),
            limit=self._record_bytes,
        )

    def _shapes_worth_trying(self, content: str, metadata: str | None) -> list[_Shape]:
        """The record shapes that may fit, cheapest first.

        Every character takes at least one byte: a shape holding inline a text with more
        characters than a record has bytes is skipped without encoding it.
        """
        content_may_fit = len(content) < self._record_bytes
        metadata_may_fit = metadata is None or len(metadata) < self._record_bytes
        return [
            shape
            for shape in _SHAPES
            if (shape.content or content_may_fit)
            and (shape.metadata or metadata_may_fit)
            and not (shape.metadata and metadata is None)
        ]

    def _stage(self, content: str, metadata: str | None, now: float) -> _Staged:
        # The creation time in the token lets collect_garbage spare chunks of writes in flight.
        token = f"{int(now):x}-{secrets.token_hex(6)}"
        pieces = list(split_utf8(encode_text(content), self._record_bytes))
        sizes = [len(decode_text(piece)) for piece in pieces]
        meta_pieces = (
            list(split_utf8(encode_text(metadata), self._record_bytes)) if metadata else []
        )
        return _Staged(token, sizes, pieces, meta_pieces)

    async def _write_chunks(
        self, loc: _Location, staged: _Staged, *, content: bool, metadata: bool
    ) -> None:
        writes = []
        if content and not staged.content_written:
            writes += [
                self.kv.create(loc.scope, content_chunk_key(loc.name, staged.token, i), piece)
                for i, piece in enumerate(staged.content_pieces)
            ]
        if metadata and not staged.metadata_written:
            writes += [
                self.kv.create(loc.scope, metadata_chunk_key(loc.name, staged.token, i), piece)
                for i, piece in enumerate(staged.metadata_pieces)
            ]
        await asyncio.gather(*writes)
        staged.content_written = staged.content_written or content
        staged.metadata_written = staged.metadata_written or metadata

    def _missing_markers(self, directory: str) -> list[tuple[str, str, str]]:
        """``(directory, scope, key)`` of the markers that make ``directory`` listable and
        that this process has not seen written yet."""
        if not directory or directory in self._known_dirs:
            return []
        parts = directory.split("/")
        missing: list[tuple[str, str, str]] = []
        for depth in range(len(parts)):
            full = "/".join(parts[: depth + 1])
            if full not in self._known_dirs:
                parent = "/".join(parts[:depth])
                missing.append((full, self._scope(parent), parts[depth] + MARKER_SUFFIX))
        return missing

    async def _after_landing(self, loc: _Location, old: FileRecord | None, new: FileRecord) -> None:
        """Drop the replaced version's chunks (best effort; the port wrote the index)."""
        if old is not None and old.live and old.token and old.token != new.token:
            await self._discard(loc.scope, old.all_chunk_keys(loc.name))

    async def _write_index(
        self, operation: MemoryOperation, path: str, mutation: MemoryMutation
    ) -> None:
        scope, key = self._index_key(operation)
        entry = IndexEntry(digest(operation.fingerprint), mutation.version, mutation.existed, path)
        try:
            await self.kv.create(scope, key, entry.dump(), ttl=self._receipt_ttl)
        except ConflictError:
            pass  # a concurrent replay indexed it already
        # Any other failure propagates: a replay is complete only once get_operation can
        # find it, and the caller's next retry repairs the index again.

    async def _discard(self, scope: str, keys: Sequence[str]) -> None:
        async def drop(key: str) -> None:
            try:
                await self.kv.delete(scope, key)
            except Exception as exc:
                logger.warning("could not delete memory chunk (%s); collect_garbage will", exc)

        await asyncio.gather(*(drop(k) for k in keys))

    # -- reads ----------------------------------------------------------------------------

    async def _fetch(
        self,
        scope: str,
        files: Sequence[tuple[str, FileRecord]],
        max_chars: int,
        *,
        metadata: bool,
    ) -> dict[str, tuple[str, str | None]]:
        """Content (cut to ``max_chars``) and encoded metadata of live records, in one batched read.

        A file whose chunks are gone (its record was replaced meanwhile) is left out.
        """
        wanted: list[str] = []
        for name, record in files:
            if record.chunked:
                wanted += record.chunk_keys(name, max_chars)
            if metadata and record.metadata_chunks:
                wanted += record.metadata_keys(name)
        chunks = await self.kv.get_many(scope, wanted) if wanted else {}
        out: dict[str, tuple[str, str | None]] = {}
        for name, record in files:
            if record.chunked:
                keys = record.chunk_keys(name, max_chars)
                if any(k not in chunks for k in keys):
                    continue
                try:
                    text = "".join(decode_text(chunks[k].value) for k in keys)[:max_chars]
                except UnicodeDecodeError:
                    continue  # a damaged chunk: the caller reports the file as corrupt
            else:
                text = (record.content or "")[:max_chars]
            meta = record.metadata
            if metadata and record.metadata_chunks:
                keys = record.metadata_keys(name)
                if any(k not in chunks for k in keys):
                    continue
                try:
                    meta = b"".join(chunks[k].value for k in keys).decode("utf-8", "surrogatepass")
                except UnicodeDecodeError:
                    continue
            out[name] = (text, meta)
        return out

    async def _walk(
        self, directory: str, key_prefix: str, page_size: int
    ) -> AsyncGenerator[tuple[str, str, FileRecord], None]:
        """Live files under ``directory`` whose key starts with ``key_prefix``, in path order."""
        scope = self._scope(directory)
        base = f"{directory}/" if directory else ""
        start_after: str | None = None
        while True:
            page = await self.kv.scan(
                scope, prefix=key_prefix, start_after=start_after, limit=page_size, values=True
            )
            for item in page:
                if item.key.startswith(INTERNAL_KEY_MARK):
                    return
                if item.key.endswith(MARKER_SUFFIX):
                    async with aclosing(self._walk(base + item.key[:-1], "", page_size)) as nested:
                        async for found in nested:
                            yield found
                    continue
                record = self._live_file(scope, base, item.key, item.entry)
                if record is not None:
                    yield base + item.key, item.key, record
            if len(page) < page_size:
                return
            start_after = page[-1].key

    def _live_file(self, scope: str, base: str, key: str, entry: Entry | None) -> FileRecord | None:
        """The record of a file a scan found, if live; a damaged one is reported and skipped."""
        try:
            record = self._decode(entry, None, where=f"{scope}/{key}")
        except CorruptRecordError as exc:
            self.problems.report(base + key, exc)
            return None
        return record if record is not None and record.live else None

    async def _directories(self, directory: str) -> AsyncGenerator[str, None]:
        """``directory`` and every directory below it."""
        yield directory
        base = f"{directory}/" if directory else ""
        start_after: str | None = None
        scope = self._scope(directory)
        while True:
            page = await self.kv.scan(
                scope, start_after=start_after, limit=self._page_size, values=False
            )
            for item in page:
                if item.key.startswith(INTERNAL_KEY_MARK):
                    return
                if item.key.endswith(MARKER_SUFFIX):
                    async with aclosing(self._directories(base + item.key[:-1])) as nested:
                        async for found in nested:
                            yield found
            if len(page) < self._page_size:
                return
            start_after = page[-1].key

    async def _collect_scope(self, scope: str, now: float) -> int:
        return await self._collect_chunks(scope, now) + await self._collect_vectors(scope)

    async def _collect_vectors(self, scope: str) -> int:
        """Delete vector records (of any model) whose file is gone; a damaged file record
        keeps its vectors. A file created again meanwhile may lose its new vectors: its
        next search computes them again."""
        by_name: dict[str, list[str]] = {}
        async for item in self.kv.iter_scan(
            scope, prefix=VECTOR_PREFIX, page_size=self._page_size, values=False
        ):
            name = item.key[len(VECTOR_PREFIX) :].partition("/")[2]
            by_name.setdefault(name, []).append(item.key)
        if not by_name:
            return 0
        records = await self.kv.get_many(scope, list(by_name))
        doomed: list[str] = []
        for name, keys in by_name.items():
            entry = records.get(name)
            try:
                record = (
                    FileRecord.load(entry.value, where=repr(f"{scope}/{name}")) if entry else None
                )
            except CorruptRecordError:
                continue
            if record is None or not record.live:
                doomed += keys
        current = await self.kv.get_many(scope, doomed) if doomed else {}
        deleted = await asyncio.gather(
            *(
                self.kv.delete(scope, key, expected_version=entry.version)
                for key, entry in current.items()
            )
        )
        return sum(deleted)

    async def _collect_chunks(self, scope: str, now: float) -> int:
        by_name: dict[str, list[tuple[str, str]]] = {}
        async for item in self.kv.iter_scan(
            scope, prefix=CHUNK_PREFIX, page_size=self._page_size, values=False
        ):
            parsed = parse_chunk_key(item.key)
            if parsed is not None:
                by_name.setdefault(parsed[0], []).append((parsed[1], item.key))
        if not by_name:
            return 0
        records = await self.kv.get_many(scope, list(by_name))
        doomed: list[str] = []
        for name, chunks in by_name.items():
            entry = records.get(name)
            try:
                record = (
                    FileRecord.load(entry.value, where=repr(f"{scope}/{name}")) if entry else None
                )
            except CorruptRecordError as exc:
                # Which chunks a damaged record references is unknown: keep them all.
                self.problems.report(f"{scope}/{name}", exc)
                continue
            keep = record.token if record is not None and record.live else None
            for token, key in chunks:
                if token != keep and _token_age(token, now) >= self._chunk_grace:
                    doomed.append(key)
        await asyncio.gather(*(self.kv.delete(scope, key) for key in doomed))
        return len(doomed)


def _staged_keys(name: str, staged: _Staged) -> list[str]:
    keys: list[str] = []
    if staged.content_written:
        keys += [
            content_chunk_key(name, staged.token, i) for i in range(len(staged.content_pieces))
        ]
    if staged.metadata_written:
        keys += [
            metadata_chunk_key(name, staged.token, i) for i in range(len(staged.metadata_pieces))
        ]
    return keys


def _shaped_record(
    shape: _Shape,
    content: str,
    metadata: str | None,
    chunks: _Staged | None,
    *,
    version: str,
    operation_id: str | None,
    receipts: list[Receipt],
    written_at: int,
) -> FileRecord:
    """The live record of ``shape``; ``chunks`` holds what it lists as chunks (None: nothing)."""
    return FileRecord(
        live=True,
        version=version,
        operation_id=operation_id,
        length=len(content),
        content=None if shape.content else content,
        token=chunks.token if chunks is not None else None,
        chunks=chunks.content_sizes if chunks is not None and shape.content else [],
        metadata=None if shape.metadata else metadata,
        metadata_chunks=len(chunks.metadata_pieces) if chunks is not None and shape.metadata else 0,
        receipts=list(receipts),
        written_at=written_at,
    )


def _written_at(record: FileRecord) -> float | None:
    """When a file's version was written: its record says, or (records written before it
    did) its chunk token or newest receipt; None when nothing tells."""
    if record.written_at is not None:
        return float(record.written_at)
    made = _token_time(record.token) if record.token else None
    if made is not None:
        return made
    return max((r.at for r in record.receipts), default=None)


def _token_time(token: str) -> float | None:
    """When the chunk set named ``token`` was staged (see ``_stage``); None: not a token
    this store writes."""
    try:
        return float(int(token.partition("-")[0], 16))
    except ValueError:
        return None


def _token_age(token: str, now: float) -> float:
    made = _token_time(token)
    return float("inf") if made is None else now - made  # inf: never referenced


def _check_operation(operation: object) -> None:
    """Refuse, before anything is written, an ``operation`` that is not None or a
    :class:`~pydantic_ai_harness.memory.MemoryOperation` (or an object with its string
    ``id`` and ``fingerprint``): the receipt is keyed and checked by those two."""
    if operation is None or type(operation) is _harness.MemoryOperation:
        return
    if not (
        isinstance(getattr(operation, "id", None), str)
        and isinstance(getattr(operation, "fingerprint", None), str)
    ):
        raise TypeError(
            "operation must be a pydantic_ai_harness.memory.MemoryOperation (string id and "
            f"fingerprint), got {type(operation).__name__}"
        )


def _reused(operation: MemoryOperation) -> MemoryOperationConflictError:
    return _harness.MemoryOperationConflictError(
        f"operation id {operation.id!r} was reused with different arguments"
    )


def _matches_within(
    sources: Sequence[tuple[str, str, float]], prefix: str, max_chars: int, max_file_chars: int
) -> tuple[list[MemorySearchMatch], bool]:
    """A search's matches from (path, text, score) in rank order: a snippet of each text
    (at most ``max_file_chars``) while the paths shown (without ``prefix``) and snippets
    fit in ``max_chars``; and whether that budget left some out."""
    matches: list[MemorySearchMatch] = []
    remaining = max_chars
    for path, source, score in sources:
        visible = path.removeprefix(prefix)
        available = remaining - len(visible)
        if available <= 0:
            return matches, True
        snippet = cut_snippet(source, min(available, max_file_chars))
        matches.append(_harness.MemorySearchMatch(path=path, snippet=snippet, score=score))
        remaining -= len(visible) + len(snippet)
    return matches, False
