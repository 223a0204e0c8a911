"""The shared contract suite on Redis: standalone and the 3-master cluster.

Every contract class runs twice (``store_url`` is parametrized), with nothing dropped or
overridden. The store contracts (sessions, memory, checkpointer) are picked up as soon
as the contract-tests distribution ships them.
"""

from __future__ import annotations

import importlib

import pytest
from agent_stores_contract import KVContract
from redis_test_support import with_fresh_prefix


class RedisURLs:
    """Runs a contract class on the standalone server and on the cluster."""

    @pytest.fixture(params=["redis", "redis-cluster"])
    def store_url(self, request: pytest.FixtureRequest, redis_urls: dict[str, str]) -> str:
        return with_fresh_prefix(redis_urls[str(request.param)])


class TestRedisKV(RedisURLs, KVContract):
    """The KV CAS contract on Redis."""


def _contract(name: str) -> type | None:
    """A store contract class, or None when this checkout does not have it yet."""
    contracts = importlib.import_module("agent_stores_contract")
    try:
        return getattr(contracts, name)  # type: ignore[no-any-return]
    except ModuleNotFoundError:
        return None


_SessionContract = _contract("SessionContract")
_MemoryContract = _contract("MemoryContract")
_CheckpointerContract = _contract("CheckpointerContract")

if _SessionContract is not None:

    class TestRedisSessions(RedisURLs, _SessionContract):  # type: ignore[misc,valid-type]
        """The session contract on Redis (native fast path when the plugin offers one)."""


if _MemoryContract is not None:

    class TestRedisMemory(RedisURLs, _MemoryContract):  # type: ignore[misc,valid-type]
        """The memory contract on Redis."""


if _CheckpointerContract is not None:

    class TestRedisCheckpointer(RedisURLs, _CheckpointerContract):  # type: ignore[misc,valid-type]
        """The checkpointer contract on Redis."""


@pytest.mark.parametrize(
    ("name", "contract"),
    [
        ("SessionContract", _SessionContract),
        ("MemoryContract", _MemoryContract),
        ("CheckpointerContract", _CheckpointerContract),
    ],
)
def test_store_contract_present(name: str, contract: type | None) -> None:
    """Says loudly when a store contract is not in this checkout (so it did not run here)."""
    if contract is None:
        pytest.skip(f"agent_stores_contract.{name} does not exist yet in this checkout")
