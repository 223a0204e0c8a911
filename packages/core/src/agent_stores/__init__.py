"""agent-stores: pluggable persistence for Pydantic AI agents.

Select a backend by URL (``sqlite:///agent.db``, ``redis://…``, ``postgresql://…``) and
get a session store, a memory store or a checkpointer, all built on one small async
key-value compare-and-swap contract (:class:`agent_stores.kv.KVStore`).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .connection import (
    StoreConnection,
    connect,
    open_checkpointer,
    open_conversations,
    open_memory,
    open_sessions,
)
from .errors import (
    AppError,
    BackendNotInstalledError,
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    CorruptRecordError,
    ErrorCode,
    InvalidIdError,
    KVError,
    MalformedURLError,
    PluginLoadError,
    ResourceClosedError,
    Severity,
    UnknownOptionError,
    UnknownSchemeError,
    UnsupportedError,
    ValueTooLargeError,
)
from .hookspecs import hookimpl
from .kv import Entry, KVCapabilities, KVLimits, KVStore
from .selection import default_url, open_kv
from .url import StoreURL

try:
    __version__ = version("agent-stores")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "AppError",
    "BackendNotInstalledError",
    "BackendUnavailableError",
    "ConfigError",
    "ConflictError",
    "CorruptRecordError",
    "Entry",
    "ErrorCode",
    "InvalidIdError",
    "KVCapabilities",
    "KVError",
    "KVLimits",
    "KVStore",
    "MalformedURLError",
    "PluginLoadError",
    "ResourceClosedError",
    "Severity",
    "StoreConnection",
    "StoreURL",
    "UnknownOptionError",
    "UnknownSchemeError",
    "UnsupportedError",
    "ValueTooLargeError",
    "__version__",
    "connect",
    "default_url",
    "hookimpl",
    "open_checkpointer",
    "open_conversations",
    "open_kv",
    "open_memory",
    "open_sessions",
]
