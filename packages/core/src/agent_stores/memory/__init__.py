"""Memory store: the ``pydantic_ai_harness.memory`` protocols on any agent-stores backend.

:class:`KVMemoryStore` implements ``MemoryStore``, ``SearchableMemoryStore`` and
``MetadataMemoryStore`` on the KV CAS base class, so ``Memory(store=..., namespace=...)``
works unchanged on every backend. :func:`append_memory` appends from outside the model.
"""

from .append import append_memory, read_whole
from .store import KVMemoryStore

__all__ = ["KVMemoryStore", "append_memory", "read_whole"]
