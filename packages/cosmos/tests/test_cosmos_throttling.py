"""429 (request rate too large) is retried after ``x-ms-retry-after-ms``, then typed.

A proxy in front of the real test server plays Azure's throttling (the npm server never
throttles); everything that is not throttled reaches the real server.
"""

from __future__ import annotations

import itertools

import pytest
from agent_stores import BackendUnavailableError, StoreURL, open_kv
from cosmos_throttle_proxy import ThrottlingProxy


def _through(url: str, port: int, **options: str) -> str:
    parsed = StoreURL.parse(url)
    return parsed.set(port=port).with_query(**options).render_with_secrets()


async def test_throttled_request_is_retried_after_the_asked_delay(cosmos_url: str) -> None:
    """Two 429s, then the write goes through; each retry waited at least x-ms-retry-after-ms."""
    port = StoreURL.parse(cosmos_url).port
    assert port is not None
    async with ThrottlingProxy(port, retry_after_ms=200) as proxy:
        kv = open_kv(_through(cosmos_url, proxy.port))
        async with kv:
            await kv.setup()
            proxy.item_requests.clear()
            proxy.throttle = 2
            version = await kv.create("s", "k", b"v")
            assert proxy.throttled == 2
            assert len(proxy.item_requests) == 3  # two refused, the third reached the server
            gaps = [b - a for a, b in itertools.pairwise(proxy.item_requests)]
            assert all(gap >= 0.19 for gap in gaps), gaps
            entry = await kv.get("s", "k")
            assert entry is not None and entry.version == version


async def test_throttling_that_does_not_stop_is_backend_unavailable(cosmos_url: str) -> None:
    """Past ?retries=, a 429 becomes BackendUnavailableError naming 429 (cause kept); nothing written."""
    port = StoreURL.parse(cosmos_url).port
    assert port is not None
    async with ThrottlingProxy(port, retry_after_ms=20) as proxy:
        kv = open_kv(_through(cosmos_url, proxy.port, retries="2"))
        async with kv:
            await kv.setup()
            proxy.item_requests.clear()
            proxy.throttle = 1000
            with pytest.raises(BackendUnavailableError, match="429") as info:
                await kv.create("s", "k", b"v")
            assert isinstance(info.value, ConnectionError)
            assert info.value.__cause__ is not None
            assert len(proxy.item_requests) == 3  # the first try and two retries
            proxy.throttle = 0
            assert await kv.get("s", "k") is None


@pytest.mark.parametrize("retry_write", [None, 1])
async def test_lost_reply_of_a_create_is_recognised_on_retry(
    cosmos_url: str, retry_write: int | None
) -> None:
    """A ready client that re-sends writes loses a create's reply: not a false conflict.

    azure-core reports the cut connection as "request not sent" and azure-cosmos re-sends
    the write, with its default settings (None) as with ``retry_write``.

    The server applied the create; the re-sent create gets 409; the store reads the item,
    finds its own write token, and returns that write's version.
    """
    from azure.cosmos.aio import CosmosClient

    parsed = StoreURL.parse(cosmos_url)
    assert parsed.port is not None
    key = parsed.query_get("key")
    async with ThrottlingProxy(parsed.port) as proxy:
        extra = {} if retry_write is None else {"retry_write": retry_write}
        client = CosmosClient(
            f"http://127.0.0.1:{proxy.port}/",
            credential=key,
            enable_endpoint_discovery=False,
            **extra,
        )
        async with client:
            kv = open_kv(
                client,
                prefix=str(parsed.query_get("prefix")),
                database=parsed.path.strip("/").split("/")[0],
                container=parsed.path.strip("/").split("/")[1],
                create=True,
                emulator="cosmosdb-server",
                retries=0,  # the store never re-sends: only the SDK does
            )
            async with kv:
                await kv.setup()
                proxy.item_requests.clear()
                proxy.drop_replies = 1
                version = await kv.create("s", "lost", b"v")
                assert proxy.drop_replies == 0
                entry = await kv.get("s", "lost")
                assert entry is not None and entry.version == version and entry.value == b"v"
                # A replace whose reply is lost: the SDK's re-send meets 412, the store
                # finds its own write token and reports the write it made.
                proxy.drop_replies = 1
                newer = await kv.replace("s", "lost", b"w", expected_version=version)
                assert proxy.drop_replies == 0
                entry = await kv.get("s", "lost")
                assert entry is not None and entry.version == newer and entry.value == b"w"
