"""Subprocess entry points used by the multi-process contract tests.

``python -m agent_stores_contract.workers kv-increment URL SCOPE KEY N`` performs N
compare-and-swap increments of a counter and prints one JSON line per won swap:
``{"replaced": <expected version>, "version": <new version>, "value": <new value>}``.
Other store contracts add their own workers to this table.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from agent_stores import ConflictError, open_kv


async def kv_increment(url: str, scope: str, key: str, count: str) -> None:
    """CAS-increment ``(scope, key)`` ``count`` times, retrying on conflict."""
    kv = open_kv(url)
    try:
        done = 0
        while done < int(count):
            entry = await kv.get(scope, key)
            if entry is None:
                raise SystemExit(f"counter {scope}/{key} missing")
            value = int(entry.value) + 1
            try:
                version = await kv.replace(
                    scope, key, str(value).encode(), expected_version=entry.version
                )
            except ConflictError:
                await asyncio.sleep(random.random() * 0.002)
                continue
            print(
                json.dumps({"replaced": entry.version, "version": version, "value": value}),
                flush=True,
            )
            done += 1
    finally:
        await kv.aclose()


WORKERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "kv-increment": kv_increment,
}


def main(argv: list[str] | None = None) -> None:
    """Run the worker named by the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in WORKERS:
        raise SystemExit(
            f"usage: python -m agent_stores_contract.workers {{{','.join(WORKERS)}}} ARGS..."
        )
    asyncio.run(WORKERS[args[0]](*args[1:]))


if __name__ == "__main__":
    main()
