"""The PostgreSQL schema: versioned, forward-only migrations applied under an advisory lock.

Objects, for ``schema=S`` and ``table=T`` (defaults ``public`` and ``agent_stores``):

* ``S.T_kv`` — the key-value table. ``PRIMARY KEY (scope, key)`` with both columns in
  ``COLLATE "C"``, so the primary key index is in byte order and serves ``scan`` (prefix
  ranges, ``start_after``) and ``scopes`` directly.
* ``S.T_kv_expires_at`` — partial index on ``expires_at`` for purging.
* ``S.T_schema_version`` — one row per applied migration (``version``, ``description``,
  ``applied_at``): the schema-version record.

:func:`setup_schema` is idempotent and safe to run from many processes at once: it takes
a transaction-scoped advisory lock derived from ``S.T`` before looking at anything, so
concurrent runners queue up and the later ones find the work done. It runs in whatever
transaction state the connection is in: on an autocommit connection it opens and commits
its own transaction; inside a caller's transaction it uses a savepoint and the caller's
``COMMIT`` (or ``ROLLBACK``) decides. Migrations only ever move forward; a database newer
than this code is refused rather than guessed at.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, LiteralString

from agent_stores.errors import ConfigError
from psycopg import AsyncConnection, sql

from .config import (
    DEFAULT_SCHEMA,
    DEFAULT_TABLE,
    MAX_SCHEMA_CHARS,
    MAX_TABLE_PREFIX_CHARS,
    validate_identifier,
)


class SchemaVersionError(ConfigError):
    """The database's schema version does not match what this code can use."""


@dataclass(frozen=True)
class Migration:
    """One forward step of the schema.

    ``statements`` are :class:`psycopg.sql.SQL` templates; the placeholders ``{schema}``,
    ``{kv}``, ``{kv_pkey}`` and ``{kv_expiry}`` are filled with quoted identifiers.
    """

    version: int
    description: str
    statements: tuple[LiteralString, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "key-value table: byte-ordered primary key (scope, key), expiry column and index",
        (
            """
            CREATE TABLE {kv} (
                scope      text COLLATE "C" NOT NULL,
                key        text COLLATE "C" NOT NULL,
                value      bytea NOT NULL,
                version    text NOT NULL,
                expires_at double precision,
                CONSTRAINT {kv_pkey} PRIMARY KEY (scope, key)
            )
            """,
            "CREATE INDEX {kv_expiry} ON {kv} (expires_at) WHERE expires_at IS NOT NULL",
        ),
    ),
)

#: The schema version this code reads and writes.
SCHEMA_VERSION = MIGRATIONS[-1].version


@dataclass(frozen=True)
class TableNames:
    """The quoted names of every object of one ``(schema, table prefix)`` pair."""

    schema: str = DEFAULT_SCHEMA
    table: str = DEFAULT_TABLE

    def __post_init__(self) -> None:
        validate_identifier("schema", self.schema, MAX_SCHEMA_CHARS)
        validate_identifier("table", self.table, MAX_TABLE_PREFIX_CHARS)

    @property
    def kv_name(self) -> str:
        """Unqualified name of the key-value table."""
        return f"{self.table}_kv"

    @property
    def versions_name(self) -> str:
        """Unqualified name of the schema-version table."""
        return f"{self.table}_schema_version"

    @property
    def kv(self) -> sql.Identifier:
        """``"schema"."T_kv"``."""
        return sql.Identifier(self.schema, self.kv_name)

    @property
    def versions(self) -> sql.Identifier:
        """``"schema"."T_schema_version"``."""
        return sql.Identifier(self.schema, self.versions_name)

    @property
    def lock_key(self) -> int:
        """A stable signed 64-bit advisory-lock key for this schema and prefix."""
        digest = hashlib.sha256(f"agent_stores:{self.schema}.{self.table}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def placeholders(self) -> dict[str, sql.Composable]:
        """The values for :class:`Migration` templates."""
        return {
            "schema": sql.Identifier(self.schema),
            "kv": self.kv,
            "kv_pkey": sql.Identifier(f"{self.kv_name}_pkey"),
            "kv_expiry": sql.Identifier(f"{self.kv_name}_expires_at"),
        }


def check_server(conn: AsyncConnection[Any]) -> None:
    """Refuse servers whose text cannot hold every key in byte order (encoding must be UTF8)."""
    encoding = conn.info.parameter_status("server_encoding")
    if encoding is not None and encoding.upper() not in ("UTF8", "UTF-8"):
        raise ConfigError(
            detail=f"postgresql: the database encoding is {encoding}; agent-stores needs a "
            "UTF8 database (CREATE DATABASE … ENCODING 'UTF8')"
        )


async def read_version(conn: AsyncConnection[Any], names: TableNames) -> int:
    """The applied schema version (0 when nothing is set up). Never raises for a missing table."""
    cur = await conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s)",
        (names.schema, names.versions_name),
    )
    row = await cur.fetchone()
    if row is None or not row[0]:
        return 0
    cur = await conn.execute(
        sql.SQL("SELECT COALESCE(max(version), 0) FROM {}").format(names.versions)
    )
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


def _check_sequence(migrations: Sequence[Migration]) -> None:
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations must be numbered 1, 2, 3, … without gaps; got {versions}")


async def setup_schema(
    conn: AsyncConnection[Any],
    *,
    schema: str = DEFAULT_SCHEMA,
    table: str = DEFAULT_TABLE,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> int:
    """Create or upgrade the schema on ``conn``; returns the version now in place.

    Idempotent; concurrent callers (tasks or processes) serialise on an advisory lock.
    Works on an autocommit connection (own transaction) and inside a caller's
    transaction (savepoint; nothing is visible until the caller commits, and the lock is
    held until then). Raises :class:`SchemaVersionError` when the database is newer than
    ``migrations``.
    """
    _check_sequence(migrations)
    names = TableNames(schema, table)
    check_server(conn)
    latest = migrations[-1].version if migrations else 0
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (names.lock_key,))
        cur = await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s)",
            (names.schema,),
        )
        row = await cur.fetchone()
        # CREATE SCHEMA IF NOT EXISTS still demands the CREATE privilege on the database;
        # checking first lets a role without it use a schema an administrator made.
        if row is None or not row[0]:
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(names.schema)))
        await conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                "version integer PRIMARY KEY, "
                "description text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(names.versions)
        )
        current = await read_version(conn, names)
        if current > latest:
            raise SchemaVersionError(
                detail=f"postgresql: {names.schema}.{names.table}_* is at schema version {current}, newer "
                f"than this agent-stores-postgres knows ({latest}); upgrade agent-stores-postgres"
            )
        values = names.placeholders()
        for migration in migrations:
            if migration.version <= current:
                continue
            for statement in migration.statements:
                await conn.execute(sql.SQL(statement).format(**values))
            await conn.execute(
                sql.SQL("INSERT INTO {} (version, description) VALUES (%s, %s)").format(
                    names.versions
                ),
                (migration.version, migration.description),
            )
        return max(current, latest)
