"""A turn's last write on a backend that answers inline (SQLite: statements run on the
event loop's thread) runs as an eager task on Python 3.12+: the turn's exit saves
without a round of the event loop (it stays shielded from the caller's cancellation as
before). Run on 3.13 by ``nox -s synaptum``."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from agent_stores import open_sessions
from agent_stores.sessions import SessionStore
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart


def pair(tag: str) -> list[ModelMessage]:
    return [ModelRequest(parts=[UserPromptPart(tag)]), ModelResponse(parts=[TextPart(tag)])]


async def rounds_during_exit(store: SessionStore) -> list[str]:
    """What a callback scheduled just before a turn's exit saw: [] when the exit (save and
    release) ran without a round of the event loop."""
    ran: list[str] = []
    async with store.turn("s") as session:
        session.replace([*session.messages, *pair("x")])
        asyncio.get_running_loop().call_soon(ran.append, "a round of the loop")
    return ran


@pytest.mark.skipif(
    sys.version_info < (3, 12),
    reason="asyncio.eager_task_factory is Python 3.12+ (nox -s synaptum runs this on 3.13)",
)
async def test_an_inline_backend_saves_without_a_round_of_the_loop(tmp_path: Path) -> None:
    async with open_sessions(f"sqlite:///{tmp_path}/s.db") as store:
        assert store.kv.capabilities.answers_inline
        assert await rounds_during_exit(store) == []
        assert await rounds_during_exit(store) == []  # and warm
        assert len(await store.read_messages("s") or []) == 4


async def test_a_backend_that_waits_saves_in_a_task_of_its_own(tmp_path: Path) -> None:
    async with open_sessions(f"sqlite:///{tmp_path}/s.db") as store:
        store.kv.capabilities = replace(store.kv.capabilities, answers_inline=False)
        assert await rounds_during_exit(store) == ["a round of the loop"]
        assert len(await store.read_messages("s") or []) == 2
