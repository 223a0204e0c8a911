"""The suite tests itself: the port contract must fail every deliberately broken port.

One pytest subprocess runs :class:`~agent_stores_contract.ports.PortContract` on
``memory://`` once per port set of ``agent_stores_contract.broken_ports`` (parametrized):
the reference ports (correct, written on the public KV API) pass every test, and each
broken one (a reference with one realistic bug) fails at least one of the behaviours
:data:`~agent_stores_contract.broken_ports.BROKEN` names for it. The killing behaviours of
each are printed (``-s``) and listed in docs/contract.md ("Broken ports").
"""

from __future__ import annotations

import re

import pytest
from agent_stores_contract.broken_ports import BROKEN
from agent_stores_contract.plugin import standard_tests
from agent_stores_contract.ports import PortContract

SUITE = """
import uuid

import pytest

from agent_stores import open_kv
from agent_stores_contract.broken_ports import BROKEN, reference_ports
from agent_stores_contract.ports import PortContract


class TestBrokenPorts(PortContract):
    @pytest.fixture(params=["reference", *sorted(BROKEN)])
    def port_maker(self, request):
        broken = None if request.param == "reference" else request.param
        return lambda kv: reference_ports(kv, broken)

    @pytest.fixture
    def kv_factory(self):
        url = f"memory://broken-ports-{uuid.uuid4().hex}"
        return lambda: open_kv(url)
"""

RESULT = re.compile(r"^(PASSED|FAILED|ERROR)\S* \S+::test_(\w+)\[([\w-]+)\]")


def test_port_contract_catches_every_broken_port(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_broken_ports_run=SUITE)
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-rA",
        "-q",
        "--tb=no",
        # A broken port that hangs a store fails at this deadline, never the CI budget.
        "--contract-timeout",
        "60",
        # Each child test is bounded by --contract-timeout; this only catches a child that
        # hangs outside any test. Generous, so a busy machine never fails a healthy run.
        timeout=3600,
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
            failed[variant].append(f"ports.{test}")
    print("\nbroken port: behaviours that fail on it")
    for name, behaviours in failed.items():
        print(f"  {name} ({len(behaviours)}): {', '.join(sorted(set(behaviours)))}")
    tests = len(standard_tests(PortContract))
    assert all(count == tests for count in ran.values()), f"not every test ran: {ran}"
    assert failed["reference"] == [], f"the reference ports failed: {failed['reference']}"
    missed = {
        name: spec.caught_by
        for name, spec in BROKEN.items()
        if not set(spec.caught_by) & set(failed[name])
    }
    assert not missed, f"the port contract did not catch these as named: {missed}"
