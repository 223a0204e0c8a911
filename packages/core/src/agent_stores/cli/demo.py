"""``agent-stores demo [--url URL]``: a scripted Pydantic AI agent keeping its conversation in a session.

No API key and no network: the model is a ``FunctionModel`` following a script. The agent
has a normal tool (``weather``) and an effect tool (``book_table``). The demo shows the
history carried from turn to turn, an effect tool interrupted mid-call latching the
session, the next turn refusing with ``SESSION_RECOVERY_REQUIRED``, the operator clearing
the latch after checking, and the conversation going on.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable

import click
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ..errors import AppError
from ..selection import default_url
from ..url import StoreURL
from .common import run_async

EFFECT_TOOLS = {"book_table"}


def _script_model() -> FunctionModel:
    """The scripted model: reads the latest prompt or tool result and answers accordingly."""

    def prompts(messages: list[ModelMessage]) -> list[str]:
        return [
            str(p.content)
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, UserPromptPart)
        ]

    def booked(messages: list[ModelMessage]) -> str | None:
        for m in messages:
            for p in m.parts:
                if (
                    isinstance(p, ToolReturnPart)
                    and p.tool_name == "book_table"
                    and p.outcome == "success"
                ):
                    return str(p.content)
        return None

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1]
        returns = [p for p in last.parts if isinstance(p, ToolReturnPart)]
        if returns:
            result = returns[-1]
            if result.tool_name == "weather":
                return ModelResponse(parts=[TextPart(f"In Paris it is {result.content}.")])
            return ModelResponse(parts=[TextPart(f"Done: {result.content}.")])
        prompt = prompts(messages)[-1].lower()
        if "weather" in prompt:
            return ModelResponse(parts=[ToolCallPart("weather", {"city": "Paris"})])
        if "book" in prompt and "did" not in prompt:
            return ModelResponse(
                parts=[ToolCallPart("book_table", {"restaurant": "Chez Ada", "time": "20:00"})]
            )
        if "asked" in prompt:
            earlier = prompts(messages)[:-1]
            listed = "; ".join(f'"{p}"' for p in earlier) or "nothing yet"
            return ModelResponse(parts=[TextPart(f"Before this you asked: {listed}.")])
        if "booking" in prompt:
            confirmation = booked(messages)
            text = (
                f"Yes: {confirmation}."
                if confirmation
                else "I have no confirmed booking in our conversation. Shall I book again?"
            )
            return ModelResponse(parts=[TextPart(text)])
        return ModelResponse(parts=[TextPart("Noted.")])

    return FunctionModel(answer, model_name="scripted-concierge")


def _make_agent(interrupt_booking: Callable[[], bool]) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(_script_model(), instructions="You are a concierge.")

    @agent.tool_plain
    def weather(city: str) -> str:
        """Today's weather in a city."""
        return "sunny, 22°C"

    @agent.tool_plain
    def book_table(restaurant: str, time: str) -> str:
        """Book a table (an effect: it changes the world outside the conversation)."""
        if interrupt_booking():
            raise ConnectionError("the connection to the booking service dropped mid-request")
        return f"table for 2 at {restaurant}, {time}, confirmation AB-1234"

    return agent


@click.command()
@click.option(
    "--url",
    default=None,
    help="Store URL (default: $AGENT_STORES_URL, else the embedded SQLite file).",
)
@click.option("--session", "session_id", default=None, help="Session id (default: a new one).")
@run_async
async def demo(url: str | None, session_id: str | None) -> None:
    """Run a scripted agent whose conversation lives in a session (no API key needed)."""
    from ..capabilities import session_checkpoints
    from ..connection import open_sessions
    from ..sessions import RecoveryRequiredError

    target = url or default_url()
    shown = StoreURL.parse(target).render()
    sid = session_id or f"demo-{secrets.token_hex(3)}"
    outage = {"armed": True}

    def interrupt_once() -> bool:
        hit, outage["armed"] = outage["armed"], False
        return hit

    agent = _make_agent(interrupt_once)
    echo = click.echo

    echo(f"agent-stores demo: a Pydantic AI agent with its conversation in {shown}")
    echo(f"session {sid!r}; scripted model, tools: weather (normal), book_table (effect)\n")

    async with open_sessions(target) as store:

        async def turn(number: int, prompt: str) -> None:
            echo(f"turn {number}  user: {prompt}")
            try:
                async with store.turn(sid) as session:
                    if session.messages:
                        echo(f"        (the agent sees {len(session.messages)} earlier messages)")
                    result = await agent.run(
                        prompt,
                        message_history=session.messages,
                        conversation_id=session.session_id,
                        capabilities=[session_checkpoints(session, effect_tools=EFFECT_TOOLS)],
                    )
                    session.replace(result.all_messages())
                for line in _tool_lines(result.new_messages()):
                    echo(f"        {line}")
                echo(f"        agent: {result.output}")
                echo(f"        saved: {len(result.all_messages())} messages\n")
            except RecoveryRequiredError as exc:
                calls = ", ".join(
                    f"{c.tool_name} (call {c.tool_call_id})" for c in exc.pending_effects
                )
                echo(f"        refused: {exc.code}: pending effect {calls}")
                echo("        nothing runs until someone checks whether the booking happened\n")
            except ConnectionError as exc:
                echo("        tool book_table started ... and the connection dropped")
                echo(f"        the turn failed: {exc}")
                echo(
                    "        (the session was marked before the tool ran: name and call id only)\n"
                )

        await turn(1, "What's the weather in Paris?")
        await turn(2, "What have I asked you so far?")
        await turn(3, "Please book a table at Chez Ada for 20:00.")
        await turn(4, "Did my booking go through?")
        info = await store.inspect(sid)
        pending = info.pending_effects if info else ()
        echo("operator: checks the booking system (no booking found), then clears the latch:")
        echo(f"        store.clear_recovery({sid!r}) -> {await store.clear_recovery(sid)}")
        echo(f"        cleared: {', '.join(c.tool_name for c in pending)}; the history is kept\n")
        await turn(5, "Did my booking go through?")
        await turn(6, "Yes, book it again please.")
        info = await store.inspect(sid)
        if info is None:
            raise AppError(detail=f"the demo session {sid!r} vanished")
        echo(
            f"done: session {sid!r} holds {info.message_count} messages, "
            f"recovery required: {info.recovery_required}"
        )
        # Run through `uv run` (as from a clone), the command is on no PATH of the shell.
        launcher = "uv run agent-stores" if "UV" in os.environ else "agent-stores"
        echo(f"look at it:  {launcher} sessions {shown} show {sid} --messages")


def _tool_lines(messages: list[ModelMessage]) -> list[str]:
    lines: list[str] = []
    for message in messages:
        for part in message.parts:
            if isinstance(part, ToolCallPart):
                kind = "effect tool" if part.tool_name in EFFECT_TOOLS else "tool"
                lines.append(f"{kind} {part.tool_name}({part.args_as_json_str()})")
            elif isinstance(part, ToolReturnPart):
                lines.append(f"  -> {part.model_response_str()}")
    return lines
