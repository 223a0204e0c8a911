"""The suite's own cleanup is bounded: a backend whose drop_scope leaves entries behind
gets a warning naming the rule, never a fixture that loops until the test timeout."""

from __future__ import annotations

import asyncio

import pytest
from agent_stores_contract.base import drop_namespace
from broken_backends import DropScopeFirstPageOnly


async def test_cleanup_stops_when_drop_scope_leaves_entries() -> None:
    kv = DropScopeFirstPageOnly()
    for i in range(150):
        await kv.create("ns-a", f"k{i:03d}", b"v")
    with pytest.warns(UserWarning, match="still listed after drop_scope"):
        dropped = await asyncio.wait_for(drop_namespace(kv, "ns-"), 10)
    assert dropped == 1
