"""The pytest plugin of the contract suite (loaded through the ``pytest11`` entry point).

* ``--store-url URL`` (or ``AGENT_STORES_CONTRACT_URL``) names the backend under test.
* The guard: a class that subclasses a contract class may not drop a standard test, nor
  override one, unless the override is marked ``xfail(strict=True, reason=...)`` or the
  test is listed in ``contract_xfails`` with a reason. Violations fail collection.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest
from agent_stores import AppError, StoreURL

URL_ENV = "AGENT_STORES_CONTRACT_URL"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agent-stores-contract")
    group.addoption(
        "--store-url",
        action="store",
        default=None,
        help=f"URL of the backend the agent-stores contract suite runs against (or ${URL_ENV}).",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "contract: a standard test of the agent-stores contract suite"
    )


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from .base import ContractBase

    for item in items:
        cls = getattr(item, "cls", None)
        if cls is None or not issubclass(cls, ContractBase):
            continue
        item.add_marker(pytest.mark.contract)
        name = getattr(item, "originalname", item.name)
        reason = (getattr(cls, "contract_xfails", {}) or {}).get(name)
        if reason:
            item.add_marker(pytest.mark.xfail(strict=True, reason=reason))
