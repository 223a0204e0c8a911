"""Ready-to-run test modules: ``pytest --pyargs agent_stores_contract.suite --store-url URL``."""
