"""dynamodb:// URLs: parsing, validation and redaction (no server needed)."""

from __future__ import annotations

import pytest
from agent_stores import open_kv
from agent_stores.errors import ConfigError
from agent_stores_dynamodb.config import parse_url
from agent_stores_dynamodb.kv import DynamoDBKV

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYzz"
KEY_ID = "AKIAZZZZEXAMPLE42"


def test_minimal_url() -> None:
    """The host names the table; region, endpoint and prefix come from the query."""
    settings = parse_url(
        "dynamodb://agent-state?region=eu-west-1&endpoint_url=http://127.0.0.1:8000&prefix=app1"
    )
    assert settings.table == "agent-state"
    assert settings.region == "eu-west-1"
    assert settings.endpoint_url == "http://127.0.0.1:8000"
    assert settings.prefix == "app1"
    assert settings.credentials == {}
    assert settings.client_kwargs() == {
        "region_name": "eu-west-1",
        "endpoint_url": "http://127.0.0.1:8000",
    }


def test_mixed_case_table_kept_as_written() -> None:
    """Table names are case-sensitive: the host keeps its capitals, as ?table= does."""
    assert parse_url("dynamodb://AgentState?region=us-east-1").table == "AgentState"
    assert parse_url("dynamodb://?table=AgentState&region=us-east-1").table == "AgentState"
    assert parse_url("dynamodb://AgentState?table=AgentState").table == "AgentState"
    with pytest.raises(ConfigError, match="table given twice"):
        parse_url("dynamodb://agentstate?table=AgentState")
    with pytest.raises(ConfigError, match="table given twice"):
        parse_url("dynamodb://other?table=AgentState")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("dynamodb://t?regoin=us-east-1", "unknown query option"),
        ("dynamodb://", "missing table"),
        ("dynamodb://ab", "3-255"),
        ("dynamodb://table/extra", "names only a table"),
        ("dynamodb://table:8000", "names only a table"),
        ("dynamodb://table?prefix=a/b", "prefix"),
        ("dynamodb://table?endpoint_url=ftp://x", "endpoint_url"),
        ("dynamodb://table?max_attempts=0", "max_attempts"),
        ("dynamodb://table?read_timeout=soon", "read_timeout"),
        ("dynamodb://table?deadline=0.1", "deadline"),
        ("dynamodb://table?deadline=never", "deadline"),
        (f"dynamodb://{KEY_ID}@table", "both the key id and the secret"),
        (f"dynamodb://table?aws_secret_access_key={SECRET}", "go together"),
        (f"dynamodb://{KEY_ID}:{SECRET}@table?profile=prod", "either profile"),
        ("redis://table", "not a DynamoDB URL"),
    ],
)
def test_bad_urls_are_config_errors(url: str, message: str) -> None:
    """Every malformed URL is a ConfigError naming the problem, never showing the secret."""
    with pytest.raises(ConfigError, match=message) as info:
        parse_url(url)
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert KEY_ID not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        f"dynamodb://{KEY_ID}:{SECRET}@table?region=us-east-1",
        f"dynamodb://table?region=us-east-1&aws_access_key_id={KEY_ID}"
        f"&aws_secret_access_key={SECRET}&aws_session_token={SECRET}tok",
    ],
)
def test_credentials_in_url_are_used_and_hidden(url: str) -> None:
    """The escape hatch hands the key to botocore and masks it in describe() and repr()."""
    settings = parse_url(url)
    assert settings.credentials["aws_access_key_id"] == KEY_ID
    assert settings.credentials["aws_secret_access_key"] == SECRET
    assert settings.client_kwargs()["aws_secret_access_key"] == SECRET
    kv = open_kv(url)
    assert isinstance(kv, DynamoDBKV)
    for text in (kv.describe(), repr(kv), repr(settings), str(settings)):
        assert SECRET not in text and KEY_ID not in text
        assert "***" in text


def test_deadline_sizes_timeouts_and_attempts() -> None:
    """``deadline`` sets kv.deadline_seconds and, unless given, the timeouts and botocore's
    attempts so that two read timeouts and the worst-case backoff fit inside it."""
    default = parse_url("dynamodb://table")
    assert (default.deadline, default.connect_timeout, default.read_timeout) == (20.0, 5.0, 10.0)
    assert default.max_attempts == 5
    short = parse_url("dynamodb://table?deadline=3")
    assert (short.deadline, short.connect_timeout, short.read_timeout) == (3.0, 0.75, 1.5)
    assert short.max_attempts == 2
    explicit = parse_url("dynamodb://table?deadline=3&read_timeout=2&max_attempts=4")
    assert (explicit.read_timeout, explicit.max_attempts) == (2.0, 4)
    kv = open_kv("dynamodb://table?deadline=3")
    assert isinstance(kv, DynamoDBKV) and kv.deadline_seconds == 3.0
    assert "deadline=3" in kv.describe()
