"""Memory store: the ``pydantic_ai_harness.memory`` protocols on any agent-stores backend.

:class:`KVMemoryStore` implements ``MemoryStore``, ``SearchableMemoryStore`` and
``MetadataMemoryStore`` on the KV CAS base class, so ``Memory(store=..., namespace=...)``
works unchanged on every backend. :func:`append_memory` appends from outside the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .append import append_memory, read_whole
    from .semantic import SearchConfig
    from .store import KVMemoryStore

__all__ = ["KVMemoryStore", "SearchConfig", "append_memory", "read_whole"]

# Imported on first use: backends import ``agent_stores.memory.port`` to implement their
# native port, and that must not import the harness (and with it Pydantic AI, over a
# second of CPU) into every process that opens a backend.
_LAZY = {
    "KVMemoryStore": "agent_stores.memory.store",
    "SearchConfig": "agent_stores.memory.semantic",
    "append_memory": "agent_stores.memory.append",
    "read_whole": "agent_stores.memory.append",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
