"""The conversation contract (Pydantic AI's ConversationStore) against ``--store-url``, or
against ``--conversation-store module:attribute``, any third party's store."""

from agent_stores_contract.conversations import ConversationContract


class TestConversations(ConversationContract):
    """Every conversation contract test, on the store under test."""
