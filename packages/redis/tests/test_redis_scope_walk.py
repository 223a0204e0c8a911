"""iter_scopes on Redis reads the keyspace once: one SCAN cursor per primary kept across
pages, each candidate checked once, where paging scopes() SCANs everything for every page.
Commands are counted on the client, never timed."""

from __future__ import annotations

from collections import Counter

import pytest
from agent_stores import open_kv
from redis_test_support import Commands, with_fresh_prefix

SCOPES = 40


@pytest.mark.parametrize("target", ["redis", "redis-cluster"])
async def test_a_walk_scans_the_keyspace_once(
    target: str, redis_urls: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_kv(with_fresh_prefix(redis_urls[target])) as kv:
        names = {f"walk/{i:03d}" for i in range(SCOPES)}
        for name in names:
            await kv.create(name, "k", b"v")
        commands = Commands(monkeypatch)
        walked = [s async for s in kv.iter_scopes(prefix="walk/", page_size=4)]
        assert sorted(walked) == sorted(names)
        sent = Counter(commands.sent)
        walk_scans = sent["SCAN"]
        assert walk_scans >= (3 if target == "redis-cluster" else 1), sent  # a cursor per primary
        assert sent["EVALSHA"] == SCOPES, sent  # one liveness check per scope

        commands.sent.clear()
        cursor, paged = None, []
        while page := await kv.scopes(prefix="walk/", start_after=cursor, limit=4):
            paged += page
            cursor = page[-1]
        assert paged == sorted(names)
        # Ten pages, each a whole walk of the keyspace (other tests' keys included, which
        # is why the bound is relative): the single walk costs a tenth of that.
        assert Counter(commands.sent)["SCAN"] >= (SCOPES // 4) * walk_scans
