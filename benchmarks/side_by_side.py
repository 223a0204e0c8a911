"""agent-stores beside the anchors it replaces, in ONE process, trials interleaved.

Run by ``nox -s bench`` in a Python 3.13 virtualenv holding the anchors
(``cortex-agent-sdk`` 0.5.0, the design brief's version; ``pydantic-ai-harness`` 0.75.0
with its PostgreSQL/SQLite stores, the release agent-stores' harness extra installs
beside: the brief's 0.62 no longer can) beside agent-stores. On a shared 2-core machine only same-run
ratios mean anything, so every row times both libraries in the same process, against the
same server, with the same data, alternating which goes first every trial (memory and
step rows: every operation, so a disk whose fsync latency drifts weighs on both alike); a row's ratio
is agent-stores ÷ anchor of the medians of all samples, and its range is the min..max of
the per-trial ratios. Round trips and bytes are counted by a TCP proxy
(:mod:`benchmarks.proxy`): a round trip is a client burst after the server spoke.

Rows: turn at history 10/100/1000 (Redis, vs Cortex); bytes sent and round trips per turn,
warm (the store served the previous turn) and cold (another store object did); 64 sessions
x 8 turns (turns/s, client CPU per turn); hand-overs with 8 tasks x 5 turns on one session
and with 6 processes (each begins its turns once all six are up); memory write / create /
read vs the harness on PostgreSQL and on SQLite (WAL + synchronous=NORMAL for both); step
``append_event`` at 10 and 1,000 events vs the harness on PostgreSQL and SQLite; the session
turn on PostgreSQL and SQLite beside its floor and its format floor only (no anchor has a
session store on either).

Floors, in the same trials: the 64 x 8 Redis row done by redis-py and Pydantic AI alone
at each history length (a turn's two ``EVALSHA`` with agent-stores' argument shapes, the
inline tail's decode and encode, the caller's one new list of the history, nothing else),
the step append done by psycopg and by ``sqlite3`` alone
(agent-stores' one journal statement on one held connection and cursor; the SQLite journal
port's transaction inline), each encoding the event, and the memory CAS write with
receipt and read done by psycopg and by ``sqlite3`` alone, encoding and decoding the
record (:mod:`memory_floors`), and the session turn on PostgreSQL and SQLite done by
psycopg or ``sqlite3`` and Pydantic AI alone (two statements: the lease taken returning
the state, the fenced save writing a spilled chunk with it; :mod:`session_floors`). No
store built on those clients can beat its floor, so each floor bounds the ratio any
design on them can reach.

Usage: ``python benchmarks/side_by_side.py --redis URL --postgres URL [--quick]
[--markdown docs/benchmarks.md] [--only memory,steps]`` (``--only``: just those sections,
to iterate on them; ``nox -s bench`` runs all).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from format_floors import PostgresFormatFloor, SQLiteFormatFloor
from memory_floors import (
    MemoryFloor,
    PostgresMemoryFloor,
    SQLiteMemoryFloor,
    floor_transaction,
    postgres_floor_table,
    sqlite_floor_file,
    wal_connection,
)
from proxy import DelayProxy
from session_floors import PostgresSessionFloor, SessionFloor, SQLiteSessionFloor

# -- workload -----------------------------------------------------------------------------


def message_pair(i: int) -> list[Any]:
    """A request and a response of about 511 bytes of JSON each (the brief's workload)."""
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

    text = f"message {i} " + "lorem ipsum dolor sit amet " * 14
    return [
        ModelRequest(parts=[UserPromptPart(content=text[:380])]),
        ModelResponse(parts=[TextPart(content=text[:400])], model_name="bench"),
    ]


def history(n: int, start: int = 0) -> list[Any]:
    return [m for i in range(start, start + n // 2) for m in message_pair(i)]


def memory_content(i: int) -> str:
    head = f"# Agent notebook, revision {i}\n\n- user prefers metric units\n"
    filler = "".join(
        f"- fact {j}: customer asked about shipping window {j % 7} days\n" for j in range(40)
    )
    return (head + filler)[:1024]


def operation() -> Any:
    from pydantic_ai_harness.memory import MemoryOperation

    return MemoryOperation(id=uuid.uuid4().hex, fingerprint=uuid.uuid4().hex)


def step_event(run_id: str, i: int) -> Any:
    from pydantic_ai_harness.step_persistence import StepEvent

    kind = ("model_request_started", "model_request_completed")[i % 2]
    return StepEvent(
        run_id=run_id,
        kind=kind,
        step_index=i // 2,
        conversation_id=f"conv-{run_id}",
        agent_name="bench",
        idempotency_key=f"{i}:{kind}",
    )


# -- results ------------------------------------------------------------------------------


@dataclass
class Row:
    """One comparison: agent-stores beside the anchor, and the ratio with its range."""

    what: str
    ours: str
    anchor: str
    ratio: float
    low: float
    high: float
    note: str = ""

    def ratio_text(self) -> str:
        if self.low == self.high:
            return f"{self.ratio:.2f}"
        return f"{self.ratio:.2f} ({self.low:.2f}-{self.high:.2f})"


def _print_row(row: Row, label: str) -> None:
    print(
        f"  {row.what:<58} {row.ratio_text():>20}   {label} {row.ours} | anchor {row.anchor}",
        flush=True,
    )


def rotated(names: Sequence[str], i: int) -> list[str]:
    """``names`` starting at the ``i``-th (mod their count): who goes first rotates with ``i``."""
    k = i % len(names)
    return [*names[k:], *names[:k]]


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    facts: list[tuple[str, str]] = field(default_factory=list)
    #: the same rows done by the client libraries alone (see "floors" in the module doc)
    floors: list[Row] = field(default_factory=list)

    def add(self, row: Row) -> None:
        self.rows.append(row)
        _print_row(row, "ours")

    def floor(self, row: Row) -> None:
        self.floors.append(row)
        _print_row(row, "floor")

    def fact(self, what: str, value: str) -> None:
        self.facts.append((what, value))
        print(f"  {what:<58} {value}", flush=True)


def med_ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1000


def p95_ms(samples: Sequence[float]) -> float:
    values = sorted(samples)
    return values[min(len(values) - 1, int(len(values) * 0.95))] * 1000


def timing(samples: Sequence[float]) -> str:
    return f"{med_ms(samples):.2f} ms (p95 {p95_ms(samples):.2f})"


async def interleaved(
    subjects: dict[str, Callable[[], Awaitable[list[float]]]], trials: int
) -> tuple[dict[str, list[float]], list[dict[str, float]]]:
    """Run each subject's trial ``trials`` times, rotating who goes first."""
    names = list(subjects)
    samples: dict[str, list[float]] = {n: [] for n in names}
    per_trial: list[dict[str, float]] = []
    for trial in range(trials):
        order = rotated(names, trial)
        medians: dict[str, float] = {}
        for name in order:
            gc.collect()
            got = await subjects[name]()
            samples[name] += got
            medians[name] = statistics.median(got)
        per_trial.append(medians)
    return samples, per_trial


async def one_at_a_time(
    run: Callable[[str], Awaitable[None]], names: Sequence[str], trials: int, ops: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], list[dict[str, float]]]:
    """``run(name)`` for each of ``names`` in turn, ``ops`` times a trial, who goes first
    rotating every operation (a disk or server whose speed drifts within seconds then
    weighs on all alike). What ``run`` returns is awaited and timed; what it does before
    returning (making the caller's inputs) is not. Returns every sample's wall time and
    process CPU time by name, and each trial's median wall times."""
    samples: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    per_trial: list[dict[str, float]] = []
    for _trial in range(trials):
        got: dict[str, list[float]] = {n: [] for n in names}
        gc.collect()
        for i in range(ops):
            for name in rotated(names, i):
                operation = run(name)
                c0, t0 = time.process_time(), time.perf_counter()
                await operation
                got[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        for name, values in got.items():
            samples[name] += values
        per_trial.append({n: statistics.median(v) for n, v in got.items()})
    return samples, cpu, per_trial


def time_row(
    what: str,
    samples: dict[str, list[float]],
    per_trial: list[dict[str, float]],
    ours: str = "ours",
    anchor: str = "anchor",
    note: str = "",
) -> Row:
    ratios = [t[ours] / t[anchor] for t in per_trial]
    return Row(
        what,
        timing(samples[ours]),
        timing(samples[anchor]),
        med_ms(samples[ours]) / med_ms(samples[anchor]),
        min(ratios),
        max(ratios),
        note,
    )


# -- stores -------------------------------------------------------------------------------


def ours_sessions(url: str, **options: Any) -> Any:
    from agent_stores import open_sessions

    return open_sessions(url, ttl_seconds=3600, **options)


def plain(url: str) -> str:
    """``url`` without its query (agent-stores options the anchors' clients do not know)."""
    return urlsplit(url)._replace(query="").geturl()


def in_schema(url: str, schema: str) -> str:
    """``url`` with agent-stores' ``schema`` option (tables of its own, fresh)."""
    return url + ("&" if "?" in url else "?") + f"schema={schema}"


def cortex_sessions(url: str, prefix: str) -> Any:
    from cortex_agent_sdk.redis import RedisSessionStore

    # A generous I/O timeout: on a loaded shared machine 64 concurrent turns can exceed its 10 s.
    return RedisSessionStore(
        plain(url), key_prefix=prefix, ttl_seconds=3600, io_timeout_seconds=120
    )


async def close(store: Any) -> None:
    result = store.aclose()
    if asyncio.iscoroutine(result):
        await result


async def set_history(store: Any, sid: str, n: int) -> None:
    async with store.turn(sid, timeout_seconds=60) as s:
        s.replace(history(n))


async def one_turn(store: Any, sid: str, i: int) -> None:
    await turn_adding(store, sid, message_pair(100_000 + i))


async def turn_adding(store: Any, sid: str, added: list[Any]) -> None:
    """A turn as an agent makes one: the history read, a new list of it and ``added``
    saved (one copy of the history, as the floors' callers make)."""
    async with store.turn(sid, timeout_seconds=60) as s:
        s.replace([*s.messages, *added])


def proxied(url: str, proxy: DelayProxy) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = netloc[0] + "@" if len(netloc) == 2 else ""
    return parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}").geturl()


# -- floors: the client libraries alone ------------------------------------------------------

#: A turn's two scripts for the Redis floor: a small reply, and one SET of the state (and,
#: when the tail spilled, one SET of the spilled chunk, kept as a store must keep it).
FLOOR_ACQUIRE = "return {'acquired', ''}"
FLOOR_SAVE = (
    "redis.call('SET', KEYS[1], ARGV[2]) "
    "if #KEYS > 2 then redis.call('SET', KEYS[3], ARGV[8], 'PX', ARGV[7]) end return 0"
)
#: agent-stores' inline tail bound on Redis (the core's default: 4 KiB).
FLOOR_TAIL_BYTES = 4 << 10


async def floor_turns(redis_url: str, ids: list[str], size: int) -> tuple[float, float]:
    """64 x 8 turns doing only what any Redis session store with redis-py and Pydantic AI
    does on the client: per turn two ``EVALSHA`` (acquire, save) with agent-stores'
    argument shapes, decode of the inline tail, encode of the new tail, spilling past the
    tail bound as agent-stores does: the tail keeps its last message and the rest (cut
    from the encoded bytes, not encoded again) is written by the save's script as a
    chunk, as the PostgreSQL and SQLite floors write it (``session_floors.py``).

    The caller gets the whole history of ``size`` messages and more, as from any session
    store, and makes one new list of it and the turn's two messages, as agent-stores'
    caller does (:func:`turn_adding`): the messages before the tail are the very objects
    the floor was given (the initial history, then each spill's), held in memory and never
    decoded, which no store can undercut. Returns (turns/s, CPU ms/turn)."""
    import redis.asyncio as aredis
    from agent_stores.kv.base import new_version  # the store's ids, not uuid4's 2 µs each
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    pool = aredis.BlockingConnectionPool.from_url(
        plain(redis_url), max_connections=100, timeout=None
    )
    client = aredis.Redis(connection_pool=pool)
    try:
        acquire = await client.script_load(FLOOR_ACQUIRE)
        save = await client.script_load(FLOOR_SAVE)
        initial = history(size)
        start = ModelMessagesTypeAdapter.dump_json(initial[-1:])
        tails = dict.fromkeys(ids, start)
        held = {sid: initial[:-1] for sid in ids}  # a list each: a spill extends it
        chunks: list[str] = []
        run = uuid.uuid4().hex[:8]

        async def worker(sid: str) -> None:
            keys = [f"bench-floor-{run}:{{{sid}}}:{k}" for k in ("i", "s", "w")]
            for i in range(8):
                now = time.time()
                await client.execute_command(
                    "EVALSHA",
                    acquire,
                    3,
                    *keys,
                    repr(now),
                    f"owner-{sid}",
                    f'"owner-{sid}"',
                    repr(now + 30),
                    "store-0123456789abcdef",
                    "0.1",
                    "",
                    "1",
                    new_version(),
                    repr(now + 3600),
                    "7200000",
                    keys[0],
                    new_version(),
                )
                before = held[sid]
                messages = ModelMessagesTypeAdapter.validate_json(tails[sid])
                new = [*before, *messages, *message_pair(100_000 + i)]  # the caller's list
                tail = ModelMessagesTypeAdapter.dump_json(new[len(before) :])
                # The spilled chunk's key (a third script key) and bytes (a last argument),
                # both empty when the tail fits.
                chunk_key: list[str] = []
                chunk_value: list[bytes] = []
                if len(tail) > FLOOR_TAIL_BYTES:
                    last = ModelMessagesTypeAdapter.dump_json(new[-1:])
                    # "[a,b,c]" is "[a,b" + "," + "c]": the chunk, without encoding it again
                    chunk_value = [tail[: len(tail) - len(last)] + b"]"]
                    chunk_key = [f"bench-floor-{run}:{{{sid}}}:h/{new_version()}"]
                    tail = last
                    before.extend(new[len(before) : -1])
                tails[sid] = tail
                state = b'{"format":"floor","fence":1}\n' + tail
                await client.execute_command(
                    "EVALSHA",
                    save,
                    2 + len(chunk_key),
                    keys[1],
                    keys[0],
                    *chunk_key,
                    repr(now),
                    state,
                    new_version(),
                    "r",
                    "",
                    repr(now + 3600),
                    "7200000",
                    *chunk_value,
                )
                chunks.extend(chunk_key)

        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker(sid) for sid in ids))
        elapsed, used = time.perf_counter() - t0, time.process_time() - c0
        await client.delete(*(f"bench-floor-{run}:{{{sid}}}:s" for sid in ids))
        for at in range(0, len(chunks), 500):
            await client.delete(*chunks[at : at + 500])
        return 512 / elapsed, used / 512 * 1000
    finally:
        await client.aclose()


# -- sections -------------------------------------------------------------------------------


async def section_turns(
    res: Results, redis_url: str, sizes: list[int], trials: int, turns: int
) -> None:
    print(
        "\nturn cycle on Redis (enter, read, replace +2 messages, exit), vs Cortex RedisSessionStore"
    )
    run = uuid.uuid4().hex[:8]
    ours = ours_sessions(redis_url)
    theirs = cortex_sessions(redis_url, f"bench-cx-{run}")
    try:
        for size in sizes:
            sids = {"ours": f"t-{run}-{size}", "anchor": f"t-{run}-{size}"}
            stores = {"ours": ours, "anchor": theirs}

            def trial(
                name: str,
                size: int = size,
                sids: dict[str, str] = sids,
                stores: dict[str, Any] = stores,
            ) -> Callable[[], Awaitable[list[float]]]:
                async def go() -> list[float]:
                    store, sid = stores[name], sids[name]
                    await set_history(store, sid, size)
                    await one_turn(store, sid, -1)  # untimed: the store has served a turn
                    out = []
                    for i in range(turns):
                        t0 = time.perf_counter()
                        await one_turn(store, sid, i)
                        out.append(time.perf_counter() - t0)
                    return out

                return go

            samples, per_trial = await interleaved(
                {"ours": trial("ours"), "anchor": trial("anchor")}, trials
            )
            res.add(time_row(f"Redis turn, history {size}", samples, per_trial))
    finally:
        await close(ours)
        await close(theirs)


async def section_wire(res: Results, redis_url: str, sizes: list[int], turns: int) -> None:
    print("\nbytes sent and round trips per turn (counting proxy), warm and cold")
    parts = urlsplit(redis_url)
    run = uuid.uuid4().hex[:8]
    async with DelayProxy(parts.hostname or "127.0.0.1", parts.port or 6379) as proxy:
        url = proxied(redis_url, proxy)
        for size in sizes:
            for mode in ("warm", "cold"):
                figures: dict[str, tuple[float, float]] = {}
                for name in ("ours", "anchor"):
                    if name == "ours":
                        stores = [ours_sessions(url), ours_sessions(url)]
                    else:
                        prefix = f"bench-cxw-{run}"
                        stores = [cortex_sessions(url, prefix), cortex_sessions(url, prefix)]
                    sid = f"w-{run}-{size}-{mode}-{name}"
                    try:
                        await set_history(stores[0], sid, size)
                        await one_turn(stores[0], sid, -2)
                        await one_turn(stores[1], sid, -1)
                        await one_turn(stores[0], sid, 0)
                        trips: list[int] = []
                        sent: list[int] = []
                        for i in range(turns):
                            # cold: the other store object wrote the session last
                            store = stores[i % 2] if mode == "cold" else stores[0]
                            proxy.stats.reset()
                            await one_turn(store, sid, i + 1)
                            trips.append(proxy.stats.round_trips)
                            sent.append(proxy.stats.bytes_to_server)
                        figures[name] = (statistics.median(trips), statistics.median(sent))
                    finally:
                        for store in stores:
                            await close(store)
                (rt_ours, b_ours), (rt_theirs, b_theirs) = figures["ours"], figures["anchor"]
                res.add(
                    Row(
                        f"Redis round trips per turn, {mode}, history {size}",
                        f"{rt_ours:.0f}",
                        f"{rt_theirs:.0f}",
                        rt_ours / rt_theirs,
                        rt_ours / rt_theirs,
                        rt_ours / rt_theirs,
                    )
                )
                res.add(
                    Row(
                        f"Redis bytes sent per turn, {mode}, history {size}",
                        f"{b_ours:,.0f}",
                        f"{b_theirs:,.0f}",
                        b_ours / b_theirs,
                        b_ours / b_theirs,
                        b_ours / b_theirs,
                    )
                )


async def section_postgres_rt(res: Results, pg_url: str, turns: int) -> None:
    print("\nPostgreSQL session turn round trips (counting proxy), warm and cold")
    parts = urlsplit(pg_url)
    run = uuid.uuid4().hex[:8]
    async with DelayProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        url = proxied(pg_url, proxy)
        sep = "&" if "?" in url else "?"
        url += f"{sep}sslmode=disable&min_size=1&max_size=1&prepare_threshold=none"
        stores = [ours_sessions(url), ours_sessions(url)]
        try:
            for store in stores:
                await store.kv.setup()
            sid = f"pg-{run}"
            await set_history(stores[0], sid, 100)
            await one_turn(stores[1], sid, -1)
            await one_turn(stores[0], sid, 0)
            for mode in ("warm", "cold"):
                trips = []
                for i in range(turns):
                    store = stores[i % 2] if mode == "cold" else stores[0]
                    proxy.stats.reset()
                    await one_turn(store, sid, i + 1)
                    trips.append(proxy.stats.round_trips)
                res.fact(
                    f"PostgreSQL round trips per turn, {mode}, history 100",
                    f"{statistics.median(trips):.0f} (every turn: {sorted(set(trips))})",
                )
        finally:
            for store in stores:
                await close(store)


def rate_row(
    what: str, name: str, rates: dict[str, list[float]], cpu: dict[str, list[float]]
) -> Row:
    """A turns/s row: ``name`` beside the anchor (higher is better)."""

    def figure(who: str) -> str:
        return (
            f"{statistics.median(rates[who]):,.0f}/s, CPU {statistics.median(cpu[who]):.2f} ms/turn"
        )

    ratios = [a / b for a, b in zip(rates[name], rates["anchor"], strict=True)]
    return Row(
        what,
        figure(name),
        figure("anchor"),
        statistics.median(rates[name]) / statistics.median(rates["anchor"]),
        min(ratios),
        max(ratios),
    )


#: issue targets against the floor: throughput at least this share of the floor's, and
#: process CPU per turn at most this multiple of it
RATE_TARGET, CPU_TARGET = 0.9, 1.25
#: issue target against the floor: an operation's median time at most this multiple of it
TIME_TARGET = 1.25


def floor_fact(res: Results, what: str, samples: dict[str, list[float]]) -> None:
    """agent-stores' median time of ``what`` ÷ the floor's, against :data:`TIME_TARGET`."""
    ratio = med_ms(samples["ours"]) / med_ms(samples["floor"])
    res.fact(
        f"{what}: agent-stores' time ÷ the floor's (target ≤ {TIME_TARGET})",
        f"{ratio:.2f} ({'met' if ratio <= TIME_TARGET else 'missed'})",
    )


async def section_concurrency(res: Results, redis_url: str, sizes: list[int], trials: int) -> None:
    print(
        "\n64 sessions x 8 turns concurrently on Redis (turns/s; ratio = ours / Cortex, higher is better)"
    )
    run = uuid.uuid4().hex[:8]
    for size in sizes:
        # The floor at every size, in the same trials: its store work does not depend on the
        # history length, but the machine's state drifts, and a floor timed minutes before a
        # row moved that row's ratio by several hundredths.
        names = ["ours", "anchor", "floor"]
        rates: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for trial in range(trials):
            for name in rotated(names, trial):
                ids = [f"c-{run}-{size}-{trial}-{name}-{k}" for k in range(64)]
                if name == "floor":
                    rate, used = await floor_turns(redis_url, ids, size)
                    rates[name].append(rate)
                    cpu[name].append(used)
                    continue
                store = (
                    ours_sessions(redis_url)
                    if name == "ours"
                    else cortex_sessions(redis_url, f"bench-cxc-{run}")
                )
                try:
                    await asyncio.gather(*(set_history(store, sid, size) for sid in ids))

                    async def worker(sid: str, store: Any = store) -> None:
                        for i in range(8):
                            await one_turn(store, sid, i)

                    gc.collect()
                    c0, t0 = time.process_time(), time.perf_counter()
                    await asyncio.gather(*(worker(sid) for sid in ids))
                    elapsed, used = time.perf_counter() - t0, time.process_time() - c0
                    rates[name].append(512 / elapsed)
                    cpu[name].append(used / 512 * 1000)
                finally:
                    await close(store)

        res.add(
            rate_row(f"Redis 64x8 turns/s, history {size} (higher is better)", "ours", rates, cpu)
        )
        res.floor(
            rate_row(
                f"Redis 64x8 turns/s, history {size}: redis-py + Pydantic AI alone",
                "floor",
                rates,
                cpu,
            )
        )
        rate = statistics.median(rates["ours"]) / statistics.median(rates["floor"])
        used = statistics.median(cpu["ours"]) / statistics.median(cpu["floor"])
        res.fact(
            f"Redis 64x8 at history {size}: agent-stores' turns/s ÷ the floor's (target ≥ {RATE_TARGET})",
            f"{rate:.2f} ({'met' if rate >= RATE_TARGET else 'missed'})",
        )
        res.fact(
            f"Redis 64x8 at history {size}: agent-stores' client CPU per turn ÷ the floor's "
            f"(target ≤ {CPU_TARGET})",
            f"{used:.2f} ({'met' if used <= CPU_TARGET else 'missed'})",
        )


async def section_handover(res: Results, redis_url: str) -> None:
    print(
        "\nhand-overs: 8 tasks x 5 turns on one session (one store object), and 6 processes x 5 turns"
    )
    run = uuid.uuid4().hex[:8]
    for name in ("ours", "anchor"):
        store = (
            ours_sessions(redis_url)
            if name == "ours"
            else cortex_sessions(redis_url, f"bench-cxh-{run}")
        )
        sid = f"h-{run}-{name}"
        owners: list[int] = []
        waits: list[float] = []

        async def worker(
            n: int,
            store: Any = store,
            sid: str = sid,
            owners: list[int] = owners,
            waits: list[float] = waits,
        ) -> None:
            for i in range(5):
                t0 = time.perf_counter()
                async with store.turn(sid, timeout_seconds=60) as s:
                    waits.append(time.perf_counter() - t0)
                    owners.append(n)
                    s.replace([*s.messages, *message_pair(n * 10 + i)])

        try:
            await asyncio.gather(*(worker(n) for n in range(8)))
            async with store.turn(sid) as s:
                lost = 80 - len(s.messages)
        finally:
            await close(store)
        handovers = sum(1 for a, b in itertools.pairwise(owners) if a != b)
        res.fact(
            f"hand-overs, 8 tasks x 5 turns ({'agent-stores' if name == 'ours' else 'Cortex'})",
            f"{handovers} of 39, longest wait {max(waits) * 1000:.0f} ms, lost updates {lost}",
        )
    for name in ("ours", "anchor"):
        sid = f"hp-{run}-{name}"
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--handover-worker",
                name,
                redis_url,
                sid,
                str(n),
                f"bench-cxh-{run}",
            )
            for n in range(HANDOVER_PROCESSES)
        ]
        for proc in procs:
            await proc.wait()
        store = (
            ours_sessions(redis_url)
            if name == "ours"
            else cortex_sessions(redis_url, f"bench-cxh-{run}")
        )
        try:
            async with store.turn(sid) as s:
                texts = [str(getattr(m.parts[0], "content", ""))[:12] for m in s.messages[::2]]
        finally:
            await close(store)
        order = [t.split()[1] for t in texts if t.startswith("proc ")]
        handovers = sum(1 for a, b in itertools.pairwise(order) if a != b)
        res.fact(
            f"hand-overs, 6 processes x 5 turns ({'agent-stores' if name == 'ours' else 'Cortex'})",
            f"{handovers} of {len(order) - 1}, lost updates {30 - len(order)}",
        )


#: processes of the hand-over row; each begins its turns once all of them are ready
HANDOVER_PROCESSES = 6


async def handover_worker(name: str, redis_url: str, sid: str, n: int, prefix: str) -> None:
    from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
    from redis.asyncio import Redis

    store = ours_sessions(redis_url) if name == "ours" else cortex_sessions(redis_url, prefix)
    # A start line: a process up before the others would otherwise take all its turns
    # in a row with no one waiting (seen: 21 of 29 hand-overs), which measures start-up
    # order, not fairness.
    ready, go = f"{prefix}:ready:{name}", f"{prefix}:go:{name}"
    async with Redis.from_url(redis_url) as barrier:
        if await barrier.incr(ready) == HANDOVER_PROCESSES:  # the last one up
            await barrier.rpush(go, *["go"] * HANDOVER_PROCESSES)
            await barrier.expire(ready, 600)
            await barrier.expire(go, 600)
        await barrier.blpop([go], timeout=120)
    try:
        for i in range(5):
            async with store.turn(sid, timeout_seconds=120) as s:
                s.replace(
                    [
                        *s.messages,
                        ModelRequest(parts=[UserPromptPart(content=f"proc {n} turn {i}")]),
                        ModelResponse(parts=[TextPart(content="ok")], model_name="bench"),
                    ]
                )
    finally:
        await close(store)


async def drop_and_close(pool: Any, anchor_table: str, our_schema: str) -> None:
    """Drop a group's PostgreSQL tables (the anchor's, with the companion tables the
    harness makes beside it, such as ``<table>_operations``; our schema) and close the
    anchor's pool."""
    async with pool.acquire() as conn:
        names = await conn.fetch(
            "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema() "
            "AND (tablename = $1 OR starts_with(tablename, $1 || '_'))",
            anchor_table,
        )
        for (name,) in names:
            await conn.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        await conn.execute(f"DROP SCHEMA IF EXISTS {our_schema} CASCADE")
    await pool.close()


MemoryGroup = tuple[str, Any, Any, MemoryFloor, Callable[[], Awaitable[None]]]


async def memory_groups(pg_url: str | None, run: str, workdir: Path) -> list[MemoryGroup]:
    """(label, our store, the harness's store, the floor, close all three) on PostgreSQL
    and SQLite."""
    from agent_stores import connect
    from pydantic_ai_harness.memory import PostgresMemoryStore, SqliteMemoryStore

    groups: list[MemoryGroup] = []
    if pg_url:
        import asyncpg

        pool = await asyncpg.create_pool(plain(pg_url), min_size=1, max_size=5)
        # A schema of its own, fresh like the anchor's table (not one grown by earlier runs).
        ours = connect(in_schema(pg_url, f"bench_{run}_mem")).memory(owns_kv=True)
        await ours.kv.setup()
        theirs = PostgresMemoryStore(pool, table=f"bench_{run}_hmem")
        pg_floor = await PostgresMemoryFloor.open(plain(pg_url), f"bench_{run}_fmem")

        async def close_pg() -> None:
            await pg_floor.close()
            await ours.aclose()
            await drop_and_close(pool, f"bench_{run}_hmem", f"bench_{run}_mem")

        groups.append(("PostgreSQL", ours, theirs, pg_floor, close_pg))
    ours_sqlite = connect(f"sqlite:///{workdir}/ours-memory.db").memory(owns_kv=True)
    conn = wal_connection(workdir / "harness-memory.db", timeout=30)
    theirs_sqlite = SqliteMemoryStore(connection=conn)
    sqlite_floor = SQLiteMemoryFloor(workdir / "floor-memory.db")

    async def close_sqlite() -> None:
        await sqlite_floor.close()
        await ours_sqlite.aclose()
        conn.close()

    groups.append(
        ("SQLite (WAL + NORMAL both)", ours_sqlite, theirs_sqlite, sqlite_floor, close_sqlite)
    )
    return groups


async def memory_trial(
    stores: dict[str, Any], floor: MemoryFloor, run: str, trial: int, ops: int
) -> dict[str, dict[str, list[float]]]:
    """One trial: creates, CAS writes with receipt and reads, alternating the stores (and,
    for writes and reads, the floor) one operation at a time (who goes first rotates every
    operation): a shared disk whose fsync latency drifts within seconds then weighs on all
    alike."""
    per: dict[str, dict[str, list[float]]] = {
        k: {"ours": [], "anchor": []} for k in ("create", "write", "read")
    }
    per["write"]["floor"], per["read"]["floor"] = [], []
    gc.collect()
    # Half as many creates as writes: enough for a stable median (each create also writes
    # its directory markers, so its time spreads wider).
    # The caller's inputs (content, operation) are made before the clock starts: only
    # the store's work is timed.
    for k in range(max(3, ops // 2)):
        for name in rotated(("ours", "anchor"), k):
            path, content, op = (
                f"bench/{run}/{trial}-{name}-{k}/new.md",
                memory_content(0),
                operation(),
            )
            t0 = time.perf_counter()
            await stores[name].write(path, content, expected_version=None, operation=op)
            per["create"][name].append(time.perf_counter() - t0)
    paths = {name: f"bench/{run}/{trial}-{name}/MEMORY.md" for name in stores}
    versions = {}
    for name, store in stores.items():
        m = await store.write(
            paths[name], memory_content(0), expected_version=None, operation=operation()
        )
        versions[name] = m.version
    for i in range(1, ops + 1):
        for name in rotated(("ours", "anchor", "floor"), i):
            content = memory_content(i)
            if name == "floor":
                t0 = time.perf_counter()
                await floor.write(content)
                per["write"][name].append(time.perf_counter() - t0)
                continue
            op = operation()
            t0 = time.perf_counter()
            m = await stores[name].write(
                paths[name], content, expected_version=versions[name], operation=op
            )
            per["write"][name].append(time.perf_counter() - t0)
            versions[name] = m.version
    for i in range(ops):
        for name in rotated(("ours", "anchor", "floor"), i):
            t0 = time.perf_counter()
            if name == "floor":
                await floor.read()
                per["read"][name].append(time.perf_counter() - t0)
                continue
            got = await stores[name].read(paths[name], max_chars=100_000)
            per["read"][name].append(time.perf_counter() - t0)
            assert got is not None and got.content == memory_content(ops)
    return per


async def section_memory(
    res: Results, pg_url: str | None, trials: int, ops: int, workdir: Path
) -> None:
    run = uuid.uuid4().hex[:8]
    for label, ours_store, theirs_store, floor, closer in await memory_groups(pg_url, run, workdir):
        print(
            f"\nmemory on {label}: create, CAS write with receipt, read of a 1,024-char file, vs the harness store"
        )
        stores = {"ours": ours_store, "anchor": theirs_store}
        try:
            for store in stores.values():  # warm-up: schema, pools, prepared statements
                m = await store.write(
                    f"warm/{run}/w.md",
                    memory_content(0),
                    expected_version=None,
                    operation=operation(),
                )
                await store.write(
                    f"warm/{run}/w.md",
                    memory_content(1),
                    expected_version=m.version,
                    operation=operation(),
                )
            await floor.write(memory_content(0))  # warm-up: the prepared statements
            await floor.read()
            kinds: dict[str, dict[str, list[float]]] = {
                k: {"ours": [], "anchor": []} for k in ("create", "write", "read")
            }
            kinds["write"]["floor"], kinds["read"]["floor"] = [], []
            trial_medians: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
            for trial in range(trials):
                per = await memory_trial(stores, floor, run, trial, ops)
                for kind in kinds:
                    for name in per[kind]:
                        kinds[kind][name] += per[kind][name]
                    trial_medians[kind].append(
                        {n: statistics.median(v) for n, v in per[kind].items()}
                    )
            for kind, title in (
                ("write", "CAS write with receipt"),
                ("create", "create with receipt"),
                ("read", "read"),
            ):
                res.add(time_row(f"memory {title}, {label}", kinds[kind], trial_medians[kind]))
            for kind, title, alone in (
                ("write", "CAS write with receipt", "one transaction"),
                ("read", "read", "one SELECT"),
            ):
                driver = "psycopg" if label == "PostgreSQL" else "sqlite3"
                res.floor(
                    time_row(
                        f"memory {title}, {label}: {driver} alone, {alone}",
                        kinds[kind],
                        trial_medians[kind],
                        ours="floor",
                    )
                )
                floor_fact(res, f"memory {title}, {label}", kinds[kind])
        finally:
            await closer()


def floor_entry(event: Any, seq: int) -> bytes:
    """A journal entry as a client of agent-stores' record shape writes it: the event's
    fields (``event_to_dict``, the shape itself) as JSON, with its position (the floors'
    share of a step append's work)."""
    from agent_stores.checkpointer.step_store import event_to_dict

    record = {"v": 1, "seq": seq, "event": event_to_dict(event)}
    return json.dumps(record, separators=(",", ":")).encode()


JournalFloor = tuple[Callable[[Any], Awaitable[None]], Callable[[], Awaitable[None]]]


def run_expiry() -> float:
    """When a run's records expire, as the step store writes them by default: every record
    of a run at the same instant, its default TTL (30 days) from the run's first write."""
    from agent_stores.checkpointer.space import DEFAULT_RUN_TTL_SECONDS

    return time.time() + DEFAULT_RUN_TTL_SECONDS


async def floor_journal(pg_url: str, table: str) -> JournalFloor:
    """The floor of a step append on PostgreSQL: agent-stores' one journal statement,
    prepared, on one held psycopg connection and cursor (no pool, no store code), into a
    logged table shaped like agent-stores' (durable commits, as the stores'), the event
    encoded by :func:`floor_entry`, entry and counter written with the run's expiry
    (:func:`run_expiry`). Returns (append one event, close and drop the table)."""
    from agent_stores.kv.base import new_version
    from agent_stores_postgres.ports import _journal_append_sql  # the port's own statement
    from psycopg import sql

    conn, name = await postgres_floor_table(plain(pg_url), table)
    expires_at = run_expiry()
    text = {
        replace: sql.SQL(_journal_append_sql(replace=replace)).format(kv=name).as_bytes(None)
        for replace in (False, True)
    }
    scope = "floor"
    state: dict[str, Any] = {"seq": 0, "head": None}
    cursor = conn.cursor()

    async def append(event: Any) -> None:
        seq, head = state["seq"], state["head"]
        fresh = new_version()
        params: dict[str, Any] = {
            "scope": scope,
            "key": f"ev/{seq:08d}",
            "value": floor_entry(event, seq),
            "version": new_version(),
            "hkey": "head/ev",
            "hvalue": b'{"next":%d}' % (seq + 1),
            "hversion_new": fresh,
            "expires_at": expires_at,
            "now": time.time(),
        }
        if head is not None:
            params["hversion"] = head
        await cursor.execute(text[head is not None], params, prepare=True)
        row = await cursor.fetchone()
        assert row is not None and row[0], row
        state["seq"], state["head"] = seq + 1, fresh

    async def close() -> None:
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))
        await conn.close()

    return append, close


def sqlite_floor_journal(path: Path) -> JournalFloor:
    """The floor of a step append on SQLite: the SQLite journal port's transaction (the
    entry's absence checked, the counter's CAS, the entry inserted, one commit) by the
    stdlib ``sqlite3`` alone (:func:`memory_floors.floor_transaction`), the event encoded
    by :func:`floor_entry`, entry and counter written with the run's expiry
    (:func:`run_expiry`)."""
    from agent_stores.kv.base import new_version

    conn = sqlite_floor_file(path)
    expires_at = run_expiry()
    state: dict[str, Any] = {"seq": 0, "head": new_version()}
    conn.execute(
        "INSERT INTO kv VALUES ('floor', 'head/ev', ?, ?, ?)",
        (b'{"next":0}', state["head"], expires_at),
    )

    async def append(event: Any) -> None:
        seq, head = state["seq"], state["head"]
        key, fresh = f"ev/{seq:08d}", new_version()
        floor_transaction(
            conn,
            ("floor", key),
            ("floor", "head/ev", b'{"next":%d}' % (seq + 1), fresh, head),
            ("floor", key, floor_entry(event, seq), new_version(), expires_at),
            swap_expires_at=expires_at,
        )
        state["seq"], state["head"] = seq + 1, fresh

    async def close() -> None:
        conn.close()  # the file is in the bench's temporary folder, removed with it

    return append, close


StepGroup = tuple[str, Any, Any, JournalFloor, Callable[[], Awaitable[None]]]


async def step_groups(pg_url: str | None, run: str, workdir: Path) -> list[StepGroup]:
    """(label, our step store, the harness's, the floor, close all three) on PostgreSQL
    and SQLite."""
    from agent_stores import connect
    from pydantic_ai_harness.step_persistence import PostgresStepStore, SqliteStepStore

    groups: list[StepGroup] = []
    if pg_url:
        import asyncpg

        pool = await asyncpg.create_pool(plain(pg_url), min_size=1, max_size=5)
        cp = connect(in_schema(pg_url, f"bench_{run}_steps")).checkpointer(owns_kv=True)
        await cp.setup()
        floor = await floor_journal(pg_url, f"bench_{run}_floor")

        async def close_pg() -> None:
            await floor[1]()
            await cp.aclose()
            await drop_and_close(pool, f"bench_{run}_hsteps", f"bench_{run}_steps")

        anchor = PostgresStepStore(pool, table=f"bench_{run}_hsteps")
        groups.append(("PostgreSQL", cp.step_store(), anchor, floor, close_pg))
    cp_sqlite = connect(f"sqlite:///{workdir}/ours-steps.db").checkpointer(owns_kv=True)
    conn = wal_connection(workdir / "harness-steps.db", timeout=30)
    sqlite_floor = sqlite_floor_journal(workdir / "floor-steps.db")

    async def close_sqlite() -> None:
        await sqlite_floor[1]()
        await cp_sqlite.aclose()
        conn.close()

    groups.append(
        (
            "SQLite (WAL + NORMAL both)",
            cp_sqlite.step_store(),
            SqliteStepStore(connection=conn),
            sqlite_floor,
            close_sqlite,
        )
    )
    return groups


async def section_steps(
    res: Results, pg_url: str | None, trials: int, ops: int, workdir: Path
) -> None:
    from pydantic_ai_harness.step_persistence import RunRecord

    run = uuid.uuid4().hex[:8]
    for label, ours, anchor, (floor, _), closer in await step_groups(pg_url, run, workdir):
        print(f"\nstep append_event on {label} at 10 and 1,000 events, vs the harness step store")
        stores = {"ours": ours, "anchor": anchor}
        driver = "psycopg" if label == "PostgreSQL" else "sqlite3"
        alone = "one statement" if label == "PostgreSQL" else "one transaction"
        try:
            for length in (10, 1000):
                runs: dict[str, str] = {}
                counters: dict[str, int] = {}
                for name, store in stores.items():
                    run_id = f"bench-{run}-{length}-{name}"
                    await store.register_run(
                        RunRecord(
                            run_id=run_id, conversation_id=f"conv-{run_id}", agent_name="bench"
                        )
                    )
                    for i in range(length):
                        await store.append_event(step_event(run_id, i))
                    runs[name], counters[name] = run_id, length
                runs["floor"], counters["floor"] = f"bench-{run}-{length}-floor", 0

                def append(
                    name: str,
                    runs: dict[str, str] = runs,
                    counters: dict[str, int] = counters,
                    floor: Callable[[Any], Awaitable[None]] = floor,
                    stores: dict[str, Any] = stores,
                ) -> Awaitable[None]:
                    """The append to time, its event made now (the caller's input)."""
                    event = step_event(runs[name], counters[name])
                    counters[name] += 1
                    if name == "floor":
                        return floor(event)
                    return stores[name].append_event(event)  # type: ignore[no-any-return]

                samples, _, per_trial = await one_at_a_time(
                    append, ("ours", "anchor", "floor"), trials, ops
                )
                what = f"step append_event at {length} events, {label}"
                res.add(time_row(what, samples, per_trial))
                res.floor(
                    time_row(
                        f"step append at {length} events, {label}: {driver} alone, {alone}",
                        samples,
                        per_trial,
                        ours="floor",
                    )
                )
                floor_fact(res, what, samples)
        finally:
            await closer()


async def drop_schema(pg_url: str, schema: str) -> None:
    """Drop the schema of our tables a section made (the floors drop their own table)."""
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(plain(pg_url), autocommit=True) as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
        )


async def session_groups(
    pg_url: str | None, run: str, workdir: Path
) -> list[tuple[str, Any, SessionFloor, SessionFloor, str | None]]:
    """(label, our session store, the floor, the format floor, our PostgreSQL schema to
    drop after) on PostgreSQL and SQLite."""
    groups: list[tuple[str, Any, SessionFloor, SessionFloor, str | None]] = []
    if pg_url:
        schema = f"bench_{run}_ses"
        ours = ours_sessions(in_schema(pg_url, schema))
        await ours.kv.setup()
        floor = await PostgresSessionFloor.open(plain(pg_url), f"bench_{run}_fses")
        formats = await PostgresFormatFloor.open(plain(pg_url), f"bench_{run}_ffses")
        groups.append(("PostgreSQL", ours, floor, formats, schema))
    ours_sqlite = ours_sessions(f"sqlite:///{workdir}/ours-sessions.db")
    floor_sqlite = SQLiteSessionFloor(workdir / "floor-sessions.db")
    formats_sqlite = SQLiteFormatFloor(workdir / "format-floor-sessions.db")
    groups.append(("SQLite (WAL + NORMAL)", ours_sqlite, floor_sqlite, formats_sqlite, None))
    return groups


async def session_trials(
    ours: Any, floors: dict[str, SessionFloor], sid: str, trials: int, turns: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Turns of session ``sid`` by agent-stores (``"ours"``) and by each of ``floors``, one
    each in turn (:func:`one_at_a_time`), after one untimed turn each; each turn adds a
    new message pair, made before the clock starts (the caller's input). Returns every
    turn's wall time and process CPU time by name."""
    counter = itertools.count()

    def turn(name: str) -> Awaitable[None]:
        added = message_pair(100_000 + next(counter))
        if name in floors:
            return floors[name].turn(sid, added)
        return turn_adding(ours, sid, added)

    names = ("ours", *floors)
    for name in names:  # untimed: each has served a turn
        await turn(name)
    samples, cpu, _ = await one_at_a_time(turn, names, trials, turns)
    return samples, cpu


async def section_session_floors(
    res: Results, pg_url: str | None, sizes: list[int], trials: int, turns: int, workdir: Path
) -> None:
    """The session turn on PostgreSQL and SQLite beside its floor and its format floor
    (no anchor has a session store on either): one turn each in turn, who goes first
    rotating every turn."""
    run = uuid.uuid4().hex[:8]
    for label, ours, floor, formats, schema in await session_groups(pg_url, run, workdir):
        print(
            f"\nsession turn on {label} (enter, read, replace +2 messages, exit), "
            "vs its floor and its format floor"
        )
        try:
            for size in sizes:
                sid = f"f-{run}-{size}"
                await set_history(ours, sid, size)
                await floor.start(sid, history(size))
                await formats.start(sid, history(size))
                samples, cpu = await session_trials(
                    ours, {"floor": floor, "format": formats}, sid, trials, turns
                )
                what = f"session turn, history {size}, {label}"
                per_turn = {n: med_ms(v) for n, v in cpu.items()}
                res.fact(
                    f"{what}: agent-stores; the client libraries alone (floor); the floor "
                    "with agent-stores' record format (format floor)",
                    f"{timing(samples['ours'])}, CPU {per_turn['ours']:.2f} ms; floor "
                    f"{timing(samples['floor'])}, CPU {per_turn['floor']:.2f} ms; format "
                    f"floor {timing(samples['format'])}, CPU {per_turn['format']:.2f} ms",
                )
                floor_fact(res, what, samples)
                used = per_turn["ours"] / per_turn["floor"]
                res.fact(
                    f"{what}: agent-stores' client CPU per turn ÷ the floor's "
                    f"(target ≤ {CPU_TARGET})",
                    f"{used:.2f} ({'met' if used <= CPU_TARGET else 'missed'})",
                )
                time_ms = {n: med_ms(v) for n, v in samples.items()}
                res.fact(
                    f"{what}: the format floor ÷ the floor (time, client CPU): what the record "
                    "format alone costs",
                    f"{time_ms['format'] / time_ms['floor']:.2f}, "
                    f"{per_turn['format'] / per_turn['floor']:.2f}",
                )
                res.fact(
                    f"{what}: agent-stores ÷ the format floor (time, client CPU): the store's "
                    "own logic",
                    f"{time_ms['ours'] / time_ms['format']:.2f}, "
                    f"{per_turn['ours'] / per_turn['format']:.2f}",
                )
        finally:
            await close(ours)
            await floor.close()
            await formats.close()
            if pg_url and schema:
                await drop_schema(pg_url, schema)


# -- output -------------------------------------------------------------------------------


def _table_row(row: Row) -> str:
    return f"| {row.what} | **{row.ratio_text()}** | {row.ours} | {row.anchor} |"


#: Profiles (py-spy and cProfile, 2 cores, 2026-12-04/05), not figures of the run above; kept beside it.
WHERE_THE_TIME_GOES = [
    "",
    "## Where the time goes",
    "",
    "Sampled with py-spy and cProfile on this 2-core machine (client process only,",
    "December 2026), after the changes of issue 26 named below:",
    "",
    "- **Redis turn, 64 concurrent, history 10.** Pydantic AI decoding and encoding",
    "  messages: about a third (the floor does most of it too; agent-stores also decodes",
    "  each chunk it spills once, for its chunk cache, because Pydantic AI edits the",
    "  caller's message objects in place after a save); the event loop and socket writes:",
    "  about a quarter; redis-py packing and parsing: about a tenth; agent-stores' own code",
    "  (state header, chunk bookkeeping, leases, call deadlines): the rest. redis-py's own",
    "  per-operation timeouts (`asyncio.wait_for`, a task per send, and `asyncio.timeout`",
    "  per read) cost about a tenth of the turn's client CPU; the store's connections now",
    "  bound a command on its shared deadline timer instead (docs/redis.md, Script calls).",
    "  redis-py packs an asynchronous command in Python, about 14 µs for a session script's",
    "  20 arguments (two a turn, the floor's too); with the hiredis extra, installed for this",
    "  run, the store packs its scripts with hiredis instead (1.5 µs, the same bytes), and",
    "  every client parses replies with it: about a tenth less client CPU a turn than",
    "  without the extra (0.68 → 0.60 ms, three alternating runs). The floor now writes",
    "  the messages it spills past the tail bound as a chunk in its save script, as the",
    "  PostgreSQL and SQLite session floors do (it dropped them, which no store may): about",
    "  5% more client CPU for the floor (0.44 → 0.46 ms a turn). A turn whose new messages",
    "  fit inline skips the chunk plan's per-chunk entries and merge pass, and the write",
    "  mark goes into the header's one copy: about 2% (0.504 → 0.494 ms, six alternating",
    "  runs). Turns/s follow client CPU one for one here (the client is the bottleneck),",
    "  so the 0.9 throughput target means at most about 1.11 times the floor's CPU. A save",
    "  with no spilled chunk (about half the turns) runs the fenced `replace` script",
    "  instead of a one-operation `commit` (fewer arguments to pack, less Lua to run), and",
    "  each scope's key base (a base64 of the scope) is made once, not per key: with the",
    "  header change below, 1-2% less client CPU a turn (579 → 566 µs and 653 → 645 µs,",
    "  medians of two sets of five and six alternating runs of 7,680 turns; the runs'",
    "  spread is larger).",
    "- **PostgreSQL step append and memory rows.** psycopg sending the one statement and",
    "  waiting for its reply (all of the floor's work): nearly all of it. The pool's",
    "  checkout and return (lock, queue, statistics) and two context managers per call,",
    "  about a sixth of a short read, are gone for calls one after another: the connection",
    "  is kept back for the next caller (docs/postgres.md, Pooling).",
    "- **SQLite memory read** (below the floor, which decodes the record with the",
    "  standard library's `json`). One `SELECT` run inline, the record decoded before",
    "  reused when the version is unchanged (versions are never reused), no chunk fetch for",
    "  a record that holds its content, a record that changed decoded by pydantic-core",
    "  (`agent_stores.compact_json`, three to four times `json.loads`); before: the call's",
    "  deadline, the async KV call chain, path checks and the telemetry switch (an",
    "  environment lookup per call) came to 20 µs more.",
    "- **SQLite memory CAS write.** The transaction's four statements (the floor's too:",
    "  the receipt's insert is its absence check, a `SELECT` fewer than before, about 5% of",
    "  a write's time for both, December 6),",
    "  the receipt's expiry entered in the table's expiry index (the floor's too): about",
    "  three quarters; the record's and the receipt's JSON: about 1.5 µs by pydantic-core",
    "  (the standard library's encoder, as the floor uses it, took 6 µs); the memory",
    "  store's own work (the receipt index key and fingerprint digests, the index entry, the",
    "  size and id checks the generic port would make, the known-record cache): the rest.",
    "  That rest was cut from about 14 to 11 µs of Python (the write without its SQL,",
    "  repeated): versions drawn as `int.to_bytes().hex()` (0.12 µs each instead of 0.45;",
    "  the floor uses the same generator), ids checked in one look when plain ASCII, the",
    "  port request and the store's own request no longer frozen dataclasses (a frozen",
    "  field costs about 0.1 µs to set), the index entry encoded without its object, the",
    "  SQLite port's statements called without a wrapper: 1.31 → 1.23-1.26 times the",
    "  floor's time (alternating runs). The same Python costs more between the SQL than",
    "  repeated alone (about 20 µs against 12 here): SQLite's work leaves the caches cold",
    "  for it, and the floor's shorter path loses less.",
    "- **SQLite step append.** The journal port's transaction is at the floor, the run's",
    "  expiry (30 days by default) written into the expiry index by both; the step store",
    "  around it (the run's lock, kept for the logs written lately instead of made at each",
    "  append, the cached counter, the TTL anchor read without an await, the record's",
    "  canonical JSON with sorted keys by the standard library's C encoder made once",
    "  instead of per call) costs about 15 µs, a third of it the JSON.",
    "- **PostgreSQL memory read.** The KV's one `SELECT` on a pooled connection; its",
    "  cursor is kept per connection for reads of one entry (closed after a reply over",
    "  64 KiB) instead of built per read, which cost about 10 µs.",
    "- **Session turn on SQLite.** Everything runs inline. A warm turn (this store wrote",
    "  the session last) takes the lease with one `UPDATE` over the state it knows (only",
    "  if still stored, live, and no client waits); a save without a spilled chunk is its",
    "  fenced `UPDATE` alone: four to six statements a turn against the floor's two to",
    "  five, down from eight to ten (a read-decide-write transaction, and `BEGIN`/`COMMIT`",
    "  around every save). Pydantic AI encoding the tail (the floor's too): about a",
    "  quarter; decoding each chunk the tail spills, for the chunk cache (the floor writes",
    "  the chunk but keeps no decoded copy): about a tenth; the session's own bookkeeping",
    "  (header, chunk plan, lease handle, the turn's task shield, the background merge",
    "  cleanup): the rest. The same encode costs about twice as much inside a turn as",
    "  repeated at once: three messages, 58 µs the first time and 32 µs made again right",
    "  after (the floor's, which follows its decode directly, 36 µs). Pydantic AI's",
    "  serializer finds its code and data cold after the session's own work in between;",
    "  in an application the model call in between leaves them cold for any store.",
    "  The turn's last write runs in a shielded task, started eagerly (Python 3.12+) on a",
    "  backend that answers inline (`KVCapabilities.answers_inline`: SQLite), so it",
    "  finishes without a round of the event loop: about 5% of the turn (0.556 → 0.53 ms,",
    "  four alternating runs). Networked backends keep a plain task: on Redis under",
    "  concurrency the eager start measured no better.",
    "- **Session turn on PostgreSQL.** A cold acquire decides in the server and parses",
    "  the state's header as `jsonb`: about 0.6 ms against 0.35 ms for the floor's",
    "  `UPDATE … RETURNING`; a warm one (this store wrote last, no client waits) compares",
    "  the version and writes the state the client built, with no header parsed and no",
    "  state sent back. The full acquire statement did that too, but the server planned",
    "  and ran the whole 5.6 KB statement for it (`EXPLAIN ANALYZE`: 0.7 ms to plan a",
    "  custom plan, 0.2 ms to run; prepared, about 0.3 ms more than a short `UPDATE`):",
    "  a store whose last acquire of the session was warm now sends that write alone,",
    "  falling back to the full statement (one round trip more, once) when another",
    "  client wrote since. The acquire went from about 0.75 to 0.47 ms, the turn from",
    "  1.95 to 1.44-1.51 times the floor's time. The save is at the floor's (0.37 ms); its",
    "  chunk parts go as a binary array (the text form escaped each byte in Python). The",
    "  acquire statement is 5.6 KB, over psycopg's 4 KiB cache for converted statements,",
    "  so its placeholders were split again at every turn (0.1-0.15 ms of client CPU): it",
    "  is now converted once. Client",
    "  CPU is about twice the floor's. A save that spills no chunk sends the fenced",
    "  `UPDATE` alone (before: with four empty arrays, dumped by psycopg in Python, and",
    "  a CTE). After a turn that merges chunks, the background",
    "  cleanup reads the branch records and the state and deletes the merged parts in",
    "  one commit (before: a delete, and a commit, per part: about 0.35 a turn here);",
    "  that commit, unconditional deletes only, is now one `DELETE … WHERE key =",
    "  ANY($keys)` instead of a pipelined transaction of a statement per part (about",
    "  eight): 2.6 → 2.2 statements a turn on average, each some 50-100 µs of client CPU.",
    "  psycopg dumps a list parameter item by item in Python: the acquire's list of the",
    "  chunks this process holds now goes as one JSON array (`jsonb ? key` in the",
    "  server), and a save with one spilled chunk part sends it as plain parameters, not",
    "  four one-item arrays: about 5% less client CPU a turn (1.36 → 1.29 ms, three",
    "  alternating runs of 2,000 turns). What remains of the client CPU above the floor's",
    "  (about 0.4 ms a turn, cProfile and call counts): the session's own bookkeeping",
    "  (state header, chunk plan, lease handle, call deadlines, the history checks), about",
    "  half; decoding each chunk the tail spills for the chunk cache (the floor keeps the",
    "  caller's objects) and the cleanup's statements (a scan, a read and a delete after",
    "  about one turn in sixteen), about a sixth; the port's parameters and calls, about",
    "  a tenth; the turn's shielded exit task and the loop rounds it costs (7.3 rounds of",
    "  the event loop a turn against the floor's 4), most of the rest.",
    "- **Session turn on PostgreSQL and SQLite against the format floor** (December 6,",
    "  three full runs, three of `--only session-floors`, three `--quick`). The format floor",
    "  alone takes 1.10-1.19 times the floor's time on PostgreSQL and 1.24-1.32 times its",
    "  client CPU, and 1.39-1.60 times both on SQLite (the lower ends in the short `--quick`",
    "  runs): at or past the ≤ 1.25 CPU target on both, which leaves nothing for the",
    "  store's own logic, and past the SQLite time target, however a store keeping these",
    "  records arranges its code. Its extra work, timed alone (10 chunk refs, repeated;",
    "  about half as much again inside a turn): the acquire's header splice 10.6 µs and",
    "  the decode of the state it made 10.7 µs, the save's header 11.4 µs, a spilled",
    "  chunk's decode for the cache about 14 µs every other turn; on SQLite also the",
    "  acquire's write of the whole state (up to about 5 KB) where the floor writes a",
    "  version. The store's own logic above the format floor: 1.22-1.31 times its time",
    "  and 1.40-1.50 its CPU on PostgreSQL, 1.43-1.80 on SQLite. Nor would the lease out",
    "  of the state's bytes be enough: the format floor with the lease in columns of its",
    "  own (`benchmarks/lease_column_floors.py`, run by hand: the acquire writes a version,",
    "  an owner and an expiry, as the floor writes a version; the header kept as an",
    "  object, nothing spliced or decoded) takes 1.34-1.41 times the floor on SQLite and",
    "  1.10-1.11 times its time, 1.20-1.24 its client CPU on PostgreSQL, in the same trials",
    "  and with no store logic at all (December 6). Most of that is the decode of each",
    "  spilled chunk, about 0.15 times the SQLite floor, which no correct store can skip",
    "  while Pydantic AI edits saved messages in place, and the save's header with its",
    "  chunk refs.",
    "  With the format floor in the trials, agent-stores ÷ floor reads 2.2-2.7 on SQLite",
    "  where it read 2.3-2.4 beside the floor alone the same day (the same code: a third",
    "  client's work between two of its turns leaves Pydantic AI's code and data colder),",
    "  and 1.38-1.54 on PostgreSQL against 1.45-1.47.",
    "- **State header encoding (every backend).** The chunk list is most of a state",
    "  header's JSON and rarely changes between two saves: each chunk reference's",
    "  encoding and each whole list are kept (by the references' identities; they are",
    "  frozen) and spliced into the header, the same bytes as before (a property test",
    "  compares them with the object encoded whole). A header of 14 chunks encodes in",
    "  11.5 µs instead of 22.6 µs repeated, 30 µs instead of 35 µs inside a SQLite turn",
    "  at a history of 1,000 (medians); not measurable in a whole turn's time.",
    "- **State header decoding (every backend).** A turn decoded a state header twice",
    "  (about 20 µs each inside a SQLite turn): the state its store saved last, for a port",
    "  deciding on it in Python (SQLite, PostgreSQL), and the acquire's reply. The first",
    "  now comes with the request (`AcquireRequest.known_header`, the header the store",
    "  encoded); the second is noted when `acquired_state` makes it from a state whose",
    "  kept fields this process encoded, and taken by the reply's decode (a property",
    "  test compares both with the full decoder). SQLite turn 0.51 → 0.475 ms, PostgreSQL",
    "  client CPU about 3% less (alternating runs); Redis, whose script decides, within",
    "  the runs' spread.",
    "- **Await chains (every backend).** Each coroutine between a task and its socket is",
    "  resumed on every reply. The deadline of a public KV call, of a session port call and",
    "  of a Redis script, and the Redis per-command bound, are now `with` blocks",
    "  (`Deadline(kv)`, `TimeBound(seconds)`) instead of coroutines wrapping the call (one",
    "  of them nested in another, where it did nothing but be resumed), and a Redis script",
    "  goes to the store's connections and an unqueued acquire to the storage without a",
    "  forwarding coroutine: four levels less per Redis script call. Redis 64x8 at history",
    "  100 about 1% more turns/s (four alternating runs; their spread is about 3%).",
    "- **A replacement that extends the loaded history** is recognised piece by piece",
    "  (each piece's first and last message by identity, then a list comparison, which",
    "  answers by identity for each message) instead of an item-by-item identity loop in",
    "  Python (about 20 ns a message, 15-30 µs a turn at a long history).",
    "- **A finished turn is freed at once.** A session referred to its turn and the turn",
    "  to its session: every turn's history, header and lease handle waited in that cycle",
    "  for CPython's garbage collector, which walks everything young at each collection.",
    "  The session now refers to its turn weakly; Redis 64x8 collection time 43 → 25 µs a",
    "  turn at history 10, turns/s 2-3% higher at h10, h100 and h1000 (alternating runs).",
    "- **Redis turn at history 1,000.** What it costs above history 10 is CPython's cyclic",
    "  garbage collector: with the collector off (`gc.disable()` around the 512 turns,",
    "  measured) a turn's client CPU at 1,000 messages equals the one at 10 (0.56 ms",
    "  against 0.54 here); with it on, 0.83 ms, of which young-generation collections",
    "  took 0.18 ms a turn (0.5 ms each, one every six turns). They walk every young list",
    "  of the whole history that the 64 turns in flight hold, item by item. A save that",
    "  releases the lease no longer rebuilds the store's basis for the next save (two such",
    "  lists a turn fewer: 0.83 → 0.74 ms); the basis is now held as the pieces it was",
    "  assembled from (the chunk cache's tuples, old objects the collector no longer walks,",
    "  and the tail), and a replacement that extends it as those pieces and the new",
    "  messages: two more lists fewer, and the collections' time a turn about a fifth",
    "  less (0.085 → 0.07 ms); client CPU 0.72 → 0.69 ms a turn, the mean of 23",
    "  alternating runs of the previous commit and this one, whose spread (0.62-0.82 ms",
    "  for the same code) is larger. What is left young is the caller's new list of the",
    "  whole history, which the floor's caller now makes too (below). The chunk cache holds",
    "  the 64 histories (about 55 MB of JSON within the 64 MB default): only tails are",
    "  decoded.",
    "- **What a turn holds while it waits.** With 64 turns in flight, young-generation",
    "  collections come from the objects the waiting turns hold, not from garbage (about",
    "  4 cyclic objects a turn) nor survivors (about 15 a turn, the spilled messages",
    "  cached): a turn alone sees 5 collections per 512 turns, 64 at once 21, the floor 8.",
    "  A turn now holds fewer: `Deadline` keeps its nesting on the loop's deadline watch",
    "  instead of a context variable (a set made a token and two mapping nodes), a bound is",
    "  its own slot in the watch, the turn's two events and lock and the session's queue",
    "  lock are made only when a renewal, a checkpoint, a closing store or a second task",
    "  needs them, the last write waits on one callback instead of `asyncio.shield`'s two",
    "  (each with its copy of the context), the telemetry wrappers hand back the turn's own",
    "  coroutine when not recording, a save asks for chunk re-copies only when one is due,",
    "  and a Redis script's first attempt is sent without two coroutine levels, a closure",
    "  and a copy of its arguments: 17 collections instead of 21, young objects at a",
    "  collection 3,750 → 3,250; Redis 64x8 at history 100 0.86 → 0.95 of the floor's",
    "  turns/s, client CPU 1.16 → 1.05 times the floor's (medians of five alternating runs",
    "  of the previous commit and this one, each in a process of its own).",
    "- **A process that has served many sessions.** The caches of header encodings (the",
    "  chunk lists and refs, the kept fields, the acquired states; 4,096 to 16,384 entries)",
    "  evicted their oldest entry with `del d[next(iter(d))]`, and a plain dict finds its",
    "  first live entry by skipping the deleted ones before it: once full, 1.8-5 µs a put",
    "  instead of 0.15, several puts a turn. They are `OrderedDict`s now (0.35 µs a put when",
    "  full). The bench's later rows ran in such a process: the Redis 64x8 rows after the",
    "  single-turn rows had filled the caches.",
    "- **The floors' callers.** The Redis 64x8 floor is timed beside each history length's",
    "  row in the same trials (it was timed once, at history 10, minutes before the other",
    "  rows, and the machine drifts by several hundredths in that time). Every session",
    "  floor's caller now gets the whole history and makes one new list of it and the",
    "  turn's messages, as agent-stores' caller in the bench does (the messages before the",
    "  tail are the very objects the floor was given, held and never decoded); before, it",
    "  got the inline tail only, which no session store can hand an agent, and at history",
    "  1,000 the caller's list was the difference. The bench's turn copies the history once",
    "  (it copied it twice).",
]


def machine_load(*, judge: bool = True) -> str:
    """The 1-minute load average, and (``judge``: taken before the run) whether it says the
    machine is busy, so the run should be repeated."""
    load = os.getloadavg()[0]
    busy = judge and load > 0.5 * (os.cpu_count() or 1)
    return f"{load:.2f}" + (
        " (busy: other work competed, rerun on a quiet machine)" if busy else ""
    )


def redis_clients() -> str:
    """Which Redis client libraries the Redis rows ran on."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        hiredis = version("hiredis")
    except PackageNotFoundError:
        return f"Redis rows: redis-py {version('redis')} without hiredis."
    return (
        f"Redis rows: redis-py {version('redis')} with hiredis {hiredis} (the "
        "`agent-stores-redis[hiredis]` extra): every client here, anchor and floor included, "
        "parses replies with it; agent-stores also packs its scripts with it."
    )


def markdown(
    res: Results, started: str, seconds: float, argv: list[str], load: tuple[str, str]
) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `nox -s bench` (`benchmarks/side_by_side.py`); do not edit by hand.",
        f"Run {started}, {seconds:.0f} s, Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs (shared machine: only the same-run ratios below mean anything).",
        f"Load average (1 min) before the run: {load[0]}; after: {load[1]} (the bench's own "
        "work included).",
        "",
        "Every row times agent-stores and the anchor in the same process, against the same server,",
        "with the same data, alternating which goes first each trial. **Ratio** = agent-stores ÷",
        "anchor of the medians of all samples (below 1: agent-stores faster or smaller; for",
        "turns/s rows, above 1: agent-stores faster), with the min-max of the per-trial ratios.",
        "Anchors: Cortex Agent SDK 0.5.0 `RedisSessionStore`; pydantic-ai-harness 0.75.0",
        "`PostgresMemoryStore` (asyncpg pool 1-5), `SqliteMemoryStore` on a WAL + `synchronous=NORMAL`",
        "connection (agent-stores' own SQLite setting), `PostgresStepStore`, `SqliteStepStore`",
        "(WAL + `synchronous=NORMAL` too).",
        redis_clients(),
        "",
        "| what | ratio (range) | agent-stores | anchor |",
        "|---|---|---|---|",
    ]
    lines += [_table_row(row) for row in res.rows]
    if res.floors:
        lines += [
            "",
            "## Floors: the client libraries alone, same run",
            "",
            "What the clients agent-stores is built on reach doing only the unavoidable",
            "part of a row's work, with no agent-stores code: for the Redis turn, redis-py's",
            "two `EVALSHA` per turn with agent-stores' argument shapes plus Pydantic AI's decode",
            "of the inline tail and encode of the tail saved back (past the 4 KiB tail bound, the",
            "save's script also writes the spilled messages as a chunk, as the PostgreSQL and",
            "SQLite session floors do: a store must keep the history), timed beside each history",
            "length's row in the same trials; in every session floor the caller gets the whole",
            "history and makes one new list of it and the turn's messages, as agent-stores'",
            "caller in the bench does, the messages before the tail being the very objects the",
            "floor was given, held and never decoded (no store can undercut that); for the",
            "step append, agent-stores' one journal statement sent by psycopg on one held",
            "connection and cursor (no pool), or the SQLite journal port's transaction by the",
            "stdlib `sqlite3` inline, each encoding the event (JSON); for the memory CAS write",
            "with receipt and the read, the memory port's own statement (PostgreSQL) or",
            "transaction (SQLite) and the KV's `SELECT`, by psycopg on one held connection or",
            "by the stdlib `sqlite3` inline, each write encoding its record (JSON) and each",
            "read decoding the record it read into the content it returns, ids drawn by the",
            "store's own generator (`benchmarks/memory_floors.py`); for the session turn on",
            "PostgreSQL and SQLite (no anchor: their figures are under *Other figures*), two",
            "statements by psycopg or `sqlite3` — the lease taken by an `UPDATE … RETURNING`",
            "the state, the fenced save, with a spilled chunk's insert when the tail overflows",
            "— plus Pydantic AI's decode and encode of the tail and the caller's list, as above",
            "(`benchmarks/session_floors.py`).",
            "Each floor's table is shaped like agent-stores', its partial index on",
            "`expires_at` included, and rows get the expiries the store gives them (a",
            "receipt's, a run's, a session's). Only the store call is timed: the caller's",
            "inputs (content, operation, event, new messages) are made before the clock starts.",
            "No store built on these clients can beat its floor, so a target beyond it is out",
            "of reach with them.",
            "",
            "The session turn on PostgreSQL and SQLite is also timed beside its *format floor*",
            "in the same trials: the floor plus what agent-stores' stored records ask of a warm",
            "turn and nothing else of the store (`benchmarks/format_floors.py`): the lease is",
            "in the state's header, so the acquire writes the state (the core's header splice)",
            "instead of a version, and the state is decoded; the save encodes the header with",
            "its chunk refs; a spilled chunk is decoded again for the chunk cache (the caller's",
            "objects are not kept: Pydantic AI edits them in place); the caller's list is",
            "checked to begin with the history it was handed; a lease-renewal timer is armed",
            "and cancelled. *Format floor ÷ floor* is what the record format alone costs;",
            "*agent-stores ÷ format floor* is what the store's own logic costs (waiters,",
            "catalog, merges, deadlines, retries, telemetry, and its code's layers). Both are",
            "under *Other figures*.",
            "",
            "| what | floor ÷ anchor (range) | floor | anchor |",
            "|---|---|---|---|",
        ]
        lines += [_table_row(row) for row in res.floors]
    lines += WHERE_THE_TIME_GOES
    lines += ["", "## Other figures of the same run", "", "| what | value |", "|---|---|"]
    for what, value in res.facts:
        lines.append(f"| {what} | {value} |")
    lines += [
        "",
        "Round trips are counted by a TCP proxy (`benchmarks/proxy.py`): a client burst after",
        "the server spoke. *Cold* turns alternate between two store objects on one session, so",
        'every turn finds the session last written by "another process". On PostgreSQL one',
        "of them costs three: the first to find the other store's write in the store whose",
        "last acquire was warm, which sends the warm write first (docs/postgres.md, Sessions).",
        "",
        f"Command: `python benchmarks/side_by_side.py {' '.join(a for a in argv if '://' not in a)}`",
        "",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> Results:
    # The SQLite databases of every side live here, removed with it when the run ends.
    with tempfile.TemporaryDirectory(prefix="agent-stores-bench-") as workdir:
        return await run_sections(args, Path(workdir))


async def run_sections(args: argparse.Namespace, workdir: Path) -> Results:
    """The sections ``args`` asks for, SQLite files in ``workdir``."""
    res = Results()
    quick = args.quick
    trials = 3 if quick else 5
    sizes = [10, 100] if quick else [10, 100, 1000]
    only = set(args.only.split(",")) if args.only else set(SECTIONS)

    def wanted(section: str) -> bool:
        return section in only

    if args.redis:
        if wanted("turns"):
            await section_turns(res, args.redis, sizes, trials, 10 if quick else 20)
        if wanted("wire"):
            await section_wire(res, args.redis, sizes, 6 if quick else 10)
        if wanted("concurrency"):
            # Seven trials: a trial is a quarter of a second of turns, and on two cores one
            # hiccup moves it by a tenth; the median of three swung the ratios by as much.
            await section_concurrency(
                res, args.redis, [10, 100] if quick else [10, 100, 1000], 2 if quick else 7
            )
        if wanted("handover"):
            await section_handover(res, args.redis)
    if args.postgres and wanted("pg-rt"):
        await section_postgres_rt(res, args.postgres, 6)
    if wanted("memory"):
        await section_memory(res, args.postgres, trials, 20 if quick else 50, workdir)
    if wanted("steps"):
        await section_steps(res, args.postgres, trials, 20 if quick else 50, workdir)
    if wanted("session-floors"):
        await section_session_floors(
            res,
            args.postgres,
            [10, 100] if quick else [10, 100, 1000],
            trials,
            20 if quick else 50,
            workdir,
        )
    return res


#: The sections ``--only`` may name, in the order they run.
SECTIONS = (
    "turns",
    "wire",
    "concurrency",
    "handover",
    "pg-rt",
    "memory",
    "steps",
    "session-floors",
)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--handover-worker":
        name, url, sid, n, prefix = sys.argv[2:7]
        asyncio.run(handover_worker(name, url, sid, int(n), prefix))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", default=os.environ.get("AGENT_STORES_BENCH_REDIS"))
    parser.add_argument("--postgres", default=os.environ.get("AGENT_STORES_BENCH_POSTGRES"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", help="write the results page here (docs/benchmarks.md)")
    parser.add_argument(
        "--only",
        help=f"run only these comma-separated sections (of {','.join(SECTIONS)}), to iterate",
    )
    args = parser.parse_args()
    if args.only and not set(args.only.split(",")) <= set(SECTIONS):
        parser.error(f"--only takes sections among {','.join(SECTIONS)}")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.perf_counter()
    before = machine_load()
    print(f"load average (1 min): {before}")
    print(redis_clients())
    print("agent-stores ÷ anchor, same process, trials interleaved (ratio (min-max over trials))")
    res = asyncio.run(main_async(args))
    load = (before, machine_load(judge=False))  # after: the bench's own work is in it
    page = markdown(res, started, time.perf_counter() - t0, sys.argv[1:], load)
    print("\n" + page)
    if args.markdown:
        Path(args.markdown).write_text(page)


if __name__ == "__main__":
    main()
