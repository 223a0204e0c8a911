"""Requests of the admin walks (``copy``, ``doctor``) over 1k and 10k scopes, counted at the client.

Usage: ``python benchmarks/scope_walk.py [--quick] [--markdown docs/benchmarks.md]``, with
the servers' URLs in ``AGENT_STORES_BENCH_REDIS`` / ``_DYNAMODB`` (``nox -s bench`` sets
them).

Each size is N memory namespaces of one file each, written on SQLite by the memory store
and copied into the backend under a fresh prefix. Then, on the backend, with every request
counted where the client sends it (redis-py's command packing; DynamoDB's
``before-send`` event, through its request-counting fault injector):

* the listing ``copy`` and ``doctor`` plan from (:meth:`KVStore.iter_scopes`), beside the
  walk they made before it existed (paging :meth:`KVStore.scopes` by ``start_after``,
  which on these two backends walks the whole keyspace or table for every page);
* a whole ``copy`` out of the backend (into ``memory://``) and a whole ``doctor`` scan.

Linear means the requests per scope stay flat from 1k to 10k.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agent_stores import KVStore, StoreURL, doctor, open_kv
from agent_stores.memory import KVMemoryStore
from agent_stores.transfer import Transfer
from agent_stores_contract.request_counts import Meter

try:  # run as a script (python benchmarks/scope_walk.py) or imported as a module
    from pages import capped_notes, load_line, replace_or_add_section  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - imported from the repository root
    from benchmarks.pages import capped_notes, load_line, replace_or_add_section

START, END = "<!-- scope-walk:start -->", "<!-- scope-walk:end -->"
MEMORY_PREFIX = "memory:"
OLD_PAGE = 500
#: Sizes a backend's test server cannot be walked at, and why (said under the table).
CAPS: dict[str, tuple[int, str]] = {
    "dynamodb": (
        1000,
        "moto answers a Query by going through every item of the table "
        "(`moto/dynamodb/models/table.py`, `Table.query`), and `copy` and `doctor` read each "
        "scope with one, so at 10,000 scopes the walk costs moto 10,000 times the whole "
        "table (it had not finished after 25 minutes) where a real table reads one "
        "partition per Query; the requests, which is what this table counts, grow as at 1,000",
    ),
}


class RedisCommands:
    """Commands this process's redis-py connections pack (each one a request)."""

    def __init__(self) -> None:
        self.count = 0

    @contextmanager
    def counting(self) -> Iterator[None]:
        from redis.asyncio.connection import AbstractConnection

        original = AbstractConnection.pack_command
        originals = AbstractConnection.pack_commands

        def one(conn: Any, *args: Any) -> Any:
            self.count += 1
            return original(conn, *args)

        def many(conn: Any, commands: Any) -> Any:
            commands = list(commands)
            self.count += len(commands)
            return originals(conn, commands)

        AbstractConnection.pack_command = one  # type: ignore[method-assign]
        AbstractConnection.pack_commands = many  # type: ignore[method-assign]
        try:
            yield
        finally:
            AbstractConnection.pack_command = original  # type: ignore[method-assign]
            AbstractConnection.pack_commands = originals  # type: ignore[method-assign]


class Target:
    """A backend under a fresh prefix, with a way to count the requests of a call."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = (
            StoreURL.parse(url)
            .with_query(prefix=f"walk-{uuid.uuid4().hex[:8]}")
            .render(hide_password=False)
        )

    async def open(self) -> KVStore:
        if self.name == "dynamodb":
            self.meter = Meter(self.url)
            return await self.meter.client()
        self.commands = RedisCommands()
        return open_kv(self.url)

    async def count(self, call: Callable[[], Awaitable[object]]) -> int:
        if self.name == "dynamodb":
            return sum((await self.meter.count(call)).values())
        before = self.commands.count
        with self.commands.counting():
            await call()
        return self.commands.count - before


async def fill(kv: KVStore, scopes: int) -> None:
    """``scopes`` memory namespaces of one file, written on SQLite and copied into ``kv``."""
    with tempfile.TemporaryDirectory() as tmp:
        async with open_kv(f"sqlite:///{tmp}/walk.db") as source:
            memory = KVMemoryStore(source, scope_prefix=MEMORY_PREFIX)
            for i in range(scopes):
                await memory.write(f"user{i:05d}/profile.md", f"user {i}", expected_version=None)
            await Transfer(source, kv, kinds=("memory",), jobs=16).copy()


async def old_walk(kv: KVStore) -> int:
    """The planning walk before iter_scopes: scopes() paged by start_after."""
    found, cursor = 0, None
    while True:
        page = await kv.scopes(prefix=MEMORY_PREFIX, start_after=cursor, limit=OLD_PAGE)
        found += len(page)
        if len(page) < OLD_PAGE:
            return found
        cursor = page[-1]


async def measure(target: Target, scopes: int) -> dict[str, int]:
    kv = await target.open()
    try:
        await fill(kv, scopes)

        # N namespaces and the memory store's own scopes (operation receipts).
        expected = sorted([s async for s in kv.iter_scopes(prefix=MEMORY_PREFIX)])
        assert len(expected) >= scopes, (len(expected), scopes)

        async def walk() -> None:
            walked = [s async for s in kv.iter_scopes(prefix=MEMORY_PREFIX)]
            assert sorted(walked) == expected

        async def before() -> None:
            assert await old_walk(kv) == len(expected)

        async def copy_out() -> None:
            async with open_kv(f"memory://walk-{uuid.uuid4().hex[:8]}") as dst:
                report = await Transfer(kv, dst, kinds=("memory",), jobs=16).copy()
                assert report.kinds["memory"].scopes == len(expected), report

        async def scan() -> None:
            report = await doctor.scan(kv, stores=("memory",), memory_prefix=MEMORY_PREFIX)
            assert report.scanned["memory"] == len(expected), report
            assert not report.findings, report.findings

        return {
            "walk": await target.count(walk),
            "before": await target.count(before),
            "copy": await target.count(copy_out),
            "doctor": await target.count(scan),
        }
    finally:
        for scope in [s async for s in kv.iter_scopes()]:  # the fresh prefix's own scopes
            await kv.drop_scope(scope)
        await kv.aclose()


def table(results: dict[str, dict[int, dict[str, int]]]) -> str:
    lines = [
        "Requests sent by the admin walks, counted at the client (redis-py's command packing; "
        "DynamoDB's requests through its injector), over N memory namespaces of one file "
        "each; in brackets, per scope:",
        "",
        "| backend | scopes | listing (iter_scopes) | listing before (scopes() paged) "
        "| copy, whole | doctor, whole |",
        "|---|---|---|---|---|---|",
    ]
    for name, sizes in results.items():
        for n, row in sizes.items():
            cells = [f"{row[k]:,} ({row[k] / n:.2f})" for k in ("walk", "before", "copy", "doctor")]
            lines.append(f"| {name} | {n:,} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Linear: the requests per scope stay flat from 1k to 10k scopes. The listing before "
        "`iter_scopes` walked the whole keyspace (Redis SCAN) or table (DynamoDB Scan) for "
        "each page of 500.",
        *capped_notes(CAPS, results, "scopes"),
        "",
        f"_{load_line()}; `python benchmarks/scope_walk.py`._",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 and 1,000 scopes")
    parser.add_argument("--markdown", type=Path, help="replace the table in this page")
    args = parser.parse_args()
    sizes = (100, 1000) if args.quick else (1000, 10000)
    results: dict[str, dict[int, dict[str, int]]] = {}
    for name in ("redis", "dynamodb"):
        url = os.environ.get(f"AGENT_STORES_BENCH_{name.upper()}")
        if not url:
            print(f"{name}: AGENT_STORES_BENCH_{name.upper()} not set, skipped", file=sys.stderr)
            continue
        results[name] = {}
        for n in sizes:
            if n > CAPS.get(name, (n, ""))[0]:
                print(f"{name} {n}: not measured ({CAPS[name][1]})", flush=True)
                continue
            results[name][n] = asyncio.run(measure(Target(name, url), n))
            print(f"{name} {n}: {results[name][n]}", flush=True)
    if not results:
        raise SystemExit("no Redis or DynamoDB URL given")
    print(table(results))
    if args.markdown:
        heading = "Admin walks over many scopes (copy, doctor)"
        replace_or_add_section(args.markdown, heading, START, END, table(results))


if __name__ == "__main__":
    main()
