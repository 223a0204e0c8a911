"""The requests each store operation sends on the cloud backends, counted at the SDK transport.

Usage: ``python benchmarks/request_counts.py [--markdown FILE]``, with the servers' URLs in
``AGENT_STORES_BENCH_DYNAMODB`` / ``_COSMOS`` / ``_FIRESTORE`` (``nox -s bench`` sets them).
How they are counted: :mod:`agent_stores_contract.request_counts`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from agent_stores_contract.request_counts import measure, table

try:  # run as a script (python benchmarks/request_counts.py) or imported as a module
    from pages import replace_section  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - imported from the repository root
    from benchmarks.pages import replace_section

BACKENDS = ("dynamodb", "cosmos", "firestore")
#: the generated table's place in the page (docs/requests.md)
START, END = "<!-- request-counts:start -->", "<!-- request-counts:end -->"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--markdown", type=Path, help="replace the table in this page (docs/requests.md)"
    )
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, int]]] = {}
    for name in BACKENDS:
        url = os.environ.get(f"AGENT_STORES_BENCH_{name.upper()}")
        if not url:
            print(f"{name}: AGENT_STORES_BENCH_{name.upper()} not set, skipped", file=sys.stderr)
            continue
        results[name] = asyncio.run(measure(url))
    if not results:
        raise SystemExit("no cloud backend URL given")
    print("\nrequests per operation, counted at the SDK transport (steady state)\n")
    print(table(results))
    if args.markdown:
        replace_section(args.markdown, START, END, table(results))


if __name__ == "__main__":
    main()
