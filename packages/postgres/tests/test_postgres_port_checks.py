"""The native PostgreSQL ports apply the public KV API's checks, and the native acquire
writes exactly the bytes ``acquired_state`` makes (issue 24).

Invalid ids, oversized values, TTLs of zero or less and a closed client are the port
contract's (on every backend); here the acquire's bytes.

Each check test first shows what the KV API does with an input (the reference the generic
ports inherit, since they write through it), then that every native port method given
the same input raises the same typed error before anything reaches the server.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from agent_stores import open_kv
from agent_stores.checkpointer.port import AppendRequest
from agent_stores.errors import ValueTooLargeError
from agent_stores.memory.port import FileWrite, IndexWrite
from agent_stores.sessions import SessionStore
from agent_stores.sessions.port import (
    AcquireRequest,
    SaveRequest,
    acquired_state,
    fresh_state,
)
from agent_stores.sessions.records import (
    EMPTY_ARRAY,
    STATE_KEY,
    ChunkRef,
    Lease,
    StateHeader,
    decode_state,
    encode_state,
)
from agent_stores_postgres.kv import PostgresKV
from agent_stores_postgres.sessions import PostgresSessionPort
from pg_test_support import with_options

LIMIT = 2048
#: A time with 17 significant digits: any rounding on the way shows.
NOW = 1722334455.1234567


async def open_store(url: str) -> PostgresKV:
    kv = open_kv(url)
    assert isinstance(kv, PostgresKV)
    await kv.setup()
    kv.limits = dataclasses.replace(kv.limits, max_value_bytes=LIMIT)
    return kv


@pytest_asyncio.fixture
async def kv(schema_url: str) -> AsyncIterator[PostgresKV]:
    store = await open_store(schema_url)
    try:
        yield store
    finally:
        await store.aclose()


def memory_write(
    *,
    scope: str = "dir",
    key: str = "f.md",
    value: bytes = b"record",
    ttl: float | None = None,
    index: IndexWrite | None = None,
    markers: tuple[tuple[str, str], ...] = (),
) -> FileWrite:
    return FileWrite(scope, key, value, None, ttl, index, list(markers))


def append(
    *,
    scope: str = "run",
    head_key: str = "head/j",
    head_value: bytes = b'{"next":1}',
    key: str = "j/a",
    value: bytes = b"entry",
    ttl: float | None = None,
) -> AppendRequest:
    return AppendRequest(scope, head_key, head_value, None, key, value, ttl)


def acquire(scope: str, *, owner: str = "owner-b", now: float = NOW) -> AcquireRequest:
    return AcquireRequest(
        scope=scope,
        owner=owner,
        now=now,
        lease_end=now + 10.000000001,
        store_id="store-b",
        courtesy_seconds=0.5,
        ttl_seconds=None,
        refresh_horizon=None,
        load_history=True,
        held_chunks=frozenset(),
    )


def released_state(now: float, *, tail: bytes = EMPTY_ARRAY, chunked: bool = True) -> bytes:
    """A released session's state as the core writes it: fence 3, one chunk (unless not
    ``chunked``), floats of 17 significant digits."""
    chunk = ChunkRef("h/c1", 2, 40, 1, 0, False, now + 1e-5)
    header = StateHeader(
        lease=Lease("owner-a", 3, now - 1.5, now - 11.25),
        fence=3,
        chunks=(chunk,) if chunked else (),
        tail_count=len(json.loads(tail)),
        recovery=(),
        recovery_since=None,
        created_at=now - 100.5,
        updated_at=now - 0.3,
        released_by="store-a",
        released_at=now - 0.3,
    )
    return encode_state(header, tail)


async def saved_session(kv: PostgresKV, scope: str) -> str:
    now = kv.clock()
    return await kv.create(scope, STATE_KEY, fresh_state("seed", now + 10, now))


@pytest.mark.parametrize("float_digits", [None, "0"], ids=["default", "extra_float_digits=0"])
async def test_acquire_writes_exactly_the_acquired_state(
    schema_url: str, float_digits: str | None
) -> None:
    """The state a native acquire stores and returns is byte for byte acquired_state() of
    the stored one — also for an owner with non-ASCII characters and quotes, times of 17
    significant digits, and a server whose extra_float_digits would round float8 text."""
    url = schema_url
    if float_digits is not None:
        url = with_options(schema_url, options=f"-c extra_float_digits={float_digits}")
    kv = await open_store(url)
    try:
        port = PostgresSessionPort(kv)
        stored = released_state(NOW, tail=b'[{"kind":"request","parts":[]}]')
        await kv.create("s", STATE_KEY, stored)
        await kv.create("s", "h/c1/0", b"[1,2]")
        request = acquire("s", owner='owné "b"\\')
        reply = await port.acquire(request)
        assert reply.outcome == "acquired"
        expected = acquired_state(
            stored, owner=request.owner, lease_end=request.lease_end, now=request.now
        )
        assert expected is not None
        assert reply.state == expected, f"\n got {reply.state!r}\nwant {expected!r}"
        entry = await kv.get("s", STATE_KEY)
        assert entry is not None and (entry.value, entry.version) == (expected, reply.version)
        header, _ = decode_state(entry.value)
        assert header.lease is not None
        assert (header.fence, header.lease.expires_at) == (4, request.lease_end)
        assert reply.parts == {"h/c1/0": b"[1,2]"}
        # The next acquire (same owner: a re-entry) reads the bytes it wrote, fence 5.
        again = dataclasses.replace(request, now=NOW + 1, lease_end=NOW + 11)
        second = await port.acquire(again)
        assert second.outcome == "acquired"
        assert second.state == acquired_state(
            expected, owner=again.owner, lease_end=again.lease_end, now=again.now
        )
    finally:
        await kv.aclose()


async def test_acquire_of_a_state_in_another_layout_is_generic(kv: PostgresKV) -> None:
    """A stored state that decodes but is not in the layout encode_state writes (the JSON
    the previous version of this port wrote: keys sorted, spaces) is left to the generic
    path, which re-encodes it, instead of being rewritten in a layout acquired_state()
    refuses; a turn on it then works and stores the core's layout."""
    stored = released_state(NOW, chunked=False)
    line, tail = stored.split(b"\n", 1)
    other = json.dumps(json.loads(line), sort_keys=True).encode() + b"\n" + tail
    assert decode_state(other) == decode_state(stored)
    assert acquired_state(other, owner="o", lease_end=NOW + 1, now=NOW) is None
    version = await kv.create("session:s", STATE_KEY, other)
    reply = await PostgresSessionPort(kv).acquire(acquire("session:s"))
    assert reply.outcome == "generic"
    entry = await kv.get("session:s", STATE_KEY)
    assert entry is not None and (entry.value, entry.version) == (other, version)
    async with SessionStore(kv, lease_seconds=5) as store, store.turn("s") as session:
        assert session.messages == []
    entry = await kv.get("session:s", STATE_KEY)
    assert entry is not None and entry.value.startswith(b'{"format":')


async def test_acquire_refuses_to_grow_the_state_over_the_limit(kv: PostgresKV) -> None:
    """An acquire whose new state (a longer owner in the lease) would exceed max_value_bytes
    writes nothing and answers GENERIC, whose save refuses it with ValueTooLargeError like
    any KV write; a fresh session whose state would not fit is GENERIC too."""
    port = PostgresSessionPort(kv)
    stored = released_state(NOW)
    pad = LIMIT - len(stored) - 10  # the stored state fits, with room for 10 more bytes
    stored = released_state(NOW, tail=b'["' + b"t" * (pad - 4) + b'"]')
    assert LIMIT - 20 < len(stored) <= LIMIT
    version = await kv.create("s", STATE_KEY, stored)
    request = acquire("s", owner="o" * 100)
    grown = acquired_state(stored, owner=request.owner, lease_end=request.lease_end, now=NOW)
    assert grown is not None and len(grown) > LIMIT
    reply = await port.acquire(request)
    assert reply.outcome == "generic"
    entry = await kv.get("s", STATE_KEY)
    assert entry is not None and (entry.value, entry.version) == (stored, version)
    with pytest.raises(ValueTooLargeError):
        await port.save(SaveRequest("s", grown, version, None, None, []))
    fresh = await port.acquire(acquire("absent", owner="o" * LIMIT))
    assert fresh.outcome == "generic"
    assert await kv.get("absent", STATE_KEY) is None
