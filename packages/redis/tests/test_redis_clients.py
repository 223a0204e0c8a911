"""Ready redis-py clients, client ownership, TLS (rediss://) and Unix sockets, on real servers."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest
from agent_stores import BackendUnavailableError, ConfigError, StoreURL, connect, open_kv
from agent_stores_redis import RedisKV
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis_test_support import PrivateServer


def _client_kwargs(url: str) -> tuple[str, int, str]:
    parsed = StoreURL.parse(url)
    assert parsed.host is not None and parsed.port is not None
    return parsed.host, parsed.port, parsed.query_get("prefix") or "p"


async def test_ready_standalone_client_is_shared_not_closed(standalone_url: str) -> None:
    """A ready Redis client works through open_kv/connect; closing the store leaves it open."""
    host, port, prefix = _client_kwargs(standalone_url)
    client = Redis(host=host, port=port)
    try:
        kv = open_kv(client, prefix=prefix)
        assert isinstance(kv, RedisKV) and kv.client is client and not kv.cluster
        assert "ready client" in kv.describe()
        version = await kv.create("s", "k", b"v")
        # The URL-opened store on the same prefix sees the same data.
        async with open_kv(standalone_url) as by_url:
            entry = await by_url.get("s", "k")
            assert entry is not None and entry.version == version
        await kv.aclose()
        assert await client.ping() is True  # still usable: the store did not close it
        conn = connect(client, prefix=prefix)
        assert isinstance(conn.kv, RedisKV)
        assert (await conn.kv.get("s", "k")) is not None
        await conn.aclose()
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_ready_client_with_decode_responses(standalone_url: str) -> None:
    """A client created with decode_responses=True still round-trips arbitrary bytes."""
    host, port, prefix = _client_kwargs(standalone_url)
    client = Redis(host=host, port=port, decode_responses=True)
    try:
        kv = open_kv(client, prefix=prefix)
        blob = bytes(range(256))
        await kv.create("s", "blob", blob)
        entry = await kv.get("s", "blob")
        assert entry is not None and entry.value == blob
        many = await kv.get_many("s", ["blob"])
        assert many["blob"].value == blob
        [item] = await kv.scan("s")
        assert item.entry is not None and item.entry.value == blob
        assert await kv.scopes(prefix="s") == ["s"]
        await kv.aclose()
    finally:
        await client.aclose()


async def test_ready_cluster_client(cluster_url: str) -> None:
    """A ready RedisCluster client works and is not closed by the store."""
    host, port, prefix = _client_kwargs(cluster_url)
    client = RedisCluster(host=host, port=port)
    try:
        kv = open_kv(client, prefix=prefix)
        assert isinstance(kv, RedisKV) and kv.cluster
        assert kv.describe() == f"redis+cluster://{host}:{port} (ready client)"
        scopes = [f"scope-{i}" for i in range(20)]  # spread over the three masters
        for scope in scopes:
            await kv.create(scope, "k", scope.encode())
        assert await kv.scopes(limit=100) == sorted(scopes)
        await kv.aclose()
        assert await client.ping() is True
    finally:
        await client.aclose()


def test_sync_client_refused() -> None:
    """A synchronous redis-py client is refused with a ConfigError naming the asyncio class."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=1)
    try:
        with pytest.raises(ConfigError, match=r"redis\.asyncio"):
            open_kv(client)
    finally:
        client.close()


def test_unknown_client_options_refused() -> None:
    """Options for a ready client other than prefix, max_value_bytes and clock are errors."""
    client = Redis(host="127.0.0.1", port=1)
    with pytest.raises(ConfigError):
        open_kv(client, db=3)
    with pytest.raises(ConfigError):
        open_kv(client, prefix="a{b}")


async def _client_names(port: int) -> list[str]:
    admin = Redis(host="127.0.0.1", port=port)
    try:
        return [c.get("name", "") for c in await admin.client_list()]
    finally:
        await admin.aclose()


async def test_owned_client_closed_on_aclose(private_server: PrivateServer) -> None:
    """A store opened from a URL closes its connections on aclose (checked from the server side)."""
    server = private_server()
    name = f"as-{uuid.uuid4().hex[:8]}"
    kv = open_kv(f"redis://127.0.0.1:{server.port}/0?client_name={name}")
    await asyncio.gather(*(kv.create("s", f"k{i}", b"v") for i in range(5)))
    assert name in await _client_names(server.port)
    await kv.aclose()
    for _ in range(100):
        if name not in await _client_names(server.port):
            break
        await asyncio.sleep(0.02)
    else:
        pytest.fail("the store's connections were still open after aclose")


async def test_db_isolation(private_server: PrivateServer) -> None:
    """/0 and /1 on one server (same prefix) are separate data; ?db= is the same as the path."""
    server = private_server()
    base = f"redis://127.0.0.1:{server.port}"
    async with open_kv(f"{base}/0?prefix=p") as db0, open_kv(f"{base}?db=1&prefix=p") as db1:
        await db0.create("s", "k", b"zero")
        assert await db1.get("s", "k") is None
        await db1.create("s", "k", b"one")
    async with open_kv(f"{base}/1?prefix=p") as again:
        entry = await again.get("s", "k")
        assert entry is not None and entry.value == b"one"


async def test_unix_socket(private_server: PrivateServer, tmp_path: Path) -> None:
    """unix:///path.sock reaches a server through its Unix socket, password in the query hidden."""
    sock = Path("/tmp") / f"as-{uuid.uuid4().hex[:8]}.sock"  # short: socket paths are limited
    server = private_server("--unixsocket", str(sock), "--unixsocketperm", "700", password="pw-x")
    try:
        async with open_kv(f"unix://{sock}?db=2&prefix=u&password=pw-x") as kv:
            assert "pw-x" not in kv.describe()
            await kv.create("s", "k", b"via-socket")
            entry = await kv.get("s", "k")
            assert entry is not None and entry.value == b"via-socket"
        admin = Redis(host="127.0.0.1", port=server.port, password="pw-x", db=2)
        try:
            assert await admin.dbsize() > 0  # it went to db 2 of this very server
        finally:
            await admin.aclose()
    finally:
        sock.unlink(missing_ok=True)


# -- TLS --------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def certificates(tmp_path: Path) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = tmp_path
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "1", "-subj", "/CN=agent-stores test CA", cwd=d)  # fmt: skip
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        extra = ["-extfile", "server.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", *extra, cwd=d)  # fmt: skip
    return d


async def test_tls(private_server: PrivateServer, certificates: Path) -> None:
    """rediss:// verifies the server against ssl_ca_certs and presents ssl_certfile/ssl_keyfile.

    The server requires client certificates: with CA + client certificate it works;
    without the CA the server is not trusted, without the client certificate the server
    refuses: both are BackendUnavailableError. ssl_cert_reqs=none skips verification.
    """
    from redis_test_support import servers

    tls_port = servers.free_port()
    c = certificates
    private_server(
        "--tls-port", str(tls_port),
        "--tls-cert-file", str(c / "server.pem"),
        "--tls-key-file", str(c / "server.key"),
        "--tls-ca-cert-file", str(c / "ca.pem"),
        "--tls-auth-clients", "yes",
    )  # fmt: skip
    base = f"rediss://127.0.0.1:{tls_port}/0?prefix=tls&retries=0&socket_timeout=3"
    good = f"{base}&ssl_ca_certs={c / 'ca.pem'}&ssl_certfile={c / 'client.pem'}&ssl_keyfile={c / 'client.key'}"
    async with open_kv(good) as kv:
        await kv.create("s", "k", b"secure")
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"secure"
    for bad, reason in (
        (f"{base}&ssl_certfile={c / 'client.pem'}&ssl_keyfile={c / 'client.key'}", "CERTIFICATE"),
        (f"{base}&ssl_ca_certs={c / 'ca.pem'}", ""),  # no client certificate: server hangs up
    ):
        async with open_kv(bad) as kv:
            with pytest.raises(BackendUnavailableError) as info:
                await kv.get("s", "k")
            assert reason in str(info.value).upper()
    unverified = (
        f"{base}&ssl_cert_reqs=none&ssl_certfile={c / 'client.pem'}&ssl_keyfile={c / 'client.key'}"
    )
    async with open_kv(unverified) as kv:
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"secure"
