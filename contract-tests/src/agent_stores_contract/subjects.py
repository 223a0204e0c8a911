"""The subject erasure contract: one subject's sessions, memory and runs erased together.

Part of :class:`~agent_stores_contract.sessions.SessionContract` (every backend that runs
the session contract runs these): ``erase_subject`` removes every session, memory
namespace (files, chunks, metadata, receipts, markers), run (journal, step records,
listing and lineage entries, runs it started) and quarantined copy of the subject, ends
with a report of zero entries left, leaves every entry of another subject identical
(value and version), refuses the subject's writes while it runs, and finishes the work
of an erase killed midway.

Subjects, memory prefixes and run prefixes are namespaced by the test's ``ns``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from agent_stores.checkpointer import Checkpointer, JournalEvent, Phase, make_step_id
from agent_stores.damage import QUARANTINE_SCOPE, quarantine
from agent_stores.erasure import SubjectErasure, erase_subject
from agent_stores.kv import KVStore
from agent_stores.memory import KVMemoryStore
from agent_stores.memory.port import KVMemoryPort
from agent_stores.sessions import SessionStore
from agent_stores.subjects import (
    ERASING_KEY,
    SubjectErasingError,
    SubjectIndex,
    namespace_subject,
)
from pydantic_ai_harness.memory import MemoryOperation
from pydantic_ai_harness.step_persistence import RunRecord

from .base import ContractBase, KVFactory, require_capability
from .catalog import killed_after_drops, populate_owners, raw_entries

SessionsFactory = Callable[..., Awaitable[SessionStore]]


@dataclass
class Stores:
    """The three stores of one test on one KV client (the KV is the session store's)."""

    sessions: SessionStore
    memory: KVMemoryStore
    checkpointer: Checkpointer

    @property
    def kv(self) -> KVStore:
        return self.sessions.kv

    async def erase(self, subject: str) -> SubjectErasure:
        return await erase_subject(
            subject, sessions=self.sessions, memory=self.memory, checkpointer=self.checkpointer
        )


def memory_prefix(ns: str) -> str:
    return f"{ns}:memory:"


def runs_prefix(ns: str) -> str:
    return f"{ns}/"


async def subject_data(stores: Stores, ns: str, who: str, sessions: list[str]) -> list[str]:
    """Memory files (one chunked, one with metadata, receipts) and runs of ``<ns>-<who>``:
    a run bound to the subject, one registered with the subject in its metadata, one of
    its first session's conversation and one started by that. Returns the run ids."""
    subject = f"{ns}-{who}"
    memory = stores.memory
    await memory.write(f"{subject}/MEMORY.md", f"{who} likes tea", expected_version=None)
    await memory.write(
        f"{subject}/notes/long.md",
        "x" * 3 * stores.kv.limits.max_value_bytes,
        expected_version=None,
        operation=MemoryOperation(id=f"{subject}-op", fingerprint="f"),
    )
    await memory.write_with_metadata(
        f"{subject}/notes/meta.md", "m", expected_version=None, metadata={"by": "agent"}
    )
    journal = stores.checkpointer
    bound, registered, conversed, child = (f"{subject}-run-{i}" for i in range(4))
    await journal.bind_subject(bound, subject)
    for i in range(3):
        event = JournalEvent(step_id=make_step_id(i, "model"), phase=Phase.ATTEMPTED, payload={})
        await journal.append(bound, event)
    steps = journal.step_store()
    await steps.register_run(RunRecord(run_id=registered, metadata={"subject": subject}))
    await steps.register_run(RunRecord(run_id=conversed, conversation_id=sessions[0]))
    await steps.register_run(RunRecord(run_id=child, parent_run_id=conversed))
    return [bound, registered, conversed, child]


async def quarantined_from(kv: KVStore, scope: str, key: str) -> str:
    """Quarantine a copy of ``(scope, key)`` (as ``doctor --repair`` would); its key."""
    entry = await kv.get(scope, key)
    assert entry is not None, (scope, key)
    return await quarantine(kv, scope, key, entry, reason="contract test")


class SubjectBehaviours(ContractBase):
    """Erasure of a subject across the three stores; a base of the session contract."""

    async def _stores(
        self, sessions_factory: SessionsFactory, ns: str, **options: object
    ) -> Stores:
        sessions = await sessions_factory(tail_bytes=256, **options)
        kv = sessions.kv
        generic = self.store_path == "generic"
        memory = KVMemoryStore(
            kv,
            scope_prefix=memory_prefix(ns),
            subject_of=namespace_subject(),
            port=KVMemoryPort(kv) if generic else None,
        )
        checkpointer = Checkpointer(kv, scope_prefix=runs_prefix(ns))
        return Stores(sessions, memory, checkpointer)

    async def _scopes_of(
        self, stores: Stores, ns: str, who: str, sessions: list[str], runs: list[str]
    ) -> list[str]:
        subject = f"{ns}-{who}"
        memory = stores.memory
        space = stores.checkpointer.space
        return [
            *(stores.sessions.storage.scope_for(sid) for sid in sessions),
            memory.directory_scope(subject),
            memory.directory_scope(f"{subject}/notes"),
            *(space.scope(run) for run in runs),
        ]

    async def _populated(
        self, stores: Stores, ns: str
    ) -> tuple[list[str], list[str], list[str], list[str], list[str], list[str]]:
        """Sessions, memory and runs of alice and bob: for each, its session ids, run ids and
        scopes (bob's with his subject scope, compared entry by entry)."""
        alice, others = await populate_owners(stores.sessions, ns)
        bob = [sid for sid in others if "bob" in sid]
        alice_runs = await subject_data(stores, ns, "alice", alice)
        bob_runs = await subject_data(stores, ns, "bob", bob)
        alice_scopes = await self._scopes_of(stores, ns, "alice", alice, alice_runs)
        bob_scopes = await self._scopes_of(stores, ns, "bob", bob, bob_runs)
        bob_scopes.append(SubjectIndex(stores.kv).scope_for(f"{ns}-bob"))
        return alice, alice_runs, alice_scopes, bob, bob_runs, bob_scopes

    async def _cleanup(self, kv: KVStore, ns: str) -> None:
        for who in ("alice", "bob"):
            await kv.drop_scope(SubjectIndex(kv).scope_for(f"{ns}-{who}"))

    async def _assert_erased(
        self, stores: Stores, ns: str, alice_scopes: list[str], memory_root: str
    ) -> None:
        """Nothing of alice is left: her scopes are empty, her memory namespace is gone
        from the root (bob's is there), her receipts and subject entries too."""
        kv = stores.kv
        for scope in alice_scopes:
            assert await raw_entries(stores.sessions, scope) == {}, scope
        assert await stores.memory.list_paths(f"{ns}-alice/", limit=10) == []
        root = await raw_entries(stores.sessions, memory_root)
        assert f"{ns}-alice/" not in root and f"{ns}-bob/" in root
        op = MemoryOperation(id=f"{ns}-alice-op", fingerprint="f")
        assert await stores.memory.get_operation(op) is None
        assert await SubjectIndex(kv).left(f"{ns}-alice") == 0

    async def _assert_untouched(
        self,
        stores: Stores,
        ns: str,
        bob_runs: list[str],
        bob_scopes: list[str],
        before: dict[str, dict[str, tuple[bytes, str]]],
    ) -> None:
        """Everything of bob is as it was: his runs are the ones listed, every entry of
        his scopes has the value and version it had, his receipt is there."""
        listed = await stores.checkpointer.list_runs(limit=100)
        assert {info.run_id for info in listed} == set(bob_runs)
        for scope in bob_scopes:
            assert await raw_entries(stores.sessions, scope) == before[scope], scope
        bob_op = MemoryOperation(id=f"{ns}-bob-op", fingerprint="f")
        assert await stores.memory.get_operation(bob_op) is not None

    async def test_erase_subject_removes_everything_of_the_subject_and_nothing_else(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """erase_subject drops the subject's sessions, memory namespace (chunks, metadata,
        receipts, markers), runs (bound, registered with the subject, of its conversation,
        started by one of those) and quarantined copies; the report names them with zero
        entries left; every entry of the other subject is identical, value and version,
        before and after; a second erase finds nothing."""
        stores = await self._stores(sessions_factory, ns)
        kv = stores.kv
        copies: list[str] = []
        try:
            alice, alice_runs, alice_scopes, bob, bob_runs, bob_scopes = await self._populated(
                stores, ns
            )
            memory_root = stores.memory.directory_scope("")
            alice_copy = await quarantined_from(kv, alice_scopes[len(alice)], "MEMORY.md")
            copies.append(alice_copy)
            bob_copy = await quarantined_from(kv, bob_scopes[len(bob)], "MEMORY.md")
            copies.append(bob_copy)
            before = {scope: await raw_entries(stores.sessions, scope) for scope in bob_scopes}
            assert all(before.values())

            report = await stores.erase(f"{ns}-alice")
            assert report.complete and report.entries_left == 0 and not report.resumed
            assert sorted(report.sessions) == sorted(alice)
            assert report.namespaces == (f"{memory_prefix(ns)}{ns}-alice/",)
            assert sorted(report.runs) == sorted(alice_runs)
            assert report.quarantined >= 1
            # What the erase must have removed, then what it must have left as it was.
            await self._assert_erased(stores, ns, alice_scopes, memory_root)
            quarantined = await raw_entries(stores.sessions, QUARANTINE_SCOPE)
            assert alice_copy not in quarantined and bob_copy in quarantined
            await self._assert_untouched(stores, ns, bob_runs, bob_scopes, before)

            again = await stores.erase(f"{ns}-alice")
            assert again.complete and again.sessions == () and again.runs == ()
            assert again.namespaces == ()
        finally:
            for copy in copies:
                await kv.delete(QUARANTINE_SCOPE, copy)
            await self._cleanup(kv, ns)

    async def test_erase_subject_refuses_the_subjects_writes_until_done(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """While an erase of the subject is unfinished (its marker present), a memory
        write or delete in its namespace, a run bound to it and a run registered with it
        are refused with SubjectErasingError and store nothing, while another subject's
        writes go through; the next erase completes it (resumed); shortly after, the
        subject's writes are refused still, and accepted again once that time has passed."""
        stores = await self._stores(sessions_factory, ns)
        kv = stores.kv
        subject = f"{ns}-alice"
        try:
            await stores.memory.write(f"{subject}/MEMORY.md", "before", expected_version=None)
            await kv.create(SubjectIndex(kv).scope_for(subject), ERASING_KEY, b"{}")  # cut off
            with pytest.raises(SubjectErasingError):
                await stores.memory.write(f"{subject}/new.md", "refused", expected_version=None)
            with pytest.raises(SubjectErasingError):
                await stores.memory.delete(f"{subject}/MEMORY.md", expected_version=None)
            with pytest.raises(SubjectErasingError):
                await stores.checkpointer.bind_subject(f"{subject}-run", subject)
            with pytest.raises(SubjectErasingError):
                await stores.checkpointer.step_store().register_run(
                    RunRecord(run_id=f"{subject}-run", metadata={"subject": subject})
                )
            assert await stores.checkpointer.get_run_info(f"{subject}-run") is None
            assert await stores.memory.list_paths(f"{subject}/", limit=10) == [
                f"{subject}/MEMORY.md"
            ]
            await stores.memory.write(f"{ns}-bob/MEMORY.md", "fine", expected_version=None)

            report = await stores.erase(subject)
            assert report.resumed and report.complete
            assert await stores.memory.list_paths(f"{subject}/", limit=10) == []
            with pytest.raises(SubjectErasingError):
                await stores.memory.write(f"{subject}/again.md", "too soon", expected_version=None)
            base = kv.clock
            kv.clock = lambda: base() + 3600
            await stores.memory.write(f"{subject}/again.md", "welcome back", expected_version=None)
            assert await stores.memory.list_paths(f"{subject}/", limit=10) == [
                f"{subject}/again.md"
            ]
        finally:
            await self._cleanup(kv, ns)

    async def test_erase_subject_killed_midway_then_run_again_completes(
        self, sessions_factory: SessionsFactory, store_url: str, kv_factory: KVFactory, ns: str
    ) -> None:
        """A process erasing the subject is SIGKILLed after five scopes were dropped (the
        sessions gone, memory and runs not yet); erase_subject run again reports the erase
        resumed and complete, every scope of the subject empty, and every entry of the
        other subject unchanged."""
        stores = await self._stores(sessions_factory, ns)
        kv = stores.kv
        require_capability(kv, "shared_across_processes", "a second process cannot share its data")
        try:
            _, alice_runs, alice_scopes, _, _, bob_scopes = await self._populated(stores, ns)
            before = {scope: await raw_entries(stores.sessions, scope) for scope in bob_scopes}
            await killed_after_drops(
                5, "erase-subject", store_url, f"{ns}-alice", memory_prefix(ns), runs_prefix(ns)
            )
            assert await stores.memory.list_paths(f"{ns}-alice/", limit=10) != []  # cut off
            report = await stores.erase(f"{ns}-alice")
            assert report.resumed and report.complete
            assert set(report.runs) == set(alice_runs)
            for scope in alice_scopes:
                assert await raw_entries(stores.sessions, scope) == {}, scope
            for scope in bob_scopes:
                assert await raw_entries(stores.sessions, scope) == before[scope], scope
        finally:
            await self._cleanup(kv, ns)
