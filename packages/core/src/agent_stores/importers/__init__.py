"""Importers from the stores agent-stores replaces, each read with its own documented API
and format: harness memory stores and pydantic-ai-memory-core (:mod:`.memory`), harness
step stores (:mod:`.steps`) and Cortex Agent SDK Redis sessions (:mod:`.cortex`).

Every import is idempotent (a rerun skips what is already there and identical) and its
:class:`ImportReport` lists what could not be carried over and why.
"""

from .report import ImportReport

__all__ = ["ImportReport"]
