"""The agent-stores contract suite: importable base classes every backend must pass.

Run it against any installed backend::

    pytest --pyargs agent_stores_contract.suite --store-url redis://localhost:6379/0?prefix=ct

or subclass the contract classes in your own test module (see ``docs/contract.md``).
"""

from .base import ContractBase
from .kv import KVContract

__all__ = ["ContractBase", "KVContract"]
