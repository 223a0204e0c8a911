"""The vector port contract against ``--store-url`` (skipped, with the reason, where the
backend has no vector port or its index is unavailable on the server under test)."""

from agent_stores_contract.vectors import VectorPortContract


class TestVectorPort(VectorPortContract):
    """Every vector port contract test, on the URL under test."""
