"""The session catalog where the contract cannot reach: failed index writes, retried saves,
the stored header field, the CLI listing (on SQLite and memory, real stores)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from agent_stores import ConfigError, open_kv, open_sessions
from agent_stores.cli import cli
from agent_stores.errors import BackendUnavailableError
from agent_stores.kv.base import Operation
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import InvalidSessionError, KVSessionPort, SessionStore
from agent_stores.sessions.catalog import (
    MAX_METADATA_BYTES,
    decode_cursor,
    encode_cursor,
    next_activity,
    preview_of,
    recent_key,
)
from agent_stores.sessions.records import STATE_KEY, decode_state
from click.testing import CliRunner
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart


def exchange(text: str) -> list[ModelRequest | ModelResponse]:
    return [
        ModelRequest(parts=[UserPromptPart(content=f"q {text}")]),
        ModelResponse(parts=[TextPart(content=f"a {text}")]),
    ]


class FailingIndexKV(CountingKV):
    """Fails every commit on an owner's index scope while ``failing`` is set."""

    def __init__(self, inner: object) -> None:
        super().__init__(inner, native_ports=False)  # type: ignore[arg-type]
        self.failing = False
        self.index_commits = 0

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        if scope.startswith("session-owner:"):
            self.index_commits += 1
            if self.failing:
                raise BackendUnavailableError(detail="injected: the index commit failed")
        return await super()._commit(scope, ops, now)


async def test_a_failed_index_write_keeps_the_turn_and_the_next_turn_repairs_it() -> None:
    """The turn's history is saved although its owner's index write failed; the session is
    not listed until its next turn, which writes the index (nothing stale left behind)."""
    kv = FailingIndexKV(open_kv("memory://catalog-fail"))
    async with SessionStore(kv, owns_kv=True, port=KVSessionPort(kv)) as store:
        async with store.turn("s1", owner="alice") as session:
            session.replace(exchange("one"))
        kv.failing = True
        async with store.turn("s1") as session:
            session.replace([*session.messages, *exchange("two")])
        info = await store.inspect("s1")
        assert info is not None and info.message_count == 4 and info.owner == "alice"
        listed = (await store.list_owner_sessions("alice")).sessions
        assert [s.message_count for s in listed] == [2]  # the last indexed state
        kv.failing = False
        async with store.turn("s1"):
            pass  # saves nothing, but the session is marked not indexed: written now
        listed = (await store.list_owner_sessions("alice")).sessions
        assert [(s.session_id, s.message_count, s.preview) for s in listed] == [("s1", 4, "a two")]
        scope = store.storage.catalog.scope_for("alice")
        keys = [item.key async for item in store.kv.iter_scan(scope, values=False)]
        assert len(keys) == 2, keys  # one entry and its pointer


async def test_a_retried_save_does_not_write_the_index_twice() -> None:
    """When the state write after the index write fails transiently, the turn's retry
    reuses the index write that landed."""
    inner = open_kv("memory://catalog-retry")
    kv = CountingKV(inner, native_ports=False)
    async with SessionStore(kv, owns_kv=True, port=KVSessionPort(kv)) as store:
        async with store.turn("s1", owner="alice") as session:
            session.replace(exchange("one"))
        port, index = store.storage.port, store.storage.catalog
        save, write = port.save, index.write
        armed = []

        async def written(*args: Any, **kwargs: Any) -> Any:
            result = await write(*args, **kwargs)
            armed.append(True)  # the state write that follows this index write fails once
            return result

        async def flaky(request: Any) -> str:
            if armed and armed.pop():
                raise ConnectionError("injected: the state write's connection dropped")
            return await save(request)

        index.write = written  # type: ignore[method-assign]
        port.save = flaky  # type: ignore[method-assign]
        kv.reset_counts()
        async with store.turn("s1") as session:
            session.replace([*session.messages, *exchange("two")])
        assert kv.calls["commit"] == 1 and not armed, kv.calls
        (summary,) = (await store.list_owner_sessions("alice")).sessions
        assert summary.message_count == 4


async def test_the_catalog_field_round_trips_and_a_damaged_one_is_reported() -> None:
    async with open_sessions("memory://catalog-header") as store:
        async with store.turn("s1", owner="o", title="T", tags=["x"], metadata={"n": 1}) as s:
            s.replace(exchange("one"))
        scope = store.storage.scope_for("s1")
        entry = await store.kv.get(scope, STATE_KEY)
        assert entry is not None
        header, _ = decode_state(entry.value)
        assert header.catalog is not None
        assert (header.catalog["owner"], header.catalog["title"]) == ("o", "T")
        assert header.catalog["meta"] == {"n": 1}
        damaged = entry.value.replace(b'"title":"T"', b'"title":7')
        await store.kv.replace(scope, STATE_KEY, damaged, expected_version=entry.version)
        info = await store.inspect("s1")
        assert info is not None and info.problem is not None and "title" in info.problem
        with pytest.raises(InvalidSessionError):
            async with store.turn("s1"):
                pass


async def test_bounds_and_configuration_errors() -> None:
    with pytest.raises(ConfigError):
        SessionStore(open_kv("memory://catalog-cfg"), scope_prefix="s", catalog_prefix="s-owner:")
    async with open_sessions("memory://catalog-bounds") as store:
        with pytest.raises(ValueError, match="metadata"):
            store.turn("s", metadata={"blob": "x" * MAX_METADATA_BYTES})
        with pytest.raises(ValueError, match="tags"):
            store.turn("s", tags=[f"t{i}" for i in range(40)])
        with pytest.raises(InvalidSessionError, match="owner"):
            store.turn("s", owner="o" * 600)
        with pytest.raises(InvalidSessionError, match="listed by owner"):
            store.turn("x" * 500, owner="o")
        with pytest.raises(ValueError, match="at least one"):
            await store.set_catalog("s")


def test_keys_order_newest_first_and_cursors_are_opaque() -> None:
    assert recent_key(2.0, "a") < recent_key(1.0, "b")
    assert next_activity(5.0, 5.0) > 5.0 and recent_key(next_activity(5.0, 5.0), "a") < recent_key(
        5.0, "a"
    )
    key = recent_key(1_800_000_000.123, "user:42/é")
    assert decode_cursor(encode_cursor(key)) == key
    with pytest.raises(ValueError, match="cursor"):
        decode_cursor(encode_cursor("h/not-an-entry"))
    long = "word " * 100
    preview = preview_of([*exchange("x"), ModelResponse(parts=[TextPart(content=long)])])
    assert preview is not None and len(preview) == 160 and preview.endswith("…")
    assert preview_of([]) is None


async def _populate(url: str) -> None:
    async with open_sessions(url) as store:
        for i in range(5):
            async with store.turn(
                f"chat-{i}", owner="alice" if i < 4 else "bob", title=f"Chat {i}", tags=["t"]
            ) as session:
                session.replace(exchange(str(i)))
            await asyncio.sleep(0.002)


def test_sessions_list_by_owner_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    asyncio.run(_populate(url))
    runner = CliRunner()
    first = runner.invoke(cli, ["sessions", url, "list", "--owner", "alice", "--limit", "3"])
    assert first.exit_code == 0, first.output
    rows = [line for line in first.output.splitlines() if line.startswith("chat-")]
    assert [r.split("\t")[0] for r in rows] == ["chat-3", "chat-2", "chat-1"]
    assert "Chat 3" in rows[0] and "2 messages" in rows[0] and "a 3" in first.output
    cursor = first.output.splitlines()[-1].split("--cursor ")[1]
    rest = runner.invoke(
        cli, ["sessions", url, "list", "--owner", "alice", "--cursor", cursor, "--json"]
    )
    assert rest.exit_code == 0, rest.output
    docs = [json.loads(line) for line in rest.output.splitlines()]
    assert [d["session_id"] for d in docs] == ["chat-0"] and docs[0]["title"] == "Chat 0"
    bad = runner.invoke(cli, ["sessions", url, "list", "--owner", "alice", "--cursor", "zz"])
    assert bad.exit_code == 2 and "cursor" in bad.output
    mixed = runner.invoke(cli, ["sessions", url, "list", "--owner", "alice", "--latched"])
    assert mixed.exit_code == 2
    shown = runner.invoke(cli, ["sessions", url, "show", "chat-4"])
    assert "owner        bob; title Chat 4; tags t" in shown.output
    nobody = runner.invoke(cli, ["sessions", url, "list", "--owner", "carol"])
    assert nobody.exit_code == 0 and "no sessions of owner 'carol'" in nobody.output


def test_erase_owner_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    asyncio.run(_populate(url))
    runner = CliRunner()
    erased = runner.invoke(cli, ["sessions", url, "erase-owner", "alice"])
    assert erased.exit_code == 0, erased.output
    assert "erased 4 sessions of owner 'alice'" in erased.output
    assert "verified: 5 scopes read back, 0 entries left" in erased.output
    again = runner.invoke(cli, ["sessions", url, "erase-owner", "alice", "--json"])
    report = json.loads(again.output)
    assert report["sessions"] == [] and report["complete"] is True
    listed = runner.invoke(cli, ["sessions", url, "list"])
    assert [line.split("\t")[0] for line in listed.output.splitlines()] == ["chat-4"]


async def test_copy_carries_the_owners_indexes(tmp_path: Path) -> None:
    """A copied store lists each owner's sessions and can erase them: the owners' index
    scopes are copied with the sessions."""
    from agent_stores.transfer import Transfer

    src, dst = f"sqlite:///{tmp_path}/src.db", f"sqlite:///{tmp_path}/dst.db"
    await _populate(src)
    async with open_kv(src) as source, open_kv(dst) as target:
        report = await Transfer(source, target, kinds=("sessions",)).copy()
        assert report.ok, report
    async with open_sessions(dst) as store:
        listed = await store.list_owner_sessions("alice")
        assert [s.session_id for s in listed.sessions] == ["chat-3", "chat-2", "chat-1", "chat-0"]
        erased = await store.erase_owner("alice")
        assert len(erased.sessions) == 4 and erased.complete


def test_purge_sessions_idle_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    asyncio.run(_populate(url))
    runner = CliRunner()
    kept = runner.invoke(cli, ["purge", url, "--sessions-idle-days", "1"])
    assert kept.exit_code == 0, kept.output
    assert "deleted 0 of 5 sessions idle for more than 1 days" in kept.output
    bad = runner.invoke(cli, ["purge", url, "--include-latched"])
    assert bad.exit_code == 2 and "--sessions-idle-days" in bad.output


def test_purge_runs_keep_cli(tmp_path: Path) -> None:
    from agent_stores import open_checkpointer
    from agent_stores.checkpointer import JournalEvent
    from pydantic_ai_harness.step_persistence import RunRecord

    url = f"sqlite:///{tmp_path}/c.db"

    async def runs() -> None:
        async with open_checkpointer(url) as checkpointer:
            steps = checkpointer.step_store()
            for i in range(3):
                await steps.register_run(RunRecord(run_id=f"r{i}", conversation_id="chat"))
                await checkpointer.append(f"r{i}", JournalEvent(step_id="s0", kind="model"))
                await asyncio.sleep(0.01)

    asyncio.run(runs())
    result = CliRunner().invoke(cli, ["purge", url, "--runs-keep", "1"])
    assert result.exit_code == 0, result.output
    assert "deleted 2 runs; kept the 1 most recent of each of 1 conversations" in result.output
