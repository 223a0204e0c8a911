"""Firestore URLs: forms, options and errors, with nothing secret in any message."""

from __future__ import annotations

import pytest
from agent_stores.errors import ConfigError
from agent_stores.kv.base import DEFAULT_DEADLINE_SECONDS
from agent_stores_firestore.config import (
    DEFAULT_DATABASE,
    DEFAULT_PREFIX,
    EMULATOR_ENV,
    HARD_MAX_VALUE_BYTES,
    parse_url,
)


def test_minimal_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATOR_ENV, raising=False)
    settings = parse_url("firestore://my-project/agent-state")
    assert settings.project == "my-project"
    assert settings.collection == "agent-state"
    assert settings.database == DEFAULT_DATABASE
    assert settings.prefix == DEFAULT_PREFIX
    assert settings.emulator_host is None
    assert settings.deadline == DEFAULT_DEADLINE_SECONDS


def test_emulator_variable_is_read_and_the_option_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATOR_ENV, "localhost:8080")
    assert parse_url("firestore://p/c").emulator_host == "localhost:8080"
    assert parse_url("firestore://p/c?emulator_host=127.0.0.1:9").emulator_host == "127.0.0.1:9"
    monkeypatch.setenv(EMULATOR_ENV, "nonsense")
    with pytest.raises(ConfigError, match=EMULATOR_ENV):
        parse_url("firestore://p/c")


def test_every_option() -> None:
    settings = parse_url(
        "firestore://p1/root/doc/sub?database=agents&prefix=app1&emulator_host=127.0.0.1:8080"
        "&timeout=2.5&retries=0&max_value_bytes=4096&deadline=7.5"
    )
    assert settings.collection == "root/doc/sub"
    assert settings.database == "agents"
    assert settings.prefix == "app1"
    assert settings.emulator_host == "127.0.0.1:8080"
    assert settings.timeout == 2.5
    assert settings.retries == 0
    assert settings.max_value_bytes == 4096
    assert settings.deadline == 7.5


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("firestore:///coll", "project"),
        ("firestore://p", "collection"),
        ("firestore://p/a/b", "odd number"),
        ("firestore://p/__x__", "reserved"),
        ("firestore://p/..", "'.' or '..'"),
        ("firestore://p/c?databse=x", "unknown query option"),
        ("firestore://p/c?database=Bad_Name", "database"),
        ("firestore://p/c?emulator_host=nohost", "HOST:PORT"),
        ("firestore://p/c?timeout=soon", "number of seconds"),
        ("firestore://p/c?deadline=soon", "number of seconds"),
        ("firestore://p/c?deadline=0.1", "deadline must be >= 0.5"),
        (f"firestore://p/c?max_value_bytes={HARD_MAX_VALUE_BYTES + 1}", "1 MiB"),
        ("firestore://p:1/c", "no user, password or port"),
        ("redis://p/c", "not a Firestore URL"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_url(url)


def test_no_secret_in_errors() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_url("firestore://user:hunter2@p/c")
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(caught.value)
    with pytest.raises(ConfigError) as caught:
        parse_url("firestore://p/c?token=s3cr3t-value")
    assert "s3cr3t-value" not in str(caught.value)
