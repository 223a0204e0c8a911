"""The pgvector vector port, against real servers: its answers checked against numpy.

Most tests need a PostgreSQL with pgvector; its URL comes from
``AGENT_STORES_TEST_PGVECTOR_URL`` (an empty database; each test works in a schema of its
own). The last test runs on the session's ordinary server (no pgvector) and checks that the
port declines cleanly and creates nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
import pytest
from agent_stores.errors import UnsupportedError
from agent_stores.memory.passages import Passage
from agent_stores.memory.vector_port import NearestFiles, VectorEntry, VectorHit, VectorPort
from agent_stores.memory.vectors import VectorRecord
from agent_stores_postgres import vectors as pgvectors
from agent_stores_postgres.kv import PostgresKV
from agent_stores_postgres.vectors import PostgresVectorPort
from pg_test_support import drop_schema, libpq_conninfo, with_options

PGVECTOR_ENV = "AGENT_STORES_TEST_PGVECTOR_URL"
MODEL = "test:model-a"
OTHER_MODEL = "test:model-b"


class Clock:
    """A settable clock for the KV store (expiry is judged by the caller's time)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def put(
    kv: PostgresKV, scope: str, key: str, value: bytes, *, ttl: float | None = None
) -> str:
    """Write ``value`` whatever is there; returns the new KV version."""
    current = await kv.get(scope, key)
    if current is None:
        return await kv.create(scope, key, value, ttl=ttl)
    return await kv.replace(scope, key, value, expected_version=current.version, ttl=ttl)


@dataclass
class Env:
    kv: PostgresKV
    port: PostgresVectorPort
    clock: Clock
    url: str
    schema: str
    #: what was upserted per (scope, model): name -> record (None: not searchable)
    truth: dict[tuple[str, str], dict[str, VectorRecord | None]] = field(default_factory=dict)

    async def put(self, scope: str, model: str, name: str, record: VectorRecord | None) -> None:
        """Create (or overwrite) the KV key and upsert ``record`` for its version."""
        version = await put(self.kv, scope, name, b"file")
        await self.port.upsert(scope, model, [VectorEntry(name, version, record)])
        self.truth.setdefault((scope, model), {})[name] = record

    async def put_many(
        self, scope: str, model: str, records: dict[str, VectorRecord | None]
    ) -> None:
        entries = []
        for name, record in records.items():
            version = await put(self.kv, scope, name, b"file")
            entries.append(VectorEntry(name, version, record))
            self.truth.setdefault((scope, model), {})[name] = record
        await self.port.upsert(scope, model, entries)

    def expected(
        self,
        scope: str,
        model: str,
        query: np.ndarray[Any, Any],
        *,
        key_prefix: str = "",
        limit: int,
        max_files: int,
    ) -> NearestFiles:
        return brute_force(
            self.truth.get((scope, model), {}),
            query,
            key_prefix=key_prefix,
            limit=limit,
            max_files=max_files,
        )


def brute_force(
    files: dict[str, VectorRecord | None],
    query: np.ndarray[Any, Any],
    *,
    key_prefix: str,
    limit: int,
    max_files: int,
) -> NearestFiles:
    """What the generic path computes: ``matrix @ query``, best passage per file."""
    dims = query.shape[1]
    searchable = sorted(
        name
        for name, record in files.items()
        if record is not None and name.startswith(key_prefix) and record.dimensions == dims
    )
    considered = searchable[:max_files]
    hits = []
    for name in considered:
        record = files[name]
        assert record is not None
        if not record.passages:
            continue
        scores = record.vectors @ query[0]
        best = int(np.argmax(scores))
        hits.append(
            VectorHit(name, record.file_version, record.passages[best], float(scores[best]))
        )
    hits.sort(key=lambda h: (-h.similarity, h.name))
    return NearestFiles(hits[:limit], len(considered), len(searchable) > max_files)


def assert_same(got: NearestFiles, want: NearestFiles) -> None:
    assert (got.considered, got.more) == (want.considered, want.more)
    assert [(h.name, h.file_version, h.passage) for h in got.hits] == [
        (h.name, h.file_version, h.passage) for h in want.hits
    ]
    for g, w in zip(got.hits, want.hits, strict=True):
        assert g.similarity == pytest.approx(w.similarity, abs=1e-5)


def unit(matrix: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


def record(
    version: str, matrix: np.ndarray[Any, Any], model: str = MODEL, *, step: int = 10
) -> VectorRecord:
    passages = tuple(Passage(i * step, i * step + step - 1) for i in range(matrix.shape[0]))
    return VectorRecord(version, model, passages, np.ascontiguousarray(matrix, dtype=np.float32))


def random_record(
    rng: np.random.Generator, version: str, passages: int, dims: int, model: str = MODEL
) -> VectorRecord:
    return record(version, unit(rng.standard_normal((passages, dims))), model)


def query(rng: np.random.Generator, dims: int) -> np.ndarray[Any, Any]:
    return unit(rng.standard_normal((1, dims)))


@pytest.fixture
def pgvector_base_url() -> str:
    url = os.environ.get(PGVECTOR_ENV)
    if not url:
        pytest.skip(
            f"{PGVECTOR_ENV} is not set: point it at an empty database of a PostgreSQL with "
            "pgvector (e.g. a throwaway cluster of pgserver's binaries) to test the vector port"
        )
    return url


@pytest.fixture
def pgvector_url(pgvector_base_url: str) -> Iterator[str]:
    schema = f"v_{uuid.uuid4().hex[:12]}"
    yield with_options(pgvector_base_url, schema=schema)
    drop_schema(pgvector_base_url, schema)


@pytest.fixture
async def env(pgvector_url: str) -> AsyncIterator[Env]:
    clock = Clock()
    kv = PostgresKV.from_url(pgvector_url, clock=clock)
    port = PostgresVectorPort(kv)
    try:
        yield Env(kv, port, clock, pgvector_url, kv.names.schema)
    finally:
        await kv.aclose()


def tables(url: str, schema: str) -> list[str]:
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname LIKE '%%\\_vec\\_%%' ORDER BY 1",
            (schema,),
        ).fetchall()
    return [r[0] for r in rows]


# -- availability -----------------------------------------------------------------------


async def test_available_and_tables_created_once_under_concurrency(pgvector_url: str) -> None:
    stores = [PostgresKV.from_url(pgvector_url) for _ in range(4)]
    try:
        ports = [PostgresVectorPort(kv) for kv in stores]
        assert isinstance(ports[0], VectorPort)
        assert ports[0].name == "pgvector"
        reasons = await asyncio.gather(*(p.unavailable() for p in ports))
        assert reasons == [None] * 4
        assert await ports[0].unavailable() is None
        schema = stores[0].names.schema
        found = tables(pgvector_url, schema)
        assert "agent_stores_vec_files" in found and "agent_stores_vec_passages" in found
    finally:
        for kv in stores:
            await kv.aclose()


async def test_the_plugin_offers_the_port(env: Env) -> None:
    from agent_stores_postgres import plugin

    port = plugin.vector_port(env.kv)
    assert isinstance(port, PostgresVectorPort)


# -- unindexed, upsert, remove ------------------------------------------------------------


async def test_unindexed_follows_kv_versions(env: Env) -> None:
    kv, port = env.kv, env.port
    rng = np.random.default_rng(1)
    s = "mem/u1"
    versions = {}
    for name in ["a/1", "a/2", "a/3", "b/1", "c", "~v/0123/a/1"]:
        versions[name] = await kv.create(s, name, b"x")
    await kv.create("mem/other", "a/9", b"x")
    files = ["a/1", "a/2", "a/3", "b/1", "c"]
    assert await port.unindexed(s, MODEL, "", "~", 100) == files
    assert await port.unindexed(s, MODEL, "", "~", 2) == ["a/1", "a/2"]
    assert await port.unindexed(s, MODEL, "a/", "~", 100) == ["a/1", "a/2", "a/3"]
    assert await port.unindexed(s, MODEL, "a/", "a/3", 100) == ["a/1", "a/2"]
    assert await port.unindexed(s, MODEL, "", "a/2", 100) == ["a/1"]
    assert await port.unindexed(s, MODEL, "", "", 100) == []
    assert await port.unindexed(s, MODEL, "", "\U0010ffff", 100) == [*files, "~v/0123/a/1"]

    await port.upsert(
        s,
        MODEL,
        [
            VectorEntry("a/1", versions["a/1"], random_record(rng, "f1", 2, 8)),
            VectorEntry("a/2", versions["a/2"], None),  # a marker: recorded, not searchable
            VectorEntry("c", versions["c"], random_record(rng, "fc", 0, 8)),
        ],
    )
    assert await port.unindexed(s, MODEL, "", "~", 100) == ["a/3", "b/1"]
    # Another model has indexed nothing.
    assert await port.unindexed(s, OTHER_MODEL, "", "~", 100) == files

    # A new KV version makes the key unindexed again, whatever was recorded.
    await kv.replace(s, "a/1", b"y", expected_version=versions["a/1"])
    await put(kv, s, "a/2", b"y")
    assert await port.unindexed(s, MODEL, "", "~", 100) == ["a/1", "a/2", "a/3", "b/1"]

    # Deleted and expired keys are not listed (they have no live entry).
    await kv.delete(s, "a/3")
    await put(kv, s, "b/1", b"z", ttl=30)
    assert await port.unindexed(s, MODEL, "", "~", 100) == ["a/1", "a/2", "b/1"]
    env.clock.now += 31
    assert await port.unindexed(s, MODEL, "", "~", 100) == ["a/1", "a/2"]

    # Removing forgets what was recorded.
    await port.remove(s, MODEL, ["c"])
    assert await port.unindexed(s, MODEL, "", "~", 100) == ["a/1", "a/2", "c"]
    await port.remove(s, MODEL, [])
    await port.upsert(s, MODEL, [])


async def test_upsert_replaces_a_files_passages(env: Env) -> None:
    rng = np.random.default_rng(2)
    s, dims = "mem/u2", 8
    q = query(rng, dims)
    first = record("v1", unit(np.vstack([rng.standard_normal((2, dims)), q])))
    await env.put(s, MODEL, "doc", first)
    got = await env.port.nearest(s, MODEL, q, key_prefix="", limit=5, max_files=10)
    assert [(h.name, h.file_version, h.passage) for h in got.hits] == [
        ("doc", "v1", first.passages[2])
    ]
    assert got.hits[0].similarity == pytest.approx(1.0, abs=1e-5)

    second = record("v2", unit(rng.standard_normal((1, dims))), step=7)
    await env.put(s, MODEL, "doc", second)
    got = await env.port.nearest(s, MODEL, q, key_prefix="", limit=5, max_files=10)
    assert_same(got, env.expected(s, MODEL, q, limit=5, max_files=10))
    assert [(h.file_version, h.passage) for h in got.hits] == [("v2", Passage(0, 6))]

    # A tombstone: no longer searchable, not even considered.
    await env.put(s, MODEL, "doc", None)
    got = await env.port.nearest(s, MODEL, q, key_prefix="", limit=5, max_files=10)
    assert got == NearestFiles([], 0, False)

    # The same name twice in one call: the last entry wins.
    version = await put(env.kv, s, "doc", b"again")
    third = random_record(rng, "v3", 3, dims)
    await env.port.upsert(
        s, MODEL, [VectorEntry("doc", version, second), VectorEntry("doc", version, third)]
    )
    env.truth[s, MODEL]["doc"] = third
    got = await env.port.nearest(s, MODEL, q, key_prefix="", limit=5, max_files=10)
    assert_same(got, env.expected(s, MODEL, q, limit=5, max_files=10))


async def test_remove_and_drop_scope(env: Env) -> None:
    rng = np.random.default_rng(3)
    dims = 8
    for scope in ("mem/a", "mem/b"):
        for model in (MODEL, OTHER_MODEL):
            await env.put_many(
                scope,
                model,
                {f"f{i}": random_record(rng, f"v{i}", 2, dims, model) for i in range(4)},
            )
    q = query(rng, dims)
    await env.port.remove("mem/a", MODEL, ["f1", "f2", "nope"])
    got = await env.port.nearest("mem/a", MODEL, q, key_prefix="", limit=10, max_files=10)
    assert sorted(h.name for h in got.hits) == ["f0", "f3"] and got.considered == 2
    # The other model of the scope is untouched by remove.
    got = await env.port.nearest("mem/a", OTHER_MODEL, q, key_prefix="", limit=10, max_files=10)
    assert got.considered == 4

    await env.port.drop_scope("mem/a")
    for model in (MODEL, OTHER_MODEL):
        got = await env.port.nearest("mem/a", model, q, key_prefix="", limit=10, max_files=10)
        assert got == NearestFiles([], 0, False)
        assert await env.port.unindexed("mem/a", model, "", "~", 10) == ["f0", "f1", "f2", "f3"]
        got = await env.port.nearest("mem/b", model, q, key_prefix="", limit=10, max_files=10)
        assert got.considered == 4 and len(got.hits) == 4


# -- nearest: exact on a small scope --------------------------------------------------------


async def test_nearest_is_exact_on_a_small_scope(env: Env) -> None:
    rng = np.random.default_rng(4)
    s, dims = "mem/u4", 16
    records: dict[str, VectorRecord | None] = {}
    for i in range(60):
        name = f"{'ab'[i % 2]}/{i:03d}.md"
        if i % 13 == 5:
            records[name] = None  # a tombstone
        elif i % 11 == 3:
            records[name] = random_record(rng, f"v{i}", 0, dims)  # empty file: counts
        else:
            records[name] = random_record(rng, f"v{i}", int(rng.integers(1, 6)), dims)
    await env.put_many(s, MODEL, records)

    for _ in range(8):
        q = query(rng, dims)
        for key_prefix in ("", "a/", "b/0", "c/"):
            for limit, max_files in [(5, 1000), (3, 10), (100, 7), (1, 1), (5, 0)]:
                got = await env.port.nearest(
                    s, MODEL, q, key_prefix=key_prefix, limit=limit, max_files=max_files
                )
                want = env.expected(
                    s, MODEL, q, key_prefix=key_prefix, limit=limit, max_files=max_files
                )
                assert_same(got, want)
    # more and considered at the boundary
    q = query(rng, dims)
    searchable = sum(1 for r in records.values() if r is not None)
    got = await env.port.nearest(s, MODEL, q, key_prefix="", limit=3, max_files=searchable)
    assert (got.considered, got.more) == (searchable, False)
    got = await env.port.nearest(s, MODEL, q, key_prefix="", limit=3, max_files=searchable - 1)
    assert (got.considered, got.more) == (searchable - 1, True)


async def test_scopes_models_and_dimensions_never_leak(env: Env) -> None:
    rng = np.random.default_rng(5)
    dims = 16
    q = query(rng, dims)
    exact_match = record("best", q)
    mine = {f"f{i}": random_record(rng, f"v{i}", 3, dims) for i in range(10)}
    await env.put_many("mem/me", MODEL, mine)
    # Perfect matches everywhere else: another scope, a scope whose name extends mine,
    # another model, and my model at another dimension.
    await env.put("mem/other", MODEL, "f0", exact_match)
    await env.put("mem/me2", MODEL, "f0", exact_match)
    await env.put("mem/me", OTHER_MODEL, "g", record("best", q, OTHER_MODEL))
    await env.put("mem/me", MODEL, "h", record("short", unit(q[:, :8])))
    got = await env.port.nearest("mem/me", MODEL, q, key_prefix="", limit=20, max_files=100)
    assert_same(got, env.expected("mem/me", MODEL, q, limit=20, max_files=100))
    assert {h.name for h in got.hits} == set(mine) and got.considered == 10
    # The 8-dimensional file is found by an 8-dimensional query, alone.
    short = unit(q[:, :8])
    got = await env.port.nearest("mem/me", MODEL, short, key_prefix="", limit=20, max_files=100)
    assert [h.name for h in got.hits] == ["h"] and got.considered == 1
    assert got.hits[0].similarity == pytest.approx(1.0, abs=1e-5)


async def test_a_model_changing_dimension(env: Env) -> None:
    rng = np.random.default_rng(6)
    s = "mem/u6"
    await env.put_many(s, MODEL, {f"f{i}": random_record(rng, "old", 2, 8) for i in range(3)})
    await env.put(s, MODEL, "f1", random_record(rng, "new", 2, 12))
    got = await env.port.nearest(s, MODEL, query(rng, 12), key_prefix="", limit=5, max_files=5)
    assert [(h.name, h.file_version) for h in got.hits] == [("f1", "new")]
    got = await env.port.nearest(s, MODEL, query(rng, 8), key_prefix="", limit=5, max_files=5)
    assert sorted(h.name for h in got.hits) == ["f0", "f2"] and got.considered == 2


# -- nearest: a large scope goes through the HNSW index ---------------------------------


async def test_a_large_scope_uses_hnsw_with_high_recall(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(7)
    dims, files, per_file = 32, 2000, 10
    assert files * per_file > pgvectors.EXACT_MAX_PASSAGES
    centers = unit(rng.standard_normal((50, dims)))

    def clustered(n: int) -> np.ndarray[Any, Any]:
        picks = centers[rng.integers(0, len(centers), n)]
        return unit(picks + 0.15 * rng.standard_normal((n, dims)))

    big = "mem/big"
    batch: dict[str, VectorRecord | None] = {}
    for i in range(files):
        batch[f"doc{i:05d}"] = record(f"v{i}", clustered(per_file))
        if len(batch) == 250:
            await env.put_many(big, MODEL, batch)
            batch = {}
    # Other scopes' rows in the same index.
    await env.put_many(
        "mem/neighbour", MODEL, {f"doc{i:05d}": record("n", clustered(5)) for i in range(400)}
    )
    small = {f"s{i}": record(f"s{i}", clustered(3)) for i in range(6)}
    await env.put_many("mem/small", MODEL, small)
    with psycopg.connect(libpq_conninfo(env.url), autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("ANALYZE {}").format(
                psycopg.sql.Identifier(env.schema, "agent_stores_vec_passages")
            )
        )

    calls: list[int] = []
    hnsw = PostgresVectorPort._hnsw

    async def counting(self: PostgresVectorPort, *args: Any) -> list[VectorHit]:
        hits = await hnsw(self, *args)
        calls.append(len(hits))
        return hits

    monkeypatch.setattr(PostgresVectorPort, "_hnsw", counting)
    recalls = []
    for _ in range(10):
        q = unit(clustered(1))
        got = await env.port.nearest(big, MODEL, q, key_prefix="", limit=5, max_files=10**6)
        want = env.expected(big, MODEL, q, limit=5, max_files=10**6)
        assert (got.considered, got.more) == (files, False)
        assert len(got.hits) == 5
        recalls.append(len({h.name for h in got.hits} & {h.name for h in want.hits}) / 5)
        for h in got.hits:  # what is returned is true, even when approximate
            r = env.truth[big, MODEL][h.name]
            assert r is not None and h.file_version == r.file_version
            assert h.similarity == pytest.approx(
                float(r.vectors[r.passages.index(h.passage)] @ q[0]), abs=1e-5
            )
    assert len(calls) == 10, "every search of the large scope went through the HNSW index"
    assert sum(recalls) / len(recalls) >= 0.9, recalls

    # max_files below the exact threshold: the considered set is small, so exact again.
    calls.clear()
    q = unit(clustered(1))
    got = await env.port.nearest(big, MODEL, q, key_prefix="doc000", limit=5, max_files=50)
    assert_same(got, env.expected(big, MODEL, q, key_prefix="doc000", limit=5, max_files=50))
    assert calls == []

    # A small scope forced through the HNSW pass: its few rows are mostly filtered out of
    # the global candidates, and the exact fallback still answers exactly.
    monkeypatch.setattr(pgvectors, "EXACT_MAX_PASSAGES", 0)
    for _ in range(3):
        q = unit(clustered(1))
        got = await env.port.nearest("mem/small", MODEL, q, key_prefix="", limit=4, max_files=100)
        assert_same(got, env.expected("mem/small", MODEL, q, limit=4, max_files=100))
    assert len(calls) == 3


# -- a server without pgvector ----------------------------------------------------------


def _has_pgvector(url: str) -> bool:
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"
        ).fetchone()
    return bool(row and row[0])


async def test_without_pgvector_the_port_declines_and_creates_nothing(
    schema_url: str, schema_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    if _has_pgvector(schema_url):
        pytest.skip("this server has pgvector; the test needs one without it")
    secret = "s3cret-pw"
    url = schema_url.replace("postgresql://postgres@", f"postgresql://postgres:{secret}@", 1)
    kv = PostgresKV.from_url(url)
    try:
        port = PostgresVectorPort(kv)
        with caplog.at_level(logging.WARNING, logger="agent_stores.memory"):
            reason = await port.unavailable()
            again = await port.unavailable()
        assert reason is not None and reason == again
        assert "pgvector is not installed on this server" in reason
        assert "CREATE EXTENSION vector failed" in reason
        assert secret not in reason and "\n" not in reason
        warnings = [r for r in caplog.records if r.name == "agent_stores.memory"]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        assert secret not in warnings[0].getMessage()
        with pytest.raises(UnsupportedError, match="pgvector"):
            await port.upsert("s", MODEL, [])
        # The KV store works as before, and nothing of the port's was created.
        await kv.create("s", "k", b"v")
        assert tables(schema_url, schema_name) == []
        with psycopg.connect(libpq_conninfo(schema_url), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
        assert row is not None and row[0] == 0
    finally:
        await kv.aclose()
