"""Generated sections of the documentation pages the benchmarks write."""

from __future__ import annotations

from pathlib import Path


def replace_section(page: Path, start: str, end: str, text: str) -> None:
    """Replace what lies between the markers ``start`` and ``end`` of ``page`` by ``text``."""
    content = page.read_text()
    before, found_start, rest = content.partition(start)
    _, found_end, after = rest.partition(end)
    if not (found_start and found_end):
        raise SystemExit(f"{page} has no {start} ... {end} section to replace")
    page.write_text(f"{before}{start}\n{text}\n{end}{after}")
