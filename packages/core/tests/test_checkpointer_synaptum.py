"""Synaptum's own agent loop on our checkpointer, through ``SynaptumCheckpointer``.

Synaptum needs Python >= 3.13 (the ``synaptum`` extra); where it is not installed these
tests skip. To run them: a Python 3.13 environment with ``agent-stores``, ``synaptum``,
``pytest`` and ``pytest-asyncio``, then ``pytest packages/core/tests/test_checkpointer_synaptum.py``.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

if sys.version_info < (3, 13):
    pytest.skip(
        "synaptum needs Python >= 3.13 (this is "
        f"{sys.version_info.major}.{sys.version_info.minor}); install the 'synaptum' extra there",
        allow_module_level=True,
    )
synaptum: Any = pytest.importorskip(
    "synaptum", reason="synaptum is not installed (pip install 'agent-stores[synaptum]')"
)

from agent_stores import open_checkpointer  # noqa: E402
from agent_stores.checkpointer import SynaptumCheckpointer  # noqa: E402
from synaptum.core.events import ModelStep, Phase, ToolStep  # noqa: E402
from synaptum.core.protocols import AppendResult  # noqa: E402
from synaptum.run.journal import Replay  # noqa: E402
from synaptum.testing import FakeGateway, calls, says  # noqa: E402


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return f"memory://syn-{uuid.uuid4().hex[:8]}"
    return f"sqlite:///{tmp_path}/syn.db"


async def test_protocol_conformance(url: str) -> None:
    """The adapter satisfies Synaptum's Checkpointer protocol: idempotent append, ordered load."""
    async with open_checkpointer(url) as cp:
        adapter = SynaptumCheckpointer(cp)
        assert isinstance(adapter, synaptum.Checkpointer)
        assert (await adapter.load("unknown")).events == ()
        intent = ModelStep(
            run_id="r", step_id="000000-model", step_seq=0, phase=Phase.ATTEMPTED, at=1.0
        )
        first = await adapter.append("r", intent)
        assert isinstance(first, AppendResult) and first.seq == 0
        again = await adapter.append("r", replace(intent, at=2.0))
        assert again.duplicate and again.seq == 0 and not again.payload_diverged
        call = ToolStep(
            run_id="r", step_id="000001-tool", step_seq=1, phase=Phase.ATTEMPTED, idempotent=False
        )
        await adapter.append("r", call)
        diverged = await adapter.append("r", replace(call, idempotent=True))
        assert diverged.duplicate and diverged.payload_diverged
        state = await adapter.load("r")
        assert isinstance(state, synaptum.RunState)
        assert [e.step_id for e in state.events] == ["000000-model", "000001-tool"]
        assert state.events[0] == intent
        assert state.attempted("000001-tool") and state.next_seq == 2
        with pytest.raises(synaptum.UncertainEffect):
            Replay(state).resolve("000001-tool", idempotent=False)


async def test_agent_resumes_without_repeating_paid_work(url: str) -> None:
    """A Synaptum run crashes after a tool step; a new session on the same run id replays the
    model and tool steps from our journal (the tool runs once) and finishes."""
    executed: list[int] = []

    @synaptum.tool(idempotent=False)
    def pay(amount: int) -> str:
        """Pay an amount."""
        executed.append(amount)
        return f"paid {amount}"

    agent = synaptum.Agent("payer", model="fake:model", tools=[pay])
    async with open_checkpointer(url) as cp:
        crashing = FakeGateway(
            calls("pay", amount=5), synaptum.ProviderError("gone", status=400), tools=[pay]
        )
        with pytest.raises(synaptum.ProviderError):
            async for _ in agent.run(
                "pay 5", session=synaptum.Session("run-1", crashing, SynaptumCheckpointer(cp))
            ):
                pass
    async with open_checkpointer(url) as cp:
        finishing = FakeGateway(says("all paid"), tools=[pay])
        steps = [
            step
            async for step in agent.run(
                "pay 5", session=synaptum.Session("run-1", finishing, SynaptumCheckpointer(cp))
            )
        ]
        assert executed == [5], "the tool ran again on resume"
        final = steps[-1]
        assert final.kind == "final" and final.output == "all paid"
        assert (await cp.load("run-1")).final is not None
