"""The waiters' queue of a session: tickets, their upkeep, and what an uncontended turn costs."""

from __future__ import annotations

from agent_stores.backends.memory import MemoryKV
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import SessionStore
from agent_stores.sessions.records import QUEUE_PREFIX
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
