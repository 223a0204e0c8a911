"""The semantic search contract against ``--store-url``."""

from agent_stores_contract.semantic import SemanticContract


class TestSemantic(SemanticContract):
    """Every semantic search contract test, on the URL under test."""
