"""The native memory port on DynamoDB: chosen by the hook, one TransactWriteItems per write
the store can predict (counted at botocore's before-send event by the fault injector's
meter), all-or-nothing across receipt, record and markers, and markers never disturbed."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from agent_stores import open_kv, open_memory
from agent_stores.backend import Create, Replace
from agent_stores.errors import ConflictError
from agent_stores.memory import KVMemoryStore
from agent_stores_contract.request_counts import Meter
from agent_stores_dynamodb.kv import DynamoDBKV
from agent_stores_dynamodb.memory import DynamoDBMemoryPort
from pydantic_ai_harness.memory import MemoryOperation


def operation() -> MemoryOperation:
    name = uuid.uuid4().hex[:10]
    return MemoryOperation(f"op-{name}", f"fp-{name}")


@pytest_asyncio.fixture
async def metered(own_table_url: str) -> AsyncIterator[tuple[Meter, KVMemoryStore, KVMemoryStore]]:
    """Two memory stores on two metered clients (two processes, as far as each can tell)."""
    meter = Meter(own_table_url)
    prefix = f"mp-{uuid.uuid4().hex[:8]}:"
    one = KVMemoryStore(await meter.client(), scope_prefix=prefix, owns_kv=True)
    two = KVMemoryStore(await meter.client(), scope_prefix=prefix, owns_kv=True)
    await one.kv.setup()
    yield meter, one, two
    await one.aclose()
    await two.aclose()


async def test_hook_gives_the_native_port(own_table_url: str) -> None:
    async with open_memory(own_table_url) as memory:
        assert isinstance(memory.port, DynamoDBMemoryPort)
        assert memory.port.atomic


async def test_a_predicted_write_is_one_request(
    metered: tuple[Meter, KVMemoryStore, KVMemoryStore],
) -> None:
    """A create (markers included) and a replace of the file this store last wrote are
    one TransactWriteItems each; the file reads back, and its directory lists it."""
    meter, one, _ = metered
    versions: list[str | None] = [None]

    async def write(text: str) -> None:
        done = await one.write(
            "a/b/notes.md", text, expected_version=versions[-1], operation=operation()
        )
        versions.append(done.version)

    created = await meter.count(lambda: write("first"))
    assert created == {"TransactWriteItems": 1}
    replaced = await meter.count(lambda: write("second"))
    assert replaced == {"TransactWriteItems": 1}
    got = await one.read("a/b/notes.md", max_chars=100)
    assert got is not None and got.content == "second"
    assert "a/b/notes.md" in await one.list_paths("a/", limit=10)


async def test_another_writer_costs_a_read_and_loses_nothing(
    metered: tuple[Meter, KVMemoryStore, KVMemoryStore],
) -> None:
    """The other store's prediction is stale: its transaction fails, writes nothing, and
    the store reads and applies the write on the current version."""
    meter, one, two = metered
    first = await one.write("f.md", "one", expected_version=None, operation=operation())
    second = await two.write("f.md", "two", expected_version=first.version, operation=operation())
    counted = await meter.count(
        lambda: one.write("f.md", "three", expected_version=second.version, operation=operation())
    )
    assert counted.get("TransactWriteItems") and sum(counted.values()) <= 4, counted
    got = await two.read("f.md", max_chars=100)
    assert got is not None and got.content == "three"


async def test_a_replayed_operation_writes_nothing_again(
    metered: tuple[Meter, KVMemoryStore, KVMemoryStore],
) -> None:
    """The same operation twice: the second transaction fails on the receipt, nothing is
    written twice, and the caller hears a replay."""
    _, one, _ = metered
    op = operation()
    done = await one.write("r.md", "once", expected_version=None, operation=op)
    again = await one.write("r.md", "once", expected_version=None, operation=op)
    assert again.replayed and again.version == done.version
    got = await one.read("r.md", max_chars=100)
    assert got is not None and got.content == "once"


async def test_transact_is_all_or_nothing_and_keeps_existing_markers(own_table_url: str) -> None:
    """A failed condition anywhere writes nothing (markers included); an existing marker
    keeps its version and value."""
    kv = open_kv(own_table_url)
    assert isinstance(kv, DynamoDBKV)
    try:
        marker = await kv.create("dirs", "d/", b"{}")
        taken = await kv.create("idx", "op-1", b"receipt")
        with pytest.raises(ConflictError) as failed:
            await kv.transact(
                [("idx", Create("op-1", b"again")), ("files", Create("f", b"x"))],
                ensure=[("dirs", "e/", b"{}")],
            )
        assert failed.value.index == 0
        assert await kv.get("files", "f") is None
        assert await kv.get("dirs", "e/") is None
        versions = await kv.transact(
            [("files", Create("f", b"x"))], ensure=[("dirs", "d/", b"{}"), ("dirs", "e/", b"{}")]
        )
        stored = await kv.get("files", "f")
        assert stored is not None and stored.version == versions[0]
        kept = await kv.get("dirs", "d/")
        assert kept is not None and kept.version == marker
        made = await kv.get("dirs", "e/")
        assert made is not None and made.value == b"{}"
        with pytest.raises(ConflictError):
            await kv.transact([("files", Replace("f", b"y", taken))])
    finally:
        await kv.aclose()
