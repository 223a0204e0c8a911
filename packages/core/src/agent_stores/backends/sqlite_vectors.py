"""The SQLite vector port: memory recall by meaning with sqlite-vec.

Python's own ``sqlite3`` module is often built without ``enable_load_extension`` (it is
here), so sqlite-vec is loaded into a connection of ``apsw``, which always can. apsw
bundles its own SQLite library, and two SQLite libraries must never open the same file
in one process (each one's POSIX locks are dropped when the other closes the file: the
database corrupts). So the index is split by who opens what:

* in the database file, through the KV store's own connection, ``agent_stores_vec_files``
  (plain SQL): per (model, scope, key) the KV versions of the file record and of its
  vector record it was read from, the file version and dimension of its vectors (NULL:
  not a searchable file). :meth:`SQLiteVectorPort.unindexed` is one anti-join of the KV
  table against it;
* in a file of its own beside it (``<database>-vectors``), through apsw with sqlite-vec
  loaded, the passages (span, file version, float32 vector) and a ``vec0`` table of
  their sign bits, partitioned by model and scope.

Both come with the extra ``agent-stores[sqlite-vec]``; where either is missing or the
extension does not load, :meth:`SQLiteVectorPort.unavailable` says why and the memory
store uses the generic path. Everything here is derived: deleting the vectors file and
the table loses nothing but the time to rebuild them.

sqlite-vec scans exhaustively: float32 vectors of 256 dimensions take about 55 ms per
100,000 passages on this project's 2-core machine, their sign bits about 10. So a scope of
more than ``EXACT_PASSAGES`` passages is searched by Hamming distance first and its
nearest candidates (``OVERSAMPLE`` per file wanted) are re-scored exactly from their
float vectors — approximate, like any vector index (the recall benchmark measures how
often it agrees with the exact ranking); a smaller scope is scored exactly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import BackendUnavailableError
from ..kv.base import prefix_upper_bound
from ..memory.passages import Passage
from ..memory.vector_port import NearestFiles, VectorEntry, VectorHit
from ..memory.vectors import model_key, numpy_module, vector_scan_prefix

if TYPE_CHECKING:
    import apsw

    from ..memory.vectors import Matrix
    from .sqlite import SQLiteKV

logger = logging.getLogger("agent_stores.memory")

T = TypeVar("T")

#: A scope (after prefix and ``max_files``) of at most this many passages is scored exactly.
EXACT_PASSAGES = 4096
#: Bit-distance candidates fetched per file wanted, before exact re-scoring (sqlite-vec's
#: scan costs grow with the candidates asked for: about 0.17 ms each at 100,000 passages).
OVERSAMPLE = 10
#: The fewest bit-distance candidates fetched.
MIN_CANDIDATES = 64
#: The most (sqlite-vec's limit on k).
MAX_CANDIDATES = 4096
#: Suffix of the vectors file's name (beside the database file).
VECTORS_FILE_SUFFIX = "-vectors"

_FILES_SCHEMA = """
CREATE TABLE IF NOT EXISTS agent_stores_vec_files (
    model          TEXT NOT NULL,
    scope          TEXT NOT NULL,
    name           TEXT NOT NULL,
    kv_version     TEXT NOT NULL,
    file_version   TEXT,
    vector_version TEXT,
    dims           INTEGER,
    passages       INTEGER NOT NULL,
    PRIMARY KEY (model, scope, name)
) WITHOUT ROWID
"""

_PASSAGES_SCHEMA = """
CREATE TABLE IF NOT EXISTS passages (
    id           INTEGER PRIMARY KEY,
    model        TEXT NOT NULL,
    scope        TEXT NOT NULL,
    name         TEXT NOT NULL,
    file_version TEXT NOT NULL,
    start        INTEGER NOT NULL,
    end          INTEGER NOT NULL,
    dims         INTEGER NOT NULL,
    embedding    BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS passages_file ON passages (model, scope, name);
"""

#: A passage row as read back: name, file version, start, end, float32 bytes.
Row = tuple[str, str, int, int, bytes]


def _bits_table(dims: int) -> str:
    return f"bits_{int(dims)}"


def _partition(model: str, scope: str) -> str:
    return f"{model_key(model)}\x1f{scope}"


class SQLiteVectorPort:
    """:class:`~agent_stores.memory.vector_port.VectorPort` for :class:`SQLiteKV`."""

    name = "sqlite-vec"

    def __init__(self, kv: SQLiteKV) -> None:
        self.kv = kv
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._conn: apsw.Connection | None = None
        self._reason: str | None = None
        self._checked = False
        self._lock = threading.Lock()
        self._bits_tables: set[int] = set()

    @property
    def vectors_path(self) -> Path:
        """The file holding the passages and their ``vec0`` index."""
        path = Path(self.kv.path).expanduser()
        return path.with_name(path.name + VECTORS_FILE_SUFFIX)

    # -- availability ---------------------------------------------------------------------

    async def unavailable(self) -> str | None:
        """Why the index cannot be used here (None: it can). Checked once."""
        if not self._checked:
            try:
                await self._vectors(lambda conn: None)
                await self.kv.transaction(lambda c: c.execute(_FILES_SCHEMA))
            except BackendUnavailableError:
                raise
            except Exception as exc:  # the extension or its binding is the problem
                detail = str(exc)
                if not detail.startswith(type(exc).__name__):
                    detail = f"{type(exc).__name__}: {detail}"
                self._reason = f"sqlite-vec cannot be used ({detail})"
            # Concurrent first callers all probe; one says so.
            if self._reason is not None and not self._checked:
                logger.warning(
                    "%s: %s; memory search by meaning uses the generic path (every passage "
                    "read and scored in Python)",
                    self.kv.describe(),
                    self._reason,
                )
            self._checked = True
        return self._reason

    # -- the vectors file -----------------------------------------------------------------

    def _connect(self) -> apsw.Connection:
        if self._conn is not None:
            return self._conn
        if self.kv.path in ("", ":memory:"):
            raise RuntimeError("an in-memory SQLite database has no file to index beside")
        try:
            import apsw
            import sqlite_vec
        except ImportError as exc:
            raise RuntimeError(
                f"{exc.name} is not installed: pip install 'agent-stores[sqlite-vec]'"
            ) from None
        conn = apsw.Connection(str(self.vectors_path))
        try:
            conn.set_busy_timeout(self.kv.busy_timeout_ms)
            conn.enable_load_extension(True)
            conn.load_extension(sqlite_vec.loadable_path())
            conn.enable_load_extension(False)
            conn.execute("PRAGMA journal_mode = WAL")
            with _writing(conn):
                conn.execute(_PASSAGES_SCHEMA)
            self._bits_tables = {
                int(str(name).removeprefix("bits_"))
                for (name,) in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name GLOB 'bits_[0-9]*' AND name NOT GLOB 'bits_*_*'"
                )
            }
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self.kv.close_with(self.close)
        return conn

    async def _vectors(self, fn: Callable[[apsw.Connection], T]) -> T:
        """Run ``fn`` on the vectors file's connection, on its own thread."""
        self.kv.check_open()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="agent-stores-sqlite-vec"
            )

        def call() -> T:
            with self._lock:
                conn = self._connect()
                try:
                    return fn(conn)
                except Exception as exc:
                    if type(exc).__module__ == "apsw" and _is_busy_or_io(exc):
                        raise BackendUnavailableError(detail=f"{self.vectors_path}: {exc}") from exc
                    raise

        return await asyncio.wrap_future(self._executor.submit(call))

    def close(self) -> None:
        """Close the vectors file and its thread (the KV store calls it as it closes)."""
        executor, self._executor = self._executor, None

        def close() -> None:
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        if executor is not None:
            executor.submit(close)
            executor.shutdown(wait=False)

    # -- writing --------------------------------------------------------------------------

    async def upsert(self, scope: str, model: str, files: Sequence[VectorEntry]) -> None:
        """Passages first, then the files' rows: a crash between leaves rows that
        :meth:`unindexed` lists, never a row that claims passages not written."""
        if not files:
            return
        np = numpy_module()
        part = _partition(model, scope)

        def passages(conn: apsw.Connection) -> None:
            with _writing(conn):
                for file in files:
                    self._forget(conn, model, scope, file.name)
                    record = file.vectors
                    if record is None or not record.passages:
                        continue
                    dims = record.dimensions
                    table = self._bits_table_in(conn, dims)
                    bits = np.packbits(record.vectors > 0, axis=1)
                    for row, passage in enumerate(record.passages):
                        conn.execute(
                            "INSERT INTO passages (model, scope, name, file_version, start, "
                            "end, dims, embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (
                                model,
                                scope,
                                file.name,
                                record.file_version,
                                passage.start,
                                passage.end,
                                dims,
                                record.vectors[row].astype("<f4").tobytes(),
                            ),
                        )
                        conn.execute(
                            f"INSERT INTO {table} (rowid, part, bits) VALUES (?, ?, vec_bit(?))",
                            (conn.last_insert_rowid(), part, bits[row].tobytes()),
                        )

        def rows(c: sqlite3.Connection) -> None:
            c.executemany(
                "INSERT OR REPLACE INTO agent_stores_vec_files VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        model,
                        scope,
                        file.name,
                        file.kv_version,
                        None if file.vectors is None else file.vectors.file_version,
                        file.vectors_kv_version,
                        None if file.vectors is None else file.vectors.dimensions,
                        0 if file.vectors is None else len(file.vectors.passages),
                    )
                    for file in files
                ],
            )

        await self._vectors(passages)
        await self.kv.transaction(rows)

    def _bits_table_in(self, conn: apsw.Connection, dims: int) -> str:
        table = _bits_table(dims)
        if dims not in self._bits_tables:
            padded = -(-dims // 8) * 8
            conn.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS {table} USING vec0("
                f"part TEXT PARTITION KEY, bits BIT[{padded}])"
            )
            self._bits_tables.add(dims)
        return table

    def _forget(self, conn: apsw.Connection, model: str, scope: str, name: str) -> None:
        for rowid, dims in list(
            conn.execute(
                "SELECT id, dims FROM passages WHERE model = ? AND scope = ? AND name = ?",
                (model, scope, name),
            )
        ):
            if int(dims) in self._bits_tables:
                conn.execute(f"DELETE FROM {_bits_table(int(dims))} WHERE rowid = ?", (rowid,))
        conn.execute(
            "DELETE FROM passages WHERE model = ? AND scope = ? AND name = ?",
            (model, scope, name),
        )

    async def remove(self, scope: str, model: str, names: Sequence[str]) -> None:
        """The files' rows first (so :meth:`unindexed` lists them), then their passages."""
        if not names:
            return

        def rows(c: sqlite3.Connection) -> None:
            c.executemany(
                "DELETE FROM agent_stores_vec_files WHERE model = ? AND scope = ? AND name = ?",
                [(model, scope, name) for name in names],
            )

        def passages(conn: apsw.Connection) -> None:
            with _writing(conn):
                for name in names:
                    self._forget(conn, model, scope, name)

        await self.kv.transaction(rows)
        await self._vectors(passages)

    async def drop_scope(self, scope: str) -> None:
        def rows(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM agent_stores_vec_files WHERE scope = ?", (scope,))

        def passages(conn: apsw.Connection) -> None:
            with _writing(conn):
                for rowid, dims in list(
                    conn.execute("SELECT id, dims FROM passages WHERE scope = ?", (scope,))
                ):
                    if int(dims) in self._bits_tables:
                        conn.execute(
                            f"DELETE FROM {_bits_table(int(dims))} WHERE rowid = ?", (rowid,)
                        )
                conn.execute("DELETE FROM passages WHERE scope = ?", (scope,))

        await self.kv.transaction(rows)
        await self._vectors(passages)

    # -- reading --------------------------------------------------------------------------

    async def unindexed(
        self, scope: str, model: str, key_prefix: str, below: str, limit: int
    ) -> list[str]:
        upper = prefix_upper_bound(key_prefix)
        bound = below if upper is None or below < upper else upper
        now = self.kv.clock()

        def op(c: sqlite3.Connection) -> list[str]:
            return [
                str(key)
                for (key,) in c.execute(
                    "SELECT k.key FROM agent_stores_kv AS k "
                    "LEFT JOIN agent_stores_vec_files AS f "
                    "ON f.model = ? AND f.scope = k.scope AND f.name = k.key "
                    "WHERE k.scope = ? AND k.key >= ? AND k.key < ? "
                    "AND (k.expires_at IS NULL OR k.expires_at > ?) "
                    "AND (f.kv_version IS NULL OR f.kv_version != k.version) "
                    "ORDER BY k.key LIMIT ?",
                    (model, scope, key_prefix, bound, now, limit),
                )
            ]

        return await self.kv.read(op)

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
        np = numpy_module()
        dims = int(query.shape[1])
        vector = np.ascontiguousarray(query[0], dtype=np.float32)
        upper = prefix_upper_bound(key_prefix)

        def bounds(c: sqlite3.Connection) -> tuple[str | None, int, int]:
            where, params = _in_range(model, scope, key_prefix, upper, None)
            # The (max_files + 1)-th searchable name, if any, bounds the files considered.
            row = c.execute(
                f"SELECT name FROM agent_stores_vec_files WHERE {where} "
                "ORDER BY name LIMIT 1 OFFSET ?",
                (*params, max_files),
            ).fetchone()
            beyond = None if row is None else str(row[0])
            where, params = _in_range(model, scope, key_prefix, upper, beyond)
            counts = c.execute(
                "SELECT count(*), coalesce(sum(CASE WHEN dims = ? THEN passages END), 0) "
                f"FROM agent_stores_vec_files WHERE {where}",
                (dims, *params),
            ).fetchone()
            return beyond, int(counts[0]), int(counts[1])

        beyond, considered, passages = await self.kv.read(bounds)

        def considered_name(name: str) -> bool:
            return name.startswith(key_prefix) and (beyond is None or name < beyond)

        hits: list[VectorHit] | None = None
        if passages > EXACT_PASSAGES:
            candidates = await self._vectors(
                lambda conn: self._candidates(conn, model, scope, vector, limit)
            )
            if candidates is not None:
                rows = [row for row in candidates if considered_name(row[0])]
                versions = await self._versions(model, scope, dims, sorted({r[0] for r in rows}))
                hits = _best_files(np, rows, vector, versions, limit)
                if len(hits) < min(limit, considered):
                    hits = None  # too few candidates were considered files: score them all
        if hits is None and passages:
            rows = [
                row
                for row in await self._vectors(
                    lambda conn: _passages_in(conn, model, scope, dims, key_prefix, upper)
                )
                if considered_name(row[0])
            ]
            versions = await self._versions(model, scope, dims, None)
            hits = _best_files(np, rows, vector, versions, limit)
        hits = hits or []
        stale = await self._changed_vectors(model, scope, [hit.name for hit in hits])
        return NearestFiles(
            hits=[hit for hit in hits if hit.name not in stale],
            considered=considered,
            more=beyond is not None,
            stale=sorted(stale),
        )

    async def _changed_vectors(self, model: str, scope: str, names: list[str]) -> set[str]:
        """Those of ``names`` whose vector record is not (live) at the KV version upserted."""
        if not names:
            return set()
        now = self.kv.clock()
        marks = ",".join("?" * len(names))

        def op(c: sqlite3.Connection) -> set[str]:
            return {
                str(name)
                for (name,) in c.execute(
                    "SELECT f.name FROM agent_stores_vec_files AS f "
                    "LEFT JOIN agent_stores_kv AS v ON v.scope = f.scope AND v.key = ? || f.name "
                    "AND (v.expires_at IS NULL OR v.expires_at > ?) "
                    f"WHERE f.model = ? AND f.scope = ? AND f.name IN ({marks}) "
                    "AND v.version IS NOT f.vector_version",
                    (vector_scan_prefix(model), now, model, scope, *names),
                )
            }

        return await self.kv.read(op)

    def _candidates(
        self, conn: apsw.Connection, model: str, scope: str, vector: Any, limit: int
    ) -> list[Row] | None:
        """The passages nearest by Hamming distance of their sign bits (None: this
        dimension has no bits table yet)."""
        np = numpy_module()
        dims = int(vector.shape[0])
        if dims not in self._bits_tables:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = ?", (_bits_table(dims),)
            ).fetchone()
            if found is None:
                return None
            self._bits_tables.add(dims)
        wanted = min(MAX_CANDIDATES, max(MIN_CANDIDATES, OVERSAMPLE * limit))
        return [
            (str(name), str(version), int(start), int(end), bytes(embedding))
            for name, version, start, end, embedding in conn.execute(
                "SELECT p.name, p.file_version, p.start, p.end, p.embedding "
                f"FROM {_bits_table(dims)} AS b JOIN passages AS p ON p.id = b.rowid "
                "WHERE b.bits MATCH vec_bit(?) AND b.k = ? AND b.part = ?",
                (np.packbits(vector > 0).tobytes(), wanted, _partition(model, scope)),
            )
        ]

    async def _versions(
        self, model: str, scope: str, dims: int, names: list[str] | None
    ) -> dict[str, str]:
        """Name → file version of the searchable files of ``dims`` (of ``names`` only,
        when given)."""

        def op(c: sqlite3.Connection) -> dict[str, str]:
            sql = (
                "SELECT name, file_version FROM agent_stores_vec_files "
                "WHERE model = ? AND scope = ? AND dims = ? AND file_version IS NOT NULL"
            )
            params: list[Any] = [model, scope, dims]
            if names is not None:
                sql += f" AND name IN ({','.join('?' * len(names))})"
                params += names
            return {str(name): str(version) for name, version in c.execute(sql, params)}

        if names is not None and not names:
            return {}
        return await self.kv.read(op)


def _in_range(
    model: str, scope: str, key_prefix: str, upper: str | None, beyond: str | None
) -> tuple[str, list[Any]]:
    where = "model = ? AND scope = ? AND file_version IS NOT NULL AND name >= ?"
    params: list[Any] = [model, scope, key_prefix]
    for bound in (upper, beyond):
        if bound is not None:
            where += " AND name < ?"
            params.append(bound)
    return where, params


def _passages_in(
    conn: apsw.Connection, model: str, scope: str, dims: int, key_prefix: str, upper: str | None
) -> list[Row]:
    where = "model = ? AND scope = ? AND dims = ? AND name >= ?"
    params: list[Any] = [model, scope, dims, key_prefix]
    if upper is not None:
        where += " AND name < ?"
        params.append(upper)
    return [
        (str(name), str(version), int(start), int(end), bytes(embedding))
        for name, version, start, end, embedding in conn.execute(
            f"SELECT name, file_version, start, end, embedding FROM passages WHERE {where}",
            params,
        )
    ]


def _best_files(
    np: Any, rows: list[Row], vector: Any, versions: dict[str, str], limit: int
) -> list[VectorHit]:
    """Each file's best passage among ``rows`` of the versions in ``versions``, the
    ``limit`` most similar files first (ties by name)."""
    rows = [row for row in rows if versions.get(row[0]) == row[1]]
    if not rows:
        return []
    matrix = np.frombuffer(b"".join(row[4] for row in rows), dtype="<f4").reshape(
        len(rows), vector.shape[0]
    )
    scores = matrix @ vector
    best: dict[str, tuple[float, int]] = {}
    for index, row in enumerate(rows):
        score = float(scores[index])
        if row[0] not in best or score > best[row[0]][0]:
            best[row[0]] = (score, index)
    ranked = sorted(best.items(), key=lambda item: (-item[1][0], item[0]))[:limit]
    return [
        VectorHit(
            name=name,
            file_version=rows[index][1],
            passage=Passage(rows[index][2], rows[index][3]),
            similarity=score,
        )
        for name, (score, index) in ranked
    ]


@contextlib.contextmanager
def _writing(conn: apsw.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: the write lock is taken (waiting the busy
    timeout) before anything is read, so it never fails upgrading a stale snapshot."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _is_busy_or_io(exc: Exception) -> bool:
    return type(exc).__name__ in {"BusyError", "LockedError", "IOError", "CantOpenError"}
