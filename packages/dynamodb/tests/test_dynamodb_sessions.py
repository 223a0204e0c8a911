"""The native session port on DynamoDB: chosen by the hook, two requests per warm turn
(counted from botocore's events), bytes per turn flat from history 10 to 1,000, three per
cold turn (the failed transaction returns the state as it stands), and the generic path
whenever that state cannot be taken."""

from __future__ import annotations

import statistics
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import connect, open_kv, open_sessions
from agent_stores.backend import Replace
from agent_stores.errors import ConflictError
from agent_stores.sessions import SessionBusyError, SessionStore
from agent_stores_dynamodb.config import parse_url
from agent_stores_dynamodb.kv import DynamoDBKV, StaleConditionError
from agent_stores_dynamodb.sessions import DynamoDBSessionPort
from aiobotocore.session import get_session
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart


def pair(i: int) -> list[ModelMessage]:
    """Two messages of about 500 bytes of JSON each."""
    return [
        ModelRequest(parts=[UserPromptPart(f"q{i} " + "x" * 440)]),
        ModelResponse(parts=[TextPart(f"a{i} " + "y" * 440)]),
    ]


@dataclass
class Meter:
    """Every DynamoDB request the client sends (botocore events), with its body size."""

    calls: list[str] = field(default_factory=list)
    sent: int = 0

    def reset(self) -> None:
        self.calls.clear()
        self.sent = 0

    def before_send(self, request: Any, **_: Any) -> None:
        target = dict(request.headers).get("X-Amz-Target", b"")
        name = target.decode() if isinstance(target, bytes) else str(target)
        self.calls.append(name.rsplit(".", 1)[-1])
        self.sent += len(request.body or b"")


@pytest_asyncio.fixture
async def metered(own_table_url: str) -> AsyncIterator[tuple[DynamoDBKV, Meter]]:
    """A store on a ready client whose every HTTP request is counted."""
    settings = parse_url(own_table_url)
    meter = Meter()
    async with get_session().create_client("dynamodb", **settings.client_kwargs()) as client:
        client.meta.events.register("before-send.dynamodb", meter.before_send)
        kv = open_kv(client, table=settings.table, prefix=f"t-{uuid.uuid4().hex[:12]}")
        assert isinstance(kv, DynamoDBKV)
        await kv.setup()
        yield kv, meter
        await kv.aclose()


@pytest_asyncio.fixture
async def elsewhere(
    own_table_url: str, metered: tuple[DynamoDBKV, Meter]
) -> AsyncIterator[DynamoDBKV]:
    """A second client on the same table and prefix: another process, as far as the
    metered client's session port can tell."""
    settings = parse_url(own_table_url)
    async with get_session().create_client("dynamodb", **settings.client_kwargs()) as client:
        kv = open_kv(client, table=settings.table, prefix=metered[0].prefix)
        assert isinstance(kv, DynamoDBKV)
        yield kv
        await kv.aclose()


async def test_hook_gives_the_native_port(own_table_url: str) -> None:
    """open_sessions on a dynamodb:// URL runs the core's store over the DynamoDB port."""
    async with open_sessions(own_table_url) as sessions:
        assert isinstance(sessions, SessionStore)
        assert isinstance(sessions.storage.port, DynamoDBSessionPort)
    async with open_sessions("memory://native-check") as other:
        assert not isinstance(other.storage.port, DynamoDBSessionPort)


async def test_warm_turn_is_two_requests_and_bytes_stay_flat(
    metered: tuple[DynamoDBKV, Meter],
) -> None:
    """A warm turn (enter, read, replace + 2 messages, exit) is exactly 2 HTTP requests at
    history 10 and 1,000; bytes sent per turn do not grow with the history."""
    kv, meter = metered
    sessions = connect(kv).sessions()
    bytes_at: dict[int, float] = {}
    for size in (10, 1000):
        sid = f"s{size}"
        history: list[ModelMessage] = []
        for i in range(size // 2):
            history += pair(i)
        async with sessions.turn(sid) as s:
            s.replace(history)
        sent: list[int] = []
        for t in range(4):
            meter.reset()
            async with sessions.turn(sid) as s:
                assert len(s.messages) == size + 2 * t
                s.replace([*s.messages, *pair(10**6 + t)])
            # acquire: one transaction; save: one transaction, or one PutItem when no
            # history chunk is new (the inline tail absorbed the messages)
            assert len(meter.calls) == 2, meter.calls
            assert meter.calls[0] == "TransactWriteItems", meter.calls
            assert meter.calls[1] in ("TransactWriteItems", "PutItem"), meter.calls
            sent.append(meter.sent)
        bytes_at[size] = statistics.median(sent)
    assert bytes_at[1000] < 1.5 * bytes_at[10], bytes_at
    assert bytes_at[1000] < 40_000  # far from the ~500 KB of the whole history


async def test_stale_memory_takes_the_returned_state(own_table_url: str) -> None:
    """When another process wrote the session since this one saved, the remembered state
    fails its condition and the turn goes on from the state the failure returned: nothing
    lost, no double owner."""
    async with open_sessions(own_table_url) as one, open_sessions(own_table_url) as two:
        async with one.turn("s") as s:
            s.replace(pair(1))
        async with two.turn("s") as s:
            assert len(s.messages) == 2
            s.replace([*s.messages, *pair(2)])
        async with one.turn("s") as s:  # its remembered state is stale now
            assert len(s.messages) == 4
            s.replace([*s.messages, *pair(3)])
        async with two.turn("s") as s:
            assert len(s.messages) == 6


async def written_by_both(kv: DynamoDBKV, elsewhere: DynamoDBKV) -> tuple[SessionStore, ...]:
    """Two stores, on the metered client and on another; each has written session ``s``
    once (the other last), so the first's remembered state is stale."""
    one, two = connect(kv).sessions(), connect(elsewhere).sessions()
    async with one.turn("s") as s:
        s.replace(pair(1))
    async with two.turn("s") as s:
        s.replace([*s.messages, *pair(2)])
    return one, two


async def test_cold_turn_is_three_requests_without_a_read(
    metered: tuple[DynamoDBKV, Meter], elsewhere: DynamoDBKV
) -> None:
    """Another client wrote last: the failed transaction returns the state, a second one
    takes the lease on it, the save follows; the turn sees the other client's messages."""
    kv, meter = metered
    one, two = await written_by_both(kv, elsewhere)
    meter.reset()
    async with one.turn("s") as s:
        assert len(s.messages) == 4
        s.replace([*s.messages, *pair(3)])
    # the failed acquire, the acquire, the save (a transaction when it writes a chunk)
    assert len(meter.calls) == 3, meter.calls
    assert meter.calls[:2] == ["TransactWriteItems", "TransactWriteItems"]
    assert not {"GetItem", "BatchGetItem"} & set(meter.calls)
    async with two.turn("s") as s:
        assert len(s.messages) == 6


async def test_a_stale_state_held_by_another_client_is_not_taken(
    metered: tuple[DynamoDBKV, Meter], elsewhere: DynamoDBKV
) -> None:
    """The returned state shows another owner's live lease: the port leaves the turn to
    the core, which waits for it and reports the session busy, never a second owner."""
    kv, meter = metered
    one, two = await written_by_both(kv, elsewhere)
    async with two.turn("s") as held:
        held.replace([*held.messages, *pair(3)])
        meter.reset()
        with pytest.raises(SessionBusyError):
            async with one.turn("s", timeout_seconds=0.3):
                pass
        assert meter.calls[0] == "TransactWriteItems"  # the port tried, then the core waited
        assert "BatchGetItem" in meter.calls
        # Tried once: the polls that follow do not pay a failed transaction each.
        assert meter.calls.count("TransactWriteItems") == 1, meter.calls
    async with one.turn("s") as s:
        assert len(s.messages) == 6


async def test_a_failed_replace_in_a_commit_carries_the_stored_item(
    metered: tuple[DynamoDBKV, Meter],
) -> None:
    """commit's ConflictError on a Replace is a StaleConditionError with the item as it
    stands (one request, no read); on an absent key it carries None."""
    kv, meter = metered
    first = await kv.create("scope", "k", b"one")
    second = await kv.replace("scope", "k", b"two", expected_version=first)
    meter.reset()
    with pytest.raises(StaleConditionError) as failed:
        await kv.commit("scope", [Replace("k", b"three", first)])
    assert meter.calls == ["TransactWriteItems"]
    assert failed.value.index == 0 and failed.value.key == "k"
    assert failed.value.stored is not None
    assert (failed.value.stored.value, failed.value.stored.version) == (b"two", second)
    with pytest.raises(StaleConditionError) as missing:
        await kv.commit("scope", [Replace("absent", b"x", first)])
    assert missing.value.stored is None
    assert isinstance(missing.value, ConflictError)
