"""The semantic search contract: memory recall by meaning on any backend.

A memory store opened with ``search=SearchConfig(mode="semantic" | "hybrid", embedder=...)``
must find a file by a query that shares no word with it, rank exactly by cosine
similarity (and by reciprocal-rank fusion in hybrid mode), and never disagree with the
files: a replaced or deleted version's text is never returned, a retried write is
indexed once, a write whose indexing never ran is repaired by the next search, two
embedding models' vectors never mix, and one namespace's files never answer another's
search. The embedder is :class:`~agent_stores_contract.embedding.ConceptEmbeddingModel`,
deterministic, so every expected ranking and score below is worked out by hand.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import KVStore
from agent_stores.memory import KVMemoryStore, SearchConfig, read_whole
from agent_stores.memory.port import KVMemoryPort
from agent_stores.memory.vectors import VectorRecord, vector_key
from pydantic_ai_harness.memory import MemoryOperation, MemorySearchResult

from .base import ContractBase, require_capability
from .embedding import ConceptEmbeddingModel
from .memory import MemoryContract, append_within_race_window, start_append_processes

SemanticFactory = Callable[..., KVMemoryStore]

BOUNDS: dict[str, Any] = {
    "limit": 10,
    "max_files": 100,
    "max_chars": 4000,
    "max_file_chars": 65536,
}


def paths(result: MemorySearchResult) -> list[str]:
    """The matched paths, best first."""
    return [match.path for match in result.matches]


class SemanticContract(ContractBase):
    """The semantic search contract. Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    # The memory contract's own: the same isolation for the same store.
    memory_prefix = MemoryContract.memory_prefix

    @pytest.fixture
    def concepts(self) -> ConceptEmbeddingModel:
        """A fresh deterministic embedding model (its counters start at zero)."""
        return ConceptEmbeddingModel()

    @pytest.fixture
    def semantic_factory(self, memory_prefix: str) -> SemanticFactory:
        """``semantic_factory(kv, model, mode="semantic", **options)``: a store searching
        by meaning with ``model`` (``model=None``: a lexical store, which never indexes)."""
        generic = self.store_path == "generic"

        def make(
            kv: KVStore,
            model: ConceptEmbeddingModel | None,
            mode: str = "semantic",
            **options: Any,
        ) -> KVMemoryStore:
            if generic:
                options = {"port": KVMemoryPort(kv), **options}
            search = (
                SearchConfig(mode=mode, embedder=model, native=not generic)  # type: ignore[arg-type]
                if model is not None
                else None
            )
            return KVMemoryStore(kv, **{"scope_prefix": memory_prefix, "search": search, **options})

        return make

    @pytest_asyncio.fixture
    async def semantic(
        self, kv: KVStore, semantic_factory: SemanticFactory, concepts: ConceptEmbeddingModel
    ) -> AsyncIterator[KVMemoryStore]:
        """A memory store on ``kv`` searching by meaning with ``concepts``."""
        async with semantic_factory(kv, concepts) as store:
            yield store

    # -- recall by meaning ----------------------------------------------------------------

    async def test_recall_by_meaning_with_no_shared_word(self, semantic: KVMemoryStore) -> None:
        """A query sharing no word with a file finds it by meaning, where lexical search
        finds nothing; the snippet is the file's text."""
        await semantic.write(
            "u/n1.md", "The user's daughter is called Maya.", expected_version=None
        )
        await semantic.write("u/n2.md", "Prefers spicy ramen for dinner.", expected_version=None)
        await semantic.write("u/n3.md", "Works as a project manager.", expected_version=None)
        found = await semantic.search("u/", "family members", **BOUNDS)
        assert paths(found) == ["u/n1.md"]
        assert found.matches[0].snippet == "The user's daughter is called Maya."
        assert found.scanned == 3
        lexical = await semantic.search("u/", "family members", mode="lexical", **BOUNDS)
        assert lexical.matches == []

    async def test_ranking_is_exact_cosine_similarity(self, semantic: KVMemoryStore) -> None:
        """Files rank by the cosine similarity of their best passage to the query, best
        first; files with no similarity are left out."""
        texts = {
            "u/a.md": "daughter and son",  # family 2: cos 1
            "u/b.md": "daughter likes ramen",  # family 1, food 1: cos 1/sqrt(2)
            "u/c.md": "daughter eats spicy ramen",  # family 1, food 3: cos 1/sqrt(10)
            "u/d.md": "ramen",  # food only: cos 0, left out
        }
        for path, text in texts.items():
            await semantic.write(path, text, expected_version=None)
        found = await semantic.search("u/", "daughter", **BOUNDS)
        assert paths(found) == ["u/a.md", "u/b.md", "u/c.md"]
        expected = [1.0, 1 / math.sqrt(2), 1 / math.sqrt(10)]
        for match, score in zip(found.matches, expected, strict=True):
            assert match.score == pytest.approx(score, abs=1e-5)

    async def test_best_passage_is_the_snippet(self, semantic: KVMemoryStore) -> None:
        """A file is split into passages; its score and snippet are its best passage's."""
        text = "Flight to Tokyo on Monday.\n\nThe user's daughter Maya is seven.\n\nOffice at nine."
        await semantic.write("u/notes.md", text, expected_version=None)
        found = await semantic.search("u/", "family", **BOUNDS)
        assert paths(found) == ["u/notes.md"]
        assert found.matches[0].snippet == "The user's daughter Maya is seven."
        assert found.matches[0].score == pytest.approx(1.0, abs=1e-5)

    async def test_hybrid_fuses_both_rankings(
        self, kv: KVStore, semantic_factory: SemanticFactory, concepts: ConceptEmbeddingModel
    ) -> None:
        """Hybrid ranks by reciprocal-rank fusion (k=60) of the semantic and the lexical
        rankings: a file in both beats files found by only one."""
        async with semantic_factory(kv, concepts, mode="hybrid") as store:
            await store.write("u/lexical.md", "zebra zebra zebra", expected_version=None)
            await store.write("u/meaning.md", "son and wife", expected_version=None)
            await store.write("u/both.md", "daughter zebra ramen", expected_version=None)
            found = await store.search("u/", "zebra daughter", **BOUNDS)
        # semantic: meaning (cos 1), both (cos 1/sqrt 2); lexical: lexical (3), both (2)
        assert paths(found) == ["u/both.md", "u/lexical.md", "u/meaning.md"]
        scores = [match.score for match in found.matches]
        assert scores == pytest.approx([2 / 62, 1 / 61, 1 / 61])

    async def test_search_stays_bounded(self, semantic: KVMemoryStore) -> None:
        """``limit``, ``max_chars`` and ``max_files`` bound a semantic search as they bound
        a lexical one, and ``truncated`` says when something was cut."""
        for i in range(6):
            await semantic.write(f"u/f{i}.md", f"daughter number {i} " * 5, expected_version=None)
        found = await semantic.search("u/", "family", **{**BOUNDS, "limit": 2})
        assert len(found.matches) == 2 and found.truncated
        found = await semantic.search("u/", "family", **{**BOUNDS, "max_files": 3})
        assert found.scanned == 3 and found.truncated
        assert set(paths(found)) == {"u/f0.md", "u/f1.md", "u/f2.md"}
        found = await semantic.search("u/", "family", **{**BOUNDS, "max_chars": 40})
        assert sum(len(m.path) - 2 + len(m.snippet) for m in found.matches) <= 40
        assert found.truncated

    # -- never disagreeing with the files -------------------------------------------------

    async def test_replaced_file_never_returns_old_text(
        self,
        kv: KVStore,
        semantic: KVMemoryStore,
        semantic_factory: SemanticFactory,
        concepts: ConceptEmbeddingModel,
    ) -> None:
        """A file replaced by a store that does not index (its vectors now stale) is
        ranked by its new text, never its old one, and the new version is embedded once."""
        created = await semantic.write("u/n.md", "daughter Maya", expected_version=None)
        await semantic.wait_indexed()
        async with semantic_factory(kv, None) as lexical:
            await lexical.write("u/n.md", "spicy ramen", expected_version=created.version)
        assert (await semantic.search("u/", "family", **BOUNDS)).matches == []
        embedded = len(concepts.documents)
        found = await semantic.search("u/", "food", **BOUNDS)
        assert paths(found) == ["u/n.md"] and found.matches[0].snippet == "spicy ramen"
        assert len(concepts.documents) == embedded, "the new version was embedded twice"

    async def test_deleted_file_never_returned(
        self, kv: KVStore, semantic: KVMemoryStore, semantic_factory: SemanticFactory
    ) -> None:
        """A file deleted by a store that does not index (its vectors left behind) is never
        returned; one deleted by the semantic store loses its vectors too."""
        first = await semantic.write("u/a.md", "daughter Maya", expected_version=None)
        second = await semantic.write("u/b.md", "son Tom", expected_version=None)
        await semantic.wait_indexed()
        async with semantic_factory(kv, None) as lexical:
            await lexical.delete("u/a.md", expected_version=first.version)
        await semantic.delete("u/b.md", expected_version=second.version)
        await semantic.wait_indexed()
        assert (await semantic.search("u/", "family", **BOUNDS)).matches == []
        index = semantic.semantic_index
        assert index is not None
        scope = semantic.directory_scope("u")
        assert await kv.get(scope, vector_key(index.model, "b.md")) is None

    async def test_retried_write_indexed_once(
        self, semantic: KVMemoryStore, concepts: ConceptEmbeddingModel
    ) -> None:
        """A write retried with the same operation (a lost acknowledgement) replays and
        embeds nothing more: each version is embedded once."""
        operation = MemoryOperation(id="op-1", fingerprint="fp")
        first = await semantic.write(
            "u/n.md", "daughter Maya", expected_version=None, operation=operation
        )
        await semantic.wait_indexed()
        assert len(concepts.documents) == 1
        again = await semantic.write(
            "u/n.md", "daughter Maya", expected_version=None, operation=operation
        )
        await semantic.wait_indexed()
        assert again.replayed and again.version == first.version
        assert len(concepts.documents) == 1
        await semantic.search("u/", "family", **BOUNDS)
        assert len(concepts.documents) == 1

    async def test_write_whose_indexing_failed_is_repaired_by_search(
        self,
        kv: KVStore,
        semantic_factory: SemanticFactory,
        concepts: ConceptEmbeddingModel,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A write lands even when embedding fails after its commit (logged, nothing
        raised); the next search embeds the missing version, and only that search."""
        outage = ConceptEmbeddingModel(down=True)
        async with semantic_factory(kv, outage) as broken:
            with caplog.at_level(logging.WARNING, logger="agent_stores.memory"):
                mutation = await broken.write("u/n.md", "daughter Maya", expected_version=None)
                await broken.wait_indexed()
            assert mutation.version is not None and outage.calls >= 1
            assert "indexing a memory file failed" in caplog.text
        async with semantic_factory(kv, concepts) as healthy:
            found = await healthy.search("u/", "family", **BOUNDS)
            assert paths(found) == ["u/n.md"]
            assert len(concepts.documents) == 1
            await healthy.search("u/", "family", **BOUNDS)
        async with semantic_factory(kv, concepts) as fresh:
            assert paths(await fresh.search("u/", "family", **BOUNDS)) == ["u/n.md"]
        assert len(concepts.documents) == 1, "the repaired vectors were not stored"

    async def test_model_change_never_mixes_vectors(
        self, kv: KVStore, semantic_factory: SemanticFactory
    ) -> None:
        """Vectors of another model (another dimension) are never compared with the
        query's: the new model embeds its own, the old model's stay usable by it."""
        old = ConceptEmbeddingModel("concepts-a", dimensions=8)
        new = ConceptEmbeddingModel("concepts-b", dimensions=13)
        async with semantic_factory(kv, old) as store:
            await store.write("u/a.md", "daughter Maya", expected_version=None)
            await store.write("u/b.md", "spicy ramen", expected_version=None)
            await store.wait_indexed()
        async with semantic_factory(kv, new) as store:
            assert paths(await store.search("u/", "family", **BOUNDS)) == ["u/a.md"]
            assert sorted(new.documents) == ["a: daughter Maya", "b: spicy ramen"]
            index = store.semantic_index
            assert index is not None
            entry = await kv.get(store.directory_scope("u"), index.key("a.md"))
            assert entry is not None
            assert VectorRecord.load(entry.value, where="a.md").dimensions == 13
        embedded = len(old.documents)
        async with semantic_factory(kv, old) as store:
            assert paths(await store.search("u/", "food", **BOUNDS)) == ["u/b.md"]
        assert len(old.documents) == embedded

    async def test_namespaces_never_leak(
        self,
        kv: KVStore,
        semantic_factory: SemanticFactory,
        concepts: ConceptEmbeddingModel,
        memory_prefix: str,
    ) -> None:
        """A search answers from the files directly below its prefix only: never a sibling
        directory, a nested one, or another store's scope prefix, however similar."""
        async with semantic_factory(kv, concepts) as store:
            await store.write("u1/a.md", "ramen", expected_version=None)
            await store.write("u2/b.md", "daughter son wife", expected_version=None)
            await store.write("u1/sub/c.md", "daughter son wife", expected_version=None)
            found = await store.search("u1/", "family", **BOUNDS)
            assert found.matches == [] and found.scanned == 1
            assert paths(await store.search("u2/", "family", **BOUNDS)) == ["u2/b.md"]
        async with semantic_factory(kv, concepts, scope_prefix=f"{memory_prefix}other:") as other:
            assert (await other.search("u2/", "family", **BOUNDS)).matches == []

    async def test_concurrent_writers_leave_the_last_version_indexed(
        self, kv: KVStore, semantic_factory: SemanticFactory
    ) -> None:
        """Many tasks on two clients rewriting one file: once they finish, the stored
        vectors are those of the file's final version, whichever indexing ran last."""
        words = ["daughter", "ramen", "flight", "meeting", "dog", "doctor", "guitar"]
        models = [ConceptEmbeddingModel(), ConceptEmbeddingModel()]
        stores = [semantic_factory(kv, models[0]), semantic_factory(kv, models[1])]
        await stores[0].write("u/n.md", "start", expected_version=None)

        async def rewrite(i: int) -> None:
            store = stores[i % 2]
            for _ in range(50):
                current = await store.read("u/n.md", max_chars=1000)
                assert current is not None
                try:
                    await store.write(
                        "u/n.md", words[i % len(words)], expected_version=current.version
                    )
                    return
                except Exception as exc:  # a lost CAS race: read and try again
                    if type(exc).__name__ != "MemoryConflictError":
                        raise
            raise AssertionError("a writer never won")

        await asyncio.gather(*(rewrite(i) for i in range(14)))
        for store in stores:
            await store.wait_indexed()
        final = await stores[0].read("u/n.md", max_chars=1000)
        assert final is not None
        index = stores[0].semantic_index
        assert index is not None
        entry = await kv.get(stores[0].directory_scope("u"), index.key("n.md"))
        assert entry is not None
        assert VectorRecord.load(entry.value, where="n.md").file_version == final.version
        found = await stores[1].search("u/", final.content, **BOUNDS)
        assert paths(found) == ["u/n.md"] and found.matches[0].snippet == final.content
        for store in stores:
            await store.aclose()

    async def test_damaged_vectors_are_recomputed(
        self, kv: KVStore, semantic: KVMemoryStore, concepts: ConceptEmbeddingModel
    ) -> None:
        """A vector record that does not decode is reported, never used, and replaced."""
        await semantic.write("u/n.md", "daughter Maya", expected_version=None)
        await semantic.wait_indexed()
        index = semantic.semantic_index
        assert index is not None
        scope, key = semantic.directory_scope("u"), index.key("n.md")
        entry = await kv.get(scope, key)
        assert entry is not None
        await kv.replace(scope, key, b"not a vector record", expected_version=entry.version)
        assert paths(await semantic.search("u/", "family", **BOUNDS)) == ["u/n.md"]
        assert len(semantic.problems) >= 1
        repaired = await kv.get(scope, key)
        assert repaired is not None
        VectorRecord.load(repaired.value, where="n.md")
        assert len(concepts.documents) == 2

    async def test_reindex_embeds_what_is_missing_once(
        self, kv: KVStore, semantic_factory: SemanticFactory, concepts: ConceptEmbeddingModel
    ) -> None:
        """``reindex`` embeds every file (nested directories too) lacking vectors from the
        store's model, reports progress, and a second run embeds nothing."""
        async with semantic_factory(kv, None) as lexical:
            for path in ["a.md", "u/b.md", "u/v/c.md", "u/v/d.md"]:
                await lexical.write(path, f"daughter {path}", expected_version=None)
        reports: list[int] = []
        async with semantic_factory(kv, concepts) as store:
            report = await store.reindex(batch_files=1, progress=lambda r: reports.append(r.files))
            assert (report.files, report.embedded, report.up_to_date) == (4, 4, 0)
            assert reports == [1, 2, 3, 4]
            again = await store.reindex()
            assert (again.files, again.embedded, again.up_to_date) == (4, 0, 4)
            assert len(concepts.documents) == 4
            assert paths(await store.search("u/v/", "family", **BOUNDS)) == ["u/v/c.md", "u/v/d.md"]
            assert len(concepts.documents) == 4

    async def test_collect_garbage_drops_vectors_of_deleted_files(
        self, kv: KVStore, semantic: KVMemoryStore, semantic_factory: SemanticFactory
    ) -> None:
        """Vectors left behind by a deletion that did not drop them are collected by
        ``collect_garbage``; a live file's vectors are kept."""
        gone = await semantic.write("u/gone.md", "daughter Maya", expected_version=None)
        await semantic.write("u/kept.md", "son Tom", expected_version=None)
        await semantic.wait_indexed()
        async with semantic_factory(kv, None) as lexical:
            await lexical.delete("u/gone.md", expected_version=gone.version)
        index = semantic.semantic_index
        assert index is not None
        scope = semantic.directory_scope("u")
        assert await kv.get(scope, index.key("gone.md")) is not None
        assert await semantic.collect_garbage() == 1
        assert await kv.get(scope, index.key("gone.md")) is None
        assert await kv.get(scope, index.key("kept.md")) is not None
        assert paths(await semantic.search("u/", "family", **BOUNDS)) == ["u/kept.md"]

    async def test_erase_namespace_leaves_no_vector_behind(
        self, kv: KVStore, semantic: KVMemoryStore
    ) -> None:
        """erase_namespace drops a namespace's vector records and, where the backend has a
        native vector index, its rows there (nearest finds nothing in the erased scopes),
        and leaves another namespace's searchable."""
        await semantic.write(
            "u/n1.md", "The user's daughter is called Maya.", expected_version=None
        )
        await semantic.write("u/deep/n2.md", "son Tom", expected_version=None)
        await semantic.write("v/n1.md", "The user's daughter is called Ada.", expected_version=None)
        await semantic.wait_indexed()
        for prefix in ("u/", "u/deep/", "v/"):  # a search fills the native index, if any
            assert (await semantic.search(prefix, "family", **BOUNDS)).matches
        report = await semantic.erase_namespace("u/")
        assert report.entries_left == 0 and report.scopes == 2
        index = semantic.semantic_index
        assert index is not None
        native = await index.native()
        query = await index.embed_query("family")
        for directory in ("u", "u/deep"):
            scope = semantic.directory_scope(directory)
            assert await kv.scan(scope, limit=10, values=False) == []
            if native is not None:
                found = await native.nearest(
                    scope, index.model, query, key_prefix="", limit=10, max_files=100
                )
                assert (found.hits, found.stale, found.considered) == ([], [], 0), (
                    f"native index rows of {scope} outlived the erase"
                )
        assert paths(await semantic.search("u/", "family", **BOUNDS)) == []
        assert paths(await semantic.search("v/", "family", **BOUNDS)) == ["v/n1.md"]

    async def test_concurrent_indexing_from_processes(
        self,
        kv: KVStore,
        store_url: str,
        memory_prefix: str,
        semantic_factory: SemanticFactory,
        concepts: ConceptEmbeddingModel,
    ) -> None:
        """Three processes and 20 tasks append to one file, each write indexed by its own
        writer: once all are done, the stored vectors are the final version's."""
        require_capability(kv, "shared_across_processes", "needs data shared between processes")
        path, per_process = "u/log.md", 5
        procs = await start_append_processes(
            store_url,
            memory_prefix,
            per_process,
            worker="semantic-append",
            path=path,
            tag="daughter",
        )
        async with semantic_factory(kv, concepts) as store:
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            tasks = asyncio.gather(
                *(append_within_race_window(store, path, f"ramen task-{i}") for i in range(20))
            )
            outputs = await asyncio.gather(*(p.communicate() for p in procs))
            await tasks
            await store.wait_indexed()
            for proc, (_, err) in zip(procs, outputs, strict=True):
                assert proc.returncode == 0, err.decode()
            final = await read_whole(store, path)
            assert final is not None
            assert final.content.count("\n") + 1 >= 20 + 3 * per_process
            index = store.semantic_index
            assert index is not None
            entry = await kv.get(store.directory_scope("u"), index.key("log.md"))
            assert entry is not None
            assert VectorRecord.load(entry.value, where="log.md").file_version == final.version
            found = await store.search("u/", "food", **BOUNDS)
            assert paths(found) == ["u/log.md"]
