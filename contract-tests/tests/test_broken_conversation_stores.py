"""The suite tests itself: the conversation contract must fail every deliberately broken store,
and pass Pydantic AI's own ``InMemoryConversationStore`` through ``--conversation-store``.

One pytest subprocess runs :class:`~agent_stores_contract.conversations.ConversationContract`
once per store of ``agent_stores_contract.broken_conversation_stores`` (parametrized): the
reference (Pydantic AI's in-memory store suspending before every primitive) passes every test,
and each broken one fails at least one of the behaviours
:data:`~agent_stores_contract.broken_conversation_stores.BROKEN` names for it. The killing
behaviours of each are printed (``-s``) and listed in docs/contract.md ("Broken conversation
stores").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agent_stores_contract.broken_conversation_stores import BROKEN
from agent_stores_contract.conversations import ConversationContract
from agent_stores_contract.plugin import standard_tests

SUITE = """
import pytest

from agent_stores_contract.broken_conversation_stores import BROKEN, store_factory
from agent_stores_contract.conversations import ConversationContract


class TestBrokenConversationStores(ConversationContract):
    @pytest.fixture(params=["reference", *sorted(BROKEN)])
    def conversation_store_factory(self, request):
        return store_factory(request.param)
"""

RESULT = re.compile(r"^(PASSED|FAILED|ERROR)\S* \S+::test_(\w+)\[([\w-]+)\]")


def test_conversation_contract_catches_every_broken_store(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_broken_conversation_stores_run=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rA", "-q", "--tb=no", "--contract-timeout", "60", timeout=3600
    )
    names = ["reference", *BROKEN]
    failed: dict[str, list[str]] = {name: [] for name in names}
    ran: dict[str, int] = dict.fromkeys(names, 0)
    for line in result.outlines:
        match = RESULT.match(line)
        if match is None:
            continue
        outcome, test, variant = match.groups()
        ran[variant] += 1
        if outcome in ("FAILED", "ERROR"):
            failed[variant].append(f"conversations.{test}")
    print("\nbroken conversation store: behaviours that fail on it")
    for name, behaviours in failed.items():
        print(f"  {name} ({len(behaviours)}): {', '.join(sorted(set(behaviours)))}")
    tests = len(standard_tests(ConversationContract)) - len(skipped_for_a_third_party())
    assert all(count == tests for count in ran.values()), f"not every test ran: {ran}"
    assert failed["reference"] == [], f"the reference store failed: {failed['reference']}"
    missed = {
        name: spec.caught_by
        for name, spec in BROKEN.items()
        if not set(spec.caught_by) & set(failed[name])
    }
    assert not missed, f"the conversation contract did not catch these as named: {missed}"


def test_pydantic_ais_in_memory_store_passes_through_the_option(pytester: pytest.Pytester) -> None:
    """``--conversation-store pydantic_ai.conversation_store:InMemoryConversationStore``: every
    test passes but those needing other processes, skipped as a declared capability."""
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-q",
        "--pyargs",
        "agent_stores_contract.suite.test_conversations",
        "--conversation-store",
        "pydantic_ai.conversation_store:InMemoryConversationStore",
        timeout=1800,
    )
    outcomes = result.parseoutcomes()
    skipped = skipped_for_a_third_party()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("errors", 0) == 0, result.outlines[-30:]
    assert outcomes.get("skipped", 0) == len(skipped), outcomes
    assert outcomes["passed"] == len(standard_tests(ConversationContract)) - len(skipped)
    result.stdout.fnmatch_lines(
        [
            "*skipped by declared capability*",
            "*shared_across_processes=False*",
            "*agent_stores_store=False*",
        ]
    )


def skipped_for_a_third_party() -> list[str]:
    """The tests a process-local third-party store skips as declared capabilities: those
    needing other processes, and agent-stores' own rules beyond the ABC."""
    return [
        name
        for name in standard_tests(ConversationContract)
        if "process" in name or name.startswith("test_agent_stores_")
    ]


FACTORIES = """
import os

import agent_stores
from pydantic_ai.conversation_store import InMemoryConversationStore


def shared():
    # An async context manager yielding the store, shared by every process.
    return agent_stores.open_conversations(os.environ["CONVERSATION_FACTORY_URL"])


shared.shared_across_processes = True


async def awaited():
    return InMemoryConversationStore()
"""


def test_every_factory_shape_and_a_shared_store_across_processes(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factory returning an async context manager whose store declares itself shared runs
    the tests across processes too (the worker imports and calls the same factory: the
    docstring example resumed in another process); an ``async def`` factory works as well."""
    pytester.makepyfile(conversation_factories=FACTORIES)
    monkeypatch.setenv("CONVERSATION_FACTORY_URL", f"sqlite:///{tmp_path / 'shared.db'}")
    base = [
        "-p",
        "no:cacheprovider",
        "-q",
        "--pyargs",
        "agent_stores_contract.suite.test_conversations",
    ]
    shared = pytester.runpytest_subprocess(
        *base,
        "--conversation-store",
        "conversation_factories:shared",
        "-k",
        "resumed_in_another_process",
        timeout=1800,
    )
    shared.assert_outcomes(passed=1)
    awaited = pytester.runpytest_subprocess(
        *base,
        "--conversation-store",
        "conversation_factories:awaited",
        "-k",
        "round_trips",
        timeout=600,
    )
    awaited.assert_outcomes(passed=1)
