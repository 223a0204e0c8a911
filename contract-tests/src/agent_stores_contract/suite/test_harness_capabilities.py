"""The harness capabilities contract against ``--store-url``."""

from agent_stores_contract.harness_capabilities import HarnessCapabilityContract


class TestHarnessCapabilities(HarnessCapabilityContract):
    """Every harness capability contract test, on the URL under test."""
