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

What the store knows of each open call is read by one function, :func:`effect_knowledge`,
which a fork (:meth:`~agent_stores.checkpointer.Checkpointer.fork_run`) reads too: a fork
of a run is resumed by the same rules as the run itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai_harness.step_persistence import StepPersistence, ToolEffectRecord

from ..errors import ConflictError, CorruptRecordError, UnsupportedError
from .codec import decode_record
from .errors import ForkIncompleteError, UncertainEffect
from .fork import fork_lineage
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
    effect: ToolEffectRecord | None = None
    """The call's effect record, when one is stored."""


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


@dataclass(frozen=True, slots=True)
class Frontier:
    """The tool calls of a history's last model response and the answers that follow it."""

    index: int
    """Position of the last ``ModelResponse`` in the history."""
    calls: tuple[ToolCallPart, ...]
    """Its tool calls, in order."""
    answered: dict[str, ModelRequestPart]
    """Returns already in the history after it, by tool call id."""
    others: tuple[ModelRequestPart, ...] = ()
    """Parts after it that answer none of its calls (returns synthesized for an
    interrupted call are dropped: the call is open)."""

    @property
    def open(self) -> tuple[ToolCallPart, ...]:
        """Calls without an answer: what the run would execute next."""
        return tuple(c for c in self.calls if c.tool_call_id not in self.answered)


def frontier(messages: Sequence[ModelMessage]) -> Frontier | None:
    """The tool calls of the last model response and what answers them, or None when the
    history holds no model response.

    Besides a history ending in the response itself (a frontier snapshot), a run that
    failed inside a tool cycle leaves the response followed by a request holding the
    returns captured before the failure, often none: its calls without a return are open.
    A return with outcome ``interrupted`` (synthesized by a history repair: no result was
    produced, the effect may have happened) answers nothing.
    """
    index = next(
        (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], ModelResponse)),
        None,
    )
    if index is None:
        return None
    response = messages[index]
    assert isinstance(response, ModelResponse)
    calls = {c.tool_call_id for c in response.tool_calls}
    answered: dict[str, ModelRequestPart] = {}
    others: list[ModelRequestPart] = []
    for message in messages[index + 1 :]:
        assert isinstance(message, ModelRequest)  # the last response is at ``index``
        for part in message.parts:
            if isinstance(part, ToolReturnPart) and part.tool_call_id in calls:
                if part.outcome != "interrupted":
                    answered[part.tool_call_id] = part
            else:
                others.append(part)
    return Frontier(index, tuple(response.tool_calls), answered, tuple(others))


async def effect_knowledge(
    store: KVStepStore, run_id: str, calls: Sequence[ToolCallPart]
) -> tuple[ResumedCall, ...]:
    """What ``run_id``'s store knows of each call's effect, deciding nothing.

    ``DONE`` (a result is stored: it is the ``result``), ``NEW`` (no effect recorded: the
    tool never started), ``DENIED_RETRY`` (the tool failed: nothing to protect) or
    ``UNCERTAIN`` (started, or completed while its result was never stored: it may have
    had its effect). :func:`plan_resume` and a fork's report read it; one function, so a
    fork is judged by exactly the rules a resume applies.
    """
    out: list[ResumedCall] = []
    for call in calls:
        ident, name = call.tool_call_id, call.tool_name
        stored = await load_tool_result(store, run_id, ident)
        effect = await store.get_tool_effect(run_id=run_id, tool_call_id=ident)
        if stored is not None:
            out.append(ResumedCall(ident, name, ReplayState.DONE, stored, effect))
        elif effect is None:
            out.append(ResumedCall(ident, name, ReplayState.NEW))
        elif effect.status == "failed":
            out.append(ResumedCall(ident, name, ReplayState.DENIED_RETRY, None, effect))
        else:
            out.append(ResumedCall(ident, name, ReplayState.UNCERTAIN, None, effect))
    return tuple(out)


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
    undecided uncertain call, :class:`ForkIncompleteError` for a fork whose copy was cut
    off.
    """
    lineage = await fork_lineage(store.kv, store.space, run_id)
    if lineage is not None and not lineage.complete:
        raise ForkIncompleteError(
            detail=f"run {run_id!r} is a fork of {lineage.source_run_id!r} whose copy did not "
            "finish: run fork_run again with the same arguments, or delete it"
        )
    snapshot = await store.latest_snapshot(run_id=run_id, include_interrupted=True)
    if snapshot is None:
        raise LookupError(
            f"run {run_id!r} left no snapshot: it stopped before its first model request "
            f"(was it run with resumable(store)?); start it again"
        )
    messages = list(snapshot.messages)
    at = frontier(messages)
    if at is None or not at.open:
        return ResumePlan(run_id, messages)
    decisions = decisions or {}
    known = await effect_knowledge(store, run_id, at.open)
    calls = tuple(_decide(run_id, k, idempotent, decisions) for k in known)
    settled = messages[: at.index + 1]
    resolved = {c.tool_call_id: c.result for c in calls if c.result is not None}
    if not resolved and not at.answered and not at.others:
        return ResumePlan(run_id, settled, calls)  # the run executes every call
    if len(resolved) < len(calls):
        raise UnsupportedError(
            detail=f"run {run_id!r}: calls {[c.tool_call_id for c in calls if c.result is None]} "
            f"must run while others of the same response are done; decide them (RETRY is not "
            f"possible here) or resolve them with a result"
        )
    answers = {**at.answered, **resolved}
    parts = [*at.others, *(answers[c.tool_call_id] for c in at.calls)]
    return ResumePlan(run_id, [*settled, ModelRequest(parts=parts)], calls)


def _decide(
    run_id: str, known: ResumedCall, idempotent: Collection[str], decisions: Mapping[str, Any]
) -> ResumedCall:
    """Apply the caller's rules to what the store knows of one call."""
    if known.state is ReplayState.DONE:
        return known
    ident, name = known.tool_call_id, known.tool_name
    decision = decisions.get(ident)
    if isinstance(decision, str) and decision == DENY:
        refusal = ToolReturnPart(name, _DENIED, tool_call_id=ident)
        return replace(known, state=ReplayState.DENIED_CLOSED, result=refusal)
    if known.state is not ReplayState.UNCERTAIN:
        return known
    if name in idempotent or (isinstance(decision, str) and decision == RETRY):
        return replace(known, state=ReplayState.NEW)
    if ident in decisions:
        part = ToolReturnPart(name, decision, tool_call_id=ident)
        return replace(known, state=ReplayState.DONE, result=part)
    status = known.effect.status if known.effect is not None else "started"
    raise UncertainEffect(
        ident,
        detail=f"tool {name!r} of run {run_id!r} was {status} without a stored "
        f"result; decide it with decisions={{{ident!r}: 'retry' | 'deny' | result}}",
        intent=known.effect,
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
