"""The ``pydantic_ai_harness.memory`` names the store implements, imported in one place.

The harness is an optional dependency of ``agent-stores`` (the ``harness`` extra); a
missing install is reported once, here, with the command that fixes it.

The harness itself is imported on first use of one of these names (``_harness.MemoryFile``
and so on, looked up when called): importing it imports Pydantic AI, over a second of CPU,
and listing paths (``agent-stores memory URL ls``) needs none of it. So that listing also
needs no import, the path rules are kept here, as the harness's ``_store`` module has
them; ``tests/test_memory_store.py`` checks the two agree.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic_ai_harness.memory import (
        MemoryConflictError,
        MemoryFile,
        MemoryMutation,
        MemoryOperation,
        MemoryOperationConflictError,
        MemorySearchMatch,
        MemorySearchResult,
        MemoryStore,
        MetadataMemoryStore,
        SearchableMemoryStore,
    )
    from pydantic_ai_harness.memory._store import (
        decode_metadata,
        encode_metadata,
        lexical_search,
    )


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # e.g. blocked with sys.modules[name] = None
        return False


if not (_installed("pydantic_ai_harness") and _installed("pydantic_ai")):
    raise ImportError(  # pragma: no cover - exercised only without the extra
        "agent_stores.memory needs pydantic-ai-harness: pip install 'agent-stores[harness]'"
    )

# Where each lazily imported name lives.
_LAZY = {
    "MemoryConflictError": "pydantic_ai_harness.memory",
    "MemoryFile": "pydantic_ai_harness.memory",
    "MemoryMutation": "pydantic_ai_harness.memory",
    "MemoryOperation": "pydantic_ai_harness.memory",
    "MemoryOperationConflictError": "pydantic_ai_harness.memory",
    "MemorySearchMatch": "pydantic_ai_harness.memory",
    "MemorySearchResult": "pydantic_ai_harness.memory",
    "MemoryStore": "pydantic_ai_harness.memory",
    "MetadataMemoryStore": "pydantic_ai_harness.memory",
    "SearchableMemoryStore": "pydantic_ai_harness.memory",
    "decode_metadata": "pydantic_ai_harness.memory._store",
    "encode_metadata": "pydantic_ai_harness.memory._store",
    "lexical_search": "pydantic_ai_harness.memory._store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# The harness's path rules (``pydantic_ai_harness.memory._store``), word for word.
_VALID_SEGMENT_RE = re.compile(r"[A-Za-z0-9_.-]{1,200}")


def validate_store_path(path: str) -> None:
    """Reject path strings that could escape a store's root directory or name another path.

    A ``.`` segment is rejected because a filesystem resolves ``a/./b`` to ``a/b``, which
    would let one namespace address another's files.
    """
    if not all(
        _VALID_SEGMENT_RE.fullmatch(segment) and ".." not in segment and segment != "."
        for segment in path.split("/")
    ):
        raise ValueError(f"invalid memory path: {path!r}")


def validate_store_prefix(prefix: str) -> None:
    """Reject a listing or search prefix whose path part is invalid (``""`` lists all)."""
    if prefix:
        validate_store_path(prefix.removesuffix("/"))


__all__ = [
    "MemoryConflictError",
    "MemoryFile",
    "MemoryMutation",
    "MemoryOperation",
    "MemoryOperationConflictError",
    "MemorySearchMatch",
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
