"""Unit tests of the checkpointer's journal, replay and writer beyond the contract suite.

The contract suite (``agent_stores_contract.checkpointer``) also runs here, on a memory
space whose item limit is 1 KiB, so every chunking path is exercised.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from agent_stores import CorruptRecordError, KVStore, connect, open_checkpointer, open_kv
from agent_stores.checkpointer import (
    AppendResult,
    Checkpointer,
    Durability,
    JournalEntry,
    JournalEvent,
    Outcome,
    Phase,
    Replay,
    ReplayState,
    RunState,
    UncertainEffect,
    make_step_id,
    parse_step_id,
)
from agent_stores.checkpointer import space as space_module
from agent_stores.checkpointer.codec import canonical
from agent_stores_contract.base import KVFactory
from agent_stores_contract.checkpointer import CheckpointerContract
from hypothesis import given
from hypothesis import strategies as st


class TestCheckpointerContractSmallItems(CheckpointerContract):
    """The whole contract on memory:// with 1 KiB items: records, snapshots and payloads chunk."""

    @pytest.fixture
    def store_url(self) -> str:
        return f"memory://cp-small-{uuid.uuid4().hex[:8]}?max_value_bytes=1024"

    @pytest.fixture
    def kv_factory(self, store_url: str) -> KVFactory:
        return lambda: open_kv(store_url)


@pytest_asyncio.fixture
async def cp() -> AsyncIterator[Checkpointer]:
    async with open_checkpointer(f"memory://cp-{uuid.uuid4().hex[:8]}") as checkpointer:
        yield checkpointer


# -- vocabulary -------------------------------------------------------------------------------


def test_make_step_id_is_positional_and_sortable() -> None:
    ids = [make_step_id(i, "model") for i in (0, 9, 10, 100, 999_999)]
    assert ids[0] == "000000-model" and ids == sorted(ids)
    assert parse_step_id("000012-tool") == (12, "tool")
    assert parse_step_id("custom") is None
    for bad_seq, kind in ((-1, "model"), (1, ""), (1, "a/b")):
        with pytest.raises(ValueError):
            make_step_id(bad_seq, kind)


def test_event_defaults_and_round_trip() -> None:
    event = JournalEvent.attempted(
        "000003-tool", {"x": [1, "é"]}, idempotent=True, at=1.5, meta={"t": "p"}
    )
    assert event.kind == "tool" and event.phase is Phase.ATTEMPTED
    assert event.durability is Durability.DEFERRABLE
    assert JournalEvent.attempted("000003-tool").durability is Durability.DURABLE
    assert JournalEvent.from_record(json.loads(canonical(event.to_record()))) == event
    assert JournalEvent.completed("free-form").kind == "step"
    with pytest.raises(ValueError):
        JournalEvent(step_id="s", phase="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        JournalEvent(step_id="a\x00b")


def test_fingerprint_ignores_timestamp_meta_and_key_order() -> None:
    one = JournalEvent.completed("s", {"a": 1, "b": 2}, at=1.0, meta={"trace": "1"})
    two = JournalEvent.completed("s", {"b": 2, "a": 1}, at=9.0, meta={"trace": "2"})
    assert one.fingerprint() == two.fingerprint()
    assert one.fingerprint() != JournalEvent.completed("s", {"a": 1, "b": 3}).fingerprint()


def test_run_state_is_indexed_and_exclusive() -> None:
    entries = (
        JournalEntry(0, JournalEvent.attempted("000000-model")),
        JournalEntry(1, JournalEvent.completed("000000-model", {"r": 1})),
        JournalEntry(3, JournalEvent.attempted("000001-tool")),
    )
    state = RunState("r", entries)
    assert state.next_seq == 4 and len(state) == 3
    assert state.completed("000000-model") and not state.attempted("000000-model")
    assert state.attempted("000001-tool") and state.uncertain_steps() == ["000001-tool"]
    assert state.events[1].payload == {"r": 1}
    intent = state.intent_of("000001-tool")
    assert intent is not None and intent.seq == 3


def test_outcome_properties() -> None:
    assert Outcome.APPROVAL_DENIED.final and not Outcome.APPROVAL_EXPIRED.final
    assert Outcome.RESULT.happened and Outcome.APPROVAL_GRANTED.happened
    assert not Outcome.DENIED_BY_POLICY.happened


def test_replay_counts_and_closed_run() -> None:
    state = RunState(
        "r",
        (
            JournalEntry(0, JournalEvent.completed("000000-model", {})),
            JournalEntry(1, JournalEvent.completed("000001-final", {"output": "x"})),
        ),
    )
    replay = Replay(state)
    assert replay.active and replay.closed is not None
    assert replay.resolve("000000-model").state is ReplayState.DONE
    assert replay.replayed == 1
    assert not Replay(RunState("empty")).active


def test_uncertain_effect_is_typed() -> None:
    intent = JournalEntry(0, JournalEvent.attempted("000001-tool", {"pay": 1}))
    replay = Replay(RunState("r", (intent,)))
    with pytest.raises(UncertainEffect) as info:
        replay.resolve("000001-tool")
    assert info.value.intent == intent and "000001-tool" in str(info.value)
    assert info.value.severity == "WARNING"


# -- the store --------------------------------------------------------------------------------


async def test_connect_and_open_checkpointer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cp.db"
    async with connect(url) as connection:
        checkpointer = connection.checkpointer(scope_prefix="x/")
        assert isinstance(checkpointer, Checkpointer) and not checkpointer.owns_kv
        assert (await checkpointer.append("r", JournalEvent.completed("s"))) == AppendResult(0)
    async with open_checkpointer(url, scope_prefix="x/") as owned:
        assert owned.owns_kv
        assert len(await owned.load("r")) == 1
    assert owned.kv.closed
    with pytest.raises(ValueError):
        Checkpointer(owned.kv, scope_prefix="")
    with pytest.raises(ValueError):
        Checkpointer(owned.kv, ttl_seconds=0)


async def test_empty_run_id_is_refused(cp: Checkpointer) -> None:
    with pytest.raises(ValueError):
        await cp.append("", JournalEvent.completed("s"))
    assert await cp.list_runs() == []


async def test_append_many_keeps_order_and_reports_duplicates(cp: Checkpointer) -> None:
    await cp.append("r", JournalEvent.completed("000001-model", {"i": 1}))
    results = await cp.append_many(
        "r", [JournalEvent.completed(make_step_id(i, "model"), {"i": i}) for i in range(4)]
    )
    assert [r.duplicate for r in results] == [False, True, False, False]
    assert results[1].seq == 0
    state = await cp.load("r")
    assert [e.step_id for e in state.entries] == [
        "000001-model",
        "000000-model",
        "000002-model",
        "000003-model",
    ]
    assert await cp.append_many("r", []) == []
    assert await cp.reserve("r", 0) == range(0)
    with pytest.raises(ValueError):
        await cp.reserve("r", -1)


async def test_corrupt_entry_is_reported_not_guessed(cp: Checkpointer) -> None:
    await cp.append("r", JournalEvent.completed("s"))
    scope = cp.space.scope("r")
    entry = await cp.kv.get(scope, "j/s/completed")
    assert entry is not None
    await cp.kv.replace(scope, "j/s/completed", b"not json", expected_version=entry.version)
    with pytest.raises(CorruptRecordError):
        await cp.load("r")
    with pytest.raises(CorruptRecordError):
        await cp.append("r", JournalEvent.completed("s"))


async def test_missing_chunk_is_reported(tmp_path: Path) -> None:
    async with open_checkpointer(
        f"memory://chunks-{uuid.uuid4().hex[:6]}?max_value_bytes=1024"
    ) as cp:
        await cp.append("r", JournalEvent.completed("s", {"big": "z" * 5000}))
        chunks = [
            i.key async for i in cp.kv.iter_scan(cp.space.scope("r"), prefix="x/", values=False)
        ]
        assert len(chunks) >= 5
        await cp.kv.delete(cp.space.scope("r"), chunks[2])
        with pytest.raises(CorruptRecordError, match="missing"):
            await cp.load("r")


async def test_deleted_run_written_again_is_listed_again(
    cp: Checkpointer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client deletes a run this process keeps writing: the run is indexed again."""
    monkeypatch.setattr(space_module, "_ANCHOR_RECHECK", 0.0)
    await cp.append("r", JournalEvent.completed("000000-model"))
    other = Checkpointer(cp.kv, scope_prefix=cp.space.scope_prefix)
    assert await other.delete_run("r")
    await cp.append("r", JournalEvent.completed("000001-model"))
    assert [r.run_id for r in await cp.list_runs()] == ["r"]
    state = await cp.load("r")
    assert [(e.seq, e.step_id) for e in state.entries] == [(0, "000001-model")]


async def test_writer_pending_and_flush_results(cp: Checkpointer) -> None:
    writer = cp.writer("r")
    assert await writer.flush() == []
    await writer.record(JournalEvent.attempted("000000-model", durability=Durability.DEFERRABLE))
    await writer.record(JournalEvent.attempted("000001-model", durability=Durability.DEFERRABLE))
    assert [e.step_id for e in writer.pending] == ["000000-model", "000001-model"]
    results = await writer.flush()
    assert [r.seq for r in results] == [0, 1] and writer.pending == ()


async def test_concurrent_writers_never_share_positions(tmp_path: Path) -> None:
    """Writers in several tasks and clients on SQLite: each batch keeps its order, no shared seq."""
    url = f"sqlite:///{tmp_path}/w.db"
    clients = [Checkpointer(open_kv(url), owns_kv=True) for _ in range(3)]
    try:

        async def one(task: int) -> None:
            writer = clients[task % 3].writer("r")
            for i in range(6):
                await writer.record(
                    JournalEvent.attempted(f"{task}-{i}", durability=Durability.DEFERRABLE)
                )
            await writer.flush()

        await asyncio.gather(*(one(t) for t in range(9)))
        state = await clients[0].load("r")
        assert len(state) == 54 and len({e.seq for e in state.entries}) == 54
        for task in range(9):
            mine = [e.step_id for e in state.entries if e.step_id.startswith(f"{task}-")]
            assert mine == [f"{task}-{i}" for i in range(6)]
    finally:
        for client in clients:
            await client.aclose()


async def test_killed_appender_then_retry_exactly_once(tmp_path: Path) -> None:
    """A process killed (SIGKILL) while appending, then a new process retrying the same events:
    every event is in the journal exactly once, in the order they were appended."""
    url = f"sqlite:///{tmp_path}/kill.db"
    total = 400
    args = [
        sys.executable,
        "-m",
        "agent_stores_contract.checkpointer_workers",
        "journal-append",
        url,
        "cp",
        "r",
        "w",
        str(total),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    seen = 0
    while seen < 50:
        line = await proc.stdout.readline()
        assert line, (await proc.stderr.read()).decode() if proc.stderr else "worker died"
        seen += 1
    proc.kill()
    await proc.wait()
    async with open_checkpointer(url) as cp:
        survived = len(await cp.load("r"))
    assert seen <= survived < total
    retry = await asyncio.create_subprocess_exec(
        *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    out, err = await retry.communicate()
    assert retry.returncode == 0, err.decode()
    results = [json.loads(line) for line in out.decode().splitlines()]
    assert len(results) == total
    assert sum(r["duplicate"] for r in results) == survived, "a landed event was written again"
    async with open_checkpointer(url) as cp:
        state = await cp.load("r")
    assert [e.step_id for e in state.entries] == [f"w-{i:04d}" for i in range(total)]
    assert len({e.seq for e in state.entries}) == total


async def test_ttl_remaining_follows_the_run(tmp_path: Path) -> None:
    kv: KVStore = open_kv(f"sqlite:///{tmp_path}/ttl.db")
    async with Checkpointer(kv, owns_kv=True, ttl_seconds=100) as cp:
        await cp.append("r", JournalEvent.completed("a"))
        info = await cp.get_run_info("r")
        assert info is not None and info.expires_at is not None
        entry = await kv.get(cp.space.scope("r"), "j/a/completed")
        assert entry is not None and entry.expires_at == pytest.approx(info.expires_at, abs=0.01)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(_json_values)
def test_canonical_bytes_are_sorted_compact_utf8_json(value: object) -> None:
    expected = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()
    assert canonical(value) == expected


@pytest.mark.parametrize(
    ("value", "error", "says"),
    [
        (float("nan"), ValueError, "Out of range float"),
        ({"a": object()}, TypeError, "not JSON serializable"),
        ({"a": b"bytes"}, TypeError, "not JSON serializable"),
    ],
)
def test_canonical_refuses_what_json_cannot_hold(
    value: object, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        canonical(value)


def test_canonical_names_a_cycle_and_encodes_after_it() -> None:
    # The reused C encoder has no cycle check of its own: the full encoder names it, and
    # nothing of the failed call is left behind for the next one.
    cycle: list[object] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular reference"):
        canonical({"a": cycle})
    assert canonical({"b": [1], "a": {"d": None, "c": "é"}}) == (
        '{"a":{"c":"é","d":null},"b":[1]}'.encode()
    )


@given(st.integers(min_value=0, max_value=2**63))
def test_position_counter_value_is_canonical(position: int) -> None:
    from agent_stores.checkpointer.space import _head_value

    assert _head_value(position) == canonical({"next": position})


@pytest.mark.parametrize(("first", "then"), [(4096, 65536), (65536, 4096)])
async def test_pack_names_the_stored_layout_when_the_bytes_were_cut_at_another_size(
    tmp_path: Path, first: int, then: int
) -> None:
    """Bytes already chunked under their content address, at another piece size (written
    where items were larger or smaller, then copied here), are referenced as they are
    stored: the stub a store writes for the same bytes reads back whole."""
    import dataclasses

    from agent_stores.checkpointer.space import RunSpace

    kv: KVStore = open_kv(f"sqlite:///{tmp_path}/layout.db")
    async with kv:
        record = {"payload": "".join(str(i) for i in range(40_000))}  # ~190 KB
        kv.limits = dataclasses.replace(kv.limits, max_value_bytes=first)
        await RunSpace(kv).pack("r", record, (), None)
        kv.limits = dataclasses.replace(kv.limits, max_value_bytes=then)
        space = RunSpace(kv)
        stub = await space.pack("r", record, (), None)
        assert await space.unpack("r", json.loads(stub), what="stub") == record
