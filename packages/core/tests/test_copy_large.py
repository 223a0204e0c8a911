"""``agent-stores copy`` into a destination with a smaller value limit.

The source is SQLite (4 MB per entry); the destination is ``memory://`` opened with a
small ``max_value_bytes``, so every 4 MB record must be re-chunked: a session history,
memory files (inline and chunked content), journal entries (inline and chunked) and a
harness snapshot. A record that cannot be split fails its unit only, and a unit whose
copy fails midway (an injected fault on the destination) leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from agent_stores import connect, doctor
from agent_stores.cli import cli
from agent_stores.kv import KVStore
from agent_stores.kv.faulty import KVFaultInjector
from agent_stores.sessions import RecoveryRequiredError
from agent_stores.transfer import Transfer
from click.testing import CliRunner
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai_harness.memory import MemoryOperation
from pydantic_ai_harness.step_persistence import RunRecord, StepPersistence, continue_run

MB = 1 << 20
LIMIT = 64 << 10
"""The destination's value limit: small, so the memory:// copies stay quick."""


def small_destination(limit: int = LIMIT) -> str:
    return f"memory://large-{uuid.uuid4().hex[:10]}?max_value_bytes={limit}"


def big_history() -> list[ModelMessage]:
    """About 4 MB of history: two large prompts (one of multi-byte characters), a tool call."""
    return [
        ModelRequest(parts=[UserPromptPart(content="read this: " + "é✓" * (MB // 2))]),
        ModelResponse(parts=[TextPart(content="ok " + "y" * (2 * MB))]),
        ModelRequest(parts=[UserPromptPart(content="now pay")]),
        ModelResponse(parts=[ToolCallPart(tool_name="pay", args={"n": 1}, tool_call_id="c9")]),
    ]


async def populate(url: str) -> dict[str, Any]:
    """4 MB records in every store, written through the public stores on SQLite."""
    from agent_stores.checkpointer import JournalEvent
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    facts: dict[str, Any] = {}
    async with connect(url) as conn:
        await conn.kv.setup()
        sessions = conn.sessions()
        history = big_history()
        facts["history"] = ModelMessagesTypeAdapter.dump_json(history)
        async with sessions.turn("big") as session:
            session.replace(history)
            await session.mark_effects([("pay", "c9")])  # a recovery latch to carry over
        memory = conn.memory()
        inline = "ñ" * (2 * MB - 4096)  # 4 MB of UTF-8, inline in one SQLite record
        first = await memory.write_with_metadata(
            "notes/inline.md",
            inline,
            expected_version=None,
            metadata={"topic": "large " * 20},
            operation=MemoryOperation("op-inline", "fp-inline"),
        )
        chunked = "abc " * (5 * MB // 4)  # 5 MB: chunks even on SQLite
        second = await memory.write("notes/chunked.md", chunked, expected_version=None)
        await memory.write("notes/small.md", "small", expected_version=None)
        facts["memory"] = {
            "notes/inline.md": (inline, first.version),
            "notes/chunked.md": (chunked, second.version),
        }
        checkpointer = conn.checkpointer()
        inline_payload = "p" * (4 * MB - 4096)  # inline on SQLite
        chunked_payload = ["q" * MB] * 5  # 5 MB: a stub and chunks on SQLite
        await checkpointer.append(
            "big-run", JournalEvent(step_id="000001-a", payload=inline_payload)
        )
        await checkpointer.append(
            "big-run", JournalEvent(step_id="000002-b", payload=chunked_payload)
        )
        facts["journal"] = [inline_payload, chunked_payload]
        steps = checkpointer.step_store()
        agent: Any = Agent(TestModel(custom_output_text="done"))
        result = await agent.run(
            "summarise " + "z" * (4 * MB),
            capabilities=[StepPersistence(store=steps, run_id="snap-run")],
        )
        facts["run_messages"] = ModelMessagesTypeAdapter.dump_json(result.all_messages())
    return facts


async def check(url: str, facts: dict[str, Any], limit: int) -> None:
    """The copy behaves on the destination, and every entry fits its limit."""
    from agent_stores.checkpointer import JournalEvent

    async with connect(url) as conn:
        for prefix in ("session:", "memory:", "cp/"):
            for scope in await conn.kv.scopes(prefix=prefix, limit=1000):
                async for item in conn.kv.iter_scan(scope):
                    assert item.entry is not None and len(item.entry.value) <= limit
        sessions = conn.sessions()
        info = await sessions.inspect("big")
        assert info is not None and [c.tool_call_id for c in info.pending_effects] == ["c9"]
        messages = await sessions.read_messages("big")
        assert messages is not None
        assert ModelMessagesTypeAdapter.dump_json(messages) == facts["history"]
        with pytest.raises(RecoveryRequiredError):
            async with sessions.turn("big", timeout_seconds=1):
                pass
        memory = conn.memory()
        for path, (content, version) in facts["memory"].items():
            found = await memory.read(path, max_chars=10 * MB)
            assert found is not None and found.content == content and found.version == version
            head = await memory.read(path, max_chars=10)
            assert head is not None and head.content == content[:10] and head.truncated
        inline = await memory.read("notes/inline.md", max_chars=10)
        assert inline is not None and inline.metadata == {"topic": "large " * 20}
        replay = await memory.write_with_metadata(
            "notes/inline.md",
            "whatever",
            expected_version=None,
            metadata={"topic": "large " * 20},
            operation=MemoryOperation("op-inline", "fp-inline"),
        )
        assert replay.replayed  # the receipt came along
        checkpointer = conn.checkpointer()
        state = await checkpointer.load("big-run")
        assert [e.payload for e in state.events] == facts["journal"]
        again = await checkpointer.append(
            "big-run", JournalEvent(step_id="000002-b", payload=facts["journal"][1])
        )
        assert again.duplicate and not again.payload_diverged  # the stub keeps its fingerprint
        continued = await continue_run(checkpointer.step_store(), run_id="snap-run")
        assert ModelMessagesTypeAdapter.dump_json(continued) == facts["run_messages"]
        report = await doctor.scan(conn.kv)
        assert report.healthy, [f.as_dict() for f in report.findings]


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """One populated SQLite source shared by the tests (they only read it)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('large')}/src.db"
    return url, asyncio.run(populate(url))


# -- re-chunking ------------------------------------------------------------------------


def test_large_records_are_rechunked_and_verify_by_content(
    source: tuple[str, dict[str, Any]],
) -> None:
    src, facts = source
    dst = small_destination()
    dry = run_cli("copy", src, dst, "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert not json.loads(dry.output)["too_large"]
    result = run_cli("copy", src, dst, "--verify", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["verify"]["ok"] and not doc["failed"]
    copied = {r["kind"]: r for r in doc["kinds"]}
    # The big session, the notes directory, and both large runs were re-cut.
    assert copied["sessions"]["rechunked"] == 1
    assert copied["memory"]["rechunked"] == 1
    assert copied["runs"]["rechunked"] == 2
    checked = {r["kind"]: r for r in doc["verify"]["kinds"]}
    assert all(r["mismatches"] == 0 and r["only_in_destination"] == 0 for r in checked.values())
    assert checked["memory"]["rechunked"] == 1
    # A rerun finds every re-cut record in place: nothing created or updated.
    again = json.loads(run_cli("copy", src, dst, "--json").output)
    assert all(r["created"] == 0 and r["updated"] == 0 for r in again["kinds"]), again
    asyncio.run(check(dst, facts, LIMIT))


async def test_rechunked_units_keep_working_on_the_destination(
    source: tuple[str, dict[str, Any]],
) -> None:
    """Stores writing on the destination after the copy read and extend what was re-cut."""
    src, facts = source
    dst = small_destination()
    async with connect(src) as a, connect(dst) as b:
        report = await Transfer(a.kv, b.kv, src_sessions=a.sessions()).copy()
        assert report.ok, report
        sessions = b.sessions()
        assert await sessions.clear_recovery("big")  # the latch works as on the source
        async with sessions.turn("big") as session:
            session.replace([*session.messages, ModelRequest(parts=[UserPromptPart("more")])])
        messages = await sessions.read_messages("big")
        assert messages is not None and len(messages) == 5
        expected = ModelMessagesTypeAdapter.validate_json(facts["history"])
        assert ModelMessagesTypeAdapter.dump_json(
            messages[:4]
        ) == ModelMessagesTypeAdapter.dump_json(expected)
        memory = b.memory()
        content, version = facts["memory"]["notes/inline.md"]
        written = await memory.write("notes/inline.md", content + "!", expected_version=version)
        found = await memory.read("notes/inline.md", max_chars=10 * MB)
        assert found is not None and found.content == content + "!"
        assert found.version == written.version
        assert await memory.collect_garbage() >= 0
        assert (await doctor.scan(b.kv)).healthy


async def test_verify_reports_a_damaged_rechunked_part(
    source: tuple[str, dict[str, Any]],
) -> None:
    src, _ = source
    dst = small_destination()
    async with connect(src) as a, connect(dst) as b:
        assert (await Transfer(a.kv, b.kv).copy()).ok
        scope = "memory:notes"
        parts = [i async for i in b.kv.iter_scan(scope, prefix="~c/inline.md/")]
        assert len(parts) > 10
        victim = parts[3]
        assert victim.entry is not None
        flipped = victim.entry.value[:-2] + "ü".encode()  # same size, other content
        await b.kv.replace(scope, victim.key, flipped, expected_version=victim.entry.version)
        missing = parts[5]
        await b.kv.delete(scope, missing.key)
        report = await Transfer(a.kv, b.kv).verify()
        assert not report.ok
        # Compared by content: the file record whose chunks changed is the difference.
        assert report.kinds["memory"].mismatches == [(scope, "inline.md", "different value")]
        assert report.kinds["sessions"].mismatches == []
        repaired = await Transfer(a.kv, b.kv).copy()
        assert (
            repaired.ok and repaired.kinds["memory"].created + repaired.kinds["memory"].updated == 2
        )
        assert (await Transfer(a.kv, b.kv).verify()).ok


# -- records that cannot fit ---------------------------------------------------------------


def test_a_record_that_cannot_be_split_is_listed_and_fails_its_unit_only(tmp_path: Path) -> None:
    src = f"sqlite:///{tmp_path}/src.db"
    dst = small_destination()

    async def populate_runs() -> None:
        from agent_stores.checkpointer import JournalEvent

        async with connect(src) as conn:
            await conn.kv.setup()
            steps = conn.checkpointer().step_store()
            # The run record holds the metadata; readers never unpack it, so it cannot be
            # split: 200 KB does not fit a 64 KB destination.
            await steps.register_run(
                RunRecord(run_id="fat", conversation_id="conv", metadata={"blob": "m" * 200_000})
            )
            await steps.register_run(RunRecord(run_id="thin", conversation_id="conv"))
            await conn.checkpointer().append("thin", JournalEvent(step_id="000001-a", payload=1))
            await conn.checkpointer().append(
                "fat", JournalEvent(step_id="000001-a", payload="x" * MB)
            )

    asyncio.run(populate_runs())
    dry = run_cli("copy", src, dst, "--dry-run", "--json")
    assert dry.exit_code == 1
    doc = json.loads(dry.output)
    [listed] = doc["too_large"]["runs"]
    assert listed["scope"] == "cp/run/fat" and listed["key"] == "run"
    assert listed["size"] > 200_000 and listed["limit"] == LIMIT
    assert [scope for scope, _ in doc["failed"]["runs"]] == ["cp/run/fat"]
    human = run_cli("copy", src, dst, "--dry-run")
    assert "too large" in human.output and "cp/run/fat" in human.output

    result = run_cli("copy", src, dst, "--json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    [(scope, why)] = doc["failed"]["runs"]
    assert scope == "cp/run/fat" and "not copied" in why and str(LIMIT) in why

    async def inspect() -> None:
        async with connect(dst) as conn:
            assert await conn.kv.scan("cp/run/fat", limit=10) == []
            # No listing or lineage entry names the run that was not copied.
            assert [i.key for i in await conn.kv.scan("cp/runs", limit=10)] == ["thin"]
            conv = await conn.kv.scopes(prefix="cp/conv/", limit=10)
            assert [[i.key for i in await conn.kv.scan(s, limit=10)] for s in conv] == [["thin"]]
            state = await conn.checkpointer().load("thin")
            assert [e.payload for e in state.events] == [1]
            report = await doctor.scan(conn.kv)
            assert report.healthy, [f.as_dict() for f in report.findings]

    asyncio.run(inspect())
    clean = run_cli("doctor", dst, "--json")
    assert clean.exit_code == 0, clean.output


# -- a unit failing midway -----------------------------------------------------------------


class FailNthWrite(KVFaultInjector):
    """Fails the ``n``-th create or replace with ``fault`` (through the injector's public API)."""

    def __init__(self, n: int, fault: str = "Unavailable") -> None:
        super().__init__()
        self.n = n
        self.fault = fault
        self.writes = 0

    def next_fault(self, operation: str | None = None, *, eligible: Any = None) -> str | None:
        if operation in ("create", "replace"):
            self.writes += 1
            if self.writes == self.n:
                return self.fault
        return None


async def _entries(kv: KVStore, prefix: str) -> dict[tuple[str, str], bytes]:
    out = {}
    for scope in await kv.scopes(prefix=prefix, limit=1000):
        async for item in kv.iter_scan(scope):
            assert item.entry is not None
            out[(scope, item.key)] = item.entry.value
    return out


@pytest.mark.parametrize("fault", ["Unavailable", "LostReply"])
@pytest.mark.parametrize(
    ("kinds", "nth"),
    [(["sessions"], 7), (["memory"], 12), (["memory"], 1), (["runs"], 9)],
)
async def test_a_unit_failing_midway_leaves_nothing_behind(
    source: tuple[str, dict[str, Any]], kinds: list[str], nth: int, fault: str
) -> None:
    src, facts = source
    dst = small_destination()
    async with connect(src) as a, connect(dst) as b:
        # Data the destination held before the copy, in a scope the copy writes to.
        before_memory = b.memory()
        await before_memory.write("notes/mine.md", "the destination's own", expected_version=None)
        before = await _entries(b.kv, "")
        injector = FailNthWrite(nth, fault)
        faulty = injector.wrap(b.kv)
        report = await Transfer(a.kv, faulty, kinds=kinds, jobs=1).copy()
        assert not report.ok
        [stats] = report.kinds.values()
        assert len(stats.failed) == 1, stats.failed
        scope, why = stats.failed[0]
        assert "unavailable" in why.lower() or "connection lost" in why
        # The first write refused outright created nothing there was to remove.
        assert ("removed" in why) == (nth > 1 or fault == "LostReply"), why
        after = await _entries(b.kv, "")
        # Nothing of the failed unit is left, and what was there before is untouched.
        assert {k: v for k, v in after.items() if k[0] == scope} == {
            k: v for k, v in before.items() if k[0] == scope
        }
        assert all(after[k] == v for k, v in before.items())
        scanned = await doctor.scan(b.kv)
        assert scanned.healthy, [f.as_dict() for f in scanned.findings]
        mine = await b.memory().read("notes/mine.md", max_chars=100)
        assert mine is not None and mine.content == "the destination's own"
        # Copying again completes the unit.
        assert (await Transfer(a.kv, b.kv, kinds=kinds).copy()).ok
        assert (await Transfer(a.kv, b.kv, kinds=kinds).verify()).ok
    if kinds == ["runs"]:
        async with connect(dst) as conn:
            state = await conn.checkpointer().load("big-run")
            assert [e.payload for e in state.events] == facts["journal"]


class FailNthWriteAndDeletes(FailNthWrite):
    """Also fails every delete: what the failed unit created cannot be taken back out."""

    def next_fault(self, operation: str | None = None, *, eligible: Any = None) -> str | None:
        if operation == "delete":
            return self.fault
        return super().next_fault(operation, eligible=eligible)


async def test_a_failed_unit_says_what_it_could_not_take_back_out() -> None:
    src = f"memory://small-{uuid.uuid4().hex[:10]}"
    dst = small_destination()
    async with connect(src) as a, connect(dst) as b:
        await a.kv.setup()
        await a.memory().write("notes/a.md", "first", expected_version=None)
        await a.memory().write("notes/b.md", "second", expected_version=None)
        # Writes: the directory listing (scope "memory:"), then a.md, then b.md fails.
        faulty = FailNthWriteAndDeletes(3).wrap(b.kv)
        report = await Transfer(a.kv, faulty, kinds=["memory"], jobs=1).copy()
        [(scope, why)] = report.kinds["memory"].failed
        assert scope == "memory:notes"
        assert why.endswith(
            "; 1 entry it created could not be removed from the destination "
            "(copy again to complete the unit)"
        ), why
        assert [i.key for i in await b.kv.scan(scope, limit=10)] == ["a.md"]
        # As the message says: copying again completes the unit.
        assert (await Transfer(a.kv, b.kv, kinds=["memory"]).copy()).ok
        assert (await Transfer(a.kv, b.kv, kinds=["memory"]).verify()).ok


async def test_a_failed_run_leaves_no_index_entry(source: tuple[str, dict[str, Any]]) -> None:
    """The runs listing is copied after the runs: a run that failed is not listed."""
    src, _ = source
    dst = small_destination()
    async with connect(src) as a, connect(dst) as b:
        report = await Transfer(a.kv, FailNthWrite(3).wrap(b.kv), kinds=["runs"], jobs=1).copy()
        [(scope, _)] = report.kinds["runs"].failed
        run_id = scope.removeprefix("cp/run/")
        listed = [i.key for i in await b.kv.scan("cp/runs", limit=10)]
        assert run_id not in listed and listed  # the other run is listed
        assert (await doctor.scan(b.kv)).healthy


async def test_a_rerun_after_a_copy_cut_short_reuses_its_chunks(
    source: tuple[str, dict[str, Any]],
) -> None:
    """A copy killed after a file's new chunks but before its record: the rerun names the
    chunks as before, finds them in place and writes only the record (no orphans)."""
    src, facts = source
    dst = small_destination()
    async with connect(src) as a, connect(dst) as b:
        assert (await Transfer(a.kv, b.kv, kinds=["memory"]).copy()).ok
        chunks = [i.key async for i in b.kv.iter_scan("memory:notes", prefix="~c/inline.md/")]
        assert len(chunks) > 10
        await b.kv.delete("memory:notes", "inline.md")  # what the kill left: chunks only
        again = await Transfer(a.kv, b.kv, kinds=["memory"]).copy()
        assert again.ok and again.kinds["memory"].created == 1
        assert again.kinds["memory"].updated == 0
        after = [i.key async for i in b.kv.iter_scan("memory:notes", prefix="~c/inline.md/")]
        assert after == chunks
        found = await b.memory().read("notes/inline.md", max_chars=10 * MB)
        content, version = facts["memory"]["notes/inline.md"]
        assert found is not None and found.content == content and found.version == version
