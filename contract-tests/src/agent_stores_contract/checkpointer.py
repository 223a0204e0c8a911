"""The checkpointer contract: the run journal, replay, the journal writer and the harness
``StepStore``, on whatever backend ``--store-url`` names.

Each test's docstring states the guarantee it checks. Tests isolate themselves with a
per-test namespace, take sizes from ``kv.limits`` and use only public APIs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from agent_stores import KVStore
from agent_stores.checkpointer import (
    Checkpointer,
    Durability,
    ForkIncompleteError,
    ForkPointError,
    JournalEvent,
    KVStepStore,
    Outcome,
    Phase,
    Replay,
    ReplayMismatchError,
    ReplayState,
    RunExistsError,
    RunNotFoundError,
    UncertainEffect,
    make_step_id,
)
from agent_stores.checkpointer.port import KVJournalPort
from agent_stores.checkpointer.space import DEFAULT_RUN_TTL_SECONDS
from agent_stores.kv.base import Operation
from agent_stores.kv.counting import CountingKV

from .base import ContractBase, KVFactory, require_capability

pytestmark = pytest.mark.asyncio

CheckpointerFactory = Callable[..., Checkpointer]


async def run_checkpointer_workers(commands: list[list[str]]) -> list[str]:
    """Run ``python -m agent_stores_contract.checkpointer_workers`` once per command; their stdout."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent_stores_contract.checkpointer_workers",
            *command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for command in commands
    ]
    outputs = [await p.communicate() for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()[-3000:]
    return [out.decode() for out, _ in outputs]


T = TypeVar("T")


def offset_clock(kv: KVStore, seconds: float) -> None:
    """Move the store's clock forward by ``seconds`` (expiry is decided by the core's clock)."""
    base = kv.clock
    kv.clock = lambda: base() + seconds


class FlakyKV(CountingKV):
    """A real backend with injected failures on ``create`` of chosen keys.

    ``fail_before[key]`` raises before the write reaches the backend; ``fail_after[key]``
    lets the write land and then raises (a lost acknowledgement). Each fires once, on the
    entry's create or on the native journal port's append of it.
    """

    def __init__(self, inner: KVStore) -> None:
        super().__init__(inner)
        self.fail_before: set[str] = set()
        self.fail_after: set[str] = set()

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        if key in self.fail_before:
            self.fail_before.discard(key)
            raise ConnectionError(f"injected failure before writing {key}")
        version = await super()._create(scope, key, value, expires_at, now)
        if key in self.fail_after:
            self.fail_after.discard(key)
            raise ConnectionError(f"injected failure after writing {key}")
        return version

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        return await super()._commit(scope, ops, now)

    async def through_port(
        self, call: str, run: Callable[[], Awaitable[T]], *, write: bool, sent: int, key: str
    ) -> T:
        """A native journal append of a chosen entry fails the same way as its create."""
        if key in self.fail_before:
            self.fail_before.discard(key)
            raise ConnectionError(f"injected failure before writing {key}")
        result = await super().through_port(call, run, write=write, sent=sent, key=key)
        if key in self.fail_after:
            self.fail_after.discard(key)
            raise ConnectionError(f"injected failure after writing {key}")
        return result


def model_step(i: int, phase: Phase = Phase.COMPLETED, **fields: Any) -> JournalEvent:
    return JournalEvent(step_id=make_step_id(i, "model"), phase=phase, payload={"i": i}, **fields)


def tool_call_messages(text: str = "hi") -> list[Any]:
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    return [
        ModelRequest(parts=[UserPromptPart(text)]),
        ModelResponse(parts=[ToolCallPart("work", {"n": 1}, tool_call_id="c1")]),
        ModelRequest(parts=[ToolReturnPart("work", "ok", tool_call_id="c1")]),
        ModelResponse(parts=[TextPart("done")]),
    ]


class ToolCrash(BaseException):
    """Raised inside a tool after its effect: the run stops there as a killed process does,
    with no hook recording the tool's outcome (a ``BaseException`` passes them all)."""


PAID = "receipt for 5"


def effect_agent(store: KVStepStore, effects: list[int], *, crash: bool = False) -> Any:
    """A resumable agent on a ``FunctionModel``: it calls the effect tool ``pay`` once
    (call id ``pay-1``), then answers with what ``pay`` returned. Every execution of ``pay``
    appends to ``effects``; with ``crash`` the tool has its effect, then the run stops
    inside it (:class:`ToolCrash`)."""
    from agent_stores.checkpointer.resume import resumable
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        returned = [
            part.content
            for message in messages
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("pay", {"amount": 5}, tool_call_id="pay-1")])
        return ModelResponse(parts=[TextPart(f"paid: {returned[0]}")])

    agent: Any = Agent(FunctionModel(model), capabilities=[*resumable(store)])

    def pay(amount: int) -> str:
        """The side effect, counted."""
        effects.append(amount)
        if crash:
            raise ToolCrash
        return PAID

    agent.tool_plain(pay)
    return agent


def calls_pay(messages: Sequence[Any]) -> bool:
    """True when the history holds the model's call of ``pay``."""
    from pydantic_ai.messages import ModelResponse

    return any(
        isinstance(m, ModelResponse) and any(c.tool_call_id == "pay-1" for c in m.tool_calls)
        for m in messages
    )


def returns_of_pay(messages: Sequence[Any]) -> list[Any]:
    """The contents of every return of ``pay`` in the history."""
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    return [
        part.content
        for m in messages
        if isinstance(m, ModelRequest)
        for part in m.parts
        if isinstance(part, ToolReturnPart) and part.tool_call_id == "pay-1"
    ]


async def raw_run_entries(kv: KVStore, checkpointer: Checkpointer, run_id: str) -> dict[str, Any]:
    """Every stored entry of a run (its scope, its listing entry), value and version."""
    space = checkpointer.space
    out: dict[str, Any] = {}
    async for item in kv.iter_scan(space.scope(run_id)):
        assert item.entry is not None
        out[item.key] = (item.entry.value, item.entry.version, item.entry.expires_at)
    listed = await kv.get(space.runs_scope, run_id)
    out["~listing"] = (listed.value, listed.version) if listed is not None else None
    return out


class CheckpointerContract(ContractBase):
    """The checkpointer contract. Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    @pytest_asyncio.fixture
    async def checkpointer_factory(
        self, kv_factory: KVFactory, ns: str
    ) -> AsyncIterator[CheckpointerFactory]:
        """Opens checkpointers on new clients of the backend (closed after the test)."""
        opened: list[Checkpointer] = []

        generic = self.store_path == "generic"

        def make(kv: KVStore | None = None, **options: Any) -> Checkpointer:
            if generic:
                options = {"port": KVJournalPort(), **options}
            checkpointer = Checkpointer(
                kv if kv is not None else kv_factory(),
                owns_kv=True,
                scope_prefix=f"{ns}/",
                **options,
            )
            opened.append(checkpointer)
            if generic:
                assert type(checkpointer.port) is KVJournalPort, "not on the generic path"
            return checkpointer

        try:
            yield make
        finally:
            for checkpointer in opened:
                await checkpointer.aclose()
            # Leave nothing behind on a shared server: erase every run of this namespace.
            async with Checkpointer(kv_factory(), owns_kv=True, scope_prefix=f"{ns}/") as cleaner:
                deleted: set[str] = set()
                # Bounded: a run listed again after delete_run stops the cleanup with a
                # warning (the checkpointer tests name the broken rule), never a hang.
                while page := await cleaner.list_runs(limit=100):
                    again = sorted({info.run_id for info in page} & deleted)
                    if again:
                        warnings.warn(
                            f"contract cleanup: run {again[0]!r} is still listed after "
                            "delete_run; cleanup stopped",
                            stacklevel=1,
                        )
                        break
                    for info in page:
                        await cleaner.delete_run(info.run_id)
                        deleted.add(info.run_id)
                await cleaner.kv.drop_scope(cleaner.space.runs_scope)

    @pytest_asyncio.fixture
    async def checkpointer(self, checkpointer_factory: CheckpointerFactory) -> Checkpointer:
        """A checkpointer on a fresh client, set up."""
        checkpointer = checkpointer_factory()
        await checkpointer.setup()
        return checkpointer

    @pytest.fixture
    def steps(self, checkpointer: Checkpointer) -> KVStepStore:
        """The harness step store of ``checkpointer``."""
        return checkpointer.step_store()

    # -- append / load ---------------------------------------------------------------------

    async def test_unknown_run_loads_empty(self, checkpointer: Checkpointer) -> None:
        """load of a run never written returns an empty journal (not an error), next_seq 0."""
        state = await checkpointer.load("never-written")
        assert state.entries == () and state.next_seq == 0 and state.final is None
        assert not state.completed("000000-model") and not state.attempted("000000-model")

    async def test_append_positions_follow_write_order(self, checkpointer: Checkpointer) -> None:
        """Appends get positions 0, 1, 2 … and load returns the entries in that order with their payloads."""
        results = [await checkpointer.append("r", model_step(i)) for i in range(5)]
        assert [r.seq for r in results] == [0, 1, 2, 3, 4]
        assert not any(r.duplicate or r.payload_diverged for r in results)
        state = await checkpointer.load("r")
        assert [e.seq for e in state.entries] == [0, 1, 2, 3, 4]
        assert [e.payload for e in state.entries] == [{"i": i} for i in range(5)]
        assert state.next_seq == 5

    async def test_reappend_returns_original_seq(self, checkpointer: Checkpointer) -> None:
        """Re-appending the same (run, step_id, phase) is a no-op reporting the original position;
        it consumes no position and the journal holds the event once."""
        first = await checkpointer.append("r", model_step(0))
        await checkpointer.append("r", model_step(1))
        again = await checkpointer.append("r", model_step(0))
        assert again.seq == first.seq == 0
        assert again.duplicate and not again.payload_diverged
        after = await checkpointer.append("r", model_step(2))
        assert after.seq == 2, "a duplicate must not consume a position"
        state = await checkpointer.load("r")
        assert [(e.step_id, e.seq) for e in state.entries] == [
            ("000000-model", 0),
            ("000001-model", 1),
            ("000002-model", 2),
        ]

    async def test_reappend_from_another_client(
        self, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """A retry from another client (another process after a crash) is recognised as a duplicate."""
        one, two = checkpointer_factory(), checkpointer_factory()
        first = await one.append("r", model_step(0, Phase.ATTEMPTED))
        again = await two.append("r", model_step(0, Phase.ATTEMPTED))
        assert again.duplicate and again.seq == first.seq
        assert len(await one.load("r")) == 1

    async def test_diverged_payload_flagged(self, checkpointer: Checkpointer) -> None:
        """A duplicate whose payload differs is flagged payload_diverged; the stored payload is kept."""
        await checkpointer.append("r", JournalEvent.completed("000000-tool", {"result": "A"}))
        retry = await checkpointer.append(
            "r", JournalEvent.completed("000000-tool", {"result": "B"})
        )
        assert retry.duplicate and retry.payload_diverged and retry.seq == 0
        state = await checkpointer.load("r")
        assert len(state) == 1 and state.entries[0].payload == {"result": "A"}

    async def test_divergence_is_semantic(self, checkpointer: Checkpointer) -> None:
        """Divergence compares a canonical serialization: key order, timestamp and trace meta do not count;
        a changed outcome does."""
        await checkpointer.append(
            "r", JournalEvent.completed("s", {"a": 1, "b": [1, 2]}, at=1.0, meta={"trace": "x"})
        )
        same = await checkpointer.append(
            "r", JournalEvent.completed("s", {"b": [1, 2], "a": 1}, at=2.0, meta={"trace": "y"})
        )
        assert same.duplicate and not same.payload_diverged
        other = await checkpointer.append(
            "r",
            JournalEvent.completed("s", {"a": 1, "b": [1, 2]}, outcome=Outcome.DENIED_BY_POLICY),
        )
        assert other.duplicate and other.payload_diverged

    async def test_phases_are_separate_entries(self, checkpointer: Checkpointer) -> None:
        """attempted and completed of one step are two entries; each is idempotent on its own."""
        intent = await checkpointer.append("r", model_step(0, Phase.ATTEMPTED))
        result = await checkpointer.append("r", model_step(0, Phase.COMPLETED))
        assert (intent.seq, result.seq) == (0, 1) and not result.duplicate
        assert (await checkpointer.append("r", model_step(0, Phase.ATTEMPTED))).seq == 0
        assert (await checkpointer.append("r", model_step(0, Phase.COMPLETED))).seq == 1

    async def test_runs_are_independent(self, checkpointer: Checkpointer) -> None:
        """Each run has its own positions and its own idempotency keys."""
        assert (await checkpointer.append("a", model_step(0))).seq == 0
        b = await checkpointer.append("b", model_step(0))
        assert b.seq == 0 and not b.duplicate
        assert len(await checkpointer.load("a")) == len(await checkpointer.load("b")) == 1

    async def test_run_state_queries(self, checkpointer: Checkpointer) -> None:
        """RunState answers result_of / completed / attempted (exclusive) / final / next_seq."""
        await checkpointer.append("r", model_step(0, Phase.ATTEMPTED))
        await checkpointer.append("r", model_step(0, Phase.COMPLETED))
        await checkpointer.append("r", JournalEvent.attempted("000001-tool", {"call": 1}))
        state = await checkpointer.load("r")
        assert state.completed("000000-model") and not state.attempted("000000-model")
        result = state.result_of("000000-model")
        assert result is not None and result.seq == 1 and result.phase is Phase.COMPLETED
        assert state.attempted("000001-tool") and not state.completed("000001-tool")
        assert state.result_of("000001-tool") is None and state.uncertain_steps() == ["000001-tool"]
        assert state.final is None and state.next_seq == 3
        await checkpointer.append("r", JournalEvent.completed("000002-final", {"output": "x"}))
        closed = await checkpointer.load("r")
        assert closed.final is not None and closed.final.payload == {"output": "x"}

    async def test_large_payload_round_trips(self, checkpointer: Checkpointer) -> None:
        """A payload larger than the backend's item limit is stored (chunked), loaded intact, and
        its duplicate is still recognised and compared."""
        size = checkpointer.kv.limits.max_value_bytes * 2 + 123
        big = {"blob": "x" * size, "tail": "é😀"}
        first = await checkpointer.append("r", JournalEvent.completed("000000-tool", big))
        again = await checkpointer.append("r", JournalEvent.completed("000000-tool", big))
        assert again.duplicate and again.seq == first.seq and not again.payload_diverged
        changed = await checkpointer.append(
            "r", JournalEvent.completed("000000-tool", {**big, "tail": "other"})
        )
        assert changed.payload_diverged
        state = await checkpointer.load("r")
        assert len(state) == 1 and state.entries[0].payload == big

    async def test_bad_input_is_refused_before_writing(self, checkpointer: Checkpointer) -> None:
        """Invalid events are refused with a clear error and nothing is written."""
        with pytest.raises(ValueError):
            JournalEvent.completed("")
        with pytest.raises(ValueError):
            await checkpointer.append("r", JournalEvent.completed("s", {"x": float("nan")}))
        with pytest.raises(TypeError):
            await checkpointer.append("r", JournalEvent.completed("s", {"x": object()}))
        with pytest.raises(TypeError):
            await checkpointer.append("r", {"step_id": "s"})  # type: ignore[arg-type]
        assert len(await checkpointer.load("r")) == 0

    # -- concurrency and cost ------------------------------------------------------------------

    async def test_concurrent_appenders_lose_nothing(
        self, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """20 tasks on 4 clients appending to one run: no event lost, no position shared, and each
        task's events keep their order."""
        clients = [checkpointer_factory() for _ in range(4)]
        per_task = 8

        async def appender(task: int) -> list[int]:
            client = clients[task % len(clients)]
            seqs = []
            for i in range(per_task):
                result = await client.append(
                    "r", JournalEvent.completed(f"t{task:02d}-{i:02d}", {"t": task})
                )
                assert not result.duplicate
                seqs.append(result.seq)
            return seqs

        per_task_seqs = await asyncio.gather(*(appender(t) for t in range(20)))
        for seqs in per_task_seqs:
            assert seqs == sorted(seqs), "a task's appends lost their order"
        all_seqs = [s for seqs in per_task_seqs for s in seqs]
        assert len(set(all_seqs)) == len(all_seqs) == 20 * per_task, "two appends share a position"
        state = await clients[0].load("r")
        assert len(state) == 20 * per_task
        assert {e.step_id for e in state.entries} == {
            f"t{t:02d}-{i:02d}" for t in range(20) for i in range(per_task)
        }
        assert [e.seq for e in state.entries] == sorted(all_seqs)

    async def test_concurrent_duplicates_one_winner(
        self, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """20 tasks appending the same event at once: exactly one is not a duplicate, all report the
        same position, and the journal holds it once."""
        clients = [checkpointer_factory() for _ in range(4)]
        results = await asyncio.gather(
            *(clients[i % 4].append("r", model_step(0)) for i in range(20))
        )
        assert sum(not r.duplicate for r in results) == 1
        assert len({r.seq for r in results}) == 1
        assert not any(r.payload_diverged for r in results)
        assert len(await clients[0].load("r")) == 1

    async def test_concurrent_appenders_across_processes(
        self, kv: KVStore, store_url: str, ns: str, checkpointer: Checkpointer, tmp_path: Path
    ) -> None:
        """4 OS processes released together by a barrier append to one run with their appends interleaved: every event kept, every position distinct."""
        require_capability(
            kv, "shared_across_processes", "process-local: no second process can share the run"
        )
        processes, per_process = 4, 20
        switches = 0
        # Appends are quick: a run where the OS happened to schedule the processes one
        # after another proves nothing about concurrency, so it is repeated (up to 3 runs).
        for attempt in range(3):
            run = f"r{attempt}"
            barrier = tmp_path / run
            barrier.mkdir()
            outputs = await run_checkpointer_workers(
                [
                    [
                        "journal-append",
                        store_url,
                        ns,
                        run,
                        f"p{p}",
                        str(per_process),
                        "--barrier",
                        str(barrier),
                        str(processes),
                    ]
                    for p in range(processes)
                ]
            )
            appends = [json.loads(line) for out in outputs for line in out.splitlines() if line]
            seqs = [a["seq"] for a in appends]
            assert len(seqs) == len(set(seqs)) == processes * per_process
            state = await checkpointer.load(run)
            assert len(state) == processes * per_process
            assert sorted(e.seq for e in state.entries) == sorted(seqs)
            by_seq = [a["worker"] for a in sorted(appends, key=lambda a: a["seq"])]
            switches = sum(1 for a, b in itertools.pairwise(by_seq) if a != b)
            if switches > processes - 1:
                break
        assert switches > processes - 1, (
            f"in 3 runs the processes always appended one after another ({switches} switches)"
        )

    async def test_append_cost_independent_of_run_length(
        self, kv_factory: KVFactory, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """Storage operations per append are the same at run lengths 10 and 2,000 (counted with
        CountingKV on a fresh client, cold first append included): an append never reads the run."""
        builder = checkpointer_factory()
        for run, length in (("short", 10), ("long", 2000)):
            await builder.append_many(run, [model_step(i) for i in range(length)])
        measured: dict[str, tuple[dict[str, int], int]] = {}
        for run, length in (("short", 10), ("long", 2000)):
            counting = CountingKV(kv_factory())
            probe = checkpointer_factory(counting)
            for i in range(length, length + 6):
                result = await probe.append(run, model_step(i))
                assert result.seq == i
            measured[run] = (dict(counting.calls), counting.bytes_read)
        (short_calls, short_read), (long_calls, long_read) = measured["short"], measured["long"]
        assert short_calls == long_calls, f"ops differ: {short_calls} vs {long_calls}"
        assert abs(short_read - long_read) <= 16, "an append read data that grows with the run"
        assert sum(short_calls.values()) <= 6 * 3 + 3

    # -- replay ----------------------------------------------------------------------------

    async def test_replay_done(self, checkpointer: Checkpointer) -> None:
        """A step with a recorded result resolves DONE with that result: nothing is re-run."""
        await checkpointer.append("r", model_step(0, Phase.ATTEMPTED))
        await checkpointer.append("r", JournalEvent.completed("000000-model", {"answer": 42}))
        replay = Replay(await checkpointer.load("r"))
        resolution = replay.resolve("000000-model", idempotent=False)
        assert resolution.state is ReplayState.DONE and not resolution.should_run
        assert resolution.entry is not None and resolution.entry.payload == {"answer": 42}
        assert replay.replayed == 1

    async def test_replay_new(self, checkpointer: Checkpointer) -> None:
        """A step without any trace resolves NEW; an intent of an idempotent step also resolves NEW."""
        await checkpointer.append(
            "r", JournalEvent.attempted("000000-tool", {"q": 1}, idempotent=True)
        )
        replay = Replay(await checkpointer.load("r"))
        assert replay.resolve("000001-model").state is ReplayState.NEW
        safe = replay.resolve("000000-tool")
        assert safe.state is ReplayState.NEW and safe.should_run

    async def test_replay_denied_retry(self, checkpointer: Checkpointer) -> None:
        """A step denied by policy, or whose approval expired, resolves DENIED_RETRY (run it again)."""
        await checkpointer.append(
            "r", JournalEvent.completed("000000-tool", outcome=Outcome.DENIED_BY_POLICY)
        )
        await checkpointer.append(
            "r", JournalEvent.completed("000001-approval", outcome=Outcome.APPROVAL_EXPIRED)
        )
        await checkpointer.append("r", JournalEvent.completed("000002-tool", denied=True))
        replay = Replay(await checkpointer.load("r"))
        for step in ("000000-tool", "000001-approval", "000002-tool"):
            resolution = replay.resolve(step)
            assert resolution.state is ReplayState.DENIED_RETRY and resolution.should_run
        assert replay.denied == 3

    async def test_replay_denied_closed(self, checkpointer: Checkpointer) -> None:
        """A step a person said no to resolves DENIED_CLOSED: not re-run and not asked again."""
        await checkpointer.append(
            "r",
            JournalEvent.completed(
                "000000-approval", outcome=Outcome.APPROVAL_DENIED, reason="no transfers"
            ),
        )
        replay = Replay(await checkpointer.load("r"))
        resolution = replay.resolve("000000-approval")
        assert resolution.state is ReplayState.DENIED_CLOSED and not resolution.should_run
        assert resolution.entry is not None and resolution.entry.event.reason == "no transfers"
        assert replay.closed_by_decision == 1

    async def test_replay_uncertain(self, checkpointer: Checkpointer) -> None:
        """An intent without a result for a non-idempotent step is UNCERTAIN: resolve raises a typed
        UncertainEffect naming the step, classify reports it without raising."""
        await checkpointer.append(
            "r", JournalEvent.attempted("000001-tool", {"transfer": 100}, idempotent=False)
        )
        replay = Replay(await checkpointer.load("r"))
        with pytest.raises(UncertainEffect) as info:
            replay.resolve("000001-tool")
        assert info.value.step_id == "000001-tool"
        assert info.value.code == "RUN_UNCERTAIN_EFFECT"
        assert replay.classify("000001-tool").state is ReplayState.UNCERTAIN
        assert replay.classify("000001-tool", idempotent=True).state is ReplayState.NEW

    async def test_replay_detects_shifted_journal(self, checkpointer: Checkpointer) -> None:
        """A positional id whose position holds another kind of step raises ReplayMismatchError."""
        await checkpointer.append("r", JournalEvent.completed("000000-tool", {}))
        with pytest.raises(ReplayMismatchError):
            Replay(await checkpointer.load("r")).resolve("000000-model")

    # -- journal writer ------------------------------------------------------------------------

    async def test_writer_durable_persists_before_return(self, checkpointer: Checkpointer) -> None:
        """A durable event is in storage when record() returns (seen by another client)."""
        writer = checkpointer.writer("r")
        result = await writer.record(model_step(0))
        assert result is not None and result.seq == 0
        assert len(await checkpointer.load("r")) == 1

    async def test_writer_defers_until_next_durable(self, checkpointer: Checkpointer) -> None:
        """Deferrable events are held, then written before the next durable one, in execution order."""
        writer = checkpointer.writer("r")
        for i in range(3):
            held = JournalEvent.attempted(
                make_step_id(i, "model"), durability=Durability.DEFERRABLE
            )
            assert await writer.record(held) is None
        assert len(await checkpointer.load("r")) == 0 and len(writer.pending) == 3
        await writer.record(JournalEvent.completed("000003-tool", {"done": True}))
        state = await checkpointer.load("r")
        assert [e.step_id for e in state.entries] == [
            "000000-model",
            "000001-model",
            "000002-model",
            "000003-tool",
        ]
        assert len(writer.pending) == 0

    async def test_failed_flush_then_retry_exactly_once_in_order(
        self, kv_factory: KVFactory, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """A flush failing midway (one write never lands, another lands but its acknowledgement is lost)
        loses nothing; the retried flush leaves every event exactly once and in order."""
        flaky = FlakyKV(kv_factory())
        checkpointer = checkpointer_factory(flaky)
        writer = checkpointer.writer("r")
        events = [
            JournalEvent.attempted(
                make_step_id(i, "model"), {"i": i}, durability=Durability.DEFERRABLE
            )
            for i in range(6)
        ]
        for event in events:
            await writer.record(event)
        flaky.fail_before.add("j/000002-model/attempted")
        flaky.fail_after.add("j/000004-model/attempted")
        with pytest.raises(ConnectionError):
            await writer.flush()
        pending = [e.step_id for e in writer.pending]
        assert "000002-model" in pending and "000004-model" in pending, "failed events were dropped"
        # A durable event must not overtake held ones: it fails too while they cannot be written.
        flaky.fail_before.add("j/000002-model/attempted")
        with pytest.raises(ConnectionError):
            await writer.record(JournalEvent.completed("000006-tool", {"ok": True}))
        assert [e.step_id for e in writer.pending] == ["000002-model"]
        assert "000006-tool" not in {e.step_id for e in (await checkpointer.load("r")).entries}
        await writer.flush()
        await writer.record(JournalEvent.completed("000006-tool", {"ok": True}))
        state = await checkpointer.load("r")
        assert [e.step_id for e in state.entries] == [
            *(make_step_id(i, "model") for i in range(6)),
            "000006-tool",
        ]
        assert [e.payload for e in state.entries[:6]] == [{"i": i} for i in range(6)]
        seqs = [e.seq for e in state.entries]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)

    async def test_writer_context_flushes_on_exit(self, checkpointer: Checkpointer) -> None:
        """Leaving the writer's context flushes held events, also when the block raised."""

        async def crashing_loop() -> None:
            async with checkpointer.writer("r") as writer:
                await writer.record(
                    JournalEvent.attempted("000000-model", durability=Durability.DEFERRABLE)
                )
                raise RuntimeError("loop crashed")

        with pytest.raises(RuntimeError):
            await crashing_loop()
        assert [e.step_id for e in (await checkpointer.load("r")).entries] == ["000000-model"]

    # -- retention -----------------------------------------------------------------------------

    async def test_list_runs(self, checkpointer: Checkpointer) -> None:
        """Runs are listed in id order, paginated with start_after; an unknown run is not listed."""
        for run in ("c", "a", "b"):
            await checkpointer.append(run, model_step(0))
        assert [r.run_id for r in await checkpointer.list_runs()] == ["a", "b", "c"]
        page = await checkpointer.list_runs(limit=2)
        assert [r.run_id for r in page] == ["a", "b"]
        assert [r.run_id for r in await checkpointer.list_runs(start_after="b")] == ["c"]
        info = await checkpointer.get_run_info("a")
        assert info is not None and info.created_at > 0
        # Kept for the default retention (30 days after the first write), not forever.
        assert info.expires_at is not None
        assert abs(info.expires_at - info.created_at - DEFAULT_RUN_TTL_SECONDS) < 60
        assert await checkpointer.get_run_info("zzz") is None

    async def test_runs_kept_until_deleted_without_retention(
        self, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """``ttl_seconds=None`` turns the default retention off: the run never expires."""
        checkpointer = checkpointer_factory(ttl_seconds=None)
        await checkpointer.append("forever", model_step(0))
        info = await checkpointer.get_run_info("forever")
        assert info is not None and info.expires_at is None

    async def test_delete_run_erases_everything(
        self, checkpointer: Checkpointer, steps: KVStepStore
    ) -> None:
        """delete_run removes the journal, step events, snapshots, tool effects and index entries;
        other runs are untouched; deleting again reports False."""
        from pydantic_ai_harness.step_persistence import (
            ContinuableSnapshot,
            RunRecord,
            StepEvent,
            ToolEffectRecord,
        )

        for run in ("gone", "kept"):
            await steps.register_run(
                RunRecord(run_id=run, conversation_id="conv", parent_run_id="p")
            )
            await checkpointer.append(run, model_step(0))
            await steps.append_event(StepEvent(run_id=run, kind="run_started", step_index=0))
            await steps.save_snapshot(
                ContinuableSnapshot(run_id=run, step_index=1, messages=tool_call_messages())
            )
            await steps.record_tool_effect(
                ToolEffectRecord(tool_call_id="c1", tool_name="work", run_id=run, status="started")
            )
        assert await checkpointer.delete_run("gone") is True
        assert len(await checkpointer.load("gone")) == 0
        assert await steps.get_run(run_id="gone") is None
        assert await steps.list_events(run_id="gone") == []
        assert await steps.latest_snapshot(run_id="gone") is None
        assert await steps.get_tool_effect(run_id="gone", tool_call_id="c1") is None
        assert [r.run_id for r in await checkpointer.list_runs()] == ["kept"]
        assert [r.run_id for r in await steps.list_runs(conversation_id="conv")] == ["kept"]
        assert [r.run_id for r in await steps.list_runs(parent_run_id="p")] == ["kept"]
        assert len(await checkpointer.load("kept")) == 1
        assert await steps.latest_snapshot(run_id="kept") is not None
        assert await checkpointer.delete_run("gone") is False
        # The id is free again: a new run starts from position 0.
        assert (await checkpointer.append("gone", model_step(0))).seq == 0

    async def test_keep_latest_runs_per_conversation(
        self, kv: KVStore, checkpointer: Checkpointer, steps: KVStepStore
    ) -> None:
        """keep_latest_runs(2) deletes all but the two most recent runs (by first write) of
        every conversation, whole, leaves runs without a conversation and the kept runs
        untouched, and a second pass deletes nothing."""
        from pydantic_ai_harness.step_persistence import RunRecord

        for i in range(4):
            for conversation in ("c1", "c2"):
                run = f"{conversation}-run{i}"
                await steps.register_run(RunRecord(run_id=run, conversation_id=conversation))
                await checkpointer.append(run, model_step(0))
            offset_clock(kv, 1)
        await checkpointer.append("loose", model_step(0))  # no conversation
        report = await checkpointer.keep_latest_runs(2)
        gone = {f"{c}-run{i}" for c in ("c1", "c2") for i in (0, 1)}
        assert set(report.removed) == gone
        assert report.conversations == 2 and report.kept == 4
        listed = {r.run_id for r in await checkpointer.list_runs()}
        assert listed == {"c1-run2", "c1-run3", "c2-run2", "c2-run3", "loose"}
        for run in gone:
            assert len(await checkpointer.load(run)) == 0
            assert await steps.get_run(run_id=run) is None
        in_c1 = [r.run_id for r in await steps.list_runs(conversation_id="c1")]
        assert in_c1 == ["c1-run2", "c1-run3"]
        assert len(await checkpointer.load("c2-run3")) == 1
        again = await checkpointer.keep_latest_runs(2)
        assert again.removed == () and again.kept == 4
        with pytest.raises(ValueError, match="keep"):
            await checkpointer.keep_latest_runs(0)

    async def test_ttl_expires_the_whole_run(
        self, kv: KVStore, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """With a TTL every record of a run expires at the same instant, measured from its first write:
        entries written later do not outlive the earlier ones, and the run disappears from listings."""
        checkpointer = checkpointer_factory(kv, ttl_seconds=60)
        await checkpointer.append("r", model_step(0))
        info = await checkpointer.get_run_info("r")
        assert info is not None and info.expires_at is not None
        offset_clock(kv, 30)
        await checkpointer.append("r", model_step(1))
        assert len(await checkpointer.load("r")) == 2
        offset_clock(kv, 31)
        assert len(await checkpointer.load("r")) == 0
        assert await checkpointer.list_runs() == []
        # After expiry the id starts over.
        assert (await checkpointer.append("r", model_step(0))).seq == 0

    # -- the harness StepStore ------------------------------------------------------------------

    async def test_step_store_implements_protocol(self, steps: KVStepStore) -> None:
        """The step store is a pydantic_ai_harness StepStore (every protocol method present)."""
        from pydantic_ai_harness.step_persistence import StepStore

        assert isinstance(steps, StepStore)

    async def test_register_and_get_run(self, steps: KVStepStore) -> None:
        """register_run stores the lineage record; get_run returns it (None for unknown runs);
        a second registration raises RunExistsError (a ValueError); a retry of the same one is a no-op."""
        from pydantic_ai_harness.step_persistence import RunRecord

        record = RunRecord(
            run_id="r",
            conversation_id="c",
            parent_run_id="p",
            agent_name="agent",
            metadata={"k": "v"},
            registration_id="reg-1",
        )
        await steps.register_run(record)
        assert await steps.get_run(run_id="r") == record
        assert await steps.get_run(run_id="unknown") is None
        await steps.register_run(record)  # the same registration retried
        with pytest.raises(RunExistsError):
            await steps.register_run(RunRecord(run_id="r", registration_id="reg-2"))
        with pytest.raises(ValueError):
            await steps.register_run(RunRecord(run_id="r"))
        assert await steps.get_run(run_id="r") == record

    async def test_list_runs_filters_and_order(self, steps: KVStepStore) -> None:
        """list_runs filters by conversation and by parent (AND-combined) and sorts by started_at."""
        from pydantic_ai_harness.step_persistence import RunRecord

        base = datetime(2026, 1, 1, tzinfo=UTC)
        specs = [
            ("r3", "c1", "p1", 3),
            ("r1", "c1", "p2", 1),
            ("r2", "c2", "p1", 2),
            ("r4", "c1", "p1", 0),
        ]
        for run_id, conv, parent, minutes in specs:
            await steps.register_run(
                RunRecord(
                    run_id=run_id,
                    conversation_id=conv,
                    parent_run_id=parent,
                    started_at=base + timedelta(minutes=minutes),
                )
            )
        assert [r.run_id for r in await steps.list_runs()] == ["r4", "r1", "r2", "r3"]
        assert [r.run_id for r in await steps.list_runs(conversation_id="c1")] == ["r4", "r1", "r3"]
        assert [r.run_id for r in await steps.list_runs(parent_run_id="p1")] == ["r4", "r2", "r3"]
        both = await steps.list_runs(conversation_id="c1", parent_run_id="p1")
        assert [r.run_id for r in both] == ["r4", "r3"]
        assert await steps.list_runs(conversation_id="none") == []

    async def test_list_runs_skips_dangling_index_entries(
        self, kv: KVStore, steps: KVStepStore
    ) -> None:
        """An index entry whose run record is missing (a registration that crashed midway, or a
        conflicting registration) is skipped, never returned."""
        from pydantic_ai_harness.step_persistence import RunRecord

        await steps.register_run(RunRecord(run_id="real", conversation_id="c"))
        await kv.create(steps.space.conversation_scope("c"), "ghost", b"{}")
        with pytest.raises(RunExistsError):
            await steps.register_run(RunRecord(run_id="real", conversation_id="other"))
        assert [r.run_id for r in await steps.list_runs(conversation_id="c")] == ["real"]
        assert await steps.list_runs(conversation_id="other") == []
        for conversation in ("c", "other"):  # the dangling entries this test made
            await kv.drop_scope(steps.space.conversation_scope(conversation))

    async def test_events_ordered_and_idempotent(self, steps: KVStepStore) -> None:
        """list_events returns events in append order with every field; a repeated idempotency_key is
        suppressed; events without a key are never suppressed."""
        from pydantic_ai_harness.step_persistence import StepEvent

        stamp = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
        first = StepEvent(
            run_id="r",
            kind="tool_call_started",
            step_index=2,
            timestamp=stamp,
            conversation_id="c",
            parent_run_id="p",
            agent_name="a",
            tool_call_id="call",
            tool_name="work",
            error=None,
            metadata={"m": "1"},
            idempotency_key="0:2:tool_call_started:call",
        )
        await steps.append_event(first)
        await steps.append_event(first)
        unkeyed = StepEvent(run_id="r", kind="run_failed", step_index=3, error="boom")
        await steps.append_event(unkeyed)
        await steps.append_event(unkeyed)
        events = await steps.list_events(run_id="r")
        assert events == [first, unkeyed, unkeyed]
        assert await steps.list_events(run_id="unknown") == []

    async def test_concurrent_event_appends_all_kept(
        self, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """20 tasks on 4 clients appending distinct events to one run: all kept, none twice."""
        from pydantic_ai_harness.step_persistence import StepEvent

        stores = [checkpointer_factory().step_store() for _ in range(4)]

        async def task(t: int) -> None:
            for i in range(5):
                await stores[t % 4].append_event(
                    StepEvent(
                        run_id="r",
                        kind="model_request_started",
                        step_index=i,
                        idempotency_key=f"{t}:{i}",
                    )
                )

        await asyncio.gather(*(task(t) for t in range(20)))
        events = await stores[0].list_events(run_id="r")
        keys = [e.idempotency_key for e in events]
        assert len(keys) == len(set(keys)) == 100

    async def test_event_append_cost_independent_of_run_length(
        self, kv_factory: KVFactory, checkpointer_factory: CheckpointerFactory
    ) -> None:
        """append_event costs the same storage operations at 10 and 2,000 events (CountingKV)."""
        from pydantic_ai_harness.step_persistence import StepEvent

        def event(run: str, i: int) -> Any:
            return StepEvent(
                run_id=run, kind="model_request_started", step_index=i, idempotency_key=str(i)
            )

        builder = checkpointer_factory().step_store()
        for run, length in (("short", 10), ("long", 2000)):
            for start in range(0, length, 100):
                await asyncio.gather(
                    *(
                        builder.append_event(event(run, i))
                        for i in range(start, min(length, start + 100))
                    )
                )
        measured = {}
        for run, length in (("short", 10), ("long", 2000)):
            counting = CountingKV(kv_factory())
            probe = checkpointer_factory(counting).step_store()
            for i in range(length, length + 6):
                await probe.append_event(event(run, i))
            measured[run] = dict(counting.calls)
        assert measured["short"] == measured["long"]

    async def test_snapshots_latest_complete_and_interrupted(self, steps: KVStepStore) -> None:
        """latest_snapshot returns the newest complete snapshot; include_interrupted the newest of any
        state; messages round-trip exactly; unknown runs give None."""
        from pydantic_ai_harness.step_persistence import ContinuableSnapshot

        messages = tool_call_messages()
        await steps.save_snapshot(
            ContinuableSnapshot(
                run_id="r",
                step_index=1,
                messages=messages[:2],
                conversation_id="c",
                agent_name="a",
                idempotency_key="0:1:complete",
            )
        )
        await steps.save_snapshot(
            ContinuableSnapshot(
                run_id="r", step_index=2, messages=messages, idempotency_key="1:2:complete"
            )
        )
        await steps.save_snapshot(
            ContinuableSnapshot(
                run_id="r",
                step_index=3,
                messages=messages[:3],
                state="interrupted",
                idempotency_key="2:3:interrupted",
            )
        )
        latest = await steps.latest_snapshot(run_id="r")
        assert latest is not None and latest.step_index == 2 and latest.messages == messages
        assert latest.state == "complete" and latest.idempotency_key == "1:2:complete"
        newest = await steps.latest_snapshot(run_id="r", include_interrupted=True)
        assert (
            newest is not None and newest.state == "interrupted" and newest.messages == messages[:3]
        )
        assert await steps.latest_snapshot(run_id="unknown") is None
        listed = await steps.list_snapshots(run_id="r")
        assert [s.step_index for s in listed] == [1, 2]
        assert listed[0].conversation_id == "c" and listed[0].agent_name == "a"
        everything = await steps.list_snapshots(run_id="r", include_interrupted=True)
        assert [s.step_index for s in everything] == [1, 2, 3]

    async def test_snapshot_retry_suppressed(self, steps: KVStepStore) -> None:
        """A save repeated with the same idempotency_key is suppressed; without a key it is not."""
        from pydantic_ai_harness.step_persistence import ContinuableSnapshot

        snap = ContinuableSnapshot(
            run_id="r", step_index=1, messages=tool_call_messages(), idempotency_key="0:1:complete"
        )
        await steps.save_snapshot(snap)
        await steps.save_snapshot(snap)
        assert len(await steps.list_snapshots(run_id="r")) == 1
        unkeyed = ContinuableSnapshot(run_id="r", step_index=2, messages=tool_call_messages())
        await steps.save_snapshot(unkeyed)
        await steps.save_snapshot(unkeyed)
        assert len(await steps.list_snapshots(run_id="r")) == 3

    async def test_snapshot_pruning(self, checkpointer_factory: CheckpointerFactory) -> None:
        """With max_snapshots_per_run=k the newest k snapshots are kept plus the newest complete one,
        latest_snapshot serves both read modes, and a replayed save of a pruned key stays suppressed."""
        from pydantic_ai_harness.step_persistence import ContinuableSnapshot

        steps = checkpointer_factory(max_snapshots_per_run=2).step_store()
        messages = tool_call_messages()
        states = ["complete", "complete", "interrupted", "interrupted", "interrupted"]
        for i, state in enumerate(states):
            await steps.save_snapshot(
                ContinuableSnapshot(
                    run_id="r",
                    step_index=i,
                    messages=messages[: i % 4 + 1],
                    state=state,
                    idempotency_key=f"{i}:{i}:{state}",
                )
            )
        kept = await steps.list_snapshots(run_id="r", include_interrupted=True)
        assert [s.step_index for s in kept] == [1, 3, 4]
        latest = await steps.latest_snapshot(run_id="r")
        assert latest is not None and latest.step_index == 1
        newest = await steps.latest_snapshot(run_id="r", include_interrupted=True)
        assert newest is not None and newest.step_index == 4
        await steps.save_snapshot(
            ContinuableSnapshot(
                run_id="r", step_index=0, messages=messages[:1], idempotency_key="0:0:complete"
            )
        )
        again = await steps.list_snapshots(run_id="r", include_interrupted=True)
        assert [s.step_index for s in again] == [1, 3, 4]
        with pytest.raises(ValueError):
            checkpointer_factory(max_snapshots_per_run=0)

    async def test_large_snapshot_round_trips(self, steps: KVStepStore) -> None:
        """A snapshot whose history exceeds the backend's item limit is stored and restored intact."""
        from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
        from pydantic_ai_harness.step_persistence import ContinuableSnapshot

        big = "y" * (steps.kv.limits.max_value_bytes + 1000)
        messages = [
            ModelRequest(parts=[UserPromptPart(big)]),
            ModelResponse(parts=[TextPart("ok")]),
        ]
        await steps.save_snapshot(ContinuableSnapshot(run_id="r", step_index=1, messages=messages))
        latest = await steps.latest_snapshot(run_id="r")
        assert latest is not None and latest.messages == messages

    async def test_tool_effect_ledger(self, steps: KVStepStore) -> None:
        """record_tool_effect upserts per (run, tool_call_id); get_tool_effect returns the latest;
        list_unresolved_tool_effects lists those still 'started'."""
        from pydantic_ai_harness.step_persistence import ToolEffectRecord

        started = ToolEffectRecord(tool_call_id="a", tool_name="pay", run_id="r", status="started")
        await steps.record_tool_effect(started)
        await steps.record_tool_effect(
            ToolEffectRecord(tool_call_id="b", tool_name="read", run_id="r", status="started")
        )
        assert await steps.get_tool_effect(run_id="r", tool_call_id="a") == started
        done = ToolEffectRecord(
            tool_call_id="b",
            tool_name="read",
            run_id="r",
            status="completed",
            ended_at=datetime.now(UTC),
            idempotency_key="k",
            effect_summary="read 3 rows",
        )
        await steps.record_tool_effect(done)
        assert await steps.get_tool_effect(run_id="r", tool_call_id="b") == done
        assert await steps.list_unresolved_tool_effects(run_id="r") == [started]
        assert await steps.get_tool_effect(run_id="r", tool_call_id="zz") is None
        assert await steps.get_tool_effect(run_id="other", tool_call_id="a") is None
        # A second client sees and updates the same ledger.
        await steps.record_tool_effect(
            ToolEffectRecord(tool_call_id="a", tool_name="pay", run_id="r", status="failed")
        )
        assert await steps.list_unresolved_tool_effects(run_id="r") == []

    # -- end to end with StepPersistence ------------------------------------------------------------

    async def test_step_persistence_resume_in_process(
        self, checkpointer_factory: CheckpointerFactory, tmp_path: Path
    ) -> None:
        """An Agent with StepPersistence on this store fails with a provider 503 after a tool call;
        continue_run on another client resumes it and the run completes without re-running the tool."""
        from pydantic_ai.exceptions import ModelHTTPError
        from pydantic_ai_harness.step_persistence import StepPersistence, continue_run

        from .checkpointer_workers import build_agent

        counter = tmp_path / "tool-runs.txt"
        first = checkpointer_factory().step_store()
        with pytest.raises(ModelHTTPError):
            await build_agent(str(counter), fail_after_tool=True).run(
                "do the work", capabilities=[StepPersistence(store=first, run_id="e2e")]
            )
        kinds = [e.kind for e in await first.list_events(run_id="e2e")]
        assert kinds[-2:] == ["model_request_failed", "run_failed"]
        second = checkpointer_factory().step_store()
        history = await continue_run(second, run_id="e2e")
        result = await build_agent(str(counter), fail_after_tool=False).run(
            None,
            message_history=history,
            capabilities=[StepPersistence(store=second, run_id="e2e-2")],
        )
        assert result.output == "finished after the tool"
        assert counter.read_text().splitlines() == ["7"], "the tool ran again"
        assert [e.kind for e in await second.list_events(run_id="e2e-2")][-1] == "run_completed"
        assert await second.list_unresolved_tool_effects(run_id="e2e") == []

    async def test_step_persistence_resume_in_new_process(
        self, kv: KVStore, store_url: str, ns: str, checkpointer: Checkpointer, tmp_path: Path
    ) -> None:
        """A run that failed with a provider 503 after a tool call in one OS process is resumed with
        continue_run in a NEW OS process on the same URL, and completes without re-running the tool."""
        require_capability(
            kv, "shared_across_processes", "process-local: a new process cannot see the run"
        )
        counter = tmp_path / "tool-runs.txt"
        outputs = []
        for command in ("step-fail", "step-resume"):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent_stores_contract.checkpointer_workers",
                command,
                store_url,
                ns,
                "e2e",
                str(counter),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            out, err = await proc.communicate()
            assert proc.returncode == 0, err.decode()
            outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
        assert outputs[0] == {"failed": 503}
        assert outputs[1]["output"] == "finished after the tool"
        assert counter.read_text().splitlines() == ["7"], "the tool ran again after the resume"
        steps = checkpointer.step_store()
        failed = [e.kind for e in await steps.list_events(run_id="e2e")]
        assert failed[-1] == "run_failed" and "tool_call_completed" in failed
        resumed = [e.kind for e in await steps.list_events(run_id=outputs[1]["run_id"])]
        assert resumed[-1] == "run_completed" and "tool_call_started" not in resumed

    # -- forks ----------------------------------------------------------------------------------

    async def test_fork_after_an_effect_call_never_runs_it_again(
        self, checkpointer: Checkpointer, steps: KVStepStore
    ) -> None:
        """A run with an effect tool forked after the tool's call — at the snapshot where the call
        is still open (its outcome known only from the effect knowledge) and at the latest point —
        runs the tool zero more times when the fork is resumed (counted), and the tool's recorded
        result is in the fork's history."""
        from agent_stores.checkpointer.resume import resume_run

        effects: list[int] = []
        agent = effect_agent(steps, effects)
        assert (await agent.run("pay", run_id="src")).output == f"paid: {PAID}"
        assert effects == [5]
        numbered = await steps.numbered_snapshots(run_id="src", include_interrupted=True)
        after_call = [n for n, s in numbered if calls_pay(s.messages)]
        open_call = next(
            n for n, s in numbered if calls_pay(s.messages) and not returns_of_pay(s.messages)
        )
        assert after_call and open_call == after_call[0]
        for at in (open_call, None):
            fork = await checkpointer.fork_run("src", at=at)
            assert fork.point.snapshot == (open_call if at is not None else numbered[-1][0])
            assert fork.tool_effects == 1 and fork.latched == ()
            if at == open_call:
                (known,) = fork.calls
                assert known.state is ReplayState.DONE and known.result is not None
                assert known.result.content == PAID
            result = await resume_run(agent, steps, fork.run_id)
            assert result.output == f"paid: {PAID}"
            assert effects == [5], f"the tool ran again after a fork at {at}"
            assert returns_of_pay(result.all_messages()) == [PAID]
            history = await steps.latest_snapshot(run_id=fork.run_id, include_interrupted=True)
            source = dict(numbered)[fork.point.snapshot or 0]
            assert history is not None and history.messages == source.messages

    async def test_fork_at_an_uncertain_call_is_latched(
        self, checkpointer: Checkpointer, steps: KVStepStore
    ) -> None:
        """A run stopped inside an effect tool (its outcome uncertain) forked at that point is
        latched: resuming the fork raises the UncertainEffect resuming the source raises, and runs
        nothing; deciding the call (resume_run's decisions=, the result it had) unlatches it and
        the fork finishes without running the tool."""
        from agent_stores.checkpointer.resume import plan_resume, resume_run

        effects: list[int] = []
        with pytest.raises(ToolCrash):
            await effect_agent(steps, effects, crash=True).run("pay", run_id="src")
        assert effects == [5]
        with pytest.raises(UncertainEffect) as on_source:
            await plan_resume(steps, "src")
        numbered = await steps.numbered_snapshots(run_id="src", include_interrupted=True)
        open_call = next(n for n, s in numbered if calls_pay(s.messages))
        agent = effect_agent(steps, effects)
        for at in (None, open_call):
            fork = await checkpointer.fork_run("src", at=at)
            assert fork.latched == ("pay-1",)
            assert [c.state for c in fork.calls] == [ReplayState.UNCERTAIN]
            with pytest.raises(UncertainEffect) as on_fork:
                await resume_run(agent, steps, fork.run_id)
            assert on_fork.value.code == on_source.value.code == "RUN_UNCERTAIN_EFFECT"
            assert on_fork.value.step_id == on_source.value.step_id == "pay-1"
            assert effects == [5], "a latched fork ran the tool"
            decided = await resume_run(agent, steps, fork.run_id, decisions={"pay-1": PAID})
            assert decided.output == f"paid: {PAID}"
            assert effects == [5]
        with pytest.raises(UncertainEffect):
            await plan_resume(steps, "src")  # deciding a fork decides nothing for the source

    async def test_fork_leaves_the_source_unchanged(
        self, kv: KVStore, checkpointer: Checkpointer, steps: KVStepStore
    ) -> None:
        """Forking reads the source only: every entry of the source run (journal, snapshots,
        messages, effects, results, record, listing) is identical, value and version, after forks
        at the latest point, at a snapshot and at a journal step."""
        from pydantic_ai_harness.step_persistence import RunRecord

        await steps.register_run(RunRecord(run_id="src", conversation_id="conv"))
        await checkpointer.append("src", model_step(0, Phase.ATTEMPTED))
        await checkpointer.append("src", model_step(0))
        await effect_agent(steps, []).run("pay", run_id="src-agent")
        before = await raw_run_entries(kv, checkpointer, "src")
        agent_before = await raw_run_entries(kv, checkpointer, "src-agent")
        await checkpointer.fork_run("src")
        await checkpointer.fork_run("src", at="000000-model")
        numbered = await steps.numbered_snapshots(run_id="src-agent", include_interrupted=True)
        await checkpointer.fork_run("src-agent", at=numbered[1][0])
        await checkpointer.fork_run("src-agent")
        assert await raw_run_entries(kv, checkpointer, "src") == before
        assert await raw_run_entries(kv, checkpointer, "src-agent") == agent_before

    async def test_fork_lineage_is_listed(
        self, checkpointer: Checkpointer, steps: KVStepStore
    ) -> None:
        """A fork records its source and point: fork_of, list_forks (oldest first, a fork of a
        fork under its own source), its registration (conversation, parent, agent and metadata
        of the source, plus forked_from and fork_point) and the run listings; deleting a fork
        takes it off its source's list."""
        from pydantic_ai_harness.step_persistence import RunRecord

        await steps.register_run(
            RunRecord(
                run_id="src",
                conversation_id="conv",
                parent_run_id="boss",
                agent_name="payer",
                metadata={"team": "a"},
            )
        )
        await checkpointer.append("src", model_step(0))
        await checkpointer.append("src", model_step(1))
        first = await checkpointer.fork_run("src", new_run_id="f1", at="000000-model")
        second = await checkpointer.fork_run("src", new_run_id="f2")
        nested = await checkpointer.fork_run("f1", new_run_id="f1-1")
        assert (first.run_id, second.run_id, nested.run_id) == ("f1", "f2", "f1-1")
        assert [f.run_id for f in await checkpointer.list_forks("src")] == ["f1", "f2"]
        assert [f.run_id for f in await checkpointer.list_forks("f1")] == ["f1-1"]
        lineage = await checkpointer.fork_of("f1")
        assert lineage is not None and lineage.complete and lineage.source_run_id == "src"
        assert lineage.point.step_id == "000000-model" and lineage.point.journal_seq == 0
        assert await checkpointer.fork_of("src") is None
        record = await steps.get_run(run_id="f1")
        assert record is not None
        assert (record.conversation_id, record.parent_run_id, record.agent_name) == (
            "conv",
            "boss",
            "payer",
        )
        assert record.metadata == {
            "team": "a",
            "forked_from": "src",
            "fork_point": "step 000000-model",
        }
        assert [r.run_id for r in await steps.list_runs(conversation_id="conv")] == [
            "src",
            "f1",
            "f2",
            "f1-1",
        ]
        listed = {r.run_id for r in await checkpointer.list_runs()}
        assert {"src", "f1", "f2", "f1-1"} <= listed
        assert [e.step_id for e in (await checkpointer.load("f1")).entries] == ["000000-model"]
        assert len(await checkpointer.load("f2")) == 2
        assert await checkpointer.delete_run("f1")
        assert [f.run_id for f in await checkpointer.list_forks("src")] == ["f2"]

    async def test_fork_errors_are_typed(
        self, checkpointer: Checkpointer, steps: KVStepStore
    ) -> None:
        """Forking an unknown run raises RunNotFoundError (RUN_NOT_FOUND), an unknown snapshot
        position or journal step ForkPointError (RUN_FORK_POINT_UNKNOWN), a taken run id
        RunExistsError; none of them writes anything of the fork."""
        await effect_agent(steps, []).run("pay", run_id="src")
        await checkpointer.append("src", model_step(0))
        await checkpointer.append("taken", model_step(0))
        listed = [r.run_id for r in await checkpointer.list_runs()]
        with pytest.raises(RunNotFoundError) as unknown:
            await checkpointer.fork_run("nope", new_run_id="f")
        assert unknown.value.code == "RUN_NOT_FOUND"
        for at in (10_000, "000009-tool"):
            with pytest.raises(ForkPointError) as bad_point:
                await checkpointer.fork_run("src", new_run_id="f", at=at)
            assert bad_point.value.code == "RUN_FORK_POINT_UNKNOWN"
        for taken in ("taken", "src"):
            with pytest.raises(RunExistsError):
                await checkpointer.fork_run("src", new_run_id=taken)
        with pytest.raises(TypeError):
            await checkpointer.fork_run("src", at=1.5)  # type: ignore[arg-type]
        assert [r.run_id for r in await checkpointer.list_runs()] == listed
        assert await checkpointer.list_forks("src") == []
        assert len(await checkpointer.load("taken")) == 1

    async def test_fork_of_a_journal_at_a_step(self, checkpointer: Checkpointer) -> None:
        """A journal forked at a step holds the source's entries through that step at the same
        positions: Replay answers DONE with the recorded result for a done step, the fork's next
        append lands after them; forked at a step attempted without a result, the fork is latched
        (UncertainEffect) until a result is appended to it, and the source stays uncertain."""
        await checkpointer.append("src", model_step(0, Phase.ATTEMPTED))
        await checkpointer.append("src", model_step(0))
        await checkpointer.append("src", JournalEvent.attempted("000001-tool", {"pay": 5}))
        await checkpointer.append("src", JournalEvent.completed("000001-tool", {"paid": 5}))
        await checkpointer.append("src", JournalEvent.attempted("000002-tool", {"pay": 7}))
        done = await checkpointer.fork_run("src", new_run_id="done", at="000001-tool")
        assert done.journal_entries == 4 and done.latched == ()
        state = await checkpointer.load("done")
        source = await checkpointer.load("src")
        assert state.entries == source.entries[:4]
        resolution = Replay(state).resolve("000001-tool")
        assert resolution.state is ReplayState.DONE and resolution.entry is not None
        assert resolution.entry.payload == {"paid": 5}
        assert Replay(state).resolve("000002-tool").state is ReplayState.NEW
        assert (await checkpointer.append("done", model_step(2))).seq == 4
        uncertain = await checkpointer.fork_run("src", new_run_id="open", at="000002-tool")
        assert uncertain.latched == ("000002-tool",)
        with pytest.raises(UncertainEffect) as latched:
            Replay(await checkpointer.load("open")).resolve("000002-tool")
        assert latched.value.step_id == "000002-tool"
        await checkpointer.append(
            "open", JournalEvent.completed("000002-tool", outcome=Outcome.APPROVAL_DENIED)
        )
        decided = Replay(await checkpointer.load("open")).resolve("000002-tool")
        assert decided.state is ReplayState.DENIED_CLOSED
        assert (await checkpointer.load("src")).uncertain_steps() == ["000002-tool"]

    async def test_fork_cut_off_is_refused_then_finished(
        self,
        kv_factory: KVFactory,
        checkpointer_factory: CheckpointerFactory,
        checkpointer: Checkpointer,
        steps: KVStepStore,
    ) -> None:
        """A fork whose copy fails midway is incomplete: resuming or forking it raises
        ForkIncompleteError (RUN_FORK_INCOMPLETE) instead of trusting a partial effect knowledge;
        fork_run again with the same arguments finishes it (the tool still runs zero more times),
        with other arguments it is refused."""
        from agent_stores.checkpointer.resume import plan_resume, resume_run

        effects: list[int] = []
        agent = effect_agent(steps, effects)
        await agent.run("pay", run_id="src")
        numbered = await steps.numbered_snapshots(run_id="src", include_interrupted=True)
        open_call = next(n for n, s in numbered if calls_pay(s.messages))
        flaky = FlakyKV(kv_factory())
        cut = checkpointer_factory(flaky)
        flaky.fail_before.add("sp")  # the fork's snapshot pointer: everything else is copied
        with pytest.raises(ConnectionError):
            await cut.fork_run("src", new_run_id="f", at=open_call)
        lineage = await checkpointer.fork_of("f")
        assert lineage is not None and not lineage.complete
        with pytest.raises(ForkIncompleteError) as refused:
            await plan_resume(steps, "f")
        assert refused.value.code == "RUN_FORK_INCOMPLETE"
        with pytest.raises(RunExistsError):
            await checkpointer.fork_run("src", new_run_id="f")
        with pytest.raises(ForkIncompleteError):
            await checkpointer.fork_run("f", new_run_id="f-of-f")  # nor is it forked
        fork = await checkpointer.fork_run("src", new_run_id="f", at=open_call)
        assert fork.calls[0].state is ReplayState.DONE
        assert (await resume_run(agent, steps, "f")).output == f"paid: {PAID}"
        assert effects == [5]


__all__: Sequence[str] = ["CheckpointerContract", "FlakyKV"]
