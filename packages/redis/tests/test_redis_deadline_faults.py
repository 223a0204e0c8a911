"""Redis's routine faults survived, and every call bounded by its deadline.

The faults come from :class:`agent_stores_redis.faults.RedisFaultInjector` (redis-py's
connection class replaced; the real private servers answer everything not faulted) while
memory writes with receipts, journal appends and session turns run: every operation
succeeds or raises a typed unavailable error, and afterwards nothing is lost, applied
twice or corrupt. A silent peer (a loopback proxy that accepts and never answers) yields
BackendUnavailableError naming the backend and host within the deadline + 1 s: from a KV
call, an agent turn and ``agent-stores check URL``; and once the peer answers again, the
same store works.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from agent_stores import BackendUnavailableError, ConfigError, StoreURL, open_kv, open_sessions
from agent_stores.faults import FaultInjector, FaultKind
from agent_stores.plugins import get_registry
from agent_stores.sessions.errors import TransientStoreError
from agent_stores_contract.fault_workloads import WORKLOADS, Tally, pair, texts
from agent_stores_contract.proxy import TCPProxy as SilentProxy
from agent_stores_redis import plugin
from agent_stores_redis.config import parse_url
from agent_stores_redis.faults import RedisFaultInjector
from agent_stores_redis.kv import RedisKV

SECRET = "pw-deadline-never-print-me"
DEADLINE = 2.0
#: The bound the issue sets: the deadline plus one second.
BOUND = DEADLINE + 1.0
#: A turn's own timeout_seconds: the core retries a failed acquire while it lasts (each
#: attempt bounded by the deadline), so a turn fails within the bound when it is shorter.
TURN_TIMEOUT = 1.0


# -- the deadline option ---------------------------------------------------------------------


def test_deadline_option_sets_the_store_and_sizes_the_socket_timeouts() -> None:
    """``?deadline=`` sets deadline_seconds; each attempt's socket timeout fits inside it."""
    settings = parse_url("redis://h?deadline=2")
    assert settings.deadline == 2.0
    # 4 attempts (retries=3) share the deadline.
    assert settings.client_kwargs["socket_timeout"] == 0.5
    assert settings.client_kwargs["socket_connect_timeout"] == 0.5
    assert parse_url("redis://h").client_kwargs["socket_timeout"] == 5.0
    explicit = parse_url("redis://h?deadline=2&socket_timeout=0.3&retries=1")
    assert explicit.client_kwargs["socket_timeout"] == 0.3
    assert explicit.client_kwargs["socket_connect_timeout"] == 1.0
    store = open_kv("redis://h?deadline=7.5")
    assert isinstance(store, RedisKV) and store.deadline_seconds == 7.5
    assert open_kv("redis://h").deadline_seconds == 20.0


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("deadline=0", "deadline must be >= 0.1"),
        ("deadline=-1", "deadline must be >= 0.1"),
        ("deadline=soon", "deadline must be a number"),
        ("deadline=inf", "finite"),
        ("deadlin=3", "deadline"),  # the unknown-option error lists deadline
    ],
)
def test_bad_deadline_is_a_config_error(query: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_url(f"redis://h?{query}")
    assert fragment in str(info.value)


# -- the hooks ----------------------------------------------------------------------------


def test_fault_injector_and_proxied_url_hooks() -> None:
    hook = get_registry().hook
    standalone = StoreURL.parse(f"redis://:{SECRET}@db.example:6379/2?prefix=p")
    injector = hook.fault_injector(url=standalone)
    assert isinstance(injector, RedisFaultInjector) and isinstance(injector, FaultInjector)
    assert injector.faults == {
        "connection_reset": FaultKind.RESET,
        "LOADING": FaultKind.TRANSIENT,
        "lost_reply": FaultKind.LOST_REPLY,
        "blackhole": FaultKind.BLACKHOLE,
    }
    cluster = hook.fault_injector(url=StoreURL.parse("redis+cluster://h:7000"))
    assert {"MOVED", "TRYAGAIN"} <= set(cluster.faults)
    other = StoreURL.parse("postgresql://h/db")
    assert plugin.fault_injector(other) is None
    assert plugin.proxied_url(other, "127.0.0.1", 1) is None
    proxied = hook.proxied_url(url=standalone, host="127.0.0.1", port=4242)
    assert (proxied.host, proxied.port, proxied.password, proxied.path) == (
        "127.0.0.1",
        4242,
        SECRET,
        "/2",
    )
    assert proxied.query_get("prefix") == "p"
    # A cluster client follows announced node addresses; a socket is no TCP address.
    for url in ("redis+cluster://h:7000", "redis://h:7000?cluster=true", "unix:///r.sock"):
        assert hook.proxied_url(url=StoreURL.parse(url), host="127.0.0.1", port=1) is None
    with pytest.raises(ValueError, match="unknown fault"):
        injector.arm("NOPE")


# -- faults injected under load ------------------------------------------------------------

STANDALONE_FAULTS = ["connection_reset", "LOADING", "lost_reply"]
CLUSTER_ONLY = ["TRYAGAIN", "MOVED"]


async def run_workloads(url: str, fault: str, rate: float, seed: int) -> Tally:
    injector = RedisFaultInjector(url)
    kv = await injector.open_kv(StoreURL.parse(url))
    tally = Tally(describe=kv.describe())
    try:
        injector.set_rate(rate, [fault], seed=seed)
        for workload in WORKLOADS.values():
            await workload(kv, tally)
        injector.set_rate(0)
    finally:
        await kv.aclose()
    counts = injector.injected()
    print(f"{fault}: injected {counts}, {tally}")
    assert counts.get(fault, 0) >= 3, f"{fault} was hardly injected: {counts}"
    assert set(counts) == {fault}
    return tally


@pytest.mark.parametrize("fault", STANDALONE_FAULTS)
async def test_fault_survived_on_standalone(standalone_url: str, fault: str) -> None:
    """At a 25 % rate of one fault: every memory write, journal append and turn succeeds
    or fails typed, and the data ends complete, once each, in order."""
    tally = await run_workloads(standalone_url, fault, 0.25, seed=len(fault))
    assert tally.ok > 0


@pytest.mark.parametrize("fault", STANDALONE_FAULTS + CLUSTER_ONLY)
async def test_fault_survived_on_cluster(cluster_url: str, fault: str) -> None:
    """The same on Redis Cluster, with TRYAGAIN and MOVED (redis-py re-sends after both)."""
    tally = await run_workloads(cluster_url, fault, 0.25, seed=len(fault) + 1)
    assert tally.ok > 0


async def test_retry_budget_spent_is_unavailable_with_its_cause(standalone_url: str) -> None:
    """More LOADING replies than retries: BackendUnavailableError (not a ConfigError) naming
    the server, with redis-py's error kept as the cause; the next call works."""
    injector = RedisFaultInjector(standalone_url)
    kv = await injector.open_kv(StoreURL.parse(standalone_url))
    try:
        injector.arm("LOADING", times=4)  # the first try and 3 retries
        with pytest.raises(BackendUnavailableError) as info:
            await kv.create("s", "k", b"v")
        from redis.exceptions import BusyLoadingError

        assert isinstance(info.value.__cause__, BusyLoadingError)
        assert "loading" in str(info.value).lower() and "127.0.0.1" in str(info.value)
        assert await kv.get("s", "k") is None  # nothing was applied
        await kv.create("s", "k", b"v")
    finally:
        await kv.aclose()


async def test_lost_reply_on_a_write_is_recognised_not_repeated(standalone_url: str) -> None:
    """The script ran and its reply was lost: the retry finds its own version and reports
    success; the entry was written once."""
    injector = RedisFaultInjector(standalone_url)
    kv = await injector.open_kv(StoreURL.parse(standalone_url))
    try:
        injector.arm("lost_reply", operation="create")
        version = await kv.create("s", "k", b"once")
        injector.arm("lost_reply", operation="replace")
        version = await kv.replace("s", "k", b"twice", expected_version=version)
        entry = await kv.get("s", "k")
        assert entry is not None and (entry.value, entry.version) == (b"twice", version)
        assert injector.injected() == {"lost_reply": 2}
    finally:
        await kv.aclose()


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("lost", "replace"),  # the state alone: the replace script
        ("lost" + "." * 5000, "commit"),  # past the tail bound, a chunk too: the commit script
    ],
    ids=["state", "state-and-chunk"],
)
async def test_lost_reply_on_a_session_save_keeps_the_turn(
    standalone_url: str, text: str, script: str
) -> None:
    """A save whose reply was lost (one client): the turn is reported saved and is in the
    history once; the session stays readable."""
    injector = RedisFaultInjector(standalone_url)
    kv = await injector.open_kv(StoreURL.parse(standalone_url))
    store = open_sessions(kv)
    try:
        async with store.turn("s") as session:
            session.replace(pair("before"))
        injector.arm("lost_reply", operation=script)
        async with store.turn("s") as session:
            session.replace([*session.messages, *pair(text)])
        assert injector.injected() == {"lost_reply": 1}
        async with store.turn("s") as session:
            assert texts(session.messages) == ["q:before", "a:before", f"q:{text}", f"a:{text}"]
    finally:
        await store.aclose()
        await kv.aclose()


# -- blackholes ----------------------------------------------------------------------------


def assert_names_backend(exc: BaseException, host: str = "127.0.0.1") -> None:
    text = str(exc)
    assert "redis://" in text and host in text, text
    assert SECRET not in text and SECRET not in repr(exc)


@pytest.mark.parametrize("target", ["standalone_url", "cluster_url"])
async def test_injected_blackhole_is_bounded_by_the_deadline(
    request: pytest.FixtureRequest, target: str
) -> None:
    """Every command unanswered: a KV call, a native script (a session turn) and setup each
    fail within the deadline + 1 s; the next call after the fault is disarmed works (on
    Redis Cluster too, where no proxy can stand in front of the nodes)."""
    url = StoreURL.parse(request.getfixturevalue(target)).with_query(deadline=str(DEADLINE))
    injector = RedisFaultInjector(url)
    kv = await injector.open_kv(url)
    store = open_sessions(kv)
    try:
        injector.arm("blackhole", times=10_000)
        for name, call in (
            ("get", lambda: kv.get("s", "k")),
            ("setup", kv.setup),
            ("turn", lambda: _one_turn(store, "bh")),
        ):
            started = time.monotonic()
            with pytest.raises((BackendUnavailableError, TransientStoreError)) as info:
                await call()
            elapsed = time.monotonic() - started
            assert elapsed <= BOUND, f"{name} took {elapsed:.1f}s"
            named = str(info.value) + str(info.value.__cause__)
            assert "redis" in named and "127.0.0.1" in named, named
        injector.disarm()
        await kv.create("s", "k", b"after")
        await _one_turn(store, "bh")
    finally:
        await store.aclose()
        await kv.aclose()


async def test_an_unanswered_command_is_given_up_after_socket_timeout_and_retried(
    standalone_url: str,
) -> None:
    """One script reply never comes: the store gives that attempt up after
    ``socket_timeout`` (its own bound: redis-py's per-operation timeouts are off on the
    store's connections) and sends the command again, so the turn succeeds long before
    the deadline, and the next turns see it once."""
    url = StoreURL.parse(standalone_url).with_query(deadline="20", socket_timeout="0.3")
    injector = RedisFaultInjector(url)
    kv = await injector.open_kv(url)
    store = open_sessions(kv)
    try:
        await _one_turn(store, "retried")
        injector.arm("blackhole", times=1)
        started = time.monotonic()
        await _one_turn(store, "retried")
        elapsed = time.monotonic() - started
        assert 0.3 <= elapsed < 5, elapsed
        async with store.turn("retried", timeout_seconds=TURN_TIMEOUT) as session:
            assert len(session.messages) == 4
    finally:
        await store.aclose()
        await kv.aclose()


async def _one_turn(store: object, sid: str, timeout_seconds: float = TURN_TIMEOUT) -> None:
    async with store.turn(sid, timeout_seconds=timeout_seconds) as session:  # type: ignore[attr-defined]
        session.replace([*session.messages, *pair("x")])


@pytest_asyncio.fixture
async def proxy(private_server: object) -> AsyncIterator[tuple[SilentProxy, str]]:
    """A password-protected private server behind a switchable silent proxy; its URL."""
    server = private_server(password=SECRET)  # type: ignore[operator]
    proxy = await SilentProxy("127.0.0.1", server.port).start()
    url = f"redis://:{SECRET}@127.0.0.1:{proxy.port}/0?prefix=bh&deadline={DEADLINE:g}"
    try:
        yield proxy, url
    finally:
        await proxy.aclose()


async def test_silent_server_kv_call_and_recovery(proxy: tuple[SilentProxy, str]) -> None:
    """The server goes silent under pooled connections: a KV call fails typed within the
    bound, naming backend and host; once it answers again, the same store works (the
    connection cut off by the deadline was discarded, not reused mid-reply)."""
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
        await _one_turn(sessions, "agent")
        silent.go_silent()
        started = time.monotonic()
        with pytest.raises((BackendUnavailableError, TransientStoreError)) as info:
            async with sessions.turn("agent", timeout_seconds=TURN_TIMEOUT) as session:
                session.replace([*session.messages, *pair("never")])
        assert time.monotonic() - started <= BOUND
        assert_names_backend(info.value.__cause__ or info.value)
        silent.heal()
        async with sessions.turn("agent", timeout_seconds=15) as session:
            assert "q:x" in texts(session.messages)


async def test_silent_from_the_start_agent_turn(proxy: tuple[SilentProxy, str]) -> None:
    """A server silent from the first connection (the handshake is never answered)."""
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
    assert "BACKEND_UNAVAILABLE" in output and "redis://" in output and "127.0.0.1" in output
    assert SECRET not in output
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


def _raised_in(filename: str) -> AttributeError:
    """An AttributeError raised by code that lives at ``filename`` (its traceback says so)."""
    try:
        exec(compile("None.writelines([b'PING'])", filename, "exec"))
    except AttributeError as exc:
        return exc
    raise AssertionError("no error raised")


def test_a_connection_closed_under_a_command_by_redis_py_is_a_broken_connection() -> None:
    """redis-py's cluster client can close a connection another task just took (its
    disconnect_free_connections after a connection error); the command then fails inside
    redis-py with AttributeError on a None writer — seen under CPU load in the contract's
    fault mode on redis-cluster. It is retried like a reset (possibly sent: a write's outcome
    is read back); the same error from anywhere else stays a bug, not retried."""
    from agent_stores_redis.kv import _classify

    inside = _raised_in("/venv/lib/python3.11/site-packages/redis/asyncio/connection.py")
    assert _classify(inside) == (True, True)
    elsewhere = _raised_in("/app/agent_code.py")
    assert _classify(elsewhere) == (None, False)
