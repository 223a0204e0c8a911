"""A DynamoDB store used from several event loops (two ``asyncio.run`` calls, a test
framework's loop per test) closes the client it made in each loop as that loop shuts
down: none is left for the garbage collector to find unclosed."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from agent_stores import open_kv


def test_each_loops_client_is_closed_with_its_loop(
    dynamodb_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    kv = open_kv(dynamodb_url)

    async def use(i: int) -> None:
        await kv.create(f"loops/{i}", "k", b"v")
        assert await kv.get(f"loops/{i}", "k") is not None

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(kv.setup())  # the table, when this test runs first on a fresh server
        for i in range(3):
            asyncio.run(use(i))  # a new loop each time, so a new client each time
            gc.collect()
        asyncio.run(kv.aclose())
        gc.collect()
    unclosed = [r.getMessage() for r in caplog.records if "nclosed" in r.getMessage()]
    assert unclosed == []


async def test_aclose_in_the_loop_closes_the_client(dynamodb_url: str) -> None:
    kv = open_kv(dynamodb_url)
    await kv.setup()
    await kv.create("loops/a", "k", b"v")
    await kv.aclose()
    assert not [t for t in asyncio.all_tasks() if "dynamodb-client-guard" in t.get_name()]
