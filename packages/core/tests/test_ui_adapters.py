"""Pydantic AI's UI adapters on our ConversationStore, as a chat app uses them.

``VercelAIAdapter`` and ``AGUIAdapter`` with ``conversation_store=`` the store opened by
``agent_stores.open_conversations(url)`` and ``conversation_scope=`` the user, served by
Starlette and driven by its ``TestClient`` (the scenarios: ``ui_adapter_support.py``).
Here on SQLite and ``memory://``, with Pydantic AI's ``InMemoryConversationStore`` as the
reference, and with two app processes (two stores on one SQLite file, or one
``memory://NAME``) serving one tab's requests in turn; the Redis package runs the same
scenarios on Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import agent_stores
import pytest
from pydantic_ai.conversation_store import ConversationStore, InMemoryConversationStore
from ui_adapter_support import (
    StoreOpener,
    ag_ui_chat_story,
    delete_story,
    edit_story,
    two_workers_story,
    vercel_chat_story,
)


def url_opener(url: str) -> StoreOpener:
    @asynccontextmanager
    async def open_store() -> AsyncIterator[ConversationStore]:
        async with agent_stores.open_conversations(url) as store:
            assert isinstance(store, ConversationStore)
            yield store

    return open_store


@asynccontextmanager
async def reference_store() -> AsyncIterator[ConversationStore]:
    yield InMemoryConversationStore()


@pytest.fixture(params=["pydantic-ai-in-memory", "memory", "sqlite"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreOpener:
    """Opens the store the app serves, in the app's lifespan (on its event loop)."""
    if request.param == "pydantic-ai-in-memory":
        return reference_store
    if request.param == "memory":
        # A name of its own: ``memory://`` alone is one space shared by the whole process.
        return url_opener(f"memory://ui-{uuid.uuid4().hex[:8]}")
    return url_opener(f"sqlite:///{tmp_path / 'chat.db'}")


def test_vercel_ai_chat(open_store: StoreOpener) -> None:
    vercel_chat_story(open_store)


def test_ag_ui_chat(open_store: StoreOpener) -> None:
    ag_ui_chat_story(open_store)


def test_vercel_ai_edits(open_store: StoreOpener) -> None:
    edit_story(open_store)


def test_vercel_ai_delete_during_a_run(open_store: StoreOpener) -> None:
    delete_story(open_store)


@pytest.fixture(params=["pydantic-ai-in-memory", "memory", "sqlite"])
def open_shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreOpener:
    """Opens a store on the same data each time (one per app process)."""
    if request.param == "sqlite":
        return url_opener(f"sqlite:///{tmp_path / 'chat.db'}")
    if request.param == "memory":
        return url_opener(f"memory://ui-{uuid.uuid4().hex[:8]}")
    shared = InMemoryConversationStore()

    @asynccontextmanager
    async def open_it() -> AsyncIterator[ConversationStore]:
        yield shared

    return open_it


def test_two_app_workers_on_one_store(open_shared_store: StoreOpener) -> None:
    two_workers_story(open_shared_store)
