"""The damage contract (one bad record costs only itself) against ``--store-url``."""

from agent_stores_contract.damage import DamageContract


class TestDamage(DamageContract):
    """Every damage contract test, on the URL under test."""
