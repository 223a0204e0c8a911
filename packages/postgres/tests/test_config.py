"""URL parsing and identifier validation (no server needed)."""

from __future__ import annotations

import pytest
from agent_stores import ConfigError, MalformedURLError, open_kv
from agent_stores_postgres.config import PostgresConfig, validate_identifier
from agent_stores_postgres.kv import PostgresKV

HOSTILE_IDENTIFIERS = [
    'x"; DROP TABLE users; --',
    "agent_stores; DROP SCHEMA public CASCADE",
    'a"b',
    "a.b",
    "a b",
    "",
    "1abc",
    "tab\x00le",
    "ta-ble",
    "é",
    "x" * 64,
]


def test_url_maps_to_libpq_keywords_and_store_options() -> None:
    """Host, port, user, password and database become libpq keywords; store options are taken out."""
    config = PostgresConfig.from_url(
        "postgresql://app:s%40cret@db.internal:6543/agents?schema=ag&table=t1&min_size=0"
        "&max_size=3&pool_timeout=2.5&auto_setup=false&sslmode=require&connect_timeout=3"
        "&max_value_bytes=2000&purge_interval=0&prepare_threshold=none"
    )
    assert config.conninfo == {
        "host": "db.internal",
        "port": "6543",
        "user": "app",
        "password": "s@cret",
        "dbname": "agents",
        "sslmode": "require",
        "connect_timeout": "3",
        "application_name": "agent-stores",
    }
    assert (config.schema, config.table, config.min_size, config.max_size) == ("ag", "t1", 0, 3)
    assert config.pool_timeout == 2.5 and config.auto_setup is False
    assert config.max_value_bytes == 2000 and config.purge_interval == 0
    assert config.prepare_threshold is None


def test_postgres_alias_and_defaults() -> None:
    """postgres:// is accepted; defaults are schema public, prefix agent_stores, pool 1..10."""
    config = PostgresConfig.from_url("postgres://localhost/db")
    assert (config.schema, config.table) == ("public", "agent_stores")
    assert (config.min_size, config.max_size) == (1, 10)
    assert config.auto_setup is True
    assert config.conninfo["connect_timeout"] == "10"


@pytest.mark.parametrize("value", HOSTILE_IDENTIFIERS)
@pytest.mark.parametrize("option", ["table", "schema"])
def test_hostile_identifier_rejected(option: str, value: str) -> None:
    """A schema or table value that is not a plain identifier raises ConfigError before any I/O."""
    with pytest.raises(ConfigError):
        PostgresConfig.from_url("postgresql://localhost/db", **{option: value})
    with pytest.raises(ConfigError):
        validate_identifier(option, value, 40)


def test_hostile_table_in_url_rejected_by_open_kv() -> None:
    """The same through open_kv and a URL-encoded query value."""
    with pytest.raises(ConfigError) as info:
        open_kv("postgresql://localhost/db?table=x%22%3B%20DROP%20TABLE%20y%3B%20--")
    assert "not allowed" in info.value.detail


def test_reserved_schema_rejected() -> None:
    """pg_* schemas are reserved by PostgreSQL."""
    with pytest.raises(ConfigError):
        PostgresConfig.from_url("postgresql://localhost/db?schema=pg_temp")


@pytest.mark.parametrize(
    "query",
    [
        "min_size=x",
        "max_size=0",
        "min_size=5&max_size=2",
        "pool_timeout=0",
        "pool_timeout=nan",
        "auto_setup=maybe",
        "max_value_bytes=0",
        "purge_interval=-1",
        "prepare_threshold=-3",
    ],
)
def test_bad_store_options_rejected(query: str) -> None:
    """Bad pool and store options raise ConfigError with the option's name."""
    with pytest.raises(ConfigError):
        PostgresConfig.from_url(f"postgresql://localhost/db?{query}")


def test_unknown_libpq_option_rejected_without_leaking_password() -> None:
    """libpq rejects an option it does not know; the message never shows the password."""
    with pytest.raises(ConfigError) as info:
        PostgresKV.from_url("postgresql://u:hunter2@localhost/db?no_such_option=1")
    assert "no_such_option" in str(info.value)
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value)


def test_password_never_in_repr_or_describe() -> None:
    """repr, str and describe of config and store show *** instead of the password."""
    url = "postgresql://u:hunter2@localhost:5432/db?sslpassword=keypass&sslmode=disable"
    config = PostgresConfig.from_url(url)
    store = PostgresKV.from_url(url)
    for text in (repr(config), str(config), repr(store), store.describe()):
        assert "hunter2" not in text and "keypass" not in text
    assert "***" in store.describe()


def test_wrong_scheme_and_path() -> None:
    """Another scheme, or a path that is not one database name, is refused."""
    with pytest.raises(ConfigError):
        PostgresConfig.from_url("mysql://localhost/db")
    with pytest.raises(ConfigError):
        PostgresConfig.from_url("postgresql://localhost/db/extra")
    with pytest.raises(MalformedURLError):
        PostgresConfig.from_url("postgresql://localhost:notaport/db")


def test_unknown_keyword_option_rejected() -> None:
    """Keyword options to from_url are checked against the known settings."""
    with pytest.raises(ConfigError):
        PostgresKV.from_url("postgresql://localhost/db", no_such_setting=1)
