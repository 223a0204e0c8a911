"""Resume a harness run after a crash at any point, tools included.

``continue_run`` needs a continuable snapshot, and the harness saves one only once a tool
cycle settled: a process killed inside the first tool call, or after it but before that
snapshot, leaves nothing it can continue, although the store knows what happened. This
module closes the gap in two parts:

* :func:`resumable` returns the capabilities a run needs: ``StepPersistence`` with
  ``capture_frontier=True`` (a snapshot before every model request and of every tool-call
  frontier) and :class:`ToolResults`, which stores each tool's result durably the moment
  the tool returns, before the harness marks its effect ``completed``;
* :func:`plan_resume` rebuilds the run from the newest snapshot (interrupted ones
  included) and resolves every tool call that snapshot left open, with the replay states
  of :mod:`.replay`: ``done`` (a result is stored: reused, the tool never runs again),
  ``new`` (no effect recorded, or the tool failed: it runs), ``denied`` (a person said
  no: a refusal is returned to the model) and ``uncertain`` (the tool started and no
  result is stored: it may have had its effect). An uncertain call of an idempotent tool
  is run again; any other raises :class:`~.errors.UncertainEffect` until the caller
  decides (``decisions={tool_call_id: "retry" | "deny" | <the result to use>}``).
  :func:`resume_run` does both and runs the agent on, under a new run id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai_harness.step_persistence import StepPersistence

from ..errors import ConflictError, CorruptRecordError, UnsupportedError
from .codec import decode_record
from .errors import UncertainEffect
from .replay import ReplayState

if TYPE_CHECKING:
    from pydantic_ai.agent import AbstractAgent
    from pydantic_ai.run import AgentRunResult

    from .step_store import KVStepStore

RETRY = "retry"
"""A decision: run the uncertain tool call again."""
DENY = "deny"
"""A decision: do not run it; the model is told it was refused."""

_RESULT_LOG = "r"
_DENIED = "The tool call was not run: it was refused while resuming the run."


def _result_key(tool_call_id: str) -> str:
    if len(tool_call_id) <= 200:
        return f"{_RESULT_LOG}/{tool_call_id}"
    return f"{_RESULT_LOG}/h/{hashlib.sha256(tool_call_id.encode('utf-8', 'surrogatepass')).hexdigest()}"


def _run_id(ctx: RunContext[Any]) -> str:
    if ctx.run_id is None:
        raise RuntimeError("ToolResults needs the agent graph to assign RunContext.run_id")
    return ctx.run_id


@dataclass
class ToolResults(AbstractCapability[Any]):
    """Stores every tool result in the run's scope as soon as the tool returns.

    List it after ``StepPersistence`` (after-hooks run in reverse order, so the result is
    stored before the harness marks the effect ``completed``): a stored result is what
    makes a call ``done`` on resume. Keys on ``RunContext.run_id``, as ``StepPersistence``
    does when neither its ``run_id`` nor its ``agent_name`` is set.
    """

    store: KVStepStore

    async def after_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        result: Any,
    ) -> Any:
        part = ToolReturnPart(
            tool_name=call.tool_name, content=result, tool_call_id=call.tool_call_id
        )
        await save_tool_result(self.store, _run_id(ctx), part)
        return result


def resumable(store: KVStepStore, **persistence: Any) -> list[AbstractCapability[Any]]:
    """The capabilities of a run :func:`resume_run` can resume from any crash point.

    ``persistence`` goes to ``StepPersistence`` (``metadata``, ``parent_run_id``…); its
    ``run_id`` and ``agent_name`` must stay unset so both capabilities key on the same id.
    """
    if persistence.get("run_id") is not None or persistence.get("agent_name") is not None:
        raise ValueError("resumable(): pass the run id to Agent.run(run_id=...), not here")
    return [StepPersistence(store=store, capture_frontier=True, **persistence), ToolResults(store)]


async def save_tool_result(store: KVStepStore, run_id: str, part: ToolReturnPart) -> None:
    """Store ``part`` as the result of its call (the first stored result wins)."""
    scope = store.space.scope(run_id)
    ttl = await store.space.write_ttl(run_id)
    request = ModelRequest(parts=[part])
    record = {"v": 1, "message": ModelMessagesTypeAdapter.dump_python([request], mode="json")}
    value = await store.space.pack(run_id, record, ("v",), ttl)
    try:
        await store.kv.create(scope, _result_key(part.tool_call_id), value, ttl=ttl)
    except ConflictError:
        pass  # a retried hook: the stored result stands


async def load_tool_result(
    store: KVStepStore, run_id: str, tool_call_id: str
) -> ToolReturnPart | None:
    """The stored result of a call, or None."""
    entry = await store.kv.get(store.space.scope(run_id), _result_key(tool_call_id))
    if entry is None:
        return None
    what = f"tool result {tool_call_id!r} of run {run_id!r}"
    record = await store.space.unpack(run_id, decode_record(entry.value, what=what), what=what)
    try:
        (request,) = ModelMessagesTypeAdapter.validate_python(record["message"])
        (part,) = request.parts
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptRecordError(detail=f"{what} cannot be decoded: {exc}") from exc
    if not isinstance(part, ToolReturnPart):
        raise CorruptRecordError(detail=f"{what} is not a tool return")
    return part


@dataclass(frozen=True, slots=True)
class ResumedCall:
    """How one tool call left open by the crash is resolved."""

    tool_call_id: str
    tool_name: str
    state: ReplayState
    result: ToolReturnPart | None = None
    """The return handed to the model (done / denied), None when the tool runs."""


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """A run rebuilt from the store, ready for ``Agent.run(None, message_history=...)``."""

    run_id: str
    messages: list[ModelMessage]
    calls: tuple[ResumedCall, ...] = field(default=())

    @property
    def to_run(self) -> tuple[ResumedCall, ...]:
        """Calls the resumed run executes."""
        return tuple(c for c in self.calls if c.result is None)


async def plan_resume(
    store: KVStepStore,
    run_id: str,
    *,
    idempotent: Collection[str] = (),
    decisions: Mapping[str, Any] | None = None,
) -> ResumePlan:
    """Rebuild ``run_id`` for resumption (see the module docstring for the rules).

    ``idempotent`` names tools that may run again after an uncertain crash;
    ``decisions`` maps tool call ids to ``RETRY``, ``DENY`` or a result to use. Raises
    ``LookupError`` when the run left no snapshot at all (it stopped before its first
    model request: nothing happened, start it again), :class:`UncertainEffect` for an
    undecided uncertain call.
    """
    snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    if snapshot is None:
        raise LookupError(
            f"run {run_id!r} left no snapshot: it stopped before its first model request "
            f"(was it run with resumable(store)?); start it again"
        )
    messages = list(snapshot.messages)
    last = messages[-1] if messages else None
    if not isinstance(last, ModelResponse) or not last.tool_calls:
        return ResumePlan(run_id, messages)
    decisions = decisions or {}
    calls: list[ResumedCall] = []
    for call in last.tool_calls:
        calls.append(await _resolve(store, run_id, call, idempotent, decisions))
    resolved = [c.result for c in calls if c.result is not None]
    if not resolved:
        return ResumePlan(run_id, messages, tuple(calls))  # the run executes every call
    if len(resolved) < len(calls):
        raise UnsupportedError(
            detail=f"run {run_id!r}: calls {[c.tool_call_id for c in calls if c.result is None]} "
            f"must run while others of the same response are done; decide them (RETRY is not "
            f"possible here) or resolve them with a result"
        )
    return ResumePlan(run_id, [*messages, ModelRequest(parts=resolved)], tuple(calls))


async def _resolve(
    store: KVStepStore,
    run_id: str,
    call: ToolCallPart,
    idempotent: Collection[str],
    decisions: Mapping[str, Any],
) -> ResumedCall:
    stored = await load_tool_result(store, run_id, call.tool_call_id)
    if stored is not None:
        return ResumedCall(call.tool_call_id, call.tool_name, ReplayState.DONE, stored)
    decision = decisions.get(call.tool_call_id)
    if isinstance(decision, str) and decision == DENY:
        refusal = ToolReturnPart(call.tool_name, _DENIED, tool_call_id=call.tool_call_id)
        return ResumedCall(call.tool_call_id, call.tool_name, ReplayState.DENIED_CLOSED, refusal)
    effect = await store.get_tool_effect(run_id=run_id, tool_call_id=call.tool_call_id)
    if effect is None:
        return ResumedCall(call.tool_call_id, call.tool_name, ReplayState.NEW)
    if effect.status == "failed":
        return ResumedCall(call.tool_call_id, call.tool_name, ReplayState.DENIED_RETRY)
    # Started, or completed while its result was never stored: it may have had its effect.
    if call.tool_name in idempotent or (isinstance(decision, str) and decision == RETRY):
        return ResumedCall(call.tool_call_id, call.tool_name, ReplayState.NEW)
    if call.tool_call_id in decisions:
        part = ToolReturnPart(call.tool_name, decision, tool_call_id=call.tool_call_id)
        return ResumedCall(call.tool_call_id, call.tool_name, ReplayState.DONE, part)
    raise UncertainEffect(
        call.tool_call_id,
        detail=f"tool {call.tool_name!r} of run {run_id!r} was {effect.status} without a stored "
        f"result; decide it with decisions={{{call.tool_call_id!r}: 'retry' | 'deny' | result}}",
        intent=effect,
    )


async def resume_run(
    agent: AbstractAgent[Any, Any],
    store: KVStepStore,
    run_id: str,
    *,
    new_run_id: str | None = None,
    idempotent: Collection[str] = (),
    decisions: Mapping[str, Any] | None = None,
    **run_options: Any,
) -> AgentRunResult[Any]:
    """Resume ``run_id`` with ``agent`` (built with :func:`resumable`) and run it to the end.

    The resumed run gets a new run id (``new_run_id``, default ``<run_id>.resumed``), as
    run ids are single-shot; resume *that* id if it crashes too.
    """
    plan = await plan_resume(store, run_id, idempotent=idempotent, decisions=decisions)
    return await agent.run(
        None,
        message_history=plan.messages,
        run_id=new_run_id or f"{run_id}.resumed",
        **run_options,
    )
