# The exception under test comes out of the ``async with store.turn()`` block itself,
# so pytest.raises must enclose the whole block.
# ruff: noqa: PT012
"""The session contract: one active turn per session, on any backend.

Covers every behaviour of the Cortex Agent SDK session stores and what they lacked:
exclusion between tasks and OS processes, fenced renewable leases (a stolen or expired
lease cancels its owner and never saves), ``replace()`` semantics, incremental history
(bytes per turn independent of its length), sliding TTL, corruption detection, tool
checkpoints with the recovery latch (driven by a scripted ``FunctionModel`` agent),
the last-tool-result fallback, recovery tools and draining on close. Each test's
docstring states its guarantee.

Stores come from ``sessions_factory`` — ``connect(kv).sessions(owns_kv=True, **options)``
on a new client from ``kv_factory`` — so a backend's native session store (from the
``session_store`` hook) is what gets tested. Tests that corrupt data use the documented
layout (``store.storage.scope_for``, ``records.STATE_KEY``).

Time: leases, TTLs and expiry are tested on the store's clock (``store.kv.clock``, which
stores must read time from): a test moves it instead of waiting, so a slow or loaded
machine cannot decide the outcome. Real time is used only where it is the point — the
renewal of a lease runs on the event loop's timer — with leases of several seconds
against a renewal every third of one, and a bounded wait for a condition
(:func:`~agent_stores_contract.base.wait_until`) instead of a fixed sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from agent_stores import (
    AppError,
    BackendUnavailableError,
    ErrorCode,
    KVStore,
    ResourceClosedError,
    Severity,
    connect,
)
from agent_stores.capabilities import last_tool_result_fallback, session_checkpoints
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import (
    EffectCall,
    InvalidSessionError,
    KVSessionPort,
    LeaseLostError,
    RecoveryRequiredError,
    SessionBusyError,
    SessionStore,
)
from agent_stores.sessions.records import CHUNK_PREFIX, STATE_KEY
from pydantic_ai import Agent, ModelRetry, Tool
from pydantic_ai.capabilities import HandleDeferredToolCalls
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext, ToolDenied

from .base import REAL_TIME_LIMIT_SECONDS, KVFactory, require_capability, wait_until
from .catalog import CatalogBehaviours
from .forks import ForkBehaviours
from .session_workers import one_call_model, pair, prompts_model, texts
from .subjects import SubjectBehaviours

SessionsFactory = Callable[..., Awaitable[SessionStore]]

SECRET = "SECRET-ARGUMENT-7f3a"


T = TypeVar("T")


#: The lease of a test about renewal, which runs on the event loop's timer every third
#: of a lease: a renewal has two thirds of it (minus the store's margin) to get through,
#: seconds even on a loaded machine.
RENEWED_LEASE_SECONDS = 3.0

#: The lease of a worker process that is killed inside its turn. Long, so it never runs
#: out while the worker starts on a slow machine; the test then moves the survivor's
#: clock past it (:data:`PAST_WORKER_LEASE_SECONDS`) instead of waiting.
WORKER_LEASE_SECONDS = 30.0
PAST_WORKER_LEASE_SECONDS = WORKER_LEASE_SECONDS + 1


def offset_clock(store: SessionStore, seconds: float) -> None:
    """Move a store's notion of time forward (its KV store's clock decides leases and expiry)."""
    base = store.kv.clock
    store.kv.clock = lambda: base() + seconds


async def outlast_lease(store: SessionStore, expires_at: float) -> None:
    """Wait, in real time, until ``store``'s clock reads past ``expires_at``."""

    async def past() -> bool:
        return store.kv.clock() > expires_at

    await wait_until(past, f"the clock passing the lease's end {expires_at}")


class FlakyKV(CountingKV):
    """Forwards to a real client; ``replace`` (and a native port's ``save``, which replaces
    the state) raises BackendUnavailableError while told to."""

    def __init__(self, inner: KVStore, *, native_ports: bool = True) -> None:
        super().__init__(inner, native_ports=native_ports)
        self.fail_next_replaces = 0
        self.fail_all_replaces = False
        self.injected = 0

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        if self.fail_all_replaces or self.fail_next_replaces > 0:
            self.fail_next_replaces = max(0, self.fail_next_replaces - 1)
            self.injected += 1
            raise BackendUnavailableError(detail="injected outage")
        return await super()._replace(scope, key, value, expected_version, expires_at, now)

    async def through_port(
        self, call: str, run: Callable[[], Awaitable[T]], *, write: bool, sent: int, key: str
    ) -> T:
        """A native port's save replaces the state: it fails like ``replace``."""
        if call == "sessions.save" and (self.fail_all_replaces or self.fail_next_replaces > 0):
            self.fail_next_replaces = max(0, self.fail_next_replaces - 1)
            self.injected += 1
            raise BackendUnavailableError(detail="injected outage")
        return await super().through_port(call, run, write=write, sent=sent, key=key)


async def spawn(*args: str) -> asyncio.subprocess.Process:
    """Start ``python -m agent_stores_contract.session_workers ARGS``."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_stores_contract.session_workers",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


async def read_json(
    proc: asyncio.subprocess.Process, wait_seconds: float = REAL_TIME_LIMIT_SECONDS
) -> dict[str, Any]:
    """The next JSON line a worker prints (fails with its stderr if it exits first)."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), wait_seconds)
    if not line:
        err = await proc.stderr.read() if proc.stderr else b""
        raise AssertionError(f"worker exited ({await proc.wait()}): {err.decode()[-3000:]}")
    result: dict[str, Any] = json.loads(line)
    return result


@asynccontextmanager
async def held_by_a_killed_process(
    store: SessionStore, store_url: str, session_id: str
) -> AsyncIterator[dict[str, Any]]:
    """A session saved as ``pair("before")``, then held by another process inside a turn
    that checkpointed ``pair("checkpointed")`` (``hold`` worker); yields the worker's
    ready line (its fence) and kills it with SIGKILL on the way out."""
    async with store.turn(session_id) as session:
        session.replace(pair("before"))
    proc = await spawn("hold", store_url, session_id, str(WORKER_LEASE_SECONDS))
    try:
        ready = await read_json(proc)
        assert ready["ready"] is True
        yield ready
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()


def max_turns_between(owners: list[str]) -> int:
    """The most turns other processes took while one process waited for its next turn."""
    last: dict[str, int] = {}
    longest = 0
    for index, owner in enumerate(owners):
        longest = max(longest, index - last.get(owner, -1) - 1)
        last[owner] = index
    return longest


def require_processes(kv: KVStore) -> None:
    require_capability(
        kv, "shared_across_processes", "process-local: a second process cannot share its data"
    )


def dump(messages: list[ModelMessage]) -> bytes:
    """Messages as Pydantic AI serializes them (compares histories across a round trip)."""
    return ModelMessagesTypeAdapter.dump_json(messages)


def _returning(value: Any) -> Callable[[], Any]:
    def tool() -> Any:
        return value

    return tool


def history(count: int, pad: int = 400, prefix: str = "m") -> list[ModelMessage]:
    return [m for i in range(count // 2) for m in pair(f"{prefix}{i}", pad)]


class SessionContract(CatalogBehaviours, SubjectBehaviours, ForkBehaviours):
    """The session-store contract. Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    @pytest_asyncio.fixture
    async def sessions_factory(self, kv_factory: KVFactory) -> AsyncIterator[SessionsFactory]:
        """An async callable opening a new session store (own KV client) with the given options."""
        made: list[SessionStore] = []

        async def make(**options: Any) -> SessionStore:
            kv = kv_factory()
            await kv.setup()
            if self.store_path == "generic":
                options = {"port": KVSessionPort(kv), **options}
            store = connect(kv).sessions(owns_kv=True, **options)
            made.append(store)
            if self.store_path == "generic":
                assert type(store.storage.port) is KVSessionPort, "not on the generic path"
            return store

        try:
            yield make
        finally:
            for store in made:
                await store.aclose(timeout_seconds=5)

    @pytest_asyncio.fixture
    async def sessions(self, sessions_factory: SessionsFactory) -> SessionStore:
        """One session store with default options."""
        return await sessions_factory()

    # -- the basic turn -------------------------------------------------------------------

    async def test_turn_loads_and_replace_saves(self, sessions: SessionStore, ns: str) -> None:
        """A new session starts empty; replace() saves on a clean exit; the next turn loads exactly that."""
        sid = f"{ns}:user:42"
        async with sessions.turn(sid) as session:
            assert session.session_id == sid
            assert session.messages == []
            assert session.changed is False
            first = pair("one")
            session.replace(first)
            assert session.changed is True
        async with sessions.turn(sid) as session:
            assert session.messages == first
            session.replace([*session.messages, *pair("two")])
        async with sessions.turn(sid) as session:
            assert texts(session.messages) == ["q:one", "a:one", "q:two", "a:two"]

    async def test_later_edits_of_saved_messages_do_not_leak(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """The next turn reads what was stored, not the caller's objects: Pydantic AI edits
        messages in place after they were saved, and the same process must then see what any
        other client reads (also once history spills into chunks)."""
        store = await sessions_factory()
        sid = f"{ns}:edits"
        messages: list[ModelMessage] = []
        for i in range(150):
            messages += pair(f"m{i}", 300)
        async with store.turn(sid) as session:
            session.replace(messages)
        first = messages[0].parts[0]
        assert isinstance(first, UserPromptPart)
        first.content = "edited after the save"
        last = messages[-1].parts[0]
        assert isinstance(last, TextPart)
        last.content = "edited after the save"
        async with store.turn(sid) as session:
            same_process = session.messages
        other = await sessions_factory()
        async with other.turn(sid) as session:
            other_process = session.messages
        assert texts(same_process) == texts(other_process)
        assert texts(same_process)[0] == "q:m0"
        assert texts(same_process)[-1] == "a:m149"

    async def test_messages_round_trip_losslessly(self, sessions: SessionStore, ns: str) -> None:
        """Every kind of message part (tool calls, returns, thinking, binary) round trips as through ModelMessagesTypeAdapter."""
        messages: list[ModelMessage] = [
            ModelRequest(
                parts=[
                    UserPromptPart(
                        ["look", BinaryContent(data=b"\x00\xff png", media_type="image/png")]
                    )
                ]
            ),
            ModelResponse(
                parts=[
                    ThinkingPart("hmm"),
                    ToolCallPart("lookup", {"q": "é😀"}, tool_call_id="c1"),
                ]
            ),
            ModelRequest(parts=[ToolReturnPart("lookup", {"n": [1, 2]}, tool_call_id="c1")]),
            ModelResponse(parts=[TextPart("done\nline two")]),
        ]
        async with sessions.turn(f"{ns}:rt") as session:
            session.replace(messages)
        # What Pydantic AI's own serialization round trip gives (e.g. BinaryContent of an
        # image comes back as BinaryImage) is exactly what the store gives back.
        expected = ModelMessagesTypeAdapter.validate_json(
            ModelMessagesTypeAdapter.dump_json(messages)
        )
        async with sessions.turn(f"{ns}:rt") as session:
            assert session.messages == expected
            assert ModelMessagesTypeAdapter.dump_json(
                session.messages
            ) == ModelMessagesTypeAdapter.dump_json(messages)

    async def test_replace_not_called_keeps_history(self, sessions: SessionStore, ns: str) -> None:
        """Without replace() the store does not modify the history, even if session.messages was mutated."""
        sid = f"{ns}:keep"
        async with sessions.turn(sid) as session:
            session.replace(pair("kept"))
        async with sessions.turn(sid) as session:
            session.messages.extend(pair("not-saved"))
        async with sessions.turn(sid) as session:
            assert texts(session.messages) == ["q:kept", "a:kept"]

    async def test_block_raising_saves_nothing_and_releases(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """If the block raises, the replacement is not saved, the exception propagates as is, and the session is free at once."""
        store = await sessions_factory(lease_seconds=30)
        other = await sessions_factory(lease_seconds=30)
        sid = f"{ns}:raise"
        async with store.turn(sid) as session:
            session.replace(pair("base"))

        class Boom(Exception):
            pass

        boom = Boom("no")
        with pytest.raises(Boom) as caught:
            async with store.turn(sid) as session:
                session.replace([*session.messages, *pair("lost")])
                raise boom
        assert caught.value is boom
        # Released, not left to expire: another client gets it well within the 30 s lease.
        async with other.turn(sid, timeout_seconds=5) as session:
            assert texts(session.messages) == ["q:base", "a:base"]

    async def test_checkpoint_survives_later_failure(self, sessions: SessionStore, ns: str) -> None:
        """A checkpoint confirmed inside the turn stays even if the block fails afterwards."""
        sid = f"{ns}:cp"
        with pytest.raises(RuntimeError):
            async with sessions.turn(sid) as session:
                await session.checkpoint(pair("checkpointed"))
                session.replace([*pair("checkpointed"), *pair("replaced")])
                raise RuntimeError("later failure")
        async with sessions.turn(sid) as session:
            assert texts(session.messages) == ["q:checkpointed", "a:checkpointed"]
            # A replace after a checkpoint extends it.
            session.replace([*session.messages, *pair("after")])
        assert texts(await sessions.read_messages(sid) or []) == [
            "q:checkpointed",
            "a:checkpointed",
            "q:after",
            "a:after",
        ]

    async def test_failed_save_propagates(self, sessions_factory: SessionsFactory, ns: str) -> None:
        """If saving fails the exception propagates from the block and the stored history is unchanged."""
        store = await sessions_factory()
        reader = await sessions_factory()
        sid = f"{ns}:failsave"
        async with store.turn(sid) as session:
            session.replace(pair("before"))
        with pytest.raises(AppError) as caught:
            async with store.turn(sid) as session:
                session.replace([*session.messages, *pair("after")])
                await store.kv.aclose()  # the backend goes away before the save
        assert caught.value.code in (ErrorCode.RESOURCE_CLOSED, ErrorCode.SESSION_STORE_FAILURE)
        assert texts(await reader.read_messages(sid) or []) == ["q:before", "a:before"]

    async def test_replace_semantics(self, sessions: SessionStore, ns: str) -> None:
        """The last replace() wins; a history that is not an extension is rewritten whole; shrinking and emptying work."""
        sid = f"{ns}:rep"
        async with sessions.turn(sid) as session:
            session.replace(pair("a"))
            session.replace(pair("b"))
        assert texts(await sessions.read_messages(sid) or []) == ["q:b", "a:b"]
        async with sessions.turn(sid) as session:
            session.replace(history(40, prefix="long"))
        async with sessions.turn(sid) as session:
            assert len(session.messages) == 40
            session.replace([*pair("other"), *session.messages[2:]])  # same length, new start
        assert texts(await sessions.read_messages(sid) or [])[:3] == [
            "q:other",
            "a:other",
            "q:long1",
        ]
        async with sessions.turn(sid) as session:
            session.replace(session.messages[:2])
        assert texts(await sessions.read_messages(sid) or []) == ["q:other", "a:other"]
        async with sessions.turn(sid) as session:
            session.replace([])
        async with sessions.turn(sid) as session:
            assert session.messages == []

    async def test_replace_rejects_non_messages(self, sessions: SessionStore, ns: str) -> None:
        """replace() with something that is not a list of ModelMessage raises TypeError at once; nothing is saved."""
        sid = f"{ns}:bad"
        async with sessions.turn(sid) as session:
            session.replace(pair("ok"))
        with pytest.raises(TypeError):
            async with sessions.turn(sid) as session:
                session.replace(["not a message"])  # type: ignore[list-item]
        assert texts(await sessions.read_messages(sid) or []) == ["q:ok", "a:ok"]

    async def test_long_history_and_huge_message(self, sessions: SessionStore, ns: str) -> None:
        """Histories far beyond one record, and a single message larger than the backend's item limit, round trip."""
        sid = f"{ns}:big"
        limit = sessions.kv.limits.max_value_bytes
        huge = ModelRequest(parts=[UserPromptPart("q:huge " + "z" * int(limit * 1.5))])
        messages = [*history(300, pad=300), huge, ModelResponse(parts=[TextPart("a:huge")])]
        async with sessions.turn(sid) as session:
            session.replace(messages)
        async with sessions.turn(sid) as session:
            assert session.messages == messages
            session.replace([*session.messages, *pair("next")])
        loaded = await sessions.read_messages(sid)
        assert loaded is not None and loaded[:-2] == messages
        assert texts(loaded[-2:]) == ["q:next", "a:next"]

    async def test_invalid_session_ids(self, sessions: SessionStore, ns: str) -> None:
        """Unusable session ids raise SESSION_INVALID (a ValueError) before anything is stored."""
        too_long = "x" * (sessions.kv.limits.max_scope_chars + 1)
        for bad in ["", "a\x00b", too_long, "\ud800"]:
            with pytest.raises(InvalidSessionError) as caught:
                async with sessions.turn(bad):
                    pass
            assert caught.value.code == ErrorCode.SESSION_INVALID
            assert isinstance(caught.value, ValueError)
        with pytest.raises(InvalidSessionError):
            sessions.turn(42)  # type: ignore[arg-type]

    async def test_awkward_session_ids_are_distinct(self, sessions: SessionStore, ns: str) -> None:
        """Session ids with separators, braces, Unicode or path syntax are stored separately and never collide."""
        ids = [
            f"{ns}:{s}" for s in ["a/b", "a%2Fb", "{a}", "a:b", "..", "é", "e\u0301", "😀", "a b"]
        ]
        for i, sid in enumerate(ids):
            async with sessions.turn(sid) as session:
                session.replace(pair(str(i)))
        for i, sid in enumerate(ids):
            assert texts(await sessions.read_messages(sid) or []) == [f"q:{i}", f"a:{i}"]

    # -- exclusion ------------------------------------------------------------------------

    async def test_50_tasks_on_one_session_never_overlap(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """50 concurrent tasks (over 5 independent clients) on one session: turn intervals never overlap and every turn's messages are kept, in turn order."""
        stores = [await sessions_factory(lease_seconds=5) for _ in range(5)]
        sid = f"{ns}:hot"
        loop = asyncio.get_running_loop()
        intervals: list[tuple[float, float, str, int]] = []

        async def one(i: int) -> None:
            async with stores[i % 5].turn(sid, timeout_seconds=120) as session:
                start = loop.time()
                seen = len(session.messages)
                await asyncio.sleep(0)  # let the others run while we hold the session
                session.replace([*session.messages, *pair(f"t{i}")])
                intervals.append((start, loop.time(), f"t{i}", seen))

        await asyncio.gather(*(one(i) for i in range(50)))
        intervals.sort()
        for (_, end, _, _), (start, _, _, _) in itertools.pairwise(intervals):
            assert end <= start, "two turns on one session overlapped"
        # Each turn saw exactly the turns before it.
        assert [seen for *_, seen in intervals] == list(range(0, 100, 2))
        final = texts(await stores[0].read_messages(sid) or [])
        assert final == [x for _, _, tag, _ in intervals for x in (f"q:{tag}", f"a:{tag}")]

    async def test_4_processes_on_one_session_never_overlap(
        self, kv: KVStore, sessions: SessionStore, store_url: str, ns: str, tmp_path: Path
    ) -> None:
        """4 OS processes released together by a barrier take turns on one session (the session changes hands between them), intervals never overlap, and the final history holds every turn, in order."""
        require_processes(kv)
        sid = f"{ns}:procs"
        per_process = 8
        # --contend: the first turn waits for the others to queue, so the processes compete
        # however unevenly a loaded machine wakes them after the barrier.
        barrier = ["--barrier", str(tmp_path), "4", "--contend"]
        procs = [
            await spawn("turns", store_url, sid, str(per_process), "3", *barrier) for _ in range(4)
        ]
        outputs = [await asyncio.wait_for(p.communicate(), 300) for p in procs]
        for proc, (_, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err.decode()[-3000:]
        turns = sorted(
            (json.loads(line) for out, _ in outputs for line in out.decode().splitlines()),
            key=lambda t: t["start"],
        )
        assert len(turns) == 4 * per_process
        owners = [t["tag"].split("-")[0] for t in turns]
        switches = sum(1 for a, b in itertools.pairwise(owners) if a != b)
        # One process after another would switch 3 times: more means they really competed.
        assert switches > 3, f"the processes ran one after another ({switches} switches)"
        for before, after in itertools.pairwise(turns):
            assert before["end"] <= after["start"], f"{before['tag']} overlapped {after['tag']}"
        assert [t["seen"] for t in turns] == list(range(0, 8 * per_process, 2))
        final = texts(await sessions.read_messages(sid) or [])
        assert final == [x for t in turns for x in (f"q:{t['tag']}", f"a:{t['tag']}")]
        # No starvation: served in arrival order, a process waits behind the 3 others,
        # not behind whoever polls fastest (slack for a barging newcomer or a stalled one).
        assert max_turns_between(owners) <= 3 * (4 - 1), owners

    async def test_50_sessions_run_concurrently(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """50 different sessions are held at the same moment: no turn waits for another session's turn."""
        store = await sessions_factory()
        inside = 0
        all_in = asyncio.Event()

        async def one(i: int) -> None:
            nonlocal inside
            async with store.turn(f"{ns}:s{i}", timeout_seconds=60) as session:
                inside += 1
                if inside == 50:
                    all_in.set()
                # Every turn stays open until all 50 are open: serialised turns would never get here.
                await asyncio.wait_for(all_in.wait(), 60)
                session.replace(pair(f"s{i}"))

        await asyncio.gather(*(one(i) for i in range(50)))
        for i in (0, 25, 49):
            assert texts(await store.read_messages(f"{ns}:s{i}") or []) == [f"q:s{i}", f"a:s{i}"]

    async def test_busy_session_times_out(self, sessions_factory: SessionsFactory, ns: str) -> None:
        """A turn waiting longer than timeout_seconds raises SESSION_BUSY (severity WARNING); the holder is unaffected."""
        holder = await sessions_factory()
        waiter = await sessions_factory()
        sid = f"{ns}:busy"
        async with holder.turn(sid) as session:
            with pytest.raises(SessionBusyError) as caught:
                async with waiter.turn(sid, timeout_seconds=0.3):
                    pass
            assert caught.value.code == ErrorCode.SESSION_BUSY
            assert caught.value.severity == Severity.WARNING
            assert sid in caught.value.detail
            with pytest.raises(SessionBusyError):  # same client: queued behind the holder
                async with holder.turn(sid, timeout_seconds=0.1):
                    pass
            session.replace(pair("holder"))
        async with waiter.turn(sid, timeout_seconds=5) as session:
            assert texts(session.messages) == ["q:holder", "a:holder"]

    async def test_fair_handover_between_tasks(self, sessions: SessionStore, ns: str) -> None:
        """8 tasks x 5 turns on one session through one client: the session is handed over in arrival order, no task re-takes it while others wait."""
        sid = f"{ns}:fair"
        order: list[int] = []

        async def worker(n: int) -> None:
            for _ in range(5):
                async with sessions.turn(sid, timeout_seconds=60) as session:
                    order.append(n)
                    await asyncio.sleep(0.001)
                    session.replace([*session.messages, *pair(str(n))])

        await asyncio.gather(*(worker(n) for n in range(8)))
        handovers = sum(1 for a, b in itertools.pairwise(order) if a != b)
        assert handovers == len(order) - 1, order

    async def test_fair_handover_between_clients(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Two clients looping on one session both make progress: the releasing client yields to a waiting one."""
        stores = [await sessions_factory() for _ in range(2)]
        sid = f"{ns}:fair2"
        order: list[int] = []

        async def worker(n: int) -> None:
            for _ in range(10):
                async with stores[n].turn(sid, timeout_seconds=60) as session:
                    order.append(n)
                    await asyncio.sleep(0.002)
                    session.replace([*session.messages, *pair(str(n))])

        await asyncio.gather(worker(0), worker(1))
        handovers = sum(1 for a, b in itertools.pairwise(order) if a != b)
        assert handovers >= 5, order

    async def test_waiting_clients_served_in_arrival_order(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Clients that find a session busy take it in the order they arrived (the queue), not in the order they happen to poll."""
        holder = await sessions_factory()
        waiters = [await sessions_factory() for _ in range(4)]
        sid = f"{ns}:queue"
        order: list[int] = []

        async def wait_turn(n: int) -> None:
            async with waiters[n].turn(sid, timeout_seconds=60) as session:
                order.append(n)
                session.replace([*session.messages, *pair(str(n))])

        tasks: list[asyncio.Task[None]] = []
        async with holder.turn(sid) as session:
            for n in range(len(waiters)):
                tasks.append(asyncio.create_task(wait_turn(n)))
                async with asyncio.timeout(30):
                    # Remote state (another client's ticket): nothing to await but polling.
                    while len(await holder.waiting(sid)) < n + 1:  # noqa: ASYNC110
                        await asyncio.sleep(0.01)
            assert await holder.waiting(sid) == [w.store_id for w in waiters]
            session.replace(pair("holder"))
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]
        history = texts(await holder.read_messages(sid) or [])
        assert history == [t for n in ["holder", "0", "1", "2", "3"] for t in (f"q:{n}", f"a:{n}")]
        async with asyncio.timeout(30):  # every waiter leaves the queue once served
            while await holder.waiting(sid):  # noqa: ASYNC110
                await asyncio.sleep(0.05)

    async def test_vanished_waiter_does_not_block_the_queue(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A waiter that died in the queue (its ticket never kept alive) holds the others up only until its ticket expires."""
        ghost = await sessions_factory()
        waiter = await sessions_factory()
        sid = f"{ns}:ghost"
        async with waiter.turn(sid) as session:
            session.replace(pair("first"))
        await ghost.storage.enqueue(sid)  # and never comes back for it
        assert await waiter.waiting(sid) == [ghost.store_id]
        async with ghost.turn(sid, timeout_seconds=30) as session:
            # Held by the ghost's store now, so the waiter below must queue behind the ticket.
            blocked = asyncio.create_task(self._one_turn(waiter, sid, "second"))

            async def queued() -> bool:
                return waiter.store_id in await waiter.waiting(sid)

            await wait_until(queued, "the waiter taking its place in the queue")
            session.replace([*session.messages, *pair("ghost")])
        await asyncio.wait_for(blocked, 60)
        assert texts(await waiter.read_messages(sid) or []) == [
            "q:first",
            "a:first",
            "q:ghost",
            "a:ghost",
            "q:second",
            "a:second",
        ]

    @staticmethod
    async def _one_turn(store: SessionStore, sid: str, label: str) -> None:
        async with store.turn(sid, timeout_seconds=60) as session:
            session.replace([*session.messages, *pair(label)])

    # -- leases ---------------------------------------------------------------------------

    async def test_lease_is_renewed_during_a_long_turn(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A turn longer than its lease keeps the session: renewals hold off other clients and the turn saves."""
        store = await sessions_factory(lease_seconds=RENEWED_LEASE_SECONDS)
        other = await sessions_factory(lease_seconds=RENEWED_LEASE_SECONDS)
        sid = f"{ns}:long"
        async with store.turn(sid) as session:
            first_expiry = session.lease_expires_at
            await outlast_lease(other, first_expiry)
            assert session.lease_expires_at > first_expiry
            with pytest.raises(SessionBusyError):
                async with other.turn(sid, timeout_seconds=0.2):
                    pass
            session.replace(pair("long"))
        assert texts(await other.read_messages(sid) or []) == ["q:long", "a:long"]

    async def test_stale_owner_cannot_save(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """After its lease expired and another client took the session, the old owner's save raises SESSION_LEASE_LOST and writes nothing."""
        owner = await sessions_factory(lease_seconds=30)
        thief = await sessions_factory(lease_seconds=30)
        offset_clock(thief, 31)  # the thief sees the owner's lease as expired
        sid = f"{ns}:stale"
        taken = asyncio.Event()

        async def steal() -> None:
            async with thief.turn(sid, timeout_seconds=5) as session:
                session.replace(pair("thief"))
            taken.set()

        with pytest.raises(LeaseLostError) as caught:
            async with owner.turn(sid) as session:
                session.replace(pair("stale"))
                await asyncio.gather(steal(), asyncio.wait_for(taken.wait(), 30))
        assert caught.value.code == ErrorCode.SESSION_LEASE_LOST
        assert caught.value.session_id == sid
        assert texts(await thief.read_messages(sid) or []) == ["q:thief", "a:thief"]

    async def test_stolen_lease_cancels_owner(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A lease taken over mid-turn: the owner's task is cancelled, the block raises SESSION_LEASE_LOST and its replace() is not saved."""
        owner = await sessions_factory(lease_seconds=RENEWED_LEASE_SECONDS)
        thief = await sessions_factory(lease_seconds=RENEWED_LEASE_SECONDS)
        offset_clock(thief, 60)  # the thief sees the owner's lease as expired
        sid = f"{ns}:steal"
        async with owner.turn(sid) as session:
            session.replace(pair("base"))

        async def steal() -> None:
            async with thief.turn(sid, timeout_seconds=30) as stolen:
                stolen.replace([*stolen.messages, *pair("thief")])

        reached_end = False
        with pytest.raises(LeaseLostError):
            async with owner.turn(sid) as session:
                session.replace([*session.messages, *pair("owner")])
                # A task of its own: the owner's cancellation, whenever the renewal finds
                # the lease gone, must not cut the thief's turn short.
                stealing = asyncio.create_task(steal())
                await asyncio.shield(stealing)
                await asyncio.sleep(60)  # cancelled by the next renewal, long before this ends
                reached_end = True
        await asyncio.wait_for(stealing, REAL_TIME_LIMIT_SECONDS)
        assert not reached_end
        assert texts(await thief.read_messages(sid) or []) == [
            "q:base",
            "a:base",
            "q:thief",
            "a:thief",
        ]

    async def test_transient_renewal_errors_are_retried(
        self, kv_factory: KVFactory, ns: str
    ) -> None:
        """A few failed renewals while the lease is still valid are retried: the turn goes on and saves."""
        flaky = FlakyKV(kv_factory(), native_ports=self.store_path == "native")
        await flaky.setup()
        async with SessionStore(flaky, owns_kv=True, lease_seconds=RENEWED_LEASE_SECONDS) as store:
            sid = f"{ns}:flaky"
            async with store.turn(sid) as session:
                first_expiry = session.lease_expires_at
                flaky.fail_next_replaces = 2

                async def renewed_after_failures() -> bool:
                    return flaky.injected == 2 and session.lease_expires_at > first_expiry

                await wait_until(renewed_after_failures, "a renewal after two failed ones")
                await outlast_lease(store, first_expiry)
                session.replace(pair("survived"))
            assert flaky.injected == 2
            assert texts(await store.read_messages(sid) or []) == ["q:survived", "a:survived"]

    async def test_renewal_failing_until_expiry_loses_lease(
        self, kv_factory: KVFactory, ns: str
    ) -> None:
        """If renewals keep failing until the lease would expire, the owner is cancelled with SESSION_LEASE_LOST and nothing is saved."""
        flaky = FlakyKV(kv_factory(), native_ports=self.store_path == "native")
        await flaky.setup()
        async with SessionStore(flaky, owns_kv=True, lease_seconds=RENEWED_LEASE_SECONDS) as store:
            sid = f"{ns}:outage"
            async with store.turn(sid) as session:
                session.replace(pair("base"))
            with pytest.raises(LeaseLostError):
                async with store.turn(sid) as session:
                    flaky.fail_all_replaces = True
                    session.replace(pair("lost"))
                    await asyncio.sleep(30)
            flaky.fail_all_replaces = False
            assert texts(await store.read_messages(sid) or []) == ["q:base", "a:base"]

    async def test_killed_process_releases_by_expiry(
        self, kv: KVStore, sessions_factory: SessionsFactory, store_url: str, ns: str
    ) -> None:
        """A process killed with SIGKILL inside a turn: after its lease expires another process gets the session with the last checkpointed history."""
        require_processes(kv)
        store = await sessions_factory()
        sid = f"{ns}:killed"
        async with held_by_a_killed_process(store, store_url, sid) as ready:
            info = await store.inspect(sid)
            assert info is not None and info.lease_owner is not None
        with pytest.raises(SessionBusyError):  # the dead process's lease still holds it
            async with store.turn(sid, timeout_seconds=0.2):
                pass
        offset_clock(store, PAST_WORKER_LEASE_SECONDS)  # and then it expires
        async with store.turn(sid, timeout_seconds=20) as session:
            assert texts(session.messages) == [
                "q:before",
                "a:before",
                "q:checkpointed",
                "a:checkpointed",
            ]
            assert session.fence > ready["fence"]

    # -- TTL ------------------------------------------------------------------------------

    async def test_sliding_ttl(self, sessions_factory: SessionsFactory, ns: str) -> None:
        """Each turn renews the session's TTL, and its history never expires before it; an idle session expires whole."""
        store = await sessions_factory(ttl_seconds=100)
        sid = f"{ns}:ttl"
        messages = history(60)  # several chunks, not only the inline tail
        async with store.turn(sid) as session:
            session.replace(messages)
        for step in range(4):  # 4 x 70 s: far past the first writes' TTL
            offset_clock(store, 70)
            async with store.turn(sid) as session:
                assert session.messages[: len(messages)] == messages
                session.replace([*session.messages, *pair(f"step{step}")])
        info = await store.inspect(sid)
        assert info is not None and info.message_count == len(messages) + 8
        offset_clock(store, 101)
        assert await store.inspect(sid) is None
        async with store.turn(sid) as session:
            assert session.messages == []

    # -- corruption -----------------------------------------------------------------------

    async def test_corrupted_state_is_session_invalid(
        self, sessions: SessionStore, ns: str
    ) -> None:
        """Undecodable session state raises SESSION_INVALID naming the session, is never overwritten, and reset() clears it."""
        sid = f"{ns}:corrupt"
        async with sessions.turn(sid) as session:
            session.replace(pair("x"))
        scope = sessions.storage.scope_for(sid)
        entry = await sessions.kv.get(scope, STATE_KEY)
        assert entry is not None
        await sessions.kv.replace(scope, STATE_KEY, b"\x00garbage{", expected_version=entry.version)
        for _ in range(2):
            with pytest.raises(InvalidSessionError) as caught:
                async with sessions.turn(sid):
                    pass
            assert caught.value.code == ErrorCode.SESSION_INVALID
            assert sid in caught.value.detail and caught.value.session_id == sid
        with pytest.raises(InvalidSessionError):
            await sessions.read_messages(sid)
        after = await sessions.kv.get(scope, STATE_KEY)
        assert after is not None and after.value == b"\x00garbage{"
        info = await sessions.inspect(sid)
        assert info is not None and info.problem
        assert await sessions.reset(sid) is True
        async with sessions.turn(sid) as session:
            assert session.messages == []

    async def test_corrupted_chunk_is_session_invalid(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """A corrupted history chunk raises SESSION_INVALID, leaves the stored history untouched and the session free; reset() clears it."""
        store = await sessions_factory(lease_seconds=30)
        reader = await sessions_factory(lease_seconds=30)  # no cached chunks
        sid = f"{ns}:chunk"
        async with store.turn(sid) as session:
            session.replace(history(60))
        scope = store.storage.scope_for(sid)
        parts = [i async for i in store.kv.iter_scan(scope, prefix=CHUNK_PREFIX)]
        assert parts, "a 60-message history is chunked"
        victim = parts[0]
        assert victim.entry is not None
        await store.kv.replace(
            scope, victim.key, b'[{"not": "a message"}]', expected_version=victim.entry.version
        )
        for _ in range(2):  # the second attempt is not SESSION_BUSY: the lease was released
            with pytest.raises(InvalidSessionError) as caught:
                async with reader.turn(sid, timeout_seconds=1):
                    pass
            assert sid in caught.value.detail
        again = await store.kv.get(scope, victim.key)
        assert again is not None and again.value == b'[{"not": "a message"}]'
        assert await reader.reset(sid) is True
        async with reader.turn(sid) as session:
            assert session.messages == []

    # -- cost -----------------------------------------------------------------------------

    async def test_bytes_per_turn_independent_of_history_length(
        self, kv_factory: KVFactory, ns: str
    ) -> None:
        """Bytes written per turn (appending 2 messages) at history 10 and 2,000 differ by less than 2x."""
        counting = CountingKV(kv_factory(), native_ports=self.store_path == "native")
        await counting.setup()
        per_turn: dict[int, float] = {}
        async with SessionStore(counting, owns_kv=True) as store:
            for length in (10, 2000):
                sid = f"{ns}:bytes{length}"
                async with store.turn(sid) as session:
                    session.replace(history(length, pad=450))
                counting.reset_counts()
                turns = 24
                for i in range(turns):
                    async with store.turn(sid) as session:
                        session.replace([*session.messages, *pair(f"n{i}", 450)])
                per_turn[length] = counting.bytes_written / turns
                info = await store.inspect(sid)
                assert info is not None and info.message_count == length + 2 * turns
        small, large = per_turn[10], per_turn[2000]
        assert max(small, large) < 2 * min(small, large), per_turn

    # -- checkpoints and the recovery latch -----------------------------------------------

    async def test_checkpointed_messages_edited_later_are_saved(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """With a tiny inline tail, so checkpoints spill into chunks: what a fresh client
        reads after the turn is exactly the run's final messages, including the request
        Pydantic AI completed in place after it had been checkpointed."""
        store = await sessions_factory(tail_bytes=256)
        sid = f"{ns}:edited"
        agent = Agent(one_call_model("book", {"slot": "noon"}, final="booked"))

        @agent.tool_plain
        async def book(slot: str) -> str:
            return f"booked {slot}"

        async with store.turn(sid) as session:
            session.replace(pair("earlier", 400))
        async with store.turn(sid) as session:
            result = await agent.run(
                "book it",
                message_history=session.messages,
                capabilities=[session_checkpoints(session, effect_tools={"book"})],
            )
            session.replace(result.all_messages())
        expected = dump(result.all_messages())
        fresh = await sessions_factory(tail_bytes=256)
        assert dump(await fresh.read_messages(sid) or []) == expected
        async with store.turn(sid) as session:
            assert dump(session.messages) == expected

    async def test_effect_success_clears_marker_and_stores_no_arguments(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """An effect call is marked (name and id only, never arguments) before it runs, and cleared when it returns successfully."""
        store = await sessions_factory()
        observer = await sessions_factory()
        sid = f"{ns}:ok"
        agent = Agent(one_call_model("book", {"slot": SECRET}, final="booked"))
        seen: dict[str, Any] = {}

        @agent.tool
        async def book(ctx: RunContext[object], slot: str) -> str:
            seen["info"] = await observer.inspect(sid)
            scope = observer.storage.scope_for(sid)
            seen["raw"] = b"".join(
                [i.entry.value async for i in observer.kv.iter_scan(scope) if i.entry is not None]
            )
            seen["call_id"] = ctx.tool_call_id
            return "ok"

        async with store.turn(sid) as session:
            result = await agent.run(
                "book it",
                message_history=session.messages,
                conversation_id=session.session_id,
                capabilities=[session_checkpoints(session, effect_tools={"book"})],
            )
            assert session.pending_effects == ()
            session.replace(result.all_messages())
        info = seen["info"]
        assert info.pending_effects == (EffectCall("book", seen["call_id"]),)
        assert info.recovery_required
        assert SECRET.encode() not in seen["raw"]
        assert seen["call_id"].encode() in seen["raw"]
        after = await store.inspect(sid)
        assert after is not None and after.pending_effects == ()
        async with store.turn(sid) as session:  # no recovery needed
            assert result.output == "booked"
            assert session.messages == result.all_messages()

    async def test_effect_failure_keeps_marker_until_clear_recovery(
        self, sessions: SessionStore, ns: str
    ) -> None:
        """A failed effect keeps the latch: the next turn raises SESSION_RECOVERY_REQUIRED listing the call; clear_recovery() keeps the history and unlatches."""
        sid = f"{ns}:fail"
        async with sessions.turn(sid) as session:
            session.replace(pair("earlier"))
        agent = Agent(one_call_model("charge", {"amount": SECRET}))
        entered: list[str] = []

        @agent.tool_plain
        async def charge(amount: str) -> str:
            raise ConnectionError("payment gateway timed out")

        with pytest.raises(ConnectionError):
            async with sessions.turn(sid) as session:
                result = await agent.run(
                    "pay",
                    message_history=session.messages,
                    capabilities=[session_checkpoints(session, effect_tools={"charge"})],
                )
                session.replace(result.all_messages())
        for _ in range(2):
            with pytest.raises(RecoveryRequiredError) as caught:
                async with sessions.turn(sid):
                    entered.append(sid)
            assert caught.value.code == ErrorCode.SESSION_RECOVERY_REQUIRED
            assert [c.tool_name for c in caught.value.pending_effects] == ["charge"]
        assert entered == []
        latched = await sessions.list_sessions(ns, latched_only=True)
        assert [i.session_id for i in latched] == [sid]
        assert await sessions.clear_recovery(sid) is True
        assert await sessions.clear_recovery(sid) is False
        async with sessions.turn(sid) as session:
            assert texts(session.messages) == ["q:earlier", "a:earlier"]

    async def test_effect_retry_keeps_marker(self, sessions: SessionStore, ns: str) -> None:
        """An effect call answered with a retry keeps the latch even if a later call succeeds."""
        sid = f"{ns}:retry"
        agent = Agent(one_call_model("send", {"to": SECRET}, final="sent"))
        attempts = 0

        @agent.tool_plain
        async def send(to: str) -> str:
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                raise ModelRetry("try again")
            return "sent"

        async with sessions.turn(sid) as session:
            result = await agent.run(
                "send it",
                message_history=session.messages,
                capabilities=[session_checkpoints(session, effect_tools={"send"})],
            )
            session.replace(result.all_messages())
        assert attempts == 2 and result.output == "sent"
        with pytest.raises(RecoveryRequiredError) as caught:
            async with sessions.turn(sid):
                pass
        assert len(caught.value.pending_effects) == 2
        # The history itself was saved.
        assert dump(await sessions.read_messages(sid) or []) == dump(result.all_messages())

    async def test_effect_denial_keeps_marker(self, sessions: SessionStore, ns: str) -> None:
        """An effect call that is denied (never runs) keeps the latch."""
        sid = f"{ns}:deny"
        agent = Agent(one_call_model("delete_all", {"scope": SECRET}, final="not deleted"))
        ran = False

        @agent.tool_plain(requires_approval=True)
        async def delete_all(scope: str) -> str:
            nonlocal ran
            ran = True
            return "deleted"

        def deny(ctx: RunContext[object], requests: DeferredToolRequests) -> DeferredToolResults:
            return DeferredToolResults(
                approvals={c.tool_call_id: ToolDenied("no") for c in requests.approvals}
            )

        async with sessions.turn(sid) as session:
            result = await agent.run(
                "delete everything",
                message_history=session.messages,
                capabilities=[
                    session_checkpoints(session, effect_tools={"delete_all"}),
                    HandleDeferredToolCalls(handler=deny),
                ],
            )
            session.replace(result.all_messages())
        assert not ran
        with pytest.raises(RecoveryRequiredError) as caught:
            async with sessions.turn(sid):
                pass
        assert [c.tool_name for c in caught.value.pending_effects] == ["delete_all"]

    async def test_checkpoint_after_each_tool_node(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """After every tool node the history with the canonical tool returns is saved, before the next model request."""
        store = await sessions_factory()
        observer = await sessions_factory()
        sid = f"{ns}:nodes"
        snapshots: list[list[ModelMessage] | None] = []

        async def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            snapshots.append(await observer.read_messages(sid))
            if len(snapshots) == 1:
                return ModelResponse(parts=[ToolCallPart("lookup", {"q": "x"}, tool_call_id="c1")])
            return ModelResponse(parts=[TextPart("answer")])

        agent = Agent(FunctionModel(model))

        @agent.tool_plain
        def lookup(q: str) -> str:
            return "found"

        with pytest.raises(RuntimeError):
            async with store.turn(sid) as session:
                await agent.run(
                    "look",
                    message_history=session.messages,
                    capabilities=[session_checkpoints(session)],
                )
                raise RuntimeError("the turn fails after the run")
        assert snapshots[0] in (None, [])
        second = snapshots[1]
        assert second is not None
        returns = [p for m in second for p in m.parts if isinstance(p, ToolReturnPart)]
        assert [(r.tool_call_id, r.content, r.outcome) for r in returns] == [
            ("c1", "found", "success")
        ]
        # The last checkpoint (the complete run) stays although the block failed.
        saved = await store.read_messages(sid)
        assert saved is not None and isinstance(saved[-1], ModelResponse)
        assert saved[-1].parts == [TextPart("answer")]

    async def test_killed_inside_effect_requires_recovery(
        self, kv: KVStore, sessions_factory: SessionsFactory, store_url: str, ns: str
    ) -> None:
        """A process killed while an effect tool runs leaves the latch: after the lease expires the next turn raises SESSION_RECOVERY_REQUIRED; reset() clears everything."""
        require_processes(kv)
        store = await sessions_factory()
        sid = f"{ns}:effectkill"
        proc = await spawn("effect", store_url, sid, str(WORKER_LEASE_SECONDS))
        try:
            assert (await read_json(proc))["ready"] is True
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        offset_clock(store, PAST_WORKER_LEASE_SECONDS)  # the dead process's lease expired
        with pytest.raises(RecoveryRequiredError) as caught:
            async with store.turn(sid, timeout_seconds=20):
                pass
        assert [c.tool_name for c in caught.value.pending_effects] == ["charge_card"]
        assert await store.reset(sid) is True
        assert await store.inspect(sid) is None
        async with store.turn(sid) as session:
            assert session.messages == []

    async def test_recovery_attempts_renew_ttl(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Each attempt on a latched session renews its TTL; without attempts it expires with the session."""
        store = await sessions_factory(ttl_seconds=100)
        sid = f"{ns}:latchttl"
        async with store.turn(sid) as session:
            await session.mark_effects([("pay", "call-1")])
            session.replace(history(60))
        for _ in range(3):
            offset_clock(store, 70)
            with pytest.raises(RecoveryRequiredError):
                async with store.turn(sid):
                    pass
        info = await store.inspect(sid)
        assert info is not None and info.message_count == 60 and info.recovery_required
        assert texts(await store.read_messages(sid) or []) == texts(history(60))
        offset_clock(store, 101)
        assert await store.inspect(sid) is None
        async with store.turn(sid) as session:
            assert session.messages == []

    # -- the last-tool-result fallback ----------------------------------------------------

    @staticmethod
    def _failing_after(
        first: ModelResponse, error: Exception | None = None
    ) -> tuple[FunctionModel, list[int]]:
        calls: list[int] = []

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.append(len(messages))
            if len(calls) == 1:
                return first
            raise error or ModelHTTPError(status_code=503, model_name="scripted", body="down")

        return FunctionModel(model), calls

    async def test_fallback_returns_last_verified_result(self) -> None:
        """When the provider fails right after an eligible tool's successful, non-empty result, that result becomes the output."""
        model, _ = self._failing_after(ModelResponse(parts=[ToolCallPart("confirm", {})]))
        agent = Agent(model, capabilities=[last_tool_result_fallback({"confirm"})])

        @agent.tool_plain
        def confirm() -> str:
            return "Your table is booked for 20:00."

        result = await agent.run("book")
        assert result.output == "Your table is booked for 20:00."

    async def test_fallback_propagates_provider_error_otherwise(self) -> None:
        """Without an eligible, non-empty result of this run the provider's exception propagates intact."""
        error = ModelHTTPError(status_code=503, model_name="scripted", body="down")
        cases: list[tuple[str, Any]] = [("other", "fine"), ("confirm", ""), ("confirm", None)]
        for tool, value in cases:
            model, _ = self._failing_after(ModelResponse(parts=[ToolCallPart(tool, {})]), error)
            agent = Agent(
                model,
                tools=[Tool(_returning(value), name=tool)],
                capabilities=[last_tool_result_fallback({"confirm"})],
            )
            with pytest.raises(ModelHTTPError) as caught:
                await agent.run("x")
            assert caught.value is error
        # A result from an earlier run (in the history) is not this run's.
        old: list[ModelMessage] = [
            ModelRequest(parts=[UserPromptPart("before")]),
            ModelResponse(parts=[ToolCallPart("confirm", {}, tool_call_id="old")]),
            ModelRequest(parts=[ToolReturnPart("confirm", "old answer", tool_call_id="old")]),
        ]

        def always_fail(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            raise error

        agent = Agent(
            FunctionModel(always_fail), capabilities=[last_tool_result_fallback({"confirm"})]
        )
        with pytest.raises(ModelHTTPError):
            await agent.run("again", message_history=old)

    async def test_fallback_not_used_after_tool_retry_or_failure(self) -> None:
        """A run containing a tool retry never falls back; tool errors themselves propagate untouched."""
        calls: list[int] = []

        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            calls.append(1)
            if len(calls) <= 2:
                return ModelResponse(parts=[ToolCallPart("confirm", {})])
            raise ModelHTTPError(status_code=500, model_name="scripted")

        agent = Agent(FunctionModel(model), capabilities=[last_tool_result_fallback({"confirm"})])
        attempts = 0

        @agent.tool_plain
        def confirm() -> str:
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                raise ModelRetry("again")
            return "confirmed"

        with pytest.raises(ModelHTTPError):
            await agent.run("x")

        broken = Agent(
            one_call_model("confirm", {}), capabilities=[last_tool_result_fallback({"confirm"})]
        )

        class ToolBroke(Exception):
            pass

        @broken.tool_plain(name="confirm")
        def confirm_broken() -> str:
            raise ToolBroke("tool error")

        with pytest.raises(ToolBroke):
            await broken.run("x")

    async def test_fallback_never_replaces_model_output(self) -> None:
        """When the provider answers, its text (or its new tool calls) is used, never the stored tool result."""
        agent = Agent(
            one_call_model("confirm", {}, final="model's own words"),
            capabilities=[last_tool_result_fallback({"confirm"})],
        )

        @agent.tool_plain
        def confirm() -> str:
            return "tool text"

        result = await agent.run("x")
        assert result.output == "model's own words"

    # -- processes and conversations ------------------------------------------------------

    async def test_two_processes_continue_one_conversation(
        self, kv: KVStore, sessions: SessionStore, store_url: str, ns: str
    ) -> None:
        """An agent's two runs in two separate processes continue one conversation through turn()."""
        require_processes(kv)
        sid = f"{ns}:conv"
        first = await spawn("agent-turn", store_url, sid, "my name is Ada")
        out1 = await read_json(first)
        assert await first.wait() == 0
        second = await spawn("agent-turn", store_url, sid, "what is my name?")
        out2 = await read_json(second)
        assert await second.wait() == 0
        assert out1["output"] == "heard: my name is Ada"
        assert out2["output"] == "heard: my name is Ada | what is my name?"
        saved = await sessions.read_messages(sid)
        assert saved is not None and len(saved) == out2["messages"] == 4

    async def test_agent_conversation_in_one_process(self, sessions: SessionStore, ns: str) -> None:
        """The seed's usage example works as written: message_history, conversation_id, replace(all_messages())."""
        agent = Agent(prompts_model())
        sid = f"{ns}:seed"
        for prompt in ("remember green", "what colour?"):
            async with sessions.turn(sid) as session:
                result = await agent.run(
                    prompt, message_history=session.messages, conversation_id=session.session_id
                )
                session.replace(result.all_messages())
        assert result.output == "heard: remember green | what colour?"
        assert all(
            m.conversation_id == sid
            for m in await sessions.read_messages(sid) or []
            if isinstance(m, ModelRequest | ModelResponse)
        )

    # -- administration -------------------------------------------------------------------

    async def test_inspect_and_listing(self, sessions: SessionStore, ns: str) -> None:
        """inspect() reports length, lease holder and pending effects; the listing pages through sessions, latched ones included."""
        assert await sessions.inspect(f"{ns}:absent") is None
        assert await sessions.read_messages(f"{ns}:absent") is None
        for i in range(5):
            async with sessions.turn(f"{ns}:l{i}") as session:
                session.replace(pair(str(i)))
                if i == 3:
                    await session.mark_effects([("ship", "call-9")])
        async with sessions.turn(f"{ns}:l0") as session:
            info = await sessions.inspect(f"{ns}:l0")
            assert info is not None
            assert info.lease_owner is not None and info.lease_active(sessions.kv.clock())
            assert info.message_count == 2 and info.fence == session.fence
        info = await sessions.inspect(f"{ns}:l0")
        assert info is not None and info.lease_owner is None and info.pending_effects == ()
        listed = await sessions.list_sessions(ns)
        assert [i.session_id for i in listed] == [f"{ns}:l{i}" for i in range(5)]
        latched = [i for i in listed if i.recovery_required]
        assert [(i.session_id, i.pending_effects) for i in latched] == [
            (f"{ns}:l3", (EffectCall("ship", "call-9"),))
        ]
        page1 = await sessions.list_sessions(ns, limit=2)
        page2 = await sessions.list_sessions(ns, limit=2, start_after=page1[-1].session_id)
        assert [i.session_id for i in page1 + page2] == [f"{ns}:l{i}" for i in range(4)]
        assert [i.session_id for i in await sessions.list_sessions(ns, latched_only=True)] == [
            f"{ns}:l3"
        ]

    async def test_reset_deletes_history_and_marker(self, sessions: SessionStore, ns: str) -> None:
        """reset() deletes history, marker and lease state; the next turn starts empty; resetting an absent session is harmless."""
        sid = f"{ns}:reset"
        async with sessions.turn(sid) as session:
            session.replace(history(60))
            await session.mark_effects([("pay", "c1")])
        assert await sessions.reset(sid) is True
        assert await sessions.inspect(sid) is None
        async with sessions.turn(sid) as session:
            assert session.messages == []
        assert await sessions.reset(f"{ns}:never") is False

    async def test_aclose_waits_for_active_turns(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """aclose() lets active turns finish and save, then refuses new turns with RESOURCE_CLOSED."""
        store = await sessions_factory()
        reader = await sessions_factory()
        sid = f"{ns}:drain"
        entered = asyncio.Event()

        async def turn() -> None:
            async with store.turn(sid) as session:
                entered.set()
                await asyncio.sleep(0.3)
                session.replace(pair("drained"))

        task = asyncio.create_task(turn())
        await entered.wait()
        await store.aclose()
        await task
        assert texts(await reader.read_messages(sid) or []) == ["q:drained", "a:drained"]
        with pytest.raises(ResourceClosedError):
            store.turn(sid)

    async def test_aclose_interrupts_turns_past_its_timeout(
        self, sessions_factory: SessionsFactory, ns: str
    ) -> None:
        """Turns still active when aclose()'s timeout passes are interrupted with RESOURCE_CLOSED, save nothing and free the session."""
        store = await sessions_factory(lease_seconds=30)
        other = await sessions_factory(lease_seconds=30)
        sid = f"{ns}:stuck"
        entered = asyncio.Event()

        async def stuck() -> None:
            async with store.turn(sid) as session:
                session.replace(pair("never"))
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(stuck())
        await entered.wait()
        await store.aclose(timeout_seconds=0.2)
        with pytest.raises(ResourceClosedError):
            await task
        async with other.turn(sid, timeout_seconds=5) as session:
            assert session.messages == []

    async def test_rejects_bad_options(self, kv: KVStore) -> None:
        """Invalid store options raise CONFIG_INVALID."""
        bad: list[dict[str, Any]] = [
            {"lease_seconds": 0},
            {"ttl_seconds": 10, "lease_seconds": 30},
            {"ttl_seconds": -1},
            {"fanout": 1},
        ]
        for options in bad:
            with pytest.raises(AppError) as caught:
                SessionStore(kv, **options)
            assert caught.value.code == ErrorCode.CONFIG_INVALID
