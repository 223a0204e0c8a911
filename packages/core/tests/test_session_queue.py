"""The waiters' queue of a session: tickets, their upkeep, and what an uncontended turn costs."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest
from agent_stores.backends.memory import MemoryKV
from agent_stores.kv.base import Entry, Operation, ScanItem
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import SessionBusyError, SessionStore
from agent_stores.sessions.records import QUEUE_PREFIX, WAITER_KEY
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart


def pair(tag: str) -> list[ModelRequest | ModelResponse]:
    return [ModelRequest(parts=[UserPromptPart(tag)]), ModelResponse(parts=[TextPart(tag)])]


async def test_tickets_list_in_arrival_order_and_leave() -> None:
    kv = MemoryKV()
    async with SessionStore(kv) as first, SessionStore(kv) as second:
        one = await first.storage.enqueue("s")
        two = await second.storage.enqueue("s")
        assert one.key < two.key and one.key.startswith(QUEUE_PREFIX)
        assert await first.waiting("s") == [first.store_id, second.store_id]
        assert await first.storage.queue_front("s") == [one.key, two.key]
        first.storage.leave_queue("s", one)
        await first.storage.drain()
        assert await first.waiting("s") == [second.store_id]


async def test_kept_ticket_survives_its_ttl_and_a_lost_reply() -> None:
    """Upkeep renews a ticket past half its life; a renewal whose reply was lost is adopted."""
    now = [1_000_000.0]
    kv = MemoryKV()
    kv.clock = lambda: now[0]
    async with SessionStore(kv) as store:
        storage = store.storage
        ticket = await storage.enqueue("s")
        assert await storage.keep_ticket("s", ticket) is ticket  # young: nothing written
        now[0] += storage.ticket_seconds * 0.75
        kept = await storage.keep_ticket("s", ticket)
        assert kept.version != ticket.version and kept.expires_at > ticket.expires_at
        # The renewal happened but its reply was lost: the ticket still names the old version.
        now[0] += storage.ticket_seconds * 0.75
        adopted = await storage.keep_ticket("s", ticket)
        assert adopted.key == ticket.key
        now[0] += storage.ticket_seconds * 0.75
        assert await storage.queue_front("s") == [ticket.key]  # still alive, same place
        # Lapsed altogether (a stalled waiter): written again under the same key.
        now[0] += storage.ticket_seconds * 2
        assert await storage.queue_front("s") == []
        again = await storage.keep_ticket("s", adopted)
        assert again.key == ticket.key and await storage.queue_front("s") == [ticket.key]


async def test_uncontended_turns_never_touch_the_queue() -> None:
    counting = CountingKV(MemoryKV())
    async with SessionStore(counting) as store:
        for i in range(5):
            async with store.turn("s") as session:
                session.replace([*session.messages, *pair(str(i))])
        assert counting.calls["scan"] == 0


class SlowKV(CountingKV):
    """Every primitive takes ``delay`` seconds more, like a loaded remote backend."""

    def __init__(self, inner: MemoryKV, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay

    async def _get(self, scope: str, key: str) -> Entry | None:
        await asyncio.sleep(self.delay)
        return await super()._get(scope, key)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        await asyncio.sleep(self.delay)
        return await super()._get_many(scope, keys)

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        await asyncio.sleep(self.delay)
        return await super()._create(scope, key, value, expires_at, now)

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        await asyncio.sleep(self.delay)
        return await super()._replace(scope, key, value, expected_version, expires_at, now)

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        await asyncio.sleep(self.delay)
        return await super()._delete(scope, key, expected_version, now)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        await asyncio.sleep(self.delay)
        return await super()._scan(scope, prefix, start_after, limit, values, now)

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        await asyncio.sleep(self.delay)
        return await super()._commit(scope, ops, now)


async def test_hand_over_windows_grow_with_the_measured_round_trip() -> None:
    """On a slow backend the courtesy, hint and ticket lifetimes grow by a few round trips."""
    async with SessionStore(MemoryKV()) as fast, SessionStore(SlowKV(MemoryKV(), 0.05)) as slow:
        for store in (fast, slow):
            async with store.turn("s") as session:
                session.replace(pair("x"))
        assert fast.storage.courtesy_seconds < fast.storage.handover_courtesy_seconds + 0.01
        assert slow.storage.courtesy_seconds >= slow.storage.handover_courtesy_seconds + 0.2
        assert slow.storage.hint_seconds >= slow.storage.waiter_hint_seconds + 0.4
        assert slow.storage.ticket_seconds >= 4 * slow.storage.hint_seconds


async def test_a_waiter_on_a_slow_backend_is_not_starved_by_a_looping_holder() -> None:
    """Calls of 150 ms make a waiter's poll outlast the default windows: it is served anyway.

    With fixed windows the looping store kept the session for all its 6 turns.
    """
    kv = SlowKV(MemoryKV(), 0.15)
    order: list[str] = []
    async with SessionStore(kv) as looping, SessionStore(kv) as waiting:
        started = asyncio.Event()

        async def loop() -> None:
            for i in range(6):
                async with looping.turn("s", timeout_seconds=60) as session:
                    session.replace([*session.messages, *pair(f"a{i}")])
                    order.append("a")
                    started.set()

        async def wait() -> None:
            await started.wait()
            async with waiting.turn("s", timeout_seconds=60) as session:
                session.replace([*session.messages, *pair("b")])
                order.append("b")

        await asyncio.gather(loop(), wait())
    # The looping store releases and asks again at once; the waiter gets the next turn or
    # the one after (it may arrive just after a release), never only once the loop ends.
    assert order.index("b") <= 2, order


async def _hint(kv: MemoryKV, store: SessionStore, session_id: str) -> bytes | None:
    entry = await kv.get(store.storage.scope_for(session_id), WAITER_KEY)
    return None if entry is None else entry.value


async def test_a_waiter_that_gives_up_withdraws_its_hint() -> None:
    kv = MemoryKV()
    async with (
        SessionStore(kv) as holder,
        SessionStore(kv) as waiter,
        holder.turn("s") as session,
    ):
        session.replace(pair("a"))
        with pytest.raises(SessionBusyError):
            async with waiter.turn("s", timeout_seconds=0.3):
                pass
        await waiter.storage.drain()
        assert await _hint(kv, holder, "s") is None
        # Cancelled while waiting: the same.
        task = asyncio.ensure_future(waiter.turn("s", timeout_seconds=30).__aenter__())
        for _ in range(200):
            if await _hint(kv, holder, "s") == waiter.store_id.encode():
                break
            await asyncio.sleep(0.01)
        assert await _hint(kv, holder, "s") == waiter.store_id.encode()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await waiter.storage.drain()
        assert await _hint(kv, holder, "s") is None


async def test_a_withdrawn_hint_leaves_another_stores_hint_alone() -> None:
    kv = MemoryKV()
    async with SessionStore(kv) as one, SessionStore(kv) as two:
        assert await one.storage.note_waiting("s")
        assert await two.storage.note_waiting("s")  # takes the hint over
        one.storage.withdraw_hint("s")
        await one.storage.drain()
        assert await _hint(kv, one, "s") == two.store_id.encode()
        two.storage.withdraw_hint("s")
        await two.storage.drain()
        assert await _hint(kv, one, "s") is None
