"""The fault contract against ``--store-url`` (faults from the backend's own injector)."""

from agent_stores_contract.faults import FaultContract


class TestFaults(FaultContract):
    """Every fault contract test, on the URL under test."""
