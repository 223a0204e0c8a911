"""Unknown options fail at once on PostgreSQL too, naming the valid ones."""

from __future__ import annotations

import pytest
from agent_stores import ConfigError, UnknownOptionError, open_kv
from agent_stores_postgres.config import PostgresConfig


def test_a_misspelt_query_option_is_refused_before_connecting() -> None:
    with pytest.raises(UnknownOptionError) as caught:
        PostgresConfig.from_url("postgresql://u:s3cret@localhost/db?ssl_mode=require")
    assert "'ssl_mode'" in str(caught.value) and "sslmode" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_libpq_options_and_store_options_pass() -> None:
    config = PostgresConfig.from_url(
        "postgresql://localhost/db?sslmode=disable&auto_setup=off&pool_timeout=2.5"
    )
    assert config.conninfo["sslmode"] == "disable"
    assert config.auto_setup is False and config.pool_timeout == 2.5


def test_a_bad_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="auto_setup must be true or false"):
        PostgresConfig.from_url("postgresql://localhost/db?auto_setup=maybe")


def test_an_unknown_keyword_option_is_refused() -> None:
    with pytest.raises(ConfigError, match="busy_timeout_ms"):
        open_kv("postgresql://localhost/db", busy_timeout_ms=5)
