"""Schema setup: idempotent, concurrent across processes, transactional, versioned, forward-only."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_stores import ConfigError, open_kv
from agent_stores_postgres import MIGRATIONS, SCHEMA_VERSION, Migration, SchemaVersionError
from agent_stores_postgres.kv import PostgresKV
from agent_stores_postgres.schema import TableNames, read_version, setup_schema
from pg_test_support import libpq_conninfo, with_options

AGENT_STORES_CLI = str(Path(sys.executable).parent / "agent-stores")

ADD_NOTE = Migration(2, "test only: a nullable column", ("ALTER TABLE {kv} ADD COLUMN note text",))


def schema_exists(admin: psycopg.Connection[Any], schema: str) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
    ).fetchone()
    return bool(row and row[0])


def applied_versions(admin: psycopg.Connection[Any], schema: str) -> list[int]:
    rows = admin.execute(
        psycopg.sql.SQL("SELECT version FROM {} ORDER BY version").format(
            TableNames(schema).versions
        )
    ).fetchall()
    return [int(r[0]) for r in rows]


async def test_setup_is_idempotent_and_records_version(
    schema_url: str, schema_name: str, admin: psycopg.Connection[Any]
) -> None:
    """setup creates the tables and one version record per migration; running it again changes nothing."""
    async with open_kv(schema_url) as kv:
        assert isinstance(kv, PostgresKV)
        assert await kv.schema_version() == 0
        await kv.setup()
        await kv.setup()
        assert await kv.schema_version() == SCHEMA_VERSION
        await kv.create("s", "k", b"v")
        await kv.setup()
        entry = await kv.get("s", "k")
        assert entry is not None and entry.value == b"v"
    assert applied_versions(admin, schema_name) == [m.version for m in MIGRATIONS]


async def test_setup_tasks_concurrently(schema_url: str, schema_name: str, admin: Any) -> None:
    """Ten stores setting up the same schema at once all succeed, and it is set up once."""
    stores = [open_kv(schema_url) for _ in range(10)]
    try:
        await asyncio.gather(*(s.setup() for s in stores))
    finally:
        for store in stores:
            await store.aclose()
    assert applied_versions(admin, schema_name) == [m.version for m in MIGRATIONS]


SETUP_WORKER = textwrap.dedent(
    """
    import asyncio, pathlib, sys, time
    from agent_stores import open_kv

    url, barrier, parties, me = sys.argv[1:]

    async def main():
        kv = open_kv(url)
        await kv.schema_version()          # connected before the barrier
        pathlib.Path(barrier, me).touch()
        while len(list(pathlib.Path(barrier).iterdir())) < int(parties):
            time.sleep(0.001)
        await kv.setup()
        print(await kv.schema_version())
        await kv.aclose()

    asyncio.run(main())
    """
)


def test_setup_from_processes_at_the_same_moment(
    schema_url: str, schema_name: str, admin: Any, tmp_path: Path
) -> None:
    """Four OS processes released together by a barrier all run setup successfully on an empty schema."""
    parties = 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SETUP_WORKER, schema_url, str(tmp_path), str(parties), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(parties)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert out.strip() == str(SCHEMA_VERSION)
    assert applied_versions(admin, schema_name) == [m.version for m in MIGRATIONS]


def test_cli_setup_twice_at_once_then_purge(schema_url: str, schema_name: str, admin: Any) -> None:
    """Two `agent-stores setup URL` commands started together both succeed; purge works; no password printed."""
    url = schema_url.replace("postgresql://postgres@", "postgresql://postgres:hunter2@", 1)
    procs = [
        subprocess.Popen(
            [AGENT_STORES_CLI, "setup", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "hunter2" not in out + err
        assert "set up" in out
    assert applied_versions(admin, schema_name) == [m.version for m in MIGRATIONS]

    async def expired_entries() -> None:
        async with open_kv(schema_url) as kv:
            for i in range(5):
                await kv.create("purge", f"k{i}", b"v", ttl=0.05)
            await kv.create("purge", "keep", b"v")
            await asyncio.sleep(0.2)

    asyncio.run(expired_entries())
    done = subprocess.run(
        [AGENT_STORES_CLI, "purge", url], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "purged 5 expired entries" in done.stdout
    assert "hunter2" not in done.stdout + done.stderr
    rows = admin.execute(
        psycopg.sql.SQL("SELECT key FROM {}").format(TableNames(schema_name).kv)
    ).fetchall()
    assert [r[0] for r in rows] == ["keep"]


async def test_setup_inside_a_transaction(
    postgres_url: str, schema_name: str, admin: Any, schema_url: str
) -> None:
    """Inside a caller's transaction setup uses a savepoint: rollback leaves nothing, commit keeps it."""
    async with await psycopg.AsyncConnection.connect(libpq_conninfo(postgres_url)) as conn:
        await conn.execute("SELECT 1")  # a transaction is now open
        assert await setup_schema(conn, schema=schema_name) == SCHEMA_VERSION
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        await conn.rollback()
        assert not schema_exists(admin, schema_name)

        await conn.execute("SELECT 1")
        await setup_schema(conn, schema=schema_name)
        await setup_schema(conn, schema=schema_name)  # again, same transaction
        await conn.commit()
    assert applied_versions(admin, schema_name) == [m.version for m in MIGRATIONS]
    async with open_kv(with_options(schema_url, auto_setup="false")) as kv:
        await kv.create("s", "k", b"v")


async def test_setup_in_autocommit(
    postgres_url: str, schema_name: str, admin: Any, schema_url: str
) -> None:
    """On an autocommit connection setup commits by itself."""
    async with await psycopg.AsyncConnection.connect(
        libpq_conninfo(postgres_url), autocommit=True
    ) as conn:
        await setup_schema(conn, schema=schema_name)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert applied_versions(admin, schema_name) == [m.version for m in MIGRATIONS]


async def test_auto_setup_off_requires_setup(schema_url: str, schema_name: str, admin: Any) -> None:
    """With auto_setup=false, first use of an empty schema raises a typed error naming the fix; nothing is created."""
    url = with_options(schema_url, auto_setup="false")
    async with open_kv(url) as kv:
        with pytest.raises(SchemaVersionError) as info:
            await kv.get("s", "k")
        assert "agent-stores setup" in info.value.detail
        assert isinstance(info.value, ConfigError)
        assert not schema_exists(admin, schema_name)
        await kv.setup()
        await kv.create("s", "k", b"v")


async def test_first_use_sets_up_by_default(schema_url: str, schema_name: str, admin: Any) -> None:
    """Without setup, the first operation creates the schema."""
    async with open_kv(schema_url) as kv:
        assert await kv.get("s", "k") is None
    assert applied_versions(admin, schema_name) == [m.version for m in MIGRATIONS]


@pytest.mark.parametrize("start", range(len(MIGRATIONS) + 1))
async def test_migrations_forward_from_every_version(
    postgres_url: str, schema_name: str, schema_url: str, start: int
) -> None:
    """From each earlier version (0 = empty) setup upgrades to the latest, keeping data written before."""
    async with await psycopg.AsyncConnection.connect(
        libpq_conninfo(postgres_url), autocommit=True
    ) as conn:
        if start:
            await setup_schema(conn, schema=schema_name, migrations=MIGRATIONS[:start])
            assert await read_version(conn, TableNames(schema_name)) == start
            # Every version has the KV table (created by version 1): data written before.
            await conn.execute(
                psycopg.sql.SQL(
                    "INSERT INTO {} (scope, key, value, version) VALUES ('before', 'upgrade', 'kept', 'v0')"
                ).format(TableNames(schema_name).kv)
            )
    async with open_kv(schema_url) as kv:
        assert isinstance(kv, PostgresKV)
        await kv.setup()
        assert await kv.schema_version() == SCHEMA_VERSION
        if start:
            entry = await kv.get("before", "upgrade")
            assert entry is not None and entry.value == b"kept"


async def test_newer_migration_applies_and_older_code_refuses(
    postgres_url: str, schema_name: str, schema_url: str, admin: Any
) -> None:
    """A later migration upgrades in place, keeping data; code that knows fewer versions refuses to touch it."""
    async with open_kv(schema_url) as kv:
        await kv.create("s", "k", b"v")
    async with await psycopg.AsyncConnection.connect(
        libpq_conninfo(postgres_url), autocommit=True
    ) as conn:
        assert await setup_schema(conn, schema=schema_name, migrations=[*MIGRATIONS, ADD_NOTE]) == 2
        assert await setup_schema(conn, schema=schema_name, migrations=[*MIGRATIONS, ADD_NOTE]) == 2
        with pytest.raises(SchemaVersionError):
            await setup_schema(conn, schema=schema_name)
    assert applied_versions(admin, schema_name) == [1, 2]
    rows = admin.execute(
        psycopg.sql.SQL("SELECT key, value, note FROM {}").format(TableNames(schema_name).kv)
    ).fetchall()
    assert rows == [("k", b"v", None)]
    async with open_kv(schema_url) as kv:
        with pytest.raises(SchemaVersionError) as info:
            await kv.get("s", "k")
        assert "newer" in info.value.detail
        with pytest.raises(SchemaVersionError):
            await kv.setup()


async def test_migrations_must_be_numbered_without_gaps(
    postgres_url: str, schema_name: str
) -> None:
    """A migration list with a gap is a programming error, refused before touching the database."""
    async with await psycopg.AsyncConnection.connect(
        libpq_conninfo(postgres_url), autocommit=True
    ) as conn:
        with pytest.raises(ValueError, match="without gaps"):
            await setup_schema(
                conn, schema=schema_name, migrations=[*MIGRATIONS, Migration(9, "gap", ())]
            )


async def test_hostile_table_rejected_and_nothing_created(postgres_url: str, admin: Any) -> None:
    """A hostile table value is refused with ConfigError; no table or schema appears on the server."""
    before = admin.execute("SELECT count(*) FROM pg_class").fetchone()
    hostile = 'x"; CREATE TABLE pwned (a int); --'
    with pytest.raises(ConfigError):
        open_kv(with_options(postgres_url, table=hostile))
    with pytest.raises(ConfigError):
        TableNames("public", hostile)
    async with await psycopg.AsyncConnection.connect(
        libpq_conninfo(postgres_url), autocommit=True
    ) as conn:
        with pytest.raises(ConfigError):
            await setup_schema(conn, table=hostile)
    assert admin.execute("SELECT to_regclass('pwned')").fetchone() == (None,)
    assert admin.execute("SELECT count(*) FROM pg_class").fetchone() == before


async def test_table_prefix_isolates_stores(postgres_url: str, schema_url: str) -> None:
    """Two table prefixes in one schema are two independent stores."""
    async with (
        open_kv(with_options(schema_url, table="app_a")) as a,
        open_kv(with_options(schema_url, table="app_b")) as b,
    ):
        await a.create("s", "k", b"a")
        assert await b.get("s", "k") is None
        await b.create("s", "k", b"b")
        entry = await a.get("s", "k")
        assert entry is not None and entry.value == b"a"
