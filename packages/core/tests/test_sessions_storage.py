"""The generic storage layer: round trips, caching, compaction, TTL invariants, lost acknowledgements."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from agent_stores import BackendUnavailableError, ResourceClosedError
from agent_stores.backends.memory import MemoryKV
from agent_stores.kv import KVStore
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import SessionStore
from agent_stores.sessions.records import CHUNK_PREFIX, STATE_KEY, decode_state
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart


def pair(tag: str, pad: int = 200) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f"{tag} " + "x" * pad)]),
        ModelResponse(parts=[TextPart(f"{tag} " + "y" * pad)]),
    ]


async def layout(
    store: SessionStore, session_id: str
) -> tuple[set[str], set[str], dict[str, float | None], float | None]:
    """(referenced part keys, stored part keys, expiry of each stored part, expiry of the state)."""
    await store.storage.drain()
    scope = store.storage.scope_for(session_id)
    state = await store.kv.get(scope, STATE_KEY)
    assert state is not None
    header, _ = decode_state(state.value)
    referenced = {k for c in header.chunks for k in c.part_keys()}
    stored = {
        i.key: i.entry.expires_at
        async for i in store.kv.iter_scan(scope, prefix=CHUNK_PREFIX)
        if i.entry
    }
    return referenced, set(stored), stored, state.expires_at


async def test_three_round_trips_per_turn_and_cached_chunks() -> None:
    """A warm turn is get_many + CAS acquire + CAS save/release, and reads only the state."""
    counting = CountingKV(MemoryKV())
    async with SessionStore(counting) as store:
        async with store.turn("s") as session:
            session.replace([m for i in range(100) for m in pair(str(i))])
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair("warm")])
        before = await store.kv.get(store.storage.scope_for("s"), STATE_KEY)
        counting.reset_counts()
        async with store.turn("s") as session:
            assert len(session.messages) == 202
            session.replace([*session.messages, *pair("next", pad=10)])
        assert dict(counting.calls) == {"get_many": 1, "replace": 2}
        assert before is not None and counting.bytes_read == len(before.value)
    # A store that never saw the session reads the chunks.
    cold = CountingKV(counting.inner)
    async with SessionStore(cold) as other, other.turn("s") as session:
        assert len(session.messages) == 204
    assert cold.bytes_read > 40_000


async def test_chunk_count_stays_bounded_and_no_orphans() -> None:
    """Many small appends keep the chunk count logarithmic; merged-away chunks are deleted."""
    async with SessionStore(MemoryKV(), tail_bytes=600, fanout=4) as store:
        for i in range(300):
            async with store.turn("s") as session:
                session.replace([*session.messages, *pair(str(i), pad=100)])
        info = await store.inspect("s")
        assert info is not None and info.message_count == 600
        levels = math.ceil(math.log(info.stored_bytes / 600, 4)) + 1
        assert info.chunk_count <= 3 * levels, info
        referenced, stored, _, _ = await layout(store, "s")
        assert referenced == stored
        # A rewrite that is not an extension replaces every chunk.
        async with store.turn("s") as session:
            session.replace(list(reversed(session.messages)))
        referenced2, stored2, _, _ = await layout(store, "s")
        assert referenced2 == stored2 and not (stored2 & stored)
        assert len(await store.read_messages("s") or []) == 600


async def test_chunks_never_expire_before_the_state() -> None:
    """With time moving on by most of a TTL between turns, every referenced chunk outlives the state."""
    kv = MemoryKV()
    offset = 0.0
    kv.clock = lambda: 1_000_000.0 + offset
    async with SessionStore(kv, ttl_seconds=100, lease_seconds=5, tail_bytes=600) as store:
        for i in range(12):
            async with store.turn("s") as session:
                session.replace([*session.messages, *pair(str(i))])
            referenced, stored, expiry, state_expiry = await layout(store, "s")
            assert referenced <= stored
            assert state_expiry is not None
            assert all((expiry[k] or 0) >= state_expiry for k in referenced)
            offset += 70
        assert len(await store.read_messages("s") or []) == 24


class LostAckKV(CountingKV):
    """Applies a state write, then reports a connection error, ``lose`` times (a lost acknowledgement)."""

    def __init__(self, inner: KVStore, when: Callable[[str], bool]) -> None:
        super().__init__(inner)
        self.lose = 0
        self.when = when

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        version = await super()._replace(scope, key, value, expected_version, expires_at, now)
        if self.lose and self.when(key):
            self.lose -= 1
            raise BackendUnavailableError(detail="connection reset after the write")
        return version


async def test_lost_acknowledgement_of_a_renewal_is_adopted() -> None:
    """A renewal that landed but whose answer was lost is recognised: the turn keeps its lease and saves."""
    kv = LostAckKV(MemoryKV(), lambda key: key == STATE_KEY)
    async with SessionStore(kv, lease_seconds=0.6, ttl_seconds=60) as store:
        async with store.turn("s") as session:
            kv.lose = 1
            await asyncio.sleep(1.0)
            session.replace(pair("kept"))
        assert kv.lose == 0
        assert len(await store.read_messages("s") or []) == 2


async def test_lost_acknowledgement_of_an_acquire_is_recovered() -> None:
    """An acquire whose answer was lost is retried with the same owner and finds its own lease (no wait for expiry)."""
    kv = LostAckKV(MemoryKV(), lambda key: key == STATE_KEY)
    async with SessionStore(kv, lease_seconds=30) as store:
        async with store.turn("s") as session:
            session.replace(pair("one"))
        kv.lose = 1
        async with store.turn("s", timeout_seconds=2) as session:
            assert len(session.messages) == 2
            session.replace([*session.messages, *pair("two")])
        assert kv.lose == 0
        assert len(await store.read_messages("s") or []) == 4


async def test_message_updated_in_place_after_checkpoint_is_saved() -> None:
    """Pydantic AI fills in the request it is about to send after a checkpoint; the final save captures that."""
    async with SessionStore(MemoryKV()) as store:
        async with store.turn("s") as session:
            base = pair("a")
            request = ModelRequest(parts=[UserPromptPart("pending")])
            await session.checkpoint([*base, request])
            request.run_id = "run-42"  # updated in place, as the agent graph does
            session.replace([*base, request, ModelResponse(parts=[TextPart("done")])])
        saved = await store.read_messages("s")
        assert saved is not None and saved[2].run_id == "run-42"


async def test_replace_checks_what_follows_the_loaded_history() -> None:
    """The loaded messages at the head of a replacement are taken as checked; anything
    after them is still refused, named by its index, and nothing is saved."""
    async with SessionStore(MemoryKV()) as store:
        async with store.turn("s") as session:
            session.replace([m for i in range(40) for m in pair(str(i))])
        with pytest.raises(TypeError, match="item 81 is str"):
            async with store.turn("s") as session:
                session.replace([*session.messages, pair("x")[0], "not a message"])  # type: ignore[list-item]
        saved = await store.read_messages("s")
        assert saved is not None and len(saved) == 80


async def test_a_replacement_compared_before_a_checkpoint_is_compared_again_after() -> None:
    """The session's comparison of a replacement with the loaded history holds for that
    history only: after a checkpoint stored another one, the save compares again."""
    async with SessionStore(MemoryKV()) as store:
        first = [m for i in range(40) for m in pair(str(i))]
        async with store.turn("s") as session:
            session.replace(first)
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair("after")])  # saved on exit
            await session.checkpoint([m for i in range(40) for m in pair(f"other {i}")])
        saved = await store.read_messages("s")
        assert saved is not None and len(saved) == 82
        assert saved[:80] == first
        text = saved[80].parts[0]
        assert isinstance(text, UserPromptPart) and str(text.content).startswith("after ")


async def test_session_is_unusable_after_its_turn() -> None:
    """replace/checkpoint/mark_effects after the block raise RESOURCE_CLOSED instead of writing."""
    async with SessionStore(MemoryKV()) as store:
        async with store.turn("s") as session:
            pass
        with pytest.raises(ResourceClosedError):
            session.replace([])
        with pytest.raises(ResourceClosedError):
            await session.checkpoint([])
        with pytest.raises(ResourceClosedError):
            await session.mark_effects([("a", "b")])


async def test_concurrent_effect_marks_all_land() -> None:
    """Parallel tool calls marking effects at once are serialised: every mark is recorded."""
    async with SessionStore(MemoryKV()) as store:
        async with store.turn("s") as session:
            await asyncio.gather(*(session.mark_effects([("pay", f"c{i}")]) for i in range(10)))
            assert len(session.pending_effects) == 10
        info = await store.inspect("s")
        assert info is not None and {c.tool_call_id for c in info.pending_effects} == {
            f"c{i}" for i in range(10)
        }
