"""DynamoDB's routine faults, injected at botocore's transport in front of the moto server.

Every fault of :mod:`agent_stores_dynamodb.faults` is injected at least once: at a chosen
KV call, and at random under the real workloads (memory writes with receipts, journal
appends, session turns). Each operation succeeds or raises the right typed error — never
a configuration error for a transient fault — and nothing is lost or applied twice. A
session shared by 4 workers under 30 % injected conflicts and throttling keeps every
message in order with no two turns at once, and a blackholed endpoint (a socket that
accepts and never answers) gives BackendUnavailableError within the deadline + 1 s, from a
KV call, a session turn and ``agent-stores check``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from agent_stores import BackendUnavailableError, ConfigError, ConflictError, open_sessions
from agent_stores.checkpointer import Checkpointer, JournalEvent, make_step_id
from agent_stores.faults import FaultInjector, FaultKind
from agent_stores.kv.base import Check, Create, KVStore, Replace
from agent_stores.memory import KVMemoryStore
from agent_stores.plugins import get_registry
from agent_stores.sessions.errors import TransientStoreError
from agent_stores.url import StoreURL
from agent_stores_dynamodb.faults import FAULTS, Blackhole, DynamoDBFaultInjector, eligible_faults
from agent_stores_dynamodb.kv import DynamoDBKV
from dynamodb_test_support import with_options
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai_harness.memory import MemoryOperation

R = TypeVar("R")

#: Faults carried by a request that reaches (or would reach) the server normally.
ROUTINE = sorted(
    f for f, kind in FAULTS.items() if kind not in (FaultKind.BLACKHOLE, FaultKind.LOST_REPLY)
)
CONTENTION = [
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "TransactionConflictException",
    "TransactionCanceledException:TransactionConflict",
    "TransactionCanceledException:ThrottlingError",
]
#: Faults DynamoDB sends on transactions only.
ARMED_ON = {
    "TransactionCanceledException:TransactionConflict": "TransactWriteItems",
    "TransactionCanceledException:ThrottlingError": "TransactWriteItems",
}


def pair(tag: str, pad: int = 0) -> list[ModelMessage]:
    """A request and its response, tagged (and padded with ``pad`` characters each)."""
    return [
        ModelRequest(parts=[UserPromptPart(f"q {tag}" + " " * pad)]),
        ModelResponse(parts=[TextPart(f"a {tag}" + " " * pad)]),
    ]


def prompt_of(message: ModelMessage) -> str:
    part = message.parts[0]
    assert isinstance(part, UserPromptPart | TextPart)
    return str(part.content).rstrip()


@pytest_asyncio.fixture
async def injector() -> AsyncIterator[DynamoDBFaultInjector]:
    made = DynamoDBFaultInjector()
    yield made
    made.close()


@pytest_asyncio.fixture
async def kv(dynamodb_url: str, injector: DynamoDBFaultInjector) -> AsyncIterator[KVStore]:
    store = await injector.open_kv(StoreURL.parse(dynamodb_url))
    await store.setup()
    yield store
    await store.aclose()


async def until_done(
    call: Callable[[], Awaitable[R]], outcomes: Counter[str], *, attempts: int = 8
) -> R:
    """Run ``call`` as an application would: a typed transient error is retried (the
    operation is idempotent by its receipt / step id / message tag); any other error,
    ConfigError above all, fails the test. A session store reports a transient backend
    failure as TransientStoreError (SESSION_STORE_UNAVAILABLE) caused by one."""
    for _ in range(attempts):
        failure: BaseException | None = None
        try:
            result = await call()
        except (BackendUnavailableError, TransientStoreError) as exc:
            failure = exc
        if failure is None:
            outcomes["ok"] += 1
            return result
        assert not isinstance(failure, ConfigError)
        if isinstance(failure, TransientStoreError):
            assert isinstance(failure.__cause__, BackendUnavailableError), repr(failure.__cause__)
        outcomes[type(failure).__name__] += 1
    raise AssertionError(f"still failing after {attempts} attempts: {outcomes}")


# -- the hooks --------------------------------------------------------------------------


def test_plugin_hooks_give_the_injector_and_the_proxied_url(dynamodb_base_url: str) -> None:
    """``fault_injector`` offers every fault DynamoDB names, with its kind; ``proxied_url``
    points endpoint_url at the proxy and keeps the rest."""
    url = StoreURL.parse(dynamodb_base_url)
    hooks = get_registry().hook
    made = hooks.fault_injector(url=url)
    assert isinstance(made, DynamoDBFaultInjector) and isinstance(made, FaultInjector)
    assert set(made.faults) == set(FAULTS)
    assert set(made.faults.values()) == {
        FaultKind.TRANSIENT,
        FaultKind.CONFLICT,
        FaultKind.RESET,
        FaultKind.LOST_REPLY,
        FaultKind.BLACKHOLE,
    }
    assert "TransactionCanceledException:ConditionalCheckFailed" not in made.faults
    endpoint = url.query_get("endpoint_url")
    assert endpoint is not None
    assert hooks.server_address(url=url) == ("127.0.0.1", int(endpoint.rsplit(":", 1)[1]))
    assert hooks.server_address(url=StoreURL.parse("dynamodb://t?region=eu-west-1")) is None
    proxied = hooks.proxied_url(url=url, host="127.0.0.1", port=4242)
    assert proxied is not None and proxied.query_get("endpoint_url") == "http://127.0.0.1:4242"
    assert proxied.query_get("prefix") == url.query_get("prefix")
    other = hooks.fault_injector(url=StoreURL.parse("memory://x"))
    assert not isinstance(other, DynamoDBFaultInjector)


# -- one fault at one chosen call ---------------------------------------------------------


@pytest.mark.parametrize("fault", ROUTINE)
async def test_one_fault_at_a_chosen_call_is_survived(
    fault: str, kv: KVStore, injector: DynamoDBFaultInjector
) -> None:
    """One injected fault on a create, a replace and a commit: each call succeeds (retried
    by botocore or by the store; a lost reply recognised as our own write) and writes once."""
    armed = [op for op in ("PutItem", "TransactWriteItems") if fault in eligible_faults(op)]
    for operation in armed:
        injector.arm(fault, operation=operation)
    version = await kv.create("s", "k", b"v1")
    version = await kv.replace("s", "k", b"v2", expected_version=version)
    versions = await kv.commit(
        "s", [Check("absent", None), Create("new", b"n"), Replace("k", b"v3", version)]
    )
    assert injector.injected() == {fault: len(armed)}
    entry = await kv.get("s", "k")
    assert entry is not None and entry.value == b"v3" and entry.version == versions[2]
    assert [i.key for i in await kv.scan("s")] == ["k", "new"]


async def test_a_lost_reply_on_a_write_is_an_unknown_outcome_never_a_resend(
    kv: KVStore, injector: DynamoDBFaultInjector
) -> None:
    """A create, a replace and a commit whose replies are lost: each raises
    BackendUnavailableError ("outcome unknown") instead of letting botocore re-send it, and
    each was applied exactly once."""
    version = await kv.create("s", "k", b"v0")
    for operation in ("PutItem", "TransactWriteItems"):
        injector.arm("lost_reply", operation=operation)
    with pytest.raises(BackendUnavailableError, match="unknown"):
        await kv.replace("s", "k", b"v1", expected_version=version)
    entry = await kv.get("s", "k")
    assert entry is not None and entry.value == b"v1"
    with pytest.raises(BackendUnavailableError, match="unknown"):
        await kv.commit("s", [Create("new", b"n"), Replace("k", b"v2", entry.version)])
    assert injector.injected() == {"lost_reply": 2}
    entry = await kv.get("s", "k")
    assert entry is not None and entry.value == b"v2"
    assert [i.key for i in await kv.scan("s")] == ["k", "new"]


@pytest.mark.parametrize("fault", ["TransactionConflictException", "ThrottlingException"])
async def test_contention_outliving_the_budget_is_backend_unavailable(
    fault: str, dynamodb_url: str, injector: DynamoDBFaultInjector
) -> None:
    """A fault that never stops ends as BackendUnavailableError (cause kept, nothing
    written), within the deadline; never ConfigError."""
    kv = await injector.open_kv(StoreURL.parse(with_options(dynamodb_url, deadline="3")))
    try:
        await kv.setup()
        injector.arm(fault, times=10_000, operation="PutItem")
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as info:
            await kv.create("s", "k", b"v")
        assert time.monotonic() - started < 3 + 1
        assert not isinstance(info.value, ConfigError)
        assert fault in str(info.value) or fault in repr(info.value.__cause__)
        injector.disarm()
        assert await kv.get("s", "k") is None
    finally:
        await kv.aclose()


async def test_cancellation_reasons_are_mapped_item_by_item(
    kv: KVStore, injector: DynamoDBFaultInjector
) -> None:
    """A real failed condition in a transaction is a ConflictError naming that operation's
    index and key (the server's reasons: None, …, ConditionalCheckFailed); injected
    TransactionConflict / ThrottlingError reasons are retried until the commit lands."""
    version = await kv.create("s", "a", b"1")
    await kv.create("s", "b", b"1")
    with pytest.raises(ConflictError) as info:
        await kv.commit("s", [Replace("a", b"2", version), Check("b", None), Create("c", b"")])
    assert info.value.index == 1 and info.value.key == "b"
    assert await kv.get("s", "c") is None
    injector.arm("TransactionCanceledException:TransactionConflict", times=2)
    injector.arm("TransactionCanceledException:ThrottlingError", times=2)
    versions = await kv.commit("s", [Replace("a", b"2", version), Create("c", b"")])
    assert injector.injected() == {
        "TransactionCanceledException:TransactionConflict": 2,
        "TransactionCanceledException:ThrottlingError": 2,
    }
    entry = await kv.get("s", "a")
    assert entry is not None and entry.version == versions[0]


async def test_blackholed_request_is_retried_after_the_read_timeout(
    dynamodb_url: str, injector: DynamoDBFaultInjector
) -> None:
    """One request sent to a silent peer: botocore's read timeout (sized from the deadline)
    ends it. A read is retried and reaches the server; a write is not re-sent (the silent
    peer may have applied it) and is an unknown outcome, within its deadline."""
    kv = await injector.open_kv(StoreURL.parse(with_options(dynamodb_url, deadline="4")))
    try:
        await kv.setup()
        await kv.create("s", "k", b"v")
        injector.arm("blackhole", operation="GetItem")
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"v"
        injector.arm("blackhole", operation="PutItem")
        with pytest.raises(BackendUnavailableError, match="unknown"):
            await kv.create("s", "k2", b"v")
        assert injector.injected() == {"blackhole": 2}
    finally:
        await kv.aclose()


# -- the workloads under random faults ----------------------------------------------------


async def memory_workload(kv: KVStore, outcomes: Counter[str], rounds: int) -> None:
    """Memory writes with receipts: each operation applied exactly once, however retried."""
    store = KVMemoryStore(kv)
    expected: dict[str, str] = {}
    versions: dict[str, str | None] = {}
    for i in range(rounds):
        path = f"notes/{i % 3}.md"
        content = f"{expected.get(path, '')}line {i}\n"
        operation = MemoryOperation(id=f"op-{i}", fingerprint=f"fp-{i}")
        expected_version = versions.get(path)

        async def write(
            path: str = path,
            content: str = content,
            expected_version: str | None = expected_version,
            operation: MemoryOperation = operation,
        ) -> Any:
            return await store.write(
                path, content, expected_version=expected_version, operation=operation
            )

        mutation = await until_done(write, outcomes)
        versions[path] = mutation.version
        expected[path] = content
        replay = await until_done(write, outcomes)  # the same operation again: a replay
        assert replay.replayed and replay.version == mutation.version
    for path, content in expected.items():
        read = await until_done(lambda p=path: store.read(p, max_chars=100_000), outcomes)
        assert read is not None and read.content == content, path


async def journal_workload(kv: KVStore, outcomes: Counter[str], steps: int) -> None:
    """Journal appends: every step once, in order, whatever was retried."""
    journal = Checkpointer(kv)
    for i in range(1, steps + 1):
        event = JournalEvent(step_id=make_step_id(i, "model"), payload={"i": i})
        await until_done(lambda e=event: journal.append("run-1", e), outcomes)
    state = await until_done(lambda: journal.load("run-1"), outcomes)
    assert [e.step_id for e in state.entries] == [
        make_step_id(i, "model") for i in range(1, steps + 1)
    ]


async def session_workload(kv: KVStore, outcomes: Counter[str], turns: int) -> None:
    """Session turns: every turn reported saved is in the history, in order, once."""
    async with open_sessions(kv) as sessions:
        for t in range(turns):

            async def turn(t: int = t) -> None:
                async with sessions.turn("chat", timeout_seconds=60) as s:
                    tags = {prompt_of(m) for m in s.messages}
                    if f"q t{t}" not in tags:  # an earlier attempt may have been saved
                        s.replace([*s.messages, *pair(f"t{t}")])

            await until_done(turn, outcomes)
        history = await sessions.read_messages("chat")
    assert history is not None
    assert [prompt_of(m) for m in history] == [
        text for t in range(turns) for text in (f"q t{t}", f"a t{t}")
    ]


WORKLOADS = {
    "memory": lambda kv, outcomes: memory_workload(kv, outcomes, 12),
    "journal": lambda kv, outcomes: journal_workload(kv, outcomes, 20),
    "sessions": lambda kv, outcomes: session_workload(kv, outcomes, 12),
}


@pytest.mark.timeout(600)
async def test_workloads_under_every_fault(kv: KVStore, injector: DynamoDBFaultInjector) -> None:
    """Memory writes with receipts, journal appends and session turns at a 25 % fault rate
    over every routine fault, after each fault armed once: every operation succeeds or
    raises the typed transient error (then retried as an application would), never
    ConfigError; nothing lost or applied twice; every fault injected at least once."""
    for fault in ROUTINE:
        injector.arm(fault, operation=ARMED_ON.get(fault))
    injector.set_rate(0.25, ROUTINE, seed=22)
    outcomes: Counter[str] = Counter()
    for name, workload in WORKLOADS.items():
        await workload(kv, outcomes)
        assert outcomes["ok"] > 0, (name, outcomes)
    injector.disarm()
    counts = injector.injected()
    assert set(counts) == set(ROUTINE), counts
    assert not outcomes.keys() - {"ok", "BackendUnavailableError", "TransientStoreError"}


@pytest.mark.parametrize(("operation", "pad"), [("TransactWriteItems", 2000), ("PutItem", 0)])
async def test_lost_reply_on_session_saves(
    operation: str, pad: int, kv: KVStore, injector: DynamoDBFaultInjector
) -> None:
    """A lost reply on a write of every turn: with 2 KB messages each save writes a new
    history chunk with the state in one transaction (a warm acquire is one too); with
    small ones the save is the state's PutItem alone. Every turn is saved once and the
    session stays readable."""
    turns = 8
    outcomes: Counter[str] = Counter()
    async with open_sessions(kv) as sessions:
        for t in range(turns):
            injector.arm("lost_reply", operation=operation)

            async def turn(t: int = t) -> None:
                async with sessions.turn("chat", timeout_seconds=30) as s:
                    if f"q t{t}" not in {prompt_of(m) for m in s.messages}:
                        s.replace([*s.messages, *pair(f"t{t}", pad=pad)])

            await until_done(turn, outcomes)
        history = await sessions.read_messages("chat")
        info = await sessions.inspect("chat")
    assert injector.injected().get("lost_reply", 0) >= turns - 1, injector.injected()
    assert outcomes == Counter(ok=turns), outcomes  # each lost reply resolved, none reported
    assert history is not None and info is not None
    assert [prompt_of(m) for m in history] == [
        text for t in range(turns) for text in (f"q t{t}", f"a t{t}")
    ]


# -- contention: 4 workers x 10 turns on one session --------------------------------------


@pytest.mark.timeout(600)
async def test_four_workers_share_a_session_under_conflicts_and_throttling(
    dynamodb_url: str, injector: DynamoDBFaultInjector
) -> None:
    """4 workers (each its own client and session store) x 10 turns on one session, 30 %
    of requests faulted with conflicts and throttling: 80 messages, each worker's turns in
    order, each turn's pair adjacent, and never two turns at once."""
    setup = await injector.open_kv(StoreURL.parse(dynamodb_url))
    await setup.setup()
    await setup.aclose()
    injector.set_rate(0.3, CONTENTION, seed=4)
    active = 0
    overlaps = 0
    outcomes: Counter[str] = Counter()

    async def worker(w: int) -> None:
        nonlocal active, overlaps
        kv = await injector.open_kv(StoreURL.parse(dynamodb_url))
        try:
            async with open_sessions(kv) as sessions:
                for t in range(10):
                    tag = f"w{w}-t{t}"

                    async def turn(tag: str = tag) -> None:
                        nonlocal active, overlaps
                        async with sessions.turn("shared", timeout_seconds=300) as s:
                            active += 1
                            overlaps += active > 1
                            try:
                                await asyncio.sleep(0.01)
                                if f"q {tag}" not in {prompt_of(m) for m in s.messages}:
                                    s.replace([*s.messages, *pair(tag)])
                            finally:
                                active -= 1

                    await until_done(turn, outcomes)
        finally:
            await kv.aclose()

    await asyncio.gather(*(worker(w) for w in range(4)))
    injector.set_rate(0.0)
    async with open_sessions(dynamodb_url) as sessions:
        history = await sessions.read_messages("shared")
    assert history is not None
    texts = [prompt_of(m) for m in history]
    assert len(texts) == 80, texts
    assert overlaps == 0
    for i in range(0, 80, 2):
        assert texts[i].startswith("q ") and texts[i + 1] == "a " + texts[i][2:], texts[i : i + 2]
    for w in range(4):
        mine = [t for t in texts if t.startswith(f"q w{w}-")]
        assert mine == [f"q w{w}-t{t}" for t in range(10)]
    counts = injector.injected()
    assert sum(counts.values()) > 0 and set(counts) <= set(CONTENTION), counts


# -- a blackholed endpoint ----------------------------------------------------------------

DEADLINE = 3.0


@pytest.fixture
def blackhole_url(dynamodb_base_url: str) -> Any:
    hole = Blackhole()
    yield with_options(dynamodb_base_url, endpoint_url=hole.url, deadline=f"{DEADLINE:g}")
    hole.close()


async def test_blackhole_kv_call_fails_typed_within_the_deadline(blackhole_url: str) -> None:
    """A KV call against a peer that accepts and never answers: BackendUnavailableError
    naming the backend, within the deadline + 1 s (client creation included)."""
    kv = DynamoDBKV.from_url(blackhole_url)
    try:
        assert kv.deadline_seconds == DEADLINE
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as info:
            await kv.get("s", "k")
        assert time.monotonic() - started < DEADLINE + 1
        assert "dynamodb://" in str(info.value) and "testing" not in str(info.value).replace(
            "agent-stores-test", ""
        )
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            await kv.setup()
        assert time.monotonic() - started < DEADLINE + 1
    finally:
        await kv.aclose()


async def test_blackhole_session_turn_fails_typed_within_the_deadline(blackhole_url: str) -> None:
    """An agent's session turn against a silent endpoint: within the deadline + 1 s, the
    session store's SESSION_STORE_UNAVAILABLE caused by BackendUnavailableError (naming the
    backend), never a hang. (The core retries a transient acquire failure until the turn's
    ``timeout_seconds``; with a timeout no longer than the deadline, that is one attempt.)"""
    async with open_sessions(blackhole_url) as sessions:
        started = time.monotonic()
        with pytest.raises(TransientStoreError) as info:
            async with sessions.turn("chat", timeout_seconds=DEADLINE) as s:
                s.replace(pair("never"))
        assert time.monotonic() - started < DEADLINE + 1
        assert isinstance(info.value.__cause__, BackendUnavailableError)
        assert "dynamodb://" in str(info.value)


def test_blackhole_check_command_fails_typed_within_the_deadline(blackhole_url: str) -> None:
    """``agent-stores check URL`` in a subprocess: exits non-zero naming the unavailable
    backend within the deadline + 1 s (+ the interpreter's own start-up, measured)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    imports = "import agent_stores.cli, agent_stores_dynamodb.kv, aiobotocore.session"
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", imports], check=True, env=env, timeout=60)
    startup = time.monotonic() - started
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "agent_stores.cli", "check", blackhole_url],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "BACKEND_UNAVAILABLE" in output or "did not answer" in output, output
    assert "CONFIG_INVALID" not in output, output
    assert elapsed < DEADLINE + 1 + startup, (elapsed, startup, output)


# -- a documented rejection keeps the definite answer (issue 59) ------------------------------


@pytest.mark.parametrize(
    "fault",
    ["ThrottlingException", "ProvisionedThroughputExceededException", "RequestLimitExceeded"],
)
async def test_a_throttled_first_attempt_then_a_real_conflict_is_a_conflict(
    fault: str, kv: KVStore, injector: DynamoDBFaultInjector
) -> None:
    """botocore's ``before-send`` answers the first attempt with a throttling error, which
    AWS documents as a rejection (nothing applied); botocore re-sends, and the real server
    answers the condition. The store used to report every condition failing after a
    botocore retry as unknown (BACKEND_UNAVAILABLE); a create over an existing item, a
    replace and a delete at a stale version are conflicts (False for the delete)."""
    stale = await kv.create("t", "k", b"v0")
    current = await kv.replace("t", "k", b"v1", expected_version=stale)
    for operation in ("PutItem", "PutItem", "DeleteItem"):
        injector.arm(fault, operation=operation)
    with pytest.raises(ConflictError):
        await kv.create("t", "k", b"again")
    with pytest.raises(ConflictError):
        await kv.replace("t", "k", b"v2", expected_version=stale)
    assert await kv.delete("t", "k", expected_version=stale) is False
    assert injector.injected() == {fault: 3}
    entry = await kv.get("t", "k")
    assert entry is not None and entry.value == b"v1" and entry.version == current


@pytest.mark.parametrize("fault", ["InternalServerError", "HTTP500"])
async def test_a_500_first_attempt_then_a_failed_condition_is_unknown(
    fault: str, kv: KVStore, injector: DynamoDBFaultInjector
) -> None:
    """AWS documents that a write answered 500 may have succeeded or failed: a condition
    failing on botocore's re-send after one is not taken for a conflict (the first attempt
    may have landed and been overwritten since); the outcome is unknown."""
    await kv.create("f", "k", b"v0")
    injector.arm(fault, operation="PutItem")
    with pytest.raises(BackendUnavailableError, match="unknown"):
        await kv.create("f", "k", b"again")
    assert injector.injected() == {fault: 1}
