"""Helpers shared by the Redis tests (a uniquely named module: ``conftest`` names collide
when several packages' tests run in one pytest process)."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from agent_stores import StoreURL

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVERS_SCRIPT = REPO_ROOT / "scripts" / "servers" / "redis.py"
STANDALONE_ENV = "AGENT_STORES_TEST_REDIS_URL"
CLUSTER_ENV = "AGENT_STORES_TEST_REDIS_CLUSTER_URL"


def load_servers_module() -> ModuleType:
    """``scripts/servers/redis.py`` loaded by path (its file name must not shadow redis-py)."""
    spec = importlib.util.spec_from_file_location("agent_stores_servers_redis", SERVERS_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


servers = load_servers_module()


def with_fresh_prefix(url: str) -> str:
    """``url`` with a new unique ``prefix``, so a test never sees another test's data."""
    parsed = StoreURL.parse(url)
    base = parsed.query_get("prefix") or "agent-stores-test"
    return parsed.with_query(prefix=f"{base}-{uuid.uuid4().hex[:8]}").render_with_secrets()


PrivateServer = Callable[..., Any]


class Commands:
    """The commands sent by this process's redis-py connections (each one a round trip),
    counted client-side where every command is packed: the store's script calls and
    redis-py's ``execute_command`` both pack through the connection."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from redis.asyncio.connection import AbstractConnection

        self.sent: list[str] = []
        original = AbstractConnection.pack_command

        def counting(conn: Any, *args: Any) -> Any:
            self.sent.append(str(args[0]))
            return original(conn, *args)

        monkeypatch.setattr(AbstractConnection, "pack_command", counting)
