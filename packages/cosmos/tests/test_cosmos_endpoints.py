"""Reaching the endpoint: nothing there fails fast, a restart is waited out, and TLS with a
certificate of one's own (Microsoft's emulator serves a self-signed one) is trusted only
as the URL says (``verify=false``, ``ca_file=``).

Microsoft's emulator itself cannot run here (it needs Docker): the TLS tests put a TLS
front with a CA of our own in front of the npm test server, on 127.0.0.2 (a loopback
address azure-cosmos does not exempt from certificate checks, unlike 127.0.0.1 and
localhost).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from agent_stores import BackendUnavailableError, StoreURL, open_kv
from agent_stores_cosmos.faults import CosmosFaultInjector, FaultTransport
from agent_stores_cosmos.kv import CosmosKV
from cosmos_tcp_front import OPENSSL, Certificates, TCPFront, make_certificates

KEY = "C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
QUOTED_KEY = KEY.replace("/", "%2F").replace("+", "%2B").replace("=", "%3D")
#: The bound the refused-connection tests hold the store to. azure.cosmos is imported above
#: (through the fault injector), not inside the timed call: its first import (once per
#: process) is no part of how the store handles a refused connection.
FAST = 3.0


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound but not listening, and held for the
    test, so no other program on the machine can start listening there meanwhile (a port
    merely released could be handed to another test's silent server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def _target(url: str) -> tuple[str, int]:
    parsed = StoreURL.parse(url)
    assert parsed.host is not None and parsed.port is not None
    return parsed.host, parsed.port


# -- nothing there ----------------------------------------------------------------------------


@pytest.mark.parametrize("tls", ["tls=false&", ""])
async def test_a_refused_port_fails_fast_naming_the_endpoint(tls: str, closed_port: int) -> None:
    """Nothing listens on the port: setup() and a KV call each raise BackendUnavailableError
    within 3 s (not after the 20 s deadline), naming host:port, never the key."""
    port = closed_port
    kv = open_kv(f"cosmos://127.0.0.1:{port}/db/c?{tls}key={QUOTED_KEY}")
    try:
        for call in (kv.setup, lambda: kv.get("s", "k")):
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as caught:
                await call()
            elapsed = time.monotonic() - started
            message = str(caught.value)
            assert elapsed < FAST, f"took {elapsed:.1f} s: {message}"
            assert f"connection refused by 127.0.0.1:{port}" in message
            assert KEY not in message and QUOTED_KEY not in message
    finally:
        await kv.aclose()


async def test_an_unknown_host_fails_fast() -> None:
    """A host name that does not exist fails like a refused port (where the resolver here
    says "not found" at once; a resolver that cannot answer is retried instead)."""
    host = "no-such-account.invalid"
    try:
        await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, 443), 2)
    except socket.gaierror as exc:
        if exc.errno not in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", None)):
            pytest.skip(f"this machine's resolver answers {exc}")
    except TimeoutError:
        pytest.skip("this machine's resolver does not answer")
    else:
        pytest.skip(f"{host} resolves here")
    kv = open_kv(f"cosmos://{host}/db/c?key={QUOTED_KEY}")
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError, match=f"host {host} not found"):
            await kv.get("s", "k")
        assert time.monotonic() - started < FAST
    finally:
        await kv.aclose()


async def test_a_restart_of_a_service_that_answered_is_waited_out(cosmos_url: str) -> None:
    """Once the service has answered, refused connections are a restart: a call made while
    it is down keeps retrying (well past the short grace of a never-reached endpoint) and
    succeeds when it is back."""
    front = await TCPFront(_target(cosmos_url)).up()
    # Retries enough for any backoff draw to outlast the 1.5 s the front is down.
    through = StoreURL.parse(cosmos_url).set(port=front.port).with_query(retries="40")
    kv = open_kv(through.render_with_secrets())
    assert isinstance(kv, CosmosKV)
    try:
        await kv.setup()
        await kv.create("s", "k", b"v")
        await front.down()
        pending = asyncio.ensure_future(kv.get("s", "k"))
        await asyncio.sleep(1.5)
        assert not pending.done(), pending
        await front.up()
        entry = await asyncio.wait_for(pending, 20)
        assert entry is not None and entry.value == b"v"
        assert kv.stats.retries.get("connection", 0) >= 3
    finally:
        await kv.aclose()
        await front.down()


# -- TLS options reach the client ---------------------------------------------------------------


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    if OPENSSL is None:
        pytest.skip("needs the openssl command")
    return make_certificates(tmp_path_factory.mktemp("tls"))


async def test_verify_false_reaches_the_client() -> None:
    """verify=false becomes azure-cosmos's connection_verify=False (its policy's switch)."""
    kv = CosmosKV.from_url(f"cosmos://127.0.0.2:8081/db/c?verify=false&key={QUOTED_KEY}")
    client = kv._build_client()
    try:
        assert client.client_connection.connection_policy.DisableSSLVerification is True
    finally:
        await client.close()
    kv = CosmosKV.from_url(f"cosmos://127.0.0.2:8081/db/c?key={QUOTED_KEY}")
    client = kv._build_client()
    try:
        assert client.client_connection.connection_policy.DisableSSLVerification is False
    finally:
        await client.close()


async def test_ca_file_reaches_the_transport(certificates: Certificates) -> None:
    """ca_file becomes the TLS context of the client's aiohttp connector, also underneath
    the fault injector's transport."""
    url = f"cosmos://127.0.0.2:8081/db/c?ca_file={certificates.ca}&key={QUOTED_KEY}"
    kv = CosmosKV.from_url(url)
    client = kv._build_client()
    try:
        transport = client.client_connection.pipeline_client._pipeline._transport
        context = transport.session.connector._ssl
        assert isinstance(context, ssl.SSLContext)
        subjects = [dict(part[0] for part in c["subject"]) for c in context.get_ca_certs()]
        assert {"commonName": "agent-stores test CA"} in subjects
    finally:
        await client.close()
    injected = await CosmosFaultInjector().open_kv(url)
    assert isinstance(injected, CosmosKV)
    client = injected._build_client()
    try:
        wrapper = injected._transport
        assert isinstance(wrapper, FaultTransport)
        assert wrapper.inner.session.connector._ssl.get_ca_certs()
    finally:
        await client.close()


# -- TLS with a certificate of our own, end to end ---------------------------------------------


@pytest.fixture
async def tls_front(cosmos_url: str, certificates: Certificates) -> AsyncIterator[str]:
    """A TLS front on 127.0.0.2 with our certificate; yields the test URL pointing at it
    (``tls=false`` dropped: https)."""
    front = await TCPFront(_target(cosmos_url), host="127.0.0.2", tls=certificates).up()
    url = StoreURL.parse(cosmos_url).set(host="127.0.0.2", port=front.port).without_query("tls")
    try:
        yield url.render_with_secrets()
    finally:
        await front.down()


def _with(url: str, **options: str) -> str:
    return StoreURL.parse(url).with_query(**options).render_with_secrets()


async def _round_trip(url: str) -> None:
    async with open_kv(url) as kv:
        await kv.create("s", "k", b"over tls")
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"over tls"


async def test_an_untrusted_certificate_fails_at_once_saying_how_to_trust_it(
    tls_front: str,
) -> None:
    """Without verify=false or ca_file the self-signed chain is refused: a typed error
    naming ca_file, at the first attempt (the same certificate would fail every retry)."""
    kv = open_kv(tls_front)
    assert isinstance(kv, CosmosKV)
    try:
        with pytest.raises(BackendUnavailableError, match=r"not trusted.*ca_file") as caught:
            await kv.get("s", "k")
        assert "certificate" in str(caught.value)
        assert kv.stats.retries == {}
    finally:
        await kv.aclose()


async def test_verify_false_talks_to_a_self_signed_endpoint(tls_front: str) -> None:
    await _round_trip(_with(tls_front, verify="false"))


async def test_ca_file_trusts_that_certificate_only(
    tls_front: str, certificates: Certificates, tmp_path: Path
) -> None:
    """ca_file with the endpoint's CA works; with another CA the chain is refused."""
    await _round_trip(_with(tls_front, ca_file=str(certificates.ca)))
    other = make_certificates(tmp_path, name="other")
    async with open_kv(_with(tls_front, ca_file=str(other.ca))) as kv:
        with pytest.raises(BackendUnavailableError, match="not trusted"):
            await kv.get("s", "k")


async def test_a_ca_file_that_holds_no_certificate_is_a_config_error(tmp_path: Path) -> None:
    from agent_stores import ConfigError

    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    kv = open_kv(f"cosmos://127.0.0.2:8081/db/c?ca_file={junk}&key={QUOTED_KEY}")
    try:
        with pytest.raises(ConfigError, match="ca_file"):
            await kv.get("s", "k")
    finally:
        await kv.aclose()
