"""Each store operation's latency behind a proxy that delays every byte 20 ms each way.

Usage: ``python benchmarks/latency.py [--delay 0.02] [--samples 20] [--markdown FILE]``, with
the servers' URLs in ``AGENT_STORES_BENCH_REDIS`` / ``_POSTGRES`` / ``_DYNAMODB`` /
``_COSMOS`` / ``_FIRESTORE`` (``nox -s bench`` sets them).

On a real network an operation costs about its sequential round trips times the round
trip time, plus the client's own work. Each backend's server is put behind
``benchmarks/proxy.py`` (latency, not bandwidth: every chunk is delivered ``delay`` later,
without holding the next), the operations of
:mod:`agent_stores_contract.request_counts` run through it, and each row gives p50 and
p99 of ``--samples`` runs, the requests the proxy saw (a client's burst on one connection
counts once), and the bound ``requests x 2 x delay + 10 ms`` the p50 must stay within.
SQLite and ``memory://`` have no network; Redis Cluster is left out (its clients follow
the nodes' own addresses, around the proxy).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from agent_stores import KVStore, StoreURL, open_kv
from agent_stores_contract import proxying
from agent_stores_contract.request_counts import OPERATIONS, Meter, Operations, prepare_backend

try:  # run as a script (python benchmarks/latency.py) or imported as benchmarks.latency
    from pages import load_line, replace_section  # type: ignore[import-not-found,unused-ignore]
    from proxy import DelayProxy  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - imported from the repository root
    from benchmarks.pages import load_line, replace_section
    from benchmarks.proxy import DelayProxy

BACKENDS = ("redis", "postgres", "dynamodb", "cosmos", "firestore")
#: What a p50 may take beyond its round trips: the client's and the server's own work.
EPSILON_SECONDS = 0.010
#: the generated table's place in the page (docs/requests.md)
START, END = "<!-- latency:start -->", "<!-- latency:end -->"


@dataclass
class Row:
    """One operation on one backend: its timings behind the proxy and without delay, and
    the requests it sent."""

    seconds: list[float]
    requests: list[int]
    delay: float
    local_seconds: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.seconds)

    @property
    def p99(self) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    @property
    def local_p50(self) -> float:
        """The p50 through the proxy at no delay: the client's and the server's own time."""
        return statistics.median(self.local_seconds)

    @property
    def typical_requests(self) -> int:
        return round(statistics.median(self.requests))

    @property
    def network(self) -> float:
        """What the delay added to the p50: the round trips the operation waited for."""
        return self.typical_requests * 2 * self.delay

    @property
    def bound(self) -> float:
        return self.network + EPSILON_SECONDS

    @property
    def within(self) -> bool:
        return self.p50 <= self.bound

    @property
    def delay_within(self) -> bool:
        """The delay added no more than the requests' round trips (+ epsilon): no hidden
        sequential request, whatever the server's own speed."""
        return self.p50 - self.local_p50 <= self.bound


def server_address(url: str) -> tuple[str, int]:
    """Host and port of the server a backend URL names (see agent_stores_contract.proxying)."""
    parsed = StoreURL.parse(url)
    address = proxying.server_address(parsed)
    if address is None:
        raise SystemExit(f"{parsed.scheme}: no server address to put a proxy in front of")
    return address


def through(url: str, port: int) -> str:
    """The same URL reaching its server through the proxy (see agent_stores_contract.proxying)."""
    parsed = StoreURL.parse(url)
    proxied = proxying.through_proxy(parsed, "127.0.0.1", port)
    if proxied is None:
        raise SystemExit(f"{parsed.scheme}: cannot be reached through a TCP proxy")
    return proxied


async def timings(url: str, delay: float, samples: int) -> dict[str, tuple[list[float], list[int]]]:
    """operation -> (seconds, requests) of ``samples`` runs behind a ``delay`` proxy.

    Requests are counted at the SDK transport where the backend's fault injector counts
    them (the cloud backends: a gRPC or HTTP/2 client's acknowledgements are no request);
    elsewhere they are the proxy's round trips (a burst of pipelined commands is one).
    """
    host, port = server_address(url)
    async with DelayProxy(host, port, delay) as proxy:
        proxied = through(url, proxy.port)
        try:
            meter: Meter | None = Meter(proxied)
        except TypeError:
            meter = None

        async def client() -> KVStore:
            return await meter.client() if meter is not None else open_kv(proxied)

        found: dict[str, tuple[list[float], list[int]]] = {}
        async with Operations(client, f"lat-{uuid.uuid4().hex[:8]}:") as ops:
            for operation in OPERATIONS:
                await ops.prepare(operation)
                await ops.run(operation)  # warm: connections open, metadata cached
                seconds, requests = found[operation] = ([], [])
                for _ in range(samples):
                    await ops.prepare(operation)
                    proxy.stats.reset()
                    if meter is not None:
                        meter.counter.requests(reset=True)
                    started = time.perf_counter()
                    await ops.run(operation)
                    seconds.append(time.perf_counter() - started)
                    counted = sum(meter.counter.requests().values()) if meter else 0
                    requests.append(counted or proxy.stats.round_trips)
    return found


async def measure(url: str, delay: float, samples: int) -> dict[str, Row]:
    """operation -> its row, on one backend: a pass without delay, then one with."""
    await prepare_backend(url)
    local = await timings(url, 0.0, samples)
    delayed = await timings(url, delay, samples)
    return {
        operation: Row(seconds, requests, delay, local[operation][0])
        for operation, (seconds, requests) in delayed.items()
    }


def table(results: dict[str, dict[str, Row]]) -> str:
    names = list(results)
    lines = [
        "| operation | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for operation in OPERATIONS:
        cells = []
        for name in names:
            row = results[name][operation]
            mark = "" if row.within else (" (over)" if row.delay_within else " **over**")
            cells.append(
                f"{row.p50 * 1000:.0f} / {row.p99 * 1000:.0f} ms; {row.typical_requests} req; "
                f"no delay {row.local_p50 * 1000:.0f} ms; bound {row.bound * 1000:.0f}{mark}"
            )
        lines.append(f"| {operation} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delay", type=float, default=0.020, help="seconds each way")
    parser.add_argument("--samples", type=int, default=20, help="timed runs per operation")
    parser.add_argument("--markdown", type=Path, help="replace the table in this page")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    print(f"latency behind a {args.delay * 1000:.0f} ms-each-way proxy; {load_line()}")
    results: dict[str, dict[str, Row]] = {}
    for name in BACKENDS:
        url = os.environ.get(f"AGENT_STORES_BENCH_{name.upper()}")
        if not url:
            print(f"{name}: AGENT_STORES_BENCH_{name.upper()} not set, skipped", file=sys.stderr)
            continue
        results[name] = asyncio.run(measure(url, args.delay, args.samples))
    if not results:
        raise SystemExit("no backend URL given")
    over = [
        f"{name}: {op}"
        for name, rows in results.items()
        for op, row in rows.items()
        if not row.within
    ]
    hidden = [
        f"{name}: {op}"
        for name, rows in results.items()
        for op, row in rows.items()
        if not row.delay_within
    ]
    text = table(results)
    print(
        f"\np50 / p99 per operation behind the proxy; requests; p50 with no delay; bound = "
        f"requests x {2 * args.delay * 1000:.0f} ms + {EPSILON_SECONDS * 1000:.0f} ms\n"
    )
    print(text)
    print(f"\n{load_line()}")
    print(f"p50 over the bound: {', '.join(over) or 'none'}")
    print(f"delay added beyond the requests' round trips + epsilon: {', '.join(hidden) or 'none'}")
    if args.markdown:
        stamp = f"_{args.samples} samples per operation; {load_line()}._"
        replace_section(args.markdown, START, END, f"{text}\n\n{stamp}")


if __name__ == "__main__":
    main()
