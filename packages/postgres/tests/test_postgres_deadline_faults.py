"""PostgreSQL's routine faults survived, and every call bounded by its deadline.

The faults come from :class:`agent_stores_postgres.faults.PostgresFaultInjector` (the
pool's connection class replaced; the real server answers every request not faulted)
while memory writes with receipts, journal appends and session turns run: every
operation succeeds or raises a typed unavailable error, and afterwards nothing is lost,
applied twice or corrupt. A silent peer (a loopback proxy that accepts and never answers)
yields BackendUnavailableError naming the backend and host within the deadline + 1 s: from
a KV call, an agent turn and ``agent-stores check URL``; and once the peer answers again,
the same store works (the connection the deadline cut off was discarded).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg.errors
import pytest
import pytest_asyncio
from agent_stores import (
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    StoreURL,
    UnknownOptionError,
    open_kv,
    open_sessions,
)
from agent_stores.faults import FaultInjector, FaultKind
from agent_stores.kv import Create, Replace
from agent_stores.plugins import get_registry
from agent_stores.sessions.errors import TransientStoreError
from agent_stores_contract.fault_workloads import WORKLOADS, Tally, pair, texts
from agent_stores_contract.proxy import TCPProxy as SilentProxy
from agent_stores_postgres import plugin
from agent_stores_postgres.config import PostgresConfig
from agent_stores_postgres.faults import PostgresFaultInjector
from agent_stores_postgres.kv import ROLLED_BACK_RETRIES, PostgresKV
from pg_test_support import with_options

DEADLINE = 2.0
#: The bound the issue sets: the deadline plus one second.
BOUND = DEADLINE + 1.0
#: A turn's own timeout_seconds: the core retries a failed acquire while it lasts (each
#: attempt bounded by the deadline), so a turn fails within the bound when it is shorter.
TURN_TIMEOUT = 1.0


# -- the deadline option ---------------------------------------------------------------------


def test_deadline_option_sets_the_store_and_sizes_connect_and_pool_timeouts() -> None:
    config = PostgresConfig.from_url("postgresql://h/db?deadline=4")
    assert config.deadline == 4.0 and config.pool_timeout == 4.0
    assert config.conninfo["connect_timeout"] == "2"
    default = PostgresConfig.from_url("postgresql://h/db")
    assert default.deadline == 20.0 and default.pool_timeout == 10.0
    assert default.conninfo["connect_timeout"] == "10"
    explicit = PostgresConfig.from_url(
        "postgresql://h/db?deadline=30&pool_timeout=3&connect_timeout=7"
    )
    assert explicit.pool_timeout == 3.0 and explicit.conninfo["connect_timeout"] == "7"
    kv = open_kv("postgresql://h/db?deadline=7.5")
    assert isinstance(kv, PostgresKV) and kv.deadline_seconds == 7.5
    assert "deadline" not in kv.describe()
    assert PostgresKV.from_url("postgresql://h/db", deadline=3).deadline_seconds == 3


@pytest.mark.parametrize("value", ["0", "-1", "inf", "soon", "99999"])
def test_bad_deadline_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="deadline"):
        PostgresConfig.from_url(f"postgresql://h/db?deadline={value}")


def test_misspelt_deadline_lists_it() -> None:
    with pytest.raises(UnknownOptionError) as info:
        PostgresConfig.from_url("postgresql://h/db?deadlin=3")
    assert "deadline" in str(info.value)


# -- the hooks ----------------------------------------------------------------------------


def test_fault_injector_and_proxied_url_hooks() -> None:
    hook = get_registry().hook
    url = StoreURL.parse("postgresql://u:pw@db.example:5433/app?schema=s&host=/run/pg&port=1")
    injector = hook.fault_injector(url=url)
    assert isinstance(injector, PostgresFaultInjector) and isinstance(injector, FaultInjector)
    assert injector.faults == {
        "40001": FaultKind.CONFLICT,
        "40P01": FaultKind.CONFLICT,
        "57P01": FaultKind.RESET,
        "08006": FaultKind.RESET,
        "lost_reply": FaultKind.LOST_REPLY,
        "blackhole": FaultKind.BLACKHOLE,
    }
    proxied = hook.proxied_url(url=url, host="127.0.0.1", port=4242)
    assert (proxied.host, proxied.port, proxied.password, proxied.path) == (
        "127.0.0.1",
        4242,
        "pw",
        "/app",
    )
    assert proxied.query_get("schema") == "s"
    assert proxied.query_get("host") is None and proxied.query_get("port") is None
    other = StoreURL.parse("redis://h")
    assert plugin.fault_injector(other) is None
    assert plugin.proxied_url(other, "127.0.0.1", 1) is None


# -- faults injected under load ------------------------------------------------------------

FAULTS = ["40001", "40P01", "57P01", "08006", "lost_reply"]


@pytest.mark.parametrize("fault", FAULTS)
async def test_fault_survived(schema_url: str, fault: str) -> None:
    """At a 25 % rate of one fault: every memory write, journal append and turn succeeds
    or fails typed, and the data ends complete, once each, in order."""
    injector = PostgresFaultInjector()
    kv = await injector.open_kv(StoreURL.parse(schema_url))
    tally = Tally(describe=kv.describe())
    try:
        await kv.setup()
        injector.set_rate(0.25, [fault], seed=len(fault))
        for workload in WORKLOADS.values():
            await workload(kv, tally)
        injector.set_rate(0)
    finally:
        await kv.aclose()
    counts = injector.injected()
    print(f"{fault}: injected {counts}, {tally}")
    assert counts.get(fault, 0) >= 3, f"{fault} was hardly injected: {counts}"
    if fault in ("40001", "40P01"):
        # Rolled back by the server, so re-sent: never reported.
        assert not tally.unavailable, tally


@pytest.mark.parametrize("fault", ["08006", "57P01", "lost_reply"])
async def test_commit_transaction_faults(schema_url: str, fault: str) -> None:
    """A multi-operation commit (a pipelined transaction) broken midway or after COMMIT:
    each commit is applied once or reported unavailable, never half; the stored versions
    are the ones reported."""
    injector = PostgresFaultInjector()
    kv = await injector.open_kv(StoreURL.parse(schema_url))
    try:
        counter = await kv.create("s", "counter", b"0")
        applied = 0
        unknown = 0
        injector.set_rate(0.3, [fault], seed=7)
        for i in range(20):
            try:
                versions = await kv.commit(
                    "s",
                    [
                        Replace("counter", str(applied + 1).encode(), counter),
                        Create(f"item-{i}", b"x"),
                    ],
                )
            except BackendUnavailableError:
                unknown += 1
                injector.set_rate(0)
                entry = await kv.get("s", "counter")
                assert entry is not None
                item = await kv.get("s", f"item-{i}")
                # All or nothing: the counter moved exactly when the item exists.
                assert (entry.version != counter) == (item is not None)
                if item is not None:
                    applied += 1
                counter = entry.version
                injector.set_rate(0.3, [fault])
                continue
            applied += 1
            counter = versions[0] or counter
        injector.set_rate(0)
        entry = await kv.get("s", "counter")
        assert entry is not None and entry.version == counter
        assert entry.value == str(applied).encode()
        items = [i.key for i in await kv.scan("s", prefix="item-")]
        assert len(items) == applied
        assert injector.injected().get(fault, 0) >= 2, injector.injected()
    finally:
        await kv.aclose()


async def test_rolled_back_budget_spent_is_unavailable_with_its_cause(schema_url: str) -> None:
    """More serialization failures than re-sends: BackendUnavailableError (never a
    ConfigError) with the server's 40001 kept as the cause; nothing was applied."""
    injector = PostgresFaultInjector()
    kv = await injector.open_kv(StoreURL.parse(schema_url))
    try:
        await kv.setup()
        injector.arm("40001", times=ROLLED_BACK_RETRIES + 1)
        with pytest.raises(BackendUnavailableError) as info:
            await kv.create("s", "k", b"v")
        assert isinstance(info.value.__cause__, psycopg.errors.SerializationFailure)
        assert "[40001]" in str(info.value) and "postgresql://" in str(info.value)
        assert await kv.get("s", "k") is None
        await kv.create("s", "k", b"v")
        with pytest.raises(ConflictError):
            await kv.create("s", "k", b"again")
    finally:
        await kv.aclose()


async def test_lost_replies_of_native_writes_are_confirmed(schema_url: str) -> None:
    """A memory write, a journal append and a session save whose statement committed but
    whose reply was lost: each is recognised by reading back its own new version, reported
    done, and was applied once."""
    from agent_stores import open_checkpointer, open_memory
    from agent_stores.checkpointer.types import JournalEvent
    from agent_stores.memory._harness import MemoryOperation

    injector = PostgresFaultInjector()
    kv = await injector.open_kv(StoreURL.parse(schema_url))
    memory = open_memory(kv)
    checkpointer = open_checkpointer(kv)
    sessions = open_sessions(kv)
    assert isinstance(kv, PostgresKV)
    confirmed: list[str] = []
    read_back = kv.version_of

    async def counting(action: str, scope: str, key: str) -> str | None:
        confirmed.append(action)
        return await read_back(action, scope, key)

    kv.version_of = counting  # type: ignore[method-assign]
    try:
        await kv.setup()
        await memory.write("a.md", "warm", expected_version=None)
        await checkpointer.append("run", JournalEvent(step_id="warm", kind="tool"))
        injector.arm("lost_reply")
        done = await memory.write(
            "b.md", "once", expected_version=None, operation=MemoryOperation("op", "fp")
        )
        assert confirmed == ["memory write"]
        replay = await memory.get_operation(MemoryOperation("op", "fp"))
        assert replay is not None and replay.version == done.version
        injector.arm("lost_reply")
        first = await checkpointer.append("run", JournalEvent(step_id="s0", kind="tool"))
        assert confirmed[1:] == ["journal append"]
        second = await checkpointer.append("run", JournalEvent(step_id="s1", kind="tool"))
        assert (first.seq, first.duplicate, second.seq) == (1, False, 2)
        async with sessions.turn("sid") as session:
            session.replace(pair("before"))
        async with sessions.turn("sid") as session:
            session.replace([*session.messages, *pair("lost")])
            injector.arm("lost_reply")  # the next request: the save
        assert confirmed[2:] == ["session save"]
        async with sessions.turn("sid") as session:
            assert texts(session.messages) == ["q:before", "a:before", "q:lost", "a:lost"]
        assert injector.injected() == {"lost_reply": 3}
    finally:
        await sessions.aclose()
        await checkpointer.aclose()
        await memory.aclose()
        await kv.aclose()


# -- blackholes ----------------------------------------------------------------------------


def assert_names_backend(exc: BaseException) -> None:
    text = str(exc)
    assert "postgresql://" in text and "127.0.0.1" in text, text


async def _one_turn(store: Any, sid: str, timeout_seconds: float = TURN_TIMEOUT) -> None:
    async with store.turn(sid, timeout_seconds=timeout_seconds) as session:
        session.replace([*session.messages, *pair("x")])


async def test_injected_blackhole_is_bounded_and_the_connection_discarded(
    schema_url: str,
) -> None:
    """Requests never answered: a KV call, setup and a native statement (a turn) each fail
    within the bound; the connections cut off were closed, and the next calls work."""
    url = StoreURL.parse(with_options(schema_url, deadline=f"{DEADLINE:g}", max_size="2"))
    injector = PostgresFaultInjector()
    kv = await injector.open_kv(url)
    sessions = open_sessions(kv)
    try:
        await kv.setup()
        injector.arm("blackhole", times=10_000)
        for name, call in (
            ("get", lambda: kv.get("s", "k")),
            ("setup", kv.setup),
            ("turn", lambda: _one_turn(sessions, "bh")),
        ):
            started = time.monotonic()
            with pytest.raises((BackendUnavailableError, TransientStoreError)) as info:
                await call()
            elapsed = time.monotonic() - started
            assert elapsed <= BOUND, f"{name} took {elapsed:.1f}s"
            assert "postgresql://" in str(info.value) + str(info.value.__cause__)
        injector.disarm()
        await kv.create("s", "k", b"after")
        await _one_turn(sessions, "bh", timeout_seconds=10)
    finally:
        await sessions.aclose()
        await kv.aclose()


@pytest_asyncio.fixture
async def proxy(schema_url: str) -> AsyncIterator[tuple[SilentProxy, str]]:
    """The session's server behind a switchable silent proxy; the store URL through it."""
    target = StoreURL.parse(schema_url)
    running = await SilentProxy(target.host or "127.0.0.1", target.port or 5432).start()
    url = target.set(host="127.0.0.1", port=running.port).with_query(
        deadline=f"{DEADLINE:g}", sslmode="disable"
    )
    try:
        yield running, url.render_with_secrets()
    finally:
        await running.aclose()


async def test_silent_server_kv_call_and_recovery(proxy: tuple[SilentProxy, str]) -> None:
    """The server goes silent under pooled connections: a read and a write each fail typed
    within the bound, naming backend and host; once it answers again the same store works
    (the connections cut off mid-statement were discarded, not handed out again)."""
    silent, url = proxy
    kv = open_kv(url)
    try:
        version = await kv.create("s", "k", b"v0")
        silent.go_silent()
        for call in (
            lambda: kv.get("s", "k"),
            lambda: kv.replace("s", "k", b"x", expected_version=version),
        ):
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as info:
                await call()
            assert time.monotonic() - started <= BOUND
            assert_names_backend(info.value)
        silent.heal()
        entry = await kv.get("s", "k")
        assert entry is not None
        await kv.replace("s", "k", b"v1", expected_version=entry.version)
    finally:
        await kv.aclose()


async def test_silent_server_agent_turn(proxy: tuple[SilentProxy, str]) -> None:
    """An agent turn (the core session store over the URL) against a server that went
    silent: a typed error within the bound; after the heal the next turn works."""
    silent, url = proxy
    async with open_sessions(url) as sessions:
        await _one_turn(sessions, "agent", timeout_seconds=10)
        silent.go_silent()
        started = time.monotonic()
        with pytest.raises((BackendUnavailableError, TransientStoreError)) as info:
            await _one_turn(sessions, "agent")
        assert time.monotonic() - started <= BOUND
        assert_names_backend(info.value.__cause__ or info.value)
        silent.heal()
        async with sessions.turn("agent", timeout_seconds=15) as session:
            assert "q:x" in texts(session.messages)


async def test_silent_from_the_start_agent_turn(proxy: tuple[SilentProxy, str]) -> None:
    """A server silent from the first connection (the startup is never answered)."""
    silent, url = proxy
    silent.go_silent()
    started = time.monotonic()
    with pytest.raises((BackendUnavailableError, TransientStoreError)) as info:
        # Entering the store sets it up: that is the first call to meet the silence.
        async with open_sessions(url) as sessions:
            await _one_turn(sessions, "agent")
    assert time.monotonic() - started <= BOUND
    assert_names_backend(info.value.__cause__ or info.value)


async def test_check_command_against_a_silent_server(proxy: tuple[SilentProxy, str]) -> None:
    """``agent-stores check URL`` in a subprocess: exits with an error naming the backend
    and host within the bound. The process's own start-up and exit (imports included) are
    measured by the same command against the healthy server first, and subtracted."""
    silent, url = proxy
    baseline, code, output = await run_check(url)
    assert code == 0, output
    silent.go_silent()
    elapsed, code, output = await run_check(url)
    assert code != 0, output
    assert "BACKEND_UNAVAILABLE" in output and "postgresql://" in output
    assert "127.0.0.1" in output
    assert elapsed - baseline <= BOUND, f"check took {elapsed:.1f}s (healthy: {baseline:.1f}s)"


async def run_check(url: str) -> tuple[float, int, str]:
    """``(seconds, exit code, output)`` of ``agent-stores check URL`` run as a subprocess."""
    cli = Path(sys.executable).parent / "agent-stores"
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        str(cli),
        "check",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 120)
    return time.monotonic() - started, process.returncode or 0, output.decode()
