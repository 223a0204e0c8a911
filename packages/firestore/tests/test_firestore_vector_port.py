"""Firestore-specific behaviour of the native vector port on Google's emulator.

The vector port and semantic contracts cover what every port must do; these tests cover
what is particular to this one: ids of long names, batches past Firestore's 500 writes,
the ``find_nearest`` path (the exact-read threshold lowered), the hand-built ``Vector``
encoding, vectors wider than Firestore's 2,048 dimensions, and stores of different
prefixes sharing one collection.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from agent_stores import open_kv
from agent_stores.memory.passages import Passage
from agent_stores.memory.vector_port import VectorEntry
from agent_stores.memory.vectors import VectorRecord, vector_key
from agent_stores_firestore import vectors
from agent_stores_firestore.ids import MAX_ID_BYTES
from agent_stores_firestore.kv import FirestoreKV
from agent_stores_firestore.vectors import FirestoreVectorPort
from firestore_test_support import with_fresh_prefix
from google.cloud.firestore_v1.vector import Vector

MODEL = "test:firestore-vector-port"


@pytest.fixture
def port(kv: FirestoreKV) -> FirestoreVectorPort:
    found = kv.ports.vector
    assert isinstance(found, FirestoreVectorPort), "the plugin registers the port"
    return found


def unit_rows(rng: np.random.Generator, count: int, dims: int) -> Any:
    matrix = rng.standard_normal((count, dims)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def record_of(rows: Any, version: str = "v1") -> VectorRecord:
    passages = tuple(Passage(10 * i, 10 * i + 10) for i in range(len(rows)))
    return VectorRecord(version, MODEL, passages, np.asarray(rows, dtype=np.float32))


def exact_top(files: dict[str, Any], query: Any, limit: int) -> list[tuple[str, int]]:
    """(name, best row) of the ``limit`` files most similar to ``query``."""
    best = []
    for name, rows in files.items():
        scores = rows @ query
        row = int(np.argmax(scores))
        best.append((-float(scores[row]), name, row))
    best.sort()
    return [(name, row) for _, name, row in best[:limit]]


async def upsert(
    port: FirestoreVectorPort, scope: str, files: dict[str, Any], version: str = "v1"
) -> None:
    await port.upsert(
        scope,
        MODEL,
        [VectorEntry(name, f"kv-{name}", record_of(rows, version)) for name, rows in files.items()],
    )


async def passage_ids(port: FirestoreVectorPort, scope: str) -> list[str]:
    await port.kv.connect()
    return [ref.id async for ref in port._passages(scope, MODEL).list_documents()]


async def test_unavailable_is_none_and_the_port_is_registered(port: FirestoreVectorPort) -> None:
    """The installed client has find_nearest: the port is usable (no server call)."""
    assert await port.unavailable() is None
    assert port.name == "firestore-find-nearest"


async def test_long_names_get_bounded_passage_ids(
    kv: FirestoreKV, port: FirestoreVectorPort
) -> None:
    """A name near Firestore's id limit is indexed, searched, listed and removed: its
    file document takes the KV entry's id, its passages hashed ids of bounded length."""
    scope = "s"
    name = "d/" + "é" * 507 + ".md"  # 512 characters (the KV's limit), 1,019 bytes
    version = await kv.create(scope, name, b"{}")
    rng = np.random.default_rng(1)
    rows = unit_rows(rng, 3, 8)
    await port.upsert(scope, MODEL, [VectorEntry(name, version, record_of(rows))])
    assert await port.unindexed(scope, MODEL, "", "~", 10) == []
    found = await port.nearest(scope, MODEL, rows[2:3], key_prefix="d/", limit=3, max_files=10)
    assert [(hit.name, hit.passage) for hit in found.hits] == [(name, Passage(20, 30))]
    ids = await passage_ids(port, scope)
    assert len(ids) == 3 and all(len(i.encode()) < 64 for i in ids)
    assert len(name) == kv.limits.max_key_chars and len(name.encode()) < MAX_ID_BYTES
    await port.remove(scope, MODEL, [name])
    assert await passage_ids(port, scope) == []
    assert await port.unindexed(scope, MODEL, "", "~", 10) == [name]


async def test_more_than_500_writes_go_in_several_batches(port: FirestoreVectorPort) -> None:
    """A file of 700 passages (more than one batch holds) and 40 small files are indexed
    whole; upserting the big file again with 3 passages deletes the other 697."""
    scope = "s"
    rng = np.random.default_rng(2)
    big = unit_rows(rng, 700, 16)
    small = {f"f{i:02d}.md": unit_rows(rng, 5, 16) for i in range(40)}
    sent: list[int] = []
    commit = port._commit

    async def counting(client: Any, writes: Any) -> None:
        sent.append(len(writes))
        await commit(client, writes)

    port._commit = counting  # type: ignore[method-assign]
    await upsert(port, scope, {"big.md": big, **small})
    assert len(sent) >= 2 and max(sent) <= 500 and sum(sent) == 700 + 1 + 40 * 6
    assert len(await passage_ids(port, scope)) == 900
    query = big[650:651]
    found = await port.nearest(scope, MODEL, query, key_prefix="", limit=1, max_files=100)
    assert [(hit.name, hit.passage) for hit in found.hits] == [("big.md", Passage(6500, 6510))]
    await upsert(port, scope, {"big.md": big[:3]}, version="v2")
    assert len(await passage_ids(port, scope)) == 203
    found = await port.nearest(scope, MODEL, query, key_prefix="big", limit=1, max_files=100)
    assert [hit.file_version for hit in found.hits] == ["v2"]
    assert found.hits[0].passage.start < 30
    await port.drop_scope(scope)
    assert await passage_ids(port, scope) == []


async def test_find_nearest_answers_above_the_exact_threshold(
    port: FirestoreVectorPort, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above the threshold ``find_nearest`` answers (no exact read) with the exact ranking
    on the emulator; a prefix its candidates mostly miss falls back to the exact read."""
    monkeypatch.setattr(vectors, "EXACT_MAX_PASSAGES", 10)
    scope = "s"
    rng = np.random.default_rng(3)
    files = {f"a{i:02d}.md": unit_rows(rng, 4, 32) for i in range(30)}
    files.update({f"b{i:02d}.md": unit_rows(rng, 4, 32) for i in range(30)})
    await upsert(port, scope, files)
    paths: list[str] = []
    search_index, read_exact = port._search_index, port._read_exact

    async def spy_index(*args: Any, **kwargs: Any) -> Any:
        paths.append("find_nearest")
        return await search_index(*args, **kwargs)

    async def spy_exact(*args: Any, **kwargs: Any) -> Any:
        paths.append("exact")
        return await read_exact(*args, **kwargs)

    port._search_index = spy_index  # type: ignore[method-assign]
    port._read_exact = spy_exact  # type: ignore[method-assign]
    for query in unit_rows(rng, 3, 32):
        paths.clear()
        found = await port.nearest(
            scope, MODEL, query[None, :], key_prefix="", limit=5, max_files=1000
        )
        assert paths == ["find_nearest"]
        assert [(h.name, h.passage.start // 10) for h in found.hits] == exact_top(files, query, 5)
        assert (found.considered, found.more) == (60, False)
    # A query right on a b-file: find_nearest's 50 candidates are mostly b-files, and the
    # first 3 a-files (max_files) may not be among them at all.
    query = files["b07.md"][1]
    paths.clear()
    found = await port.nearest(scope, MODEL, query[None, :], key_prefix="a", limit=3, max_files=3)
    first = {name: files[name] for name in ["a00.md", "a01.md", "a02.md"]}
    assert [(h.name, h.passage.start // 10) for h in found.hits] == exact_top(first, query, 3)
    assert (found.considered, found.more) == (3, True)
    assert paths[0] == "find_nearest"


async def test_vectors_are_stored_as_firestore_vectors(
    kv: FirestoreKV, port: FirestoreVectorPort
) -> None:
    """The hand-built ``Write`` of a passage reads back through the client as the
    ``Vector`` and float32 bytes of the row, and the scalar fields as written."""
    rng = np.random.default_rng(4)
    rows = unit_rows(rng, 2, 24)
    await upsert(port, "s", {"f.md": rows})
    doc = port._passages("s", MODEL).document(vectors._passage_id("f.md", 1))
    snaps = [snap async for snap in kv.client.get_all([doc])]
    data = snaps[0].to_dict()
    assert data is not None
    assert data["embedding"] == Vector(rows[1].astype(np.float64).tolist())
    assert data["f32"] == rows[1].tobytes()
    assert {k: data[k] for k in ("name", "fv", "ord", "start", "end", "dims")} == {
        "name": "f.md",
        "fv": "v1",
        "ord": 1,
        "start": 10,
        "end": 20,
        "dims": 24,
    }


async def test_vectors_wider_than_firestore_allows_are_scored_exactly(
    port: FirestoreVectorPort, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 dimensions (over find_nearest's 2,048) are stored as bytes only and searched
    by the exact read, whatever the threshold."""
    monkeypatch.setattr(vectors, "EXACT_MAX_PASSAGES", 1)
    rng = np.random.default_rng(5)
    files = {f"f{i}.md": unit_rows(rng, 2, 3000) for i in range(4)}
    await upsert(port, "s", files)
    query = files["f2.md"][1]
    found = await port.nearest("s", MODEL, query[None, :], key_prefix="", limit=2, max_files=10)
    assert [(h.name, h.passage.start // 10) for h in found.hits] == exact_top(files, query, 2)


async def test_stores_of_different_prefixes_never_share_an_index(firestore_url: str) -> None:
    """Two stores on one collection with different prefixes: same scope, same names, and
    neither sees the other's vectors, KV entries or stale state."""
    rng = np.random.default_rng(6)
    query = unit_rows(rng, 1, 8)
    first = open_kv(firestore_url)
    second = open_kv(with_fresh_prefix(firestore_url))
    try:
        a, b = first.ports.vector, second.ports.vector
        assert a is not None and b is not None
        version = await first.create("s", "x.md", b"{}")
        stored = await first.create("s", vector_key(MODEL, "x.md"), b"vectors")
        await a.upsert("s", MODEL, [VectorEntry("x.md", version, record_of(query), stored)])
        found = await a.nearest("s", MODEL, query, key_prefix="", limit=5, max_files=10)
        assert [hit.name for hit in found.hits] == ["x.md"] and found.stale == []
        found = await b.nearest("s", MODEL, query, key_prefix="", limit=5, max_files=10)
        assert found.hits == [] and found.considered == 0
        assert await b.unindexed("s", MODEL, "", "~", 10) == []
        await second.create("s", "x.md", b"{}")
        assert await b.unindexed("s", MODEL, "", "~", 10) == ["x.md"]
        assert await a.unindexed("s", MODEL, "", "~", 10) == []
    finally:
        await first.aclose()
        await second.aclose()
