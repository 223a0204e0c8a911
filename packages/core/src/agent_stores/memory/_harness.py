"""The ``pydantic_ai_harness.memory`` names the store implements, imported in one place.

The harness is an optional dependency of ``agent-stores`` (the ``harness`` extra); a
missing install is reported once, here, with the command that fixes it.
"""

from __future__ import annotations

try:
    from pydantic_ai_harness.memory import (
        MemoryConflictError,
        MemoryFile,
        MemoryMutation,
        MemoryOperation,
        MemoryOperationConflictError,
        MemorySearchResult,
        MemoryStore,
        MetadataMemoryStore,
        SearchableMemoryStore,
    )
    from pydantic_ai_harness.memory._store import (
        decode_metadata,
        encode_metadata,
        lexical_search,
        validate_store_path,
        validate_store_prefix,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "agent_stores.memory needs pydantic-ai-harness: pip install 'agent-stores[harness]'"
    ) from exc

__all__ = [
    "MemoryConflictError",
    "MemoryFile",
    "MemoryMutation",
    "MemoryOperation",
    "MemoryOperationConflictError",
    "MemorySearchResult",
    "MemoryStore",
    "MetadataMemoryStore",
    "SearchableMemoryStore",
    "decode_metadata",
    "encode_metadata",
    "lexical_search",
    "validate_store_path",
    "validate_store_prefix",
]
