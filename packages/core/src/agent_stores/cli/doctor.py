"""``agent-stores doctor URL [--repair] [--json]``: find and quarantine damaged records."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..doctor import (
    DEFAULT_CONVERSATION_PREFIX,
    DEFAULT_MEMORY_PREFIX,
    DEFAULT_RUNS_PREFIX,
    DEFAULT_SESSION_PREFIX,
    Report,
    scan,
)
from ..selection import open_kv
from ..url import StoreURL
from .common import resolve_url, run_async, url_argument


@click.command()
@url_argument()
@click.option("--repair", is_flag=True, help="Quarantine damaged records (raw bytes kept).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--store",
    "stores",
    type=click.Choice(["sessions", "memory", "runs", "conversations"]),
    multiple=True,
    help="Only these stores (repeatable; default: all four).",
)
@click.option("--sessions-prefix", default=DEFAULT_SESSION_PREFIX, show_default=True)
@click.option("--memory-prefix", default=DEFAULT_MEMORY_PREFIX, show_default=True)
@click.option("--runs-prefix", default=DEFAULT_RUNS_PREFIX, show_default=True)
@click.option("--conversations-prefix", default=DEFAULT_CONVERSATION_PREFIX, show_default=True)
@run_async
async def doctor(
    url: str | None,
    repair: bool,
    as_json: bool,
    stores: tuple[str, ...],
    sessions_prefix: str,
    memory_prefix: str,
    runs_prefix: str,
    conversations_prefix: str,
) -> None:
    """Scan sessions, memory, runs and conversations at URL for records that cannot be used.

    Lists undecodable records, missing or damaged chunks and dangling index entries.
    With --repair each damaged record is copied (raw bytes and origin) into the
    quarantine scope, then removed; nothing healthy is touched. Exit status 1 when
    damage remains.
    """
    target = resolve_url(url)
    kv = open_kv(target)
    try:
        await kv.setup()
        if not as_json:
            click.echo(f"examining {StoreURL.parse(target).render()}")
        bars: list[Any] = []

        def progress(store: str, scope: str, index: int, total: int) -> None:
            if as_json:
                return
            if not bars:
                bar = click.progressbar(length=total, label="scopes", file=sys.stderr)
                bars.append(bar.__enter__())
            bars[0].update(1)

        try:
            report = await scan(
                kv,
                repair=repair,
                session_prefix=sessions_prefix,
                memory_prefix=memory_prefix,
                runs_prefix=runs_prefix,
                conversation_prefix=conversations_prefix,
                stores=stores or ("sessions", "memory", "runs", "conversations"),
                progress=progress,
            )
        finally:
            if bars:
                bars[0].__exit__(None, None, None)
    finally:
        await kv.aclose()
    if as_json:
        click.echo(report.to_json())
    else:
        _print(report)
    if not report.healthy:
        raise SystemExit(1)


def _print(report: Report) -> None:
    scanned = ", ".join(f"{n} {store}" for store, n in report.scanned.items())
    click.echo(f"scanned {scanned} scope(s)")
    for finding in report.findings:
        state = "repaired" if finding.repaired else ("NOT repaired" if report.repaired else "")
        click.secho(
            f"  {finding.store} {finding.kind}: {finding.scope}/{finding.key}: {finding.detail}",
            fg="green" if finding.repaired else "red",
        )
        if report.repaired:
            click.echo(f"    {state}; quarantined as {', '.join(finding.quarantined_as) or '-'}")
        else:
            click.echo(f"    --repair would {finding.repair}")
    if not report.findings:
        click.secho("  no damaged records", fg="green")
    elif not report.repaired:
        click.echo(f"{len(report.findings)} damaged record(s); run again with --repair")
