"""Semantic memory search: passages, the vector record format, the configuration, and what
a write costs with an embedder (the contract, ``agent_stores_contract.semantic``, covers
the behaviour on every backend)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from agent_stores import ConfigError, CorruptRecordError
from agent_stores.backends.memory import MemoryKV
from agent_stores.kv.counting import CountingKV
from agent_stores.memory import KVMemoryStore, SearchConfig
from agent_stores.memory.passages import Passage, split_passages
from agent_stores.memory.semantic import reciprocal_rank_fusion
from agent_stores.memory.vectors import VectorRecord, max_passages, unit_rows
from agent_stores_contract.embedding import ConceptEmbeddingModel
from hypothesis import given
from hypothesis import strategies as st

BOUNDS = {"limit": 10, "max_files": 100, "max_chars": 4000, "max_file_chars": 65536}


# -- passages ---------------------------------------------------------------------------------


def test_paragraphs_are_passages() -> None:
    text = "First paragraph,\nstill first.\n\n\nSecond one.\n"
    spans = split_passages(text, 100)
    assert [text[p.start : p.end] for p in spans] == [
        "First paragraph,\nstill first.",
        "Second one.",
    ]


def test_paragraphs_can_be_packed_together() -> None:
    text = "one\n\ntwo\n\nthree"
    assert len(split_passages(text, 64)) == 3
    [whole] = split_passages(text, 64, merge_paragraphs=True)
    assert text[whole.start : whole.end] == text


def test_long_lines_are_cut_at_whitespace() -> None:
    text = " ".join(f"word{i}" for i in range(100))
    spans = split_passages(text, 64)
    assert all(p.end - p.start <= 64 for p in spans)
    assert " ".join(text[p.start : p.end] for p in spans) == text


@given(
    st.text(alphabet=st.sampled_from("ab \n\t."), max_size=600),
    st.integers(64, 200),
    st.booleans(),
)
def test_passages_cover_the_text_in_order(text: str, limit: int, merge: bool) -> None:
    """Passages are ordered, disjoint, at most ``limit`` long, trimmed, and together hold
    every non-blank character of the text (paragraphs packed together or not)."""
    spans = split_passages(text, limit, merge_paragraphs=merge)
    assert spans == split_passages(text, limit, merge_paragraphs=merge)  # deterministic
    end = 0
    for span in spans:
        assert end <= span.start < span.end <= len(text)
        assert span.end - span.start <= limit
        piece = text[span.start : span.end]
        assert piece == piece.strip() and piece
        end = span.end
    kept = "".join(text[p.start : p.end] for p in spans)
    assert sorted(c for c in kept if not c.isspace()) == sorted(c for c in text if not c.isspace())


def test_passage_length_has_a_floor() -> None:
    with pytest.raises(ValueError, match="passage_chars"):
        split_passages("x", 10)


# -- the vector record --------------------------------------------------------------------------


def _record(rows: list[list[float]]) -> VectorRecord:
    passages = tuple(Passage(i * 10, i * 10 + 5) for i in range(len(rows)))
    return VectorRecord("v1", "contract:concepts", passages, unit_rows(rows), "op")


def test_vector_record_round_trips_as_raw_float32() -> None:
    record = _record([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]])
    data = record.dump()
    header, _, raw = data.partition(b"\n")
    assert len(raw) == 2 * 3 * 4
    assert json.loads(header)["d"] == 3
    loaded = VectorRecord.load(data, where="x")
    assert loaded.passages == record.passages and loaded.file_version == "v1"
    assert loaded.operation_id == "op"
    np.testing.assert_allclose(loaded.vectors, [[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], rtol=1e-6)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[:-1],  # a byte short
        lambda d: d.replace(b'"d":3', b'"d":4'),
        lambda d: d.replace(b'"f":1', b'"f":9'),
        lambda d: b"no header at all",
        lambda d: d.replace(b'"s":[[0,5]', b'"s":[[5,0]'),
        lambda d: d.partition(b"\n")[0] + b"\n" + np.array([np.nan] * 6, "<f4").tobytes(),
    ],
)
def test_damaged_vector_record_is_refused(damage: object) -> None:
    data = _record([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]).dump()
    with pytest.raises(CorruptRecordError):
        VectorRecord.load(damage(data), where="x")  # type: ignore[operator]


def test_zero_vector_stays_zero_and_bad_embeddings_are_refused() -> None:
    np.testing.assert_array_equal(unit_rows([[0.0, 0.0]]), [[0.0, 0.0]])
    with pytest.raises(ValueError, match="not finite"):
        unit_rows([[float("inf"), 1.0]])
    with pytest.raises(ValueError, match="matrix"):
        unit_rows([[]])


def test_passages_per_value() -> None:
    # 400 KB DynamoDB items hold about a hundred 1,024-dimension vectors.
    assert 90 <= max_passages(400_000, 1024) <= 100
    assert max_passages(2000, 1024) == 0


# -- configuration ----------------------------------------------------------------------------


def test_search_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="needs an embedder"):
        SearchConfig(mode="semantic")
    with pytest.raises(ConfigError, match="one of lexical, semantic, hybrid"):
        SearchConfig(mode="vector", embedder=ConceptEmbeddingModel())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="passage_chars"):
        SearchConfig(mode="hybrid", embedder=ConceptEmbeddingModel(), passage_chars=3)
    with pytest.raises(TypeError, match="SearchConfig"):
        KVMemoryStore(MemoryKV(), search={"mode": "semantic"})  # type: ignore[arg-type]


async def test_semantic_mode_on_a_lexical_store_says_what_is_missing() -> None:
    async with KVMemoryStore(MemoryKV(), owns_kv=True) as store:
        with pytest.raises(ValueError, match="needs a store opened with an embedder"):
            await store.search("u/", "x", mode="semantic", **BOUNDS)
        with pytest.raises(ValueError, match="reindex needs"):
            await store.reindex()


def test_fusion_adds_reciprocal_ranks() -> None:
    fused = reciprocal_rank_fusion([["a", "b"], ["b", "c"]], 60)
    assert fused == pytest.approx({"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 62})


# -- what a write costs -------------------------------------------------------------------------


@pytest.mark.parametrize("generic", [False, True])
async def test_write_keeps_its_commit_and_indexing_adds_one_write(generic: bool) -> None:
    """The write the caller waits on makes the same KV calls with an embedder as without;
    the indexing after it reads record and vectors in one call and writes once."""
    calls = {}
    for search in (None, SearchConfig(mode="semantic", embedder=ConceptEmbeddingModel())):
        kv = CountingKV(MemoryKV(), native_ports=not generic)
        async with KVMemoryStore(kv, owns_kv=True, search=search) as store:
            await store.write("u/warm.md", "x", expected_version=None)
            await store.wait_indexed()
            kv.reset_counts()
            await store.write("u/n.md", "daughter " * 500, expected_version=None)
            calls[search is None] = dict(kv.calls)
            kv.reset_counts()
            await store.wait_indexed()
            if search is not None:
                assert dict(kv.calls) == {"get_many": 1, "create": 1}
    assert calls[False] == calls[True]


async def test_one_embedding_request_per_search_once_indexed() -> None:
    model = ConceptEmbeddingModel()
    async with KVMemoryStore(
        MemoryKV(), owns_kv=True, search=SearchConfig(mode="hybrid", embedder=model)
    ) as store:
        for i in range(20):
            await store.write(f"u/f{i}.md", f"daughter {i}", expected_version=None)
        await store.wait_indexed()
        before = model.calls
        await store.search("u/", "family", **BOUNDS)
        assert model.calls == before + 1


async def test_a_blank_file_is_indexed_once_and_never_matches() -> None:
    model = ConceptEmbeddingModel()
    async with KVMemoryStore(
        MemoryKV(), owns_kv=True, search=SearchConfig(mode="semantic", embedder=model)
    ) as store:
        await store.write("u/blank.md", "  \n\n ", expected_version=None)
        await store.write("u/a.md", "daughter", expected_version=None)
        await store.wait_indexed()
        for _ in range(2):
            found = await store.search("u/", "family", **BOUNDS)
            assert [m.path for m in found.matches] == ["u/a.md"]
        assert model.documents == ["a: daughter"]


async def test_an_empty_directory_costs_no_embedding() -> None:
    model = ConceptEmbeddingModel()
    async with KVMemoryStore(
        MemoryKV(), owns_kv=True, search=SearchConfig(mode="semantic", embedder=model)
    ) as store:
        found = await store.search("nobody/", "family", **BOUNDS)
        assert (found.matches, found.scanned, model.calls) == ([], 0, 0)


async def test_vectors_of_another_dimension_are_recomputed_before_the_first_embedding() -> None:
    """A fresh store's first search reads vectors before its first embedding tells the
    dimension: vectors of the same model name but another dimension are recomputed."""
    kv = MemoryKV()
    short = ConceptEmbeddingModel(dimensions=8)
    async with KVMemoryStore(kv, search=SearchConfig(mode="semantic", embedder=short)) as store:
        await store.write("u/a.md", "daughter", expected_version=None)
    longer = ConceptEmbeddingModel(dimensions=16)  # same name: same model key
    async with KVMemoryStore(kv, search=SearchConfig(mode="semantic", embedder=longer)) as store:
        found = await store.search("u/", "family", **BOUNDS)
        assert [m.path for m in found.matches] == ["u/a.md"]
        assert longer.documents == ["a: daughter"]


async def test_a_long_file_gets_longer_passages_to_fit_one_value() -> None:
    """A fresh store does not know the dimension before its first embedding: a file with
    more passages than one value holds is split again into longer passages, and stored."""
    import uuid

    from agent_stores import open_kv

    kv = open_kv(f"memory://long-{uuid.uuid4().hex[:8]}?max_value_bytes=4096")
    model = ConceptEmbeddingModel(dimensions=64)
    text = "\n\n".join(f"daughter number {i} " * 4 for i in range(40))
    async with KVMemoryStore(
        kv, owns_kv=True, search=SearchConfig(mode="semantic", embedder=model)
    ) as store:
        await store.write("u/long.md", text, expected_version=None)
        await store.wait_indexed()
        assert store.semantic_index is not None
        entry = await kv.get(store.directory_scope("u"), store.semantic_index.key("long.md"))
        assert entry is not None and len(entry.value) <= 4096
        record = VectorRecord.load(entry.value, where="long.md")
        assert 1 < len(record.passages) <= max_passages(4096, 64)
        assert record.passages[-1].end == len(text.rstrip())
        embedded = len(model.documents)
        found = await store.search("u/", "family", **BOUNDS)
        assert [m.path for m in found.matches] == ["u/long.md"]
        assert len(model.documents) == embedded
