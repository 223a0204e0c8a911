"""The errors a conversation store raises beyond Pydantic AI's ``ConversationConflict``.

Each names the conversation it is about and is a :class:`~agent_stores.errors.CorruptRecordError`
(code ``RECORD_CORRUPTED``), so ``doctor`` and callers treat a damaged conversation as they
treat a damaged session: nothing is overwritten, the record is left for inspection.
"""

from __future__ import annotations

from ..errors import CorruptRecordError


class ConversationDamagedError(CorruptRecordError):
    """A conversation's stored record or entries cannot be decoded; nothing was changed."""

    def __init__(self, conversation_id: str, reason: str) -> None:
        super().__init__(detail=f"conversation {conversation_id!r}: {reason}")
        self.conversation_id = conversation_id


class ConversationFormatError(ConversationDamagedError):
    """A conversation was written by a newer agent-stores (a format this code does not read)."""

    def __init__(self, conversation_id: str, found: int, supported: int) -> None:
        super().__init__(
            conversation_id,
            f"it is stored in format {found}, newer than the {supported} this agent-stores "
            "reads; upgrade agent-stores to read it (nothing was changed)",
        )
        self.found = found


class ConversationEntryMissingError(ConversationDamagedError, KeyError):
    """An entry a conversation's history needs is gone (a ``KeyError`` too, as Pydantic AI's
    ``ConversationStore`` expects of ``read_history`` when a concurrent delete released it)."""

    def __init__(self, conversation_name: str, entry_id: str) -> None:
        super().__init__(conversation_name, f"entry {entry_id!r} of its history is missing")
        self.entry_id = entry_id

    def __str__(self) -> str:
        return Exception.__str__(self)
