"""The native vector port on Firestore: nearest passages found by ``find_nearest``.

Layout, beside the KV store's ``scopes`` under its namespace document (so stores of
different collections or prefixes never share an index)::

    COLLECTION/{prefix id}/vectors/{scope id}/models/{model key}/vector_files/{name id}
    COLLECTION/{prefix id}/vectors/{scope id}/models/{model key}/vector_passages/{passage id}

Scope and name ids are the KV store's own (:func:`~agent_stores_firestore.ids.encode_id`:
reversible, in key order, and no longer than the KV entry's id, which the KV store bounds),
so a file document's id is its KV entry's id and a scope's files are read in key order
with a ``__name__`` range. The model is its 16-hex-digit key
(:func:`~agent_stores.memory.vectors.model_key`). The ``vectors/{scope id}`` and ``models``
documents are never written: they exist only as parents.

* ``vector_files`` — one document per name the store upserted: ``kv`` (the KV version of
  the record it was checked against), ``vkv`` (of the vector record), and for a searchable
  file ``searchable: true``, ``fv`` (file version), ``dims``, ``n`` (passage count). A
  tombstone or directory marker is ``searchable: false``, kept so :meth:`unindexed` stops
  listing it.
* ``vector_passages`` — one document per passage, id ``{sha256(name)[:32]}-{ordinal}``
  (bounded, whatever the name): ``name``, ``fv``, ``ord``, ``start``, ``end``, ``dims``,
  ``f32`` (the float32 vector as bytes, for exact scoring) and, up to Firestore's 2,048
  dimensions, ``embedding`` (a Firestore ``Vector``, for ``find_nearest``).

Writes. :meth:`~FirestoreVectorPort.upsert` reads the files' documents (one batched get,
their passage counts only), then writes, per file, its passages, the deletes of the
passages it no longer has, and its file document last, packed into batches of at most
500 writes and 8 MiB; a file that fits one batch is replaced atomically, a larger one is
split with its file document in the last batch. A crash between batches leaves a file
document old or missing, which :meth:`unindexed` lists; a passage of another file
version than its file document's, or beyond its count, is never used (passage ids are
``(name, ordinal)``, so the next upsert overwrites or deletes them). :meth:`remove`
deletes file documents first, then every passage of those names (found by ``name in``
queries, so passages a crash left behind go too). :meth:`drop_scope` deletes both
collections of every model of the scope. Every write is unconditional, so the store's
retries may repeat it harmlessly. Passage documents are built as protobuf messages
directly (:func:`_passage_message`): the client library encodes a ``Vector`` a hundred
times slower.

Reads, and their cost in document reads:

* :meth:`unindexed` — Firestore has no join: the KV entries of the key range are read in
  key order with a projection (nonce and expiry: the version, never the value), pages of
  :data:`UNINDEXED_PAGE`, and the file documents of the same ids with one batched get;
  their versions are compared here. A search that finds everything indexed therefore
  reads about twice the files of the namespace (every KV entry under the prefix, every
  file document). Cheaper would need a per-scope change counter the KV writes bump (one
  read to learn nothing changed), which the KV layout does not have.
* :meth:`nearest` — the considered files are read from ``vector_files`` (searchable,
  in key order within the prefix, at most ``max_files + 1``, a projection without the
  passages): about one read per considered file. When their passages of the query's
  dimension number at most :data:`EXACT_MAX_PASSAGES`, all of them are read (``name``
  range, projection with ``f32``) and scored exactly with numpy: exact for a small scope.
  Above it, ``find_nearest`` (``DOT_PRODUCT``: the vectors are unit length, so the dot
  product is the cosine similarity the generic path computes) asks for ``limit x``
  :data:`OVERFETCH` passages (at most Firestore's 1,000), keeps those of considered files
  at their indexed version, best passage per file; if that yields fewer than
  ``min(limit, files with passages)`` files, the exact read answers instead. When
  ``find_nearest``'s passages are the true nearest ones (the emulator searches
  exhaustively, as Firestore's flat index is meant to), that answer is exact too: a
  file's first passage in the ranking is its best, and a file with none among the
  ``limit x 10`` ranks below every file found. It is as approximate as Firestore's
  search otherwise (the contract's recall test checks 90%). Finally the vector
  records of the files to be returned are read (a projection: their version, never the
  vectors) and those changed since the upsert are reported as ``stale``.

Production Firestore needs, for the large path, one vector index per dimension on the
collection group ``vector_passages`` (scope and model are in the path, so no pre-filter
and no composite fields)::

    gcloud firestore indexes composite create --collection-group=vector_passages \\
        --query-scope=COLLECTION --field-config=field-path=embedding,\\
    vector-config='{"dimension":"1536","flat":"{}"}'

Without it ``find_nearest`` fails (FAILED_PRECONDITION, naming the index): the port logs
that once per dimension and answers from the exact read. Exempting ``f32`` and
``embedding`` of ``vector_passages`` from single-field indexing saves index writes.
Google's emulator needs no index.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_stores.backend import (
    NearestFiles,
    Passage,
    VectorEntry,
    VectorHit,
    model_key,
    numpy_module,
    prefix_upper_bound,
    vector_key,
    within_deadline,
)

from .ids import MAX_ID_BYTES, checked_id, decode_id, encode_id
from .kv import MAX_BATCH_WRITES

if TYPE_CHECKING:
    from agent_stores.backend import Matrix
    from google.cloud.firestore import AsyncClient, AsyncCollectionReference

    from .kv import FirestoreKV

log = logging.getLogger("agent_stores.memory")

VECTORS = "vectors"
MODELS = "models"
FILES = "vector_files"
PASSAGES = "vector_passages"

# File document fields.
F_NAME = "name"
F_KV = "kv"
F_VKV = "vkv"
F_FV = "fv"
F_DIMS = "dims"
F_COUNT = "n"
F_SEARCHABLE = "searchable"
# Passage document fields (and F_NAME, F_FV, F_DIMS).
F_ORD = "ord"
F_START = "start"
F_END = "end"
F_RAW = "f32"
F_EMBEDDING = "embedding"
#: The field ``find_nearest`` writes each result's dot product into.
F_SIMILARITY = "similarity"

#: A search considering at most this many passages reads and scores them all exactly.
EXACT_MAX_PASSAGES = 1_000
#: Passages ``find_nearest`` is asked for per file wanted (a file's passages crowd together).
OVERFETCH = 10
#: The fewest passages ``find_nearest`` is asked for.
MIN_CANDIDATES = 50
#: Firestore's ceiling on ``find_nearest``'s limit.
MAX_CANDIDATES = 1_000
#: Firestore's largest ``Vector``; longer vectors are stored as ``f32`` only (exact reads).
MAX_VECTOR_DIMS = 2_048
#: KV entries read per page by :meth:`FirestoreVectorPort.unindexed`.
UNINDEXED_PAGE = 500
#: Documents deleted per page by :meth:`FirestoreVectorPort.drop_scope`.
DROP_PAGE = 300
#: Values of one ``in`` filter (Firestore's limit on a disjunction).
IN_VALUES = 30
#: Queries or batches sent at once.
CONCURRENCY = 8
#: Bytes of one batch, estimated (Firestore refuses a commit request over 10 MiB).
BATCH_BYTES = 8 << 20


def _passage_id(name: str, ordinal: int) -> str:
    """A passage's document id: bounded and valid whatever the name."""
    return f"{hashlib.sha256(name.encode('utf-8')).hexdigest()[:32]}-{ordinal}"


def _file_id(name: str) -> str:
    """A file document's id: its KV entry's (InvalidIdError when no KV entry can have it)."""
    return checked_id("key", name)


def _id_range(key_prefix: str, bound: str | None) -> tuple[str, str | None] | None:
    """``(low, high)`` ids of the keys in ``[key_prefix, bound)`` (``high`` None: no upper
    bound an id can express; callers check keys), or None when no id starts with the prefix."""
    low = encode_id(key_prefix)
    if len(low.encode("utf-8")) > MAX_ID_BYTES:
        return None
    high = None if bound is None else encode_id(bound)
    if high is not None and len(high.encode("utf-8")) > MAX_ID_BYTES:
        high = None
    return low, high


def _library_problem() -> str | None:
    """Why this google-cloud-firestore cannot run vector queries (None: it can)."""
    try:
        from google.cloud.firestore_v1.async_query import AsyncQuery
        from google.cloud.firestore_v1.base_vector_query import DistanceMeasure
        from google.cloud.firestore_v1.vector import Vector  # noqa: F401
    except ImportError as exc:
        return f"google-cloud-firestore has no vector search ({exc}); upgrade it"
    if not hasattr(AsyncQuery, "find_nearest") or not hasattr(DistanceMeasure, "DOT_PRODUCT"):
        return "google-cloud-firestore is too old for find_nearest with DOT_PRODUCT; upgrade it"
    return None


@dataclass(frozen=True, slots=True)
class _File:
    """A considered file, from its file document."""

    file_version: str
    vectors_kv_version: str | None
    dims: int
    count: int


@dataclass(frozen=True, slots=True)
class _Write:
    """One write of a batch: a set (``data``), a ready ``Write`` message (``message``), or
    a delete (neither)."""

    ref: Any
    data: dict[str, Any] | None
    size: int
    message: Any = None


class FirestoreVectorPort:
    """:class:`~agent_stores.memory.vector_port.VectorPort` on :class:`FirestoreKV`."""

    name = "firestore-find-nearest"

    def __init__(self, kv: FirestoreKV) -> None:
        self.kv = kv
        self._checked = False
        self._reason: str | None = None
        #: dimensions whose missing vector index was already logged
        self._index_missing: set[int] = set()

    # -- availability ---------------------------------------------------------------------

    async def unavailable(self) -> str | None:
        """None when the client library has ``find_nearest`` (the emulator and Firestore
        both answer it); else why not, logged once. Never contacts the server."""
        if not self._checked:
            self._reason = _library_problem()
            if self._reason is not None:
                log.warning(
                    "%s: native vector search unavailable, using the generic path: %s",
                    self.kv.describe(),
                    self._reason,
                )
            self._checked = True
        return self._reason

    # -- collections ----------------------------------------------------------------------

    def _model_doc(self, scope: str, model: str) -> Any:
        return (
            self.kv.namespace.collection(VECTORS)
            .document(checked_id("scope", scope))
            .collection(MODELS)
            .document(model_key(model))
        )

    def _files(self, scope: str, model: str) -> AsyncCollectionReference:
        files: AsyncCollectionReference = self._model_doc(scope, model).collection(FILES)
        return files

    def _passages(self, scope: str, model: str) -> AsyncCollectionReference:
        passages: AsyncCollectionReference = self._model_doc(scope, model).collection(PASSAGES)
        return passages

    async def _stream(self, query: Any) -> list[Any]:
        """Every result of ``query`` (its stream consumed to the end), with retries."""

        async def fetch(seconds: float) -> list[Any]:
            return [snap async for snap in query.stream(retry=None, timeout=seconds)]

        return await self.kv.request(fetch)

    async def _get_all(
        self, client: AsyncClient, refs: list[Any], fields: Sequence[str]
    ) -> dict[str, Any]:
        """Document id -> snapshot of those of ``refs`` that exist (one batched get per
        :data:`UNINDEXED_PAGE` documents), reading only ``fields``."""
        out: dict[str, Any] = {}
        for start in range(0, len(refs), UNINDEXED_PAGE):
            chunk = refs[start : start + UNINDEXED_PAGE]

            async def fetch(seconds: float, chunk: list[Any] = chunk) -> list[Any]:
                return [
                    snap
                    async for snap in client.get_all(
                        chunk, field_paths=list(fields), retry=None, timeout=seconds
                    )
                ]

            for snap in await self.kv.request(fetch):
                if snap.exists:
                    out[snap.id] = snap
        return out

    async def _commit(self, client: AsyncClient, writes: Sequence[_Write]) -> None:
        """One batch of unconditional writes (repeating it after a lost reply is harmless)."""

        async def send(seconds: float) -> None:
            # A fresh batch per attempt: a committed batch forgets its writes.
            batch = client.batch()
            ready = []
            for write in writes:
                if write.message is not None:
                    ready.append(write.message)
                    continue
                if ready:
                    _add_messages(batch, ready)
                    ready = []
                if write.data is None:
                    batch.delete(write.ref)
                else:
                    batch.set(write.ref, write.data)
            if ready:
                _add_messages(batch, ready)
            await batch.commit(retry=None, timeout=seconds)

        await self.kv.request(send)

    # -- writes ---------------------------------------------------------------------------

    async def upsert(self, scope: str, model: str, files: Sequence[VectorEntry]) -> None:
        """Replace each file's passages and file document (see the module docstring)."""
        if not files:
            return
        latest = {entry.name: entry for entry in files}
        await within_deadline(self.kv, self._upsert(scope, model, list(latest.values())))

    async def _upsert(self, scope: str, model: str, entries: list[VectorEntry]) -> None:
        np = numpy_module()
        client = await self.kv.connect()
        files = self._files(scope, model)
        passages = self._passages(scope, model)
        refs = [files.document(_file_id(entry.name)) for entry in entries]
        # The passages each file document counts: those the new state does not overwrite
        # are deleted. (Passages a crash left uncounted are never used: see _current.)
        before = await self._get_all(client, refs, [F_COUNT])
        groups: list[list[_Write]] = []
        for entry, ref in zip(entries, refs, strict=True):
            writes: list[_Write] = []
            record = entry.vectors
            count = 0
            if record is not None and record.passages:
                matrix = np.ascontiguousarray(record.vectors, dtype="<f4")
                if matrix.ndim != 2 or matrix.shape[0] != len(record.passages):
                    raise ValueError(
                        f"vector record of {entry.name!r}: {len(record.passages)} passages, "
                        f"vectors of shape {tuple(matrix.shape)}"
                    )
                dims = int(matrix.shape[1])
                size = 300 + len(entry.name) + 4 * dims + (11 * dims if dims <= 2048 else 0)
                for ordinal, passage in enumerate(record.passages):
                    doc = passages.document(_passage_id(entry.name, ordinal))
                    message = _passage_message(
                        doc, entry.name, record.file_version, ordinal, passage, matrix[ordinal]
                    )
                    writes.append(_Write(doc, None, size, message))
                count = len(record.passages)
            old = before.get(ref.id)
            counted = (old.to_dict() or {}).get(F_COUNT) if old is not None else None
            for ordinal in range(count, counted if isinstance(counted, int) else 0):
                writes.append(
                    _Write(passages.document(_passage_id(entry.name, ordinal)), None, 200)
                )
            writes.append(_Write(ref, _file_data(entry), 500))
            groups.append(writes)
        # In order: a file split over batches has its file document in the last one.
        for batch in _batches(groups):
            await self._commit(client, batch)

    async def _passage_ids(
        self, passages: AsyncCollectionReference, names: Sequence[str]
    ) -> dict[str, set[str]]:
        """Name -> ids of the passage documents stored for it, of those of ``names``."""
        from google.cloud.firestore_v1.base_query import FieldFilter

        chunks = [list(names[i : i + IN_VALUES]) for i in range(0, len(names), IN_VALUES)]
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(chunk: list[str]) -> list[Any]:
            query = passages.where(filter=FieldFilter(F_NAME, "in", chunk)).select([F_NAME])
            async with gate:
                return await self._stream(query)

        found: dict[str, set[str]] = {}
        for snaps in await asyncio.gather(*(one(chunk) for chunk in chunks)):
            for snap in snaps:
                name = (snap.to_dict() or {}).get(F_NAME)
                if isinstance(name, str):
                    found.setdefault(name, set()).add(snap.id)
        return found

    async def remove(self, scope: str, model: str, names: Sequence[str]) -> None:
        """File documents first (so :meth:`unindexed` lists the names), then every passage
        of those names."""
        if not names:
            return
        await within_deadline(self.kv, self._remove(scope, model, sorted(set(names))))

    async def _remove(self, scope: str, model: str, names: list[str]) -> None:
        client = await self.kv.connect()
        files = self._files(scope, model)
        passages = self._passages(scope, model)
        refs = [files.document(_file_id(name)) for name in names]
        for start in range(0, len(refs), MAX_BATCH_WRITES):
            await self._commit(
                client, [_Write(ref, None, 200) for ref in refs[start : start + MAX_BATCH_WRITES]]
            )
        existing = await self._passage_ids(passages, names)
        doomed = [passages.document(i) for ids in existing.values() for i in sorted(ids)]
        for start in range(0, len(doomed), MAX_BATCH_WRITES):
            await self._commit(
                client,
                [_Write(ref, None, 200) for ref in doomed[start : start + MAX_BATCH_WRITES]],
            )

    async def drop_scope(self, scope: str) -> None:
        """Delete the file documents, then the passages, of every model of ``scope``."""
        await within_deadline(self.kv, self._drop_scope(scope))

    async def _drop_scope(self, scope: str) -> None:
        client = await self.kv.connect()
        models = self.kv.namespace.collection(VECTORS).document(checked_id("scope", scope))
        models = models.collection(MODELS)

        async def listed(seconds: float) -> list[Any]:
            # The model documents are never written: listed as missing parents.
            return [ref async for ref in models.list_documents(retry=None, timeout=seconds)]

        for model_doc in await self.kv.request(listed):
            for name in (FILES, PASSAGES):
                collection = model_doc.collection(name)
                while True:
                    page = collection.order_by("__name__").select([F_NAME]).limit(DROP_PAGE)
                    snaps = await self._stream(page)
                    if not snaps:
                        break
                    await self._commit(client, [_Write(s.reference, None, 200) for s in snaps])

    # -- reads ----------------------------------------------------------------------------

    async def unindexed(
        self, scope: str, model: str, key_prefix: str, below: str, limit: int
    ) -> list[str]:
        """Live KV keys in ``[key_prefix, below)`` whose version is not the one indexed."""
        if limit <= 0:
            return []
        return await within_deadline(
            self.kv, self._unindexed(scope, model, key_prefix, below, limit)
        )

    async def _unindexed(
        self, scope: str, model: str, key_prefix: str, below: str, limit: int
    ) -> list[str]:
        upper = prefix_upper_bound(key_prefix)
        bound = below if upper is None or below < upper else upper
        ids = _id_range(key_prefix, bound)
        if bound <= key_prefix or ids is None:
            return []
        low, high = ids
        client = await self.kv.connect()
        entries = self.kv.entries_of(scope)
        files = self._files(scope, model)
        now = self.kv.clock()
        found: list[str] = []
        after: str | None = None
        # A page of KV entries at a time (their versions only), then one batched read of
        # their file documents to compare: until ``limit`` keys or the end of the range.
        while True:
            query = _id_page(entries, low if after is None else after, high, first=after is None)
            snaps = await self._stream(
                query.select(list(self.kv.VERSION_FIELDS)).limit(UNINDEXED_PAGE)
            )
            live, past = self._live_entries(snaps, key_prefix, bound, now)
            indexed = await self._get_all(
                client, [files.document(doc_id) for _, _, doc_id in live], [F_KV]
            )
            for key, version, doc_id in live:
                snap = indexed.get(doc_id)
                if snap is None or (snap.to_dict() or {}).get(F_KV) != version:
                    found.append(key)
                    if len(found) >= limit:
                        return found
            if past or len(snaps) < UNINDEXED_PAGE:
                return found
            after = snaps[-1].id

    def _live_entries(
        self, snaps: Sequence[Any], key_prefix: str, bound: str, now: float
    ) -> tuple[list[tuple[str, str, str]], bool]:
        """(key, version, document id) of the unexpired entries of ``key_prefix`` below
        ``bound`` in a page of entry documents (ids not ours are skipped), and whether the
        page reached ``bound`` (ids sort like keys: the rest are beyond it too)."""
        live: list[tuple[str, str, str]] = []
        for snap in snaps:
            try:
                key = decode_id(snap.id)
            except ValueError:
                continue  # not ours
            if key >= bound:
                return live, True
            stated = self.kv.entry_version(snap)
            if stated is None or not key.startswith(key_prefix):
                continue
            version, expires_at = stated
            if expires_at is not None and expires_at <= now:
                continue
            live.append((key, version, snap.id))
        return live, False

    async def nearest(
        self,
        scope: str,
        model: str,
        query: Matrix,
        *,
        key_prefix: str,
        limit: int,
        max_files: int,
    ) -> NearestFiles:
        """Exact read of a small considered set, ``find_nearest`` (exact fallback) of a
        large one; hits whose vector record changed are reported stale."""
        return await within_deadline(
            self.kv, self._nearest(scope, model, query, key_prefix, limit, max(0, max_files))
        )

    async def _nearest(
        self, scope: str, model: str, query: Matrix, key_prefix: str, limit: int, max_files: int
    ) -> NearestFiles:
        np = numpy_module()
        vector = np.ascontiguousarray(np.asarray(query, dtype=np.float32).reshape(-1))
        dims = int(vector.shape[0])
        await self.kv.connect()
        files, beyond = await self._considered(scope, model, key_prefix, max_files)
        considered, more = len(files), beyond is not None
        passages = sum(f.count for f in files.values() if f.dims == dims)
        with_passages = sum(1 for f in files.values() if f.dims == dims and f.count)
        if passages == 0 or limit <= 0:
            return NearestFiles([], considered, more)
        collection = self._passages(scope, model)
        if passages > EXACT_MAX_PASSAGES and dims <= MAX_VECTOR_DIMS:
            ranked = await self._search_index(collection, vector, files, limit)
            if ranked is not None:
                hits, stale = await self._fresh(scope, model, ranked, files, limit)
                if len(hits) >= min(limit, with_passages - len(stale)):
                    return NearestFiles(hits, considered, more, stale)
        ranked = await self._read_exact(collection, vector, files, key_prefix, beyond)
        hits, stale = await self._fresh(scope, model, ranked, files, limit)
        return NearestFiles(hits, considered, more, stale)

    async def _considered(
        self, scope: str, model: str, key_prefix: str, max_files: int
    ) -> tuple[dict[str, _File], str | None]:
        """The first ``max_files`` searchable files of the prefix in key order, and the
        name of the next one (None: there is none)."""
        from google.cloud.firestore_v1.base_query import FieldFilter

        ids = _id_range(key_prefix, prefix_upper_bound(key_prefix))
        if ids is None:
            return {}, None
        low, high = ids
        collection = self._files(scope, model)
        query = collection.where(filter=FieldFilter(F_SEARCHABLE, "==", True)).where(
            filter=FieldFilter("__name__", ">=", collection.document(low))
        )
        if high is not None:
            query = query.where(filter=FieldFilter("__name__", "<", collection.document(high)))
        query = (
            query.order_by("__name__").select([F_FV, F_VKV, F_DIMS, F_COUNT]).limit(max_files + 1)
        )
        files: dict[str, _File] = {}
        for snap in await self._stream(query):
            try:
                name = decode_id(snap.id)
            except ValueError:
                continue  # not ours
            if not name.startswith(key_prefix):
                continue
            if len(files) >= max_files:
                return files, name
            data = snap.to_dict() or {}
            vkv = data.get(F_VKV)
            files[name] = _File(
                file_version=str(data.get(F_FV)),
                vectors_kv_version=vkv if isinstance(vkv, str) else None,
                dims=int(data.get(F_DIMS) or 0),
                count=int(data.get(F_COUNT) or 0),
            )
        return files, None

    async def _search_index(
        self,
        collection: AsyncCollectionReference,
        vector: Any,
        files: dict[str, _File],
        limit: int,
    ) -> list[VectorHit] | None:
        """Each considered file's best passage among ``find_nearest``'s, best first; None
        when the database has no vector index for this dimension (logged once)."""
        from google.api_core.exceptions import FailedPrecondition
        from google.cloud.firestore_v1.base_vector_query import DistanceMeasure
        from google.cloud.firestore_v1.vector import Vector

        wanted = min(MAX_CANDIDATES, max(MIN_CANDIDATES, limit * OVERFETCH))
        query = collection.select([F_NAME, F_FV, F_ORD, F_START, F_END, F_SIMILARITY]).find_nearest(
            vector_field=F_EMBEDDING,
            query_vector=Vector(vector.astype("float64").tolist()),
            limit=wanted,
            distance_measure=DistanceMeasure.DOT_PRODUCT,
            distance_result_field=F_SIMILARITY,
        )
        missing: list[FailedPrecondition] = []

        async def fetch(seconds: float) -> list[Any]:
            try:
                return [snap async for snap in query.stream(retry=None, timeout=seconds)]
            except FailedPrecondition as exc:  # no vector index: an answer, not a failure
                missing.append(exc)
                return []

        snaps = await self.kv.request(fetch)
        if missing:
            dims = int(vector.shape[0])
            if dims not in self._index_missing:
                self._index_missing.add(dims)
                log.warning(
                    "%s: find_nearest needs a vector index (collection group %s, field %s, "
                    "dimension %d); searching by exact reads until it exists: %s",
                    self.kv.describe(),
                    PASSAGES,
                    F_EMBEDDING,
                    dims,
                    str(missing[0]).splitlines()[0][:500],
                )
            return None
        best: dict[str, VectorHit] = {}
        for snap in snaps:
            data = snap.to_dict() or {}
            name = data.get(F_NAME)
            file = files.get(name) if isinstance(name, str) else None
            if file is None or not isinstance(name, str) or not _current(data, file):
                continue
            hit = VectorHit(
                name,
                file.file_version,
                Passage(int(data[F_START]), int(data[F_END])),
                float(data.get(F_SIMILARITY) or 0.0),
            )
            if name not in best or hit.similarity > best[name].similarity:
                best[name] = hit
        return sorted(best.values(), key=lambda hit: (-hit.similarity, hit.name))

    async def _read_exact(
        self,
        collection: AsyncCollectionReference,
        vector: Any,
        files: dict[str, _File],
        key_prefix: str,
        beyond: str | None,
    ) -> list[VectorHit]:
        """Every considered file's best passage, scored exactly; best first, ties by name."""
        from google.cloud.firestore_v1.base_query import FieldFilter

        np = numpy_module()
        dims = int(vector.shape[0])
        query: Any = collection
        if key_prefix:
            query = query.where(filter=FieldFilter(F_NAME, ">=", key_prefix))
        high = beyond if beyond is not None else prefix_upper_bound(key_prefix)
        if high is not None:
            query = query.where(filter=FieldFilter(F_NAME, "<", high))
        rows: list[tuple[str, int, int, int]] = []
        raw: list[bytes] = []
        for snap in await self._stream(query.select([F_NAME, F_FV, F_ORD, F_START, F_END, F_RAW])):
            data = snap.to_dict() or {}
            name = data.get(F_NAME)
            file = files.get(name) if isinstance(name, str) else None
            blob = data.get(F_RAW)
            if (
                file is None
                or not isinstance(name, str)
                or file.dims != dims
                or not isinstance(blob, bytes)
                or len(blob) != 4 * dims
                or not _current(data, file)
            ):
                continue
            rows.append((name, int(data[F_ORD]), int(data[F_START]), int(data[F_END])))
            raw.append(blob)
        if not rows:
            return []
        matrix = np.frombuffer(b"".join(raw), dtype="<f4").reshape(len(rows), dims)
        scores = matrix @ vector
        best: dict[str, tuple[float, int]] = {}  # name -> (score, row)
        for index, row in enumerate(rows):
            score = float(scores[index])
            held = best.get(row[0])
            if held is None or score > held[0] or (score == held[0] and row[1] < rows[held[1]][1]):
                best[row[0]] = (score, index)
        ranked = sorted(best.items(), key=lambda item: (-item[1][0], item[0]))
        return [
            VectorHit(name, files[name].file_version, Passage(rows[i][2], rows[i][3]), score)
            for name, (score, i) in ranked
        ]

    async def _fresh(
        self,
        scope: str,
        model: str,
        ranked: list[VectorHit],
        files: dict[str, _File],
        limit: int,
    ) -> tuple[list[VectorHit], list[str]]:
        """The first ``limit`` of ``ranked`` whose vector record is live at the KV version
        upserted, and the names passed over because it is not (read in rounds, so stale
        files never push out a fresh one)."""
        client = await self.kv.connect()
        entries = self.kv.entries_of(scope)
        hits: list[VectorHit] = []
        stale: list[str] = []
        position = 0
        while len(hits) < limit and position < len(ranked):
            chunk = ranked[position : position + limit - len(hits)]
            position += len(chunk)
            ids: dict[str, str] = {}
            for hit in chunk:
                if files[hit.name].vectors_kv_version is not None:
                    doc_id = encode_id(vector_key(model, hit.name))
                    if len(doc_id.encode("utf-8")) <= MAX_ID_BYTES:
                        ids[hit.name] = doc_id
            snaps = await self._get_all(
                client, [entries.document(i) for i in ids.values()], self.kv.VERSION_FIELDS
            )
            now = self.kv.clock()
            for hit in chunk:
                expected = files[hit.name].vectors_kv_version
                if expected is not None:
                    snap = snaps.get(ids.get(hit.name, ""))
                    stated = None if snap is None else self.kv.entry_version(snap)
                    if (
                        stated is None
                        or stated[0] != expected
                        or (stated[1] is not None and stated[1] <= now)
                    ):
                        stale.append(hit.name)
                        continue
                hits.append(hit)
        return hits, stale


def _current(data: dict[str, Any], file: _File) -> bool:
    """Whether a passage document belongs to its file document's indexed state."""
    ordinal = data.get(F_ORD)
    return (
        data.get(F_FV) == file.file_version
        and isinstance(ordinal, int)
        and 0 <= ordinal < file.count
    )


#: Bytes of one double in a serialized ``ArrayValue``: ``values`` (field 1, length 9)
#: holding a ``Value`` whose ``double_value`` (field 3, fixed64) follows.
_DOUBLE_HEAD = (0x0A, 0x09, 0x19)


def _passage_message(
    ref: Any, name: str, file_version: str, ordinal: int, passage: Passage, row: Any
) -> Any:
    """The ``Write`` that sets a passage document, built as a protobuf message directly.

    ``WriteBatch.set`` encodes a ``Vector`` one double at a time through proto-plus (about
    5 ms for 256 dimensions: half a minute for 6,000 passages); here the vector's
    ``ArrayValue`` is serialized with numpy and parsed in one call. It uses two
    google-cloud-firestore internals, ``DocumentReference._document_path`` and
    ``WriteBatch._add_write_pbs`` (:func:`_add_messages`); ``tests/test_firestore_vector_port.py``
    reads such a document back through the client to check the encoding.
    """
    np = numpy_module()
    from google.cloud.firestore_v1.types import Write

    message = Write.pb()()
    document = message.update
    document.name = ref._document_path
    fields = document.fields
    fields[F_NAME].string_value = name
    fields[F_FV].string_value = file_version
    fields[F_ORD].integer_value = ordinal
    fields[F_START].integer_value = passage.start
    fields[F_END].integer_value = passage.end
    dims = int(row.shape[0])
    fields[F_DIMS].integer_value = dims
    fields[F_RAW].bytes_value = np.ascontiguousarray(row, dtype="<f4").tobytes()
    if dims <= MAX_VECTOR_DIMS:
        wire = np.empty((dims, 11), dtype=np.uint8)
        wire[:, :3] = _DOUBLE_HEAD
        wire[:, 3:] = np.ascontiguousarray(row, dtype="<f8").view(np.uint8).reshape(dims, 8)
        vector = fields[F_EMBEDDING].map_value.fields
        vector["__type__"].string_value = "__vector__"
        vector["value"].array_value.MergeFromString(wire.tobytes())
    return Write.wrap(message)


def _add_messages(batch: Any, messages: list[Any]) -> None:
    """Add ready ``Write`` messages to ``batch`` (what ``set`` does after encoding)."""
    batch._add_write_pbs(messages)


def _file_data(entry: VectorEntry) -> dict[str, Any]:
    record = entry.vectors
    return {
        F_NAME: entry.name,
        F_KV: entry.kv_version,
        F_VKV: entry.vectors_kv_version,
        F_SEARCHABLE: record is not None,
        F_FV: None if record is None else record.file_version,
        F_DIMS: None if record is None else record.dimensions,
        F_COUNT: 0 if record is None else len(record.passages),
    }


def _batches(groups: list[list[_Write]]) -> Iterator[list[_Write]]:
    """``groups`` (each a file's writes, its file document last) packed in order into
    batches of at most :data:`MAX_BATCH_WRITES` writes and :data:`BATCH_BYTES`; a group
    is kept whole in one batch when it fits an empty one."""
    batch: list[_Write] = []
    size = 0
    for group in groups:
        group_size = sum(write.size for write in group)
        if batch and (
            len(batch) + len(group) > MAX_BATCH_WRITES or size + group_size > BATCH_BYTES
        ):
            yield batch
            batch, size = [], 0
        for write in group:
            if batch and (len(batch) >= MAX_BATCH_WRITES or size + write.size > BATCH_BYTES):
                yield batch
                batch, size = [], 0
            batch.append(write)
            size += write.size
    if batch:
        yield batch


__all__ = ["EXACT_MAX_PASSAGES", "FirestoreVectorPort"]


def _id_page(
    entries: AsyncCollectionReference, start: str, high: str | None, *, first: bool
) -> Any:
    """The query of the entry documents of ``entries`` from document id ``start``
    (included on the ``first`` page, else the last id of the page before: excluded) to
    ``high`` (excluded; None: no end), in id order."""
    from google.cloud.firestore_v1.base_query import FieldFilter

    query = entries.order_by("__name__")
    query = query.where(
        filter=FieldFilter("__name__", ">=" if first else ">", entries.document(start))
    )
    if high is not None:
        query = query.where(filter=FieldFilter("__name__", "<", entries.document(high)))
    return query
