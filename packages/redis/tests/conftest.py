"""Servers for the Redis backend's tests.

The URLs come from ``AGENT_STORES_TEST_REDIS_URL`` (standalone) and
``AGENT_STORES_TEST_REDIS_CLUSTER_URL`` (3-master cluster), as set by ``nox -s tests``.
When they are absent, this file starts private servers with ``scripts/servers/redis.py``
for the test session and stops them afterwards. Tests that must crash or reconfigure a
server start their own with :func:`private_server`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis_test_support import (
    CLUSTER_ENV,
    STANDALONE_ENV,
    PrivateServer,
    servers,
    with_fresh_prefix,
)


@pytest.fixture(scope="session")
def redis_urls() -> Iterator[dict[str, str]]:
    """``{"redis": url, "redis-cluster": url}`` from the environment, or private servers."""
    standalone = os.environ.get(STANDALONE_ENV)
    cluster = os.environ.get(CLUSTER_ENV)
    if standalone and cluster:
        yield {"redis": standalone, "redis-cluster": cluster}
        return
    if shutil.which("redis-server") is None:
        pytest.fail(
            f"set {STANDALONE_ENV} and {CLUSTER_ENV}, or install redis-server so the tests can "
            "start private servers"
        )
    with servers.redis_servers() as urls:
        yield {
            "redis": standalone or urls["redis"],
            "redis-cluster": cluster or urls["redis-cluster"],
        }


@pytest.fixture(params=["redis", "redis-cluster"])
def redis_url(request: pytest.FixtureRequest, redis_urls: dict[str, str]) -> str:
    """Each test using it runs on the standalone server and on the cluster."""
    return redis_urls[str(request.param)]


@pytest.fixture
def standalone_url(redis_urls: dict[str, str]) -> str:
    """The standalone server (fresh prefix)."""
    return with_fresh_prefix(redis_urls["redis"])


@pytest.fixture
def cluster_url(redis_urls: dict[str, str]) -> str:
    """The cluster (fresh prefix)."""
    return with_fresh_prefix(redis_urls["redis-cluster"])


@pytest.fixture
def private_server() -> Iterator[PrivateServer]:
    """Start private ``redis-server`` processes for one test: ``private_server(*args, password=)``.

    Returns the ``RedisServer`` (``.port``, ``.kill()``, ``.start()``, ``.stop()``); every
    server started is stopped after the test.
    """
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed")
    started: list[Any] = []
    folder = Path(tempfile.mkdtemp(prefix="as-redis-"))

    def start(*extra_args: str, password: str | None = None) -> Any:
        port = servers.free_port()
        server = servers.RedisServer(
            port, folder / str(port), extra_args=list(extra_args), password=password
        )
        started.append(server)  # before start(): a half-started daemon is stopped too
        server.start()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
