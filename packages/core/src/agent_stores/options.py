"""The keyword options of the three stores, typed for editors and ``mypy --strict``.

``open_sessions(url, **options)``, ``open_memory`` and ``open_checkpointer`` (and the
matching :class:`~agent_stores.connection.StoreConnection` methods) take exactly these
keys, so a misspelt option is a type error before it is a runtime error. One concept has
one name in every store: ``scope_prefix`` isolates applications sharing a database, and
durations are seconds in options named ``*_seconds``. The names marked deprecated still
work for one release and warn.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypedDict

if TYPE_CHECKING:
    from .memory.semantic import SearchConfig


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Final[Any] = _Unset()
"""Default of a deprecated option, telling "not given" apart from an explicit None."""


def renamed_option(owner: str, old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """The value of option ``new``, accepting its deprecated name ``old`` with a warning.

    ``old_value`` is :data:`UNSET` when the old name was not given.
    """
    if old_value is UNSET:
        return new_value
    warnings.warn(
        f"{owner}: the option {old}= is deprecated and will be removed; use {new}=",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value


class SessionOptions(TypedDict, total=False):
    """Options of :class:`~agent_stores.sessions.SessionStore` (see docs/sessions.md)."""

    ttl_seconds: float | None
    lease_seconds: float
    poll_initial_seconds: float
    poll_max_seconds: float
    handover_courtesy_seconds: float | None
    close_timeout_seconds: float
    scope_prefix: str
    cache_bytes: int
    tail_bytes: int | None
    chunk_bytes: int | None
    fanout: int


class ConversationOptions(TypedDict, total=False):
    """Options of :class:`~agent_stores.conversations.KVConversationStore` (docs/conversations.md)."""

    scope_prefix: str
    page_size: int
    cache_entries: int


class MemoryOptions(TypedDict, total=False):
    """Options of :class:`~agent_stores.memory.KVMemoryStore` (see docs/memory.md)."""

    scope_prefix: str
    receipt_ttl_seconds: float
    max_receipts_per_file: int
    max_record_bytes: int | None
    page_size: int
    chunk_grace_seconds: float
    search: SearchConfig
    """Lexical, semantic or hybrid search, and the embedder (see docs/memory.md)."""
    subject_of: Callable[[str], tuple[str, str] | None] | None
    """Whose files these are: path -> ``(namespace, subject)`` (see docs/subjects.md)."""
    subject_prefix: str
    receipt_ttl: float
    """Deprecated: ``receipt_ttl_seconds``."""
    chunk_grace: float
    """Deprecated: ``chunk_grace_seconds``."""


class CheckpointerOptions(TypedDict, total=False):
    """Options of :class:`~agent_stores.checkpointer.Checkpointer` (see docs/checkpointer.md)."""

    scope_prefix: str
    ttl_seconds: float | None
    max_snapshots_per_run: int | None
    subject_prefix: str
    namespace: str
    """Deprecated: ``scope_prefix`` (``namespace="cp"`` is ``scope_prefix="cp/"``)."""
    ttl: float | None
    """Deprecated: ``ttl_seconds``."""


__all__ = [
    "UNSET",
    "CheckpointerOptions",
    "MemoryOptions",
    "SessionOptions",
    "renamed_option",
]
