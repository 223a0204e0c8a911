"""The agent-stores contract suite: importable base classes every backend must pass.

Run it against any installed backend::

    pytest --pyargs agent_stores_contract.suite --store-url "redis://localhost:6379/0?prefix=ct"

or subclass the contract classes in your own test module (see ``docs/contract.md``).
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import ContractBase
from .kv import KVContract

# Store contracts are imported on first use so the KV contract works without the
# optional Pydantic AI dependencies being importable.
_LAZY = {
    "SessionContract": "agent_stores_contract.sessions",
    "MemoryContract": "agent_stores_contract.memory",
    "CheckpointerContract": "agent_stores_contract.checkpointer",
    "FaultContract": "agent_stores_contract.faults",
    "PortContract": "agent_stores_contract.ports",
}

__all__ = [
    "CheckpointerContract",
    "ContractBase",
    "FaultContract",
    "KVContract",
    "MemoryContract",
    "PortContract",
    "SessionContract",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
