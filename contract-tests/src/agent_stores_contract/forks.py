# The exception under test comes out of the ``async with store.turn()`` block itself,
# so pytest.raises must enclose the whole block.
# ruff: noqa: PT012
"""The fork and rewind contract: sessions branch without copying, and nothing shared is lost.

Part of :class:`~agent_stores_contract.sessions.SessionContract` (every backend that runs
the session contract runs these). ``fork`` gives a new session the source's committed
history up to any turn boundary, never half of a turn another process is running; a
``rewind`` is a turn of its own (refused while another client holds the lease) that
keeps what it discards as a branch, and ``restore`` brings a branch back. Shared history
chunks survive every turn, reset and purge of the sessions that share them, however
those interleave; erasing an owner leaves nothing of it, while another owner's fork
(which copied) stays whole.

Stores with a small inline tail and fanout 2 are used where chunks matter, so a few
turns already spill, merge and delete chunks.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest
from agent_stores.erasure import erase_subject
from agent_stores.kv import KVStore
from agent_stores.sessions import (
    BranchNotFoundError,
    RecoveryRequiredError,
    SessionBusyError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStore,
)
from pydantic_ai.messages import ModelResponse, ToolCallPart

from .base import ContractBase
from .catalog import raw_entries
from .session_workers import pair, texts

SessionsFactory = Callable[..., Awaitable[SessionStore]]

#: Options that make a few turns spill into chunks and merge them (fanout 2).
CHUNKY = {"tail_bytes": 300, "fanout": 2}


def conversation(turns: int, tag: str = "t", pad: int = 120) -> list[list[str]]:
    """The texts of each turn of a scripted conversation (a user prompt and an answer)."""
    return [texts(pair(f"{tag}{i}", pad)) for i in range(turns)]


async def talk(store: SessionStore, sid: str, tags: list[str], **catalog: str) -> None:
    """One turn per tag, each appending a user prompt and an answer."""
    for tag in tags:
        async with store.turn(sid, **catalog) as session:  # type: ignore[arg-type]
            session.replace([*session.messages, *pair(tag, 120)])


def flat(turns: list[list[str]]) -> list[str]:
    return [t for turn in turns for t in turn]


class ForkBehaviours(ContractBase):
    """Fork, rewind and branch behaviours; a base of the session contract (uses its fixtures)."""

    async def test_fork_at_every_turn_boundary(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A fork at turn k holds exactly the source's first k turns (every k, and all by
        default), read back by another client; its lineage is recorded; later turns of
        the fork and of the source do not see each other; a taken id, a missing source
        and a turn past the end are refused with typed errors."""
        store = await sessions_factory(**CHUNKY)
        reader = await sessions_factory()
        sid = f"{ns}:src"
        tags = [f"t{i}" for i in range(6)]
        await talk(store, sid, tags)
        whole = conversation(6)
        for k in range(7):
            report = await store.fork(sid, f"{ns}:f{k}", at_turn=k)
            assert report.message_count == 2 * k and report.at_turn == k
            got = await reader.read_messages(f"{ns}:f{k}")
            assert got is not None and texts(got) == flat(whole[:k]), k
            info = await reader.inspect(f"{ns}:f{k}")
            assert info is not None and (info.forked_from, info.fork_point) == (sid, 2 * k)
            assert info.problem is None
        report = await store.fork(sid, f"{ns}:all")
        assert report.message_count == 12 and report.shared_chunks > 0 and not report.copied
        got = await reader.read_messages(f"{ns}:all")
        assert got is not None and texts(got) == flat(whole)
        lineage = await reader.lineage(f"{ns}:all")
        assert [(x["session_id"], x["source"], x["count"]) for x in lineage] == [
            (f"{ns}:all", sid, 12)
        ]
        await talk(reader, f"{ns}:all", ["fork-only"])
        await talk(store, sid, ["source-only"])
        fork_history = await store.read_messages(f"{ns}:all")
        source_history = await reader.read_messages(sid)
        assert fork_history is not None and source_history is not None
        assert texts(fork_history) == [*flat(whole), *texts(pair("fork-only"))]
        assert texts(source_history) == [*flat(whole), *texts(pair("source-only"))]
        with pytest.raises(SessionExistsError):
            await store.fork(sid, f"{ns}:all")
        with pytest.raises(SessionNotFoundError):
            await store.fork(f"{ns}:nobody", f"{ns}:x")
        with pytest.raises(ValueError, match="past the end"):
            await store.fork(sid, f"{ns}:x", at_turn=99)
        assert await store.inspect(f"{ns}:x") is None

    async def test_a_fork_keeps_the_latch_of_the_effects_it_holds(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A latched session (an effect call marked, its result never saved) forked whole,
        or from a turn after that call, is latched too — the effect may have happened in
        the world whichever session goes on; a fork from before the call is not."""
        store = await sessions_factory()
        sid = f"{ns}:latched"
        await talk(store, sid, ["a"])
        call = ModelResponse(parts=[ToolCallPart("charge_card", {"amount": 1}, "call-1")])
        with pytest.raises(RuntimeError):
            async with store.turn(sid) as session:
                await session.checkpoint([*session.messages, *pair("pay", 0)[:1], call])
                await session.mark_effects([("charge_card", "call-1")])
                raise RuntimeError("the process dies inside the tool")
        await store.fork(sid, f"{ns}:whole")
        await store.fork(sid, f"{ns}:after", at_turn=2)
        await store.fork(sid, f"{ns}:before", at_turn=1)
        for name in ("whole", "after"):
            info = await store.inspect(f"{ns}:{name}")
            assert info is not None and [c.tool_call_id for c in info.pending_effects] == [
                "call-1"
            ], name
            with pytest.raises(RecoveryRequiredError):
                async with store.turn(f"{ns}:{name}"):
                    pass
        async with store.turn(f"{ns}:before") as session:
            assert texts(session.messages) == texts(pair("a", 120))

    async def test_fork_during_another_process_turn_takes_committed_state_only(
        self, kv: KVStore, sessions_factory: SessionsFactory, store_url: str, ns: str
    ) -> None:
        """While another process runs a turn that checkpointed half of it, a fork holds the
        history as it was before that turn (never half a turn); the running turn keeps
        its lease."""
        from .sessions import held_by_a_killed_process, require_processes

        require_processes(kv)
        store = await sessions_factory()
        sid = f"{ns}:busy"
        async with held_by_a_killed_process(store, store_url, sid) as ready:
            during = await store.read_messages(sid)
            assert during is not None and texts(during)[-2:] == ["q:checkpointed", "a:checkpointed"]
            await store.fork(sid, f"{ns}:copy")
            got = await store.read_messages(f"{ns}:copy")
            assert got is not None and texts(got) == ["q:before", "a:before"]
            info = await store.inspect(sid)
            assert info is not None and info.lease_owner is not None
            assert info.fence == ready["fence"]

    async def test_rewind_is_refused_while_another_client_holds_the_lease(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A rewind waits for the lease like a turn and gives up with SESSION_BUSY; the
        history is untouched; once the turn ends the rewind goes through."""
        holder = await sessions_factory()
        other = await sessions_factory()
        sid = f"{ns}:held"
        await talk(holder, sid, ["a", "b", "c"])
        async with holder.turn(sid):
            with pytest.raises(SessionBusyError):
                await other.rewind(sid, 1, timeout_seconds=0.3)
        got = await other.read_messages(sid)
        assert got is not None and len(got) == 6
        assert await other.branches(sid) == []
        branch = await other.rewind(sid, 1)
        assert branch.message_count == 6 and branch.reason == "rewind"
        got = await holder.read_messages(sid)
        assert got is not None and texts(got) == texts(pair("a", 120))
        with pytest.raises(SessionNotFoundError):
            await other.rewind(f"{ns}:absent", 0)

    async def test_rewind_keeps_branches_and_restore_brings_them_back(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A rewind keeps the discarded history as a branch; the rewound session goes on
        with new turns; restore brings the branch back exactly, setting the replaced
        history aside in turn, which restores as well; every client sees the same."""
        store = await sessions_factory(**CHUNKY)
        reader = await sessions_factory()
        sid = f"{ns}:rw"
        await talk(store, sid, [f"t{i}" for i in range(5)])
        original = flat(conversation(5))
        first = await store.rewind(sid, 2)
        got = await reader.read_messages(sid)
        assert got is not None and texts(got) == original[:4]
        await talk(reader, sid, ["other"])
        alternative = [*original[:4], *texts(pair("other"))]
        listed = await reader.branches(sid)
        assert [(b.branch_id, b.message_count, b.reason) for b in listed] == [
            (first.branch_id, 10, "rewind")
        ]
        second = await reader.restore(sid, first.branch_id)
        assert second.reason == "restore" and second.message_count == 6
        got = await store.read_messages(sid)
        assert got is not None and texts(got) == original
        assert [b.branch_id for b in await store.branches(sid)] == [second.branch_id]
        await store.restore(sid, second.branch_id)
        got = await reader.read_messages(sid)
        assert got is not None and texts(got) == alternative
        with pytest.raises(BranchNotFoundError):
            await store.restore(sid, second.branch_id)
        info = await reader.inspect(sid)
        assert info is not None and info.problem is None

    async def test_shared_chunks_survive_concurrent_forks_turns_and_purges(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Several clients fork a session (and forks of forks) while its owner keeps taking
        turns (which merge and delete chunks) and others reset, purge and rewind forks:
        every surviving session then reads exactly its own history from a new client, no
        chunk it references is missing, and once all are deleted no state, pin or
        branch is left."""
        clients = [await sessions_factory(**CHUNKY) for _ in range(4)]
        purger = await sessions_factory(**CHUNKY)
        ahead = purger.kv.clock
        purger.kv.clock = lambda: ahead() + 3600
        sid = f"{ns}:root"
        await talk(clients[0], sid, [f"r{i}" for i in range(4)])
        expected: dict[str, list[str]] = {}
        rng = random.Random(7)
        lock = asyncio.Lock()

        async def source_turns() -> None:
            for i in range(4, 16):
                await talk(clients[0], sid, [f"r{i}"])

        async def forker(client: SessionStore, n: int) -> None:
            for j in range(5):
                name = f"{ns}:f{n}-{j}"
                async with lock:
                    parents = [sid, *expected]
                parent = rng.choice(parents)
                try:
                    report = await client.fork(parent, name, at_turn=rng.choice([None, 1, 2]))
                except SessionNotFoundError:
                    continue  # its parent was reset meanwhile
                except ValueError:
                    continue  # a fork with fewer turns than asked
                got = await client.read_messages(name)
                assert got is not None and len(got) == report.message_count
                want = texts(got)
                if j % 2:
                    await talk(client, name, [f"own{n}-{j}"])
                    want += texts(pair(f"own{n}-{j}"))
                async with lock:  # published once this task is done with it
                    expected[name] = want

        async def remover(client: SessionStore) -> None:
            for _ in range(6):
                await asyncio.sleep(0.01)
                async with lock:
                    if not expected:
                        continue
                    victim = rng.choice(sorted(expected))
                    del expected[victim]
                action = rng.choice(["reset", "rewind", "purge"])
                if action == "purge":
                    # Retention: the purging client's clock is far ahead, so the victim is idle.
                    purged = await purger.purge_idle(60.0, prefix=victim)
                    assert purged.removed == (victim,), purged
                    continue
                if action == "rewind":
                    await client.rewind(victim, 0)
                await client.reset(victim)

        await asyncio.gather(
            source_turns(),
            forker(clients[1], 1),
            forker(clients[2], 2),
            remover(clients[3]),
        )
        for client in [*clients, purger]:
            await client.storage.drain()
        fresh = await sessions_factory()
        for name, want in sorted(expected.items()):
            got = await fresh.read_messages(name)
            assert got is not None and texts(got) == want, name
            info = await fresh.inspect(name)
            assert info is not None and info.problem is None, (name, info)
        await clients[0].reset(sid)
        await clients[0].storage.drain()
        for name, want in sorted(expected.items()):
            got = await fresh.read_messages(name)
            assert got is not None and texts(got) == want, name
        for name in sorted(expected):
            await fresh.reset(name)
        await fresh.storage.drain()
        for scope in [fresh.storage.scope_for(s) for s in [sid, *expected]]:
            left = await raw_entries(fresh, scope)
            assert not [k for k in left if not k.startswith("h/")], (scope, sorted(left))

    async def test_processes_fork_while_the_source_takes_turns_and_forks_are_purged(
        self, kv: KVStore, sessions_factory: SessionsFactory, store_url: str, ns: str
    ) -> None:
        """Two processes fork a session again and again while this one keeps taking turns
        on it (merging and deleting its chunks) and resets and purges some forks: every
        fork a process made reads, from here, exactly what it read right after making
        it, and the source's own history is whole."""
        from .sessions import read_json, require_processes, spawn

        require_processes(kv)
        store = await sessions_factory(**CHUNKY)
        purger = await sessions_factory(**CHUNKY)
        ahead = purger.kv.clock
        purger.kv.clock = lambda: ahead() + 3600
        sid = f"{ns}:proc-src"
        await talk(store, sid, ["p0", "p1", "p2"])
        workers = [await spawn("forks", store_url, sid, f"{ns}:w{n}-", "6") for n in range(2)]
        made: dict[str, list[str]] = {}
        try:
            turns = asyncio.create_task(talk(store, sid, [f"p{i}" for i in range(3, 12)]))
            for proc in workers:
                while "done" not in (line := await read_json(proc)):
                    made[line["fork"]] = line["texts"]
                    if len(made) % 3 == 0:  # purge one, reset another, as they come
                        victim = line["fork"]
                        if len(made) % 2:
                            await purger.purge_idle(60.0, prefix=victim)
                        else:
                            await store.reset(victim)
                        del made[victim]
            await turns
        finally:
            for proc in workers:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
        await store.storage.drain()
        await purger.storage.drain()
        assert made, "the workers made no fork"
        reader = await sessions_factory()
        for name, want in sorted(made.items()):
            got = await reader.read_messages(name)
            assert got is not None and texts(got) == want, name
        got = await reader.read_messages(sid)
        assert got is not None and texts(got) == flat(
            [texts(pair(f"p{i}", 120)) for i in range(12)]
        )

    async def test_erase_subject_with_forks_leaves_nothing_of_it(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Forks within one owner share chunks, a fork for another owner copies them, and
        so does a fork given to another owner later: erasing the first owner removes its
        sessions, their forks and branches (nothing left), while the other owner's
        sessions still read their whole history."""
        store = await sessions_factory(**CHUNKY)
        alice, bob = f"{ns}-alice", f"{ns}-bob"
        sid = f"{ns}:alice-src"
        await talk(store, sid, [f"a{i}" for i in range(6)], owner=alice)
        same = await store.fork(sid, f"{ns}:alice-fork")
        assert not same.copied and same.shared_chunks > 0
        await store.fork(f"{ns}:alice-fork", f"{ns}:alice-fork2", at_turn=3)
        await store.rewind(f"{ns}:alice-fork", 2)
        other = await store.fork(sid, f"{ns}:bob-fork", owner=bob)
        assert other.copied and other.shared_chunks == 0
        moved = await store.fork(sid, f"{ns}:bob-later")
        assert not moved.copied and moved.shared_chunks > 0
        assert await store.set_catalog(f"{ns}:bob-later", owner=bob)
        report = await erase_subject(alice, sessions=store)
        assert report.entries_left == 0
        for name in ("alice-src", "alice-fork", "alice-fork2"):
            assert await store.inspect(f"{ns}:{name}") is None
            assert await raw_entries(store, store.storage.scope_for(f"{ns}:{name}")) == {}
        reader = await sessions_factory()
        for name in ("bob-fork", "bob-later"):
            got = await reader.read_messages(f"{ns}:{name}")
            assert got is not None and texts(got) == flat(conversation(6, "a")), name
            info = await reader.inspect(f"{ns}:{name}")
            assert info is not None and info.problem is None and info.owner == bob
