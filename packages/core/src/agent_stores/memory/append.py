"""``append_memory``: add text to a memory file from outside the model, safely under concurrency."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping

from ._harness import (
    MemoryConflictError,
    MemoryFile,
    MemoryMutation,
    MemoryOperation,
    MemoryStore,
    MetadataMemoryStore,
)

DEFAULT_MAX_ATTEMPTS = 100
_FIRST_READ_CHARS = 1 << 20


async def append_memory(
    store: MemoryStore,
    path: str,
    text: str,
    *,
    separator: str = "\n",
    operation: MemoryOperation | None = None,
    metadata: Mapping[str, str] | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    base_delay: float = 0.002,
    max_delay: float = 0.25,
) -> MemoryMutation:
    """Append ``text`` to the file at ``path`` (creating it) with compare-and-swap retries.

    The new content is the whole current file, then ``separator`` unless the file is empty
    or already ends with it, then ``text`` exactly. The file is read in full, however
    long, so nothing is ever cut off. A lost race re-reads and retries after a jittered,
    exponentially growing pause (full jitter, capped at ``max_delay``), so many writers
    make progress instead of colliding in lockstep.

    Works on any ``pydantic_ai_harness.memory.MemoryStore``. With ``operation`` the append
    is idempotent: retrying it after a lost acknowledgement returns the first result
    (``replayed=True``) instead of appending twice. ``metadata`` needs a
    ``MetadataMemoryStore``.

    Raises ``MemoryConflictError`` after ``max_attempts`` lost races, ``ValueError`` for a
    bad path, ``TypeError`` for metadata on a store that cannot record it.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    if metadata is not None and not isinstance(store, MetadataMemoryStore):
        raise TypeError(f"{type(store).__name__} does not record write metadata")
    if operation is not None:
        previous = await store.get_operation(operation)
        if previous is not None:
            return previous
    for attempt in range(max_attempts):
        current = await read_whole(store, path)
        existing = current.content if current is not None else ""
        joiner = separator if existing and separator and not existing.endswith(separator) else ""
        updated = existing + joiner + text
        expected = current.version if current is not None else None
        try:
            if metadata is not None and isinstance(store, MetadataMemoryStore):
                return await store.write_with_metadata(
                    path, updated, expected_version=expected, metadata=metadata, operation=operation
                )
            return await store.write(path, updated, expected_version=expected, operation=operation)
        except MemoryConflictError:
            if attempt + 1 == max_attempts:
                raise
            await asyncio.sleep(random.uniform(0, min(max_delay, base_delay * 2**attempt)))
    raise AssertionError("unreachable")  # pragma: no cover


async def read_whole(store: MemoryStore, path: str) -> MemoryFile | None:
    """Read the whole file, however long: the read bound grows until nothing is cut off."""
    max_chars = _FIRST_READ_CHARS
    while True:
        current = await store.read(path, max_chars=max_chars)
        if current is None or not current.truncated:
            return current
        max_chars *= 4
