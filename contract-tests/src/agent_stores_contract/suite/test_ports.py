"""The port contract against ``--store-url`` (the backend's native ports, else the generic ones)."""

from agent_stores_contract.ports import PortContract


class TestPorts(PortContract):
    """Every port contract test, on the URL under test."""
