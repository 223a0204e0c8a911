"""Helpers shared by the Firestore tests (a uniquely named module: ``conftest`` names collide
when several packages' tests run in one pytest process)."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

from agent_stores import StoreURL

REPO_ROOT = Path(__file__).resolve().parents[3]
SERVER_SCRIPT = REPO_ROOT / "scripts" / "servers" / "firestore.py"
URL_ENV = "AGENT_STORES_TEST_FIRESTORE_URL"


def load_server_module() -> ModuleType:
    """``scripts/servers/firestore.py`` loaded by path (the scripts folder is not a package)."""
    name = "agent_stores_servers_firestore"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SERVER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


server = load_server_module()


def with_fresh_prefix(url: str) -> str:
    """``url`` with a new unique ``prefix``, so a test never sees another test's data."""
    parsed = StoreURL.parse(url)
    base = parsed.query_get("prefix") or "agent-stores-test"
    return parsed.with_query(prefix=f"{base}-{uuid.uuid4().hex[:8]}").render_with_secrets()


def emulator_port(url: str) -> int:
    """The port of the emulator a test URL points at."""
    host = StoreURL.parse(url).query_get("emulator_host")
    assert host is not None, "test URLs carry emulator_host"
    return int(host.rsplit(":", 1)[1])
