"""The vector port contract: a backend's native vector index, driven directly.

A backend with vector search implements :class:`~agent_stores.memory.vector_port.VectorPort`
(``docs/plugins.md``, "Native paths"). The semantic contract proves the memory store
stays right over it; this one checks the port's own answers against the definition, so a
port bug shows here, named, rather than as a ranking that is only sometimes off:

* :meth:`unindexed` lists exactly the keys whose record changed since they were
  upserted, within the prefix and bound, in key order; :meth:`nearest` names a file whose
  vector record changed as stale instead of returning it;
* :meth:`nearest` on a small scope is the exact cosine ranking numpy computes (best
  passage per file, ties by name), bounded by ``max_files`` in key order with
  ``considered`` and ``more`` right; on a scope larger than any exact threshold it still
  finds at least 90% of the exact top files;
* models, scopes and dimensions never mix; ``remove`` and ``drop_scope`` forget.

A backend without a vector port skips these tests with that reason (the generic path
serves it, and the semantic contract checks that path); a port that is unavailable on the
server under test (no extension) skips them with the port's own reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from agent_stores import KVStore
from agent_stores.memory.passages import Passage
from agent_stores.memory.vector_port import VectorEntry, VectorPort
from agent_stores.memory.vectors import VectorRecord, vector_key

from .base import ContractBase, require_vector_port

MODEL = "test:vector-port-contract"
OTHER_MODEL = "test:another-model"
#: Below this every key of a memory scope is a file (the memory store's internal keys
#: start with ``~``).
BELOW = "~"


def unit_rows(rng: np.random.Generator, count: int, dims: int) -> Any:
    """``count`` random unit vectors of ``dims`` dimensions (float32)."""
    matrix = rng.standard_normal((count, dims)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def record_of(vectors: Any, version: str = "v1", model: str = MODEL) -> VectorRecord:
    """A vector record with one 10-character passage per row."""
    passages = tuple(Passage(10 * i, 10 * i + 10) for i in range(len(vectors)))
    return VectorRecord(version, model, passages, np.asarray(vectors, dtype=np.float32))


def exact_top(files: dict[str, Any], query: Any, limit: int) -> list[tuple[str, float, int]]:
    """(name, best similarity, best passage row) of the ``limit`` most similar files."""
    best = []
    for name, vectors in files.items():
        if len(vectors) == 0:
            continue
        scores = vectors @ query
        row = int(np.argmax(scores))
        best.append((name, float(scores[row]), row))
    best.sort(key=lambda item: (-item[1], item[0]))
    return best[:limit]


class VectorPortContract(ContractBase):
    """The vector port contract. Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    @pytest_asyncio.fixture
    async def port(self, kv: KVStore, ns: str) -> AsyncIterator[VectorPort]:
        """The backend's vector port on ``kv``; its entries of the test's scopes are
        dropped after the test."""
        port = await require_vector_port(kv)
        yield port
        for scope in (f"{ns}-a", f"{ns}-b"):
            await port.drop_scope(scope)

    async def files(self, kv: KVStore, scope: str, names: list[str]) -> dict[str, str]:
        """A KV entry per name (a stand-in for a memory file record): name -> KV version."""
        return {name: await kv.create(scope, name, b"{}") for name in names}

    async def upsert_vectors(
        self,
        kv: KVStore,
        port: VectorPort,
        scope: str,
        files: dict[str, Any],
        *,
        model: str = MODEL,
    ) -> None:
        """Create each file's record and vector record in the KV store, then upsert both."""
        versions = await self.files(kv, scope, list(files))
        entries = []
        for name, vectors in files.items():
            record = record_of(vectors, model=model)
            stored = await kv.create(scope, vector_key(model, name), record.dump())
            entries.append(VectorEntry(name, versions[name], record, stored))
        await port.upsert(scope, model, entries)

    # -- unindexed ------------------------------------------------------------------------

    async def test_unindexed_lists_keys_until_upserted_at_their_version(
        self, kv: KVStore, port: VectorPort, ns: str
    ) -> None:
        """``unindexed`` lists, in key order, the keys never upserted or whose record has
        another KV version than the one upserted, and only keys within the prefix and
        below the bound."""
        scope = f"{ns}-a"
        versions = await self.files(kv, scope, ["a.md", "b.md", "c/", "x.md"])
        await kv.create(scope, "~internal", b"{}")
        assert await port.unindexed(scope, MODEL, "", BELOW, 100) == ["a.md", "b.md", "c/", "x.md"]
        assert await port.unindexed(scope, MODEL, "", BELOW, 2) == ["a.md", "b.md"]
        assert await port.unindexed(scope, MODEL, "b", BELOW, 100) == ["b.md"]
        await port.upsert(
            scope,
            MODEL,
            [VectorEntry("a.md", versions["a.md"], None), VectorEntry("c/", versions["c/"], None)],
        )
        assert await port.unindexed(scope, MODEL, "", BELOW, 100) == ["b.md", "x.md"]
        assert await port.unindexed(scope, OTHER_MODEL, "", BELOW, 100) == [
            "a.md",
            "b.md",
            "c/",
            "x.md",
        ]
        await kv.replace(scope, "a.md", b"{ }", expected_version=versions["a.md"])
        assert await port.unindexed(scope, MODEL, "", BELOW, 100) == ["a.md", "b.md", "x.md"]
        await kv.delete(scope, "x.md")
        assert await port.unindexed(scope, MODEL, "", BELOW, 100) == ["a.md", "b.md"]

    async def test_a_changed_vector_record_makes_its_file_stale(
        self, kv: KVStore, port: VectorPort, ns: str
    ) -> None:
        """A file whose vector record was rewritten, damaged or deleted after the upsert
        is not a hit: ``nearest`` names it in ``stale`` (the index mirrors that record)."""
        scope = f"{ns}-a"
        rng = np.random.default_rng(1)
        query = unit_rows(rng, 1, 8)
        await self.upsert_vectors(kv, port, scope, {"a.md": query, "b.md": -query})

        async def nearest() -> tuple[list[str], list[str]]:
            found = await port.nearest(scope, MODEL, query, key_prefix="", limit=5, max_files=10)
            return [hit.name for hit in found.hits], found.stale

        assert await nearest() == (["a.md", "b.md"], [])
        key = vector_key(MODEL, "a.md")
        entry = await kv.get(scope, key)
        assert entry is not None
        damaged = await kv.replace(scope, key, b"damaged", expected_version=entry.version)
        assert await nearest() == (["b.md"], ["a.md"])
        await kv.delete(scope, key, expected_version=damaged)
        assert await nearest() == (["b.md"], ["a.md"])
        assert await port.unindexed(scope, MODEL, "", BELOW, 100) == []

    # -- nearest --------------------------------------------------------------------------

    async def test_nearest_is_the_exact_cosine_ranking_on_a_small_scope(
        self, kv: KVStore, port: VectorPort, ns: str
    ) -> None:
        """On a scope of a few hundred passages ``nearest`` returns exactly numpy's
        ranking: each file by its best passage (its span and cosine similarity), most
        similar first, ``limit`` files, every searchable file considered."""
        scope = f"{ns}-a"
        rng = np.random.default_rng(2)
        files = {f"f{i:03d}.md": unit_rows(rng, 1 + i % 4, 16) for i in range(60)}
        await self.upsert_vectors(kv, port, scope, files)
        for query in unit_rows(rng, 5, 16):
            found = await port.nearest(
                scope, MODEL, query[None, :], key_prefix="", limit=7, max_files=1000
            )
            expected = exact_top(files, query, 7)
            assert [hit.name for hit in found.hits] == [name for name, _, _ in expected]
            assert [hit.similarity for hit in found.hits] == pytest.approx(
                [score for _, score, _ in expected], abs=1e-5
            )
            assert [hit.passage for hit in found.hits] == [
                Passage(10 * row, 10 * row + 10) for _, _, row in expected
            ]
            assert {hit.file_version for hit in found.hits} == {"v1"}
            assert (found.considered, found.more) == (60, False)

    async def test_nearest_considers_the_first_max_files_in_key_order(
        self, kv: KVStore, port: VectorPort, ns: str
    ) -> None:
        """Only the first ``max_files`` searchable files matching the prefix are
        considered (a file without passages counts, a non-searchable entry does not);
        ``more`` says when others matched."""
        scope = f"{ns}-a"
        rng = np.random.default_rng(3)
        files = {f"a{i}.md": unit_rows(rng, 2, 8) for i in range(6)}
        files["a0.md"] = np.zeros((0, 8), dtype=np.float32)
        files.update({f"b{i}.md": unit_rows(rng, 2, 8) for i in range(3)})
        await self.upsert_vectors(kv, port, scope, files)
        tombstone = await kv.create(scope, "a00.md", b"{}")
        await port.upsert(scope, MODEL, [VectorEntry("a00.md", tombstone, None)])
        query = unit_rows(rng, 1, 8)
        found = await port.nearest(scope, MODEL, query, key_prefix="a", limit=10, max_files=4)
        assert (found.considered, found.more) == (4, True)
        expected = exact_top(
            {n: files[n] for n in ["a0.md", "a1.md", "a2.md", "a3.md"]}, query[0], 10
        )
        assert [hit.name for hit in found.hits] == [name for name, _, _ in expected]
        found = await port.nearest(scope, MODEL, query, key_prefix="a", limit=10, max_files=6)
        assert (found.considered, found.more) == (6, False)
        found = await port.nearest(scope, MODEL, query, key_prefix="", limit=2, max_files=100)
        assert found.considered == 9 and len(found.hits) == 2

    async def test_models_scopes_and_dimensions_never_mix(
        self, kv: KVStore, port: VectorPort, ns: str
    ) -> None:
        """A search sees only its own scope's and model's vectors of the query's
        dimension; after ``remove`` a file is gone from ``nearest`` and listed by
        ``unindexed``, after ``drop_scope`` the whole scope is."""
        rng = np.random.default_rng(4)
        query = unit_rows(rng, 1, 8)
        await self.upsert_vectors(kv, port, f"{ns}-a", {"mine.md": unit_rows(rng, 1, 8)})
        await self.upsert_vectors(kv, port, f"{ns}-b", {"theirs.md": query.copy()})
        await self.upsert_vectors(
            kv, port, f"{ns}-a", {"other-model.md": query.copy()}, model=OTHER_MODEL
        )
        await self.upsert_vectors(kv, port, f"{ns}-a", {"wider.md": unit_rows(rng, 1, 12)})
        found = await port.nearest(f"{ns}-a", MODEL, query, key_prefix="", limit=10, max_files=10)
        assert [hit.name for hit in found.hits] == ["mine.md"]
        await port.remove(f"{ns}-a", MODEL, ["mine.md"])
        found = await port.nearest(f"{ns}-a", MODEL, query, key_prefix="", limit=10, max_files=10)
        assert found.hits == []
        # other-model.md was only ever indexed for the other model
        assert await port.unindexed(f"{ns}-a", MODEL, "", BELOW, 10) == [
            "mine.md",
            "other-model.md",
        ]
        await port.drop_scope(f"{ns}-b")
        found = await port.nearest(f"{ns}-b", MODEL, query, key_prefix="", limit=10, max_files=10)
        assert found.hits == [] and found.considered == 0
        assert await port.unindexed(f"{ns}-b", MODEL, "", BELOW, 10) == ["theirs.md"]

    async def test_upsert_replaces_a_files_passages(
        self, kv: KVStore, port: VectorPort, ns: str
    ) -> None:
        """Upserting a file again replaces all its passages: a passage of the old
        version is never a hit, the new version's is."""
        scope = f"{ns}-a"
        rng = np.random.default_rng(5)
        query = unit_rows(rng, 1, 8)
        await self.upsert_vectors(kv, port, scope, {"f.md": np.concatenate([query, query])})
        entry = await kv.get(scope, "f.md")
        assert entry is not None
        version = await kv.replace(scope, "f.md", b"{ }", expected_version=entry.version)
        newer = VectorRecord("v2", MODEL, (Passage(0, 5),), -query)
        old_vectors = await kv.get(scope, vector_key(MODEL, "f.md"))
        assert old_vectors is not None
        stored = await kv.replace(
            scope, vector_key(MODEL, "f.md"), newer.dump(), expected_version=old_vectors.version
        )
        await port.upsert(scope, MODEL, [VectorEntry("f.md", version, newer, stored)])
        found = await port.nearest(scope, MODEL, query, key_prefix="", limit=10, max_files=10)
        assert [(hit.file_version, hit.passage) for hit in found.hits] == [("v2", Passage(0, 5))]
        assert found.hits[0].similarity == pytest.approx(-1.0, abs=1e-5)

    async def test_a_large_scope_finds_nine_in_ten_of_the_exact_top_files(
        self, kv: KVStore, port: VectorPort, ns: str
    ) -> None:
        """On a scope of 6,000 passages (beyond an exact-scan threshold of a few thousand)
        in 750 topics, the top 5 files found by ``nearest`` for a query on a topic are,
        over 10 queries, at least 90% the exact top 5."""
        scope = f"{ns}-a"
        rng = np.random.default_rng(6)
        centres = unit_rows(rng, 750, 256)
        topics = rng.permutation(np.repeat(np.arange(750), 8))
        passages = centres[topics] + 0.6 * unit_rows(rng, 6000, 256)
        passages /= np.linalg.norm(passages, axis=1, keepdims=True)
        files = {f"f{i:04d}.md": passages[6 * i : 6 * i + 6] for i in range(1000)}
        versions = {name: f"kv-{name}" for name in files}
        await port.upsert(
            scope,
            MODEL,
            [VectorEntry(name, versions[name], record_of(v)) for name, v in files.items()],
        )
        found_total = 0
        for query in centres[:10] + 0.6 * unit_rows(rng, 10, 256):
            query = query / np.linalg.norm(query)
            found = await port.nearest(
                scope,
                MODEL,
                query[None, :].astype(np.float32),
                key_prefix="",
                limit=5,
                max_files=10_000,
            )
            expected = {name for name, _, _ in exact_top(files, query, 5)}
            found_total += len(expected & {hit.name for hit in found.hits})
            assert found.considered == 1000
        assert found_total >= 45
