"""The session contract against ``--store-url``."""

from agent_stores_contract.sessions import SessionContract


class TestSessions(SessionContract):
    """Every session contract test, on the URL under test."""
