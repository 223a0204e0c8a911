"""``nox -s bench``: the DESIGN.md §6 rows, ours beside the anchors'.

Per backend (memory, sqlite, and Redis / PostgreSQL when their URLs are given):

* turn cycle (enter, read, replace +2 messages, exit) at history 10 / 100 / 1000;
* bytes sent per turn and round trips per turn (through a counting TCP proxy for
  networked backends, through ``CountingKV`` for embedded ones);
* 64 sessions x 8 turns concurrently (turns/s), 8 tasks x 5 turns on one session
  (hand-overs, longest wait);
* 6 processes x 8 turns on one session: p95 and longest wait for the session, also in
  turn times (served in arrival order, the longest wait stays near 5 turn times);
* memory CAS write with receipt / read, step ``append_event`` at 10 and 1,000 events.

Usage: ``python benchmarks/run.py [--redis URL] [--postgres URL] [--dynamodb URL] [--cosmos URL]
[--firestore URL] [--quick]``.
Numbers are printed, never asserted: speed is measured here, not in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agent_stores import StoreURL, connect, open_kv
from agent_stores.kv.counting import CountingKV
from agent_stores.sessions import SessionStore
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, UserPromptPart

try:
    from proxy import DelayProxy  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - run as a module
    from benchmarks.proxy import DelayProxy

ANCHORS = {
    "turn 10/100/1000 (ms median)": "Cortex Redis 0.70 / 2.0 / 15.6",
    "bytes per turn 10/100/1000": "Cortex Redis 8,009 / 54,030 / 514,231",
    "round trips per turn": "Cortex Redis 4",
    "64x8 turns/s (history 10/100)": "Cortex Redis 1,568 / 482",
    "8 tasks x 5 turns, one session": "Cortex Redis: 7 hand-overs in 40 turns, waits up to 263 ms",
    "memory write / read": "harness Postgres 0.64 / 0.19 ms, 6 / 2 round trips; SQLite write 1.24 ms",
    "step append at 10 / 1000 events": "harness Postgres 0.47 / 0.48 ms, 4 round trips",
}


def message_pair(i: int) -> list[ModelMessage]:
    """A request and a response of about 511 bytes of JSON each."""
    text = f"message {i} " + "lorem ipsum dolor sit amet " * 14
    return [
        ModelRequest(parts=[UserPromptPart(content=text[:380])]),
        ModelResponse(parts=[TextPart(content=text[:400])], model_name="bench"),
    ]


def history(n: int) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for i in range(n // 2):
        out += message_pair(i)
    return out


def ms(seconds: list[float]) -> str:
    values = sorted(s * 1000 for s in seconds)
    p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
    return f"{statistics.median(values):.2f} / {p95:.2f}"


@dataclass
class Meter:
    """Round trips and bytes sent, from the proxy (network) or the counting KV (embedded)."""

    proxy: DelayProxy | None
    counting: CountingKV | None

    def reset(self) -> None:
        if self.proxy:
            self.proxy.stats.reset()
        if self.counting:
            self.counting.reset_counts()

    def read(self) -> tuple[int, int]:
        if self.proxy:
            return self.proxy.stats.round_trips, self.proxy.stats.bytes_to_server
        assert self.counting is not None
        return self.counting.total_calls, self.counting.bytes_written


@asynccontextmanager
async def backend(url: str) -> AsyncIterator[tuple[str, Meter]]:
    """Yield a URL to use (through a proxy for networked backends) and its meter."""
    parsed = StoreURL.parse(url)
    if parsed.scheme in {"memory", "sqlite"}:
        yield url, Meter(None, None)
        return
    emulator = parsed.query_get("emulator_host")
    if parsed.scheme == "firestore" and emulator:
        # Firestore's address is the emulator's, in the query; the host is the project.
        host, _, port = emulator.rpartition(":")
        async with DelayProxy(host, int(port)) as proxy:
            proxied = parsed.with_query(emulator_host=f"127.0.0.1:{proxy.port}")
            yield proxied.render_with_secrets(), Meter(proxy, None)
        return
    endpoint = parsed.query_get("endpoint_url")
    if parsed.scheme == "dynamodb" and endpoint:
        # DynamoDB's host is the table; the server is the endpoint URL.
        server = urlsplit(endpoint)
        async with DelayProxy(server.hostname or "127.0.0.1", server.port or 80) as proxy:
            proxied = parsed.with_query(
                endpoint_url=f"{server.scheme}://127.0.0.1:{proxy.port}{server.path}"
            )
            yield proxied.render_with_secrets(), Meter(proxy, None)
        return
    async with DelayProxy(parsed.host or "127.0.0.1", parsed.port or 0) as proxy:
        yield (
            parsed.set(host="127.0.0.1", port=proxy.port).render_with_secrets(),
            Meter(proxy, None),
        )


def open_session_store(url: str, meter: Meter) -> SessionStore:
    if meter.proxy is None:
        counting = CountingKV(open_kv(url))
        meter.counting = counting
        return SessionStore(counting, owns_kv=True)
    return connect(url).sessions(owns_kv=True)


async def bench_turns(
    url: str, meter: Meter, sizes: list[int], rounds: int
) -> list[tuple[str, str]]:
    rows = []
    store = open_session_store(url, meter)
    async with store:
        for size in sizes:
            sid = f"bench-{uuid.uuid4().hex[:8]}"
            async with store.turn(sid) as s:
                s.replace(history(size))
            times: list[float] = []
            trips: list[int] = []
            sent: list[int] = []
            for i in range(rounds):
                meter.reset()
                t0 = time.perf_counter()
                async with store.turn(sid) as s:
                    msgs = list(s.messages)
                    s.replace([*msgs, *message_pair(10_000 + i)])
                times.append(time.perf_counter() - t0)
                r, b = meter.read()
                trips.append(r)
                sent.append(b)
            rows.append((f"turn at history {size} (ms median / p95)", ms(times)))
            rows.append((f"  bytes sent per turn at {size}", f"{int(statistics.median(sent)):,}"))
            rows.append((f"  round trips per turn at {size}", str(int(statistics.median(trips)))))
    return rows


async def bench_concurrency(url: str, meter: Meter, size: int) -> tuple[str, str]:
    store = open_session_store(url, meter)
    async with store:
        ids = [f"bench-c-{uuid.uuid4().hex[:8]}" for _ in range(64)]
        for sid in ids:
            async with store.turn(sid) as s:
                s.replace(history(size))

        async def run(sid: str) -> None:
            for i in range(8):
                async with store.turn(sid, timeout_seconds=60) as s:
                    s.replace([*s.messages, *message_pair(i)])

        t0 = time.perf_counter()
        await asyncio.gather(*(run(sid) for sid in ids))
        elapsed = time.perf_counter() - t0
    return (f"64 sessions x 8 turns at history {size} (turns/s)", f"{64 * 8 / elapsed:,.0f}")


async def bench_contention(url: str, meter: Meter) -> tuple[str, str]:
    # Separate store objects: each stands for a different process.
    stores = [open_session_store(url, Meter(meter.proxy, None)) for _ in range(8)]
    sid = f"bench-h-{uuid.uuid4().hex[:8]}"
    owners: list[int] = []
    waits: list[float] = []

    async def worker(n: int) -> None:
        for _ in range(5):
            t0 = time.perf_counter()
            async with stores[n].turn(sid, timeout_seconds=60) as s:
                waits.append(time.perf_counter() - t0)
                owners.append(n)
                s.replace([*s.messages, *message_pair(n)])

    await asyncio.gather(*(worker(n) for n in range(8)))
    for store in stores:
        await store.aclose()
    handovers = sum(1 for a, b in itertools.pairwise(owners) if a != b)
    return (
        "8 tasks x 5 turns on one session",
        f"{handovers} hand-overs in 40 turns, longest wait {max(waits) * 1000:.0f} ms",
    )


async def bench_processes(url: str, processes: int = 6, turns: int = 8) -> tuple[str, str]:
    """``processes`` OS processes loop on one session (the contract's ``turns`` worker)."""
    if StoreURL.parse(url).scheme == "memory":
        return (f"{processes} processes x {turns} turns, one session", "n/a (process-local)")
    sid = f"bench-p-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as barrier:
        args = ["turns", url, sid, str(turns), "30", "--barrier", barrier, str(processes)]
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent_stores_contract.session_workers",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for _ in range(processes)
        ]
        outputs = [await p.communicate() for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"a bench process failed: {err.decode()[-2000:]}")
    done = sorted(
        (json.loads(line) for out, _ in outputs for line in out.decode().splitlines()),
        key=lambda t: t["start"],
    )
    waits = sorted((t["start"] - t["asked"]) / 1e9 for t in done)
    starts = [t["start"] for t in done]
    # Served in arrival order, a turn waits behind at most the other processes' turns.
    behind = max(sum(1 for s in starts if t["asked"] < s < t["start"]) for t in done)
    # A turn time: the mean interval between turns, the hand-over included.
    cycle = (starts[-1] - starts[0]) / (len(starts) - 1) / 1e9
    p95 = waits[min(len(waits) - 1, int(0.95 * len(waits)))]
    return (
        f"{processes} processes x {turns} turns, one session",
        f"wait p95 {p95 * 1000:.0f} ms, max {waits[-1] * 1000:.0f} ms "
        f"(= {waits[-1] / cycle:.1f} turn times of {cycle * 1000:.1f} ms); "
        f"at most {behind} turns served ahead of a waiting one",
    )


async def bench_memory(url: str, meter: Meter, rounds: int) -> list[tuple[str, str]]:
    from agent_stores.memory import KVMemoryStore
    from pydantic_ai_harness.memory import MemoryOperation

    if meter.proxy is None:
        counting = CountingKV(open_kv(url))
        meter.counting = counting
        store = KVMemoryStore(counting, owns_kv=True)
    else:
        store = connect(url).memory(owns_kv=True)
    writes: list[float] = []
    reads: list[float] = []
    write_trips: list[int] = []
    read_trips: list[int] = []
    base = f"bench/{uuid.uuid4().hex[:8]}"
    async with store:
        version: str | None = None
        for i in range(rounds):
            meter.reset()
            t0 = time.perf_counter()
            mutation = await store.write(
                f"{base}/notes.md",
                f"note {i}\n" * 20,
                expected_version=version,
                operation=MemoryOperation(id=f"op-{uuid.uuid4().hex}", fingerprint=f"fp-{i}"),
            )
            writes.append(time.perf_counter() - t0)
            write_trips.append(meter.read()[0])
            version = mutation.version
            meter.reset()
            t0 = time.perf_counter()
            await store.read(f"{base}/notes.md", max_chars=10_000)
            reads.append(time.perf_counter() - t0)
            read_trips.append(meter.read()[0])
    return [
        (
            "memory write with receipt (ms median / p95)",
            f"{ms(writes)}; {int(statistics.median(write_trips))} round trips",
        ),
        (
            "memory read (ms median / p95)",
            f"{ms(reads)}; {int(statistics.median(read_trips))} round trips",
        ),
    ]


async def bench_steps(url: str, meter: Meter, rounds: int) -> list[tuple[str, str]]:
    from agent_stores.checkpointer import Checkpointer
    from pydantic_ai_harness.step_persistence import RunRecord, StepEvent

    if meter.proxy is None:
        counting = CountingKV(open_kv(url))
        meter.counting = counting
        checkpointer = Checkpointer(counting, owns_kv=True)
    else:
        checkpointer = connect(url).checkpointer(owns_kv=True)
    rows = []
    async with checkpointer:
        steps = checkpointer.step_store()
        for length in (10, 1000):
            run_id = f"bench-{uuid.uuid4().hex[:8]}"
            await steps.register_run(RunRecord(run_id=run_id))
            for i in range(length):
                await steps.append_event(
                    StepEvent(
                        run_id=run_id,
                        kind="model_request",
                        step_index=i,
                        idempotency_key=f"{run_id}-{i}",
                    )
                )
            times: list[float] = []
            trips: list[int] = []
            for i in range(rounds):
                meter.reset()
                t0 = time.perf_counter()
                await steps.append_event(
                    StepEvent(
                        run_id=run_id,
                        kind="model_request",
                        step_index=length + i,
                        idempotency_key=f"{run_id}-x{i}",
                    )
                )
                times.append(time.perf_counter() - t0)
                trips.append(meter.read()[0])
            rows.append(
                (
                    f"step append_event at {length} events (ms median / p95)",
                    f"{ms(times)}; {int(statistics.median(trips))} round trips",
                )
            )
    return rows


async def run_backend(name: str, url: str, quick: bool) -> list[tuple[str, str]]:
    rounds = 20 if quick else 100
    sizes = [10, 100] if quick else [10, 100, 1000]
    rows: list[tuple[str, str]] = []
    kv = open_kv(url)
    try:
        await kv.setup()  # the table / container a test server starts without
    finally:
        await kv.aclose()
    sections: list[Callable[[str, Meter], Awaitable[Any]]] = [
        lambda u, m: bench_turns(u, m, sizes, rounds),
        lambda u, m: bench_concurrency(u, m, 10),
        lambda u, m: bench_concurrency(u, m, 100),
        lambda u, m: bench_contention(u, m),
        lambda u, m: bench_processes(u),
        lambda u, m: bench_memory(u, m, rounds),
        lambda u, m: bench_steps(u, m, rounds),
    ]
    for section in sections:
        async with backend(url) as (target, meter):
            result = await section(target, meter)
        rows += result if isinstance(result, list) else [result]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sqlite", default=f"sqlite:////tmp/agent-stores-bench-{uuid.uuid4().hex[:8]}.db"
    )
    parser.add_argument("--redis", default=os.environ.get("AGENT_STORES_BENCH_REDIS"))
    parser.add_argument("--postgres", default=os.environ.get("AGENT_STORES_BENCH_POSTGRES"))
    parser.add_argument("--dynamodb", default=os.environ.get("AGENT_STORES_BENCH_DYNAMODB"))
    parser.add_argument("--cosmos", default=os.environ.get("AGENT_STORES_BENCH_COSMOS"))
    parser.add_argument("--firestore", default=os.environ.get("AGENT_STORES_BENCH_FIRESTORE"))
    parser.add_argument("--quick", action="store_true", help="fewer rounds, history up to 100")
    args = parser.parse_args()
    targets = {"memory": f"memory://bench-{uuid.uuid4().hex[:6]}", "sqlite": args.sqlite}
    if args.redis:
        targets["redis"] = args.redis
    if args.postgres:
        targets["postgres"] = args.postgres
    if args.dynamodb:
        targets["dynamodb"] = args.dynamodb
    if args.cosmos:
        targets["cosmos"] = args.cosmos
    if args.firestore:
        targets["firestore"] = args.firestore
    print("anchors (DESIGN.md §6):")
    for what, figure in ANCHORS.items():
        print(f"  {what:<36} {figure}")
    for name, url in targets.items():
        print(f"\n{name}: {StoreURL.parse(url)}")
        for label, value in asyncio.run(run_backend(name, url, args.quick)):
            print(f"  {label:<52} {value}")


if __name__ == "__main__":
    main()
