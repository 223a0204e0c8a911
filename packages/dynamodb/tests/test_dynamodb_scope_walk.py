"""iter_scopes on DynamoDB is one Scan through the table, a page per request, where paging
scopes() scans the whole table for every page. Requests are counted at botocore's
before-send hook (the request-counting fault injector), never timed."""

from __future__ import annotations

from agent_stores_contract.request_counts import Meter

SCOPES = 30


async def test_a_walk_scans_the_table_once(own_table_url: str) -> None:
    # A table of its own: its whole Scan fits in one page, whatever other tests wrote.
    meter = Meter(own_table_url)
    kv = await meter.client()
    try:
        names = {f"walk/{i:03d}" for i in range(SCOPES)}
        for name in names:
            await kv.create(name, "a", b"v")
            await kv.create(name, "b", b"v")

        walked: list[str] = []

        async def walk() -> None:
            walked.extend([s async for s in kv.iter_scopes(prefix="walk/", page_size=4)])

        assert await meter.count(walk) == {"Scan": 1}
        assert sorted(walked) == sorted(names)

        async def page_through() -> None:
            cursor = None
            while page := await kv.scopes(prefix="walk/", start_after=cursor, limit=4):
                cursor = page[-1]

        assert (await meter.count(page_through))["Scan"] >= SCOPES // 4
    finally:
        for name in [s async for s in kv.iter_scopes()]:
            await kv.drop_scope(name)
        await kv.aclose()
