"""The agent-stores contract suite: importable base classes every backend must pass.

Run it against any installed backend::

    pytest --pyargs agent_stores_contract.suite --store-url "redis://localhost:6379/0?prefix=ct"

or subclass the contract classes in your own test module (see ``docs/contract.md``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import ContractBase
    from .checkpointer import CheckpointerContract
    from .conversations import ConversationContract
    from .faults import FaultContract
    from .harness_capabilities import HarnessCapabilityContract
    from .kv import KVContract
    from .memory import MemoryContract
    from .ports import PortContract
    from .semantic import SemanticContract
    from .sessions import SessionContract
    from .vectors import VectorPortContract

# Every contract is imported on first use: the KV contract works without the optional
# Pydantic AI dependencies, and the contract's worker processes (``python -m
# agent_stores_contract.session_workers`` and the others) do not import pytest and
# Hypothesis, over a second of CPU each, on a machine the suite already keeps busy.
_LAZY = {
    "ContractBase": "agent_stores_contract.base",
    "KVContract": "agent_stores_contract.kv",
    "SessionContract": "agent_stores_contract.sessions",
    "MemoryContract": "agent_stores_contract.memory",
    "CheckpointerContract": "agent_stores_contract.checkpointer",
    "ConversationContract": "agent_stores_contract.conversations",
    "FaultContract": "agent_stores_contract.faults",
    "HarnessCapabilityContract": "agent_stores_contract.harness_capabilities",
    "PortContract": "agent_stores_contract.ports",
    "SemanticContract": "agent_stores_contract.semantic",
    "VectorPortContract": "agent_stores_contract.vectors",
}

__all__ = [
    "CheckpointerContract",
    "ContractBase",
    "ConversationContract",
    "FaultContract",
    "HarnessCapabilityContract",
    "KVContract",
    "MemoryContract",
    "PortContract",
    "SemanticContract",
    "SessionContract",
    "VectorPortContract",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)
