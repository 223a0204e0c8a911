"""Everything a backend author uses, in one place (users import from ``agent_stores``).

A backend subclasses :class:`KVStore` (its ``_`` primitives are the documented backend
contract, see ``docs/kv.md``), registers its scheme with :data:`hookimpl`, and may hand
the stores native ports (``docs/plugins.md``, "Native paths"). The port types are
imported on first use: they pull in Pydantic AI, which a KV-only backend never needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
    InvalidIdError,
    KVError,
    UnknownOptionError,
    UnsupportedError,
    ValueTooLargeError,
)
from .faults import BaseFaultInjector, FaultInjector, FaultKind
from .hookspecs import RegisterBackend, hookimpl
from .kv.base import (
    DEFAULT_DEADLINE_SECONDS,
    MIN_VALUE_BYTES,
    Check,
    Clock,
    Create,
    Delete,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
    new_version,
    prefix_upper_bound,
    within_deadline,
)
from .url import StoreURL, check_options, redact

if TYPE_CHECKING:
    from .checkpointer.port import AppendOutcome, AppendRequest, JournalPort, KVJournalPort
    from .memory.port import MARKER_VALUE, FileWrite, IndexWrite, KVMemoryPort, MemoryPort
    from .sessions.port import (
        GENERIC,
        AcquireReply,
        AcquireRequest,
        ChunkWrite,
        KVSessionPort,
        SaveRequest,
        SessionPort,
        acquired_state,
    )

# name -> module, for the port types imported on first use
_LAZY = {
    **dict.fromkeys(
        [
            "GENERIC",
            "AcquireReply",
            "AcquireRequest",
            "ChunkWrite",
            "KVSessionPort",
            "SaveRequest",
            "SessionPort",
            "acquired_state",
        ],
        "agent_stores.sessions.port",
    ),
    **dict.fromkeys(
        ["MARKER_VALUE", "FileWrite", "IndexWrite", "KVMemoryPort", "MemoryPort"],
        "agent_stores.memory.port",
    ),
    **dict.fromkeys(
        ["AppendOutcome", "AppendRequest", "JournalPort", "KVJournalPort"],
        "agent_stores.checkpointer.port",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_stores.backend' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_DEADLINE_SECONDS",
    "GENERIC",
    "MARKER_VALUE",
    "MIN_VALUE_BYTES",
    "AcquireReply",
    "AcquireRequest",
    "AppendOutcome",
    "AppendRequest",
    "BackendUnavailableError",
    "BaseFaultInjector",
    "Check",
    "ChunkWrite",
    "Clock",
    "ConfigError",
    "ConflictError",
    "CorruptRecordError",
    "Create",
    "Delete",
    "Entry",
    "FaultInjector",
    "FaultKind",
    "FileWrite",
    "IndexWrite",
    "InvalidIdError",
    "JournalPort",
    "KVCapabilities",
    "KVError",
    "KVJournalPort",
    "KVLimits",
    "KVMemoryPort",
    "KVSessionPort",
    "KVStore",
    "MemoryPort",
    "Operation",
    "RegisterBackend",
    "Replace",
    "SaveRequest",
    "ScanItem",
    "SessionPort",
    "StoreURL",
    "UnknownOptionError",
    "UnsupportedError",
    "ValueTooLargeError",
    "acquired_state",
    "check_options",
    "hookimpl",
    "new_version",
    "prefix_upper_bound",
    "redact",
    "within_deadline",
]
