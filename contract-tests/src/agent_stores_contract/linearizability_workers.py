"""Subprocess entry point of the multi-process linearizability workload.

``python -m agent_stores_contract.linearizability_workers URL SCOPE SEED PREFIX TASKS OPS COMMIT``
opens a client of URL, prints ``ready``, waits for one line on stdin (so every process
starts at the same moment), runs TASKS concurrent workers named ``PREFIX0``… of OPS
operations each on SCOPE (with commits when COMMIT is ``1``), and prints every recorded
operation as one JSON line (:meth:`~agent_stores_contract.linearizability.Op.to_json`).
"""

from __future__ import annotations

import asyncio
import json
import sys

from agent_stores import open_kv

from .linearizability import History, run_workload


async def run(
    url: str, scope: str, seed: str, prefix: str, tasks: str, ops: str, commit: str
) -> None:
    """Run this process's share of the workload once stdin says go; print its history."""
    kv = open_kv(url)
    history = History()
    try:
        await kv.get(scope, "k0")  # connect before the start line
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await run_workload(
            [kv],
            scope,
            history,
            tasks=int(tasks),
            ops=int(ops),
            seed=seed,
            prefix=prefix,
            use_commit=commit == "1",
        )
    finally:
        await kv.aclose()
    for op in history.ops:
        print(json.dumps(op.to_json()), flush=True)


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments and run."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 7:
        raise SystemExit(
            "usage: python -m agent_stores_contract.linearizability_workers "
            "URL SCOPE SEED PREFIX TASKS OPS COMMIT"
        )
    asyncio.run(run(*args))


if __name__ == "__main__":
    main()
