"""Call deadlines (``within_deadline``): one timer per event loop bounds every call."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from agent_stores import BackendUnavailableError, open_kv
from agent_stores.backend import Deadline, TimeBound, within_seconds
from agent_stores.kv.base import within_deadline


async def test_a_hanging_call_ends_at_its_deadline_and_others_at_theirs() -> None:
    """Concurrent calls with different deadlines: the hanging ones are reported
    unavailable (a typed error, never a bare timeout) close to their own deadline; the
    quick ones return; a call made after all of them still gets its deadline."""
    short = open_kv("memory://deadline-a?deadline=0.2")
    long = open_kv("memory://deadline-b?deadline=0.6")
    loop = asyncio.get_running_loop()

    async def timed(kv: object, seconds: float) -> tuple[str, float]:
        start = loop.time()
        try:
            await within_deadline(kv, asyncio.sleep(seconds))  # type: ignore[arg-type]
        except BackendUnavailableError:
            return "unavailable", loop.time() - start
        return "ok", loop.time() - start

    results = await asyncio.gather(
        timed(long, 5), timed(short, 5), timed(short, 0.01), timed(long, 0.05)
    )
    (a, ta), (b, tb), (c, _), (d, _) = results
    assert (a, b, c, d) == ("unavailable", "unavailable", "ok", "ok")
    # Never before the deadline; long before the 5 s call would end (generous: a loaded
    # machine may run the timer late, but not by seconds).
    assert 0.2 <= tb < 3 and 0.6 <= ta < 3
    later, elapsed = await timed(short, 5)
    assert later == "unavailable" and 0.2 <= elapsed < 3
    await short.aclose()
    await long.aclose()


async def test_a_cancellation_from_outside_is_not_a_deadline() -> None:
    kv = open_kv("memory://deadline-c?deadline=5")
    task = asyncio.create_task(within_deadline(kv, asyncio.sleep(10)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await kv.aclose()


async def test_a_bound_inside_a_deadline_ends_first_as_a_timeout() -> None:
    """``within_seconds`` (a backend's per-attempt bound) nested in a store call's
    deadline: the inner bound fires first as ``TimeoutError`` and the outer call goes on
    (it may retry); past the outer deadline the call is unavailable; a quick call passes;
    a cancellation from outside stays one."""
    kv = open_kv("memory://deadline-e?deadline=0.6")
    loop = asyncio.get_running_loop()
    attempts: list[float] = []

    async def retrying() -> str:
        while True:
            start = loop.time()
            try:
                return await within_seconds(0.15, asyncio.sleep(5))
            except TimeoutError:
                attempts.append(loop.time() - start)

    with pytest.raises(BackendUnavailableError):
        await within_deadline(kv, retrying())  # type: ignore[arg-type]
    assert len(attempts) >= 2 and all(0.15 <= t < 1.5 for t in attempts)
    assert await within_seconds(1.0, asyncio.sleep(0.01, "done")) == "done"
    assert await within_seconds(None, asyncio.sleep(0.01, "unbounded")) == "unbounded"
    task = asyncio.create_task(within_seconds(5.0, asyncio.sleep(10)))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await kv.aclose()


async def test_the_with_forms_bound_as_the_calls_do() -> None:
    """``with Deadline(kv)`` and ``with TimeBound(s)``, the forms without a coroutine of
    their own: the inner bound raises ``TimeoutError`` from its block, the outer one
    ``BackendUnavailableError``; a nested deadline of the same store adds nothing (the
    outer one reports); a cancellation from outside stays one; and after each block the
    task is neither cancelled nor bounded any more."""
    kv = open_kv("memory://deadline-f?deadline=0.4")
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError), TimeBound(0.1):
        await asyncio.sleep(5)
    assert 0.1 <= loop.time() - start < 2
    start = loop.time()
    with (
        pytest.raises(BackendUnavailableError, match=r"did not answer within 0\.4 s"),
        Deadline(kv),
        Deadline(kv),
    ):
        await asyncio.sleep(5)
    assert 0.4 <= loop.time() - start < 2
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    with TimeBound(1.0):
        await asyncio.sleep(0.5)  # past the deadline's 0.4 s, had its slot stayed armed
    with TimeBound(None):
        await asyncio.sleep(0.01)

    async def hangs() -> None:
        with Deadline(kv):
            await asyncio.sleep(10)

    hanging = asyncio.create_task(hangs())
    await asyncio.sleep(0.01)
    hanging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await hanging
    await kv.aclose()


def test_the_watch_keeps_no_event_loop_alive() -> None:
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one() -> None:
        kv = open_kv("memory://deadline-d")
        await kv.get("s", "k")
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await kv.aclose()

    for _ in range(3):
        asyncio.run(one())
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]
