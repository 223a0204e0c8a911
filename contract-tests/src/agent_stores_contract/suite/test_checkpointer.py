"""The checkpointer contract against ``--store-url``."""

from agent_stores_contract.checkpointer import CheckpointerContract


class TestCheckpointer(CheckpointerContract):
    """Every checkpointer contract test, on the URL under test."""
