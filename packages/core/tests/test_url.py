"""StoreURL: parsing, immutability and secret hiding."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from agent_stores import BackendNotInstalledError, MalformedURLError, StoreURL, open_kv
from agent_stores.url import redact

SECRET = "s3cret"


def test_parse_components() -> None:
    url = StoreURL.parse("redis://user:s3cret@host:6380/2?prefix=app&socket_timeout=5")
    assert url.scheme == "redis"
    assert url.username == "user"
    assert url.password == SECRET
    assert url.host == "host"
    assert url.port == 6380
    assert url.path == "/2"
    assert url.query_get("prefix") == "app"
    assert url.query_dict == {"prefix": "app", "socket_timeout": "5"}


def test_immutable_and_hashable() -> None:
    url = StoreURL.parse("sqlite:///a.db")
    with pytest.raises(dataclasses.FrozenInstanceError):
        url.path = "/b.db"  # type: ignore[misc]
    assert hash(url) == hash(StoreURL.parse("sqlite:///a.db"))
    changed = url.with_query(max_value_bytes="4096")
    assert url.query == ()
    assert changed.query_get("max_value_bytes") == "4096"


@pytest.mark.parametrize(
    "text",
    [
        "redis://user:s3cret@host/0",
        "postgresql://app:s3cret@db.example:5432/app?sslmode=require",
        "dynamodb://table?region=eu-west-1&aws_secret_access_key=s3cret",
        "dynamodb://table?region=eu-west-1&aws_access_key_id=s3cret",
        "cosmos://account?key=s3cret",
        "firestore://proj/coll?token=s3cret",
        "redis://:s3cret@host",
    ],
)
def test_secrets_never_rendered(text: str) -> None:
    url = StoreURL.parse(text)
    assert SECRET not in str(url)
    assert SECRET not in repr(url)
    assert SECRET not in url.render()
    assert SECRET not in f"{url!r} {url!s}"
    assert SECRET in url.render_with_secrets()
    assert StoreURL.parse(url.render_with_secrets()) == url


def test_password_with_special_characters_round_trips() -> None:
    url = StoreURL.parse("redis://u:p%40ss%2Fw%3Ard@h/0")
    assert url.password == "p@ss/w:rd"
    assert "p@ss" not in str(url)
    assert StoreURL.parse(url.render_with_secrets()).password == "p@ss/w:rd"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a url",
        "redis:/missing-slash",
        "://nohost",
        "1redis://x",
        "redis://u:s3cret@host:99999/0",
        "redis://h/#frag",
    ],
)
def test_malformed_urls_raise_typed_error(text: str) -> None:
    with pytest.raises(MalformedURLError) as info:
        StoreURL.parse(text)
    assert SECRET not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_malformed_url_error_hides_password() -> None:
    with pytest.raises(MalformedURLError) as info:
        open_kv("redis://user:s3cret@host:notaport/0")
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def test_redact_helper() -> None:
    assert (
        redact("redis://u:s3cret@h/0?token=abc&prefix=p") == "redis://u:***@h/0?token=***&prefix=p"
    )


def test_sqlite_paths() -> None:
    assert StoreURL.parse("sqlite:///rel/a.db").path == "/rel/a.db"
    assert StoreURL.parse("sqlite:////abs/a.db").path == "//abs/a.db"


@pytest.mark.usefixtures("fresh_registry")
def test_secret_not_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_STORES_DISABLE_PLUGINS", "redis")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(BackendNotInstalledError) as info:
        open_kv("redis://user:s3cret@localhost/0")
    assert SECRET not in caplog.text
    assert SECRET not in str(info.value)
