"""The KV contract against ``--store-url``."""

from agent_stores_contract import KVContract


class TestKV(KVContract):
    """Every KV contract test, on the URL under test."""
