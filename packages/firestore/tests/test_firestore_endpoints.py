"""Reaching the endpoint: nothing there fails fast and says what was tried, a restart of an
emulator that answered is waited out, and a credentials file named but absent is reported
as such."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import agent_stores_firestore.client  # noqa: F401  (imported lazily by the store: see below)
import pytest
from agent_stores import StoreURL, open_kv
from agent_stores.errors import BackendUnavailableError, ConfigError
from agent_stores_firestore.config import CREDENTIALS_ENV, EMULATOR_ENV
from firestore_proxy import SilentProxy
from firestore_test_support import emulator_port

#: The bound the refused-connection test holds the store to. The Google client library is
#: imported above, not inside the timed call: its first import (once per process, seconds
#: on a busy machine) is no part of how the store handles a refused connection.
FAST = 3.0


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound but not listening, and held for the
    test, so no other program on the machine can start listening there meanwhile (a port
    merely released could be handed to another test's silent server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_a_refused_port_fails_fast_naming_the_endpoint(closed_port: int) -> None:
    """Nothing listens at emulator_host: setup() and a KV call each raise
    BackendUnavailableError within 3 s (not after the 20 s deadline), naming host:port."""
    port = closed_port
    kv = open_kv(f"firestore://p/c?emulator_host=127.0.0.1:{port}")
    try:
        for call in (kv.setup, lambda: kv.get("s", "k")):
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as caught:
                await call()
            elapsed = time.monotonic() - started
            message = str(caught.value)
            assert elapsed < FAST, f"took {elapsed:.1f} s: {message}"
            assert f"nothing answers at 127.0.0.1:{port}" in message
            assert "emulator_host" in message
    finally:
        await kv.aclose()


async def test_a_restart_of_an_emulator_that_answered_is_waited_out(firestore_url: str) -> None:
    """Once the emulator has answered, refused connections are a restart: a call made while
    it is down keeps retrying past the short grace of a never-reached endpoint, and
    succeeds when it is back."""
    proxy = await SilentProxy("127.0.0.1", emulator_port(firestore_url)).start()
    url = StoreURL.parse(firestore_url).with_query(emulator_host=proxy.host, retries="40")
    kv = open_kv(url.render_with_secrets())
    try:
        await kv.create("s", "k", b"v")
        await proxy.down()
        pending = asyncio.ensure_future(kv.get("s", "k"))
        await asyncio.sleep(1.5)
        assert not pending.done(), pending
        await proxy.up()
        entry = await asyncio.wait_for(pending, 20)
        assert entry is not None and entry.value == b"v"
    finally:
        await kv.aclose()
        await proxy.aclose()


# -- GOOGLE_APPLICATION_CREDENTIALS -------------------------------------------------------------


@pytest.fixture
def no_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATOR_ENV, raising=False)


@pytest.mark.usefixtures("no_emulator")
async def test_a_credentials_file_that_does_not_exist_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "no Google credentials found": the variable names a path that is not there."""
    missing = tmp_path / "keys" / "service-account.json"
    monkeypatch.setenv(CREDENTIALS_ENV, str(missing))
    kv = open_kv("firestore://my-project/c")
    try:
        expected = f"GOOGLE_APPLICATION_CREDENTIALS names {missing}, which does not exist"
        for call in (kv.setup, lambda: kv.get("s", "k")):
            with pytest.raises(ConfigError, match=re.escape(expected)) as caught:
                await call()
            assert "no Google credentials" not in str(caught.value)
    finally:
        await kv.aclose()


@pytest.mark.usefixtures("no_emulator")
async def test_a_credentials_path_that_is_a_folder_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CREDENTIALS_ENV, str(tmp_path))
    kv = open_kv("firestore://my-project/c")
    try:
        with pytest.raises(ConfigError, match=re.escape(f"names {tmp_path}, which is not a file")):
            await kv.setup()
    finally:
        await kv.aclose()


@pytest.mark.usefixtures("no_emulator")
async def test_a_credentials_file_google_cannot_load_is_named_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that is there but is no credentials file: google-auth's reason, the path."""
    bogus = tmp_path / "key.json"
    bogus.write_text('{"type": "not-a-credential-type"}')
    monkeypatch.setenv(CREDENTIALS_ENV, str(bogus))
    kv = open_kv("firestore://my-project/c")
    try:
        with pytest.raises(ConfigError, match=re.escape(f"names {bogus}, which could not be")):
            await kv.setup()
    finally:
        await kv.aclose()


async def test_the_emulator_needs_no_credentials_file(
    firestore_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With emulator_host the variable is not consulted (anonymous credentials)."""
    monkeypatch.setenv(CREDENTIALS_ENV, str(tmp_path / "missing.json"))
    async with open_kv(firestore_url) as kv:
        await kv.setup()
