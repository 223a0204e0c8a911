"""Awaiting a synchronous session method says so, instead of a NoneType error."""

from __future__ import annotations

import pytest
from agent_stores import open_sessions
from pydantic_ai.messages import ModelRequest, UserPromptPart


async def test_awaiting_replace_names_the_method_and_the_fix() -> None:
    async with open_sessions("memory://sync-methods") as sessions:
        async with sessions.turn("s") as session:
            with pytest.raises(
                TypeError, match=r"Session\.replace\(\) is synchronous.*without await"
            ):
                await session.replace([ModelRequest(parts=[UserPromptPart("hi")])])
            assert session.changed  # the call itself did its work
        async with sessions.turn("s") as session:
            assert len(session.messages) == 1


async def test_replace_refuses_what_is_not_a_message_and_accepts_subclasses() -> None:
    class TaggedRequest(ModelRequest):
        pass

    hello = ModelRequest(parts=[UserPromptPart("hi")])
    async with open_sessions("memory://replace-types") as sessions:
        async with sessions.turn("s") as session:
            with pytest.raises(TypeError, match=r"item 1 is dict"):
                session.replace([hello, {"role": "user"}])  # type: ignore[list-item]
            assert not session.changed  # nothing recorded from the refused call
            session.replace([hello, TaggedRequest(parts=[UserPromptPart("tagged")])])
        async with sessions.turn("s") as session:
            assert len(session.messages) == 2
