"""The native session port on Firestore (agent_stores_firestore.sessions): requests per
turn counted at the gRPC interceptor, on the emulator."""

from __future__ import annotations

import asyncio

import pytest
from agent_stores import connect
from agent_stores.backend import WAITER_KEY, Check, Create, Replace
from agent_stores.errors import ConflictError, InvalidIdError, ValueTooLargeError
from agent_stores.sessions import SessionBusyError
from agent_stores_contract.request_counts import Meter, pair
from agent_stores_firestore.kv import FirestoreKV
from agent_stores_firestore.sessions import MAX_SKIPPED_ACQUIRES, FirestoreSessionPort

pytestmark = pytest.mark.asyncio


async def _turns(meter: Meter, order: str) -> list[int]:
    """Requests of each turn of session ``s``, by two stores: ``order`` names the store of
    each turn (``a`` or ``b``). The inline tail is large enough that no turn spills a
    chunk (a spill's later cleanup would add requests of its own)."""
    stores = {
        name: connect(await meter.client()).sessions(
            owns_kv=True, scope_prefix="t:", tail_bytes=1 << 19
        )
        for name in "ab"
    }
    counts: list[int] = []
    try:
        for i, name in enumerate(order):

            async def turn(name: str = name, i: int = i) -> None:
                async with stores[name].turn("s") as session:
                    session.replace([*session.messages, *pair(i)])

            counts.append(sum((await meter.count(turn)).values()))
    finally:
        for store in stores.values():
            await store.aclose()
    return counts


async def test_the_store_takes_the_native_port(firestore_url: str) -> None:
    sessions = connect(firestore_url).sessions(owns_kv=True)
    try:
        assert isinstance(sessions.storage.port, FirestoreSessionPort)
    finally:
        await sessions.aclose()


async def test_a_warm_turn_is_two_requests(firestore_url: str) -> None:
    # The first turn creates the session (generic: read, create, save).
    assert await _turns(Meter(firestore_url), "aaaa") == [3, 2, 2, 2]


async def test_a_turn_after_another_client_costs_one_request_more_once(
    firestore_url: str,
) -> None:
    # a's warm commit fails after b's turn (one request more, nothing written), its next
    # acquire goes straight to the generic path (three), then the warm commit again.
    # b's turns: its first is generic (nothing known), its second follows a's turn.
    counts = await _turns(Meter(firestore_url), "aabaaa")
    assert counts == [3, 2, 3, 4, 3, 2]


async def test_alternating_clients_back_off_the_warm_commit(firestore_url: str) -> None:
    counts = await _turns(Meter(firestore_url), "ab" * 56)
    # Every turn follows the other client's: 3 requests by the generic path, 4 with a
    # failed warm commit first, 5 when the commit failed before too (a read for an
    # expired hint to delete: there is none). Each store's first turn knows nothing
    # (generic); its warm commits fail at its 2nd turn, then after runs of 1, 2, 4, 8, 16
    # and again 16 acquires sent straight to the generic path.
    for store, mine in (("a", counts[0::2]), ("b", counts[1::2])):
        failed = [i + 1 for i, n in enumerate(mine) if n > 3]
        assert sorted(set(mine)) == [3, 4, 5], (store, mine)
        assert failed == [2, 4, 7, 12, 21, 38, 55], (store, mine)
        assert [mine[i - 1] for i in failed] == [4, 5, 5, 5, 5, 5, 5], (store, mine)
    assert MAX_SKIPPED_ACQUIRES == 16


async def test_an_expired_hint_of_a_dead_waiter_is_deleted(firestore_url: str) -> None:
    """A waiter that died leaves its hint; expired, it still fails the warm commit's "no
    hint" precondition. The second failed commit in a row deletes it, and the turns are
    warm again."""
    meter = Meter(firestore_url)
    holder = connect(await meter.client()).sessions(
        owns_kv=True, scope_prefix="d:", tail_bytes=1 << 19
    )  # no chunk spilled (see _turns)
    kv = holder.kv
    assert isinstance(kv, FirestoreKV)
    try:
        async with holder.turn("s") as session:
            session.replace(pair(0))
        scope = holder.storage.scope_for("s")
        await kv.create(scope, WAITER_KEY, b"a-store-that-died", ttl=0.2)
        await asyncio.sleep(0.3)
        counts: list[int] = []
        for i in range(1, 7):

            async def turn(i: int = i) -> None:
                async with holder.turn("s") as session:
                    session.replace([*session.messages, *pair(i)])

            counts.append(sum((await meter.count(turn)).values()))
        # a failed commit and the generic path; the generic path (backoff 1); a failed
        # commit, the hint read and deleted, the generic path; the generic path twice
        # (backoff 2); warm.
        assert counts == [4, 3, 6, 3, 3, 2]
        assert await kv.commit_as_expected(scope, [Check(WAITER_KEY, None)]) == [None]
    finally:
        await holder.aclose()


async def test_delete_expired_leaves_a_live_document(kv: FirestoreKV) -> None:
    await kv.create("x", "live", b"v", ttl=30)
    await kv.create("x", "gone", b"v", ttl=0.1)
    await asyncio.sleep(0.2)
    assert not await kv.delete_expired("x", "live")
    assert not await kv.delete_expired("x", "absent")
    assert await kv.delete_expired("x", "gone")
    assert (await kv.get("x", "live")) is not None
    await kv.commit_as_expected("x", [Check("gone", None)])


async def test_a_waiting_client_fails_the_warm_commit(kv: FirestoreKV) -> None:
    sessions = connect(kv).sessions(scope_prefix="w:")
    try:
        async with sessions.turn("s") as session:
            session.replace(pair(0))
        scope = sessions.storage.scope_for("s")
        await kv.create(scope, WAITER_KEY, b"another-store", ttl=30)
        # The hint is live: the warm commit fails and the generic path sees the waiter;
        # this store released last, so it lets the waiter have the session first.
        async with sessions.turn("s", timeout_seconds=5) as session:
            assert len(session.messages) == 2
    finally:
        await sessions.aclose()


async def test_commit_as_expected_fails_without_reading(kv: FirestoreKV) -> None:
    meter_version = await kv.create("x", "k", b"1")
    await kv.replace("x", "k", b"2", expected_version=meter_version)
    with pytest.raises(ConflictError):
        await kv.commit_as_expected("x", [Replace("k", b"3", meter_version)])
    with pytest.raises(ConflictError):
        await kv.commit_as_expected("x", [Check("k", None), Create("other", b"v")])
    assert (await kv.get("x", "other")) is None
    stored = await kv.get("x", "k")
    assert stored is not None and stored.value == b"2"
    versions = await kv.commit_as_expected(
        "x", [Check("absent", None), Replace("k", b"4", stored.version)]
    )
    after = await kv.get("x", "k")
    assert after is not None and after.value == b"4" and after.version == versions[1]


async def test_commit_as_expected_applies_the_checks_of_commit(kv: FirestoreKV) -> None:
    """Everything KVStore.commit refuses before sending, commit_as_expected refuses too."""
    with pytest.raises(ValueError, match="appears twice"):
        await kv.commit_as_expected("x", [Create("k", b"1"), Check("k", None)])
    with pytest.raises(InvalidIdError):
        await kv.commit_as_expected("x", [Create("", b"1")])
    with pytest.raises(ValueTooLargeError):
        await kv.commit_as_expected("x", [Create("k", b"v" * (kv.limits.max_value_bytes + 1))])
    assert await kv.commit_as_expected("x", []) == []
    assert (await kv.get("x", "k")) is None


async def test_a_hint_withdrawn_after_it_expired_is_deleted(firestore_url: str) -> None:
    """A waiter gives up about when its hint expires; the expired hint document, still
    stored, would fail the warm commit's "no hint" precondition, so the withdrawal
    deletes the very write it made, expired or not."""
    sessions = connect(firestore_url).sessions(owns_kv=True, scope_prefix="e:")
    kv = sessions.kv
    assert isinstance(kv, FirestoreKV)
    try:
        assert await sessions.storage.note_waiting("s")
        scope = sessions.storage.scope_for("s")
        await asyncio.sleep(sessions.storage.hint_seconds + 0.1)
        assert await kv.get(scope, WAITER_KEY) is None  # expired
        with pytest.raises(ConflictError):  # ...but still stored
            await kv.commit_as_expected(scope, [Check(WAITER_KEY, None)])
        sessions.storage.withdraw_hint("s")
        await sessions.storage.drain()
        await kv.commit_as_expected(scope, [Check(WAITER_KEY, None)])
    finally:
        await sessions.aclose()


async def test_a_waiter_that_gave_up_leaves_the_next_turn_warm(firestore_url: str) -> None:
    meter = Meter(firestore_url)
    holder = connect(await meter.client()).sessions(owns_kv=True, scope_prefix="g:")
    waiter = connect(await meter.client()).sessions(owns_kv=True, scope_prefix="g:")
    try:
        async with holder.turn("s") as session:
            session.replace(pair(0))
        async with holder.turn("s") as session:
            with pytest.raises(SessionBusyError):
                async with waiter.turn("s", timeout_seconds=0.5):
                    pass
            await waiter.storage.drain()  # its hint withdrawn
            session.replace([*session.messages, *pair(1)])

        async def turn() -> None:
            async with holder.turn("s") as session:
                session.replace([*session.messages, *pair(2)])

        assert await meter.count(turn) == {"Commit": 2}
    finally:
        await holder.aclose()
        await waiter.aclose()
