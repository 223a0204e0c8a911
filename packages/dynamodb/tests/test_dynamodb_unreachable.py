"""An endpoint that refuses connections is reported fast, naming what was tried.

botocore's ``standard`` mode retried a refused connect up to 5 times with up to 15 s of
backoff, so a wrong ``endpoint_url`` (or a server not started) took 12-20 s to report.
A connection that could not be opened to an endpoint that never answered this client is
now tried twice (``CONNECT_ATTEMPTS``); once the endpoint has answered, a refused connect
(a restart) gets botocore's full schedule again. The 3 s bound is the issue's stated one
(the old behaviour took 4-5 times that), measured generously: two refused loopback
connects take milliseconds, botocore's one retry waits at most 1 s.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from agent_stores import BackendUnavailableError, ConfigError, StoreURL, open_kv
from agent_stores.kv.base import KVStore
from agent_stores_dynamodb.kv import CONNECT_ATTEMPTS
from click.testing import CliRunner
from dynamodb_test_support import with_options

#: The issue's bound for reporting a refused connection.
BOUND_SECONDS = 3.0
KEY_ID = "AKIAREFUSEDTESTKEY01"
SECRET = "refused-endpoint-secret-0123456789"


@pytest.fixture(scope="module", autouse=True)
def sdk_imported() -> None:
    """Import what the store imports on its first request (aiobotocore, botocore, aiohttp:
    1-3 s on a busy machine), so the bound times the reporting, not the imports."""
    import aiobotocore.config
    import aiobotocore.session  # noqa: F401
    import aiohttp  # noqa: F401
    import botocore.exceptions  # noqa: F401


def free_port() -> int:
    """A loopback port nobody listens on (bound, then closed again)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refused_url(port: int, **options: str) -> str:
    return with_options(
        f"dynamodb://{KEY_ID}:{SECRET}@agent-stores-refused",
        region="us-east-1",
        endpoint_url=f"http://127.0.0.1:{port}",
        **options,
    )


def assert_reported(error: BaseException, port: int) -> None:
    text = str(error)
    assert f"127.0.0.1:{port}" in text, text
    assert f"in {CONNECT_ATTEMPTS} attempts" in text, text
    assert "region us-east-1" in text, text
    assert SECRET not in text and KEY_ID not in text and SECRET not in repr(error)
    assert not isinstance(error, ConfigError)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda kv: kv.get("s", "k"), id="get"),
        pytest.param(lambda kv: kv.create("s", "k", b"v"), id="create"),
        pytest.param(lambda kv: kv.setup(), id="setup"),
    ],
)
async def test_refused_port_is_backend_unavailable_within_3_seconds(
    call: Callable[[KVStore], Awaitable[Any]],
) -> None:
    port = free_port()
    async with open_kv(refused_url(port)) as kv:
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as info:
            await call(kv)
        elapsed = time.monotonic() - started
    assert elapsed < BOUND_SECONDS, f"{elapsed:.2f} s"
    assert_reported(info.value, port)


def test_check_command_reports_the_refused_endpoint_within_3_seconds() -> None:
    from agent_stores.cli import cli

    port = free_port()
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["check", refused_url(port)])
    elapsed = time.monotonic() - started
    assert result.exit_code != 0
    assert "BACKEND_UNAVAILABLE" in result.output
    assert f"127.0.0.1:{port}" in result.output
    assert SECRET not in result.output
    assert elapsed < BOUND_SECONDS, f"{elapsed:.2f} s"


# -- once the endpoint has answered, a refused connect is retried -----------------------


class Forwarder:
    """A TCP forwarder on a fixed loopback port that can stop (connections refused, open
    ones cut) and listen again: a DynamoDB endpoint restarting."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.update((writer, up_writer))

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        try:
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        finally:
            self._writers.difference_update((writer, up_writer))


@pytest_asyncio.fixture
async def forwarder(dynamodb_base_url: str) -> AsyncIterator[Forwarder]:
    endpoint = StoreURL.parse(dynamodb_base_url).query_get("endpoint_url") or ""
    host, _, port = endpoint.removeprefix("http://").rstrip("/").rpartition(":")
    made = Forwarder((host, int(port)))
    await made.start()
    yield made
    await made.stop()


async def test_a_restart_of_an_endpoint_that_answered_is_retried(
    dynamodb_url: str, forwarder: Forwarder
) -> None:
    """The endpoint answers, then refuses connections for 0.3 s: a read made meanwhile
    succeeds through botocore's retries (up to 5 attempts, a 20 s deadline), instead of
    failing after two attempts as for an endpoint never reached."""
    url = with_options(dynamodb_url, endpoint_url=f"http://127.0.0.1:{forwarder.port}")
    async with open_kv(url) as kv:
        await kv.setup()
        version = await kv.create("s", "k", b"v")
        await forwarder.stop()
        # Refused now: a fresh store (never answered) fails fast on the same endpoint.
        async with open_kv(url) as fresh:
            with pytest.raises(BackendUnavailableError, match=f"in {CONNECT_ATTEMPTS} attempts"):
                await fresh.get("s", "k")

        async def restart() -> None:
            await asyncio.sleep(0.3)
            await forwarder.start()

        restarting = asyncio.create_task(restart())
        entry = await kv.get("s", "k")
        await restarting
    assert entry is not None and entry.version == version
