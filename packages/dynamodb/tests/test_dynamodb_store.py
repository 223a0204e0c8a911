"""DynamoDB-specific behaviour on the moto server: limits, the missing table and the setup
command, an unreachable endpoint, byte order of non-ASCII keys, ready clients, no secret
in any output."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Any

import pytest
from agent_stores import StoreURL, open_kv
from agent_stores.cli import cli
from agent_stores.errors import BackendUnavailableError, ValueTooLargeError
from agent_stores.kv.base import Create
from agent_stores_dynamodb.kv import DynamoDBKV, TableMissingError
from click.testing import CliRunner
from dynamodb_test_support import with_options

KEY_ID = "AKIATESTKEYID0042"


def with_secret(url: str) -> tuple[str, str]:
    """``url`` with a distinctive dummy key (moto accepts any) and its secret."""
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    parsed = StoreURL.parse(url).set(username=KEY_ID, password=secret)
    return parsed.render_with_secrets(), secret


def assert_hidden(secret: str, *texts: str) -> None:
    for text in texts:
        assert secret not in text
        assert KEY_ID not in text


async def test_500_kb_value_is_refused_and_nothing_written(dynamodb_url: str) -> None:
    """A 500 KB value raises ValueTooLargeError; neither create nor replace writes anything."""
    async with open_kv(dynamodb_url) as kv:
        await kv.setup()
        assert kv.limits.max_value_bytes == 400_000
        with pytest.raises(ValueTooLargeError) as info:
            await kv.create("s", "big", b"x" * 500_000)
        assert info.value.limit == 400_000 and info.value.size == 500_000
        assert await kv.get("s", "big") is None
        version = await kv.create("s", "big", b"small")
        with pytest.raises(ValueTooLargeError):
            await kv.replace("s", "big", b"x" * 500_000, expected_version=version)
        entry = await kv.get("s", "big")
        assert entry is not None and entry.value == b"small" and entry.version == version
        assert [i.key for i in await kv.scan("s")] == ["big"]


async def test_commit_over_transaction_limits_writes_nothing(dynamodb_url: str) -> None:
    """Over 100 operations or 4 MB, commit raises ValueTooLargeError before any request."""
    async with open_kv(dynamodb_url) as kv:
        await kv.setup()
        with pytest.raises(ValueTooLargeError):
            await kv.commit("s", [Create(f"k{i:03d}", b"v") for i in range(101)])
        with pytest.raises(ValueTooLargeError):
            await kv.commit("s", [Create(f"k{i:03d}", b"v" * 390_000) for i in range(11)])
        assert await kv.scan("s") == []
        versions = await kv.commit("s", [Create(f"k{i:03d}", b"v") for i in range(100)])
        assert len(versions) == 100 and len(await kv.scan("s", limit=1000)) == 100


async def test_missing_table_names_the_setup_command(dynamodb_base_url: str) -> None:
    """Without setup, the first request raises TableMissingError naming `agent-stores setup`;
    `agent-stores setup URL` creates the table with TTL, twice is fine, then the store works."""
    table = f"agent-stores-missing-{uuid.uuid4().hex[:8]}"
    url, secret = with_secret(
        StoreURL.parse(dynamodb_base_url).set(host=table).render_with_secrets()
    )
    kv = open_kv(url)
    try:
        with pytest.raises(TableMissingError) as info:
            await kv.get("s", "k")
        message = str(info.value)
        assert "agent-stores setup" in message and table in message
        assert_hidden(secret, message, repr(info.value))
        with pytest.raises(TableMissingError):
            await kv.create("s", "k", b"v")
    finally:
        await kv.aclose()

    runner = CliRunner()
    for _ in range(2):
        # The command runs its own event loop: give it a thread of its own.
        result = await asyncio.to_thread(runner.invoke, cli, ["setup", url], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        # The core's URL rendering shows the key id like a user name; never the secret.
        assert secret not in result.output
        assert "set up dynamodb://" in result.output

    async with open_kv(url) as kv:
        assert isinstance(kv, DynamoDBKV)
        version = await kv.create("s", "k", b"v")
        entry = await kv.get("s", "k")
        assert entry is not None and entry.version == version
        client = await kv._get_client()  # inspect what setup created
        ttl = await client.describe_time_to_live(TableName=table)
        assert ttl["TimeToLiveDescription"]["TimeToLiveStatus"] in ("ENABLED", "ENABLING")
        assert ttl["TimeToLiveDescription"]["AttributeName"] == "ttl"
        described = await client.describe_table(TableName=table)
        assert described["Table"]["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_endpoint_is_backend_unavailable(
    dynamodb_base_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing listening: BackendUnavailableError (a ConnectionError) after botocore's retries;
    the secret is in no message, repr or log line (DEBUG included)."""
    caplog.set_level(logging.DEBUG)
    url, secret = with_secret(
        with_options(
            dynamodb_base_url,
            endpoint_url=f"http://127.0.0.1:{_closed_port()}",
            max_attempts="2",
            connect_timeout="1",
        )
    )
    kv = open_kv(url)
    try:
        for call in (kv.get("s", "k"), kv.create("s", "k", b"v"), kv.setup()):
            with pytest.raises(BackendUnavailableError) as info:
                await call
            assert isinstance(info.value, ConnectionError)
            assert_hidden(secret, str(info.value), repr(info.value))
        assert_hidden(secret, repr(kv), kv.describe())
        # botocore's own DEBUG lines carry the key id in the signed Authorization header
        # (as every AWS SDK does); the secret itself is never sent, let alone logged.
        assert secret not in caplog.text
        ours = [r.getMessage() for r in caplog.records if r.name.startswith("agent_stores")]
        assert_hidden(secret, *ours)
    finally:
        await kv.aclose()


# Code points whose UTF-16 order differs from their UTF-8 byte order (surrogate pairs sort
# below U+E000..U+FFFF in UTF-16): the contract's order is UTF-8 bytes = code points.
NON_ASCII_KEYS = [
    "\uffff",
    "\U00010000",
    "\ue000",
    "\U0001f600",
    "日本",
    "日",
    "日\U0001f600",
    "é",
    "e\u0301",
    "z",
    "\u00ff",
    "\u0100",
]


async def test_non_ascii_keys_scan_in_byte_order(dynamodb_url: str) -> None:
    """DynamoDB orders string sort keys by UTF-8 bytes: scan, prefixes and start_after agree
    with the contract's code point order for keys beyond the BMP too."""
    expected = sorted(NON_ASCII_KEYS, key=lambda k: k.encode())
    assert expected != sorted(NON_ASCII_KEYS, key=lambda k: k.encode("utf-16-be"))
    async with open_kv(dynamodb_url) as kv:
        await kv.setup()
        for key in NON_ASCII_KEYS:
            await kv.create("s", key, key.encode())
        assert [i.key for i in await kv.scan("s")] == expected
        paged = [i.key async for i in kv.iter_scan("s", page_size=1)]
        assert paged == expected
        assert [i.key for i in await kv.scan("s", prefix="日")] == ["日", "日本", "日\U0001f600"]
        after = await kv.scan("s", prefix="日", start_after="日本")
        assert [i.key for i in after] == ["日\U0001f600"]
        after_bmp = await kv.scan("s", start_after="\uffff")
        assert [i.key for i in after_bmp] == ["\U00010000", "\U0001f600"]


async def test_ready_client_is_used_and_not_closed(dynamodb_base_url: str) -> None:
    """open_kv(aiobotocore client, table=…) wraps it; closing the store leaves it open."""
    from agent_stores_dynamodb.config import parse_url
    from aiobotocore.session import get_session

    settings = parse_url(dynamodb_base_url)
    calls: list[str] = []

    def count(event_name: str, **_: Any) -> None:
        calls.append(event_name.rsplit(".", 1)[-1])

    async with get_session().create_client("dynamodb", **settings.client_kwargs()) as client:
        client.meta.events.register("before-call.dynamodb", count)
        prefix = f"t-{uuid.uuid4().hex[:12]}"
        kv = open_kv(client, table=settings.table, prefix=prefix)
        assert isinstance(kv, DynamoDBKV)
        await kv.setup()
        calls.clear()
        version = await kv.create("s", "k", b"v")
        await kv.replace("s", "k", b"w", expected_version=version)
        assert calls == ["PutItem", "PutItem"]
        await kv.aclose()
        listed = await client.list_tables()
        assert settings.table in listed["TableNames"]
        assert kv.describe() == f"dynamodb://{settings.table}?prefix={prefix}"
