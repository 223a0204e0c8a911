"""Contract tests run alone pass on a table nobody has created yet (issue 59).

Each selection runs the ready-to-run suite in a pytest process of its own, as
``nox -s contract -- dynamodb -k SELECTION`` does, on a table name no test has used: its
fixtures must create what the test needs (``backend_ready``), not count on other tests
having done it. Both selections failed with ``TableMissingError`` while the checkpointer's
fixture handed out clients nothing had set up.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from agent_stores import StoreURL
from dynamodb_test_support import REPO_ROOT, with_fresh_prefix

#: The two selections of the issue, by name.
SELECTIONS = [
    "runs_kept_until_deleted_without_retention",
    "catalog or owner or erase or retention or subject",
]


def on_a_new_table(url: str) -> str:
    """``url`` with a fresh prefix on a table name nothing has created."""
    parsed = StoreURL.parse(with_fresh_prefix(url))
    return parsed.set(host=f"agent-stores-alone-{uuid.uuid4().hex[:12]}").render_with_secrets()


@pytest.mark.parametrize("selection", SELECTIONS)
def test_selection_passes_alone_on_a_new_table(dynamodb_base_url: str, selection: str) -> None:
    """The selection, alone in its own process on a table never created, passes."""
    env = {**os.environ, "AGENT_STORES_CONTRACT_URL": on_a_new_table(dynamodb_base_url)}
    suite = ["--pyargs", "agent_stores_contract.suite", "-k", selection]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *suite],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
    assert done.returncode == 0, f"-k {selection!r} failed alone:\n{tail}"
    assert " passed" in done.stdout and "error" not in done.stdout.splitlines()[-1], tail
