"""Generated sections of the documentation pages the benchmarks write."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def load_line() -> str:
    """The machine's load when a table was measured (it belongs under every table)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPU(s)"


def replace_section(page: Path, start: str, end: str, text: str) -> None:
    """Replace what lies between the markers ``start`` and ``end`` of ``page`` by ``text``."""
    content = page.read_text()
    before, found_start, rest = content.partition(start)
    _, found_end, after = rest.partition(end)
    if not (found_start and found_end):
        raise SystemExit(f"{page} has no {start} ... {end} section to replace")
    page.write_text(f"{before}{start}\n{text}\n{end}{after}")


def replace_or_add_section(page: Path, heading: str, start: str, end: str, text: str) -> None:
    """:func:`replace_section`, first adding the markers under ``## heading`` at the end of
    ``page`` when it has none (``side_by_side.py`` rewrites the page whole)."""
    if start not in page.read_text():
        page.write_text(page.read_text().rstrip("\n") + f"\n\n## {heading}\n\n{start}\n{end}\n")
    replace_section(page, start, end, text)


def capped_notes(
    caps: Mapping[str, tuple[int, str]], measured: Mapping[str, Mapping[int, object]], unit: str
) -> list[str]:
    """One paragraph per row a backend's test server could not be measured at, saying why.

    ``caps``: backend -> (largest size measured, why); ``measured``: backend -> size -> row.
    """
    sizes = sorted({n for rows in measured.values() for n in rows})
    return [
        f"\nThe {name} row at {n:,} {unit} is not measured: {why}."
        for name, (cap, why) in caps.items()
        for n in sizes
        if name in measured and n > cap and n not in measured[name]
    ]
