"""Subprocess entry points used by the multi-process contract tests.

``python -m agent_stores_contract.workers kv-increment URL SCOPE KEY N [--barrier DIR K]``
performs N compare-and-swap increments of a counter and prints one JSON line per won swap:
``{"replaced": <expected version>, "version": <new version>, "value": <new value>}``;
``kv-create URL SCOPE KEY [--barrier DIR K]`` races to create one key.
Other store contracts add their own workers to this table.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from agent_stores import ConflictError, open_kv

#: How long a worker waits at the barrier for the others. Generous: on a loaded machine
#: starting a Python process with its imports can take tens of seconds, and one worker
#: may arrive long before the last; the test's own bound still ends a real hang.
BARRIER_SECONDS = 240


def _arrive(folder: Path) -> None:
    (folder / f"ready-{os.getpid()}").touch()


def _arrived(folder: Path) -> int:
    return sum(1 for p in folder.iterdir() if p.name.startswith("ready-"))


async def file_barrier(directory: str, parties: str) -> None:
    """Wait until ``parties`` processes reached this point (each drops a file in ``directory``).

    Multi-process tests start their workers behind it, so the processes really run at
    the same time instead of one after another while the others are still starting.
    """
    _arrive(Path(directory))
    deadline = time.monotonic() + BARRIER_SECONDS
    while _arrived(Path(directory)) < int(parties):
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier in {directory}: not all {parties} processes arrived")
        await asyncio.sleep(0.005)


def barrier_args(args: tuple[str, ...]) -> tuple[list[str], tuple[str, str] | None]:
    """Split a trailing ``--barrier DIR PARTIES`` off a worker's arguments."""
    rest = list(args)
    if "--barrier" in rest:
        index = rest.index("--barrier")
        directory, parties = rest[index + 1], rest[index + 2]
        del rest[index : index + 3]
        return rest, (directory, parties)
    return rest, None


async def kv_increment(*raw: str) -> None:
    """``URL SCOPE KEY N [--barrier DIR PARTIES]``: CAS-increment a counter N times.

    The first read happens before the barrier, so every process starts from the same
    version and all but one must lose their first swap. Prints one JSON line per won
    swap and a last line ``{"conflicts": n}``.
    """
    (url, scope, key, count), barrier = barrier_args(raw)
    kv = open_kv(url)
    try:
        done = conflicts = 0
        first = True
        while done < int(count):
            entry = await kv.get(scope, key)
            if entry is None:
                raise SystemExit(f"counter {scope}/{key} missing")
            if first and barrier is not None:
                await file_barrier(*barrier)
            first = False
            value = int(entry.value) + 1
            try:
                version = await kv.replace(
                    scope, key, str(value).encode(), expected_version=entry.version
                )
            except ConflictError:
                conflicts += 1
                await asyncio.sleep(random.random() * 0.002)
                continue
            print(
                json.dumps({"replaced": entry.version, "version": version, "value": value}),
                flush=True,
            )
            done += 1
        print(json.dumps({"conflicts": conflicts}), flush=True)
    finally:
        await kv.aclose()


async def kv_create(*raw: str) -> None:
    """``URL SCOPE KEY [--barrier DIR PARTIES]``: try to create KEY (value: this pid) once.

    Prints ``{"pid": ..., "won": bool, "version": str | null}``.
    """
    (url, scope, key), barrier = barrier_args(raw)
    kv = open_kv(url)
    try:
        if await kv.get(scope, key) is not None:
            raise SystemExit(f"{scope}/{key} exists before the race")
        if barrier is not None:
            await file_barrier(*barrier)
        try:
            version: str | None = await kv.create(scope, key, str(os.getpid()).encode())
        except ConflictError:
            version = None
        print(json.dumps({"pid": os.getpid(), "won": version is not None, "version": version}))
    finally:
        await kv.aclose()


WORKERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "kv-increment": kv_increment,
    "kv-create": kv_create,
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
