"""A two-tool harness run that kills itself (SIGKILL) at a chosen point, and its resumption.

``python resume_worker.py run URL RUN_ID CRASH_AT LOG`` runs the agent: model → ``alpha``
→ model → ``beta`` → model → "done". Each tool appends ``<name> effect`` to LOG when its
effect happens. CRASH_AT names where the process SIGKILLs itself (see ``CRASH_POINTS``).

``python resume_worker.py resume URL RUN_ID - LOG [DECISIONS_JSON] [IDEMPOTENT]`` resumes
the run with ``resume_run`` and prints the output as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from agent_stores import open_checkpointer
from agent_stores.checkpointer.resume import resumable, resume_run
from pydantic_ai import Agent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import RunContext, ToolDefinition

CRASH_POINTS = (
    "model-1",  # inside the first model call
    "before-alpha",  # after the response calling alpha, before alpha starts
    "inside-alpha",  # alpha had its effect, then died before returning
    "after-alpha",  # alpha returned and its result is stored, before the next snapshot
    "model-2",  # between the model calls: inside the second model call
    "before-beta",
    "inside-beta",
    "after-beta",
    "model-3",
)

CRASH_AT = ""


def die(point: str) -> None:
    if point == CRASH_AT:
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = {p.tool_name for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    if "alpha" not in returned:
        die("model-1")
        return ModelResponse(parts=[ToolCallPart("alpha", {"x": 1}, tool_call_id="a1")])
    if "beta" not in returned:
        die("model-2")
        return ModelResponse(parts=[ToolCallPart("beta", {"x": 2}, tool_call_id="b1")])
    die("model-3")
    results = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    return ModelResponse(parts=[TextPart(f"done {results}")])


@dataclass
class Crasher(AbstractCapability[Any]):
    """Listed first: its before-hook runs before StepPersistence's, its after-hook last."""

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
    ) -> dict[str, Any]:
        die(f"before-{call.tool_name}")
        return args

    async def after_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        result: Any,
    ) -> Any:
        die(f"after-{call.tool_name}")
        return result


def build_agent(store: Any, log: str) -> Agent[None, str]:
    agent: Agent[None, str] = Agent(
        FunctionModel(model), capabilities=[Crasher(), *resumable(store)]
    )

    def effect(name: str, x: int) -> str:
        with open(log, "a") as f:
            f.write(f"{name} effect\n")
            f.flush()
            os.fsync(f.fileno())
        die(f"inside-{name}")
        return f"{name}({x})"

    @agent.tool_plain
    def alpha(x: int) -> str:
        return effect("alpha", x)

    @agent.tool_plain
    def beta(x: int) -> str:
        return effect("beta", x)

    return agent


async def main(argv: list[str]) -> None:
    global CRASH_AT
    mode, url, run_id, crash_at, log = argv[:5]
    async with open_checkpointer(url) as checkpointer:
        store = checkpointer.step_store()
        agent = build_agent(store, log)
        if mode == "run":
            CRASH_AT = crash_at
            result = await agent.run("go", run_id=run_id)
        else:
            decisions = json.loads(argv[5]) if len(argv) > 5 else None
            idempotent = argv[6].split(",") if len(argv) > 6 and argv[6] else ()
            result = await resume_run(
                agent, store, run_id, decisions=decisions, idempotent=idempotent
            )
        print(json.dumps({"output": result.output}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
