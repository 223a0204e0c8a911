"""Azure's routine faults, injected at the azure-core transport in front of the real test server.

Every fault of :class:`agent_stores_cosmos.faults.CosmosFaultInjector` is injected while
memory writes with receipts, journal appends and session turns run: each operation
succeeds or raises the right typed error, and nothing is lost, applied twice or left
corrupt. Then: 4 workers x 10 turns on one session under 30 % throttling / 449 / 503; a
blackholed endpoint fails typed within the deadline (KV call, agent turn, the CLI);
nothing billable is created implicitly; the container's TTL and the account's
consistency and write regions are checked at open.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import pytest
from agent_stores import BackendUnavailableError, ConfigError, StoreURL, open_kv, open_sessions
from agent_stores.checkpointer import Checkpointer
from agent_stores.checkpointer.types import JournalEvent
from agent_stores.faults import FaultInjector, FaultKind
from agent_stores.kv.base import KVStore
from agent_stores.memory import KVMemoryStore
from agent_stores.sessions import SessionStore
from agent_stores.sessions.errors import TransientStoreError
from agent_stores_contract.proxy import TCPProxy
from agent_stores_contract.session_workers import pair, texts
from agent_stores_cosmos import plugin
from agent_stores_cosmos.faults import FAULTS, CosmosFaultInjector, FaultTransport, _FaultResponse
from agent_stores_cosmos.kv import ContainerMissingError, CosmosKV
from cosmos_test_support import REPO_ROOT

T = TypeVar("T")

#: What an operation may raise when a fault's retry budget runs out or its outcome is
#: unknown: the typed "unavailable" errors (never a conflict, a configuration error, a
#: lost lease or a damaged session).
TYPED = (BackendUnavailableError, TransientStoreError)


def _url(base: str, **options: str) -> str:
    return StoreURL.parse(base).with_query(**options).render_with_secrets()


async def _retrying(call: Callable[[], Awaitable[T]], failures: list[BaseException]) -> T:
    """``call`` until it succeeds; each failure must be typed (and is recorded)."""
    for _ in range(6):
        try:
            return await call()
        except TYPED as exc:
            failures.append(exc)
    raise AssertionError(f"still failing after 6 tries: {failures[-3:]!r}")


@pytest.fixture
async def injector() -> CosmosFaultInjector:
    return CosmosFaultInjector(retry_after_ms=20)


@pytest.fixture
async def faulty_kv(injector: CosmosFaultInjector, cosmos_url: str) -> AsyncIterator[KVStore]:
    kv = await injector.open_kv(StoreURL.parse(_url(cosmos_url, deadline="20")))
    async with kv:
        await kv.setup()
        yield kv


# -- the hooks ------------------------------------------------------------------------------


def test_plugin_hooks(cosmos_url: str) -> None:
    """fault_injector and proxied_url answer for cosmos:// only; every fault has its kind."""
    url = StoreURL.parse(cosmos_url)
    found = plugin.fault_injector(url)
    assert isinstance(found, FaultInjector) and isinstance(found, CosmosFaultInjector)
    assert set(found.faults) == {
        "429",
        "449",
        "408",
        "410",
        "500",
        "503",
        "reset",
        "lost_reply",
        "stale_read",
        "blackhole",
    }
    assert found.faults["lost_reply"] is FaultKind.LOST_REPLY
    assert found.faults["449"] is FaultKind.CONFLICT
    other = StoreURL.parse("redis://localhost:6379/0")
    assert plugin.fault_injector(other) is None
    assert plugin.proxied_url(other, "127.0.0.1", 1) is None
    proxied = plugin.proxied_url(url, "127.0.0.1", 4242)
    assert proxied is not None and proxied.port == 4242 and proxied.host == "127.0.0.1"
    assert proxied.query_get("endpoint_discovery") == "false"
    assert proxied.path == url.path and proxied.query_get("key") == url.query_get("key")


async def test_proxied_url_reaches_the_server(cosmos_url: str) -> None:
    """Through a plain TCP proxy at the rewritten URL, the store works."""
    url = StoreURL.parse(cosmos_url)
    assert url.port is not None
    upstream = url.port

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        proxied = plugin.proxied_url(url, "127.0.0.1", port)
        assert proxied is not None
        async with open_kv(proxied.render_with_secrets()) as kv:
            version = await kv.create("proxied", "k", b"v")
            entry = await kv.get("proxied", "k")
            assert entry is not None and entry.version == version
    finally:
        server.close()


# -- every fault under the three workloads ---------------------------------------------------


async def _memory_writes(
    kv: KVStore, arm: Callable[[], None], settle: Callable[[], None], failures: list[BaseException]
) -> None:
    """Four writes with receipts; a failed write is retried with the same operation id.

    A stale read can make the store see an older version than the caller expects: that is
    a conflict (typed, nothing written), after which a fresh read gives the version again.
    """
    from pydantic_ai_harness.memory import MemoryConflictError, MemoryOperation

    memory = KVMemoryStore(kv)
    path = f"faults/{uuid.uuid4().hex[:8]}/notes.md"
    version: str | None = None
    for i in range(4):
        operation = MemoryOperation(id=f"op-{uuid.uuid4().hex}", fingerprint=f"fp{i}")
        arm()
        expected = version
        write = functools.partial(
            memory.write, path, f"note {i}\n", expected_version=expected, operation=operation
        )
        try:
            mutation = await _retrying(write, failures)
        except MemoryConflictError as exc:
            failures.append(exc)
            settle()
            current = await memory.read(path, max_chars=1000)
            assert (current.version if current else None) == expected, "a write was lost"
            mutation = await _retrying(write, failures)
        version = mutation.version
        again = await memory.get_operation(operation)
        assert again is not None and again.version == version, "receipt not applied once"
    settle()
    found = await memory.read(path, max_chars=1000)
    assert found is not None and found.content == "note 3\n"


async def _journal_appends(
    kv: KVStore, arm: Callable[[], None], settle: Callable[[], None], failures: list[BaseException]
) -> None:
    """Six appends; a failed one is re-sent; each step is in the journal once, in order."""
    journal = Checkpointer(kv)
    run_id = f"faults-{uuid.uuid4().hex[:8]}"
    for i in range(6):
        arm()
        event = JournalEvent(step_id=f"step-{i}", payload={"i": i})
        await _retrying(functools.partial(journal.append, run_id, event), failures)
    settle()
    state = await journal.load(run_id)
    assert [e.step_id for e in state.entries] == [f"step-{i}" for i in range(6)]


async def _session_turns(
    kv: KVStore, arm: Callable[[], None], settle: Callable[[], None], failures: list[BaseException]
) -> None:
    """Five turns on one session: every turn reported saved is in the history once, in
    order; a turn that failed (typed) is there at most once, in its place."""
    sessions = SessionStore(kv)
    sid = f"faults-{uuid.uuid4().hex[:8]}"
    saved: list[str] = []
    tried: list[str] = []
    for i in range(5):
        tag = f"t{i}"
        arm()
        tried.append(tag)
        try:
            async with sessions.turn(sid, timeout_seconds=60) as session:
                session.replace([*session.messages, *pair(tag)])
        except TYPED as exc:
            failures.append(exc)
            continue
        saved.append(tag)
    settle()
    history = texts(await _retrying(lambda: sessions.read_messages(sid), failures) or [])
    tags = [t[2:] for t in history[::2]]
    assert history == [x for t in tags for x in (f"q:{t}", f"a:{t}")], history
    assert len(set(tags)) == len(tags), f"a turn was applied twice: {tags}"
    assert [t for t in tags if t in saved] == saved, f"a saved turn is missing: {tags} {saved}"
    assert tags == [t for t in tried if t in tags], f"turns out of order: {tags}"


WORKLOADS = {"memory": _memory_writes, "journal": _journal_appends, "sessions": _session_turns}


#: Journal appends make no point read of an item that has a previous version (they only
#: create), so there is no read a stale replica could answer differently.
_NOT_APPLICABLE = {("stale_read", "journal")}


@pytest.mark.parametrize(
    ("fault", "workload"),
    [
        pytest.param(f, w, id=f"{f}-{w}")
        for f in sorted(set(FAULTS) - {"blackhole"})
        for w in WORKLOADS
        if (f, w) not in _NOT_APPLICABLE
    ],
)
async def test_each_fault_under_each_workload(
    injector: CosmosFaultInjector, faulty_kv: KVStore, fault: str, workload: str
) -> None:
    """The fault, armed before every operation (twice): typed outcomes only, no damage."""
    operation = {"lost_reply": "write"}.get(fault)

    def arm() -> None:
        injector.arm(fault, times=2, operation=operation)

    from pydantic_ai_harness.memory import MemoryConflictError

    failures: list[BaseException] = []
    await WORKLOADS[workload](faulty_kv, arm, injector.disarm, failures)
    injector.disarm()
    assert injector.injected().get(fault, 0) >= 2, injector.injected()
    for exc in failures:
        stale_conflict = fault == "stale_read" and isinstance(exc, MemoryConflictError)
        assert isinstance(exc, TYPED) or stale_conflict, repr(exc)


@pytest.mark.parametrize("workload", list(WORKLOADS))
async def test_every_fault_at_a_20_percent_rate(
    injector: CosmosFaultInjector, faulty_kv: KVStore, workload: str
) -> None:
    """All faults but the blackhole, mixed, on 20 % of requests: typed outcomes, no damage."""
    from pydantic_ai_harness.memory import MemoryConflictError

    failures: list[BaseException] = []
    try:
        for seed in range(3):
            injector.set_rate(0.2, seed=seed)
            await WORKLOADS[workload](faulty_kv, lambda: None, injector.disarm, failures)
    finally:
        injector.disarm()
    assert sum(injector.injected().values()) >= 3, injector.injected()
    for exc in failures:
        assert isinstance(exc, (*TYPED, MemoryConflictError)), repr(exc)


#: Faults after which a request may have been applied (a reply lost, 408, 500, a broken
#: connection): a create is not sent again after one (see ``test_a_create_is_never_applied_twice``).
MAYBE_APPLIED_FAULTS = ("408", "500", "reset")


async def create_through(
    injector: CosmosFaultInjector, kv: KVStore, fault: str, scope: str, key: str, value: bytes
) -> None:
    """``kv.create`` with ``fault`` injected twice first: retried away, or, for a fault after
    which the first attempt may have landed, reported unknown (it had not: the injector
    answers before sending) and then created without faults."""
    injector.arm(fault, times=2)
    if fault not in MAYBE_APPLIED_FAULTS:
        await kv.create(scope, key, value)
        return
    with pytest.raises(BackendUnavailableError, match="unknown"):
        await kv.create(scope, key, value)
    await kv.create(scope, key, value)


async def test_transient_faults_are_retried_on_every_operation(
    injector: CosmosFaultInjector, faulty_kv: KVStore
) -> None:
    """Each transient status, injected twice before each KV primitive, is retried away
    (a create under a fault after which it may have been applied reads what is stored
    instead, and says its outcome is unknown when it finds nothing)."""
    kv = faulty_kv
    scope = f"prims-{uuid.uuid4().hex[:8]}"
    for fault in ("429", "449", "408", "410", "500", "503", "reset"):
        key = f"k{fault}"
        await create_through(injector, kv, fault, scope, key, b"1")
        calls: list[Callable[[], Awaitable[Any]]] = [
            functools.partial(kv.get, scope, key),
            functools.partial(kv.get_many, scope, [key]),
            functools.partial(kv.scan, scope),
        ]
        for call in calls:
            injector.arm(fault, times=2)
            await call()
        entry = await kv.get(scope, key)
        assert entry is not None
        injector.arm(fault, times=2)
        version = await kv.replace(scope, key, b"2", expected_version=entry.version)
        injector.arm(fault, times=2)
        assert await kv.delete(scope, key, expected_version=version)
        await create_through(injector, kv, fault, scope, key, b"3")
        injector.arm(fault, times=2)
        assert await kv.delete(scope, key)
        injector.arm(fault, times=2)
        await kv.scopes(prefix=scope)
    injector.arm("429", times=2)
    assert await kv.drop_scope(scope) == 0
    # Every fault was injected and survived (the SDK's query pipeline handles some 410s
    # itself: it refreshes its partition map and re-runs the query).
    assert injector.injected() == {
        f: 9 * 2 for f in ("429", "449", "408", "410", "500", "503", "reset")
    } | {"429": 9 * 2 + 2}
    assert isinstance(kv, CosmosKV)
    assert sum(kv.stats.retries.values()) >= 100


async def test_lost_replies_on_writes_are_recognised(
    injector: CosmosFaultInjector, faulty_kv: KVStore
) -> None:
    """A create or replace applied but unanswered: the store's re-send meets its own write
    (409 / 412), finds its write token, and returns the version it wrote."""
    kv = faulty_kv
    scope = f"lost-{uuid.uuid4().hex[:8]}"
    injector.arm("lost_reply", operation="write")
    version = await kv.create(scope, "k", b"1")
    entry = await kv.get(scope, "k")
    assert entry is not None and entry.version == version and entry.value == b"1"
    injector.arm("lost_reply", operation="write")
    newer = await kv.replace(scope, "k", b"2", expected_version=version)
    entry = await kv.get(scope, "k")
    assert entry is not None and entry.version == newer and entry.value == b"2"
    assert injector.injected()["lost_reply"] == 2
    # A delete leaves nothing to recognise: its re-send finds the item gone, and the store
    # says the outcome is unknown instead of guessing.
    injector.arm("lost_reply", operation="write")
    with pytest.raises(BackendUnavailableError, match="unknown"):
        await kv.delete(scope, "k", expected_version=newer)
    assert await kv.get(scope, "k") is None


def applied_once(injector: CosmosFaultInjector, method: str) -> asyncio.Event:
    """An event set when the server has answered the next ``method`` request (whatever
    the client is told next: a lost reply leaves it applied and unanswered)."""
    original = injector.observe
    applied = asyncio.Event()

    def observe_then_signal(request: Any, item: Any, response: Any) -> None:
        original(request, item, response)
        if str(request.method) == method:
            injector.observe = original  # type: ignore[method-assign]
            applied.set()

    injector.observe = observe_then_signal  # type: ignore[method-assign]
    return applied


async def test_lost_reply_then_another_writer_is_unknown_not_a_conflict(
    injector: CosmosFaultInjector,
    faulty_kv: KVStore,
    cosmos_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our replace is applied, its reply lost, and another client writes before the
    re-send: the re-send meets 412 with someone else's item. Whether ours was applied is
    unknown to the store: it says so (BackendUnavailableError), never "conflict"."""
    kv = faulty_kv
    scope = f"lost2-{uuid.uuid4().hex[:8]}"
    # Time for the other client to write before the store re-sends.
    monkeypatch.setattr(CosmosKV, "_delay", staticmethod(lambda exc, attempt: 0.5))
    version = await kv.create(scope, "k", b"1")
    other = open_kv(cosmos_url)
    async with other:
        applied = applied_once(injector, "PUT")
        injector.arm("lost_reply", operation="write")
        task = asyncio.ensure_future(kv.replace(scope, "k", b"ours", expected_version=version))
        await applied.wait()
        entry = await other.get(scope, "k")
        assert entry is not None and entry.value == b"ours"
        await other.replace(scope, "k", b"theirs", expected_version=entry.version)
        with pytest.raises(BackendUnavailableError, match="unknown"):
            await task


async def test_a_create_is_never_applied_twice(
    injector: CosmosFaultInjector, faulty_kv: KVStore, cosmos_url: str
) -> None:
    """Our create is applied, its reply lost, and another client deletes the item before
    the store looks: the store does not send the create again (it would land a second
    time, bringing back what the other client deleted); it says the outcome is unknown,
    and the item stays deleted. (Seen in the contract's linearizability run under faults.)"""
    kv = faulty_kv
    scope = f"twice-{uuid.uuid4().hex[:8]}"
    other = open_kv(cosmos_url)
    async with other:
        applied = applied_once(injector, "POST")
        injector.arm("lost_reply", operation="write")
        blocked = asyncio.Event()
        read = CosmosKV._read_item

        async def read_after_the_delete(self: CosmosKV, scope: str, key: str) -> Any:
            await blocked.wait()
            return await read(self, scope, key)

        with pytest.MonkeyPatch.context() as patch:
            # This client's reads only: the other client's delete reads first too.
            patch.setattr(kv, "_read_item", functools.partial(read_after_the_delete, kv))
            task = asyncio.ensure_future(kv.create(scope, "k", b"ours"))
            await applied.wait()
            assert await other.delete(scope, "k")
            blocked.set()
            with pytest.raises(BackendUnavailableError, match="unknown"):
                await task
        assert await other.get(scope, "k") is None


async def test_stale_read_serves_the_previous_version(
    injector: CosmosFaultInjector, faulty_kv: KVStore
) -> None:
    """An armed stale read returns the item's previous body and ETag; a CAS on it conflicts."""
    from agent_stores import ConflictError

    kv = faulty_kv
    scope = f"stale-{uuid.uuid4().hex[:8]}"
    first = await kv.create(scope, "k", b"1")
    second = await kv.replace(scope, "k", b"2", expected_version=first)
    injector.arm("stale_read", operation="read")
    stale = await kv.get(scope, "k")
    assert stale is not None and stale.value == b"1" and stale.version == first
    with pytest.raises(ConflictError):
        await kv.replace(scope, "k", b"3", expected_version=stale.version)
    fresh = await kv.get(scope, "k")
    assert fresh is not None and fresh.version == second


async def test_exhausted_budget_is_backend_unavailable_with_cause(
    injector: CosmosFaultInjector, cosmos_url: str
) -> None:
    """A fault that never stops: BackendUnavailableError (cause kept) — never ConfigError."""
    kv = await injector.open_kv(StoreURL.parse(_url(cosmos_url, retries="3")))
    async with kv:
        await kv.setup()
        for fault in ("449", "410", "503", "500", "408", "reset"):
            injector.arm(fault, times=4)
            with pytest.raises(BackendUnavailableError) as info:
                await kv.get("exhausted", "k")
            assert not isinstance(info.value, ConfigError)
            assert info.value.__cause__ is not None
            assert "4 attempts" in str(info.value)
            injector.disarm()


# -- 4 workers x 10 turns under 30 % faults -------------------------------------------------


async def test_4_workers_10_turns_under_30_percent_faults(
    injector: CosmosFaultInjector, cosmos_url: str
) -> None:
    """4 clients x 10 turns on one session, 30 % of requests answered 429, 449 or 503:
    80 messages, in turn order, and no two turns overlapped."""
    url = StoreURL.parse(cosmos_url)
    kvs = [await injector.open_kv(url) for _ in range(4)]
    stores = [SessionStore(kv, lease_seconds=10) for kv in kvs]
    await kvs[0].setup()
    sid = f"hot-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()
    intervals: list[tuple[float, float, str]] = []
    injector.set_rate(0.3, ["429", "449", "503"], seed=22)

    async def worker(n: int) -> None:
        for i in range(10):
            async with stores[n].turn(sid, timeout_seconds=120) as session:
                start = loop.time()
                await asyncio.sleep(0)
                session.replace([*session.messages, *pair(f"w{n}-{i}")])
                intervals.append((start, loop.time(), f"w{n}-{i}"))

    try:
        await asyncio.gather(*(worker(n) for n in range(4)))
    finally:
        injector.disarm()
    intervals.sort()
    for (_, end, a), (start, _, b) in itertools.pairwise(intervals):
        assert end <= start, f"turns {a} and {b} overlapped"
    history = texts(await stores[0].read_messages(sid) or [])
    assert len(history) == 80
    assert history == [x for *_, tag in intervals for x in (f"q:{tag}", f"a:{tag}")]
    injected = injector.injected()
    assert all(injected.get(f, 0) > 0 for f in ("429", "449", "503")), injected
    for store in stores:
        await store.aclose()
    for kv in kvs:
        await kv.aclose()


# -- a blackholed endpoint -------------------------------------------------------------------


class Blackhole:
    """A TCP server that accepts connections and never answers (nor closes them)."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def _hold(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._held.append(writer)

    async def __aenter__(self) -> Blackhole:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for writer in self._held:
            writer.close()
        if self._server is not None:
            self._server.close()


DEADLINE = 3.0


def _blackholed(cosmos_url: str, port: int) -> str:
    url = StoreURL.parse(cosmos_url).set(port=port)
    return url.with_query(deadline=f"{DEADLINE:g}", timeout="1").render_with_secrets()


async def test_blackhole_kv_call_fails_typed_within_the_deadline(cosmos_url: str) -> None:
    """get, create and setup against a silent peer: BackendUnavailableError naming cosmos
    and the host, each within deadline + 1 s."""
    async with Blackhole() as hole:
        kv = open_kv(_blackholed(cosmos_url, hole.port))
        async with kv:
            for call in (
                lambda: kv.get("s", "k"),
                lambda: kv.create("s", "k", b"v"),
                lambda: kv.setup(),
            ):
                started = time.monotonic()
                with pytest.raises(BackendUnavailableError) as info:
                    await call()
                took = time.monotonic() - started
                assert took <= DEADLINE + 1, took
                assert "cosmos" in str(info.value) and "127.0.0.1" in str(info.value)


async def test_blackhole_fault_is_survived_then_bounded(
    injector: CosmosFaultInjector, cosmos_url: str
) -> None:
    """One injected blackhole: the request times out (?timeout=) and is retried (a read:
    a create whose request may have been applied reads instead, see
    ``test_a_create_is_never_applied_twice``); a peer that stays silent:
    BackendUnavailableError within deadline + 1 s."""
    kv = await injector.open_kv(StoreURL.parse(_url(cosmos_url, timeout="1", deadline="3")))
    async with kv:
        await kv.setup()
        version = await kv.create("bh", "k", b"v")
        injector.arm("blackhole")
        entry = await kv.get("bh", "k")
        assert entry is not None and entry.version == version
        injector.arm("blackhole", times=100)
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError):
            await kv.get("bh", "k")
        assert time.monotonic() - started <= 3 + 1
        injector.disarm()


async def test_blackhole_agent_turn_fails_typed_within_the_deadline(cosmos_url: str) -> None:
    """An agent turn against a silent peer: a typed error within deadline + 1 s.

    The turn waits at most 1 s for its session: the core retries a transient acquire
    until ``timeout_seconds``, each attempt bounded by the deadline, so a longer wait
    adds attempts (``timeout_seconds`` + deadline in all; see the report of issue 22).
    """
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    agent = Agent(TestModel())
    async with Blackhole() as hole:

        async def turn() -> None:
            async with (
                open_sessions(_blackholed(cosmos_url, hole.port)) as sessions,
                sessions.turn("user:42", timeout_seconds=1) as session,
            ):
                result = await agent.run("hello", message_history=session.messages)
                session.replace(result.all_messages())

        started = time.monotonic()
        with pytest.raises(TYPED):
            await turn()
        took = time.monotonic() - started
        assert took <= DEADLINE + 1, took


async def test_blackhole_cli_check_fails_typed(cosmos_url: str) -> None:
    """`agent-stores check URL` in a subprocess against a silent peer: exits non-zero with
    BACKEND_UNAVAILABLE naming cosmos and the host, never the key; bounded by the deadline
    (its setup, then its cleanup's drop_scope: two calls, see the report)."""
    async with Blackhole() as hole:
        url = _blackholed(cosmos_url, hole.port)
        env = dict(os.environ)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent_stores.cli",
            "check",
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=REPO_ROOT,
        )
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        took = time.monotonic() - started
    text = out.decode() + err.decode()
    assert proc.returncode != 0, text
    assert "BACKEND_UNAVAILABLE" in text and "127.0.0.1" in text, text
    key = StoreURL.parse(cosmos_url).query_get("key")
    assert key and key not in text
    # Interpreter start-up, then at most two deadline-bounded calls (setup, drop_scope).
    assert took <= 2 * DEADLINE + 1 + 15, took


# -- nothing billable created implicitly; the container and account are checked ------------


def _renamed(cosmos_url: str, database: str, container: str, **options: str) -> str:
    url = StoreURL.parse(cosmos_url).set(path=f"/{database}/{container}")
    return url.with_query(**options).render_with_secrets()


async def _database_ids(cosmos_url: str) -> set[str]:
    kv = CosmosKV.from_url(cosmos_url)
    settings = kv._settings
    assert settings is not None
    from azure.cosmos.aio import CosmosClient

    async with CosmosClient(
        settings.endpoint, credential=settings.key, enable_endpoint_discovery=False
    ) as client:
        return {str(d["id"]) async for d in client.list_databases()}


async def test_no_database_is_created_implicitly(cosmos_url: str) -> None:
    """A typo in the database name: a typed error naming `agent-stores setup URL`, on a KV
    call and on a session turn; the database is not created. auto_setup=true creates it."""
    name = f"typo-{uuid.uuid4().hex[:8]}"
    url = _renamed(cosmos_url, name, "kv")
    async with open_kv(url) as kv:
        assert kv.auto_setup is False
        with pytest.raises(ContainerMissingError, match="agent-stores setup URL") as info:
            await kv.get("s", "k")
        assert isinstance(info.value, ConfigError)
    with pytest.raises(Exception, match="agent-stores setup URL"):
        async with open_sessions(url) as sessions, sessions.turn("user:1") as session:
            session.replace([*session.messages, *pair("x")])
    assert name not in await _database_ids(cosmos_url)
    async with open_kv(_renamed(cosmos_url, name, "kv", auto_setup="true")) as kv:
        assert kv.auto_setup is True
        await kv.create("s", "k", b"v")
    assert name in await _database_ids(cosmos_url)
    # setup creates them too (idempotent); create=false makes setup only check.
    other = f"typo-{uuid.uuid4().hex[:8]}"
    async with open_kv(_renamed(cosmos_url, other, "kv", create="false")) as kv:
        with pytest.raises(ContainerMissingError):
            await kv.setup()
    async with open_kv(_renamed(cosmos_url, other, "kv")) as kv:
        await kv.setup()
        await kv.setup()
        await kv.create("s", "k", b"v")


@pytest.mark.parametrize(("ttl", "message"), [(None, "Time to Live is off"), (60, "defaultTtl")])
async def test_container_ttl_is_checked(cosmos_url: str, ttl: int | None, message: str) -> None:
    """TTL off, or defaultTtl = 60: a ConfigError at open saying how to set defaultTtl = -1."""
    from azure.cosmos import PartitionKey
    from azure.cosmos.aio import CosmosClient

    settings = CosmosKV.from_url(cosmos_url)._settings
    assert settings is not None
    name = f"ttl-{uuid.uuid4().hex[:8]}"
    async with CosmosClient(
        settings.endpoint, credential=settings.key, enable_endpoint_discovery=False
    ) as client:
        database = client.get_database_client(settings.database)
        extra: dict[str, Any] = {} if ttl is None else {"default_ttl": ttl}
        await database.create_container(name, partition_key=PartitionKey(path="/pk"), **extra)
        try:
            async with open_kv(_renamed(cosmos_url, settings.database, name)) as kv:
                for call in (lambda: kv.get("s", "k"), lambda: kv.setup()):
                    with pytest.raises(ConfigError, match=message) as info:
                        await call()
                    assert "-1" in str(info.value)
        finally:
            await database.delete_container(name)


class _AccountRewriter(FaultTransport):
    """A transport that edits the account document (GET /) the server returns."""

    def __init__(self, changes: Mapping[str, Any]) -> None:
        super().__init__(CosmosFaultInjector())
        self.changes = dict(changes)

    async def send(self, request: Any, **kwargs: Any) -> Any:
        from urllib.parse import urlsplit

        response = await self.inner.send(request, **kwargs)
        if request.method == "GET" and urlsplit(str(request.url)).path in ("", "/"):
            account = json.loads(response.body())
            account.update(self.changes)
            headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
            return _FaultResponse(request, 200, headers, json.dumps(account).encode())
        return response


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"userConsistencyPolicy": {"defaultConsistencyLevel": "Eventual"}}, "Eventual"),
        (
            {"userConsistencyPolicy": {"defaultConsistencyLevel": "ConsistentPrefix"}},
            "ConsistentPrefix",
        ),
        (
            {
                "enableMultipleWriteLocations": True,
                "writableLocations": [
                    {"name": "West Europe", "databaseAccountEndpoint": "http://127.0.0.1:1/"},
                    {"name": "East US", "databaseAccountEndpoint": "http://127.0.0.1:2/"},
                ],
            },
            "several regions",
        ),
    ],
    ids=["eventual", "consistent-prefix", "multi-region-writes"],
)
async def test_account_consistency_and_write_regions_are_checked(
    cosmos_url: str, changes: dict[str, Any], message: str
) -> None:
    """An account under Eventual / Consistent Prefix, or with several write regions, is
    refused at open with a ConfigError saying why and what to change."""
    kv = CosmosKV.from_url(cosmos_url)
    kv._transport = _AccountRewriter(changes)
    async with kv:
        with pytest.raises(ConfigError, match=message):
            await kv.get("s", "k")


async def test_client_asking_for_eventual_is_refused(cosmos_url: str) -> None:
    """A ready client built with consistency_level=Eventual is refused at open."""
    from azure.cosmos.aio import CosmosClient

    settings = CosmosKV.from_url(cosmos_url)._settings
    assert settings is not None
    async with CosmosClient(
        settings.endpoint,
        credential=settings.key,
        enable_endpoint_discovery=False,
        consistency_level="Eventual",
    ) as client:
        kv = open_kv(
            client,
            prefix=settings.prefix,
            database=settings.database,
            container=settings.container,
            emulator="cosmosdb-server",
        )
        async with kv:
            with pytest.raises(ConfigError, match="client asks for Eventual"):
                await kv.get("s", "k")


def test_deadline_option_sets_deadline_seconds() -> None:
    """?deadline= sets kv.deadline_seconds; ?timeout= and ?retries= are taken."""
    base = "cosmos://acct.documents.azure.com/db/c?key=k"
    kv = open_kv(base + "&deadline=7.5&timeout=2&retries=4")
    assert isinstance(kv, CosmosKV)
    assert kv.deadline_seconds == 7.5 and kv.retries == 4
    assert kv._settings is not None and kv._settings.timeout == 2
    default = open_kv(base)
    assert default.deadline_seconds == 20 and not default.auto_setup
    with pytest.raises(ConfigError):
        open_kv(base + "&deadline=0")


# -- a reply lost below the SDK (issue 59) ----------------------------------------------------


@pytest.fixture
async def lossy(cosmos_url: str) -> AsyncIterator[tuple[TCPProxy, KVStore]]:
    """A store reaching the server through a TCP proxy that can lose a reply, warmed up (the
    account and container already read), so the next request is the one under test."""
    url = StoreURL.parse(cosmos_url)
    assert url.host is not None and url.port is not None
    async with TCPProxy(url.host, url.port) as proxy:
        proxied = plugin.proxied_url(url, proxy.host, proxy.port)
        assert proxied is not None
        async with open_kv(proxied.render_with_secrets()) as kv:
            await kv.get(f"lossy-{uuid.uuid4().hex[:8]}", "warm")
            yield proxy, kv


async def test_a_lost_replace_reply_is_reported_applied_not_a_conflict(
    lossy: tuple[TCPProxy, KVStore], cosmos_url: str
) -> None:
    """The server applies a conditional replace and the connection drops before its reply:
    below the SDK, aiohttp used to send the PUT again, the second attempt met 412, and the
    store reported KV_CONFLICT for a replace that was applied. Now the store sees the lost
    reply, re-sends it itself and recognises its own write."""
    proxy, kv = lossy
    for trial in range(3):
        scope = f"lostput-{trial}-{uuid.uuid4().hex[:8]}"
        version = await kv.create(scope, "k", b"1")
        proxy.lose_reply()
        new = await kv.replace(scope, "k", b"2", expected_version=version)
        assert proxy.lost_replies == trial + 1
        async with open_kv(cosmos_url) as plain:
            entry = await plain.get(scope, "k")
        assert entry is not None and entry.value == b"2" and entry.version == new


async def test_a_lost_delete_reply_is_unknown_not_not_found(
    lossy: tuple[TCPProxy, KVStore], cosmos_url: str
) -> None:
    """The server applies a conditional delete and the connection drops before its reply:
    the store used to answer False ("nothing at that version") for a delete that deleted,
    after aiohttp's own re-send met 412. A delete leaves nothing to recognise, so the
    outcome is unknown: BackendUnavailableError saying so, never False."""
    proxy, kv = lossy
    for trial in range(3):
        scope = f"lostdel-{trial}-{uuid.uuid4().hex[:8]}"
        version = await kv.create(scope, "k", b"1")
        proxy.lose_reply()
        with pytest.raises(BackendUnavailableError, match="unknown"):
            await kv.delete(scope, "k", expected_version=version)
        assert proxy.lost_replies == trial + 1
        async with open_kv(cosmos_url) as plain:
            assert await plain.get(scope, "k") is None


async def test_store_sessions_never_resend_below_the_store() -> None:
    """The aiohttp session of a client the store builds has aiohttp's re-send of PUT and
    DELETE after a broken connection turned off (the flag exists in this aiohttp)."""
    from agent_stores_cosmos.kv import no_resend_session

    session = no_resend_session()
    try:
        assert session._retry_connection is False
    finally:
        await session.close()
