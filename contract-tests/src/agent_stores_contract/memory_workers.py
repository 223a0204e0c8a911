"""Subprocess entry points used by the multi-process memory contract tests.

``python -m agent_stores_contract.memory_workers append URL PREFIX PATH TAG N`` opens a
memory store, prints ``ready``, waits for one line on stdin (so every process starts at
the same moment), then runs N concurrent appends of ``TAG-i``, each at a random
moment of the race window.

``python -m agent_stores_contract.memory_workers semantic-append URL PREFIX PATH TAG N``
does the same on a store searching by meaning (the contract's concept embedder), and
waits for its indexing before it exits.

``python -m agent_stores_contract.memory_workers crash-write URL PREFIX PATH SIZE K OP RECORD_BYTES``
writes ``crash_content(SIZE)`` to PATH with operation ``op-OP`` and is SIGKILLed by its
own KV client right before the (K+1)-th KV write.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from agent_stores import open_kv
from agent_stores.memory import KVMemoryStore

from .memory import FaultKV, append_within_race_window, crash_content, op


async def append_lines(
    url: str, prefix: str, path: str, tag: str, count: str, semantic: bool = False
) -> None:
    """Append ``tag-0`` … ``tag-(count-1)`` concurrently once stdin says go."""
    kv = open_kv(url)
    try:
        await kv.setup()
        search = None
        if semantic:
            from agent_stores.memory import SearchConfig

            from .embedding import ConceptEmbeddingModel

            search = SearchConfig(mode="semantic", embedder=ConceptEmbeddingModel())
        store = KVMemoryStore(kv, scope_prefix=prefix, search=search)
        await store.list_paths(path, limit=1)  # connect before the start line
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        await asyncio.gather(
            *(append_within_race_window(store, path, f"{tag}-{i}") for i in range(int(count)))
        )
        await store.wait_indexed()
    finally:
        await kv.aclose()


async def crash_write(
    url: str,
    prefix: str,
    path: str,
    size: str,
    crash_after: str,
    name: str,
    record_bytes: str,
    store_path: str = "native",
) -> None:
    """Start a chunked write with an operation and die (SIGKILL) after ``crash_after`` KV
    writes (a native port call counts as one), on the backend's ports or the generic ones."""
    kv = open_kv(url)
    await kv.setup()
    native = store_path == "native"
    faulty = FaultKV(kv, crash_after=int(crash_after), kill_process=True, native_ports=native)
    store = KVMemoryStore(faulty, scope_prefix=prefix, max_record_bytes=int(record_bytes))
    await store.write(path, crash_content(int(size)), expected_version=None, operation=op(name))
    await kv.aclose()


async def semantic_append_lines(url: str, prefix: str, path: str, tag: str, count: str) -> None:
    """:func:`append_lines` on a store that indexes every version it writes."""
    await append_lines(url, prefix, path, tag, count, semantic=True)


WORKERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "append": append_lines,
    "semantic-append": semantic_append_lines,
    "crash-write": crash_write,
}


def main(argv: list[str] | None = None) -> None:
    """Run the worker named by the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in WORKERS:
        raise SystemExit(
            f"usage: python -m agent_stores_contract.memory_workers {{{','.join(WORKERS)}}} ARGS..."
        )
    asyncio.run(WORKERS[args[0]](*args[1:]))


if __name__ == "__main__":
    main()
