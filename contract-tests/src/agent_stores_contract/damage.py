"""Damage stays local: one undecodable record costs only itself, on every backend.

The damage is planted through the KV layer (``kv.replace`` with bytes no store writes),
so the same tests run on every backend. What they hold the stores to (``docs/design.md``,
"Damaged records"):

* memory: listing, search and the harness ``Memory`` injection skip the damaged file and
  report it (``store.problems``); overwriting and deleting it work; its bytes are kept
  in the quarantine scope;
* runs: listing runs skips a damaged run record and reports it; other runs load; the
  damaged run's journal raises ``RECORD_CORRUPTED`` (a replay never guesses) until the
  run is deleted;
* sessions: a damaged state record or chunk makes only that session ``SESSION_INVALID``
  (every time, never ``SESSION_BUSY``: no lease is left behind), its row is untouched,
  other sessions and listings keep working, and ``reset`` clears it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import KVStore
from agent_stores.checkpointer import Checkpointer, JournalEvent
from agent_stores.damage import (
    QUARANTINE_SCOPE,
    list_quarantined,
    purge_quarantined,
    quarantine,
)
from agent_stores.errors import CorruptRecordError, ErrorCode
from agent_stores.kv.base import Entry
from agent_stores.memory import KVMemoryStore
from agent_stores.sessions import InvalidSessionError, SessionStore
from agent_stores.sessions.records import CHUNK_PREFIX, STATE_KEY
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai_harness.memory import Memory

from .base import ContractBase

GARBAGE = b"\xff\xfe garbage, not a record {"


def exchange(tag: str, pad: int = 400) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(f"q:{tag} " + "x" * pad)]),
        ModelResponse(parts=[TextPart(f"a:{tag} " + "y" * pad)]),
    ]


async def plant(kv: KVStore, scope: str, key: str, value: bytes = GARBAGE) -> None:
    """Overwrite ``(scope, key)`` with ``value`` behind the stores' backs."""
    entry = await kv.get(scope, key)
    assert entry is not None, f"nothing stored at {scope}/{key}"
    await kv.replace(scope, key, value, expected_version=entry.version)


class DamageContract(ContractBase):
    """Damaged records stay local. Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    @pytest_asyncio.fixture
    async def memory(self, kv: KVStore, ns: str) -> AsyncIterator[KVMemoryStore]:
        async with KVMemoryStore(kv, scope_prefix=f"{ns}:memory:", max_record_bytes=1024) as store:
            yield store

    @pytest_asyncio.fixture
    async def seeded(self, memory: KVMemoryStore) -> KVMemoryStore:
        """Two tenants' files; ``dave/main/notes.md`` is then damaged."""
        for path, text in {
            "dave/main/MEMORY.md": "dave likes green tea",
            "dave/main/notes.md": "tea notes: oolong",
            "dave/main/trips.md": "tea trip to Kyoto",
            "dave/main/deep/plan.md": "tea plan",
            "erin/main/MEMORY.md": "erin likes coffee",
        }.items():
            await memory.write(path, text, expected_version=None)
        await plant(memory.kv, memory.directory_scope("dave/main"), "notes.md")
        return memory

    # -- memory ---------------------------------------------------------------------------

    async def test_memory_listing_skips_and_reports_damaged_file(
        self, seeded: KVMemoryStore
    ) -> None:
        """list_paths of every tenant and of the damaged tenant skip the damaged file and report it."""
        assert await seeded.list_paths("", limit=100) == [
            "dave/main/MEMORY.md",
            "dave/main/deep/plan.md",
            "dave/main/trips.md",
            "erin/main/MEMORY.md",
        ]
        assert await seeded.list_paths("dave/", limit=100) == [
            "dave/main/MEMORY.md",
            "dave/main/deep/plan.md",
            "dave/main/trips.md",
        ]
        problems = seeded.problems.take()
        assert problems and {p.where for p in problems} == {"dave/main/notes.md"}
        assert all(p.store == "memory" and p.detail for p in problems)

    async def test_memory_search_skips_and_reports_damaged_file(
        self, seeded: KVMemoryStore
    ) -> None:
        """search over the damaged directory finds the healthy files and reports the damaged one."""
        result = await seeded.search(
            "dave/main/", "tea", limit=10, max_files=100, max_chars=4000, max_file_chars=4000
        )
        found = {m.path for m in result.matches}
        assert found == {"dave/main/MEMORY.md", "dave/main/trips.md"}
        assert [p.where for p in seeded.problems.take()] == ["dave/main/notes.md"]

    async def test_memory_read_of_damaged_file_is_typed(self, seeded: KVMemoryStore) -> None:
        """Reading the damaged file raises RECORD_CORRUPTED and changes nothing; its neighbours read fine."""
        with pytest.raises(CorruptRecordError) as caught:
            await seeded.read("dave/main/notes.md", max_chars=100)
        assert caught.value.code == ErrorCode.RECORD_CORRUPTED
        scope = seeded.directory_scope("dave/main")
        raw = await seeded.kv.get(scope, "notes.md")
        assert raw is not None and raw.value == GARBAGE
        healthy = await seeded.read("dave/main/MEMORY.md", max_chars=100)
        assert healthy is not None and healthy.content == "dave likes green tea"

    async def test_memory_overwrite_and_delete_of_damaged_file(self, seeded: KVMemoryStore) -> None:
        """An unconditional overwrite replaces the damaged file (raw bytes quarantined); delete needs no body."""
        with pytest.raises(CorruptRecordError):
            await seeded.write("dave/main/notes.md", "x", expected_version="not-its-version")
        written = await seeded.write("dave/main/notes.md", "fresh notes", expected_version=None)
        current = await seeded.read("dave/main/notes.md", max_chars=100)
        assert current is not None and current.content == "fresh notes"
        assert current.version == written.version
        scope = seeded.directory_scope("dave/main")
        kept = [q for q in await list_quarantined(seeded.kv) if q.scope == scope]
        assert [(q.origin_key, q.raw) for q in kept] == [("notes.md", GARBAGE)]

        await plant(seeded.kv, seeded.directory_scope("dave/main"), "trips.md")
        deleted = await seeded.delete("dave/main/trips.md", expected_version=None)
        assert deleted.existed is True
        assert await seeded.read("dave/main/trips.md", max_chars=10) is None
        assert "dave/main/trips.md" not in await seeded.list_paths("dave/", limit=100)

    async def test_memory_damaged_chunk_is_local(self, memory: KVMemoryStore) -> None:
        """A damaged content chunk of a large file: search skips that file and reports it, reading
        it raises RECORD_CORRUPTED, listing and the other files of the directory work."""
        await memory.write("u/main/big.md", "tea " * 800, expected_version=None)
        await memory.write("u/main/small.md", "tea time", expected_version=None)
        scope = memory.directory_scope("u/main")
        chunks = [i.key async for i in memory.kv.iter_scan(scope, prefix="~c/", values=False)]
        assert chunks, "a 3,200-character file with max_record_bytes=1024 is chunked"
        await plant(memory.kv, scope, chunks[0])
        result = await memory.search(
            "u/main/", "tea", limit=10, max_files=10, max_chars=4000, max_file_chars=4000
        )
        assert {m.path for m in result.matches} == {"u/main/small.md"}
        assert "u/main/big.md" in {p.where for p in memory.problems.take()}
        with pytest.raises(CorruptRecordError):
            await memory.read("u/main/big.md", max_chars=4000)
        assert await memory.list_paths("u/", limit=10) == ["u/main/big.md", "u/main/small.md"]
        current = await memory.read("u/main/small.md", max_chars=100)
        assert current is not None
        big = await memory.list_paths("u/main/big", limit=1)
        assert big == ["u/main/big.md"]
        written = await memory.write(
            "u/main/small.md", "rewritten", expected_version=current.version
        )
        await memory.delete("u/main/small.md", expected_version=written.version)
        assert await memory.list_paths("u/", limit=10) == ["u/main/big.md"]

    async def test_harness_memory_keeps_injecting_healthy_files(
        self, seeded: KVMemoryStore
    ) -> None:
        """Through the harness Memory capability: MEMORY.md is still injected and search_memory answers."""
        seen: dict[str, Any] = {}

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
            if not returns:
                seen["prompt"] = "\n".join(
                    str(p.content)
                    for m in messages
                    for p in m.parts
                    if isinstance(p, UserPromptPart)
                )
                call = ToolCallPart("search_memory", {"query": "tea"}, tool_call_id="s1")
                return ModelResponse(parts=[call])
            seen["search"] = str(returns[-1].content)
            return ModelResponse(parts=[TextPart("done")])

        agent = Agent(FunctionModel(model), capabilities=[Memory(store=seeded, namespace="dave")])
        result = await agent.run("what do I drink?")
        assert result.output == "done"
        assert "dave likes green tea" in seen["prompt"]
        assert "trips.md" in seen["search"]
        assert "notes.md" not in seen["search"]
        assert "dave/main/notes.md" in {p.where for p in seeded.problems}

    # -- runs -----------------------------------------------------------------------------

    async def test_damaged_run_record_is_skipped_in_listing(self, kv: KVStore, ns: str) -> None:
        """A damaged step-store run record: list_runs skips and reports it; the others list and load."""
        from datetime import UTC, datetime

        from pydantic_ai_harness.step_persistence import RunRecord

        checkpointer = Checkpointer(kv, scope_prefix=f"{ns}-cp/")
        steps = checkpointer.step_store()
        now = datetime.now(UTC)
        for name in ("good", "bad"):
            await steps.register_run(
                RunRecord(run_id=f"{ns}-{name}", conversation_id=f"{ns}-conv", started_at=now)
            )
        await plant(kv, checkpointer.space.scope(f"{ns}-bad"), "run")
        listed = await steps.list_runs(conversation_id=f"{ns}-conv")
        assert [r.run_id for r in listed] == [f"{ns}-good"]
        assert [p.where for p in steps.problems.take()] == [
            f"{checkpointer.space.scope(f'{ns}-bad')}/run"
        ]
        assert await checkpointer.delete_run(f"{ns}-bad") is True
        assert await steps.get_run(run_id=f"{ns}-bad") is None

    async def test_damaged_journal_entry_is_local_to_its_run(self, kv: KVStore, ns: str) -> None:
        """A damaged journal entry: that run's load raises RECORD_CORRUPTED (replay never guesses),
        other runs load and list, and deleting the run clears it."""
        checkpointer = Checkpointer(kv, scope_prefix=f"{ns}-cp/")
        for run in ("good", "bad"):
            await checkpointer.append(f"{ns}-{run}", JournalEvent.attempted("s1"))
            await checkpointer.append(f"{ns}-{run}", JournalEvent.completed("s1", {"ok": 1}))
        await plant(kv, checkpointer.space.scope(f"{ns}-bad"), "j/s1/completed")
        with pytest.raises(CorruptRecordError) as caught:
            await checkpointer.load(f"{ns}-bad")
        assert "j/s1/completed" in caught.value.detail
        good = await checkpointer.load(f"{ns}-good")
        assert len(good.entries) == 2
        listed = {r.run_id for r in await checkpointer.list_runs(limit=1000)}
        assert {f"{ns}-good", f"{ns}-bad"} <= listed
        assert await checkpointer.delete_run(f"{ns}-bad") is True
        assert (await checkpointer.load(f"{ns}-bad")).entries == ()

    # -- sessions -------------------------------------------------------------------------

    @pytest_asyncio.fixture
    async def sessions(self, kv_factory: Any) -> AsyncIterator[SessionStore]:
        kv = kv_factory()
        await kv.setup()
        store = SessionStore(kv, owns_kv=True, lease_seconds=30)
        try:
            yield store
        finally:
            await store.aclose(timeout_seconds=5)

    async def _expect_invalid_twice(self, sessions: SessionStore, sid: str) -> None:
        for _ in range(2):  # the second is not SESSION_BUSY: nothing kept a lease
            with pytest.raises(InvalidSessionError) as caught:
                async with sessions.turn(sid, timeout_seconds=1):
                    pass
            assert caught.value.code == ErrorCode.SESSION_INVALID
            assert caught.value.session_id == sid

    @pytest.mark.parametrize("cut", ["end", "inside"])
    async def test_truncated_state_tail_leaves_row_untouched(
        self, sessions: SessionStore, ns: str, cut: str
    ) -> None:
        """A state record whose header is intact but inline tail is cut: SESSION_INVALID every time
        (never SESSION_BUSY: no lease is left behind), the stored history untouched, inspect shows
        no owner, other sessions work, reset clears it."""
        sid = f"{ns}:tail"
        async with sessions.turn(sid) as session:
            session.replace(exchange("one", pad=20))
        scope = sessions.storage.scope_for(sid)
        entry = await sessions.kv.get(scope, STATE_KEY)
        assert entry is not None and entry.value.count(b"\n") >= 1
        # "end": the array loses its closing bracket; "inside": it keeps it, so only decoding
        # the messages (after the lease is taken) finds the damage.
        damaged = entry.value[:-7] if cut == "end" else entry.value[:-30] + b"]"
        await sessions.kv.replace(scope, STATE_KEY, damaged, expected_version=entry.version)
        await self._expect_invalid_twice(sessions, sid)
        after = await sessions.kv.get(scope, STATE_KEY)
        assert after is not None
        if cut == "end":
            assert after.value == damaged  # refused before anything was written
        else:
            # Found only once the lease was taken (a native path takes it and loads in one
            # round trip): the lease is given back, and the history bytes stay as they were.
            assert after.value.partition(b"\n")[2] == damaged.partition(b"\n")[2]
        info = await sessions.inspect(sid)
        assert info is None or info.lease_owner is None
        other = f"{ns}:healthy"
        async with sessions.turn(other) as session:
            session.replace(exchange("fine"))
        assert await sessions.reset(sid) is True
        async with sessions.turn(sid) as session:
            assert session.messages == []

    async def test_damaged_chunk_is_local_to_its_session(
        self, sessions: SessionStore, kv_factory: Any, ns: str
    ) -> None:
        """A damaged history chunk: only that session is SESSION_INVALID (never BUSY); another
        session's turns, inspect and the listing keep working; reset clears it."""
        sid, other = f"{ns}:chunky", f"{ns}:neighbour"
        history = [m for i in range(30) for m in exchange(f"m{i}")]
        for name in (sid, other):
            async with sessions.turn(name) as session:
                session.replace(history)
        scope = sessions.storage.scope_for(sid)
        parts = [
            i.key async for i in sessions.kv.iter_scan(scope, prefix=CHUNK_PREFIX, values=False)
        ]
        assert parts, "a 60-message history is chunked"
        await plant(sessions.kv, scope, parts[0])
        reader_kv = kv_factory()
        await reader_kv.setup()
        async with SessionStore(reader_kv, owns_kv=True, lease_seconds=30) as reader:
            await self._expect_invalid_twice(reader, sid)
            async with reader.turn(other) as session:
                assert len(session.messages) == 60
            listed = {i.session_id: i for i in await reader.list_sessions(prefix=ns)}
            assert set(listed) == {sid, other}
            assert listed[sid].lease_owner is None
            assert await reader.reset(sid) is True
            async with reader.turn(sid) as session:
                assert session.messages == []

    # -- doctor ---------------------------------------------------------------------------

    async def test_doctor_finds_and_quarantines_every_kind(
        self, kv: KVStore, kv_factory: Any, ns: str
    ) -> None:
        """doctor lists a planted damage of each kind without changing anything; --repair
        quarantines each (raw bytes kept), a second scan is clean, every store works again
        and nothing healthy was lost."""
        prefixes: dict[str, Any] = {
            "session_prefix": f"{ns}:session:",
            "memory_prefix": f"{ns}:memory:",
            "runs_prefix": f"{ns}-cp/",
        }
        sessions = SessionStore(kv, scope_prefix=prefixes["session_prefix"], lease_seconds=30)
        expected, garbage = await _damage_sessions(kv, sessions)
        memory = KVMemoryStore(kv, scope_prefix=prefixes["memory_prefix"], max_record_bytes=1024)
        found, chunk = await _damage_memory(kv, memory, ns, prefixes["memory_prefix"])
        expected |= found
        garbage.append(chunk)
        checkpointer = Checkpointer(kv, scope_prefix=f"{ns}-cp/")
        expected |= await _damage_runs(kv, checkpointer)

        await _scan_finds_and_changes_nothing(kv, prefixes, expected, checkpointer)
        await _repair_quarantines(kv, prefixes, expected, garbage)

        # Every store works again; nothing healthy was lost.
        reader = SessionStore(kv, scope_prefix=prefixes["session_prefix"], lease_seconds=30)
        await _sessions_work_again(reader)
        await _memory_works_again(memory)
        await _runs_work_again(checkpointer)
        await sessions.aclose()
        await reader.aclose()

    # -- retention of the quarantine --------------------------------------------------------

    async def test_purge_quarantined_removes_old_records_only(self, kv: KVStore, ns: str) -> None:
        """purge_quarantined deletes the quarantined records older than the period, each with
        every continuation part, keeps younger ones byte for byte and those from scopes
        outside its prefix, and a second pass deletes nothing."""
        size = min(kv.limits.max_value_bytes, 200_000) + 100  # in parts where values are small
        base = kv.clock
        try:
            for index, (scope, age_days) in enumerate(
                [(f"{ns}:old-a", 40), (f"{ns}:old-b", 35), (f"{ns}:young", 1), (f"{ns}!o", 40)]
            ):
                kv.clock = _shifted(base, -age_days * 86_400)
                raw = bytes([65 + index]) * size
                await quarantine(kv, scope, "k", Entry(raw, f"v{index}"), reason="contract")
        finally:
            kv.clock = base
        removed = await purge_quarantined(kv, 30 * 86_400, scope_prefix=f"{ns}:")
        assert len(removed) == 2
        left = {q.scope: q for q in await list_quarantined(kv) if q.scope.startswith(ns)}
        assert set(left) == {f"{ns}:young", f"{ns}!o"}
        assert left[f"{ns}:young"].raw == b"C" * size
        keys = [i.key async for i in kv.iter_scan(QUARANTINE_SCOPE, values=False)]
        assert not [k for k in keys if k.partition("/")[0] in removed]
        assert await purge_quarantined(kv, 30 * 86_400, scope_prefix=f"{ns}:") == []
        kv.clock = _shifted(base, 1)
        try:  # leave nothing of this test in the shared quarantine scope
            await purge_quarantined(kv, 0, scope_prefix=f"{ns}:")
            await purge_quarantined(kv, 0, scope_prefix=f"{ns}!")
        finally:
            kv.clock = base


# -- doctor: one helper per store and per phase of test_doctor_finds_and_quarantines_every_kind

_Finding = tuple[str, str, str, str]  # (store, kind, scope, key)


async def _damage_sessions(
    kv: KVStore, sessions: SessionStore
) -> tuple[set[_Finding], list[tuple[str, str]]]:
    """A session with an undecodable state and one with a damaged chunk, next to a healthy one.

    The findings doctor must report, and the (scope, key) of the damaged chunk.
    """
    long_history = [m for i in range(30) for m in exchange(f"m{i}")]
    for sid in ("bad-state", "bad-chunk", "healthy"):
        async with sessions.turn(sid) as session:
            session.replace(long_history)
    await plant(kv, sessions.storage.scope_for("bad-state"), STATE_KEY)
    chunk_scope = sessions.storage.scope_for("bad-chunk")
    parts = [i.key async for i in kv.iter_scan(chunk_scope, prefix=CHUNK_PREFIX, values=False)]
    await plant(kv, chunk_scope, parts[0])
    expected = {
        ("sessions", "undecodable", sessions.storage.scope_for("bad-state"), STATE_KEY),
        ("sessions", "damaged-chunk", chunk_scope, STATE_KEY),
    }
    return expected, [(chunk_scope, parts[0])]


async def _damage_memory(
    kv: KVStore, memory: KVMemoryStore, ns: str, memory_prefix: str
) -> tuple[set[_Finding], tuple[str, str]]:
    """An undecodable record, a damaged chunk of a big one and an undecodable operation receipt.

    The findings doctor must report, and the (scope, key) of the damaged chunk.
    """
    from pydantic_ai_harness.memory import MemoryOperation

    await memory.write("dave/main/MEMORY.md", "dave likes tea", expected_version=None)
    await memory.write("dave/main/notes.md", "notes", expected_version=None)
    await memory.write("dave/main/big.md", "tea " * 800, expected_version=None)
    await memory.write(
        "dave/main/op.md",
        "by op",
        expected_version=None,
        operation=MemoryOperation(id=f"{ns}-op", fingerprint="fp"),
    )
    dave = memory.directory_scope("dave/main")
    await plant(kv, dave, "notes.md")
    big_chunks = [i.key async for i in kv.iter_scan(dave, prefix="~c/big.md/", values=False)]
    await plant(kv, dave, big_chunks[0])
    ops_scopes = await kv.scopes(prefix=f"{memory_prefix}~ops/")
    assert len(ops_scopes) == 1
    ops_key = (await kv.scan(ops_scopes[0], limit=1, values=False))[0].key
    await plant(kv, ops_scopes[0], ops_key)
    expected = {
        ("memory", "undecodable", dave, "notes.md"),
        ("memory", "damaged-chunk", dave, "big.md"),
        ("memory", "undecodable", ops_scopes[0], ops_key),
    }
    return expected, (dave, big_chunks[0])


async def _damage_runs(kv: KVStore, checkpointer: Checkpointer) -> set[_Finding]:
    """An undecodable journal entry and a run index entry with no run behind it."""
    for run in ("good", "bad"):
        await checkpointer.append(run, JournalEvent.attempted("s1"))
        await checkpointer.append(run, JournalEvent.completed("s1", {"ok": run}))
    await plant(kv, checkpointer.space.scope("bad"), "j/s1/completed")
    await kv.create(checkpointer.space.runs_scope, "ghost", b"{}")
    return {
        ("runs", "undecodable", checkpointer.space.scope("bad"), "j/s1/completed"),
        ("runs", "dangling-index", checkpointer.space.runs_scope, "ghost"),
    }


async def _scan_finds_and_changes_nothing(
    kv: KVStore, prefixes: dict[str, Any], expected: set[_Finding], checkpointer: Checkpointer
) -> None:
    from agent_stores.doctor import scan

    seen: list[str] = []
    report = await scan(kv, progress=lambda store, scope, i, n: seen.append(scope), **prefixes)
    assert {(f.store, f.kind, f.scope, f.key) for f in report.findings} == expected
    assert not any(f.repaired for f in report.findings)
    assert report.scanned["sessions"] == 3 and report.scanned["runs"] == 2
    assert len(seen) == sum(report.scanned.values())
    # A scan without --repair changes nothing.
    with pytest.raises(CorruptRecordError):
        await checkpointer.load("bad")


async def _repair_quarantines(
    kv: KVStore,
    prefixes: dict[str, Any],
    expected: set[_Finding],
    garbage: list[tuple[str, str]],
) -> None:
    """--repair quarantines every finding with its raw bytes; a second scan is clean."""
    from agent_stores.doctor import scan

    repaired = await scan(kv, repair=True, **prefixes)
    assert {(f.store, f.kind, f.scope, f.key) for f in repaired.findings} == expected
    assert all(
        f.repaired and f.quarantined_as for f in repaired.findings if f.kind != "dangling-index"
    )
    assert repaired.healthy
    assert (await scan(kv, **prefixes)).findings == []

    kept = await list_quarantined(kv)
    origins = {(q.scope, q.origin_key): q.raw for q in kept}
    for _, kind, scope, key in expected:
        if kind == "undecodable":
            assert origins[(scope, key)] == GARBAGE
    for chunk in garbage:
        assert origins[chunk] == GARBAGE


async def _sessions_work_again(reader: SessionStore) -> None:
    for sid in ("bad-state", "bad-chunk"):
        async with reader.turn(sid) as session:
            assert session.messages == []
    async with reader.turn("healthy") as session:
        assert len(session.messages) == 60


async def _memory_works_again(memory: KVMemoryStore) -> None:
    assert await memory.list_paths("dave/", limit=10) == [
        "dave/main/MEMORY.md",
        "dave/main/op.md",
    ]
    assert not memory.problems
    healthy = await memory.read("dave/main/MEMORY.md", max_chars=100)
    assert healthy is not None and healthy.content == "dave likes tea"
    await memory.write("dave/main/notes.md", "new notes", expected_version=None)


async def _runs_work_again(checkpointer: Checkpointer) -> None:
    assert len((await checkpointer.load("good")).entries) == 2
    assert [e.event.phase.value for e in (await checkpointer.load("bad")).entries] == ["attempted"]
    assert "ghost" not in {r.run_id for r in await checkpointer.list_runs(limit=1000)}


def _shifted(clock: Callable[[], float], seconds: float) -> Callable[[], float]:
    """``clock`` moved by ``seconds``."""
    return lambda: clock() + seconds
