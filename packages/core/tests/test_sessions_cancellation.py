"""How turns interact with task cancellation, lease loss and closing."""

from __future__ import annotations

import asyncio

import pytest
from agent_stores import ConfigError, ResourceClosedError
from agent_stores.backends.memory import MemoryKV
from agent_stores.sessions import LeaseLostError, SessionStore
from pydantic_ai.messages import ModelRequest, UserPromptPart


def shared() -> tuple[MemoryKV, MemoryKV]:
    """Two clients of one in-process space; the second sees time 60 s ahead (leases look expired)."""
    name = f"cancel-{id(object())}"
    a, b = MemoryKV(name), MemoryKV(name)
    base = b.clock
    b.clock = lambda: base() + 60
    return a, b


async def test_outer_cancellation_propagates_and_releases() -> None:
    """Cancelling the task running a turn raises CancelledError (not a session error) and frees the session."""
    a, b = shared()
    b.clock = a.clock
    async with (
        SessionStore(a, lease_seconds=30) as store,
        SessionStore(b, lease_seconds=30) as other,
    ):
        entered = asyncio.Event()

        async def run() -> None:
            async with store.turn("s") as session:
                session.replace([ModelRequest(parts=[UserPromptPart("never")])])
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(run())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with other.turn("s", timeout_seconds=2) as session:
            assert session.messages == []


async def test_lease_loss_wins_even_if_the_block_swallows_the_cancellation() -> None:
    """A block that catches the cancellation caused by a lost lease still ends with SESSION_LEASE_LOST."""
    a, b = shared()
    async with (
        SessionStore(a, lease_seconds=1.2) as owner,
        SessionStore(b, lease_seconds=1.2) as thief,
    ):
        swallowed = False
        with pytest.raises(LeaseLostError):  # noqa: PT012
            async with owner.turn("s") as session:
                async with thief.turn("s", timeout_seconds=2) as stolen:
                    stolen.replace([ModelRequest(parts=[UserPromptPart("thief")])])
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    swallowed = True
                session.replace([ModelRequest(parts=[UserPromptPart("owner")])])
        assert swallowed
        saved = await thief.read_messages("s")
        assert saved is not None and saved[0].parts[0].content == "thief"  # type: ignore[union-attr]
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_outer_timeout_is_not_reported_as_lease_loss() -> None:
    """asyncio.timeout around a turn raises TimeoutError as usual."""
    async with SessionStore(MemoryKV(), lease_seconds=30) as store:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2), store.turn("s"):
                await asyncio.sleep(3600)
        async with store.turn("s", timeout_seconds=1) as session:
            assert session.messages == []


async def test_aclose_from_inside_a_turn_does_not_deadlock() -> None:
    """Closing the store from the task that holds a turn returns; that turn's save then fails cleanly."""
    store = SessionStore(MemoryKV(), owns_kv=True)
    async with asyncio.timeout(10):
        with pytest.raises(ResourceClosedError):  # noqa: PT012
            async with store.turn("s") as session:
                session.replace([ModelRequest(parts=[UserPromptPart("x")])])
                await store.aclose(timeout_seconds=0.1)
    with pytest.raises(ResourceClosedError):
        store.turn("s")


def test_options_are_validated() -> None:
    """Bad options are refused with CONFIG_INVALID before anything runs."""
    kv = MemoryKV()
    for options in (
        {"lease_seconds": -1},
        {"poll_max_seconds": 0},
        {"scope_prefix": ""},
        {"close_timeout_seconds": -1},
    ):
        with pytest.raises(ConfigError):
            SessionStore(kv, **options)
    with pytest.raises(ConfigError):
        SessionStore("memory://")  # type: ignore[arg-type]
    SessionStore(kv, ttl_seconds=None)
