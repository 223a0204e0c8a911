"""Pydantic AI capabilities built on the session store.

* :func:`session_checkpoints` — durable tool checkpoints and a fail-closed recovery latch
  for effect tools, inside a ``store.turn()``.
* :func:`last_tool_result_fallback` — when the provider fails right after an eligible
  tool produced a complete answer, use that answer instead of failing the run.

Both plug into ``agent.run(..., capabilities=[...])`` (or ``Agent(capabilities=[...])``
for the fallback) and use only public Pydantic AI hooks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai import CallToolsNode, ModelRequestNode
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import AgentNode, NodeResult, ValidatedToolArgs
from pydantic_ai.exceptions import ModelAPIError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models import ModelRequestContext
from pydantic_ai.tools import RunContext, ToolDefinition

from .sessions import EffectCall, Session

__all__ = [
    "LastToolResultFallback",
    "SessionCheckpoints",
    "last_tool_result_fallback",
    "session_checkpoints",
]


@dataclass
class SessionCheckpoints(AbstractCapability[Any]):
    """Checkpoint tool results into a session and latch effect tools; see :func:`session_checkpoints`."""

    session: Session
    effect_tools: frozenset[str] = frozenset()

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # bound to a live session: not part of an agent spec

    async def _mark(self, calls: Iterable[ToolCallPart]) -> None:
        effects = [
            EffectCall(c.tool_name, c.tool_call_id)
            for c in calls
            if c.tool_name in self.effect_tools
        ]
        if effects:
            await self.session.mark_effects(effects)

    async def before_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any]
    ) -> AgentNode[Any]:
        # Every effect call of the response is marked before any tool of the node runs,
        # so a call that is then denied, or never runs, keeps the latch too.
        if isinstance(node, CallToolsNode):
            await self._mark(p for p in node.model_response.parts if isinstance(p, ToolCallPart))
        return node

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
    ) -> ValidatedToolArgs:
        # Calls reaching execution by another path (e.g. resumed deferred calls) are
        # marked here; an already marked call costs nothing.
        await self._mark([call])
        return args

    async def after_node_run(
        self,
        ctx: RunContext[Any],
        *,
        node: AgentNode[Any],
        result: NodeResult[Any],
    ) -> NodeResult[Any]:
        if isinstance(node, CallToolsNode):
            # The tool returns travel in the next request, not yet in ctx.messages.
            messages: list[ModelMessage] = list(ctx.messages)
            if isinstance(result, ModelRequestNode):
                messages.append(result.request)
            await self.session.checkpoint(messages)
        return result


def session_checkpoints(
    session: Session, *, effect_tools: Iterable[str] = ()
) -> SessionCheckpoints:
    """Durable tool checkpoints for a turn, with a fail-closed latch for effect tools.

    After every ``CallToolsNode`` (before the next model request) the history including
    the canonical tool returns is saved to the session. Before an effect tool (named in
    ``effect_tools``) runs, the session is durably marked with the tool's name and call id
    — never its arguments. The mark is cleared only when every marked call has a
    successful ``ToolReturnPart`` in a saved history; failures, retries, denials,
    interruptions or missing results keep it, and the next ``turn()`` raises
    ``SESSION_RECOVERY_REQUIRED`` until ``store.clear_recovery()`` or ``store.reset()``.

    Use inside the turn::

        async with sessions.turn("user:42") as session:
            result = await agent.run(
                "Book the appointment.",
                message_history=session.messages,
                conversation_id=session.session_id,
                capabilities=[session_checkpoints(session, effect_tools={"create_event"})],
            )
            session.replace(result.all_messages())
    """
    if isinstance(effect_tools, str):
        raise TypeError("effect_tools must be a collection of tool names, not a single string")
    return SessionCheckpoints(session=session, effect_tools=frozenset(effect_tools))


@dataclass
class LastToolResultFallback(AbstractCapability[Any]):
    """Answer with the last verified tool result when the provider fails; see :func:`last_tool_result_fallback`."""

    tool_names: frozenset[str] = frozenset()
    # Per-run state, reset by ``for_run``.
    _eligible: dict[str, ToolReturnPart] = field(default_factory=dict, init=False, repr=False)
    _unclean: bool = field(default=False, init=False, repr=False)

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def for_run(self, ctx: RunContext[Any]) -> AbstractCapability[Any]:
        return replace(self)

    async def after_node_run(
        self,
        ctx: RunContext[Any],
        *,
        node: AgentNode[Any],
        result: NodeResult[Any],
    ) -> NodeResult[Any]:
        if isinstance(node, CallToolsNode) and isinstance(result, ModelRequestNode):
            for part in result.request.parts:
                if isinstance(part, RetryFeedbackPart):
                    self._unclean = True
                elif isinstance(part, ToolReturnPart):
                    if part.outcome in ("failed", "retried"):
                        self._unclean = True
                    elif (
                        part.outcome == "success"
                        and part.tool_name in self.tool_names
                        and _non_empty(part.content)
                    ):
                        self._eligible[part.tool_call_id] = part
                elif getattr(part, "part_kind", None) == "retry-prompt":
                    self._unclean = True
        return result

    async def on_tool_execute_error(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        error: Exception,
    ) -> Any:
        self._unclean = True
        raise error

    async def on_model_request_error(
        self,
        ctx: RunContext[Any],
        *,
        request_context: ModelRequestContext,
        error: Exception,
    ) -> ModelResponse:
        if not isinstance(error, ModelAPIError | ConnectionError | TimeoutError):
            raise error
        if self._unclean:
            raise error
        part = self._answer(request_context.messages)
        if part is None:
            raise error
        return ModelResponse(
            parts=[TextPart(part.model_response_str())],
            provider_details={
                "agent_stores_fallback": {
                    "tool_name": part.tool_name,
                    "tool_call_id": part.tool_call_id,
                    "error": type(error).__name__,
                }
            },
        )

    def _answer(self, messages: list[ModelMessage]) -> ToolReturnPart | None:
        """The eligible result the failed request was carrying, if it came from this run."""
        if not messages or not isinstance(messages[-1], ModelRequest):
            return None
        found: ToolReturnPart | None = None
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart) and part.tool_call_id in self._eligible:
                found = self._eligible[part.tool_call_id]
        return found


def _non_empty(content: Any) -> bool:
    if content is None:
        return False
    if isinstance(content, str | bytes | list | tuple | dict | set):
        return bool(content.strip() if isinstance(content, str) else content)
    return True


def last_tool_result_fallback(tool_names: Iterable[str]) -> LastToolResultFallback:
    """Reuse the last successful result of an eligible tool when the provider request after it fails.

    Only a successful, non-empty result of a tool in ``tool_names`` produced in the *same
    run* and carried by the request that failed qualifies, and only if the run contains
    no tool failures or retries; it then becomes the model's text answer. Otherwise the
    provider's exception propagates unchanged. Tool errors never pass through this
    fallback, and it never replaces model text or new tool calls (it acts on provider
    errors only)::

        agent = Agent(model, capabilities=[last_tool_result_fallback({"confirm_booking"})])
    """
    if isinstance(tool_names, str):
        raise TypeError("tool_names must be a collection of tool names, not a single string")
    return LastToolResultFallback(tool_names=frozenset(tool_names))
