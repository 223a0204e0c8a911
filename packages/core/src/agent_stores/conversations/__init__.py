"""Pydantic AI's ``ConversationStore`` on every agent-stores backend (docs/conversations.md)."""

from __future__ import annotations

from .errors import (
    ConversationDamagedError,
    ConversationEntryMissingError,
    ConversationFormatError,
)
from .store import DEFAULT_SCOPE_PREFIX, KVConversationStore

__all__ = [
    "DEFAULT_SCOPE_PREFIX",
    "ConversationDamagedError",
    "ConversationEntryMissingError",
    "ConversationFormatError",
    "KVConversationStore",
]
