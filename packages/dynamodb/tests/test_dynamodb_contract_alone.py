"""Contract tests run alone pass on a table nobody has created yet (issue 59).

Each selection runs the ready-to-run suite in a pytest process of its own, as
``nox -s contract -- dynamodb -k SELECTION`` does, on a table name no test has used: its
fixtures must create what the test needs (``backend_ready``), not count on other tests
having done it. Both selections failed with ``TableMissingError`` while the checkpointer's
fixture handed out clients nothing had set up.
"""

from __future__ import annotations

import uuid

import pytest
from agent_stores import StoreURL
from agent_stores_contract.alone import ISSUE_59_SELECTIONS, run_selection_alone
from dynamodb_test_support import REPO_ROOT, with_fresh_prefix


def on_a_new_table(url: str) -> str:
    """``url`` with a fresh prefix on a table name nothing has created."""
    parsed = StoreURL.parse(with_fresh_prefix(url))
    return parsed.set(host=f"agent-stores-alone-{uuid.uuid4().hex[:12]}").render_with_secrets()


@pytest.mark.parametrize("selection", ISSUE_59_SELECTIONS)
def test_selection_passes_alone_on_a_new_table(dynamodb_base_url: str, selection: str) -> None:
    """The selection, alone in its own process on a table never created, passes."""
    done = run_selection_alone(on_a_new_table(dynamodb_base_url), selection, cwd=REPO_ROOT)
    assert done.passed, f"-k {selection!r} failed alone:\n{done.tail}"
