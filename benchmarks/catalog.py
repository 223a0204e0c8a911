"""One owner's most recent sessions among 1k and 10k sessions of 100 owners: requests and time.

Usage: ``python benchmarks/catalog.py [--quick] [--markdown docs/benchmarks.md]``, with
the servers' URLs in ``AGENT_STORES_BENCH_<NAME>`` (``nox -s bench`` sets them); SQLite
always runs.

For each backend and size N: N sessions (two messages each, one turn) of 100 owners are
written through the session store under a fresh prefix — the listed owner has 40 of them
at every size, the other 99 share the rest — then that owner's 20 most recent sessions
are listed 30 times. Requests are counted where the client sends
them: redis-py's command packing, the cloud SDKs' transport (their request-counting
fault injectors), and KV calls on SQLite and PostgreSQL (one statement each). The time
is the median listing; "flat" means it does not grow with the sessions of other owners.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent_stores import KVStore, StoreURL, connect, open_kv
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import SessionBusyError, TransientStoreError
from agent_stores_contract.request_counts import Meter
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

try:  # run as a script (python benchmarks/catalog.py) or imported as a module
    from pages import capped_notes, load_line, replace_or_add_section  # type: ignore[import-not-found,unused-ignore]
    from scope_walk import RedisCommands  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - imported from the repository root
    from benchmarks.pages import capped_notes, load_line, replace_or_add_section
    from benchmarks.scope_walk import RedisCommands

START, END = "<!-- catalog:start -->", "<!-- catalog:end -->"
OWNERS = 100
PAGE = 20
LISTINGS = 30
LISTED_OWNER_SESSIONS = 40
CLOUDS = ("dynamodb", "cosmos", "firestore")
#: Sizes a backend's test server cannot be filled to, and why (said under the table).
CAPS: dict[str, tuple[int, str]] = {
    "dynamodb": (
        1000,
        "moto copies the whole table for every TransactWriteItems "
        "(`moto/dynamodb/models/__init__.py`, `transact_write_items`: `copy.deepcopy` of the "
        "table as a rollback backup), and every owner-index write is one, so each write takes "
        "time in proportion to everything the table holds and filling 10,000 sessions would "
        "take hours; a real table does not do this. Until the test server turned moto's "
        "instance tracking off (scripts/servers/dynamodb.py), moto also kept every one of "
        "those copies: this fill drove it to 22 GB of resident memory in one bench run; now "
        "moto's peak is printed in the bench's header, and the run stops if moto passes "
        "its bound (4 GB by default, scripts/servers/watch.py)",
    ),
    "cosmos": (
        1000,
        "the Cosmos DB test server (cosmosdb-server) slows with what it holds: after the "
        "1,000-session run a turn took 3 to 7 seconds there (measured), so 9,000 more would "
        "take hours; requests per page do not depend on it",
    ),
}


class Target:
    """A backend under a fresh prefix, and how to count the requests of a call."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        tag = f"cat-{uuid.uuid4().hex[:8]}"
        parsed = StoreURL.parse(url)
        if name == "sqlite":
            self.url = parsed.render(hide_password=False)
        elif name == "postgres":  # a table of its own
            self.url = parsed.with_query(table=tag.replace("-", "_")).render(hide_password=False)
        else:
            self.url = parsed.with_query(prefix=tag).render(hide_password=False)
        self.counting: CountingKV | None = None

    async def open(self) -> KVStore:
        if self.name in CLOUDS:
            self.meter = Meter(self.url)
            return await self.meter.client()
        if self.name == "redis":
            self.commands = RedisCommands()
            return open_kv(self.url)
        self.counting = CountingKV(open_kv(self.url))
        return self.counting

    async def count(self, call: Callable[[], Awaitable[object]]) -> int:
        if self.name in CLOUDS:
            return sum((await self.meter.count(call)).values())
        if self.name == "redis":
            before = self.commands.count
            with self.commands.counting():
                await call()
            return self.commands.count - before
        assert self.counting is not None
        self.counting.reset_counts()
        await call()
        return sum(self.counting.calls.values())


def owner_of(i: int) -> str:
    """The listed owner has the same sessions at every size; the other 99 share the rest."""
    return "owner000" if i < LISTED_OWNER_SESSIONS else f"owner{1 + i % (OWNERS - 1):03d}"


def exchange(i: int) -> list[ModelRequest | ModelResponse]:
    return [
        ModelRequest(parts=[UserPromptPart(content=f"question {i}")]),
        ModelResponse(parts=[TextPart(content=f"answer {i}")]),
    ]


async def measure(target: Target, sessions: int, filled: int) -> tuple[dict[str, float], int]:
    """Fill up to ``sessions`` (``filled`` exist already), then count and time the listing."""
    kv = await target.open()
    store = connect(kv).sessions(owns_kv=True, scope_prefix="bench-session:")
    try:
        await kv.setup()
        semaphore = asyncio.Semaphore(4 if target.name in CLOUDS else 16)

        # A turn whose release was lost keeps the session leased (30 s): a retry waits it out.
        wait = 90.0 if target.name in CLOUDS else 10.0

        async def one(i: int) -> None:
            async with semaphore:
                for attempt in range(5):
                    try:
                        async with store.turn(
                            f"s{i:05d}", owner=owner_of(i), timeout_seconds=wait
                        ) as s:
                            s.replace(exchange(i))
                        return
                    except (TransientStoreError, SessionBusyError):
                        # A slow emulator: retry, as a client would.
                        if attempt == 4:
                            raise
                        await asyncio.sleep(1 + attempt)

        await asyncio.gather(*(one(i) for i in range(filled, sessions)))
        owner = owner_of(0)
        page = await store.list_owner_sessions(owner, limit=PAGE)
        assert len(page.sessions) == PAGE and page.cursor is not None, page
        requests = await target.count(lambda: store.list_owner_sessions(owner, limit=PAGE))
        times, cpu = [], []
        for _ in range(LISTINGS):
            started, started_cpu = time.perf_counter(), time.process_time()
            await store.list_owner_sessions(owner, limit=PAGE)
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        return {
            "requests": requests,
            "ms": statistics.median(times) * 1000,
            "cpu_ms": statistics.median(cpu) * 1000,
        }, sessions
    finally:
        await store.aclose()


async def measure_all(target: Target, sizes: tuple[int, ...]) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    filled = 0
    cap = CAPS.get(target.name, (max(sizes), ""))[0]
    try:
        for n in sizes:
            if n > cap:
                print(f"{target.name} {n}: not measured ({CAPS[target.name][1]})", flush=True)
                continue
            rows[n], filled = await measure(target, n, filled)
            print(f"{target.name} {n}: {rows[n]}", flush=True)
    finally:
        await drop_everything(target)
    return rows


async def drop_everything(target: Target) -> None:
    """Drop every scope under the target's fresh prefix (its own table on PostgreSQL)."""
    kv = open_kv(target.url)
    try:
        for scope in [s async for s in kv.iter_scopes()]:
            await kv.drop_scope(scope)
    except Exception as exc:  # the rows stand; what is left is under a fresh prefix
        print(f"{target.name}: could not clean up ({exc})", file=sys.stderr)
    finally:
        await kv.aclose()


def backend_urls(folder: str, database: str) -> dict[str, str]:
    """SQLite in ``folder``, and every server whose ``AGENT_STORES_BENCH_<NAME>`` is set."""
    urls = {"sqlite": f"sqlite:///{folder}/{database}"}
    for name in ("redis", "postgres", *CLOUDS):
        url = os.environ.get(f"AGENT_STORES_BENCH_{name.upper()}")
        if url:
            urls[name] = url
        else:
            print(f"{name}: AGENT_STORES_BENCH_{name.upper()} not set, skipped", file=sys.stderr)
    return urls


def table(results: dict[str, dict[int, dict[str, float]]]) -> str:
    sizes = sorted({n for rows in results.values() for n in rows})
    head = " | ".join(f"{n:,} sessions: requests, ms, client CPU ms" for n in sizes)
    lines = [
        f"Listing one owner's {PAGE} most recent sessions (`list_owner_sessions`) among N "
        f"sessions of {OWNERS} owners (that owner has {LISTED_OWNER_SESSIONS} of them at "
        "every N), requests counted at the client (redis-py's command "
        "packing; the cloud SDKs' transport; KV calls on SQLite and PostgreSQL); wall time and "
        f"this process's CPU time, medians of {LISTINGS} listings:",
        "",
        f"| backend | {head} |",
        "|---|" + "---|" * len(sizes),
    ]
    for name, rows in results.items():
        cells = [
            f"{rows[n]['requests']:.0f}, {rows[n]['ms']:.2f}, {rows[n]['cpu_ms']:.2f}"
            if n in rows
            else "not measured (below)"
            for n in sizes
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "A page is one range read of the owner's index and one batched read of its pointers "
        "(docs/catalog.md): the requests and the client's CPU stay flat as other owners' "
        "sessions grow. Where the wall time grows (Firestore's emulator here) it is the "
        "server's time for the same two requests, growing with everything it holds; moto, "
        "for one, answers a Query by going through every item of the table "
        "(`moto/dynamodb/models/table.py`, `Table.query`: `for item in self.all_items()`), "
        "where a real table reads one partition.",
        *capped_notes(CAPS, results, "sessions"),
        "",
        f"_{load_line()}; `python benchmarks/catalog.py`._",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 and 1,000 sessions")
    parser.add_argument("--markdown", type=Path, help="replace the table in this page")
    parser.add_argument("--only", nargs="*", default=None, help="only these backends")
    args = parser.parse_args()
    sizes = (200, 1000) if args.quick else (1000, 10000)
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, url in backend_urls(tmp, "catalog.db").items():
            if args.only and name not in args.only:
                continue
            results[name] = asyncio.run(measure_all(Target(name, url), sizes))
    print(table(results))
    if args.markdown:
        heading = "One owner's sessions among many (the session catalog)"
        replace_or_add_section(args.markdown, heading, START, END, table(results))


if __name__ == "__main__":
    main()
