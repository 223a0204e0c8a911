"""Everything a backend author uses, in one place (users import from ``agent_stores``).

A backend subclasses :class:`KVStore` (its ``_`` primitives are the documented backend
contract, see ``docs/kv.md``), registers its scheme with :data:`hookimpl`, declares its
URL query options as :class:`URLOptions` (its ``url_options`` class attribute, see
``docs/urls.md``), and may hand the stores native ports (``docs/plugins.md``, "Native paths"). The port toolkit — the port
types, the session record layout and codecs a native acquire reads and writes
(``STATE_KEY``, ``decode_state``, ``acquired_state``, …), and the public API's own checks
(``KVStore.check_open``, ``check_ids``, ``check_value``, ``expires_at``) — is here too; a
backend needs nothing else from the core but ``agent_stores`` and ``agent_stores.errors``.
The port and record types are imported on first use: they pull in Pydantic AI, which a
KV-only backend never needs.
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
    Deadline,
    Delete,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
    TimeBound,
    new_version,
    prefix_upper_bound,
    within_deadline,
    within_seconds,
)
from .lru import LRU
from .url import MASK, StoreURL, URLOption, URLOptions, check_options, redact

if TYPE_CHECKING:
    from .checkpointer.port import (
        AppendOutcome,
        AppendRequest,
        CommitJournalPort,
        JournalPort,
        KVJournalPort,
        check_append,
    )
    from .kv.ports import GENERIC_ONLY, NativePorts
    from .memory.passages import Passage
    from .memory.port import (
        MARKER_VALUE,
        FileWrite,
        IndexWrite,
        KVMemoryPort,
        MemoryPort,
        Transacting,
        TransactMemoryPort,
        check_file_write,
    )
    from .memory.vector_port import NearestFiles, VectorEntry, VectorHit, VectorPort
    from .memory.vectors import (
        VECTOR_PREFIX,
        VectorRecord,
        model_key,
        numpy_module,
        vector_key,
        vector_scan_prefix,
    )
    from .memory.vectors import Matrix as Matrix  # a type alias: for annotations only
    from .sessions import SessionStore
    from .sessions.port import (
        GENERIC,
        HEADER_START,
        KEPT_FIELDS,
        AcquireReply,
        AcquireRequest,
        ChunkWrite,
        KVSessionPort,
        SaveRequest,
        SessionPort,
        acquired_header,
        acquired_state,
        acquired_state_if_takeable,
        check_save,
        decide_acquire,
        fresh_state,
        known_acquired_state,
    )
    from .sessions.records import (
        CHUNK_PREFIX,
        FORMAT,
        STATE_KEY,
        WAITER_KEY,
        ChunkRef,
        Lease,
        RecordError,
        StateHeader,
        decode_state,
        encode_state,
    )

# name -> module, for the port types imported on first use
_LAZY = {
    **dict.fromkeys(
        [
            "GENERIC",
            "HEADER_START",
            "KEPT_FIELDS",
            "AcquireReply",
            "AcquireRequest",
            "ChunkWrite",
            "KVSessionPort",
            "SaveRequest",
            "SessionPort",
            "acquired_header",
            "acquired_state",
            "acquired_state_if_takeable",
            "check_save",
            "decide_acquire",
            "fresh_state",
            "known_acquired_state",
        ],
        "agent_stores.sessions.port",
    ),
    **dict.fromkeys(
        [
            "CHUNK_PREFIX",
            "FORMAT",
            "STATE_KEY",
            "WAITER_KEY",
            "ChunkRef",
            "Lease",
            "RecordError",
            "StateHeader",
            "decode_state",
            "encode_state",
        ],
        "agent_stores.sessions.records",
    ),
    "SessionStore": "agent_stores.sessions",
    **dict.fromkeys(["GENERIC_ONLY", "NativePorts"], "agent_stores.kv.ports"),
    **dict.fromkeys(
        [
            "MARKER_VALUE",
            "FileWrite",
            "IndexWrite",
            "KVMemoryPort",
            "MemoryPort",
            "Transacting",
            "TransactMemoryPort",
            "check_file_write",
        ],
        "agent_stores.memory.port",
    ),
    "Passage": "agent_stores.memory.passages",
    **dict.fromkeys(
        ["NearestFiles", "VectorEntry", "VectorHit", "VectorPort"],
        "agent_stores.memory.vector_port",
    ),
    **dict.fromkeys(
        [
            "VECTOR_PREFIX",
            "VectorRecord",
            "model_key",
            "numpy_module",
            "vector_key",
            "vector_scan_prefix",
        ],
        "agent_stores.memory.vectors",
    ),
    **dict.fromkeys(
        [
            "AppendOutcome",
            "AppendRequest",
            "CommitJournalPort",
            "JournalPort",
            "KVJournalPort",
            "check_append",
        ],
        "agent_stores.checkpointer.port",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agent_stores.backend' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "CHUNK_PREFIX",
    "DEFAULT_DEADLINE_SECONDS",
    "FORMAT",
    "GENERIC",
    "GENERIC_ONLY",
    "HEADER_START",
    "KEPT_FIELDS",
    "LRU",
    "MARKER_VALUE",
    "MASK",
    "MIN_VALUE_BYTES",
    "STATE_KEY",
    "VECTOR_PREFIX",
    "WAITER_KEY",
    "AcquireReply",
    "AcquireRequest",
    "AppendOutcome",
    "AppendRequest",
    "BackendUnavailableError",
    "BaseFaultInjector",
    "Check",
    "ChunkRef",
    "ChunkWrite",
    "Clock",
    "CommitJournalPort",
    "ConfigError",
    "ConflictError",
    "CorruptRecordError",
    "Create",
    "Deadline",
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
    "Lease",
    "MemoryPort",
    "NativePorts",
    "NearestFiles",
    "Operation",
    "Passage",
    "RecordError",
    "RegisterBackend",
    "Replace",
    "SaveRequest",
    "ScanItem",
    "SessionPort",
    "SessionStore",
    "StateHeader",
    "StoreURL",
    "TimeBound",
    "TransactMemoryPort",
    "Transacting",
    "URLOption",
    "URLOptions",
    "UnknownOptionError",
    "UnsupportedError",
    "ValueTooLargeError",
    "VectorEntry",
    "VectorHit",
    "VectorPort",
    "VectorRecord",
    "acquired_header",
    "acquired_state",
    "acquired_state_if_takeable",
    "check_append",
    "check_file_write",
    "check_options",
    "check_save",
    "decide_acquire",
    "decode_state",
    "encode_state",
    "fresh_state",
    "hookimpl",
    "known_acquired_state",
    "model_key",
    "new_version",
    "numpy_module",
    "prefix_upper_bound",
    "redact",
    "vector_key",
    "vector_scan_prefix",
    "within_deadline",
    "within_seconds",
]
