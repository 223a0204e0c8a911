"""The native vector port of the memory store: nearest passages found by the database.

The generic path (:mod:`.semantic`) reads every candidate file's vector record and scores
them with numpy, so a search costs time linear in the namespace's passages. A backend
whose database has vector search (sqlite-vec, pgvector) implements :class:`VectorPort`
and returns it from its ``vector_port`` hook::

    @hookimpl
    def vector_port(kv):
        return MyVectorPort(kv) if isinstance(kv, MyKV) else None

The port keeps a **derived** index, never the source of truth: the KV vector record
(``~v/<model key>/<name>``) stays what the generic path and ``copy`` read, and the port's
index can be dropped and rebuilt from the KV entries at any time. The store keeps it
exact with two rules:

* every entry the port holds names the KV versions of the file record and of the vector
  record it was checked against (:class:`VectorEntry`). :meth:`VectorPort.unindexed`
  lists, in one query the database answers from its own indexes, the keys whose current
  record has another KV version (or none indexed): written since, deleted, never
  indexed; a search brings those up to date (reading, and if need be embedding, only
  them) before it asks :meth:`VectorPort.nearest`, which reports a file whose vector
  record changed (damaged, replaced) as ``stale`` instead of returning it — checked for
  the files it would return only, as a vector record is large to read;
* a hit names the file version it was computed from, and the store uses it only when the
  file it then reads has that version; otherwise it repairs the entry and asks again, and
  falls back to the generic path if the index still disagrees.

So a native search never ranks text that is no longer the file's, and a port that loses
entries (crash, restore, a model change) costs time, never a wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .passages import Passage
    from .vectors import Matrix, VectorRecord


@dataclass(frozen=True, slots=True)
class VectorEntry:
    """What the port records for one key of a memory scope."""

    #: the key (the file's name in its directory scope)
    name: str
    #: KV version of the record entry this state was read from
    kv_version: str
    #: the vectors of the file's live version; None: not a searchable file (a tombstone,
    #: a directory marker), recorded so :meth:`VectorPort.unindexed` stops listing it
    vectors: VectorRecord | None
    #: KV version of the stored vector record (``vector_key(model, name)``) these
    #: vectors were read from or written as; None: not stored (too large for one value)
    vectors_kv_version: str | None = None


@dataclass(frozen=True, slots=True)
class VectorHit:
    """A file's passage most similar to the query."""

    name: str
    #: the file version the passage's vector was computed from
    file_version: str
    passage: Passage
    #: cosine similarity to the query
    similarity: float


@dataclass(frozen=True, slots=True)
class NearestFiles:
    """The answer of :meth:`VectorPort.nearest`."""

    #: best passage per file, most similar first (ties by name)
    hits: list[VectorHit]
    #: searchable files the search considered (at most ``max_files``)
    considered: int
    #: whether more searchable files matched the prefix than ``max_files``
    more: bool
    #: files that would have been hits but whose vector record (``vector_key(model,
    #: name)``) is absent or has another KV version than upserted (rewritten, damaged,
    #: deleted): left out of ``hits``, for the store to read again
    stale: list[str] = field(default_factory=list)


@runtime_checkable
class VectorPort(Protocol):
    """Nearest-passage search kept by the backend's own database, beside its KV table."""

    #: what the index is built on, for logs and ``check`` (``"sqlite-vec"``, ``"pgvector"``)
    name: str

    async def unavailable(self) -> str | None:
        """None when the index can be used; else why not (the extension cannot be
        loaded or created), said once in a log line, and the store uses the generic
        path. Cheap after the first call."""
        ...

    async def upsert(self, scope: str, model: str, files: Sequence[VectorEntry]) -> None:
        """Replace whatever the index holds for each of ``files`` (by ``(scope, model,
        name)``) with it. ``model`` is ``system:model_name``; vectors of different models
        never meet, and one model's vectors may change dimension (all of a model's rows
        then have the new one after their files are upserted again)."""
        ...

    async def remove(self, scope: str, model: str, names: Sequence[str]) -> None:
        """Forget ``names`` (the next :meth:`unindexed` lists them if they still exist)."""
        ...

    async def unindexed(
        self, scope: str, model: str, key_prefix: str, below: str, limit: int
    ) -> list[str]:
        """Up to ``limit`` keys of ``scope`` that start with ``key_prefix`` and sort
        before ``below``, with a live (unexpired) KV entry whose version is not the one
        last upserted for ``(scope, model, key)``; in key order."""
        ...

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
        """The ``limit`` files (with passages) most similar to ``query`` (one unit row),
        each by its best passage, among the first ``max_files`` searchable files whose
        name starts with ``key_prefix`` in key order (a file without passages counts as
        considered). Entries of another dimension than ``query``'s are ignored. May be
        approximate for a large scope (say so in the docs); must be exact for one of a
        few thousand passages."""
        ...

    async def drop_scope(self, scope: str) -> None:
        """Forget everything indexed in ``scope`` (every model)."""
        ...
