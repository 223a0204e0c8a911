# The exception under test comes out of the ``async with store.turn()`` block itself.
# ruff: noqa: PT012
"""The session catalog contract: owners, titles, tags, and each owner's listing.

Part of :class:`~agent_stores_contract.sessions.SessionContract` (every backend that runs
the session contract runs these): the catalog fields are saved in the turn's own write
and survive every later turn (a native acquire copies them byte for byte), one owner's
listing is most recent first, pages with opaque cursors, reads only that owner's index
(two KV calls for a page) and never shows a session twice, and a stale or damaged index
entry is skipped, never shown.

Owners are namespaced by the test's ``ns`` so runs never see each other's sessions.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from agent_stores import connect
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import (
    InvalidSessionError,
    KVSessionPort,
    OwnerErasingError,
    SessionError,
    SessionStore,
)
from agent_stores.sessions.catalog import ERASING_KEY, pointer_key, recent_key
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

from .base import REAL_TIME_LIMIT_SECONDS, ContractBase, KVFactory, require_capability

SessionsFactory = Callable[..., Awaitable[SessionStore]]


def exchange(question: str, answer: str) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(content=question)]),
        ModelResponse(parts=[TextPart(content=answer)]),
    ]


def tick(store: SessionStore, step: float) -> Callable[[], None]:
    """Make ``store``'s clock advance ``step`` seconds per call of the returned function."""
    base = store.kv.clock
    offset = itertools.count(1)
    state = {"now": 0.0}

    def advance() -> None:
        state["now"] = next(offset) * step

    store.kv.clock = lambda: base() + state["now"]
    return advance


async def raw_entries(store: SessionStore, scope: str) -> dict[str, tuple[bytes, str]]:
    """Every live entry of a KV scope: key -> (value, version)."""
    found: dict[str, tuple[bytes, str]] = {}
    async for item in store.kv.iter_scan(scope, page_size=500):
        assert item.entry is not None
        found[item.key] = (item.entry.value, item.entry.version)
    return found


async def populate_owners(store: SessionStore, ns: str) -> tuple[list[str], list[str]]:
    """Four sessions of ``<ns>-alice`` (history in chunks, one latched) and, untouched by
    an erase of alice, two of ``<ns>-bob`` and one without an owner. Returns the alice
    session ids and every other session id."""
    alice = [f"{ns}:alice-{i}" for i in range(4)]
    others = [f"{ns}:bob-0", f"{ns}:bob-1", f"{ns}:nobody"]
    for sid in [*alice, *others]:
        owner = f"{ns}-alice" if sid in alice else f"{ns}-bob" if "bob" in sid else None
        for turn in range(3):
            await talk(store, sid, f"{turn} " + "padding " * 60, owner=owner)
    async with store.turn(alice[0]) as session:
        await session.mark_effects([("send_money", "call-1")])  # latched
    return alice, others


async def talk(store: SessionStore, sid: str, text: str, **catalog: Any) -> None:
    async with store.turn(sid, **catalog) as session:
        session.replace([*session.messages, *exchange(f"q {text}", f"a {text}")])


async def killed_after_drops(drops: int, worker: str, *args: str) -> None:
    """Run ``session_workers <worker> *args <drops>``, wait until it has dropped ``drops``
    scopes and stopped, then SIGKILL it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_stores_contract.session_workers",
        worker,
        *args,
        str(drops),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), REAL_TIME_LIMIT_SECONDS)
        assert json.loads(line or b"null") == {"dropped": drops}, await proc.stderr.read()  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


class CatalogBehaviours(ContractBase):
    """Session catalog behaviours; a base of the session contract (uses its fixtures)."""

    async def test_catalog_fields_saved_with_the_turn_and_kept(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Owner, title, tags and metadata given to turn() are stored with it; later turns
        without them, from another client, keep them; inspect and the listing show them."""
        writer = await sessions_factory()
        reader = await sessions_factory()
        owner, sid = f"{ns}-alice", f"{ns}:chat-1"
        await talk(
            writer, sid, "hello", owner=owner, title="Trip", tags=["travel"], metadata={"x": 1}
        )
        for i in range(3):
            await talk(reader if i % 2 else writer, sid, f"more {i}")
        info = await reader.inspect(sid)
        assert info is not None
        assert (info.owner, info.title, info.tags) == (owner, "Trip", ("travel",))
        page = await reader.list_owner_sessions(owner)
        assert [s.session_id for s in page.sessions] == [sid] and page.cursor is None
        summary = page.sessions[0]
        assert (summary.owner, summary.title, summary.tags) == (owner, "Trip", ("travel",))
        assert summary.metadata == {"x": 1}
        assert summary.message_count == 8
        assert summary.preview == "a more 2"
        assert summary.created_at == info.created_at

    async def test_catalog_costs_no_extra_write_without_an_owner(
        self, kv_factory: KVFactory, ns: str
    ) -> None:
        """Title and tags ride in the turn's own state write: the same KV calls as a plain
        turn. With an owner, a turn that changes what the listing shows adds exactly one
        call (the owner's index commit; four on a backend without an atomic commit: a read
        of the erase fences, new entry, pointer, old entry); a turn that changes nothing
        listed adds none."""
        counting = CountingKV(kv_factory(), native_ports=self.store_path == "native")
        await counting.setup()
        options: dict[str, Any] = (
            {"port": KVSessionPort(counting)} if self.store_path == "generic" else {}
        )
        async with connect(counting).sessions(owns_kv=True, **options) as store:

            async def calls(sid: str, **catalog: Any) -> int:
                await talk(store, sid, "warm-up", **catalog)
                counting.reset_counts()
                await talk(store, sid, "counted", **catalog)
                return sum(counting.calls.values())

            plain = await calls(f"{ns}:plain")
            titled = await calls(f"{ns}:titled", title="T", tags=["a"])
            owned = await calls(f"{ns}:owned", owner=f"{ns}-o", title="T")
            await talk(store, f"{ns}:owned", "x")
            counting.reset_counts()
            async with store.turn(f"{ns}:owned"):
                pass  # nothing saved, nothing listed changed
            released = sum(counting.calls.values())
            counting.reset_counts()
            async with store.turn(f"{ns}:plain"):
                pass
            plain_released = sum(counting.calls.values())
        assert titled == plain, counting.calls
        assert owned == plain + (1 if counting.capabilities.commit else 4), counting.calls
        assert released == plain_released

    async def test_owner_listing_most_recent_first_and_paged(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """25 sessions of one owner among another owner's: pages of 10 by cursor list each
        of the owner's sessions once, by last activity, newest first; a turn on an old
        session moves it to the front; the other owner's are never listed."""
        store = await sessions_factory()
        advance = tick(store, 1.0)
        alice, bob = f"{ns}-alice", f"{ns}-bob"
        for i in range(25):
            advance()
            await talk(store, f"{ns}:a{i:02d}", "hi", owner=alice)
            advance()
            await talk(store, f"{ns}:b{i:02d}", "hi", owner=bob)
        advance()
        await talk(store, f"{ns}:a03", "again")
        expected = [f"{ns}:a03"] + [f"{ns}:a{i:02d}" for i in range(24, -1, -1) if i != 3]
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            page = await store.list_owner_sessions(alice, limit=10, cursor=cursor)
            pages += 1
            seen.extend(s.session_id for s in page.sessions)
            assert all(s.owner == alice for s in page.sessions)
            if page.cursor is None:
                break
            cursor = page.cursor
        assert seen == expected
        assert pages == 3
        times = [s.last_activity_at for s in (await store.list_owner_sessions(alice)).sessions]
        assert times == sorted(times, reverse=True)

    async def test_a_page_is_two_reads_of_the_owner_index(
        self, kv_factory: KVFactory, ns: str
    ) -> None:
        """With 15 sessions of the owner and 30 of others, a page of 10 costs two KV calls
        (one range read, one batched read), and the next page two more."""
        counting = CountingKV(kv_factory(), native_ports=self.store_path == "native")
        await counting.setup()
        async with connect(counting).sessions(owns_kv=True) as store:
            for i in range(45):
                await talk(store, f"{ns}:s{i}", "hi", owner=f"{ns}-o{i % 3}")
            counting.reset_counts()
            first = await store.list_owner_sessions(f"{ns}-o0", limit=10)
            first_calls = dict(counting.calls)
            counting.reset_counts()
            assert first.cursor is not None
            second = await store.list_owner_sessions(f"{ns}-o0", limit=10, cursor=first.cursor)
            second_calls = dict(counting.calls)
        assert len(first.sessions) == 10 and len(second.sessions) == 5
        assert second.cursor is None
        assert sum(first_calls.values()) == 2, first_calls
        assert sum(second_calls.values()) == 2, second_calls
        ids = {s.session_id for s in [*first.sessions, *second.sessions]}
        assert ids == {f"{ns}:s{i}" for i in range(0, 45, 3)}

    async def test_tags_filter_the_listing(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """tags=[...] lists only sessions carrying all of them, paging past the others."""
        store = await sessions_factory()
        owner = f"{ns}-t"
        for i in range(12):
            tags = ["work", "urgent"] if i % 4 == 0 else ["work"] if i % 2 == 0 else ["home"]
            await talk(store, f"{ns}:t{i:02d}", "hi", owner=owner, tags=tags)
        found: list[str] = []
        cursor: str | None = None
        while True:
            page = await store.list_owner_sessions(
                owner, limit=2, cursor=cursor, tags=["work", "urgent"]
            )
            found.extend(s.session_id for s in page.sessions)
            if page.cursor is None:
                break
            cursor = page.cursor
        assert sorted(found) == [f"{ns}:t00", f"{ns}:t04", f"{ns}:t08"]
        home = await store.list_owner_sessions(owner, tags=["home"])
        assert len(home.sessions) == 6

    async def test_owner_change_title_change_and_reset(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Changing the owner moves the session to the new owner's listing; set_catalog
        changes the title outside a turn; reset takes the session out of the listing;
        set_catalog on an absent session creates nothing."""
        store = await sessions_factory()
        alice, bob, sid = f"{ns}-alice", f"{ns}-bob", f"{ns}:moving"
        await talk(store, sid, "hi", owner=alice, title="First")
        assert [s.session_id for s in (await store.list_owner_sessions(alice)).sessions] == [sid]
        assert await store.set_catalog(sid, owner=bob, title="Second") is True
        await store.storage.drain()
        assert (await store.list_owner_sessions(alice)).sessions == []
        listed = (await store.list_owner_sessions(bob)).sessions
        assert [(s.session_id, s.title, s.message_count) for s in listed] == [(sid, "Second", 2)]
        assert await store.reset(sid) is True
        assert (await store.list_owner_sessions(bob)).sessions == []
        assert await store.set_catalog(f"{ns}:absent", title="x") is False
        assert await store.inspect(f"{ns}:absent") is None

    async def test_title_set_inside_the_turn(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Session.set_catalog() inside the block is saved on a clean exit (merged with what
        turn() was given) and discarded when the block raises."""
        store = await sessions_factory()
        owner, sid = f"{ns}-o", f"{ns}:named-later"
        async with store.turn(sid, owner=owner, metadata={"a": 1}) as session:
            session.replace(exchange("plan a trip", "where to?"))
            session.set_catalog(title="Trip planning", metadata={"b": 2})
        with pytest.raises(RuntimeError):
            async with store.turn(sid) as session:
                session.set_catalog(title="Lost")
                raise RuntimeError("the block fails")
        (summary,) = (await store.list_owner_sessions(owner)).sessions
        assert summary.title == "Trip planning"
        assert summary.metadata == {"a": 1, "b": 2}
        assert summary.preview == "where to?"

    async def test_stale_and_damaged_index_entries_are_never_listed(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """An ``r/`` entry the session's pointer does not name (an index write whose turn
        never saved) is skipped and deleted; an entry that does not decode is skipped; the
        page still fills from the entries after them."""
        store = await sessions_factory()
        owner = f"{ns}-o"
        for i in range(4):
            await talk(store, f"{ns}:s{i}", "hi", owner=owner)
        scope = store.storage.catalog.scope_for(owner)
        stale = recent_key(store.kv.clock() + 100, f"{ns}:s1")
        await store.kv.create(scope, stale, b'{"id": "stale"}')
        damaged_sid = f"{ns}:damaged"
        damaged = recent_key(store.kv.clock() + 50, damaged_sid)
        await store.kv.create(scope, damaged, b"not json")
        await store.kv.create(
            scope, pointer_key(damaged_sid), b'{"k": "' + damaged.encode() + b'"}'
        )
        page = await store.list_owner_sessions(owner, limit=4)
        assert sorted(s.session_id for s in page.sessions) == [f"{ns}:s{i}" for i in range(4)]
        await store.storage.drain()
        assert await store.kv.get(scope, stale) is None

    async def test_concurrent_turns_leave_one_entry_per_session(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Three clients run 60 turns over 6 sessions of one owner at once: the listing then
        names each session once, with its final message count (120 messages in all); a walk by cursor during
        the writes never returns a session twice."""
        stores = [await sessions_factory() for _ in range(3)]
        owner = f"{ns}-busy"
        sids = [f"{ns}:c{i}" for i in range(6)]
        walks: list[list[str]] = []

        async def writer(k: int) -> None:
            for j in range(20):
                await talk(stores[k], sids[(k + j) % 6], f"{k}-{j}", owner=owner)

        async def walker() -> None:
            for _ in range(5):
                seen: list[str] = []
                cursor: str | None = None
                while True:
                    page = await stores[0].list_owner_sessions(owner, limit=2, cursor=cursor)
                    seen.extend(s.session_id for s in page.sessions)
                    if page.cursor is None:
                        break
                    cursor = page.cursor
                walks.append(seen)
                await asyncio.sleep(0)

        await asyncio.gather(*(writer(k) for k in range(3)), walker())
        for seen in walks:
            assert len(seen) == len(set(seen)), seen
        listed = (await stores[1].list_owner_sessions(owner, limit=50)).sessions
        assert sorted(s.session_id for s in listed) == sorted(sids)
        counts = []
        for summary in listed:
            info = await stores[2].inspect(summary.session_id)
            assert info is not None and summary.message_count == info.message_count
            counts.append(info.message_count)
        assert sum(counts) == 2 * 60

    async def test_bad_catalog_input_is_refused_and_loses_nothing(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """An empty owner, a NUL in it, a title over 200 characters, tags given as one string,
        metadata that is not JSON, a foreign cursor, order other than recent: typed errors
        before anything is written; the session is unchanged."""
        store = await sessions_factory()
        sid = f"{ns}:guarded"
        await talk(store, sid, "kept", owner=f"{ns}-o", title="Kept")
        with pytest.raises(InvalidSessionError):
            store.turn(sid, owner="")
        with pytest.raises(InvalidSessionError):
            store.turn(sid, owner="a\x00b")
        with pytest.raises(ValueError, match="title"):
            store.turn(sid, title="x" * 201)
        with pytest.raises(TypeError, match="tags"):
            store.turn(sid, tags="work")
        with pytest.raises(ValueError, match="JSON"):
            store.turn(sid, metadata={"when": object()})
        with pytest.raises(ValueError, match="cursor"):
            await store.list_owner_sessions(f"{ns}-o", cursor="not-a-cursor!")
        with pytest.raises(ValueError, match="order"):
            await store.list_owner_sessions(f"{ns}-o", order="oldest")
        (summary,) = (await store.list_owner_sessions(f"{ns}-o")).sessions
        assert (summary.session_id, summary.title, summary.message_count) == (sid, "Kept", 2)

    # -- erasing an owner's sessions ------------------------------------------------------

    async def test_erase_owner_removes_everything_of_the_owner_and_nothing_else(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """erase_owner drops every session of the owner — state, history chunks, a latched
        recovery marker — and its index; the report names them with zero entries left; the
        other owner's and an unowned session's entries are identical, value and version,
        before and after; a second erase finds nothing."""
        store = await sessions_factory(tail_bytes=256)
        alice, others = await populate_owners(store, ns)
        kept_scopes = [store.storage.scope_for(sid) for sid in others]
        kept_scopes.append(store.storage.catalog.scope_for(f"{ns}-bob"))
        before = {scope: await raw_entries(store, scope) for scope in kept_scopes}
        assert all(before.values())
        assert any(k.startswith("h/") for k in before[kept_scopes[0]])  # chunks exist

        report = await store.erase_owner(f"{ns}-alice")
        assert sorted(report.sessions) == sorted(alice)
        assert report.complete and report.entries_left == 0 and not report.resumed
        assert report.scopes_checked == len(alice) + 1
        for sid in alice:
            assert await store.inspect(sid) is None
            assert await raw_entries(store, store.storage.scope_for(sid)) == {}
        assert (await store.list_owner_sessions(f"{ns}-alice")).sessions == []
        index = await raw_entries(store, store.storage.catalog.scope_for(f"{ns}-alice"))
        assert all(key.startswith("x/") for key in index), index  # only the hashed tombstones
        for scope in kept_scopes:
            assert await raw_entries(store, scope) == before[scope], scope
        again = await store.erase_owner(f"{ns}-alice")
        assert again.sessions == () and again.complete

    async def test_erase_owner_fences_out_turns_of_the_owner(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A turn holding one of the owner's sessions while it is erased saves nothing (its
        exit raises a session error), and the session stays erased and unlisted; while an
        erase is unfinished (its marker in the owner's index) a turn for the owner is
        refused with OwnerErasingError; the next erase completes it (resumed) and the owner
        can be used again."""
        store = await sessions_factory()
        eraser = await sessions_factory()
        owner, sid = f"{ns}-alice", f"{ns}:held"
        await talk(store, sid, "before", owner=owner)
        entered, go = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            async with store.turn(sid) as session:
                entered.set()
                await go.wait()
                session.replace([*session.messages, *exchange("q", "written after the erase")])

        task = asyncio.create_task(holder())
        await asyncio.wait_for(entered.wait(), REAL_TIME_LIMIT_SECONDS)
        report = await eraser.erase_owner(owner)
        assert report.sessions == (sid,) and report.complete
        go.set()
        with pytest.raises(SessionError):
            await task
        await store.storage.drain()
        assert await eraser.inspect(sid) is None
        assert (await eraser.list_owner_sessions(owner)).sessions == []

        scope = eraser.storage.catalog.scope_for(owner)
        await eraser.kv.create(scope, ERASING_KEY, b'{"since": 0}')  # an erase cut off
        with pytest.raises(OwnerErasingError):
            await talk(store, f"{ns}:new", "refused", owner=owner)
        resumed = await eraser.erase_owner(owner)
        assert resumed.resumed and resumed.complete
        await talk(store, f"{ns}:later", "welcome back", owner=owner)
        listed = (await eraser.list_owner_sessions(owner)).sessions
        assert [s.session_id for s in listed] == [f"{ns}:later"]

    async def test_erase_owner_killed_midway_then_run_again_completes(
        self, sessions_factory: SessionsFactory, store_url: str, ns: str
    ) -> None:
        """A process erasing the owner is SIGKILLed after two of four sessions were dropped;
        erase_owner run again reports the erase resumed and complete, every session of the
        owner gone, and every entry of the other sessions unchanged."""
        store = await sessions_factory(tail_bytes=256)
        require_capability(
            store.kv, "shared_across_processes", "a second process cannot share its data"
        )
        alice, others = await populate_owners(store, ns)
        kept_scopes = [store.storage.scope_for(sid) for sid in others]
        before = {scope: await raw_entries(store, scope) for scope in kept_scopes}
        await killed_after_drops(2, "erase-owner", store_url, f"{ns}-alice")
        assert sum([await store.inspect(sid) is None for sid in alice]) == 2
        report = await store.erase_owner(f"{ns}-alice")
        assert report.resumed and report.complete
        assert set(report.sessions) <= set(alice)
        for sid in alice:
            assert await raw_entries(store, store.storage.scope_for(sid)) == {}
        for scope in kept_scopes:
            assert await raw_entries(store, scope) == before[scope], scope

    # -- retention --------------------------------------------------------------------------

    async def test_purge_idle_deletes_idle_sessions_only(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """purge_idle (retention, no native expiry needed) deletes the sessions no turn used
        for longer than the period — state, history chunks and owner-index entries —
        keeps a session used within it and an idle latched one (listed), never looks past
        its id prefix, and a second run removes nothing."""
        writer = await sessions_factory(tail_bytes=256, ttl_seconds=None)
        alice, others = await populate_owners(writer, ns)
        purger = await sessions_factory(tail_bytes=256, ttl_seconds=None)
        base = purger.kv.clock
        purger.kv.clock = lambda: base() + 100 * 86_400  # a hundred days later
        recent = f"{ns}:bob-1"
        await talk(purger, recent, "still here")
        report = await purger.purge_idle(90 * 86_400, prefix=f"{ns}:")
        ours = set(report.removed)
        expected = {*alice, *others} - {recent, alice[0]}
        assert ours == expected, report
        assert alice[0] in report.kept_latched
        for sid in expected:
            assert await writer.inspect(sid) is None
            assert await raw_entries(writer, writer.storage.scope_for(sid)) == {}
        assert await writer.inspect(recent) is not None
        assert await writer.inspect(alice[0]) is not None
        listed = (await purger.list_owner_sessions(f"{ns}-alice")).sessions
        assert [s.session_id for s in listed] == [alice[0]]
        again = await purger.purge_idle(90 * 86_400, prefix=f"{ns}:")
        assert again.removed == () and again.scanned == 2
