"""The store's own client: built off the event loop, no process environment touched, every
gRPC call finished before the store call returns, deadlines kept against a silent server,
and recovery once the network heals (same store, new store)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
import pytest_asyncio
from agent_stores import StoreURL, open_kv, open_sessions
from agent_stores.errors import BackendUnavailableError, ConfigError
from agent_stores.sessions.errors import TransientStoreError
from agent_stores_firestore.config import EMULATOR_ENV
from agent_stores_firestore.kv import FirestoreKV
from firestore_proxy import SilentProxy
from firestore_test_support import with_fresh_prefix
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

DEADLINE = 3.0
#: timeout_seconds of a turn on a silent server
WAIT = 1.0


class CallTracker(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Keeps every streaming call (BatchGetDocuments, RunQuery) the store starts."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        self.calls.append(call)
        return call


async def test_point_reads_finish_their_streams(firestore_url: str) -> None:
    """``get`` returns only once its BatchGetDocuments stream has ended (``ref.get()`` returns
    on the first message and leaves the call running)."""
    tracker = CallTracker()
    kv = FirestoreKV.from_url(firestore_url, interceptors=[tracker])
    try:
        await kv.create("s", "k", b"v")
        for key in ("k", "absent", "k"):
            await kv.get("s", key)
            assert tracker.calls, "the read went through the channel"
            assert all(call.done() for call in tracker.calls), "a read outlived its store call"
        await kv.get_many("s", ["k", "absent"])
        await kv.scan("s")
        assert all(call.done() for call in tracker.calls)
    finally:
        await kv.aclose()


def test_reads_in_short_lived_loops_leave_nothing_behind(firestore_url: str) -> None:
    """Many reads, each in an event loop closed right after it (the store left open, as a
    test harness does): nothing lands on a closed loop ("Event loop is closed")."""
    errors: list[str] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        errors.append(f"{context.get('message')}: {context.get('exception')!r}")

    async def prepare() -> None:
        kv = FirestoreKV.from_url(firestore_url)
        await kv.create("s", "k", b"v")
        await kv.aclose()

    async def reads() -> None:
        asyncio.get_running_loop().set_exception_handler(handler)
        kv = FirestoreKV.from_url(firestore_url)
        for _ in range(3):
            entry = await kv.get("s", "k")
            assert entry is not None and entry.value == b"v"

    asyncio.run(prepare())
    for _ in range(20):
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(reads())
        finally:
            loop.close()
    # A leftover completion shows up in the next loop that polls gRPC's queue.
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(handler)
    loop.run_until_complete(asyncio.sleep(0.3))
    loop.close()
    assert errors == []


async def test_credentials_are_resolved_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Application Default Credentials are looked up in a worker thread, on first use; none
    found is a ConfigError naming the fix."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    threads: list[int] = []

    def no_credentials(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        raise DefaultCredentialsError("no credentials (test)")

    monkeypatch.setattr(google.auth, "default", no_credentials)
    monkeypatch.delenv(EMULATOR_ENV, raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    kv = open_kv("firestore://my-project/c")
    assert threads == []  # opening resolves nothing
    try:
        with pytest.raises(ConfigError, match="no Google credentials"):
            await kv.get("s", "k")
        assert threads and threading.get_ident() not in threads
    finally:
        await kv.aclose()


async def test_the_service_is_reached_over_tls_with_the_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without an emulator the store's channel is TLS to Google's endpoint, built with the
    credentials found (no request is sent here: gRPC connects on the first call)."""
    import google.auth
    from agent_stores_firestore.client import StoreClient
    from google.auth.credentials import AnonymousCredentials

    found = AnonymousCredentials()  # type: ignore[no-untyped-call]
    monkeypatch.setattr(google.auth, "default", lambda *a, **k: (found, "other-project"))
    monkeypatch.delenv(EMULATOR_ENV, raising=False)
    kv = FirestoreKV.from_url("firestore://my-project/c")
    try:
        client = await kv._connect()
        assert isinstance(client, StoreClient)
        assert client.project == "my-project" and client._credentials is found
        assert client._target == "firestore.googleapis.com:443"
        assert client._firestore_api is client._firestore_api  # one channel, made once
    finally:
        await kv.aclose()


async def test_emulator_endpoint_never_enters_the_environment(
    firestore_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emulator is reached through the client's own endpoint: ``FIRESTORE_EMULATOR_HOST``
    is never set, not even for a moment (another thread would see it)."""
    monkeypatch.delenv(EMULATOR_ENV, raising=False)
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            value = os.environ.get(EMULATOR_ENV)
            if value is not None:
                seen.append(value)
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(3):
            kv = FirestoreKV.from_url(firestore_url)
            await kv.create("s", "k", b"v")
            await kv.delete("s", "k")
            await kv.aclose()
    finally:
        stop.set()
        watcher.join()
    assert seen == []


async def test_close_is_idempotent_and_final(firestore_url: str) -> None:
    kv = FirestoreKV.from_url(firestore_url)
    await kv.setup()
    client = kv.client
    await kv.aclose()
    await kv.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        _ = client._firestore_api  # the store's channel is gone
    never_used = FirestoreKV.from_url(firestore_url)
    await never_used.aclose()  # nothing was built: nothing to close


# -- a silent server --------------------------------------------------------------------------


@pytest_asyncio.fixture
async def proxy(firestore_base_url: str) -> AsyncIterator[SilentProxy]:
    host = StoreURL.parse(firestore_base_url).query_get("emulator_host")
    assert host is not None
    name, port = host.rsplit(":", 1)
    silent = await SilentProxy(name, int(port)).start()
    try:
        yield silent
    finally:
        await silent.aclose()


def through(url: str, proxy: SilentProxy, deadline: float = DEADLINE) -> str:
    parsed = StoreURL.parse(url).with_query(emulator_host=proxy.host, deadline=f"{deadline:g}")
    return parsed.render_with_secrets()


async def timed_failure(call: Any) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError) as caught:
        await call
    return caught.value, time.monotonic() - started


async def test_silent_server_fails_within_the_deadline_and_heals(
    firestore_url: str, proxy: SilentProxy
) -> None:
    """A peer that accepts and never answers: BackendUnavailableError naming the backend and
    host within deadline + 1 s, for a fresh store (setup: a real round trip) and for one
    whose connection went silent; once the proxy forwards again, the same store and a new
    one in the same process work at once."""
    url = through(firestore_url, proxy)
    kv = open_kv(url)
    assert kv.deadline_seconds == DEADLINE
    await kv.setup()
    version = await kv.create("s", "k", b"v")

    proxy.silent = True
    error, took = await timed_failure(kv.get("s", "k"))
    assert took <= DEADLINE + 1, took
    assert "firestore://" in str(error) and proxy.host in str(error)
    _, took = await timed_failure(kv.replace("s", "k", b"w", expected_version=version))
    assert took <= DEADLINE + 1, took
    fresh = open_kv(url)
    _, took = await timed_failure(fresh.setup())
    assert took <= DEADLINE + 1, took
    await fresh.aclose()

    proxy.silent = False
    entry = await kv.get("s", "k")  # the same store recovers
    assert entry is not None
    assert await kv.replace("s", "k", b"x", expected_version=entry.version)
    again = open_kv(url)  # and so does a new one in the same process
    try:
        entry = await again.get("s", "k")
        assert entry is not None and entry.value == b"x"
    finally:
        await again.aclose()
        await kv.aclose()


def _model() -> FunctionModel:
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart("ok")])

    return FunctionModel(answer)


async def test_agent_turn_on_a_silent_server_fails_within_the_deadline(
    firestore_url: str, proxy: SilentProxy
) -> None:
    """An agent turn whose server goes silent: a typed error within the turn's wait plus
    the deadline, + 1 s (SESSION_STORE_UNAVAILABLE, the store's BackendUnavailableError as its cause); after
    the network heals, the next turn sees the saved history."""
    agent = Agent(_model())
    async with open_sessions(through(firestore_url, proxy)) as sessions:
        async with sessions.turn("user:1") as session:
            result = await agent.run("hello", message_history=session.messages)
            session.replace(result.all_messages())
        proxy.silent = True
        started = time.monotonic()
        with pytest.raises(TransientStoreError) as caught:  # noqa: PT012 (a whole turn)
            async with sessions.turn("user:1", timeout_seconds=WAIT) as session:
                result = await agent.run("again", message_history=session.messages)
                session.replace(result.all_messages())
        took = time.monotonic() - started
        # The core's acquire retries a transient failure while the turn may still wait
        # (timeout_seconds); each KV call it makes ends within the store's deadline.
        assert took <= WAIT + DEADLINE + 1, took
        assert isinstance(caught.value.__cause__, BackendUnavailableError)
        assert "firestore://" in str(caught.value) and proxy.host in str(caught.value)
        proxy.silent = False
        async with sessions.turn("user:1") as session:
            assert len(session.messages) == 2
            result = await agent.run("again", message_history=session.messages)
            session.replace(result.all_messages())
        assert len(await sessions.read_messages("user:1") or []) == 4


def test_check_command_on_a_silent_server(firestore_base_url: str) -> None:
    """``agent-stores check URL`` against a silent server ends with an error naming the
    backend; it never hangs, and never claims to be connected."""
    url = with_fresh_prefix(firestore_base_url)

    async def run() -> tuple[subprocess.CompletedProcess[str], float, float]:
        host = StoreURL.parse(url).query_get("emulator_host")
        assert host is not None
        proxy = await SilentProxy(host.rsplit(":", 1)[0], int(host.rsplit(":", 1)[1])).start()
        proxy.silent = True
        try:
            args = [sys.executable, "-m", "agent_stores.cli", "check", through(url, proxy)]
            started = time.monotonic()
            # The CLI imports the Google client only when a URL is opened: the baseline
            # imports it too, so only connecting and waiting are left to compare.
            warm = "import google.cloud.firestore, grpc, agent_stores.cli"
            baseline = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", warm],
                capture_output=True,
                text=True,
                timeout=60,
            )
            startup = time.monotonic() - started
            assert baseline.returncode == 0, baseline.stderr
            started = time.monotonic()
            done = await asyncio.to_thread(
                subprocess.run, args, capture_output=True, text=True, timeout=120
            )
            return done, time.monotonic() - started, startup
        finally:
            await proxy.aclose()

    done, took, startup = asyncio.run(run())
    assert done.returncode != 0
    assert "connected" not in done.stdout
    assert "BACKEND_UNAVAILABLE" in done.stdout + done.stderr
    assert "firestore://" in done.stdout + done.stderr
    # ``startup``: the same interpreter importing the CLI and the Google client (no
    # connection); the slack covers a busy machine, the bound that it never hangs.
    assert took <= startup + DEADLINE + 3, (took, startup)
