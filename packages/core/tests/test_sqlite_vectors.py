"""The sqlite-vec index of ``sqlite://``: used when it loads, the generic path (said once
in a log line) when it does not, and never trusted over the files.

The contracts cover the rest: ``nox -s contract -- sqlite`` runs the semantic and the
vector port contracts on the native index, ``test_native_ports.py`` the semantic
contract on the generic path.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlite_vec
from agent_stores import open_kv
from agent_stores.backends.sqlite_vectors import VECTORS_FILE_SUFFIX, SQLiteVectorPort
from agent_stores.memory import KVMemoryStore, SearchConfig
from agent_stores.memory.vector_port import VectorEntry
from agent_stores_contract.embedding import ConceptEmbeddingModel

BOUNDS = {"limit": 10, "max_files": 100, "max_chars": 4000, "max_file_chars": 65536}


def semantic_store(url: str, **search: object) -> KVMemoryStore:
    kv = open_kv(url)
    config = SearchConfig(mode="semantic", embedder=ConceptEmbeddingModel(), **search)  # type: ignore[arg-type]
    return KVMemoryStore(kv, search=config, owns_kv=True)


async def test_search_uses_the_sqlite_vec_index(tmp_path: Path) -> None:
    """With the extra installed, a semantic search is answered by the index in the
    vectors file beside the database (the database file itself is never opened by a
    second SQLite library)."""
    url = f"sqlite:///{tmp_path}/a.db"
    async with semantic_store(url) as store:
        await store.write("u/family.md", "My daughter Maya.", expected_version=None)
        await store.wait_indexed()
        port = store.kv.ports.vector
        assert isinstance(port, SQLiteVectorPort)
        assert await port.unavailable() is None
        found = await store.search("u/", "family", **BOUNDS)
        assert [m.path for m in found.matches] == ["u/family.md"]
        nearest = await port.nearest(
            store.directory_scope("u"),
            store.semantic_index.model,  # type: ignore[union-attr]
            await store.semantic_index.embed_query("family"),  # type: ignore[union-attr]
            key_prefix="",
            limit=5,
            max_files=10,
        )
        assert [hit.name for hit in nearest.hits] == ["family.md"]
    assert (tmp_path / f"a.db{VECTORS_FILE_SUFFIX}").exists()


async def test_without_the_extension_the_generic_path_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """When sqlite-vec cannot be loaded the store says so once, in a log line naming the
    generic path, and every search still answers (from the KV vector records)."""
    monkeypatch.setattr(sqlite_vec, "loadable_path", lambda: str(tmp_path / "no-such-vec0"))
    url = f"sqlite:///{tmp_path}/b.db"
    caplog.set_level(logging.WARNING, logger="agent_stores.memory")
    async with semantic_store(url) as store:
        await store.write("u/family.md", "My daughter Maya.", expected_version=None)
        await store.write("u/car.md", "A red car.", expected_version=None)
        for _ in range(3):
            found = await store.search("u/", "family", **BOUNDS)
            assert found.matches[0].path == "u/family.md"
        port = store.kv.ports.vector
        assert port is not None
        reason = await port.unavailable()
        assert reason is not None and "sqlite-vec cannot be used" in reason
    lines = [r.getMessage() for r in caplog.records if "generic path" in r.getMessage()]
    assert len(lines) == 1 and "sqlite-vec cannot be used" in lines[0]


async def test_native_false_keeps_the_generic_path(tmp_path: Path) -> None:
    """``SearchConfig(native=False)`` never touches the index."""
    async with semantic_store(f"sqlite:///{tmp_path}/c.db", native=False) as store:
        await store.write("u/family.md", "My daughter Maya.", expected_version=None)
        found = await store.search("u/", "family", **BOUNDS)
        assert [m.path for m in found.matches] == ["u/family.md"]
    assert not (tmp_path / f"c.db{VECTORS_FILE_SUFFIX}").exists()


async def test_an_index_entry_that_lies_is_never_trusted(tmp_path: Path) -> None:
    """An index entry naming the file's current KV version but vectors of another file
    version (a port bug, a restored vectors file) is caught when the hit's file is read:
    the entry is repaired and the search answers from the right text."""
    async with semantic_store(f"sqlite:///{tmp_path}/d.db") as store:
        await store.write("u/family.md", "My daughter Maya.", expected_version=None)
        await store.write("u/car.md", "A red car.", expected_version=None)
        await store.wait_indexed()
        index = store.semantic_index
        assert index is not None
        port = store.kv.ports.vector
        assert port is not None
        scope = store.directory_scope("u")
        car = await store.kv.get(scope, "car.md")
        assert car is not None
        # car.md's entry now claims the family vectors, under a version that never was
        [family] = await index.embed_files(
            [
                __import__("agent_stores.memory.semantic", fromlist=["ToEmbed"]).ToEmbed(
                    "car.md", "not-a-version", "My daughter Maya."
                )
            ]
        )
        car_vectors = await store.kv.get(scope, index.key("car.md"))
        assert car_vectors is not None
        await port.upsert(
            scope, index.model, [VectorEntry("car.md", car.version, family, car_vectors.version)]
        )
        assert await port.unindexed(scope, index.model, "", "~", 10) == []
        found = await store.search("u/", "family", **BOUNDS)
        assert found.matches[0].path == "u/family.md"
        snippets = {m.path: m.snippet for m in found.matches}
        assert snippets.get("u/car.md", "A red car.") == "A red car."
