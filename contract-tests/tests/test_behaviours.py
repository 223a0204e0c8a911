"""Behaviours: every contract test has an id and a sentence, and docs/contract.md lists them all."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores_contract import KVContract
from agent_stores_contract.behaviours import (
    behaviour_id,
    behaviours,
    check_documented,
    render,
)

PAGE = Path(__file__).parents[2] / "docs" / "contract.md"


def test_docs_list_every_behaviour() -> None:
    problems = check_documented(PAGE.read_text())
    assert not problems, (
        "docs/contract.md is out of date: "
        + "; ".join(problems)
        + " (python -m agent_stores_contract.behaviours --write docs/contract.md)"
    )


def test_a_behaviour_dropped_from_the_suite_is_reported() -> None:
    page = PAGE.read_text()
    fake = "| `kv.a_removed_guarantee` | a guarantee the suite no longer checks. |\n"
    anchor = "| `kv.create_then_get` |"
    assert anchor in page
    problems = check_documented(page.replace(anchor, fake + anchor, 1))
    assert any("kv.a_removed_guarantee" in p and "no longer in the suite" in p for p in problems)


def test_an_undocumented_behaviour_is_reported() -> None:
    page = render()
    line = next(line for line in page.splitlines() if line.startswith("| `kv.create_then_get`"))
    problems = check_documented(page.replace(line + "\n", ""))
    assert problems == ["behaviour kv.create_then_get is in the suite but not documented"]


def test_ids_are_unique_and_sentences_present() -> None:
    found = behaviours()
    ids = [b.id for b in found]
    assert len(ids) == len(set(ids))
    assert {b.store for b in found} >= {"kv", "sessions", "memory", "checkpointer"}
    for item in found:
        assert len(item.sentence) > 20, f"{item.id} has no sentence"
    assert behaviour_id(KVContract, "test_create_then_get") == "kv.create_then_get"


def test_every_contract_test_records_its_behaviour_id(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_backend="""
from agent_stores_contract import KVContract

class TestMine(KVContract):
    pass

def test_ids(request):
    pass
"""
    )
    pytester.makeconftest(
        """
import json
def pytest_collection_finish(session):
    ids = {item.name: dict(item.user_properties).get("behaviour") for item in session.items}
    print("IDS=" + json.dumps(ids))
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--store-url", "memory://", "--collect-only", "-q"
    )
    line = next(line for line in result.outlines if line.startswith("IDS="))
    assert '"test_create_then_get": "kv.create_then_get"' in line
    assert '"test_model_based_sequences": "kv.model_based_sequences"' in line
