"""Which region a store talks to, and what a read of a table absent there does.

The region is the URL's ``?region=``, else ``AWS_REGION``, else ``AWS_DEFAULT_REGION``,
else the profile's; botocore alone reads only the last two. moto keeps one set of tables
per region (from the request's signature), so ``setup`` creating the table in exactly one
region, seen with boto3's ``list_tables`` in each, shows which region was used. A read of
a table that is absent in its region raises TableMissingError (a ConfigError) naming the
table, the region and ``agent-stores setup``, and creates nothing anywhere.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import boto3
import pytest
from agent_stores import ConfigError, StoreURL, open_kv
from agent_stores.kv.base import KVStore
from agent_stores_dynamodb.kv import TableMissingError

REGIONS = ("ap-south-1", "eu-west-1", "eu-west-2", "eu-west-3", "us-east-1")
PROFILE_REGION = "eu-west-3"


class Moto:
    """The moto server's endpoint and key, and a boto3 client per region."""

    def __init__(self, base_url: str) -> None:
        parsed = StoreURL.parse(base_url)
        self.endpoint = parsed.query_get("endpoint_url") or ""
        self.key_id = parsed.username or "testing"
        self.secret = parsed.password or "testing"

    def url(self, table: str, **options: str) -> str:
        query = "&".join(
            f"{k}={quote(v, safe='')}"
            for k, v in {"endpoint_url": self.endpoint, **options}.items()
        )
        return f"dynamodb://{self.key_id}:{self.secret}@{table}?{query}"

    def client(self, region: str) -> Any:
        return boto3.client(
            "dynamodb",
            region_name=region,
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        )

    def tables(self, region: str) -> list[str]:
        # Every page: the contract's classes in this session make a table per test.
        pages = self.client(region).get_paginator("list_tables").paginate()
        return [name for page in pages for name in page["TableNames"]]

    def regions_with(self, table: str) -> list[str]:
        return [r for r in REGIONS if table in self.tables(r)]

    def drop(self, table: str) -> None:
        for region in self.regions_with(table):
            self.client(region).delete_table(TableName=table)


@pytest.fixture
def moto(dynamodb_base_url: str) -> Moto:
    return Moto(dynamodb_base_url)


@pytest.fixture
def table(moto: Moto) -> Iterator[str]:
    name = f"agent-stores-region-{uuid.uuid4().hex[:10]}"
    yield name
    moto.drop(name)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No region in the environment, and a shared config file whose default profile has
    ``PROFILE_REGION`` (nothing of the machine's own AWS setup leaks in)."""
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nregion = {PROFILE_REGION}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("url_region", "aws_region", "aws_default_region", "expected"),
    [
        pytest.param("ap-south-1", "eu-west-1", "eu-west-2", "ap-south-1", id="url-first"),
        pytest.param(None, "eu-west-1", "eu-west-2", "eu-west-1", id="AWS_REGION-next"),
        pytest.param(None, None, "eu-west-2", "eu-west-2", id="AWS_DEFAULT_REGION-next"),
        pytest.param(None, None, None, PROFILE_REGION, id="profile-last"),
    ],
)
async def test_region_resolution_order(
    url_region: str | None,
    aws_region: str | None,
    aws_default_region: str | None,
    expected: str,
    moto: Moto,
    table: str,
    aws_env: pytest.MonkeyPatch,
) -> None:
    if aws_region is not None:
        aws_env.setenv("AWS_REGION", aws_region)
    if aws_default_region is not None:
        aws_env.setenv("AWS_DEFAULT_REGION", aws_default_region)
    environ = dict(os.environ)
    options = {"region": url_region} if url_region else {}
    async with open_kv(moto.url(table, **options)) as kv:
        await kv.setup()
        await kv.create("s", "k", b"v")
        entry = await kv.get("s", "k")
    assert entry is not None and entry.value == b"v"
    assert moto.regions_with(table) == [expected]
    assert dict(os.environ) == environ  # resolved, never written to the environment


async def test_an_invalid_aws_region_is_a_config_error(
    moto: Moto, table: str, aws_env: pytest.MonkeyPatch
) -> None:
    aws_env.setenv("AWS_REGION", "eu west 1")
    async with open_kv(moto.url(table)) as kv:
        with pytest.raises(ConfigError, match="AWS_REGION='eu west 1' is not an AWS region"):
            await kv.get("s", "k")


async def test_no_region_anywhere_names_aws_region(
    moto: Moto, table: str, aws_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    empty = tmp_path / "empty-config"
    empty.write_text("")
    aws_env.setenv("AWS_CONFIG_FILE", str(empty))
    async with open_kv(moto.url(table)) as kv:
        with pytest.raises(ConfigError) as info:
            await kv.get("s", "k")
    assert "no AWS region" in info.value.detail
    assert "?region=" in info.value.detail and "AWS_REGION" in info.value.detail
    assert moto.regions_with(table) == []


# -- a read where the table is absent ---------------------------------------------------

READS: dict[str, Callable[[KVStore], Awaitable[Any]]] = {
    "get": lambda kv: kv.get("s", "k"),
    "get_many": lambda kv: kv.get_many("s", ["a", "b"]),
    "scan": lambda kv: kv.scan("s"),
}


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("how", ["url", "AWS_REGION"])
async def test_a_read_where_the_table_is_absent_names_it_and_creates_nothing(
    read: str, how: str, moto: Moto, table: str, aws_env: pytest.MonkeyPatch
) -> None:
    """The table exists in us-east-1 only; a store reading it in eu-west-1 (by the URL or
    by AWS_REGION) gets TableMissingError naming table, region and the setup command,
    and no table appears in eu-west-1 (nor anywhere else)."""
    async with open_kv(moto.url(table, region="us-east-1")) as kv:
        await kv.setup()
    assert moto.regions_with(table) == ["us-east-1"]
    if how == "url":
        url = moto.url(table, region="eu-west-1")
        source = "?region="
    else:
        aws_env.setenv("AWS_REGION", "eu-west-1")
        url = moto.url(table)
        source = "AWS_REGION"
    async with open_kv(url) as kv:
        with pytest.raises(TableMissingError) as info:
            await READS[read](kv)
    error = info.value
    assert isinstance(error, ConfigError)
    assert repr(table) in error.detail
    assert "region eu-west-1" in error.detail and source in error.detail
    assert f"agent-stores setup 'dynamodb://***:***@{table}?" in error.detail
    assert f"{moto.key_id}:{moto.secret}@" not in str(error)
    assert table not in moto.tables("eu-west-1")
    assert moto.regions_with(table) == ["us-east-1"]


async def test_a_read_of_a_table_that_exists_nowhere_creates_nothing(
    moto: Moto, table: str
) -> None:
    async with open_kv(moto.url(table, region="us-east-1")) as kv:
        for read in READS.values():
            with pytest.raises(TableMissingError, match="agent-stores setup"):
                await read(kv)
    assert moto.regions_with(table) == []


@pytest.mark.parametrize("case", ["misspelt-table", "wrong-region", "lower-cased"])
def test_check_creates_nothing_and_names_the_problem(case: str, moto: Moto, table: str) -> None:
    """`agent-stores check` (read-only by default) on a misspelt table, a wrong region or a
    lower-cased name reports the missing table with the setup command; boto3 then finds no
    table of that name in any region (only the real one, in us-east-1)."""
    from agent_stores.cli import cli
    from click.testing import CliRunner

    real = table.replace("region", "Region")
    checked = {"misspelt-table": real + "x", "wrong-region": real, "lower-cased": real.lower()}
    region = "eu-west-1" if case == "wrong-region" else "us-east-1"
    try:
        assert CliRunner().invoke(cli, ["setup", moto.url(real, region="us-east-1")]).exit_code == 0
        result = CliRunner().invoke(cli, ["check", moto.url(checked[case], region=region)])
        assert result.exit_code == 1, result.output
        assert "does not exist" in result.output and "agent-stores setup" in result.output
        assert f"region {region}" in result.output
        assert "connected" not in result.output
        assert moto.secret not in result.output
        for name in {real, checked[case]}:
            assert moto.regions_with(name) == (["us-east-1"] if name == real else [])
    finally:
        moto.drop(real)
