"""Firestore's routine faults, injected at the gRPC channel in front of Google's emulator.

Every fault of :mod:`agent_stores_firestore.faults` is injected: at a chosen call (a lost
reply on each kind of write, each transient status), and at random under the real
workloads (memory writes with receipts, journal appends, session turns). Each operation
succeeds or raises the right typed error — never a configuration error for a transient
fault — and nothing is lost or applied twice. A session shared by 4 workers under 30 %
injected ABORTED / UNAVAILABLE / RESOURCE_EXHAUSTED keeps every message in order with no two
turns at once. (A silent server behind a TCP proxy: ``test_firestore_client.py``.)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from agent_stores import BackendUnavailableError, ConfigError, open_sessions
from agent_stores.checkpointer import Checkpointer, JournalEvent, make_step_id
from agent_stores.faults import FaultInjector, FaultKind
from agent_stores.kv.base import Check, Create, Delete, KVStore, Replace
from agent_stores.memory import KVMemoryStore
from agent_stores.plugins import get_registry
from agent_stores.sessions.errors import TransientStoreError
from agent_stores.url import StoreURL
from agent_stores_firestore.faults import FAULTS, FirestoreFaultInjector
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai_harness.memory import MemoryOperation

R = TypeVar("R")

#: Faults of a request that reaches (or would reach) the server normally.
ROUTINE = sorted(f for f, kind in FAULTS.items() if kind is not FaultKind.BLACKHOLE)
TRANSIENT = ["ABORTED", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "INTERNAL"]
CONTENTION = ["ABORTED", "UNAVAILABLE", "RESOURCE_EXHAUSTED"]
LOST = ["LOST_REPLY", "LOST_REPLY_DEADLINE"]


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


def with_options(url: str, **options: str) -> StoreURL:
    return StoreURL.parse(url).with_query(**options)


@pytest_asyncio.fixture
async def injector() -> FirestoreFaultInjector:
    return FirestoreFaultInjector()


@pytest_asyncio.fixture
async def kv(firestore_url: str, injector: FirestoreFaultInjector) -> AsyncIterator[KVStore]:
    # A short per-attempt timeout: the injected BLACKHOLE waits it out.
    store = await injector.open_kv(with_options(firestore_url, timeout="2"))
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


def test_plugin_hooks_give_the_injector_and_the_proxied_url(firestore_base_url: str) -> None:
    """``fault_injector`` offers every fault with its kind; ``proxied_url`` points
    emulator_host at the proxy and keeps the rest; a URL to Google's endpoint (TLS) has no
    plain TCP proxy."""
    url = StoreURL.parse(firestore_base_url)
    hooks = get_registry().hook
    made = hooks.fault_injector(url=url)
    assert isinstance(made, FirestoreFaultInjector) and isinstance(made, FaultInjector)
    assert set(made.faults) == set(FAULTS)
    assert set(made.faults.values()) == {
        FaultKind.TRANSIENT,
        FaultKind.CONFLICT,
        FaultKind.RESET,
        FaultKind.LOST_REPLY,
        FaultKind.BLACKHOLE,
    }
    proxied = hooks.proxied_url(url=url, host="127.0.0.1", port=4242)
    assert proxied is not None and proxied.query_get("emulator_host") == "127.0.0.1:4242"
    assert proxied.query_get("prefix") == url.query_get("prefix")
    real = StoreURL.parse("firestore://my-project/agent-stores")
    assert hooks.proxied_url(url=real, host="127.0.0.1", port=4242) is None
    other = hooks.fault_injector(url=StoreURL.parse("memory://x"))
    assert not isinstance(other, FirestoreFaultInjector)


# -- one fault at one chosen call ---------------------------------------------------------


@pytest.mark.parametrize("fault", ROUTINE)
async def test_one_fault_at_a_chosen_call_is_survived(
    fault: str, kv: KVStore, injector: FirestoreFaultInjector
) -> None:
    """One injected fault on a replace, a commit (no create in it) and each read (get,
    scan): every call succeeds (retried; a lost reply recognised as our own write by its
    nonce) and writes once."""
    reads = 0 if fault in LOST else 2
    version = await kv.create("s", "k", b"v1")
    await kv.create("s", "old", b"o")
    injector.arm(fault, times=2, operation="Commit")
    version = await kv.replace("s", "k", b"v2", expected_version=version)
    versions = await kv.commit(
        "s", [Check("absent", None), Delete("old"), Replace("k", b"v3", version)]
    )
    if reads:
        injector.arm(fault, operation="BatchGetDocuments")
        injector.arm(fault, operation="RunQuery")
    entry = await kv.get("s", "k")
    assert entry is not None and entry.value == b"v3" and entry.version == versions[2]
    assert [i.key for i in await kv.scan("s")] == ["k"]
    assert injector.injected() == {fault: 2 + reads}


#: Faults after which a create may or may not have landed (the store cannot tell).
AMBIGUOUS = ["DEADLINE_EXCEEDED", "INTERNAL", "RESET", "UNAVAILABLE", *LOST]


@pytest.mark.parametrize("fault", ROUTINE)
async def test_one_fault_on_a_create(
    fault: str, kv: KVStore, injector: FirestoreFaultInjector
) -> None:
    """A create is never sent twice blindly (if it landed and was deleted since, a second
    send would apply it again): after a fault that may follow a landed write it reads back.
    Its own nonce: success. Nothing there: "may or may not have been applied" (typed), and
    the entry is what the server really holds. Faults that say nothing was applied: retried."""
    for ops in ([Create("k", b"v")], [Create("c1", b"1"), Create("c2", b"2")]):
        injector.arm(fault, operation="Commit")
        failure: BackendUnavailableError | None = None
        try:
            if len(ops) == 1:
                written = [await kv.create("s", ops[0].key, b"v")]
            else:
                written = await kv.commit("s", list(ops))
        except BackendUnavailableError as exc:
            failure = exc
        if failure is not None:
            assert fault in AMBIGUOUS and fault not in LOST, fault
            assert "may or may not" in str(failure) and failure.__cause__ is not None
            for op in ops:  # the injected fault stopped the request: nothing landed
                assert await kv.get("s", op.key) is None
            continue
        for op, version in zip(ops, written, strict=True):
            entry = await kv.get("s", op.key)
            assert entry is not None and entry.version == version
    assert injector.injected() == {fault: 2}


async def test_lost_reply_of_a_create_is_our_own_write(
    kv: KVStore, injector: FirestoreFaultInjector
) -> None:
    """The create was applied; its retry meets ALREADY_EXISTS and finds its own nonce."""
    injector.arm("LOST_REPLY", operation="Commit")
    version = await kv.create("s", "k", b"v")
    assert injector.injected() == {"LOST_REPLY": 1}
    entry = await kv.get("s", "k")
    assert entry is not None and entry.version == version and entry.value == b"v"


async def test_lost_reply_of_a_conditional_delete_is_reported_unknown(
    kv: KVStore, injector: FirestoreFaultInjector
) -> None:
    """A deleted document carries no nonce: when the retry of a lost delete finds the
    document gone, the store cannot tell whose delete it was, and says so (typed)."""
    version = await kv.create("s", "k", b"v")
    injector.arm("LOST_REPLY", operation="Commit")
    with pytest.raises(BackendUnavailableError, match="may or may not"):
        await kv.delete("s", "k", expected_version=version)
    assert await kv.get("s", "k") is None


async def test_commit_of_only_deletes_whose_reply_was_lost(
    kv: KVStore, injector: FirestoreFaultInjector
) -> None:
    """No nonce to find either: the outcome is reported unknown, and the delete did land."""
    a = await kv.create("s", "a", b"1")
    injector.arm("LOST_REPLY_DEADLINE", operation="Commit")
    with pytest.raises(BackendUnavailableError, match="may or may not"):
        await kv.commit("s", [Delete("a", a)])
    assert await kv.get("s", "a") is None


@pytest.mark.parametrize("fault", ["ABORTED", "RESOURCE_EXHAUSTED", "INTERNAL"])
async def test_a_fault_that_never_stops_is_backend_unavailable(
    fault: str, firestore_url: str, injector: FirestoreFaultInjector
) -> None:
    """A fault that never stops ends as BackendUnavailableError naming the status (cause
    kept, nothing written), within the deadline; never ConfigError."""
    kv = await injector.open_kv(with_options(firestore_url, deadline="3"))
    try:
        await kv.setup()
        injector.arm(fault, times=10_000, operation="Commit")
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as info:
            await kv.create("s", "k", b"v")
        assert time.monotonic() - started < 3 + 1
        assert not isinstance(info.value, ConfigError)
        assert info.value.__cause__ is not None
        assert type(info.value.__cause__).__name__ in str(info.value)
        injector.disarm()
        assert await kv.get("s", "k") is None
    finally:
        await kv.aclose()


async def test_blackholed_request_is_retried_after_its_timeout(
    firestore_url: str, injector: FirestoreFaultInjector
) -> None:
    """One request that never gets an answer: its gRPC timeout (timeout=, capped by the
    deadline) ends it, the store retries on a fresh channel and the call succeeds."""
    kv = await injector.open_kv(with_options(firestore_url, deadline="5", timeout="1"))
    try:
        await kv.setup()
        version = await kv.create("s", "k", b"v")
        injector.arm("BLACKHOLE", operation="Commit")
        await kv.replace("s", "k", b"w", expected_version=version)
        injector.arm("BLACKHOLE", operation="BatchGetDocuments")
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"w"
        assert injector.injected() == {"BLACKHOLE": 2}
    finally:
        await kv.aclose()


async def test_a_blackhole_ends_within_the_deadline(
    firestore_url: str, injector: FirestoreFaultInjector
) -> None:
    kv = await injector.open_kv(with_options(firestore_url, deadline="3"))
    try:
        await kv.setup()
        injector.arm("BLACKHOLE", times=10_000)
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            await kv.get("s", "k")
        assert time.monotonic() - started < 3 + 1
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
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
async def test_workloads_under_every_fault(
    workload: str, kv: KVStore, injector: FirestoreFaultInjector
) -> None:
    """Memory writes with receipts, journal appends and session turns at a 25 % fault rate
    over every routine fault, after each fault armed once: every operation succeeds or
    raises the typed transient error (then retried as an application would), never
    ConfigError; nothing lost or applied twice."""
    for fault in ROUTINE:
        injector.arm(fault, operation="Commit" if fault in LOST else None)
    injector.set_rate(0.25, ROUTINE, seed=22)
    outcomes: Counter[str] = Counter()
    await WORKLOADS[workload](kv, outcomes)
    assert outcomes["ok"] > 0, outcomes
    injector.disarm()
    counts = injector.injected()
    assert set(counts) == set(ROUTINE), counts
    assert not outcomes.keys() - {"ok", "BackendUnavailableError", "TransientStoreError"}


@pytest.mark.parametrize("pad", [0, 20_000])
async def test_lost_reply_on_session_saves(
    pad: int, kv: KVStore, injector: FirestoreFaultInjector
) -> None:
    """A lost reply on the first commit of every turn (with 20 KB messages each save also
    writes a new history chunk). Every turn is saved once and the session stays readable."""
    turns = 6
    outcomes: Counter[str] = Counter()
    async with open_sessions(kv) as sessions:
        for t in range(turns):
            injector.arm("LOST_REPLY", operation="Commit")

            async def turn(t: int = t) -> None:
                async with sessions.turn("chat", timeout_seconds=30) as s:
                    if f"q t{t}" not in {prompt_of(m) for m in s.messages}:
                        s.replace([*s.messages, *pair(f"t{t}", pad=pad)])

            await until_done(turn, outcomes)
        history = await sessions.read_messages("chat")
        info = await sessions.inspect("chat")
    assert injector.injected().get("LOST_REPLY", 0) >= turns - 1, injector.injected()
    assert history is not None and info is not None
    assert [prompt_of(m) for m in history] == [
        text for t in range(turns) for text in (f"q t{t}", f"a t{t}")
    ]


# -- contention: 4 workers x 10 turns on one session --------------------------------------


@pytest.mark.timeout(600)
async def test_four_workers_share_a_session_under_conflicts_and_throttling(
    firestore_url: str, injector: FirestoreFaultInjector
) -> None:
    """4 workers (each its own client and session store) x 10 turns on one session, 30 %
    of requests faulted with ABORTED, UNAVAILABLE and RESOURCE_EXHAUSTED: 80 messages, each
    worker's turns in order, each turn's pair adjacent, and never two turns at once."""
    injector.set_rate(0.3, CONTENTION, seed=4)
    active = 0
    overlaps = 0
    outcomes: Counter[str] = Counter()

    async def worker(w: int) -> None:
        nonlocal active, overlaps
        kv = await injector.open_kv(StoreURL.parse(firestore_url))
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
    async with open_sessions(firestore_url) as sessions:
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
