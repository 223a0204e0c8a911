"""Forks and rewinds: the record layout, turn boundaries, and the CLI commands.

The behaviours (every backend) are in the contract: ``agent_stores_contract.forks``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agent_stores import open_sessions
from agent_stores.cli import cli
from agent_stores.sessions import TurnOutOfRangeError
from agent_stores.sessions.forks import (
    cut_at_turn,
    decode_branch,
    decode_pin,
    encode_branch,
    encode_pin,
    pin_key,
    turn_starts,
)
from agent_stores.sessions.records import (
    ChunkRef,
    RecordError,
    StateHeader,
    decode_state,
    encode_state,
)
from click.testing import CliRunner
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)


def exchange(tag: str) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f"q:{tag}")]),
        ModelResponse(parts=[ToolCallPart("look", {}, tool_call_id=f"c-{tag}")]),
        ModelRequest(parts=[ToolReturnPart("look", "ok", tool_call_id=f"c-{tag}")]),
        ModelResponse(parts=[TextPart(f"a:{tag}")]),
    ]


def test_a_shared_chunk_reference_keeps_its_home_and_an_own_one_stays_seven_fields() -> None:
    own = ChunkRef("h/aa", 2, 10, 1, 0, False, None)
    shared = ChunkRef("h/bb", 3, 12, 1, 0, True, 5.0, home="session:src")
    header = StateHeader(
        chunks=(own, shared),
        lineage={"source": "src", "count": 5, "turn": None, "at": 1.0},
        open_turn={"fence": 3, "count": 5},
    )
    value = encode_state(header, b"[]")
    doc = json.loads(value.partition(b"\n")[0])
    assert [len(c) for c in doc["chunks"]] == [7, 8]
    decoded, _ = decode_state(value)
    assert decoded.chunks == (own, shared)
    assert decoded.lineage == header.lineage and decoded.open_turn == header.open_turn


def test_turns_start_at_user_prompts_and_cut_before_them() -> None:
    history = [*exchange("a"), *exchange("b"), *exchange("c")]
    assert turn_starts(history) == [0, 4, 8]
    assert [cut_at_turn(history, k, "s") for k in range(4)] == [0, 4, 8, 12]
    with pytest.raises(TurnOutOfRangeError, match="has 3 turns"):
        cut_at_turn(history, 4, "s")
    with pytest.raises(TurnOutOfRangeError, match=">= 0"):
        cut_at_turn(history, -1, "s")
    with pytest.raises(ValueError, match="integer"):
        cut_at_turn(history, True, "s")


def test_pins_and_branches_round_trip_and_refuse_garbage() -> None:
    assert decode_pin(encode_pin("session:f", ["h/b", "h/a", "h/a"])) == (
        "session:f",
        frozenset({"h/a", "h/b"}),
    )
    assert pin_key("session:f") != pin_key("session:g") and pin_key("x").startswith("r/p/")
    with pytest.raises(RecordError):
        decode_pin(b"{}")
    header = StateHeader(chunks=(ChunkRef("h/aa", 2, 10, 1, 0),), tail_count=0)
    info, kept, tail = decode_branch("b1", encode_branch(header, b"[]", at=2.5, reason="rewind"))
    assert (info.branch_id, info.created_at, info.message_count, info.reason) == (
        "b1",
        2.5,
        2,
        "rewind",
    )
    assert kept.chunks == header.chunks and tail == b"[]"
    with pytest.raises(RecordError):
        decode_branch("b1", b"no header line")


async def _three_turns(url: str) -> None:
    async with open_sessions(url) as store:
        for tag in "abc":
            async with store.turn("chat") as session:
                session.replace([*session.messages, *exchange(tag)])


async def _history_length(url: str, session_id: str) -> int | None:
    async with open_sessions(url) as store:
        found = await store.read_messages(session_id)
    return None if found is None else len(found)


def test_cli_forks_rewinds_lists_and_restores(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    asyncio.run(_three_turns(url))
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, ["sessions", url, *args])
        assert result.exit_code == 0, result.output
        return result.output

    assert "forked chat into alt: 8 messages" in run("fork", "chat", "alt", "--at-turn", "2")
    assert "forked from  chat (its first 8 messages)" in run("show", "alt")
    assert "forked from chat" in run("list", "--prefix", "alt")
    report = json.loads(run("fork", "chat", "all", "--json"))
    assert report["message_count"] == 12 and not report["copied"]
    assert "rewound chat to turn 1" in run("rewind", "chat", "1")
    branches = [json.loads(line) for line in run("branches", "chat", "--json").splitlines()]
    assert [(b["message_count"], b["reason"]) for b in branches] == [(12, "rewind")]
    assert "restored branch" in run("restore", "chat", branches[0]["branch_id"])
    assert asyncio.run(_history_length(url, "chat")) == 12
    failed = runner.invoke(cli, ["sessions", url, "fork", "chat", "all"])
    assert failed.exit_code == 1 and "already exists" in failed.output
    failed = runner.invoke(cli, ["sessions", url, "fork", "chat", "x", "--at-turn", "9"])
    assert failed.exit_code == 1 and "past the end" in failed.output
    failed = runner.invoke(cli, ["sessions", url, "restore", "chat", "nope"])
    assert failed.exit_code == 1 and "no branch" in failed.output


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/late.db"])
async def test_a_late_cleanup_keeps_chunks_a_restore_brought_back(url: str, tmp_path: Path) -> None:
    """A restore lets go of the chunks it replaced in the background; when another client
    restores them before that cleanup runs (a slow process, a starved event loop), the
    cleanup finds them in the state again and deletes nothing."""
    store = open_sessions(url.format(tmp=tmp_path), tail_bytes=300, fanout=2)
    try:
        sid = "late"
        for i in range(5):
            async with store.turn(sid) as s:
                s.replace([*s.messages, *exchange(f"t{i}")])
        first = await store.rewind(sid, 2)
        async with store.turn(sid) as s:
            s.replace([*s.messages, *exchange("other")])
        scope = store.storage.scope_for(sid)
        entry = await store.kv.get(scope, "state")
        assert entry is not None
        replaced = decode_state(entry.value)[0].chunks
        assert replaced, "the alternative history is chunked"
        second = await store.restore(sid, first.branch_id)
        await store.restore(sid, second.branch_id)  # the replaced chunks are back
        # The first restore's cleanup, had it run only now:
        await store.storage.let_go(sid, scope, replaced)
        info = await store.inspect(sid)
        assert info is not None and info.problem is None
        got = await store.read_messages(sid)
        assert got is not None and len(got) == 4 * 2 + 4
    finally:
        await store.aclose()


@pytest.mark.parametrize("url", ["memory://", "sqlite:///{tmp}/late-pin.db"])
async def test_a_late_pin_cleanup_never_brings_back_a_pin_its_session_dropped(
    url: str, tmp_path: Path
) -> None:
    """A turn of a fork lets go of the shared chunks it merged away in the background: it
    reads the fork's state, then shrinks the fork's pin in the chunks' home. When the fork
    is reset between the two (another client, a slow process), the reset deletes the pin;
    the late cleanup must not write it again from what it read before (a pin that outlives
    its session keeps the home's chunks for ever)."""
    store = open_sessions(url.format(tmp=tmp_path), tail_bytes=300, fanout=2)
    try:
        for i in range(5):
            async with store.turn("root") as s:
                s.replace([*s.messages, *exchange(f"t{i}")])
        await store.fork("root", "fork")
        root, fork = store.storage.scope_for("root"), store.storage.scope_for("fork")
        entry = await store.kv.get(fork, "state")
        assert entry is not None
        shared = [r for r in decode_state(entry.value)[0].chunks if r.home == root]
        assert shared, "the fork shares the root's chunks"
        assert await store.kv.get(root, pin_key(fork)) is not None

        reached, go_on = asyncio.Event(), asyncio.Event()
        kv_get = store.kv.get

        async def get_pausing_once(scope: str, key: str) -> Any:
            if (scope, key) == (root, pin_key(fork)) and not reached.is_set():
                reached.set()  # the cleanup has read the fork's state: pause it here
                await go_on.wait()
            return await kv_get(scope, key)

        store.kv.get = get_pausing_once  # type: ignore[method-assign]
        late = asyncio.create_task(store.storage.let_go("fork", fork, shared[:1]))
        await reached.wait()
        assert await store.reset("fork")
        await store.storage.drain()
        assert await kv_get(root, pin_key(fork)) is None, "the reset dropped the pin"
        go_on.set()
        await late
        await store.storage.drain()
        assert await kv_get(root, pin_key(fork)) is None, "the late cleanup wrote it again"
        got = await store.read_messages("root")
        assert got is not None and len(got) == 5 * 4
    finally:
        await store.aclose()
