"""Run a selection of the ready-to-run suite alone, in a pytest process of its own.

What ``nox -s contract -- NAME -k SELECTION`` does, for a backend package's own tests: a
selection run first on a fresh table, container or database must pass without any other
test having created what it needs (issue 59). ``ISSUE_59_SELECTIONS`` are the two
selections that once failed that way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

#: The two selections issue 59 found failing alone, by name.
ISSUE_59_SELECTIONS = (
    "runs_kept_until_deleted_without_retention",
    "catalog or owner or erase or retention or subject",
)


class AloneRun(NamedTuple):
    """How a selection run alone ended: pytest's exit status and its last lines."""

    returncode: int
    passed: bool
    tail: str


def run_selection_alone(
    url: str, selection: str, *, cwd: Path | str | None = None, timeout: float = 840
) -> AloneRun:
    """Run ``-k selection`` of the suite on ``url`` in a new pytest process."""
    env = {**os.environ, "AGENT_STORES_CONTRACT_URL": url}
    suite = ["--pyargs", "agent_stores_contract.suite", "-k", selection]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *suite],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = done.stdout.splitlines()
    passed = (
        done.returncode == 0
        and " passed" in done.stdout
        and bool(lines)
        and "error" not in lines[-1]
    )
    return AloneRun(
        done.returncode, passed, "\n".join((done.stdout + done.stderr).splitlines()[-30:])
    )
