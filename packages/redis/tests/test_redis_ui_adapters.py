"""Pydantic AI's UI adapters on our ConversationStore over Redis, as a chat app uses them.

The core's scenarios (``packages/core/tests/ui_adapter_support.py``, loaded by path) with
the store the app opens being ``agent_stores.open_conversations(redis URL)``: a first
request, a follow-up, a regenerate kept as a branch, an approval answering a deferred
call, another user kept out and a stale save ending in the reload error, edits (one
branching off nothing), and two app processes on one prefix, through
``VercelAIAdapter`` and ``AGUIAdapter`` served by Starlette's ``TestClient``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import ModuleType

import agent_stores
import pytest
from pydantic_ai.conversation_store import ConversationStore
from redis_test_support import REPO_ROOT


def load_scenarios() -> ModuleType:
    """The core's module (the one the core's tests imported, when they run in this process)."""
    if (loaded := sys.modules.get("ui_adapter_support")) is not None:
        return loaded
    path = REPO_ROOT / "packages" / "core" / "tests" / "ui_adapter_support.py"
    spec = importlib.util.spec_from_file_location("ui_adapter_support", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scenarios = load_scenarios()

StoreOpener = Callable[[], AbstractAsyncContextManager[ConversationStore]]


@pytest.fixture(params=["redis", "redis-cluster"])
def open_store(request: pytest.FixtureRequest) -> StoreOpener:
    """Opens the store the app serves, in the app's lifespan, on a fresh prefix."""
    fixture = "standalone_url" if request.param == "redis" else "cluster_url"
    url: str = request.getfixturevalue(fixture)

    @asynccontextmanager
    async def open_it() -> AsyncIterator[ConversationStore]:
        async with agent_stores.open_conversations(url) as store:
            assert isinstance(store, ConversationStore)
            yield store

    return open_it


def test_vercel_ai_chat_on_redis(open_store: StoreOpener) -> None:
    scenarios.vercel_chat_story(open_store)


def test_ag_ui_chat_on_redis(open_store: StoreOpener) -> None:
    scenarios.ag_ui_chat_story(open_store)


def test_vercel_ai_edits_on_redis(open_store: StoreOpener) -> None:
    scenarios.edit_story(open_store)


def test_vercel_ai_delete_during_a_run_on_redis(open_store: StoreOpener) -> None:
    scenarios.delete_story(open_store)


def test_two_app_workers_on_redis(open_store: StoreOpener) -> None:
    """Two app processes' stores on one prefix, a tab's requests landing on either."""
    scenarios.two_workers_story(open_store)
