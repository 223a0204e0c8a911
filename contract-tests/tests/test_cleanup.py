"""The suite's own cleanup is bounded: a backend whose drop_scope leaves entries behind
gets a warning naming the rule, never a fixture that loops until the test timeout."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from agent_stores.backends.memory import MemoryKV
from agent_stores_contract.base import CLEANUP_ROUNDS, drop_namespace
from broken_backends import DropScopeFirstPageOnly


class ScopesNeverEnd(MemoryKV):
    """scopes invents a new name on every call: a listing that never runs dry."""

    names = itertools.count()

    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        return [f"{prefix}{next(self.names)}"]


async def test_cleanup_stops_when_drop_scope_leaves_entries() -> None:
    kv = DropScopeFirstPageOnly()
    for i in range(150):
        await kv.create("ns-a", f"k{i:03d}", b"v")
    with pytest.warns(UserWarning, match="still listed after drop_scope"):
        dropped = await asyncio.wait_for(drop_namespace(kv, "ns-"), 10)
    assert dropped == 1


async def test_cleanup_stops_when_scopes_keeps_naming_new_scopes() -> None:
    kv = ScopesNeverEnd("scopes-never-end")
    with pytest.warns(UserWarning, match="still listed after"):
        dropped = await asyncio.wait_for(drop_namespace(kv, "ns-"), 30)
    assert dropped == CLEANUP_ROUNDS
