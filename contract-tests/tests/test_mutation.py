"""The suite tests itself: the KV contract alone must fail every deliberately broken backend.

One pytest subprocess runs ``KVContract`` (model-based test included) once per backend of
``broken_backends.py``, parametrized, and the outcome is read per backend: the unbroken
store passes every test, each broken one fails at least one. The killing tests of each
mutant are printed (``-s``) and summarised in docs/contract.md ("Mutation score").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from broken_backends import MUTANTS

HERE = Path(__file__).parent

SUITE = f"""
import sys
import uuid

import pytest

sys.path.insert(0, {str(HERE)!r})
from broken_backends import MUTANTS, Correct
from agent_stores_contract import KVContract

BACKENDS = {{"correct": Correct, **MUTANTS}}


class TestBroken(KVContract):
    @pytest.fixture(params=sorted(BACKENDS))
    def kv_factory(self, request):
        cls = BACKENDS[request.param]
        name = f"mutant-{{uuid.uuid4().hex}}"
        return lambda: cls(name, max_value_bytes=1 << 17)
"""

RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\S* \S+::(test_\w+)\[([\w-]+)\]")


def test_kv_contract_kills_every_broken_backend(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_broken=SUITE)
    # Only outcomes matter here; --tb=no also keeps pytest from re-parsing source for
    # hundreds of tracebacks (CPython 3.11.7's parser once failed doing so: INTERNALERROR).
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--store-url",
        "memory://",
        "-rA",
        "-q",
        "--tb=no",
        # A bug that livelocks a retry loop fails at this deadline instead of the default 300 s.
        "--contract-timeout",
        "60",
        # Each child test is bounded by --contract-timeout; this only catches a child that
        # hangs outside any test. Generous, so a busy machine never fails a healthy run.
        timeout=3600,
    )
    killed: dict[str, list[str]] = {name: [] for name in ["correct", *MUTANTS]}
    ran: dict[str, int] = dict.fromkeys(killed, 0)
    for line in result.outlines:
        match = RESULT.match(line)
        if match is None:
            continue
        outcome, test, backend = match.groups()
        ran[backend] += 1
        if outcome in ("FAILED", "ERROR"):
            killed[backend].append(test)
    print("\nmutant: tests that fail on it")
    for name, tests in killed.items():
        print(f"  {name} ({len(tests)}): {', '.join(sorted(set(tests)))}")
    assert all(count > 0 for count in ran.values()), f"some backends never ran: {ran}"
    assert killed["correct"] == [], f"the unbroken store failed: {killed['correct']}"
    survivors = [name for name in MUTANTS if not killed[name]]
    assert not survivors, f"the KV contract did not catch: {survivors}"
