"""The KV ConversationStore: request counts, bytes, damage and formats (the rules of the ABC
themselves are the contract suite's conversation part, run on every backend)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import agent_stores
import pytest
from agent_stores.conversations import (
    ConversationDamagedError,
    ConversationFormatError,
    KVConversationStore,
)
from agent_stores.conversations.layout import kv_name
from agent_stores.kv.counting import CountingKV
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


def _reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(parts=[TextPart(f"reply to {len(messages)} messages")])


AGENT = Agent(FunctionModel(_reply))


def _turns(count: int) -> list[ModelMessage]:
    messages: list[ModelMessage] = []
    for index in range(count // 2):
        messages.append(ModelRequest(parts=[UserPromptPart(f"question {index} " + "x" * 200)]))
        messages.append(ModelResponse(parts=[TextPart(f"answer {index} " + "y" * 200)]))
    return messages


@pytest.fixture(params=["memory", "sqlite"])
async def counted(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[KVConversationStore]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'c.db'}"
    inner = agent_stores.open_kv(url)
    async with inner:
        kv = CountingKV(inner)
        async with KVConversationStore(kv, scope_prefix=f"t{uuid.uuid4().hex}:") as store:
            yield store


def _twin(store: KVConversationStore) -> KVConversationStore:
    """The same database seen from another process: nothing cached."""
    return KVConversationStore(store.kv, scope_prefix=store.layout.prefix)


def _calls(store: KVConversationStore) -> int:
    kv = store.kv
    assert isinstance(kv, CountingKV)
    return kv.total_calls


def _reset(store: KVConversationStore) -> None:
    kv = store.kv
    assert isinstance(kv, CountingKV)
    kv.reset_counts()


async def test_turn_costs_two_requests_at_most_and_load_three(counted: KVConversationStore) -> None:
    await counted.save(Conversation(conversation_id="long", messages=_turns(1000)), scope="u")
    cold = _twin(counted)  # another process: nothing cached
    _reset(counted)
    conversation = await cold.load("long", scope="u")
    assert conversation is not None and len(conversation.messages) == 1000
    assert _calls(counted) <= 3
    result = await AGENT.run("one more", conversation=conversation)
    _reset(counted)
    await cold.save(result, scope="u")
    assert _calls(counted) <= 2
    _reset(counted)
    listed = await cold.list_conversations(scope="u", limit=20)
    assert [record.conversation_id for record in listed] == ["long"]
    assert _calls(counted) <= 2


async def test_fork_and_save_bytes_are_flat_in_the_history(counted: KVConversationStore) -> None:
    kv = counted.kv
    assert isinstance(kv, CountingKV)
    written: dict[int, tuple[int, int]] = {}
    for length in (10, 1000):
        source = f"h{length}"
        await counted.save(Conversation(conversation_id=source, messages=_turns(length)))
        loaded = await counted.load(source)
        assert loaded is not None
        result = await AGENT.run("next", conversation=loaded)
        kv.reset_counts()
        await counted.save(result)
        save_bytes = kv.bytes_written
        kv.reset_counts()
        await counted.fork(source, at=length // 2, new_conversation_id=f"fork-{length}")
        written[length] = (save_bytes, kv.bytes_written)
    # The same turn writes the same bytes whatever came before; a fork writes a record and a pin.
    assert abs(written[1000][0] - written[10][0]) < 200
    assert abs(written[1000][1] - written[10][1]) < 100


async def test_a_damaged_record_is_a_typed_error_naming_the_conversation(
    counted: KVConversationStore,
) -> None:
    await counted.save(Conversation(conversation_id="bad", messages=_turns(2)), scope="u")
    owner = counted.layout.owner_scope("u")
    key = counted.layout.record_key(kv_name("bad"))
    entry = await counted.kv.get(owner, key)
    assert entry is not None
    await counted.kv.replace(owner, key, b"{not json", expected_version=entry.version)
    fresh = _twin(counted)
    with pytest.raises(ConversationDamagedError, match="'bad'") as raised:
        await fresh.load("bad")
    assert raised.value.code == agent_stores.ErrorCode.RECORD_CORRUPTED
    with pytest.raises(ConversationDamagedError):
        await fresh.save(Conversation(conversation_id="bad", messages=_turns(4)))
    stored = await counted.kv.get(owner, key)
    assert stored is not None and stored.value == b"{not json"  # nothing overwritten
    # The others still list.
    await counted.save(Conversation(conversation_id="good", messages=_turns(2)), scope="u")
    assert [r.conversation_id for r in await fresh.list_conversations(scope="u")] == ["good"]


async def test_a_record_of_a_newer_format_is_refused(counted: KVConversationStore) -> None:
    await counted.save(Conversation(conversation_id="new", messages=_turns(2)))
    owner = counted.layout.owner_scope(None)
    key = counted.layout.record_key(kv_name("new"))
    entry = await counted.kv.get(owner, key)
    assert entry is not None
    body = json.loads(entry.value)
    body["f"] = 99
    await counted.kv.replace(owner, key, json.dumps(body).encode(), expected_version=entry.version)
    with pytest.raises(ConversationFormatError, match="format 99"):
        await _twin(counted).load("new")


async def test_a_foreign_record_under_the_id_is_damage_not_data(
    counted: KVConversationStore,
) -> None:
    await counted.save(Conversation(conversation_id="a", messages=_turns(2)))
    owner = counted.layout.owner_scope(None)
    entry = await counted.kv.get(owner, counted.layout.record_key("a"))
    assert entry is not None
    await counted.kv.create(owner, counted.layout.record_key("b"), entry.value)
    await counted.kv.create(counted.layout.pointer_scope("b"), "p", owner.encode())
    with pytest.raises(ConversationDamagedError, match="'b'"):
        await _twin(counted).load("b")


async def test_long_and_odd_ids_and_scopes_are_stored(counted: KVConversationStore) -> None:
    conversation_id = "c/" + "é" * 400
    scope = "user\x01" + "s" * 600
    await counted.save(
        Conversation(conversation_id=conversation_id, messages=_turns(4)), scope=scope
    )
    loaded = await _twin(counted).load(conversation_id, scope=scope)
    assert loaded is not None and len(loaded.messages) == 4
    listed = await counted.list_conversations(scope=scope)
    assert [r.conversation_id for r in listed] == [conversation_id]


async def test_an_oversized_turn_is_split_across_values(tmp_path: Path) -> None:
    async with agent_stores.open_conversations(
        "memory://?max_value_bytes=4096", scope_prefix=f"t{uuid.uuid4().hex}:"
    ) as store:
        big = [ModelRequest(parts=[UserPromptPart("z" * 50_000)])]
        await store.save(Conversation(conversation_id="big", messages=big))
        loaded = await _twin(store).load("big")
        assert loaded is not None and loaded.messages == big


async def test_a_deleted_source_keeps_what_its_fork_uses_and_releases_the_rest(
    counted: KVConversationStore,
) -> None:
    await counted.save(Conversation(conversation_id="src", messages=_turns(4)))
    loaded = await counted.load("src")
    assert loaded is not None
    result = await AGENT.run("later", conversation=loaded)
    await counted.save(result)  # a second segment, after the fork point
    fork = await counted.fork("src", at=4, new_conversation_id="fork")
    late_ids = [e.id for e in (await counted.load_entries("src") or [])[4:]]
    await counted.delete("src")
    assert await counted.load("src") is None
    again = await _twin(counted).load("fork")
    assert again is not None and again.messages == fork.messages
    fresh = _twin(counted)
    for entry_id in late_ids:
        with pytest.raises(KeyError):
            await fresh.read_entry(entry_id)
    await counted.delete("fork")
    assert [s async for s in counted.kv.iter_scopes(prefix=counted.layout.owner_prefix)] == []


async def test_a_fork_of_a_deleted_source_conflicts(counted: KVConversationStore) -> None:
    await counted.save(Conversation(conversation_id="s", messages=_turns(4)))
    stale = _twin(counted)
    assert await stale.load("s") is not None  # its histories are cached now
    await counted.delete("s")
    record = await stale.read_record("s")
    assert record is None
    with pytest.raises(Exception, match="not in the store"):
        await stale.fork("s", at=2)


async def test_the_same_id_created_twice_at_once_gives_one_conversation(
    counted: KVConversationStore,
) -> None:
    import asyncio

    stores = [_twin(counted) for _ in range(8)]
    outcomes = await asyncio.gather(
        *(
            store.save(Conversation(conversation_id="race", messages=_turns(2)), scope=f"s{i % 2}")
            for i, store in enumerate(stores)
        ),
        return_exceptions=True,
    )
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
    assert all(
        isinstance(o, ConversationConflict) for o in outcomes if isinstance(o, BaseException)
    )


async def test_doctor_finds_and_quarantines_damaged_conversations(
    counted: KVConversationStore,
) -> None:
    from agent_stores.conversations import ConversationEntryMissingError
    from agent_stores.doctor import scan

    prefix = counted.layout.prefix
    await counted.save(Conversation(conversation_id="fine", messages=_turns(4)), scope="u")
    await counted.save(Conversation(conversation_id="torn", messages=_turns(4)), scope="u")
    await counted.save(Conversation(conversation_id="garbled", messages=_turns(2)), scope="u")
    owner = counted.layout.owner_scope("u")
    keys = [item.key async for item in counted.kv.iter_scan(owner, prefix="e/torn/", values=False)]
    assert len(keys) == 1
    entry = await counted.kv.get(owner, keys[0])
    assert entry is not None
    await counted.kv.delete(owner, keys[0], expected_version=entry.version)
    record = await counted.kv.get(owner, "r/garbled")
    assert record is not None
    await counted.kv.replace(owner, "r/garbled", b"\x00junk", expected_version=record.version)

    with pytest.raises(ConversationEntryMissingError, match="missing"):
        await _twin(counted).load("torn")
    report = await scan(counted.kv, stores=["conversations"], conversation_prefix=prefix)
    assert report.scanned["conversations"] == 1
    assert sorted((f.key, f.kind) for f in report.findings) == [
        ("r/garbled", "undecodable"),
        ("r/torn", "missing-chunk"),
    ]
    repaired = await scan(
        counted.kv, stores=["conversations"], conversation_prefix=prefix, repair=True
    )
    assert repaired.healthy
    fresh = _twin(counted)
    assert await fresh.load("torn") is None and await fresh.load("garbled") is None
    fine = await fresh.load("fine")
    assert fine is not None and len(fine.messages) == 4
    assert (await scan(counted.kv, stores=["conversations"], conversation_prefix=prefix)).healthy


async def test_erase_subject_deletes_its_conversations_and_keeps_what_others_forked(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'erase.db'}"
    async with agent_stores.connect(url) as connection:
        store = connection.conversations()
        for name in ("a", "b"):
            await store.save(Conversation(conversation_id=name, messages=_turns(4)), scope="alice")
        await store.save(Conversation(conversation_id="c", messages=_turns(2)), scope="bob")
        await store.fork("b", at=2, new_conversation_id="bob-fork", scope="bob")
        report = await connection.erase_subject("alice")
        assert report.complete and report.conversations == ("a", "b")
        assert report.kept_for_forks == 1
        assert report.as_dict()["conversations"] == ["a", "b"]
        fresh = connection.conversations()
        assert await fresh.load("a") is None and await fresh.load("b") is None
        assert await fresh.list_conversations(scope="alice") == []
        forked = await fresh.load("bob-fork")
        assert forked is not None and len(forked.messages) == 2
        assert await connection.kv.get(fresh.layout.pointer_scope("a"), "p") is None
        again = await connection.erase_subject("alice")
        assert again.complete and again.conversations == ()


async def test_retention_deletes_conversations_not_saved_for_the_duration(
    counted: KVConversationStore,
) -> None:
    from agent_stores.retention import RetentionPolicy, apply_retention

    await counted.save(Conversation(conversation_id="old", messages=_turns(2)))
    await counted.save(Conversation(conversation_id="recent", messages=_turns(2)))
    policy = RetentionPolicy.parse("conversations-idle=1h")
    assert policy.conversations_idle_seconds == 3600 and not policy.empty
    kept = await apply_retention(policy, conversations=counted)
    assert kept.conversations is not None and kept.conversations.removed == ()
    # "old" was last saved two hours ago.
    owner = counted.layout.owner_scope(None)
    entry = await counted.kv.get(owner, "r/old")
    assert entry is not None
    body = json.loads(entry.value)
    body["updated_at"] = (datetime.now(UTC) - timedelta(hours=2)).isoformat()
    await counted.kv.replace(
        owner, "r/old", json.dumps(body).encode(), expected_version=entry.version
    )
    purged = await apply_retention(policy, conversations=_twin(counted))
    assert purged.conversations is not None
    assert purged.conversations.removed == ("old",) and purged.conversations.scanned == 2
    assert await _twin(counted).load("old") is None
    assert await _twin(counted).load("recent") is not None


async def test_copy_carries_conversations_and_recuts_large_segments(tmp_path: Path) -> None:
    from agent_stores.transfer import Transfer

    big = [ModelRequest(parts=[UserPromptPart("z" * 30_000)]), *_turns(10)]
    async with (
        agent_stores.open_kv(f"sqlite:///{tmp_path / 'src.db'}") as src,
        agent_stores.open_kv(f"sqlite:///{tmp_path / 'dst.db'}?max_value_bytes=8192") as dst,
    ):
        source = KVConversationStore(src)
        await source.save(Conversation(conversation_id="big", messages=big), scope="u")
        await source.fork("big", at=5, new_conversation_id="fork", scope="v")
        transfer = Transfer(src, dst, kinds=["conversations"])
        report = await transfer.copy()
        assert report.ok, report
        assert (await transfer.verify()).ok
        copied = KVConversationStore(dst)
        loaded = await copied.load("big", scope="u")
        assert loaded is not None and loaded.messages == big
        fork = await copied.load("fork")
        assert fork is not None and fork.messages == big[:5]
        assert [r.conversation_id for r in await copied.list_conversations(scope="u")] == ["big"]


async def test_conversations_of_another_store_are_copied_in_whole(tmp_path: Path) -> None:
    from agent_stores.conversations.copy_in import copy_conversations
    from pydantic_ai.conversation_store import InMemoryConversationStore

    theirs = InMemoryConversationStore()
    await theirs.save(Conversation(conversation_id="a", messages=_turns(6)), scope="u")
    loaded = await theirs.load("a")
    assert loaded is not None
    await theirs.save(await AGENT.run("next", conversation=loaded))
    await theirs.update("a", title="A", metadata={"model": "m"})
    loaded = await theirs.load("a")
    assert loaded is not None
    branched = await theirs.branch("a", at=2, expected_revision=loaded.revision)
    await theirs.save(await AGENT.run("other", conversation=branched))
    await theirs.fork("a", at=4, new_conversation_id="a-fork", scope="w")
    async with agent_stores.open_conversations(f"sqlite:///{tmp_path / 'in.db'}") as ours:
        report = await copy_conversations(theirs, ours)
        assert report.ok and sorted(report.copied) == ["a", "a-fork"]
        again = await copy_conversations(theirs, ours)
        assert again.copied == [] and sorted(again.present) == ["a", "a-fork"]
        fresh = _twin(ours)
        for conversation_id in ("a", "a-fork"):
            mine = await fresh.read_record(conversation_id)
            original = await theirs.read_record(conversation_id)
            assert mine == original  # revision, usage, scope, title, branches, times
            assert await fresh.load_entries(conversation_id) == await theirs.load_entries(
                conversation_id
            )
        record = await fresh.read_record("a")
        assert record is not None and record.branches
        assert await fresh.read_history(record.branches[0]) == await theirs.read_history(
            record.branches[0]
        )
        # The fork's entries were written once, as its source's.
        fork_owner = fresh.layout.owner_scope("w")
        assert [i.key async for i in fresh.kv.iter_scan(fork_owner, prefix="e/")] == []


async def test_a_save_too_large_for_one_commit_writes_entries_first(
    counted: KVConversationStore,
) -> None:
    """A long history saved at once (about 3 MB) goes in several writes, the record last."""
    kv = counted.kv
    assert isinstance(kv, CountingKV)
    history = [ModelRequest(parts=[UserPromptPart(f"{i} " + "w" * 300_000)]) for i in range(10)]
    kv.reset_counts()
    await counted.save(Conversation(conversation_id="huge", messages=history))
    assert kv.calls["commit"] == 0 and kv.calls["create"] >= 2
    loaded = await _twin(counted).load("huge")
    assert loaded is not None and loaded.messages == history
