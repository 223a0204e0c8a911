"""The conversation contract: Pydantic AI's ``ConversationStore`` protocol, on any store.

Every rule the docstrings of ``pydantic_ai.conversation_store`` state, exercised through the
store's public methods (``load``, ``load_entries``, ``save``, ``branch``, ``fork``,
``list_conversations``, ``update``, ``delete``) and its storage primitives (``read_record``,
``read_records``, ``write_record``, ``write_details``, ``delete_record``, ``read_entry``,
``read_history``): only new messages are appended, a rewritten history branches off the last
shared message, forks share entries, stale revisions conflict, a conversation of another scope
is one the store does not have, ``update`` never changes the revision, delete releases what no
remaining record reaches and never what a fork still uses (also while forks and saves race
it, with tasks and with OS processes), and Pydantic AI's own docstring example runs with a
real ``Agent``, resumed from a deferred tool in another process.

The store under test comes from ``conversation_store_factory``: by default
``agent_stores.open_conversations(store_url)``; with ``--conversation-store module:attribute``
(or ``AGENT_STORES_CONTRACT_CONVERSATION_STORE``) any third party's store (see
:mod:`agent_stores_contract.conversation_workers` for the factory's shape). Tests that need
several processes skip, as a declared capability, for a store whose data is not shared across
processes (Pydantic AI's ``InMemoryConversationStore``). Every test works on conversation ids
and scopes named from its random ``ns`` prefix and deletes what it made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from pydantic_ai.conversation import Conversation, ConversationTypeAdapter
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.tools import DeferredToolRequests
from pydantic_ai.usage import RequestUsage, RunUsage

from .base import CAPABILITY_SKIP, REAL_TIME_LIMIT_SECONDS, ContractBase
from .conversation_workers import (
    CONVERSATION_STORE_ENV,
    StoreFactory,
    approval_agent,
    load_factory,
    opened,
    url_factory,
)
from .session_workers import pair, texts

#: How many tasks race one delete in the in-process race tests.
RACING_TASKS = 40
#: How many worker processes race one delete, and how many forks each makes.
RACING_PROCESSES = 3
FORKS_PER_PROCESS = 6


@dataclass
class ConversationTarget:
    """The store under test, and what the tests made in it (deleted after the test)."""

    store: ConversationStore
    ns: str
    #: How a worker process opens the same data (``url=URL`` / ``factory=module:attribute``),
    #: or None when no other process can.
    worker_target: str | None
    #: Why the store's data cannot be shared with other processes (None: it can).
    not_shared: str | None
    #: The store is one of agent-stores' own (from ``agent_stores.open_conversations``).
    ours: bool
    created: set[str] = field(default_factory=set)

    def cid(self, name: str) -> str:
        """A conversation id of this test (deleted after it)."""
        conversation_id = f"{self.ns}-{name}"
        self.created.add(conversation_id)
        return conversation_id

    def scope(self, name: str) -> str:
        """A scope of this test."""
        return f"{self.ns}-scope-{name}"

    def require_processes(self) -> str:
        """The worker target; skips the calling test (a declared capability) without one."""
        if self.not_shared is not None or self.worker_target is None:
            pytest.skip(
                f"{CAPABILITY_SKIP} shared_across_processes=False ({type(self.store).__name__}): "
                f"{self.not_shared or 'no importable factory a worker process could call'}"
            )
        return self.worker_target

    async def cleanup(self) -> None:
        for conversation_id in sorted(self.created):
            try:
                await self.store.delete(conversation_id)
            except Exception:  # the behaviour was already judged
                continue


def turns(*tags: str) -> list[ModelMessage]:
    """A user prompt and a model answer per tag."""
    return [message for tag in tags for message in pair(tag)]


def rich_messages() -> list[ModelMessage]:
    """Messages of every kind of part a conversation carries (binary, tool calls, returns, thinking)."""
    return [
        ModelRequest(
            parts=[
                UserPromptPart(
                    ["look é😀", BinaryContent(data=b"\x00\xff png", media_type="image/png")]
                )
            ]
        ),
        ModelResponse(
            parts=[ThinkingPart("hmm"), ToolCallPart("lookup", {"q": "é😀"}, tool_call_id="c1")],
            usage=RequestUsage(input_tokens=7, output_tokens=3),
        ),
        ModelRequest(parts=[ToolReturnPart("lookup", {"n": [1, 2]}, tool_call_id="c1")]),
        ModelResponse(parts=[TextPart("found 2")]),
    ]


def pending_requests() -> DeferredToolRequests:
    """Deferred tool requests of a paused run: an approval and an external call, with metadata."""
    return DeferredToolRequests(
        approvals=[ToolCallPart("delete_file", {"path": "a.txt"}, tool_call_id="ap-1")],
        calls=[ToolCallPart("fetch_report", {"id": 7}, tool_call_id="ext-1")],
        metadata={"ap-1": {"reason": "destructive"}},
    )


def dump(messages: Sequence[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(list(messages))


async def saved(
    store: ConversationStore,
    conversation_id: str,
    messages: list[ModelMessage],
    *,
    scope: str | None = None,
    usage: RunUsage | None = None,
    deferred: DeferredToolRequests | None = None,
) -> Conversation:
    """A new conversation saved with ``messages``; returned as saved (its revision set)."""
    conversation = Conversation(
        conversation_id=conversation_id,
        messages=messages,
        usage=usage or RunUsage(),
        deferred_tool_requests=deferred,
    )
    await store.save(conversation, scope=scope)
    return conversation


async def entry_ids(store: ConversationStore, conversation_id: str, **kwargs: Any) -> list[str]:
    entries = await store.load_entries(conversation_id, **kwargs)
    assert entries is not None, f"{conversation_id} is not stored"
    return [entry.id for entry in entries]


async def is_released(store: ConversationStore, entry_id: str) -> bool:
    """The store no longer has the entry: ``read_entry`` raises ``LookupError`` (as the ABC's
    ``_history_of`` expects of a missing entry)."""
    try:
        await store.read_entry(entry_id)
    except LookupError:
        return True
    return False


async def assert_whole(store: ConversationStore, conversation_id: str) -> list[ConversationEntry]:
    """The stored conversation's history and every branch it left read back whole and linked."""
    record = await store.read_record(conversation_id)
    assert record is not None
    entries = await store.load_entries(conversation_id)
    assert entries is not None
    assert_linked(entries)
    assert (entries[-1].id if entries else None) == record.head_id
    for tip in record.branches:
        assert_linked(await store.read_history(tip))
    return entries


def assert_linked(entries: Sequence[ConversationEntry]) -> None:
    """Each entry points at the one before it; the first at nothing."""
    parents = [entry.parent_id for entry in entries]
    assert parents == [None, *(entry.id for entry in entries[:-1])][: len(entries)], (
        "history out of order"
    )


async def spawn(*args: str) -> asyncio.subprocess.Process:
    """Start ``python -m agent_stores_contract.conversation_workers ARGS``."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_stores_contract.conversation_workers",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def lines_of(proc: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    """Every JSON line a worker printed (fails with its stderr unless it exits 0)."""
    out, err = await asyncio.wait_for(proc.communicate(), REAL_TIME_LIMIT_SECONDS * 2)
    if proc.returncode != 0:
        raise AssertionError(f"worker exited ({proc.returncode}): {err.decode()[-3000:]}")
    return [json.loads(line) for line in out.decode().splitlines() if line.strip()]


async def settle(*coroutines: Any) -> list[str]:
    """Run the coroutines concurrently; each one's outcome: ``ok``, ``conflict``
    (ConversationConflict), ``missing`` (another UserError); anything else propagates."""

    async def one(coroutine: Any) -> str:
        try:
            await coroutine
        except ConversationConflict:
            return "conflict"
        except UserError:
            return "missing"
        return "ok"

    return list(await asyncio.gather(*(one(c) for c in coroutines)))


class ConversationContract(ContractBase):
    """The ConversationStore contract. Subclass it and provide ``store_url`` (agent-stores
    stores) or ``conversation_store_factory`` (any store)."""

    pytestmark = pytest.mark.asyncio

    @pytest.fixture
    def conversation_store_factory(self, request: pytest.FixtureRequest) -> StoreFactory:
        """A zero-argument callable opening the store under test: ``--conversation-store``'s
        factory if given, else ``agent_stores.open_conversations(store_url)``."""
        spec = request.config.getoption("--conversation-store", None) or os.environ.get(
            CONVERSATION_STORE_ENV
        )
        if spec:
            # A worker process calls the same factory.
            return NamedFactory(load_factory(spec), worker_target=f"factory={spec}")
        url = request.getfixturevalue("store_url")
        if "backend_ready" in request.fixturenames or hasattr(self, "backend_ready"):
            request.getfixturevalue("backend_ready")
        return NamedFactory(url_factory(url), worker_target=f"url={url}", store_url=url)

    @pytest.fixture
    def ns(self) -> str:
        """A random prefix of this test's conversation ids and scopes (no KV client needed: a
        third party's store has none)."""
        return f"ct-{uuid.uuid4().hex[:12]}"

    @pytest_asyncio.fixture
    async def conversations(
        self, conversation_store_factory: StoreFactory, ns: str
    ) -> AsyncIterator[ConversationTarget]:
        """The store under test (one client), with this test's ids; cleaned up after."""
        factory = conversation_store_factory
        async with opened(factory) as store:
            target = ConversationTarget(
                store=store,
                ns=ns,
                worker_target=worker_target_of(factory),
                not_shared=await not_shared_reason(factory, store),
                ours=type(store).__module__.startswith("agent_stores."),
            )
            try:
                yield target
            finally:
                await target.cleanup()

    # -- the protocol ---------------------------------------------------------------------

    async def test_is_a_conversation_store(self, conversations: ConversationTarget) -> None:
        """The store is a subclass of Pydantic AI's ConversationStore; a conversation it does not have loads as None, lists nowhere and deletes harmlessly."""
        store = conversations.store
        assert isinstance(store, ConversationStore)
        missing = conversations.cid("missing")
        assert await store.load(missing) is None
        assert await store.load_entries(missing) is None
        assert await store.read_record(missing) is None
        await store.delete(missing)
        assert await store.list_conversations(scope=conversations.scope("none")) == []
        assert await is_released(store, "no-such-entry"), "read_entry of an unknown id"

    async def test_save_then_load_round_trips_the_whole_conversation(
        self, conversations: ConversationTarget
    ) -> None:
        """A saved conversation loads with every message (every kind of part, byte-equal as through ModelMessagesTypeAdapter), its usage, its id and the deferred tool requests it waits on, and a revision."""
        store, cid = conversations.store, conversations.cid("round-trip")
        messages = rich_messages()
        usage = RunUsage(input_tokens=70, output_tokens=30, requests=3, tool_calls=2)
        conversation = await saved(store, cid, messages, usage=usage, deferred=pending_requests())
        assert conversation.revision is not None
        loaded = await store.load(cid)
        assert loaded is not None
        assert dump(loaded.messages) == dump(messages)
        assert loaded.usage == usage
        assert loaded.conversation_id == cid
        assert loaded.deferred_tool_requests == pending_requests()
        assert loaded.revision == conversation.revision
        assert loaded.new_message_index == len(messages)
        # The same through Pydantic AI's serialization of the whole conversation.
        assert ConversationTypeAdapter.dump_json(
            dataclasses.replace(loaded, new_message_index=None)
        ) == ConversationTypeAdapter.dump_json(
            dataclasses.replace(conversation, new_message_index=None)
        )

    async def test_save_appends_only_new_messages_with_stable_entry_ids(
        self, conversations: ConversationTarget
    ) -> None:
        """A save stores only the messages the store does not have, returns their entries in order (each pointing at the one before), and every entry id already stored stays the same; a save with nothing new returns no entry."""
        store, cid = conversations.store, conversations.cid("append")
        conversation = Conversation(conversation_id=cid, messages=turns("one"))
        first = await store.save(conversation)
        assert [e.message for e in first] == conversation.messages
        assert_linked(first)
        loaded = await store.load(cid)
        assert loaded is not None
        loaded.messages.extend(turns("two", "three"))
        second = await store.save(loaded)
        assert texts([e.message for e in second]) == ["q:two", "a:two", "q:three", "a:three"]
        assert second[0].parent_id == first[-1].id
        assert_linked([*first, *second])
        ids = await entry_ids(store, cid)
        assert ids == [e.id for e in [*first, *second]]
        before = loaded.revision
        assert await store.save(loaded) == []
        assert await entry_ids(store, cid) == ids
        assert loaded.revision != before, "a save advances the revision"
        record = await store.read_record(cid)
        assert (
            record is not None and record.revision == loaded.revision and record.head_id == ids[-1]
        )

    async def test_a_saved_result_of_a_loaded_conversation_appends_the_run(
        self, conversations: ConversationTarget
    ) -> None:
        """A serialized conversation (no new_message_index) saved again appends only what extends the stored history, and a history a run trimmed before the boundary still only appends after it."""
        store, cid = conversations.store, conversations.cid("compare")
        await saved(store, cid, turns("one", "two"))
        loaded = await store.load(cid)
        assert loaded is not None
        # Serialized and read back: the boundary is gone, the messages are compared.
        copy = ConversationTypeAdapter.validate_json(ConversationTypeAdapter.dump_json(loaded))
        copy.messages.extend(turns("three"))
        assert copy.new_message_index is None or copy.new_message_index == 4
        appended = await store.save(copy)
        assert texts([e.message for e in appended]) == ["q:three", "a:three"]
        # A run's capability trimmed the history it was sent: the store only grows.
        again = await store.load(cid)
        assert again is not None
        trimmed = Conversation(
            conversation_id=cid,
            messages=[*again.messages[-2:], *turns("four")],
            revision=again.revision,
        )
        trimmed.new_message_index = 2
        stored_before = await entry_ids(store, cid)
        appended = await store.save(trimmed)
        assert texts([e.message for e in appended]) == ["q:four", "a:four"]
        assert appended[0].parent_id == stored_before[-1]
        final = await store.load(cid)
        assert final is not None
        assert texts(final.messages) == [
            f"{k}:{t}" for t in ("one", "two", "three", "four") for k in "qa"
        ]

    async def test_history_loads_in_order_and_limit_takes_the_last_messages(
        self, conversations: ConversationTarget
    ) -> None:
        """A history saved over many turns loads in order; load/load_entries/read_history with ``limit`` return its last messages in order, 0 none, and the whole history is still appended to."""
        store, cid = conversations.store, conversations.cid("order")
        conversation = Conversation(conversation_id=cid)
        for i in range(12):
            conversation.messages.extend(turns(f"t{i}"))
            await store.save(conversation)
        expected = texts(turns(*(f"t{i}" for i in range(12))))
        loaded = await store.load(cid)
        assert loaded is not None and texts(loaded.messages) == expected
        entries = await assert_whole(store, cid)
        assert len(entries) == 24
        last = await store.load(cid, limit=5)
        assert last is not None and texts(last.messages) == expected[-5:]
        tail = await store.load_entries(cid, limit=5)
        assert tail is not None and [e.id for e in tail] == [e.id for e in entries[-5:]]
        assert [e.id for e in await store.read_history(entries[9].id, limit=3)] == [
            e.id for e in entries[7:10]
        ]
        none = await store.load(cid, limit=0)
        assert none is not None and none.messages == []
        last.messages.extend(turns("t12"))
        await store.save(last)
        whole = await store.load(cid)
        assert whole is not None and texts(whole.messages) == [*expected, "q:t12", "a:t12"]

    async def test_negative_limit_is_a_user_error(self, conversations: ConversationTarget) -> None:
        """A negative ``limit`` raises UserError from load, load_entries and list_conversations."""
        store, cid = conversations.store, conversations.cid("limit")
        await saved(store, cid, turns("one"))
        with pytest.raises(UserError):
            await store.load(cid, limit=-1)
        with pytest.raises(UserError):
            await store.load_entries(cid, limit=-1)
        with pytest.raises(UserError):
            await store.list_conversations(limit=-1)

    async def test_stored_copies_are_independent_of_the_callers_objects(
        self, conversations: ConversationTarget
    ) -> None:
        """Changing a message, a record or a conversation after it was saved or returned never changes what is stored."""
        store, cid = conversations.store, conversations.cid("copies")
        messages = turns("one")
        await saved(store, cid, messages, usage=RunUsage(requests=1))
        part = messages[0].parts[0]
        assert isinstance(part, UserPromptPart)
        part.content = "edited after the save"
        record = await store.read_record(cid)
        assert record is not None
        record.usage.requests = 99
        record.branches.append("not-an-entry")
        loaded = await store.load(cid)
        assert loaded is not None and texts(loaded.messages) == ["q:one", "a:one"]
        assert loaded.usage.requests == 1
        loaded.usage.requests = 50
        again = await store.read_record(cid)
        assert again is not None and again.usage.requests == 1 and again.branches == []

    # -- branches -------------------------------------------------------------------------

    async def test_rewritten_history_branches_off_the_last_shared_message(
        self, conversations: ConversationTarget
    ) -> None:
        """A save whose history was rewritten appends the messages from the first difference after the last shared one, records the old head in ``branches``, and keeps the old branch readable."""
        store, cid = conversations.store, conversations.cid("rewrite")
        await saved(store, cid, turns("a", "b"))
        old = await entry_ids(store, cid)
        loaded = await store.load(cid)
        assert loaded is not None
        rewritten = Conversation(
            conversation_id=cid,
            messages=[*loaded.messages[:2], *turns("x")],
            revision=loaded.revision,
        )
        new = await store.save(rewritten)
        assert texts([e.message for e in new]) == ["q:x", "a:x"]
        assert new[0].parent_id == old[1]
        record = await store.read_record(cid)
        assert record is not None and record.branches == [old[-1]]
        assert await entry_ids(store, cid) == [*old[:2], *(e.id for e in new)]
        left = await store.read_history(old[-1])
        assert [e.id for e in left] == old
        # Rewritten from the first message: the new history starts a branch of its own.
        again = await store.load(cid)
        assert again is not None
        fresh = Conversation(conversation_id=cid, messages=turns("z"), revision=again.revision)
        newest = await store.save(fresh)
        assert newest[0].parent_id is None
        record = await store.read_record(cid)
        assert record is not None and record.branches == [old[-1], new[-1].id]

    async def test_branch_continues_from_an_earlier_point_and_back(
        self, conversations: ConversationTarget
    ) -> None:
        """``branch(at=)`` keeps that many messages and records the history it leaves; the next save goes on the branch; ``branch(from_entry=)`` returns to a left branch; a branch off the head clears the deferred requests."""
        store, cid = conversations.store, conversations.cid("branch")
        await saved(
            store,
            cid,
            turns("a", "b", "c"),
            deferred=pending_requests(),
            usage=RunUsage(requests=3),
        )
        old = await entry_ids(store, cid)
        loaded = await store.load(cid)
        assert loaded is not None
        branched = await store.branch(cid, at=2, expected_revision=loaded.revision)
        assert texts(branched.messages) == ["q:a", "a:a"]
        assert branched.deferred_tool_requests is None
        assert branched.usage.requests == 3
        assert branched.revision not in (None, loaded.revision)
        record = await store.read_record(cid)
        assert record is not None and record.head_id == old[1] and record.branches == [old[-1]]
        branched.messages.extend(turns("B"))
        on_branch = await store.save(branched)
        assert on_branch[0].parent_id == old[1]
        record = await store.read_record(cid)
        assert record is not None
        back = await store.branch(cid, from_entry=old[-1], expected_revision=record.revision)
        assert texts(back.messages) == texts(turns("a", "b", "c"))
        record = await store.read_record(cid)
        assert record is not None and record.head_id == old[-1]
        assert record.branches == [on_branch[-1].id], "the tip returned to leaves branches"
        # Nothing was copied: the branch back is the very same entries.
        assert await entry_ids(store, cid) == old

    async def test_branch_refuses_what_it_cannot_do(
        self, conversations: ConversationTarget
    ) -> None:
        """``branch`` raises UserError for a conversation the store does not have, ``at`` out of range, an unknown ``from_entry``, or not exactly one of them; ConversationConflict on a stale revision; nothing changes."""
        store, cid = conversations.store, conversations.cid("branch-bad")
        first = await saved(store, cid, turns("a", "b"))
        record = await store.read_record(cid)
        assert record is not None
        revision = record.revision
        with pytest.raises(UserError):
            await store.branch(conversations.cid("absent"), at=0, expected_revision=None)
        for kwargs in (
            {"at": 5},
            {"at": -1},
            {"from_entry": "no-such-entry"},
            {},
            {"at": 1, "from_entry": record.head_id},
        ):
            with pytest.raises(UserError) as caught:
                await store.branch(cid, expected_revision=revision, **kwargs)
            assert not isinstance(caught.value, ConversationConflict), kwargs
        with pytest.raises(ConversationConflict):
            await store.branch(cid, at=1, expected_revision="stale")
        after = await store.read_record(cid)
        assert after is not None and after.revision == revision and after.head_id == record.head_id
        assert first.revision == revision

    # -- forks ----------------------------------------------------------------------------

    async def test_forks_share_entries(self, conversations: ConversationTarget) -> None:
        """A fork points at the source's entries (the same entry ids, nothing copied), records ``forked_from``/``forked_at``, keeps usage and deferred requests only when it keeps the whole history; the fork and the source then grow apart."""
        store, cid = conversations.store, conversations.cid("source")
        usage = RunUsage(requests=4, input_tokens=40)
        await saved(store, cid, turns("a", "b", "c"), usage=usage, deferred=pending_requests())
        source = await entry_ids(store, cid)
        whole_id, part_id = conversations.cid("whole"), conversations.cid("part")
        whole = await store.fork(cid, new_conversation_id=whole_id)
        assert whole.conversation_id == whole_id
        assert await entry_ids(store, whole_id) == source
        assert whole.usage == usage and whole.deferred_tool_requests == pending_requests()
        record = await store.read_record(whole_id)
        assert record is not None and record.forked_from == cid and record.forked_at == source[-1]
        part = await store.fork(cid, at=2, new_conversation_id=part_id)
        assert await entry_ids(store, part_id) == source[:2]
        assert part.usage == RunUsage() and part.deferred_tool_requests is None
        record = await store.read_record(part_id)
        assert record is not None and record.forked_at == source[1]
        part.messages.extend(turns("P"))
        grown = await store.save(part)
        assert grown[0].parent_id == source[1]
        assert await entry_ids(store, cid) == source
        loaded = await store.load(cid)
        assert loaded is not None
        loaded.messages.extend(turns("S"))
        await store.save(loaded)
        assert await entry_ids(store, part_id) == [*source[:2], *(e.id for e in grown)]
        empty = await store.fork(cid, at=0, new_conversation_id=conversations.cid("empty"))
        assert empty.messages == []
        # A default id is minted, and the fork lists under the source's scope.
        minted = await store.fork(cid, at=1)
        conversations.created.add(minted.conversation_id)
        assert minted.conversation_id not in (cid, whole_id, part_id)
        assert await entry_ids(store, minted.conversation_id) == source[:1]

    async def test_fork_from_an_entry_of_a_left_branch(
        self, conversations: ConversationTarget
    ) -> None:
        """``fork(from_entry=)`` forks from an entry of the current history or of a branch the conversation left; an entry in neither is a UserError."""
        store, cid = conversations.store, conversations.cid("fork-branch")
        await saved(store, cid, turns("a", "b"))
        old = await entry_ids(store, cid)
        loaded = await store.load(cid)
        assert loaded is not None
        await store.branch(cid, at=1, expected_revision=loaded.revision)
        fork_id = conversations.cid("fork-branch-f")
        fork = await store.fork(cid, from_entry=old[2], new_conversation_id=fork_id)
        assert texts(fork.messages) == ["q:a", "a:a", "q:b"]
        assert await entry_ids(store, fork_id) == old[:3]
        with pytest.raises(UserError):
            await store.fork(
                cid, from_entry="no-such-entry", new_conversation_id=conversations.cid("x")
            )
        with pytest.raises(UserError):
            await store.fork(
                conversations.cid("absent"), new_conversation_id=conversations.cid("y")
            )
        assert await store.read_record(conversations.cid("x")) is None

    # -- revisions ------------------------------------------------------------------------

    async def test_stale_revision_conflicts(self, conversations: ConversationTarget) -> None:
        """A save of a copy loaded before another save raises ConversationConflict naming the conversation and writes nothing; reloaded, it saves."""
        store, cid = conversations.store, conversations.cid("stale")
        await saved(store, cid, turns("a"))
        first, second = await store.load(cid), await store.load(cid)
        assert first is not None and second is not None
        first.messages.extend(turns("first"))
        await store.save(first)
        stored = await entry_ids(store, cid)
        second.messages.extend(turns("second"))
        with pytest.raises(ConversationConflict) as caught:
            await store.save(second)
        assert caught.value.conversation_id == cid
        assert await entry_ids(store, cid) == stored
        record = await store.read_record(cid)
        assert record is not None and record.revision == first.revision
        again = await store.load(cid)
        assert again is not None
        again.messages.extend(turns("second"))
        await store.save(again)
        final = await store.load(cid)
        assert final is not None and texts(final.messages)[-2:] == ["q:second", "a:second"]

    async def test_recreating_an_existing_conversation_conflicts(
        self, conversations: ConversationTarget
    ) -> None:
        """A conversation not loaded from the store (revision None) whose id is stored raises ConversationConflict; a fork onto a stored id too; both leave it unchanged."""
        store, cid = conversations.store, conversations.cid("exists")
        await saved(store, cid, turns("a"))
        stored = await entry_ids(store, cid)
        with pytest.raises(ConversationConflict):
            await saved(store, cid, turns("other"))
        other = conversations.cid("other")
        await saved(store, other, turns("b"))
        with pytest.raises(ConversationConflict):
            await store.fork(other, new_conversation_id=cid)
        assert await entry_ids(store, cid) == stored

    async def test_a_conversation_deleted_and_created_again_gets_a_new_revision(
        self, conversations: ConversationTarget
    ) -> None:
        """A copy loaded before a delete cannot be saved over the conversation created again under the same id: every save gets a new revision."""
        store, cid = conversations.store, conversations.cid("recreated")
        await saved(store, cid, turns("a"))
        before = await store.load(cid)
        assert before is not None
        await store.delete(cid)
        assert await store.load(cid) is None
        with pytest.raises(ConversationConflict):
            await store.save(before)
        again = await saved(store, cid, turns("new"))
        assert again.revision != before.revision
        before.messages.extend(turns("late"))
        with pytest.raises(ConversationConflict):
            await store.save(before)
        loaded = await store.load(cid)
        assert loaded is not None and texts(loaded.messages) == ["q:new", "a:new"]

    async def test_concurrent_saves_of_one_revision_one_wins(
        self, conversations: ConversationTarget
    ) -> None:
        """Many tasks saving copies loaded at the same revision: exactly one save succeeds, every other raises ConversationConflict, and the stored history is the winner's."""
        store, cid = conversations.store, conversations.cid("race")
        await saved(store, cid, turns("base"))
        copies = [await store.load(cid) for _ in range(RACING_TASKS)]
        for i, copy in enumerate(copies):
            assert copy is not None
            copy.messages.extend(turns(f"w{i}"))
        outcomes = await settle(*(store.save(copy) for copy in copies if copy is not None))
        assert outcomes.count("ok") == 1, outcomes
        assert outcomes.count("conflict") == RACING_TASKS - 1, outcomes
        winner = outcomes.index("ok")
        loaded = await store.load(cid)
        assert loaded is not None
        assert texts(loaded.messages) == ["q:base", "a:base", f"q:w{winner}", f"a:w{winner}"]
        await assert_whole(store, cid)

    async def test_loads_during_saves_read_whole_histories(
        self, conversations: ConversationTarget
    ) -> None:
        """While one task saves turn after turn, readers loading concurrently always get a whole history the store held (a prefix of the final one, ending on a saved turn), never a missing entry."""
        store, cid = conversations.store, conversations.cid("readers")
        await saved(store, cid, turns("t0"))
        done = asyncio.Event()
        seen: list[list[str]] = []

        async def writer() -> None:
            try:
                for i in range(1, 16):
                    loaded = await store.load(cid)
                    assert loaded is not None
                    loaded.messages.extend(turns(f"t{i}"))
                    await store.save(loaded)
            finally:
                done.set()

        async def reader() -> None:
            while not done.is_set():
                loaded = await store.load(cid)
                assert loaded is not None
                seen.append(texts(loaded.messages))
                await asyncio.sleep(0)

        await asyncio.gather(writer(), *(reader() for _ in range(6)))
        final = texts(turns(*(f"t{i}" for i in range(16))))
        for history in seen:
            assert history == final[: len(history)] and len(history) % 2 == 0 and history

    # -- scopes ---------------------------------------------------------------------------

    async def test_another_scope_is_a_conversation_the_store_does_not_have(
        self, conversations: ConversationTarget
    ) -> None:
        """A conversation saved with scope A, asked for with scope B: load and load_entries return None, save conflicts, update/branch/fork raise UserError, delete leaves it, B's list omits it; with A (or no scope) all work, and a save without scope keeps A."""
        store, cid = conversations.store, conversations.cid("scoped")
        mine, theirs = conversations.scope("a"), conversations.scope("b")
        await saved(store, cid, turns("a"), scope=mine)
        assert await store.load(cid, scope=theirs) is None
        assert await store.load_entries(cid, scope=theirs) is None
        loaded = await store.load(cid, scope=mine)
        assert loaded is not None
        loaded.messages.extend(turns("b"))
        with pytest.raises(ConversationConflict):
            await store.save(loaded, scope=theirs)
        with pytest.raises(UserError):
            await store.update(cid, title="theirs", scope=theirs)
        with pytest.raises(UserError):
            await store.branch(cid, at=0, expected_revision=loaded.revision, scope=theirs)
        with pytest.raises(UserError):
            await store.fork(cid, source_scope=theirs, new_conversation_id=conversations.cid("f"))
        await store.delete(cid, scope=theirs)
        assert [r.conversation_id for r in await store.list_conversations(scope=theirs)] == []
        record = await store.read_record(cid)
        assert record is not None and record.scope == mine and record.title is None
        assert len(await entry_ids(store, cid)) == 2
        await store.save(loaded)
        record = await store.read_record(cid)
        assert record is not None and record.scope == mine
        assert [r.conversation_id for r in await store.list_conversations(scope=mine)] == [cid]
        fork = await store.fork(cid, source_scope=mine, new_conversation_id=conversations.cid("f2"))
        forked = await store.read_record(fork.conversation_id)
        assert forked is not None and forked.scope == mine
        moved = await store.fork(cid, scope=theirs, new_conversation_id=conversations.cid("f3"))
        assert await store.load(moved.conversation_id, scope=theirs) is not None
        assert await store.load(moved.conversation_id, scope=mine) is None
        await store.delete(cid, scope=mine)
        assert await store.load(cid) is None

    # -- listing --------------------------------------------------------------------------

    async def test_list_is_newest_first_and_limited(
        self, conversations: ConversationTarget
    ) -> None:
        """``list_conversations(scope=)`` lists that scope's records, most recently saved first; a save moves one to the front; ``limit`` keeps the newest; ``limit=0`` lists none."""
        store = conversations.store
        scope, other = conversations.scope("list"), conversations.scope("other")
        ids = [conversations.cid(f"l{i}") for i in range(5)]
        for conversation_id in ids:
            await saved(store, conversation_id, turns(conversation_id), scope=scope)
            await asyncio.sleep(0.002)
        await saved(store, conversations.cid("elsewhere"), turns("x"), scope=other)
        listed = await store.list_conversations(scope=scope)
        assert [r.conversation_id for r in listed] == ids[::-1]
        assert all(isinstance(r, ConversationRecord) and r.scope == scope for r in listed)
        assert [r.updated_at for r in listed] == sorted(
            (r.updated_at for r in listed), reverse=True
        )
        oldest = await store.load(ids[0])
        assert oldest is not None
        oldest.messages.extend(turns("again"))
        await store.save(oldest)
        order = [ids[0], *ids[:0:-1]]
        assert [r.conversation_id for r in await store.list_conversations(scope=scope)] == order
        assert [
            r.conversation_id for r in await store.list_conversations(scope=scope, limit=2)
        ] == order[:2]
        assert await store.list_conversations(scope=scope, limit=0) == []
        assert [r.conversation_id for r in await store.read_records(scope=scope, limit=3)] == order[
            :3
        ]
        everyone = [r.conversation_id for r in await store.list_conversations()]
        assert set(ids) <= set(everyone)

    # -- update ---------------------------------------------------------------------------

    async def test_update_never_changes_the_revision_and_a_save_never_undoes_it(
        self, conversations: ConversationTarget
    ) -> None:
        """``update`` changes only the title or metadata passed (None clears, metadata replaced whole), returns the stored record, keeps the revision, so a copy loaded before it saves without conflict and keeps the update; an unknown conversation is a UserError."""
        store, cid = conversations.store, conversations.cid("update")
        await saved(store, cid, turns("a"))
        loaded = await store.load(cid)
        assert loaded is not None
        record = await store.update(cid, title="Trip", metadata={"model": "m1", "n": [1]})
        assert record.title == "Trip" and record.metadata == {"model": "m1", "n": [1]}
        assert record.revision == loaded.revision
        record = await store.update(cid, metadata={"model": "m2"})
        assert record.title == "Trip" and record.metadata == {"model": "m2"}
        loaded.messages.extend(turns("b"))
        await store.save(loaded)
        stored = await store.read_record(cid)
        assert stored is not None and stored.title == "Trip" and stored.metadata == {"model": "m2"}
        assert stored.revision == loaded.revision
        # A save that read the record before an update writes it after: the update stays.
        before = await store.read_record(cid)
        assert before is not None
        await store.update(cid, title="Late", metadata={"late": True})
        following = str(uuid.uuid4())
        await store.write_record(
            dataclasses.replace(before, revision=following), expected_revision=before.revision
        )
        stored = await store.read_record(cid)
        assert stored is not None and stored.title == "Late" and stored.metadata == {"late": True}
        assert stored.revision == following
        loaded.revision = stored.revision
        await store.update(cid, metadata={"model": "m2"})
        cleared = await store.update(cid, title=None)
        assert cleared.title is None and cleared.metadata == {"model": "m2"}
        assert (await store.update(cid)).revision == loaded.revision
        with pytest.raises(UserError):
            await store.update(conversations.cid("absent"), title="x")
        # A branch and a fork keep or start their own details as the record says.
        await store.update(cid, title="Kept")
        branched = await store.branch(cid, at=1, expected_revision=loaded.revision)
        after = await store.read_record(cid)
        assert after is not None and after.title == "Kept" and after.revision == branched.revision

    async def test_expected_title_updates_only_when_it_still_holds(
        self, conversations: ConversationTarget
    ) -> None:
        """``update(expected_title=)`` writes only while the title is that one (``None``: has none); otherwise ConversationConflict and nothing is written."""
        store, cid = conversations.store, conversations.cid("titled")
        await saved(store, cid, turns("a"))
        first = await store.update(cid, title="By agent", expected_title=None)
        assert first.title == "By agent"
        with pytest.raises(ConversationConflict):
            await store.update(cid, title="Agent again", expected_title=None)
        with pytest.raises(ConversationConflict):
            await store.update(cid, title="x", metadata={"a": 1}, expected_title="Wrong")
        record = await store.read_record(cid)
        assert record is not None and record.title == "By agent" and record.metadata is None
        user = await store.update(cid, title="By user", expected_title="By agent")
        assert user.title == "By user"

    # -- delete ---------------------------------------------------------------------------

    async def test_delete_releases_entries_no_record_reaches(
        self, conversations: ConversationTarget
    ) -> None:
        """A deleted conversation no longer loads or lists, and its entries no remaining record reaches (history and left branches) are released: ``read_entry`` raises LookupError."""
        store, cid = conversations.store, conversations.cid("deleted")
        scope = conversations.scope("deleted")
        await saved(store, cid, turns("a", "b"), scope=scope)
        loaded = await store.load(cid)
        assert loaded is not None
        await store.branch(cid, at=1, expected_revision=loaded.revision)
        whole = await store.load_entries(cid)
        record = await store.read_record(cid)
        assert whole is not None and record is not None
        released = {e.id for e in whole} | {
            e.id for tip in record.branches for e in await store.read_history(tip)
        }
        assert len(released) == 4
        await store.delete(cid)
        assert await store.load(cid) is None and await store.read_record(cid) is None
        assert await store.list_conversations(scope=scope) == []
        assert [e for e in released if not await is_released(store, e)] == []

    async def test_delete_never_releases_an_entry_a_fork_uses(
        self, conversations: ConversationTarget
    ) -> None:
        """Deleting a conversation keeps every entry a fork's history or left branches reach (the fork loads whole, same entry ids, and can branch back), releases the others as the forks reaching them go, and all once the last record reaching them is deleted."""
        store, cid = conversations.store, conversations.cid("forked-source")
        await saved(store, cid, turns("a", "b", "c"))
        source = await entry_ids(store, cid)
        part = conversations.cid("forked-part")
        await store.fork(cid, at=3, new_conversation_id=part)
        whole = conversations.cid("forked-whole")
        fork = await store.fork(cid, new_conversation_id=whole)
        # The whole fork rewrites its history: the source's tail is now only on its branch.
        rewritten = Conversation(
            conversation_id=whole,
            messages=[*fork.messages[:1], *turns("w")],
            revision=fork.revision,
        )
        await store.save(rewritten)
        await store.delete(cid)
        assert await entry_ids(store, part) == source[:3]
        record = await store.read_record(whole)
        assert record is not None and record.branches == [source[-1]]
        assert [e.id for e in await store.read_history(source[-1])] == source
        for entry in source:
            assert not await is_released(store, entry)
        back = await store.branch(whole, from_entry=source[-1], expected_revision=record.revision)
        assert texts(back.messages) == texts(turns("a", "b", "c"))
        await store.delete(whole)
        # Only ``part`` reaches into the source now: what it does not reach is released.
        assert await entry_ids(store, part) == source[:3]
        assert [e for e in source[3:] if not await is_released(store, e)] == []
        await store.delete(part)
        assert [e for e in source if not await is_released(store, e)] == []

    async def test_a_head_whose_entry_was_released_conflicts(
        self, conversations: ConversationTarget
    ) -> None:
        """``write_record`` (and so a fork or save) naming a head entry that neither the store nor its new entries has, because a delete released it, raises ConversationConflict and stores nothing; with the entry among its new entries it is stored."""
        store, cid = conversations.store, conversations.cid("released")
        await saved(store, cid, turns("a"))
        head = (await entry_ids(store, cid))[-1]
        await store.delete(cid)
        dangling = conversations.cid("dangling")
        with pytest.raises(ConversationConflict):
            await store.write_record(
                ConversationRecord(
                    conversation_id=dangling, head_id=head, forked_from=cid, forked_at=head
                ),
                expected_revision=None,
            )
        assert await store.read_record(dangling) is None
        entry = ConversationEntry(parent_id=None, message=turns("n")[0])
        await store.write_record(
            ConversationRecord(conversation_id=dangling, head_id=entry.id),
            new_entries=[entry],
            expected_revision=None,
        )
        assert await entry_ids(store, dangling) == [entry.id]

    async def test_primitives_check_revisions(self, conversations: ConversationTarget) -> None:
        """``write_record``, ``write_details`` and ``delete_record`` raise ConversationConflict unless the stored revision is the one expected (None: absent), and write nothing then."""
        store, cid = conversations.store, conversations.cid("primitives")
        entry = ConversationEntry(parent_id=None, message=turns("p")[0])
        record = ConversationRecord(conversation_id=cid, head_id=entry.id)
        with pytest.raises(ConversationConflict):
            await store.write_record(record, new_entries=[entry], expected_revision="never-stored")
        assert await store.read_record(cid) is None
        await store.write_record(record, new_entries=[entry], expected_revision=None)
        stored = await store.read_record(cid)
        assert stored is not None and stored.revision == record.revision
        assert await store.read_entry(entry.id) == entry
        replacement = dataclasses.replace(record, revision="r2")
        with pytest.raises(ConversationConflict):
            await store.write_record(replacement, expected_revision=None)
        with pytest.raises(ConversationConflict):
            await store.write_record(replacement, expected_revision="stale")
        with pytest.raises(ConversationConflict):
            await store.delete_record(cid, expected_revision="stale")
        try:
            with pytest.raises(ConversationConflict):
                await store.write_details(cid, {"title": "t"}, expected_revision="stale")
        except NotImplementedError:
            pass
        again = await store.read_record(cid)
        assert again is not None and again.revision == record.revision and again.title is None
        await store.delete_record(cid, expected_revision=record.revision)
        assert await store.read_record(cid) is None

    async def test_forks_and_saves_racing_a_delete_never_leave_a_dangling_history(
        self, conversations: ConversationTarget
    ) -> None:
        """Many tasks forking a conversation (at every point) and saving it while another deletes it: each fork either succeeds and loads whole, with the source's entry ids, or raises ConversationConflict/UserError; at most one save wins; the source ends deleted."""
        store = conversations.store
        rng = random.Random(58)
        for round_ in range(3):
            cid = conversations.cid(f"raced{round_}")
            await saved(store, cid, turns("a", "b", "c"))
            source = await entry_ids(store, cid)
            copies = [await store.load(cid) for _ in range(RACING_TASKS // 4)]
            forks = {conversations.cid(f"raced{round_}-f{i}"): i % 7 for i in range(RACING_TASKS)}
            work: list[Any] = [
                store.fork(cid, at=at, new_conversation_id=f) for f, at in forks.items()
            ]
            kinds = ["fork"] * len(work)
            for i, copy in enumerate(copies):
                assert copy is not None
                copy.messages.extend(turns(f"s{i}"))
                work.append(store.save(copy))
                kinds.append("save")
            where = rng.randrange(len(work))
            work.insert(where, store.delete(cid))
            kinds.insert(where, "delete")
            outcomes = await settle(*work)
            saves = [o for o, kind in zip(outcomes, kinds, strict=True) if kind == "save"]
            assert saves.count("ok") <= 1 and set(saves) <= {"ok", "conflict"}, saves
            assert await store.read_record(cid) is None
            for fork_id, at in forks.items():
                record = await store.read_record(fork_id)
                if record is None:
                    continue
                entries = await assert_whole(store, fork_id)
                assert [e.id for e in entries] == source[:at]

    # -- Pydantic AI's own example, with a real agent -------------------------------------

    async def test_docstring_example_with_an_agent_paused_and_resumed(
        self, conversations: ConversationTarget
    ) -> None:
        """Pydantic AI's ConversationStore example with a real Agent on a FunctionModel: a run pausing on a tool that needs approval is saved with its deferred requests, loaded, resumed with ``deferred_tool_results`` and saved, and a third run continues it, usage accumulated across the three runs."""
        store, conversation_id = conversations.store, conversations.cid("agent")
        agent = approval_agent()

        async def turn(prompt: str | None, **kwargs: Any) -> Any:
            conversation = await store.load(conversation_id) or Conversation(
                conversation_id=conversation_id
            )
            result = await agent.run(prompt, conversation=conversation, **kwargs)
            await store.save(result)
            return result

        first = await turn("delete notes.txt")
        assert isinstance(first.output, DeferredToolRequests)
        paused = await store.load(conversation_id)
        assert paused is not None and paused.deferred_tool_requests == first.output
        results = paused.deferred_tool_requests.build_results(approve_all=True)
        second = await turn(None, deferred_tool_results=results)
        assert second.output == "done: deleted notes.txt"
        third = await turn("thanks")
        assert third.output == "noted: thanks"
        final = await store.load(conversation_id)
        assert final is not None
        assert_accumulated(final, runs=3)

    async def test_docstring_example_resumed_in_another_process(
        self, conversations: ConversationTarget
    ) -> None:
        """The docstring example across processes: a run paused on an approval is saved here, loaded in a new process, resumed there with ``deferred_tool_results`` and saved, and a third run here continues it, usage accumulated across the three runs."""
        target = conversations.require_processes()
        store, conversation_id = conversations.store, conversations.cid("agent-process")
        agent = approval_agent()
        conversation = await store.load(conversation_id) or Conversation(
            conversation_id=conversation_id
        )
        first = await agent.run("delete notes.txt", conversation=conversation)
        await store.save(first)
        assert isinstance(first.output, DeferredToolRequests)
        (line,) = await lines_of(await spawn("resume", target, conversation_id))
        assert line == {"output": "done: deleted notes.txt", "requests": 2, "pending": False}
        conversation = await store.load(conversation_id) or Conversation(
            conversation_id=conversation_id
        )
        assert conversation.deferred_tool_requests is None
        third = await agent.run("thanks", conversation=conversation)
        await store.save(third)
        final = await store.load(conversation_id)
        assert final is not None
        assert_accumulated(final, runs=3)

    # -- across processes -----------------------------------------------------------------

    async def test_saves_from_processes_at_one_revision_one_wins(
        self, conversations: ConversationTarget
    ) -> None:
        """Processes released together by a barrier, each saving a copy loaded at the same revision: exactly one wins, the others raise ConversationConflict, and the stored history is the winner's."""
        target = conversations.require_processes()
        store, cid = conversations.store, conversations.cid("process-race")
        await saved(store, cid, turns("base"))
        with tempfile.TemporaryDirectory() as barrier:
            procs = [
                await spawn(
                    "save-race", target, cid, f"p{i}", "--barrier", barrier, str(RACING_PROCESSES)
                )
                for i in range(RACING_PROCESSES)
            ]
            lines = [line for proc in procs for line in await lines_of(proc)]
        outcomes = {line["tag"]: line["outcome"] for line in lines}
        winners = [tag for tag, outcome in outcomes.items() if outcome == "ok"]
        assert (
            len(winners) == 1
            and sorted(outcomes.values()).count("conflict") == RACING_PROCESSES - 1
        ), outcomes
        loaded = await store.load(cid)
        assert loaded is not None
        assert texts(loaded.messages) == ["q:base", "a:base", f"q:{winners[0]}", f"a:{winners[0]}"]

    async def test_processes_forking_and_saving_while_another_deletes(
        self, conversations: ConversationTarget
    ) -> None:
        """Processes forking a conversation and saving it, released together with this one deleting it: every fork that succeeded loads whole with the source's entry ids, every other raised ConversationConflict or UserError, at most one save won, and the source is gone."""
        target = conversations.require_processes()
        store, cid = conversations.store, conversations.cid("process-delete")
        await saved(store, cid, turns("a", "b", "c", "d"))
        source = await entry_ids(store, cid)
        parties = RACING_PROCESSES + 1
        with tempfile.TemporaryDirectory() as barrier:
            prefixes = [conversations.cid(f"pf{p}-") for p in range(RACING_PROCESSES)]
            procs = [
                await spawn(
                    "race",
                    target,
                    cid,
                    prefix,
                    str(FORKS_PER_PROCESS),
                    "--barrier",
                    barrier,
                    str(parties),
                )
                for prefix in prefixes
            ]
            from .workers import file_barrier

            await asyncio.wait_for(file_barrier(barrier, str(parties)), REAL_TIME_LIMIT_SECONDS * 2)
            await store.delete(cid)
            lines = [line for proc in procs for line in await lines_of(proc)]
        forks = [line for line in lines if "fork" in line]
        conversations.created.update(line["fork"] for line in forks)
        assert len(forks) == RACING_PROCESSES * FORKS_PER_PROCESS
        assert {line["outcome"] for line in forks} <= {"ok", "conflict", "missing"}, forks
        saves = [line["save"] for line in lines if "save" in line]
        assert saves.count("ok") <= 1 and set(saves) <= {"ok", "conflict", "missing"}, saves
        for line in forks:
            record = await store.read_record(line["fork"])
            assert (record is not None) == (line["outcome"] == "ok"), line
            if record is not None:
                entries = await assert_whole(store, line["fork"])
                assert [e.id for e in entries] == source[: line["at"]]
        # The delete ran after every save it raced (it retries on a new revision): gone.
        assert await store.load(cid) is None

    # -- agent-stores' own rules (beyond Pydantic AI's ABC) --------------------------------

    async def test_agent_stores_undecodable_record_is_a_typed_error(
        self, conversations: ConversationTarget
    ) -> None:
        """agent-stores only (the ABC defines no damage): a record that does not decode makes load, load_entries and save raise a CorruptRecordError naming the conversation, is never overwritten, and hides no other conversation of its scope from the list."""
        await self._damaged(conversations, lambda raw, other: b"\x00 not a record {")

    async def test_agent_stores_record_of_another_conversation_is_a_typed_error(
        self, conversations: ConversationTarget
    ) -> None:
        """agent-stores only: a record stored under one conversation id that is another conversation's (copied over it) is a CorruptRecordError naming the conversation asked for, never that other conversation's history; nothing is overwritten."""
        await self._damaged(conversations, lambda raw, other: other)

    async def test_agent_stores_record_of_a_newer_format_is_refused(
        self, conversations: ConversationTarget
    ) -> None:
        """agent-stores only: a record written in a newer format than this code reads is a CorruptRecordError naming the conversation and the format, never read as if it were the current one; nothing is overwritten."""

        def newer(raw: bytes, other: bytes) -> bytes:
            body = json.loads(raw)
            body["f"] = int(body["f"]) + 1
            return json.dumps(body).encode()

        await self._damaged(conversations, newer)

    async def _damaged(self, conversations: ConversationTarget, damage: Any) -> None:
        """Damage a conversation's stored record with ``damage(raw, other_raw)`` (through the
        documented layout, agent_stores/conversations/layout.py) and check what each call does."""
        from agent_stores import CorruptRecordError

        kv, scope_of, key_of = require_agent_stores_layout(conversations)
        store = conversations.store
        scope = conversations.scope("damaged")
        cid, other = conversations.cid("damaged"), conversations.cid("intact")
        await saved(store, cid, turns("mine"), scope=scope)
        await saved(store, other, turns("theirs"), scope=scope)
        entry = await kv.get(scope_of(scope), key_of(cid))
        theirs = await kv.get(scope_of(scope), key_of(other))
        assert entry is not None and theirs is not None, "record not where the layout says"
        version = await kv.replace(
            scope_of(scope),
            key_of(cid),
            damage(entry.value, theirs.value),
            expected_version=entry.version,
        )
        try:
            for call in (
                lambda: store.load(cid),
                lambda: store.load_entries(cid),
                lambda: store.save(Conversation(conversation_id=cid, messages=turns("over"))),
            ):
                with pytest.raises((CorruptRecordError, ConversationConflict)) as caught:
                    await call()
                if isinstance(caught.value, CorruptRecordError):
                    assert cid in str(caught.value), caught.value
            with pytest.raises(CorruptRecordError) as caught:
                await store.load(cid)
            assert cid in str(caught.value)
            after = await kv.get(scope_of(scope), key_of(cid))
            assert after is not None and after.version == version, (
                "the damaged record was overwritten"
            )
            assert [r.conversation_id for r in await store.list_conversations(scope=scope)] == [
                other
            ]
            intact = await store.load(other)
            assert intact is not None and texts(intact.messages) == ["q:theirs", "a:theirs"]
        finally:
            # Put it back, so the test's cleanup deletes it as any other.
            await kv.replace(scope_of(scope), key_of(cid), entry.value, expected_version=version)


def require_agent_stores_layout(target: ConversationTarget) -> tuple[Any, Any, Any]:
    """``(kv, owner scope of a scope, record key of a conversation id)`` of one of our stores;
    skips the calling test (a declared capability) for any other store."""
    if not target.ours:
        pytest.skip(
            f"{CAPABILITY_SKIP} agent_stores_store=False ({type(target.store).__name__}): a rule "
            "agent-stores adds to Pydantic AI's ConversationStore, checked on its own stores only"
        )
    from agent_stores.conversations.layout import kv_name

    store: Any = target.store
    layout = store.layout
    return store.kv, layout.owner_scope, lambda cid: layout.record_key(kv_name(cid))


def assert_accumulated(conversation: Conversation, *, runs: int) -> None:
    """The conversation's usage is the sum of its model responses' and counts every run's request and tool call."""
    responses = [m for m in conversation.messages if isinstance(m, ModelResponse)]
    assert len(responses) == runs
    assert conversation.usage.requests == runs
    assert conversation.usage.tool_calls == 1
    assert conversation.usage.input_tokens == sum(r.usage.input_tokens for r in responses)
    assert conversation.usage.output_tokens == sum(r.usage.output_tokens for r in responses)
    assert conversation.deferred_tool_requests is None


class NamedFactory:
    """A store factory that knows how a worker process opens the same store (and, for our
    stores, the URL); anything else is the wrapped factory's (``shared_across_processes``)."""

    def __init__(
        self, inner: StoreFactory, *, worker_target: str, store_url: str | None = None
    ) -> None:
        self.inner = inner
        self.contract_worker_target = worker_target
        self.contract_store_url = store_url

    def __call__(self) -> Any:
        return self.inner()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def worker_target_of(factory: StoreFactory) -> str | None:
    """How a worker process opens the same store: set by the default factory, else the
    factory's import path when it has one."""
    declared = getattr(factory, "contract_worker_target", None)
    if declared:
        return str(declared)
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if module and name and "<" not in name and module != "__main__":
        return f"factory={module}:{name}"
    return None


async def not_shared_reason(factory: StoreFactory, store: ConversationStore) -> str | None:
    """Why the store's data is not shared with other processes (None: it is)."""
    url = getattr(factory, "contract_store_url", None)
    if url is not None:
        from agent_stores import open_kv

        async with AsyncExitStack() as stack:
            kv = open_kv(url)
            stack.push_async_callback(kv.aclose)
            if not kv.capabilities.shared_across_processes:
                return f"{kv.backend_name} is process-local: a second process cannot share its data"
            return None
    declared = getattr(store, "shared_across_processes", None)
    if declared is None:
        declared = getattr(factory, "shared_across_processes", False)
    if declared:
        return None
    return (
        f"{type(store).__name__} does not declare shared_across_processes = True (on the store "
        "or its factory): a second process would open a store of its own"
    )
