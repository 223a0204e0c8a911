"""noxfile.py's contract order options: --shuffle[=SEED], --alone N --seed S, --alone-test ID,
and the fresh storage a test run alone gets (issue 59)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def noxfile() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agent_stores_noxfile", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Refused(Exception):
    pass


class FakeSession:
    """What _contract_args and _order use of a nox session."""

    def __init__(self, *posargs: str) -> None:
        self.posargs = list(posargs)
        self.logged: list[str] = []

    def log(self, message: str) -> None:
        self.logged.append(message)

    def error(self, message: str) -> Any:
        raise Refused(message)


def order_of(noxfile: ModuleType, *posargs: str) -> tuple[Any, list[str], FakeSession]:
    session = FakeSession(*posargs)
    names, ours, pytest_args = noxfile._contract_args(session, noxfile.BACKENDS)
    return noxfile._order(session, names, ours), pytest_args, session


def test_shuffle_with_a_seed_passes_it_to_pytest_random_order(noxfile: ModuleType) -> None:
    order, pytest_args, session = order_of(noxfile, "sqlite", "--shuffle=42", "-k", "kv")
    assert order.shuffle_seed == 42 and not order.alone_mode
    assert order.pytest_args() == ["--random-order-bucket=global", "--random-order-seed=42"]
    assert pytest_args == ["-k", "kv"]
    assert any("--shuffle=42" in line for line in session.logged), session.logged


def test_shuffle_without_a_seed_draws_one_and_prints_it(
    noxfile: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_STORES_CONTRACT_SHUFFLE", raising=False)
    order, _, session = order_of(noxfile, "dynamodb", "cosmos", "--shuffle")
    assert order.shuffle_seed is not None
    assert any(
        f"uv run nox -s contract -- dynamodb cosmos --shuffle={order.shuffle_seed}" in line
        for line in session.logged
    ), session.logged


def test_shuffle_from_the_environment(noxfile: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_STORES_CONTRACT_SHUFFLE", "7")
    assert order_of(noxfile, "sqlite")[0].shuffle_seed == 7
    monkeypatch.setenv("AGENT_STORES_CONTRACT_SHUFFLE", "0")
    assert order_of(noxfile, "sqlite")[0].shuffle_seed is None


def test_the_suites_order_unless_asked(
    noxfile: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_STORES_CONTRACT_SHUFFLE", raising=False)
    order, _, _ = order_of(noxfile, "sqlite")
    assert order.shuffle_seed is None and not order.alone_mode and order.pytest_args() == []


def test_alone_draws_by_its_seed(noxfile: ModuleType) -> None:
    order, _, _ = order_of(noxfile, "dynamodb", "--alone", "30", "--seed", "5")
    assert (order.alone, order.seed, order.alone_mode) == (30, 5, True)
    order, _, _ = order_of(noxfile, "dynamodb", "--alone-test", "a.py::T::test_x")
    assert order.alone_tests == ["a.py::T::test_x"] and order.alone_mode


@pytest.mark.parametrize(
    "posargs",
    [
        ("sqlite", "--alone", "0"),
        ("sqlite", "--alone", "many"),
        ("sqlite", "--seed", "3"),
        ("sqlite", "--shuffle=x"),
        ("sqlite", "--shuffle", "--alone", "3"),
    ],
)
def test_bad_order_options_are_refused(noxfile: ModuleType, posargs: tuple[str, ...]) -> None:
    with pytest.raises(Refused):
        order_of(noxfile, *posargs)


def test_fresh_storage_for_a_test_alone(noxfile: ModuleType) -> None:
    fresh = noxfile._fresh_url
    sqlite = fresh("sqlite:////tmp/run/contract.db", 1)
    assert sqlite.startswith("sqlite:////tmp/run/contract-alone-1-") and sqlite.endswith(".db")
    dynamodb = fresh("dynamodb://k:s@agent-stores-test?region=us-east-1&prefix=p", 2)
    assert dynamodb.startswith("dynamodb://k:s@agent-stores-alone-2-")
    assert dynamodb.endswith("?region=us-east-1&prefix=p")
    cosmos = fresh("cosmos://127.0.0.1:8081/agent-stores-test/kv?key=a%2Bb", 3)
    assert cosmos.startswith("cosmos://127.0.0.1:8081/db-alone-3-") and "/c-alone-3-" in cosmos
    assert cosmos.endswith("?key=a%2Bb")
    assert fresh("redis://localhost:6379/0?prefix=p", 4) == "redis://localhost:6379/0?prefix=p"
    assert fresh("sqlite:////tmp/run/contract.db", 1) != sqlite
