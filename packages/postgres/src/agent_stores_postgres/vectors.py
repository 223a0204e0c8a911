"""The native vector port on PostgreSQL with pgvector: nearest passages found by the server.

Objects, for ``schema=S`` and ``table=T``, created by :meth:`PostgresVectorPort.unavailable`
(not by the schema migrations: the extension may be missing, and a server without it
must keep working with the generic path):

* ``S.T_vec_files`` — one row per ``(scope, model, name)`` the store has upserted: the KV
  version it was checked against, and for a searchable file its file version, dimension
  and passage count (a NULL file version marks a tombstone or directory marker, kept so
  :meth:`~PostgresVectorPort.unindexed` stops listing it). A partial index over the
  searchable rows, with the passage count included, lets a search count and bound its
  considered files from the index alone.
* ``S.T_vec_passages`` — one row per passage: span, dimension and ``embedding vector``
  without a fixed dimension, because one table holds every model and a model may change
  dimension.
* ``S.T_vec_<digest>`` — one HNSW index per ``(model, dimension)``, made on the first
  upsert of that pair: an expression index on ``embedding::vector(D)`` restricted to the
  pair's rows, since pgvector indexes only vectors of one fixed dimension. Searches that
  want it repeat the expression and the predicate as literals. It is built after that
  first upsert's rows are in (one bulk build); later rows are inserted into it one by one,
  which costs pgvector milliseconds per passage, so large upserts should come in batches.

The tables hold a derived index the store can rebuild from the KV vector records at any
time, so they have no migrations: a future layout can drop them and start over. Creating
the extension and the tables is serialised by one database-wide advisory lock, so
concurrent first users (any process, any table prefix) never race on the catalog.

The model is stored as its 16-hex-digit key (:func:`~agent_stores.memory.vectors.model_key`):
short primary keys, and a value safe to write as a literal into index predicates.

Scores are inner products (pgvector's ``<#>``, ``vector_ip_ops``), not ``<=>``: the rows
are unit length, so the inner product is the cosine similarity; it is what the generic
path computes (``matrix @ query``), and a zero row scores 0 where ``<=>`` gives NaN.

Exactness. pgvector 0.6's HNSW scan finds ``hnsw.ef_search`` candidates across the whole
index (every scope of the model) and only then applies the scope and name filters, so a
small scope's files could be missed entirely. A search therefore first counts the
passages it considers (from the files index, bounded by ``max_files``) and scans them
exactly when there are at most :data:`EXACT_MAX_PASSAGES`, which is exact and fast at
that size. Above it the HNSW index is asked for ``limit x`` :data:`OVERFETCH` passages
with ``ef_search`` raised by how small a share of the table the scope is (up to
pgvector's ceiling of 1000); if that yields fewer than ``limit`` files, the search falls
back to the exact scan. Large searches are thus approximate (HNSW recall), small ones
exact, and none returns fewer files than exist.

Passages are sent with binary ``COPY``: the float32 matrix goes as bytes, never as text.
"""

from __future__ import annotations

import hashlib
import logging
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString

import psycopg
from agent_stores.backend import (
    NearestFiles,
    Passage,
    VectorEntry,
    VectorHit,
    model_key,
    numpy_module,
    prefix_upper_bound,
    vector_key,
)
from agent_stores.errors import (
    AppError,
    BackendUnavailableError,
    ResourceClosedError,
    UnsupportedError,
)
from psycopg import AsyncConnection, sql

from .schema import TableNames

if TYPE_CHECKING:
    from agent_stores.backend import Matrix

    from .kv import PostgresKV

log = logging.getLogger("agent_stores.memory")

#: A search considering at most this many passages scans them exactly (no HNSW).
EXACT_MAX_PASSAGES = 5_000
#: Passages an HNSW search asks for per file wanted (a file's passages crowd together).
OVERFETCH = 10
#: Fewest passages an HNSW search asks for (pgvector's default ``ef_search``).
MIN_CANDIDATES = 40
#: ``hnsw.ef_search`` of an HNSW search of a whole table: well above the candidates, since
#: an ``ef_search`` near the number of rows wanted loses many of the best.
EF_SEARCH = 200
#: pgvector's ceiling of ``hnsw.ef_search``.
EF_SEARCH_MAX = 1000
#: pgvector's HNSW indexes ``vector`` of at most this many dimensions; larger ones are
#: always scanned exactly.
HNSW_MAX_DIMS = 2000

# One key for the whole database: CREATE EXTENSION races with every other table prefix's.
_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"agent_stores:pgvector").digest()[:8], "big", signed=True
)

_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_COPY_FIELDS = struct.pack(">h", 8)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class _Names:
    """Quoted names of the port's tables for one ``(schema, table prefix)``."""

    names: TableNames

    def _ident(self, suffix: str) -> sql.Identifier:
        return sql.Identifier(self.names.schema, f"{self.names.table}{suffix}")

    @property
    def files(self) -> sql.Identifier:
        return self._ident("_vec_files")

    @property
    def passages(self) -> sql.Identifier:
        return self._ident("_vec_passages")

    def index_name(self, mkey: str, dims: int) -> str:
        """Unqualified name of the HNSW index of one ``(model key, dimension)``."""
        suffix = hashlib.sha256(f"{mkey}:{dims}".encode()).hexdigest()[:12]
        return f"{self.names.table}_vec_{suffix}"


def _tables_sql(n: _Names, ext: sql.Identifier) -> list[sql.Composed]:
    t = n.names.table
    files_live = sql.Identifier(f"{t}_vec_files_live")
    return [
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {files} ("
            'scope text COLLATE "C" NOT NULL, '
            'model text COLLATE "C" NOT NULL, '
            'name text COLLATE "C" NOT NULL, '
            "kv_version text NOT NULL, "
            "vectors_kv_version text, "
            "file_version text, "
            "dims integer, "
            "passages integer NOT NULL DEFAULT 0, "
            "CONSTRAINT {pkey} PRIMARY KEY (scope, model, name))"
        ).format(files=n.files, pkey=sql.Identifier(f"{t}_vec_files_pkey")),
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS {idx} ON {files} (scope, model, dims, name) "
            "INCLUDE (passages) WHERE file_version IS NOT NULL"
        ).format(idx=files_live, files=n.files),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {passages} ("
            'scope text COLLATE "C" NOT NULL, '
            'model text COLLATE "C" NOT NULL, '
            'name text COLLATE "C" NOT NULL, '
            "ord integer NOT NULL, "
            "dims integer NOT NULL, "
            "start_at integer NOT NULL, "
            "end_at integer NOT NULL, "
            "embedding {ext}.vector NOT NULL, "
            "CONSTRAINT {pkey} PRIMARY KEY (scope, model, name, ord))"
        ).format(passages=n.passages, ext=ext, pkey=sql.Identifier(f"{t}_vec_passages_pkey")),
    ]


class _Statements:
    """The port's statements once the extension's schema is known."""

    def __init__(self, names: TableNames, ext_schema: str) -> None:
        n = self.n = _Names(names)
        ext = self.ext = sql.Identifier(ext_schema)
        self.ip = sql.SQL("OPERATOR({}.<#>)").format(ext)

        def q(text: LiteralString, **extra: sql.Composable) -> bytes:
            return (
                sql.SQL(text)
                .format(files=n.files, passages=n.passages, ext=ext, ip=self.ip, **extra)
                .as_bytes(None)
            )

        self.delete_passages = q(
            "DELETE FROM {passages} WHERE scope = %s AND model = %s AND name = ANY(%s)"
        )
        self.upsert_files = q(
            "INSERT INTO {files} AS t (scope, model, name, kv_version, vectors_kv_version, "
            "file_version, dims, passages) "
            "SELECT %(scope)s, %(model)s, f.name, f.kv, f.vkv, f.fv, f.dims, f.n "
            "FROM unnest(%(names)s::text[], %(kvs)s::text[], %(vkvs)s::text[], %(fvs)s::text[], "
            "%(dims)s::int[], %(counts)s::int[]) AS f(name, kv, vkv, fv, dims, n) "
            "ON CONFLICT (scope, model, name) DO UPDATE SET kv_version = EXCLUDED.kv_version, "
            "vectors_kv_version = EXCLUDED.vectors_kv_version, "
            "file_version = EXCLUDED.file_version, dims = EXCLUDED.dims, "
            "passages = EXCLUDED.passages"
        )
        self.copy = q(
            "COPY {passages} (scope, model, name, ord, dims, start_at, end_at, embedding) "
            "FROM STDIN (FORMAT BINARY)"
        )
        self.remove = q(
            "WITH p AS (DELETE FROM {passages} WHERE scope = %(scope)s AND model = %(model)s "
            "AND name = ANY(%(names)s)) "
            "DELETE FROM {files} WHERE scope = %(scope)s AND model = %(model)s "
            "AND name = ANY(%(names)s)"
        )
        self.drop_scope = q(
            "WITH p AS (DELETE FROM {passages} WHERE scope = %(scope)s) "
            "DELETE FROM {files} WHERE scope = %(scope)s"
        )
        # unindexed: walk the KV primary key in key order and probe the files primary key
        # per key (nested-loop anti-join), stopping after ``limit`` keys.
        self.unindexed = (
            sql.SQL(
                "SELECT k.key FROM {kv} AS k "
                "WHERE k.scope = %(scope)s AND k.key >= %(lo)s AND k.key < %(hi)s "
                "AND (k.expires_at IS NULL OR k.expires_at > %(now)s) "
                "AND NOT EXISTS (SELECT 1 FROM {files} AS f WHERE f.scope = k.scope "
                "AND f.model = %(model)s AND f.name = k.key AND f.kv_version = k.version) "
                "ORDER BY k.key LIMIT %(limit)s"
            )
            .format(kv=names.kv, files=n.files)
            .as_bytes(None)
        )
        # The considered files, from the files index alone: how many match (up to
        # max_files + 1), their passages, the last considered name; and the table's size,
        # to judge what share of the HNSW index the scope is.
        regclass = sql.Literal(f'"{names.schema}"."{names.table}_vec_passages"')
        self.considered: dict[bool, bytes] = {}
        for bounded in (False, True):
            upper: LiteralString = " AND name < %(hi)s" if bounded else ""
            self.considered[bounded] = q(
                "SELECT count(*), "
                "coalesce(sum(s.passages) FILTER (WHERE s.rn <= %(max)s), 0)::bigint, "
                "max(s.name) FILTER (WHERE s.rn <= %(max)s), "
                "(SELECT c.reltuples FROM pg_catalog.pg_class AS c WHERE c.oid = {rel}::regclass) "
                "FROM (SELECT name, passages, row_number() OVER (ORDER BY name) AS rn "
                "FROM {files} WHERE scope = %(scope)s AND model = %(model)s "
                "AND dims = %(dims)s AND file_version IS NOT NULL AND name >= %(lo)s"
                + upper
                + " ORDER BY name LIMIT %(max1)s) AS s",
                rel=regclass,
            )
        # Exact: every considered passage scored, best per file (DISTINCT ON), top files.
        # ``embedding`` without the cast never matches an HNSW index expression.
        self.exact = q(
            "SELECT b.name, f.file_version, b.start_at, b.end_at, b.d, f.vectors_kv_version FROM ("
            "SELECT DISTINCT ON (p.name) p.name, p.start_at, p.end_at, "
            "p.embedding {ip} %(q)s::{ext}.vector AS d FROM {passages} AS p "
            "WHERE p.scope = %(scope)s AND p.model = %(model)s AND p.name >= %(lo)s "
            "AND p.name <= %(last)s AND p.dims = %(dims)s "
            "ORDER BY p.name, d, p.ord) AS b "
            "JOIN {files} AS f ON f.scope = %(scope)s AND f.model = %(model)s AND f.name = b.name "
            "ORDER BY b.d, b.name LIMIT %(limit)s"
        )
        self.record_versions = (
            sql.SQL(
                "SELECT key, version FROM {kv} WHERE scope = %s AND key = ANY(%s) "
                "AND (expires_at IS NULL OR expires_at > %s)"
            )
            .format(kv=names.kv)
            .as_bytes(None)
        )
        self.set_read_only = b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
        # enable_sort off: the only plan for ORDER BY distance without a sort is the HNSW
        # index scan (the planner would otherwise pick a primary-key range and sort it).
        self.set_hnsw = (
            b"SELECT set_config('hnsw.ef_search', %s, true), set_config('enable_sort', 'off', true)"
        )
        self.reset_sort = b"SELECT set_config('enable_sort', 'on', true)"
        self._hnsw: dict[tuple[str, int], bytes] = {}

    def create_index(self, mkey: str, dims: int) -> sql.Composed:
        return sql.SQL(
            "CREATE INDEX IF NOT EXISTS {idx} ON {passages} USING hnsw "
            "((embedding::{ext}.vector({dims})) {ext}.vector_ip_ops) "
            "WHERE model = {mkey} AND dims = {dims}"
        ).format(
            idx=sql.Identifier(self.n.index_name(mkey, dims)),
            passages=self.n.passages,
            ext=self.ext,
            dims=sql.Literal(dims),
            mkey=sql.Literal(mkey),
        )

    def hnsw(self, mkey: str, dims: int) -> bytes:
        """The HNSW search of one ``(model key, dimension)``: the index's expression and
        predicate as literals, so the planner can prove the partial index applies."""
        statement = self._hnsw.get((mkey, dims))
        if statement is None:
            statement = self._hnsw[mkey, dims] = (
                sql.SQL(
                    "SELECT c.name, f.file_version, c.start_at, c.end_at, c.d, "
                    "f.vectors_kv_version, c.ord FROM ("
                    "SELECT p.name, p.ord, p.start_at, p.end_at, "
                    "(p.embedding::{ext}.vector({dims})) {ip} %(q)s::{ext}.vector AS d "
                    "FROM {passages} AS p WHERE p.model = {mkey} AND p.dims = {dims} "
                    "AND p.scope = %(scope)s AND p.name >= %(lo)s AND p.name <= %(last)s "
                    "ORDER BY (p.embedding::{ext}.vector({dims})) {ip} %(q)s::{ext}.vector "
                    "LIMIT %(k)s) AS c "
                    "JOIN {files} AS f ON f.scope = %(scope)s AND f.model = {mkey} "
                    "AND f.name = c.name"
                )
                .format(
                    ext=self.ext,
                    ip=self.ip,
                    dims=sql.Literal(dims),
                    mkey=sql.Literal(mkey),
                    passages=self.n.passages,
                    files=self.n.files,
                )
                .as_bytes(None)
            )
        return statement


def _text_field(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">i", len(data)) + data


def _copy_data(scope: str, mkey: str, entries: Sequence[VectorEntry]) -> bytes | None:
    """Binary COPY data of every passage of ``entries`` (None: there is none)."""
    np = numpy_module()
    parts: list[bytes] = []
    fixed = _COPY_FIELDS + _text_field(scope) + _text_field(mkey)
    for entry in entries:
        record = entry.vectors
        if record is None or not record.passages:
            continue
        dims = record.dimensions
        matrix = np.ascontiguousarray(record.vectors, dtype=">f4")
        if matrix.shape[0] != len(record.passages):
            raise ValueError(
                f"vector record of {entry.name!r}: {len(record.passages)} passages, "
                f"{matrix.shape[0]} vectors"
            )
        head = fixed + _text_field(entry.name)
        vector_head = struct.pack(">ihh", 4 + 4 * dims, dims, 0)
        raw = matrix.tobytes()
        width = 4 * dims
        for i, passage in enumerate(record.passages):
            parts.append(
                head
                + struct.pack(">iiiiiiii", 4, i, 4, dims, 4, passage.start, 4, passage.end)
                + vector_head
                + raw[i * width : (i + 1) * width]
            )
    if not parts:
        return None
    return b"".join([_COPY_HEADER, *parts, _COPY_TRAILER])


def _vector_text(query: Matrix) -> str:
    """The query row as pgvector's text form (shortest repr: float32 round-trips exactly)."""
    np = numpy_module()
    row = np.asarray(query, dtype=np.float32).reshape(-1)
    return "[" + ",".join(map(repr, row.astype(np.float64).tolist())) + "]"


class PostgresVectorPort:
    """:class:`~agent_stores.memory.vector_port.VectorPort` on :class:`PostgresKV` with pgvector."""

    name = "pgvector"

    def __init__(self, kv: PostgresKV) -> None:
        self.kv = kv
        self._names = _Names(kv.names)
        self._sql: _Statements | None = None
        self._reason: str | None = None
        self._warned = False
        #: (model key, dims) pairs whose HNSW index is known to exist (or cannot)
        self._indexes: set[tuple[str, int]] = set()

    # -- availability ---------------------------------------------------------------------

    async def unavailable(self) -> str | None:
        """None once the extension and the tables exist (created if need be); else why not."""
        if self._sql is not None:
            return None
        if self._reason is not None:
            return self._reason
        where = self.kv.describe()
        try:
            ext_schema, reason = await self.kv.run_native_idempotent("pgvector setup", self._setup)
        except (BackendUnavailableError, ResourceClosedError) as exc:
            # Says nothing about the extension: asked again next time.
            return self._say(f"{where}: pgvector could not be checked: {exc.detail}", keep=False)
        except AppError as exc:
            return self._say(
                f"{where}: the pgvector tables could not be created: {exc.detail}", keep=True
            )
        if reason is not None:
            return self._say(f"{where}: {reason}", keep=True)
        assert ext_schema is not None
        self._sql = _Statements(self.kv.names, ext_schema)
        return None

    def _say(self, reason: str, *, keep: bool) -> str:
        if keep:
            self._reason = reason
        if not self._warned:
            self._warned = True
            log.warning("native vector search unavailable, using the generic path: %s", reason)
        else:
            log.debug("native vector search unavailable: %s", reason)
        return reason

    async def _setup(self, conn: AsyncConnection[Any]) -> tuple[str | None, str | None]:
        """(the extension's schema, None), or (None, why pgvector cannot be used)."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            ext_schema = await _extension_schema(conn)
            if ext_schema is None:
                try:
                    async with conn.transaction():
                        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                except psycopg.Error as exc:
                    if conn.closed:
                        raise
                    return None, (
                        "pgvector is not installed on this server: CREATE EXTENSION vector "
                        f"failed: {self.kv._scrub(_first_line(exc))}"
                    )
                ext_schema = await _extension_schema(conn)
                if ext_schema is None:  # pragma: no cover - CREATE EXTENSION succeeded
                    return None, "pgvector: CREATE EXTENSION vector left no extension"
            for statement in _tables_sql(self._names, sql.Identifier(ext_schema)):
                await conn.execute(statement)
        return ext_schema, None

    async def _statements(self) -> _Statements:
        if self._sql is None:
            reason = await self.unavailable()
            if reason is not None:
                raise UnsupportedError(detail=reason)
        assert self._sql is not None
        return self._sql

    async def _ensure_index(
        self, conn: AsyncConnection[Any], st: _Statements, mkey: str, dims: int
    ) -> None:
        if (mkey, dims) in self._indexes:
            return
        if dims <= HNSW_MAX_DIMS:
            cur = await conn.execute(
                "SELECT 1 FROM pg_catalog.pg_indexes WHERE schemaname = %s AND indexname = %s",
                (self.kv.names.schema, self._names.index_name(mkey, dims)),
            )
            if await cur.fetchone() is None:
                async with conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                    await conn.execute(st.create_index(mkey, dims))
        self._indexes.add((mkey, dims))

    # -- writes ---------------------------------------------------------------------------

    async def upsert(self, scope: str, model: str, files: Sequence[VectorEntry]) -> None:
        """Replace each file's rows (one transaction); passages go by binary COPY."""
        st = await self._statements()
        if not files:
            return
        mkey = model_key(model)
        latest = {entry.name: entry for entry in files}
        names = sorted(latest)
        entries = [latest[name] for name in names]
        dims_used = sorted(
            {e.vectors.dimensions for e in entries if e.vectors is not None and e.vectors.passages}
        )
        params: dict[str, Any] = {
            "scope": scope,
            "model": mkey,
            "names": names,
            "kvs": [e.kv_version for e in entries],
            "vkvs": [e.vectors_kv_version for e in entries],
            "fvs": [None if e.vectors is None else e.vectors.file_version for e in entries],
            "dims": [None if e.vectors is None else e.vectors.dimensions for e in entries],
            "counts": [0 if e.vectors is None else len(e.vectors.passages) for e in entries],
        }
        data = _copy_data(scope, mkey, entries)

        async def run(conn: AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                await conn.execute(st.delete_passages, (scope, mkey, names))
                await conn.execute(st.upsert_files, params)
                if data is not None:
                    async with conn.cursor().copy(st.copy) as copy:
                        await copy.write(data)
            # After the rows: a new pair's first batch is indexed by one bulk build, many
            # times faster than as many single HNSW inserts.
            for dims in dims_used:
                await self._ensure_index(conn, st, mkey, dims)
            return True

        await self.kv.run_native_idempotent("vectors upsert", run)

    async def remove(self, scope: str, model: str, names: Sequence[str]) -> None:
        """Delete the files' rows and passages (one statement)."""
        st = await self._statements()
        if not names:
            return
        params = {"scope": scope, "model": model_key(model), "names": sorted(set(names))}

        async def run(conn: AsyncConnection[Any]) -> bool:
            await conn.execute(st.remove, params)
            return True

        await self.kv.run_native_idempotent("vectors remove", run)

    async def drop_scope(self, scope: str) -> None:
        """Delete every row of ``scope``, every model (one statement)."""
        st = await self._statements()

        async def run(conn: AsyncConnection[Any]) -> bool:
            await conn.execute(st.drop_scope, {"scope": scope})
            return True

        await self.kv.run_native_idempotent("vectors drop_scope", run)

    # -- reads ----------------------------------------------------------------------------

    async def unindexed(
        self, scope: str, model: str, key_prefix: str, below: str, limit: int
    ) -> list[str]:
        """Live KV keys in ``[key_prefix, below)`` whose version is not the one indexed."""
        st = await self._statements()
        upper = prefix_upper_bound(key_prefix) if key_prefix else None
        hi = below if upper is None else min(below, upper)
        if limit <= 0 or hi <= key_prefix:
            return []
        params = {
            "scope": scope,
            "model": model_key(model),
            "lo": key_prefix,
            "hi": hi,
            "now": self.kv.clock(),
            "limit": limit,
        }

        async def run(conn: AsyncConnection[Any]) -> list[str]:
            # Both sides come in key order from their primary keys: a merge (or hash)
            # anti-join is linear. Right after a bulk load the statistics still say "one
            # row", and the planner's nested loop then scans every file of the scope per
            # key (measured: 200 ms at 1,000 files); so nested loops are off here.
            async with conn.transaction():
                await conn.execute(b"SELECT set_config('enable_nestloop', 'off', true)")
                cur = await conn.execute(st.unindexed, params)
                return [row[0] for row in await cur.fetchall()]

        return await self.kv.run_native_idempotent("vectors unindexed", run)

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
        """Exact scan of a small considered set, HNSW (exact fallback) of a large one."""
        st = await self._statements()
        dims = int(query.shape[-1])
        mkey = model_key(model)
        upper = prefix_upper_bound(key_prefix) if key_prefix else None
        params: dict[str, Any] = {
            "scope": scope,
            "model": mkey,
            "dims": dims,
            "lo": key_prefix,
            "max": max(max_files, 0),
            "max1": max(max_files, 0) + 1,
            "q": _vector_text(query),
            "limit": limit,
        }
        if upper is not None:
            params["hi"] = upper
        considered_sql = st.considered[upper is not None]

        async def run(conn: AsyncConnection[Any]) -> NearestFiles:
            async with conn.transaction():
                await conn.execute(st.set_read_only)
                cur = await conn.execute(considered_sql, params)
                row = await cur.fetchone()
                assert row is not None
                matched, passages, last, table_rows = (
                    int(row[0]),
                    int(row[1]),
                    row[2],
                    float(row[3] or -1),
                )
                considered = min(matched, params["max"])
                more = matched > considered
                if passages == 0 or limit <= 0:
                    return NearestFiles([], considered, more)
                params["last"] = last
                if passages > EXACT_MAX_PASSAGES and dims <= HNSW_MAX_DIMS:
                    rows = await self._hnsw(conn, st, mkey, dims, params, passages, table_rows)
                    hits, stale = await self._fresh(conn, st, scope, model, rows, limit)
                    if len(hits) >= min(limit, considered - len(stale)):
                        return NearestFiles(hits, considered, more, stale)
                    # The filtered HNSW pass came up short: scan exactly instead.
                    await conn.execute(st.reset_sort)
                # Exact; asked again for more files while stale ones crowd out hits.
                fetch = limit
                while True:
                    cur = await conn.execute(st.exact, {**params, "limit": fetch})
                    rows = await cur.fetchall()
                    hits, stale = await self._fresh(conn, st, scope, model, rows, limit)
                    if len(hits) >= limit or len(rows) < fetch:
                        return NearestFiles(hits, considered, more, stale)
                    fetch = limit + len(stale)

        return await self.kv.run_native_idempotent("vectors nearest", run)

    async def _hnsw(
        self,
        conn: AsyncConnection[Any],
        st: _Statements,
        mkey: str,
        dims: int,
        params: dict[str, Any],
        passages: int,
        table_rows: float,
    ) -> list[Sequence[Any]]:
        """Each found file's best row (name, file version, start, end, distance, vector
        record version), best first."""
        limit: int = params["limit"]
        k = min(EF_SEARCH_MAX, max(MIN_CANDIDATES, limit * OVERFETCH))
        # The index holds every scope's rows and filters after its search: widen the
        # search by how much of the table the considered passages are.
        # A table never analysed (reltuples -1) or analysed before most of its rows came
        # (fewer than this scope alone holds) is taken as this scope's: searching the
        # whole ef ceiling costs several times more, and a short answer falls back to the
        # exact scan anyway.
        share = passages / table_rows if table_rows >= passages else 1.0
        wanted = max(EF_SEARCH, 2 * k)
        ef = min(EF_SEARCH_MAX, math.ceil(wanted / share))
        await conn.execute(st.set_hnsw, (str(ef),))
        cur = await conn.execute(st.hnsw(mkey, dims), {**params, "k": k})
        rows = sorted(await cur.fetchall(), key=lambda r: (r[4], r[0], r[6]))
        best: dict[str, Sequence[Any]] = {}
        for row in rows:
            best.setdefault(row[0], row)
        return sorted(best.values(), key=lambda r: (r[4], r[0]))

    async def _fresh(
        self,
        conn: AsyncConnection[Any],
        st: _Statements,
        scope: str,
        model: str,
        rows: Sequence[Sequence[Any]],
        limit: int,
    ) -> tuple[list[VectorHit], list[str]]:
        """The first ``limit`` rows whose vector record still has the KV version they
        were upserted with, and the names of those passed over because it has not."""
        keys = [vector_key(model, str(r[0])) for r in rows if r[5] is not None]
        current: dict[str, str] = {}
        if keys:
            cur = await conn.execute(st.record_versions, (scope, keys, self.kv.clock()))
            current = {str(k): str(v) for k, v in await cur.fetchall()}
        hits: list[VectorHit] = []
        stale: list[str] = []
        for row in rows:
            if len(hits) >= limit:
                break
            if row[5] is not None and current.get(vector_key(model, str(row[0]))) != row[5]:
                stale.append(str(row[0]))
            else:
                hits.append(_hit(row))
        return hits, stale


async def _extension_schema(conn: AsyncConnection[Any]) -> str | None:
    cur = await conn.execute(
        "SELECT n.nspname FROM pg_catalog.pg_extension AS e "
        "JOIN pg_catalog.pg_namespace AS n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
    )
    row = await cur.fetchone()
    return None if row is None else str(row[0])


def _hit(row: Sequence[Any]) -> VectorHit:
    # row: name, file_version, start, end, negative inner product
    return VectorHit(str(row[0]), str(row[1]), Passage(int(row[2]), int(row[3])), -float(row[4]))


__all__ = ["EXACT_MAX_PASSAGES", "PostgresVectorPort"]
