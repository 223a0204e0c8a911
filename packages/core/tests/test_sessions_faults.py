"""Sessions under a service's routine faults: lost replies, re-sent writes, silence.

The faults are injected at the KV API of a memory:// store (the embedded backends'
injector, ``agent_stores.kv.faulty``); the contract runs the same scenarios on every
backend through its own injector.
"""

from __future__ import annotations

import asyncio

import pytest
from agent_stores import BackendUnavailableError, ErrorCode
from agent_stores.backends.memory import MemoryKV
from agent_stores.kv.faulty import FaultyKV, KVFaultInjector
from agent_stores.sessions import LeaseLostError, SessionStore, TransientStoreError
from agent_stores.sessions.cache import CachedChunk, ChunkCache
from agent_stores.sessions.records import CHUNK_PREFIX, STATE_KEY, decode_state
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart


def pair(tag: str, pad: int = 300) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f"{tag} " + "x" * pad)]),
        ModelResponse(parts=[TextPart(f"{tag} " + "y" * pad)]),
    ]


def texts(messages: list[ModelMessage] | None) -> list[str]:
    assert messages is not None
    return [str(m.parts[0].content).split(" ")[0] for m in messages]  # type: ignore[union-attr]


def faulty(inner: MemoryKV) -> tuple[KVFaultInjector, FaultyKV]:
    injector = KVFaultInjector()
    return injector, injector.wrap(inner)


async def assert_readable(store: SessionStore, session_id: str, expected: list[str]) -> None:
    """The history is exactly ``expected`` (turn tags, each a request and a response), every
    referenced chunk is stored, and inspect reports no problem."""
    await store.storage.drain()
    assert texts(await store.read_messages(session_id)) == [t for t in expected for _ in (0, 1)]
    info = await store.inspect(session_id)
    assert info is not None and info.problem is None, info
    scope = store.storage.scope_for(session_id)
    state = await store.kv.get(scope, STATE_KEY)
    assert state is not None
    header, _ = decode_state(state.value)
    stored = {i.key async for i in store.kv.iter_scan(scope, prefix=CHUNK_PREFIX, values=False)}
    assert {k for c in header.chunks for k in c.part_keys()} <= stored


async def test_a_resent_save_that_wrote_a_chunk_is_recognised_as_ours() -> None:
    """The SDK re-sends a save whose reply was lost: the re-send meets our own write as a
    conflict. The turn is saved, its chunk kept, and the session stays readable."""
    inner = MemoryKV()
    injector, kv = faulty(inner)
    async with SessionStore(kv, tail_bytes=1024) as store:
        async with store.turn("s") as session:
            session.replace(pair("t0"))
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair("t1"), *pair("t2")])
            injector.arm("ResentWrite", operation="replace")
        assert injector.injected() == {"ResentWrite": 1}
        info = await store.inspect("s")
        assert info is not None and info.chunk_count >= 1 and info.lease_owner is None
        await assert_readable(store, "s", ["t0", "t1", "t2"])
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair("t3")])
    async with SessionStore(inner) as fresh:
        await assert_readable(fresh, "s", ["t0", "t1", "t2", "t3"])


@pytest.mark.parametrize("other_saves", [False, True], ids=["other-holds", "other-saves"])
async def test_a_lost_reply_then_another_client_takes_the_session(other_saves: bool) -> None:
    """A's last save lands but its reply is lost; B takes the session (and may save) before
    A retries. A's turn is reported saved, it is in the history, and nothing is missing."""
    inner = MemoryKV()
    injector, kv = faulty(inner)
    async with SessionStore(kv, tail_bytes=1024) as a, SessionStore(inner) as b:
        async with a.turn("s") as session:
            session.replace(pair("a0"))

        async def b_turn() -> None:
            async with b.turn("s", timeout_seconds=5) as other:
                if other_saves:
                    other.replace([*other.messages, *pair("b1")])

        injector.after_lost_reply = b_turn
        async with a.turn("s") as session:
            session.replace([*session.messages, *pair("a1"), *pair("a2")])
            injector.arm("LostReply", operation="replace")
        assert injector.injected() == {"LostReply": 1}
        expected = ["a0", "a1", "a2", *(["b1"] if other_saves else [])]
        await assert_readable(a, "s", expected)
        await assert_readable(b, "s", expected)


async def test_a_write_that_never_landed_is_retried_and_saved() -> None:
    """A save refused before it reached the store is retried at the turn's end: the turn is
    saved and the session released (no lease left to expire)."""
    injector, kv = faulty(MemoryKV())
    async with SessionStore(kv) as store:
        async with store.turn("s") as session:
            session.replace(pair("t0"))
            injector.arm("Unavailable", times=2, operation="replace")
        assert injector.injected() == {"Unavailable": 2}
        info = await store.inspect("s")
        assert info is not None and info.lease_owner is None
        await assert_readable(store, "s", ["t0"])


async def test_a_lost_reply_on_a_checkpoint_is_adopted_by_the_next_write() -> None:
    """A checkpoint whose reply is lost raises a transient error (code SESSION_STORE_UNAVAILABLE);
    the turn's next write finds it landed and goes on from it."""
    injector, kv = faulty(MemoryKV())
    async with SessionStore(kv, tail_bytes=1024) as store:
        async with store.turn("s") as session:
            injector.arm("LostReply", operation="replace")
            with pytest.raises(TransientStoreError) as raised:
                await session.checkpoint([*pair("c0"), *pair("c1")])
            assert raised.value.code == ErrorCode.SESSION_STORE_UNAVAILABLE
            session.replace([*pair("c0"), *pair("c1"), *pair("c2")])
        await assert_readable(store, "s", ["c0", "c1", "c2"])


async def test_inspect_reports_a_state_referencing_a_missing_chunk() -> None:
    async with SessionStore(MemoryKV(), tail_bytes=1024) as store:
        async with store.turn("s") as session:
            session.replace([*pair("t0"), *pair("t1"), *pair("t2")])
        await store.storage.drain()
        scope = store.storage.scope_for("s")
        chunks = [i.key async for i in store.kv.iter_scan(scope, prefix=CHUNK_PREFIX)]
        await store.kv.delete(scope, chunks[0])
        info = await store.inspect("s")
        assert info is not None and info.problem is not None and "missing" in info.problem


async def test_a_silent_backend_interrupts_the_owner_before_its_lease_expires() -> None:
    """The owner's server goes silent after it acquired: renewals hang. The owner is told
    SESSION_LEASE_LOST before its lease expires, and another client gets the session only
    after that — never two turns at once."""
    inner = MemoryKV()
    injector, kv = faulty(inner)
    lease = 1.5
    events: list[tuple[str, float]] = []
    async with SessionStore(kv, lease_seconds=lease) as a, SessionStore(inner) as b:
        expires_at = 0.0

        async def owner() -> None:
            nonlocal expires_at
            try:
                async with a.turn("s") as session:
                    expires_at = session.lease_expires_at
                    injector.arm("Blackhole", times=1000)
                    await asyncio.sleep(30 * lease)
            except LeaseLostError:
                pass
            else:
                raise AssertionError("the owner was not interrupted")
            events.append(("owner interrupted", inner.clock()))

        async def other() -> None:
            await asyncio.sleep(0.1)
            async with b.turn("s", timeout_seconds=10 * lease):
                events.append(("other acquired", inner.clock()))

        await asyncio.wait_for(asyncio.gather(owner(), other()), timeout=20 * lease)
        injector.disarm()
    assert [name for name, _ in events] == ["owner interrupted", "other acquired"]
    assert events[0][1] < expires_at <= events[1][1]


async def test_every_kv_call_is_bounded_by_the_deadline() -> None:
    injector, kv = faulty(MemoryKV())
    kv.deadline_seconds = 0.2
    injector.arm("Blackhole")
    with pytest.raises(BackendUnavailableError, match=r"did not answer within 0\.2 s"):
        await kv.get("s", "k")


async def test_a_nested_bounded_call_is_covered_by_the_outer_deadline() -> None:
    """A call bounded inside another bounded call of the same store (a native port's request
    inside the session layer's call) sets no timer of its own, yet still gives up in time."""
    from agent_stores.kv.base import within_deadline

    injector, kv = faulty(MemoryKV())
    kv.deadline_seconds = 0.2
    injector.arm("Blackhole")
    started = asyncio.get_running_loop().time()
    with pytest.raises(BackendUnavailableError, match=r"did not answer within 0\.2 s"):
        await within_deadline(kv, within_deadline(kv, kv.get("s", "k")))
    assert asyncio.get_running_loop().time() - started < 5


async def test_a_task_started_inside_a_bounded_call_keeps_its_own_deadline() -> None:
    """A background task started during a bounded call (a chunk clean-up) inherits the
    call's context but not its timer: its own requests are bounded by their own deadline."""
    from agent_stores.kv.base import within_deadline

    injector, kv = faulty(MemoryKV())
    kv.deadline_seconds = 0.2
    spawned: list[asyncio.Task[object]] = []

    async def outer() -> None:
        spawned.append(asyncio.get_running_loop().create_task(kv.get("s", "k")))

    await within_deadline(kv, outer())
    injector.arm("Blackhole")
    with pytest.raises(BackendUnavailableError, match=r"did not answer within 0\.2 s"):
        await asyncio.wait_for(spawned[0], timeout=10)


async def test_a_cold_turn_that_recopies_aged_chunks_reads_its_history() -> None:
    """A store that never saw the session takes a turn whose acquire must re-copy chunks
    due to expire: the copies are cached as they are written, so the chunk reads that
    ride along with the acquire never race the save creating them (it was SESSION_INVALID)."""
    now = [1_000_000.0]
    inner = MemoryKV(clock=lambda: now[0])
    ttl = 1000.0
    async with SessionStore(inner, ttl_seconds=ttl, tail_bytes=1024) as a:
        async with a.turn("s") as session:
            session.replace([*pair("t0"), *pair("t1"), *pair("t2")])
        now[0] += 0.9 * ttl
        async with a.turn("s") as session:
            session.replace([*session.messages, *pair("t3")])
    now[0] += 0.6 * ttl
    for _ in range(3):
        async with SessionStore(inner, ttl_seconds=ttl, tail_bytes=1024) as cold:
            async with cold.turn("s") as session:
                assert texts(session.messages) == [
                    t for t in ("t0", "t1", "t2", "t3") for _ in (0, 1)
                ]
            await assert_readable(cold, "s", ["t0", "t1", "t2", "t3"])


class _ForgetfulCache(ChunkCache):
    """A chunk cache that evicts every chunk right after handing it out: what other turns
    filling a full cache do to a turn waiting for its own read."""

    def get(self, scope: str, key: str) -> CachedChunk | None:
        found = super().get(scope, key)
        if found is not None:
            self.discard(scope, key)
        return found


async def test_a_chunk_evicted_while_a_turn_loads_its_history_is_still_used() -> None:
    """An acquire holds the chunks it found cached: evicted before it assembles the history
    (a cache full of other sessions' chunks), they are neither lost nor read again (it was
    a KeyError with 64 concurrent sessions of 1,000 messages)."""
    async with SessionStore(MemoryKV(), tail_bytes=1024) as store:
        async with store.turn("s") as session:
            session.replace([*pair("t0"), *pair("t1"), *pair("t2"), *pair("t3")])
        assert decode_state((await store.kv.get(store.storage.scope_for("s"), STATE_KEY)).value)[
            0
        ].chunks
        store.storage.cache.__class__ = _ForgetfulCache  # keeps what it holds
        for turn in range(3):
            async with store.turn("s") as session:
                assert texts(session.messages)[:8] == [
                    t for t in ("t0", "t1", "t2", "t3") for _ in (0, 1)
                ]
                session.replace([*session.messages, *pair(f"n{turn}")])
