"""The pytest plugin of the contract suite (loaded through the ``pytest11`` entry point).

* ``--store-url URL`` (or ``AGENT_STORES_CONTRACT_URL``) names the backend under test.
* ``--conversation-store module:attribute`` (or ``AGENT_STORES_CONTRACT_CONVERSATION_STORE``)
  runs the conversation contract on any third party's Pydantic AI ``ConversationStore``.
* The guard: a class that subclasses a contract class may not drop a standard test, nor
  override one, unless the override is marked ``xfail(strict=True, reason=...)`` or the
  test is listed in ``contract_xfails`` with a reason. Violations fail collection.
* ``--contract-examples N`` (or ``AGENT_STORES_CONTRACT_EXAMPLES``) sets the example
  budget of the model-based KV test; ``--contract-timeout S`` (or
  ``AGENT_STORES_CONTRACT_TIMEOUT``) the deadline of every contract test.
* Skips are policed: a contract test may only skip through
  :func:`~agent_stores_contract.base.require_capability` (the backend's declared
  capabilities justify it); those skips are listed in the run's summary, any other skip
  of a contract test fails it (in its body, a fixture or a skip mark), and so does a
  skip of a whole test module that uses the contract (``pytest.importorskip``, a
  module-level ``pytest.skip``), which would leave its tests uncollected.
* Every contract test carries a behaviour id (``kv.create_then_get``), recorded in the
  test's ``user_properties`` (and so in JUnit XML) and listed in ``docs/contract.md``.
* Port reach: the summary lists, per port method the port contract drove, how many tests
  reached it, on which rules and with which edge cases; when the run selected every port
  contract test, a method the port offers that no test reached, or that no test of one of
  its rules (``reach.APPLIES``) reached, fails the run.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Generator
from typing import Any

import pytest
from agent_stores import AppError, StoreURL

from .base import CAPABILITY_SKIP

URL_ENV = "AGENT_STORES_CONTRACT_URL"
EXAMPLES_ENV = "AGENT_STORES_CONTRACT_EXAMPLES"
TIMEOUT_ENV = "AGENT_STORES_CONTRACT_TIMEOUT"
DEFAULT_EXAMPLES = 30
DEFAULT_STEPS = 30
DEFAULT_TIMEOUT = 300.0
CAPABILITY_SKIPS = pytest.StashKey[list[tuple[str, str]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agent-stores-contract")
    group.addoption(
        "--store-url",
        action="store",
        default=None,
        help=f"URL of the backend the agent-stores contract suite runs against (or ${URL_ENV}).",
    )
    group.addoption(
        "--contract-examples",
        action="store",
        type=int,
        default=None,
        help=f"examples of the model-based KV test (or ${EXAMPLES_ENV}; default {DEFAULT_EXAMPLES}).",
    )
    group.addoption(
        "--contract-timeout",
        action="store",
        type=float,
        default=None,
        help=f"seconds each contract test may take before it fails as hung (or ${TIMEOUT_ENV}; "
        f"default {DEFAULT_TIMEOUT:g}).",
    )
    group.addoption(
        "--conversation-store",
        action="store",
        default=None,
        help="module:attribute of a callable returning a Pydantic AI ConversationStore (or an "
        "async context manager yielding one): the conversation contract runs on it instead of "
        "agent_stores.open_conversations(--store-url) (or $AGENT_STORES_CONTRACT_CONVERSATION_STORE).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "contract: a standard test of the agent-stores contract suite"
    )
    config.stash[CAPABILITY_SKIPS] = []


def _examples(config: pytest.Config) -> int:
    value = config.getoption("--contract-examples") or os.environ.get(EXAMPLES_ENV)
    examples = int(value) if value else DEFAULT_EXAMPLES
    if examples < 1:
        raise pytest.UsageError("--contract-examples must be at least 1")
    return examples


def _timeout(config: pytest.Config) -> float:
    value = config.getoption("--contract-timeout") or os.environ.get(TIMEOUT_ENV)
    return float(value) if value else DEFAULT_TIMEOUT


@pytest.fixture
def contract_examples(request: pytest.FixtureRequest) -> tuple[int, int]:
    """``(examples, steps)`` of the model-based KV test: the contract's example budget."""
    return _examples(request.config), DEFAULT_STEPS


class RedactedURL(str):
    """A URL string whose repr hides its secrets.

    pytest prints a failing test's arguments; a store URL with a password must not end up
    in a CI log that way.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        try:
            return repr(StoreURL.parse(str(self)).render())
        except AppError:
            return "'<unparsable store URL>'"


@pytest.fixture
def contract_store_url(request: pytest.FixtureRequest) -> str:
    """The backend URL given on the command line or in the environment."""
    url = request.config.getoption("--store-url") or os.environ.get(URL_ENV)
    if not url:
        raise pytest.UsageError(
            f"the agent-stores contract suite needs a backend: pass --store-url URL or set {URL_ENV}, "
            "or override the kv_factory fixture"
        )
    return RedactedURL(url)


class ContractViolation(Exception):
    """A contract subclass dropped or silently overrode a standard test."""


def standard_tests(base: type) -> dict[str, Any]:
    """The standard tests a contract class defines (including those it inherits from other contract classes)."""
    from .base import ContractBase

    tests: dict[str, Any] = {}
    for klass in reversed(base.__mro__):
        if klass is object or not issubclass(klass, ContractBase) or not _is_contract_class(klass):
            continue
        for name, value in vars(klass).items():
            if name.startswith("test_") and callable(value):
                tests[name] = value
    return tests


def _is_contract_class(klass: type) -> bool:
    return klass.__module__.startswith(
        "agent_stores_contract."
    ) and not klass.__module__.startswith("agent_stores_contract.suite")


def _strict_xfail_reason(func: Any) -> str | None:
    for mark in getattr(func, "pytestmark", []):
        if (
            mark.name == "xfail"
            and mark.kwargs.get("strict") is True
            and str(mark.kwargs.get("reason", "")).strip()
        ):
            return str(mark.kwargs["reason"])
    return None


def check_contract_class(cls: type) -> list[str]:
    """Every way ``cls`` breaks the no-silent-drop rule (empty list: fine)."""
    problems: list[str] = []
    xfails: dict[str, str] = getattr(cls, "contract_xfails", {}) or {}
    contract_bases = [k for k in cls.__mro__[1:] if _is_contract_class(k)]
    expected: dict[str, Any] = {}
    for base in contract_bases:
        expected.update(standard_tests(base))
    for name in xfails:
        if name not in expected:
            problems.append(f"contract_xfails names {name!r}, which is not a standard test")
        elif not str(xfails[name]).strip():
            problems.append(f"contract_xfails[{name!r}] has no reason")
    for name, standard in expected.items():
        actual = inspect.getattr_static(cls, name, None)
        if actual is None or not callable(actual):
            problems.append(
                f"{name} is dropped (set to {actual!r}); mark it xfail(strict=True, reason=...) instead"
            )
            continue
        if actual is standard or name in xfails:
            continue
        if _strict_xfail_reason(actual) is None:
            problems.append(
                f"{name} overrides a standard test without xfail(strict=True, reason=...); "
                "list it in contract_xfails or mark the override"
            )
    return problems


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> None:
    from .base import ContractBase

    if inspect.isclass(obj) and issubclass(obj, ContractBase) and not _is_contract_class(obj):
        problems = check_contract_class(obj)
        if problems:
            raise ContractViolation(
                f"{obj.__module__}.{obj.__qualname__} breaks the agent-stores contract:\n  - "
                + "\n  - ".join(problems)
            )


def pytest_collection_finish(session: pytest.Session) -> None:
    import sys

    ports = sys.modules.get("agent_stores_contract.ports")
    reach = sys.modules.get("agent_stores_contract.reach")
    if ports is None or reach is None:
        return
    wanted = set(standard_tests(ports.PortContract))
    selected: dict[type, set[str]] = {}
    for item in session.items:
        cls = getattr(item, "cls", None)
        if cls is not None and issubclass(cls, ports.PortContract):
            selected.setdefault(cls, set()).add(getattr(item, "originalname", item.name))
    # Only a run of the whole port contract judges reach: a -k selection of a few tests
    # would otherwise fail for the methods it left out.
    reach.REGISTRY.enforce = any(names >= wanted for names in selected.values())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import sys

    reach = sys.modules.get("agent_stores_contract.reach")
    if reach is None or not reach.REGISTRY.enforce or not reach.REGISTRY.unreached():
        return
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from .base import ContractBase

    for item in items:
        cls = getattr(item, "cls", None)
        if cls is None or not issubclass(cls, ContractBase):
            continue
        item.add_marker(pytest.mark.contract)
        name = getattr(item, "originalname", item.name)
        behaviour = behaviour_of(cls, name)
        if behaviour is not None:
            item.user_properties.append(("behaviour", behaviour))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(_timeout(config)))
        reason = (getattr(cls, "contract_xfails", {}) or {}).get(name)
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))


def behaviour_of(cls: type, name: str) -> str | None:
    """The behaviour id of standard test ``name`` as run by ``cls`` (None: not a standard test)."""
    from .behaviours import behaviour_id

    for klass in cls.__mro__:
        if _is_contract_class(klass) and name in vars(klass):
            return behaviour_id(klass, name)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not item.get_closest_marker("contract"):
        return report
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if reason.startswith(CAPABILITY_SKIP):
            item.config.stash[CAPABILITY_SKIPS].append((item.nodeid, reason))
        else:
            # A contract test that does not run proves nothing: only a declared
            # capability may switch one off.
            report.outcome = "failed"
            report.longrepr = (
                f"contract test {item.nodeid} was skipped ({reason}); a contract test may only "
                "be skipped by require_capability() when the backend declares it lacks that "
                "capability. Make the backend runnable here, or exclude it from the run."
            )
    elif report.failed and call.excinfo is not None and "Timeout" in str(call.excinfo.value):
        report.sections.append(
            (
                "agent-stores contract",
                f"{item.nodeid} did not finish within {_timeout(item.config):g} s: the backend "
                f"under test hung (a call never returned). Raise the limit with "
                f"--contract-timeout or ${TIMEOUT_ENV} only if the backend is merely slow.",
            )
        )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    if report.skipped and isinstance(collector, pytest.Module) and _uses_contract(collector):
        # Skipped while importing: its contract classes never reach the guard, so no
        # capability can justify it and the run would look complete without them.
        reason = _skip_reason(report)
        report.outcome = "failed"
        report.longrepr = (
            f"test module {collector.nodeid} uses the agent-stores contract and was skipped "
            f"({reason}); contract tests may only be skipped one by one, by "
            "require_capability(). Make the backend runnable here, or exclude it from the run."
        )
    return report


#: A class statement subclassing a contract class (``class TestMine(KVContract):``).
_CONTRACT_SUBCLASS = re.compile(r"^\s*class\s+\w+\s*\([^)]*Contract\b", re.MULTILINE)


def _uses_contract(module: pytest.Module) -> bool:
    """The module imports the contract and subclasses one of its classes (read, not imported:
    it failed to import)."""
    try:
        source = module.path.read_text(errors="replace")
    except OSError:
        return False
    return "agent_stores_contract" in source and _CONTRACT_SUBCLASS.search(source) is not None


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    import sys

    faults = sys.modules.get("agent_stores_contract.faults")
    reports = getattr(faults, "REPORTS", [])
    if reports:
        terminalreporter.section("agent-stores contract: fault runs")
        for report in reports:
            terminalreporter.write_line(report.line())
    reach = sys.modules.get("agent_stores_contract.reach")
    registry = getattr(reach, "REGISTRY", None)
    if registry is not None and registry.offered:
        terminalreporter.section("agent-stores contract: port reach (tests per port method)")
        for line in registry.lines():
            terminalreporter.write_line(line)
        if registry.enforce:
            for failure in registry.failures():
                terminalreporter.write_line(f"FAILED: {failure}")
    skips = config.stash.get(CAPABILITY_SKIPS, [])
    if not skips:
        return
    terminalreporter.section("agent-stores contract: skipped by declared capability")
    for nodeid, reason in skips:
        terminalreporter.write_line(f"{nodeid}: {reason}")
