"""The key-value compare-and-swap layer every store is built on."""

from .base import (
    Check,
    Create,
    Delete,
    Entry,
    KVCapabilities,
    KVLimits,
    KVStore,
    Operation,
    Replace,
    ScanItem,
)

__all__ = [
    "Check",
    "Create",
    "Delete",
    "Entry",
    "KVCapabilities",
    "KVLimits",
    "KVStore",
    "Operation",
    "Replace",
    "ScanItem",
]
