"""Forking a session with 10 and with 10,000 messages: time, bytes written, requests.

Usage: ``python benchmarks/forks.py [--quick] [--markdown docs/benchmarks.md]``, with the
servers' URLs in ``AGENT_STORES_BENCH_<NAME>`` (``nox -s bench`` sets them); SQLite always
runs.

For each backend and history length H a session is given H messages through the session
store under a fresh prefix (one turn), then forked whole (``SessionStore.fork``, the
default: the committed history) into new sessions several times. Bytes written are the
fork's own report (its state record and pins; no history chunk is copied); requests are
counted where the client sends them, as in ``catalog.py``. "Flat" means neither grows
with H.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from agent_stores import connect
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

try:  # run as a script (python benchmarks/forks.py) or imported as a module
    from catalog import (  # type: ignore[import-not-found,unused-ignore]
        Target,
        backend_urls,
        drop_everything,
    )
    from pages import load_line, replace_or_add_section  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - imported from the repository root
    from benchmarks.catalog import Target, backend_urls, drop_everything
    from benchmarks.pages import load_line, replace_or_add_section

START, END = "<!-- forks:start -->", "<!-- forks:end -->"
SIZES = (10, 10_000)


def history(messages: int) -> list[ModelRequest | ModelResponse]:
    out: list[ModelRequest | ModelResponse] = []
    for i in range(messages // 2):
        out.append(ModelRequest(parts=[UserPromptPart(content=f"question {i} " + "q" * 60)]))
        out.append(ModelResponse(parts=[TextPart(content=f"answer {i} " + "a" * 60)]))
    return out


async def measure(target: Target, size: int, forks: int) -> dict[str, float]:
    kv = await target.open()
    store = connect(kv).sessions(owns_kv=True, scope_prefix="bench-fork:")
    try:
        await kv.setup()
        source = f"src-{size}"
        async with store.turn(source, timeout_seconds=60) as session:
            session.replace(history(size))
        await store.storage.drain()
        n = 0

        async def one() -> object:
            nonlocal n
            n += 1
            return await store.fork(source, f"fork-{size}-{n}")

        requests = await target.count(one)
        times, written, shared = [], [], []
        for _ in range(forks):
            started = time.perf_counter()
            report = await one()
            times.append(time.perf_counter() - started)
            written.append(report.bytes_written)  # type: ignore[attr-defined]
            shared.append(report.shared_chunks)  # type: ignore[attr-defined]
        got = await store.read_messages(f"fork-{size}-{n}")
        assert got is not None and len(got) == size, (size, None if got is None else len(got))
        return {
            "ms": statistics.median(times) * 1000,
            "bytes": statistics.median(written),
            "requests": requests,
            "shared": statistics.median(shared),
        }
    finally:
        await store.aclose()


async def measure_all(target: Target, forks: int) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    try:
        for size in SIZES:
            rows[size] = await measure(target, size, forks)
            print(f"{target.name} {size}: {rows[size]}", flush=True)
    finally:
        await drop_everything(target)
    return rows


def table(results: dict[str, dict[int, dict[str, float]]], forks: int) -> str:
    head = " | ".join(f"{n:,} messages: ms, bytes written, requests" for n in SIZES)
    lines = [
        "Forking a session whole (`SessionStore.fork`) at two history lengths: median wall "
        f"time and bytes the fork wrote over {forks} forks, and the requests of one fork "
        "counted at the client (redis-py's command packing; the cloud SDKs' transport; KV "
        "calls on SQLite and PostgreSQL). The fork refers to the source's history chunks "
        "(the last column of each size: chunks shared) instead of copying them:",
        "",
        f"| backend | {head} | chunks shared at {SIZES[-1]:,} |",
        "|---|" + "---|" * (len(SIZES) + 1),
    ]
    for name, rows in results.items():
        cells = [
            f"{rows[n]['ms']:.1f}, {rows[n]['bytes']:,.0f}, {rows[n]['requests']:.0f}"
            if n in rows
            else "not measured"
            for n in SIZES
        ]
        last = rows.get(SIZES[-1])
        shared = f"{last['shared']:.0f}" if last else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {shared} |")
    lines += [
        "",
        "A fork reads the source's state, writes one pin per scope it shares chunks from, "
        "reads the source's state again and creates its own state record: the same requests "
        "and about the same bytes at any length (the state record holds the chunk list, "
        "which grows with the logarithm of the history, and the inline tail). Forking at an "
        "earlier turn (`at_turn=`) also decodes the history to find the turn and writes "
        "the messages of the one chunk the cut falls in (docs/forks.md). The time follows "
        "the requests: six round trips to the backend, whatever the history's length (on "
        "SQLite since its table became a rowid table: before, each of the six statements "
        "took over a millisecond beside a 10,000-message history, docs/embedded.md).",
        "",
        f"_{load_line()}; `python benchmarks/forks.py`._",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 forks per size")
    parser.add_argument("--markdown", type=Path, help="replace the table in this page")
    parser.add_argument("--only", nargs="*", default=None, help="only these backends")
    args = parser.parse_args()
    forks = 3 if args.quick else 15
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, url in backend_urls(tmp, "forks.db").items():
            if args.only and name not in args.only:
                continue
            results[name] = asyncio.run(measure_all(Target(name, url), forks))
    print(table(results, forks))
    if args.markdown:
        heading = "Forking a session (copy-on-write)"
        replace_or_add_section(args.markdown, heading, START, END, table(results, forks))


if __name__ == "__main__":
    main()
