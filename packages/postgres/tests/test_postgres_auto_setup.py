"""``?auto_setup=false`` means the same for the three stores: entering one creates nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from agent_stores import open_checkpointer, open_memory, open_sessions
from agent_stores_postgres.config import URL_OPTIONS, PostgresConfig
from agent_stores_postgres.schema import SchemaVersionError
from pg_test_support import with_options

OPENERS: list[Any] = [open_sessions, open_memory, open_checkpointer]


def _schema_exists(admin: psycopg.Connection[tuple[object, ...]], schema: str) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
    ).fetchone()
    return row is not None and row[0] == 1


@pytest.mark.parametrize("opener", OPENERS)
async def test_auto_setup_off_creates_nothing_on_enter(
    opener: Any, schema_url: str, schema_name: str, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    async with opener(with_options(schema_url, auto_setup="false")):
        pass
    assert not _schema_exists(admin, schema_name)


@pytest.mark.parametrize("opener", OPENERS)
async def test_auto_setup_on_creates_the_schema_on_enter(
    opener: Any, schema_url: str, schema_name: str, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    async with opener(schema_url):
        pass
    assert _schema_exists(admin, schema_name)


async def test_a_missing_schema_names_the_setup_command(schema_url: str) -> None:
    async with open_checkpointer(with_options(schema_url, auto_setup="false")) as runs:
        with pytest.raises(SchemaVersionError, match="agent-stores setup"):
            await runs.list_runs()


def test_the_declared_default_is_the_one_used() -> None:
    """The URL option table is generated from URL_OPTIONS: its default must be the real one."""
    assert (
        PostgresConfig.from_url("postgresql://localhost/db").auto_setup
        is URL_OPTIONS["auto_setup"].default
        is True
    )
