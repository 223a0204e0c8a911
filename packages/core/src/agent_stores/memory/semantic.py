"""Recall by meaning: the search configuration, and the vector index every backend gets.

A :class:`~agent_stores.memory.KVMemoryStore` opened with ``search=SearchConfig(mode=
"semantic" | "hybrid", embedder=...)`` embeds each file version's passages after the
write has committed (the write itself stays one commit) and answers ``search()`` by
cosine similarity, or by reciprocal-rank fusion of that ranking and the lexical one.

This module is the generic path, built on the KV contract alone, so every backend has
it: one vector record per file and model (:mod:`.vectors`), read with one batched
``get_many`` per search and scored exactly with numpy. A vector is used only when it
was computed from the very version the search read; any other (the write's indexing has
not run yet, crashed, or another model wrote it) is recomputed by that search, so a
search never ranks text that is no longer the file's, and a crash between a write and
its indexing is repaired by the next search, the next write or ``reindex``.

Embedding goes through Pydantic AI's ``Embedder``: any embedding model a Pydantic AI
user has configured works, and the store itself never opens a network connection.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from ..errors import ConfigError, ConflictError, CorruptRecordError
from ..kv.base import KVStore
from ..url import redact
from .passages import DEFAULT_PASSAGE_CHARS, MIN_PASSAGE_CHARS, Passage, split_passages
from .vectors import (
    HEADER_BYTES,
    VectorRecord,
    max_passages,
    numpy_module,
    unit_rows,
    vector_key,
)

if TYPE_CHECKING:
    from pydantic_ai.embeddings import Embedder, EmbeddingModel

    from ..damage import ProblemLog
    from .vector_port import VectorEntry, VectorPort
    from .vectors import Matrix

logger = logging.getLogger("agent_stores.memory")

SearchMode = Literal["lexical", "semantic", "hybrid"]
SEARCH_MODES: tuple[str, ...] = get_args(SearchMode)

#: Reciprocal-rank fusion's constant (the usual 60: a rank's weight is 1 / (60 + rank)).
DEFAULT_RRF_K = 60
#: Texts per embedding request.
DEFAULT_EMBED_BATCH = 64


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """How a memory store answers ``search()``.

    Args:
        mode: ``"lexical"`` (the harness's term counting, no embedder needed),
            ``"semantic"`` (cosine similarity of passages to the query) or ``"hybrid"``
            (reciprocal-rank fusion of both rankings).
        embedder: a Pydantic AI ``Embedder``, an ``EmbeddingModel``, or a model name
            such as ``"openai:text-embedding-3-small"``; required unless lexical.
        passage_chars: the longest passage a vector stands for; a file too long for its
            vectors to fit one stored value gets proportionally longer passages.
        min_similarity: semantic matches below this cosine similarity are left out.
        rrf_k: the constant of reciprocal-rank fusion (hybrid).
        embed_batch: texts sent per embedding request.
        native: use the backend's native vector index (its ``vector_port``) where it
            has one and it is available; False: always the generic path.
    """

    mode: SearchMode = "lexical"
    embedder: Embedder | EmbeddingModel | str | None = None
    passage_chars: int = DEFAULT_PASSAGE_CHARS
    min_similarity: float = 0.0
    rrf_k: int = DEFAULT_RRF_K
    embed_batch: int = DEFAULT_EMBED_BATCH
    native: bool = True

    def __post_init__(self) -> None:
        if self.mode not in SEARCH_MODES:
            raise ConfigError(
                detail=f"search mode must be one of {', '.join(SEARCH_MODES)}, got {self.mode!r}"
            )
        if self.mode != "lexical" and self.embedder is None:
            raise ConfigError(detail=f"search mode {self.mode!r} needs an embedder")
        if self.passage_chars < MIN_PASSAGE_CHARS:
            raise ConfigError(detail=f"passage_chars must be >= {MIN_PASSAGE_CHARS}")
        if not -1.0 <= self.min_similarity <= 1.0:
            raise ConfigError(detail="min_similarity must be between -1 and 1")
        if self.rrf_k < 1 or self.embed_batch < 1:
            raise ConfigError(detail="rrf_k and embed_batch must be >= 1")

    @property
    def semantic(self) -> bool:
        """Whether searches (and writes) use vectors."""
        return self.mode != "lexical"


@dataclass(slots=True)
class IndexedFile:
    """A file's vectors as one search uses them."""

    name: str
    record: VectorRecord
    #: the stored entry's KV version (None: computed by this search, not stored yet)
    entry_version: str | None = None


@dataclass(slots=True)
class ToEmbed:
    """A file version whose vectors must be computed."""

    name: str
    file_version: str
    text: str
    operation_id: str | None = None
    #: KV version of the vector entry it replaces (None: there is none)
    replaces: str | None = None


@dataclass(slots=True)
class ReindexReport:
    """What :meth:`~agent_stores.memory.KVMemoryStore.reindex` did."""

    files: int = 0
    embedded: int = 0
    up_to_date: int = 0
    skipped: list[str] = field(default_factory=list)


class SemanticIndex:
    """The generic vector index of one memory store: embeds, stores and scores."""

    def __init__(self, kv: KVStore, config: SearchConfig, problems: ProblemLog) -> None:
        from pydantic_ai.embeddings import Embedder

        assert config.embedder is not None
        self.kv = kv
        self.config = config
        self.problems = problems
        embedder = config.embedder
        self.embedder: Embedder = embedder if isinstance(embedder, Embedder) else Embedder(embedder)
        self._model: str | None = None
        self._dimensions: int | None = None
        #: embedding requests made (documents and queries), for tests and the bench
        self.requests = 0
        #: texts embedded as documents
        self.documents_embedded = 0
        self._port: VectorPort | None = kv.ports.vector if config.native else None
        self._port_checked = False

    async def native(self) -> VectorPort | None:
        """The backend's vector port when there is one and it can be used (asked once)."""
        port = self._port
        if port is not None and not self._port_checked:
            if await port.unavailable() is not None:
                self._port = port = None
            self._port_checked = True
        return port

    async def mirror(self, scope: str, files: Sequence[VectorEntry]) -> None:
        """Hand ``files`` to the native index, if any; best effort (a search repairs)."""
        port = await self.native()
        if port is None or not files:
            return
        try:
            await port.upsert(scope, self.model, files)
        except Exception as exc:
            logger.warning(
                "could not update the %s index of %d memory file(s) (%s); the next "
                "search repairs it",
                port.name,
                len(files),
                redact(str(exc)),
            )

    @property
    def model(self) -> str:
        """``system:model_name`` of the embedding model: the name vectors are kept under."""
        if self._model is None:
            from pydantic_ai.embeddings import EmbeddingModel, infer_embedding_model

            model = self.embedder.model
            resolved = model if isinstance(model, EmbeddingModel) else infer_embedding_model(model)
            self._model = f"{resolved.system}:{resolved.model_name}"
        return self._model

    def key(self, name: str) -> str:
        """The KV key of file ``name``'s vectors (in the file's own scope)."""
        return vector_key(self.model, name)

    def decode(self, scope: str, name: str, value: bytes) -> VectorRecord | None:
        """The vector record of ``name``, or None (reported) when it does not decode."""
        try:
            record = VectorRecord.load(value, where=repr(f"{scope}/{self.key(name)}"))
        except CorruptRecordError as exc:
            self.problems.report(f"{scope}/{self.key(name)}", exc)
            return None
        return record if record.model == self.model else None

    def usable(self, record: VectorRecord | None, file_version: str | None) -> bool:
        """Whether ``record`` holds this model's vectors of exactly ``file_version``."""
        return (
            record is not None
            and record.file_version == file_version
            and (
                self._dimensions is None
                or record.dimensions == self._dimensions
                or not record.passages  # a blank file: no vector to compare
            )
        )

    # -- embedding ------------------------------------------------------------------------

    async def embed_query(self, query: str) -> Matrix:
        """The query's unit vector (one row)."""
        return await self._embed([query], "query")

    async def embed_files(self, files: Sequence[ToEmbed]) -> list[VectorRecord]:
        """The vector records of ``files``, all their passages embedded in as few requests
        as ``embed_batch`` allows, each small enough for one stored value."""
        limit = self.kv.limits.max_value_bytes
        known = self._dimensions is not None
        records = await self._embed_planned(
            [(file, self._passages(file.text, limit)) for file in files]
        )
        if known:
            return records
        # The first embedding told the dimension: a file with more passages than one value
        # holds at that dimension is split again, into longer passages, and embedded again.
        most = max_passages(limit, self._dimensions or 1)
        again = [i for i, record in enumerate(records) if len(record.passages) > most]
        if again:
            redone = await self._embed_planned(
                [(files[i], self._passages(files[i].text, limit)) for i in again]
            )
            for i, record in zip(again, redone, strict=True):
                records[i] = record
        return records

    async def _embed_planned(
        self, plans: Sequence[tuple[ToEmbed, list[Passage]]]
    ) -> list[VectorRecord]:
        np = numpy_module()
        inputs = [
            _embedding_input(file.name, file.text, passage)
            for file, passages in plans
            for passage in passages
        ]
        matrix = await self._embed(inputs, "document") if inputs else None
        records = []
        row = 0
        for file, passages in plans:
            count = len(passages)
            if matrix is not None and count:
                vectors = matrix[row : row + count]
            else:
                vectors = np.zeros((0, self._dimensions or 1), dtype=np.float32)
            row += count
            records.append(
                VectorRecord(
                    file.file_version, self.model, tuple(passages), vectors, file.operation_id
                )
            )
        return records

    def _passages(self, text: str, limit_bytes: int) -> list[Passage]:
        """The passages of ``text``, longer than configured when that many vectors would
        not fit one stored value."""
        chars = self.config.passage_chars
        passages = split_passages(text, chars)
        dims = self._dimensions
        if dims is None:
            return passages
        most = max_passages(limit_bytes, dims)
        if most < 1:
            raise ConfigError(
                detail=f"one vector of {dims} dimensions does not fit the backend's "
                f"{limit_bytes}-byte values (header {HEADER_BYTES} bytes)"
            )
        if len(passages) > most:
            passages = split_passages(text, chars, merge_paragraphs=True)
        while len(passages) > most and chars < len(text):
            chars *= 2
            passages = split_passages(text, chars, merge_paragraphs=True)
        return passages

    async def _embed(self, texts: list[str], input_type: Literal["query", "document"]) -> Matrix:
        np = numpy_module()
        parts = []
        batch = self.config.embed_batch
        for start in range(0, len(texts), batch):
            chunk = texts[start : start + batch]
            result = await self.embedder.embed(chunk, input_type=input_type)
            self.requests += 1
            if len(result.embeddings) != len(chunk):
                raise ValueError(
                    f"the embedding model returned {len(result.embeddings)} vectors "
                    f"for {len(chunk)} texts"
                )
            parts.append(unit_rows(result.embeddings))
        matrix: Matrix = np.concatenate(parts) if len(parts) > 1 else parts[0]
        dims = int(matrix.shape[1])
        if self._dimensions not in (None, dims):
            logger.warning(
                "embedding model %s now returns %d dimensions (was %d): vectors of the "
                "old dimension are recomputed as searches meet them",
                self.model,
                dims,
                self._dimensions,
            )
        self._dimensions = dims
        if input_type == "document":
            self.documents_embedded += len(texts)
        return matrix

    # -- storing --------------------------------------------------------------------------

    async def store(
        self, scope: str, record: VectorRecord, name: str, replaces: str | None
    ) -> tuple[Literal["stored", "conflict", "too-large"], str | None]:
        """Write ``record`` as ``name``'s vectors over the entry at ``replaces`` (None:
        absent), and say how it went with the new entry's KV version: ``"stored"``;
        ``"conflict"`` when another writer changed the entry first (it wins: it was
        computed from the same version or a newer one, and a search re-checks anyway);
        ``"too-large"`` (logged) when the record does not fit one value."""
        key = self.key(name)
        value = record.dump()
        if len(value) > self.kv.limits.max_value_bytes:
            # Only when one passage's vector alone nears the limit (passages grow to fit
            # otherwise): each search computes the file's vectors again.
            logger.warning(
                "vectors of memory file %r do not fit one stored value (%d bytes)", name, len(value)
            )
            return "too-large", None
        try:
            if replaces is None:
                version = await self.kv.create(scope, key, value)
            else:
                version = await self.kv.replace(scope, key, value, expected_version=replaces)
        except ConflictError:
            return "conflict", None
        return "stored", version

    async def drop(self, scope: str, name: str) -> None:
        """Delete ``name``'s vectors (after the file was deleted); best effort."""
        try:
            port = await self.native()
            if port is not None:
                await port.remove(scope, self.model, [name])
            await self.kv.delete(scope, self.key(name))
        except Exception as exc:
            logger.warning(
                "could not delete the vectors of memory file %r (%s); reindex will",
                name,
                redact(str(exc)),
            )

    # -- ranking --------------------------------------------------------------------------

    def best_passages(
        self, query: Matrix, files: Sequence[IndexedFile]
    ) -> list[tuple[float, IndexedFile, Passage]]:
        """Each file's most similar passage and its cosine similarity (files without
        passages are left out)."""
        np = numpy_module()
        with_vectors = [f for f in files if len(f.record.passages)]
        if not with_vectors:
            return []
        matrix = np.concatenate([f.record.vectors for f in with_vectors])
        scores = matrix @ query[0]
        out = []
        row = 0
        for file in with_vectors:
            count = len(file.record.passages)
            part = scores[row : row + count]
            best = int(np.argmax(part))
            out.append((float(part[best]), file, file.record.passages[best]))
            row += count
        return out


def reciprocal_rank_fusion(rankings: Sequence[Sequence[str]], k: int) -> dict[str, float]:
    """Each item's fused score: the sum over rankings of ``1 / (k + rank)`` (rank from 1)."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (k + rank)
    return fused


def _embedding_input(name: str, text: str, passage: Passage) -> str:
    """What is embedded for a passage: the file's name as a title, then the passage.

    A memory file's name often says what it holds (``family.md``), as its path counts
    in the lexical score.
    """
    title = name.rsplit(".", 1)[0].replace("_", " ").replace("-", " ")
    return f"{title}: {text[passage.start : passage.end]}"


def cut_snippet(text: str, budget: int) -> str:
    """``text`` within ``budget`` characters, ``...`` marking a cut."""
    if len(text) <= budget:
        return text
    return f"{text[: budget - 3]}..." if budget >= 3 else "." * budget
