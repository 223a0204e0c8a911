"""The memory contract against ``--store-url``."""

from agent_stores_contract.memory import MemoryContract


class TestMemory(MemoryContract):
    """Every memory contract test, on the URL under test."""
