"""PostgreSQL specifics of the KV store: index use, purging, id limits, commit locking, limits."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import psycopg
import pytest
from agent_stores import ConflictError, InvalidIdError, open_kv
from agent_stores.kv import Check, Create, Delete
from agent_stores_postgres.config import DEFAULT_MAX_VALUE_BYTES
from agent_stores_postgres.kv import PostgresKV
from agent_stores_postgres.schema import TableNames
from pg_test_support import libpq_conninfo, with_options


def count_rows(admin: psycopg.Connection[Any], schema: str) -> int:
    row = admin.execute(
        psycopg.sql.SQL("SELECT count(*) FROM {}").format(TableNames(schema).kv)
    ).fetchone()
    return int(row[0]) if row else 0


async def test_scan_and_scopes_are_served_by_the_primary_key(
    schema_url: str, schema_name: str, admin: psycopg.Connection[Any]
) -> None:
    """The scan and scopes statements run as index scans on (scope, key), never as sequential scans."""
    async with open_kv(schema_url) as kv:
        assert isinstance(kv, PostgresKV)
        for scope in range(40):
            await kv.commit(f"scope{scope:02d}", [Create(f"k{i:03d}", b"v") for i in range(100)])
        admin.execute(psycopg.sql.SQL("ANALYZE {}").format(TableNames(schema_name).kv))
        scan = kv._sql.scan[True, True]
        plans = []
        async with kv._pools.connection() as conn:
            cur = await conn.execute(
                b"EXPLAIN (FORMAT JSON) " + scan, ("scope07", "k05", "k050", "k06", 0.0, 10)
            )
            plans.append(json.dumps(await cur.fetchall()))
            cur = await conn.execute(
                b"EXPLAIN (FORMAT JSON) " + kv._sql.scopes[True],
                {"lo": "scope1", "after": "", "hi": "scope2", "now": 0.0, "limit": 5},
            )
            plans.append(json.dumps(await cur.fetchall()))
    for plan in plans:
        assert "agent_stores_kv_pkey" in plan
        assert "Seq Scan" not in plan


async def test_purge_expired_removes_rows_in_batches(
    schema_url: str, schema_name: str, admin: psycopg.Connection[Any]
) -> None:
    """purge_expired physically deletes every expired row (more than one batch) and nothing live."""
    async with open_kv(with_options(schema_url, purge_interval="0")) as kv:
        assert isinstance(kv, PostgresKV)
        for batch in range(3):
            await kv.commit("p", [Create(f"e{batch}-{i:04d}", b"x", ttl=10) for i in range(450)])
        await kv.create("p", "live", b"x")
        await kv.create("p", "later", b"x", ttl=1000)
        assert count_rows(admin, schema_name) == 1352
        base = kv.clock
        kv.clock = lambda: base() + 60
        assert await kv.purge_expired() == 1350
        assert count_rows(admin, schema_name) == 2
        assert await kv.purge_expired() == 0


async def test_writes_purge_opportunistically(
    schema_url: str, schema_name: str, admin: psycopg.Connection[Any]
) -> None:
    """With purge_interval set, a write after the interval removes expired rows in the background."""
    async with open_kv(with_options(schema_url, purge_interval="0.05")) as kv:
        for i in range(20):
            await kv.create("o", f"k{i}", b"x", ttl=0.01)
        await asyncio.sleep(0.1)
        await kv.create("o", "trigger", b"x")
        assert isinstance(kv, PostgresKV)
        await asyncio.gather(*kv._purge_tasks)
        assert count_rows(admin, schema_name) == 1


async def test_expired_row_is_physically_reused_by_create(
    schema_url: str, schema_name: str, admin: psycopg.Connection[Any]
) -> None:
    """create over an expired row rewrites it in place; delete of an expired row removes it and returns False."""
    async with open_kv(with_options(schema_url, purge_interval="0")) as kv:
        await kv.create("s", "k", b"old", ttl=5)
        await kv.create("s", "gone", b"old", ttl=5)
        base = kv.clock
        kv.clock = lambda: base() + 10
        await kv.create("s", "k", b"new")
        assert await kv.delete("s", "gone") is False
        assert count_rows(admin, schema_name) == 1


async def test_ids_too_long_for_the_index_raise_invalid_id(schema_url: str) -> None:
    """Scope and key within the char limits but too many incompressible UTF-8 bytes for a btree entry
    raise InvalidIdError and write nothing."""
    rng = random.Random(7)
    scope = "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(500))
    key = "".join(chr(rng.randrange(0x10000, 0x10FFFF)) for _ in range(500))
    async with open_kv(schema_url) as kv:
        with pytest.raises(InvalidIdError):
            await kv.create(scope, key, b"v")
        assert await kv.get(scope, key) is None
        await kv.create(scope[:100], key[:100], b"v")  # moderately long ids are fine


async def test_commit_check_absent_waits_for_a_concurrent_insert(
    schema_url: str, postgres_url: str
) -> None:
    """Check(key, None) locks the key: a row inserted by a transaction still open when the commit
    runs makes the commit fail once that transaction commits, instead of slipping past it."""
    async with open_kv(schema_url) as kv:
        await kv.setup()
        names = TableNames(with_schema(schema_url))
        async with await psycopg.AsyncConnection.connect(libpq_conninfo(postgres_url)) as other:
            await other.execute(
                psycopg.sql.SQL(
                    "INSERT INTO {} (scope, key, value, version) VALUES ('c', 'd', 'x', 'theirs')"
                ).format(names.kv)
            )
            committing = asyncio.create_task(
                kv.commit("c", [Check("d", None), Create("x", b"mine")])
            )
            await wait_for_a_lock_wait(postgres_url)
            # The commit is really blocked on the open insert, not finished before it.
            assert not committing.done(), "the commit did not wait for the concurrent insert"
            await other.commit()
            with pytest.raises(ConflictError) as info:
                await committing
            assert info.value.index == 0
        assert await kv.get("c", "x") is None
        entry = await kv.get("c", "d")
        assert entry is not None and entry.version == "theirs"


async def wait_for_a_lock_wait(postgres_url: str, within_seconds: float = 30) -> None:
    """Return once some session of the database waits on a lock (fails after ``within_seconds``)."""
    deadline = asyncio.get_running_loop().time() + within_seconds
    async with await psycopg.AsyncConnection.connect(
        libpq_conninfo(postgres_url), autocommit=True
    ) as watcher:
        while True:
            cursor = await watcher.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            row = await cursor.fetchone()
            if row and int(row[0]) > 0:
                return
            assert asyncio.get_running_loop().time() < deadline, "no session ever waited on a lock"
            await asyncio.sleep(0.02)


def with_schema(url: str) -> str:
    from agent_stores import StoreURL

    schema = StoreURL.parse(url).query_get("schema")
    assert schema is not None
    return schema


async def test_commit_check_absent_leaves_no_placeholder(
    schema_url: str, schema_name: str, admin: psycopg.Connection[Any]
) -> None:
    """The row that locks an absent key during commit is gone afterwards, on success and on conflict."""
    async with open_kv(schema_url) as kv:
        await kv.commit("c", [Check("a", None), Create("b", b"1")])
        with pytest.raises(ConflictError):
            await kv.commit("c", [Check("z", None), Create("b", b"2")])
        assert count_rows(admin, schema_name) == 1


async def test_commit_of_unconditional_deletes_is_one_statement_deleting_each_key(
    schema_url: str, schema_name: str, admin: psycopg.Connection[Any]
) -> None:
    """A commit of unconditional deletes only (the chunk cleanup's) deletes every key it
    names, present, expired or absent, in one statement, and nothing else; a commit with
    any other operation is still its transaction of one statement per operation."""
    async with open_kv(with_options(schema_url, purge_interval="0")) as kv:
        assert isinstance(kv, PostgresKV)
        await kv.commit("d", [Create(f"k{i}", b"v") for i in range(5)])
        await kv.commit("d", [Create("short", b"v", ttl=0.05)])
        await kv.commit("other", [Create("k0", b"v")])
        await asyncio.sleep(0.1)  # "short" has expired, its row is still there
        sent: list[bytes] = []
        execute = psycopg.AsyncCursor.execute

        async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(query if isinstance(query, bytes) else str(query).encode())
            return await execute(self, query, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(psycopg.AsyncCursor, "execute", counted)
            deletes = [Delete(k) for k in ("k1", "k3", "short", "never-written")]
            assert await kv.commit("d", deletes) == [None] * 4
        assert len([q for q in sent if q.lstrip().upper().startswith(b"DELETE")]) == 1
        assert sorted((await kv.get_many("d", [f"k{i}" for i in range(5)])).keys()) == [
            "k0",
            "k2",
            "k4",
        ]
        assert await kv.get("other", "k0") is not None
        assert count_rows(admin, schema_name) == 4  # d/k0, d/k2, d/k4, other/k0
        version = (await kv.get("d", "k0")).version  # type: ignore[union-attr]
        with pytest.raises(ConflictError):
            await kv.commit("d", [Delete("k2"), Delete("k0", "not-its-version")])
        assert await kv.get("d", "k2") is not None  # the failed commit deleted nothing
        await kv.commit("d", [Delete("k2"), Delete("k0", version)])
        assert await kv.get_many("d", ["k0", "k2"]) == {}


def test_limits_documented_default() -> None:
    """The advertised value limit is the documented default (4 MiB) and follows the URL."""
    kv = PostgresKV.from_url("postgresql://localhost/db")
    assert kv.limits.max_value_bytes == DEFAULT_MAX_VALUE_BYTES == 4 << 20
    small = PostgresKV.from_url("postgresql://localhost/db?max_value_bytes=2048")
    assert small.limits.max_value_bytes == 2048
