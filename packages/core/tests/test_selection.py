"""open_kv / connect: selection by URL, defaults and actionable errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_stores import (
    BackendNotInstalledError,
    ConfigError,
    UnknownSchemeError,
    connect,
    default_url,
    open_kv,
)
from agent_stores.backends.memory import MemoryKV
from agent_stores.backends.sqlite import SQLiteKV
from agent_stores.selection import default_sqlite_path

pytestmark = pytest.mark.usefixtures("fresh_registry")


@pytest.mark.parametrize(
    ("url", "distribution"),
    [
        ("redis://localhost", "agent-stores-redis"),
        ("rediss://localhost", "agent-stores-redis"),
        ("postgresql://localhost/db", "agent-stores-postgres"),
        ("postgres://localhost/db", "agent-stores-postgres"),
        ("dynamodb://table?region=x", "agent-stores-dynamodb"),
        ("cosmos://account", "agent-stores-cosmos"),
        ("firestore://project/coll", "agent-stores-firestore"),
    ],
)
def test_missing_distribution_is_named(
    url: str, distribution: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Block the first-party plugins that may be installed in this workspace.
    monkeypatch.setenv("AGENT_STORES_DISABLE_PLUGINS", "redis,postgres,dynamodb,cosmos,firestore")
    with pytest.raises(BackendNotInstalledError) as info:
        open_kv(url)
    assert f"pip install {distribution}" in str(info.value)
    assert info.value.distribution == distribution
    assert isinstance(info.value, ImportError)


def test_missing_distribution_error_hides_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_STORES_DISABLE_PLUGINS", "redis")
    with pytest.raises(BackendNotInstalledError) as info:
        open_kv("redis://user:s3cret@host/0")
    assert "s3cret" not in str(info.value)
    assert "s3cret" not in repr(info.value)
    assert "agent-stores-redis" in str(info.value)


def test_unknown_scheme_suggests_close_match() -> None:
    with pytest.raises(UnknownSchemeError) as info:
        open_kv("sqllite:///x.db")
    message = str(info.value)
    assert "Did you mean 'sqlite'" in message
    assert "memory" in message and "sqlite" in message
    assert info.value.suggestion == "sqlite"
    assert {"memory", "sqlite"} <= set(info.value.installed)


def test_unknown_scheme_without_match() -> None:
    with pytest.raises(UnknownSchemeError) as info:
        open_kv("zzqq://x")
    assert info.value.suggestion is None
    assert "Installed schemes" in str(info.value)


def test_embedded_backends_open() -> None:
    assert isinstance(open_kv("memory://"), MemoryKV)
    assert isinstance(open_kv("sqlite:///x.db"), SQLiteKV)


def test_bad_backend_options_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        open_kv("sqlite://somehost/x.db")
    with pytest.raises(ConfigError):
        open_kv("sqlite:///x.db?nonsense=1")
    with pytest.raises(ConfigError):
        open_kv("memory://?max_value_bytes=abc")


def test_default_url_uses_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_STORES_URL", "memory://from-env")
    assert default_url() == "memory://from-env"
    kv = open_kv()
    assert isinstance(kv, MemoryKV) and kv.name == "from-env"


def test_default_url_is_embedded_sqlite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AGENT_STORES_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_sqlite_path() == tmp_path / "agent-stores" / "agent-stores.db"
    kv = open_kv()
    assert isinstance(kv, SQLiteKV)
    assert Path(kv.path) == tmp_path / "agent-stores" / "agent-stores.db"


async def test_connect_shares_one_kv() -> None:
    async with connect("memory://connect-test") as conn:
        assert isinstance(conn.kv, MemoryKV)
        await conn.kv.create("s", "k", b"v")
        assert "memory://connect-test" in repr(conn)
    assert conn.kv.closed


def test_a_ready_kv_store_passes_through() -> None:
    kv = MemoryKV()
    assert open_kv(kv) is kv


def test_unknown_client_object_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ready client"):
        open_kv(object())
