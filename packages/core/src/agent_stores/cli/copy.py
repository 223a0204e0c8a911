"""``agent-stores copy SRC DST``: move sessions, memory and runs to another backend."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from ..transfer import KINDS, Layout, Progress, Redactor, Transfer, TransferReport, summary_rows
from ..transfer import parse_kinds as _parse_kinds
from ..url import StoreURL
from .common import run_async

if TYPE_CHECKING:
    from rich.console import Console

_COLUMNS = (
    ("kind", "kind"),
    ("units", "units"),
    ("records", "records"),
    ("bytes", "bytes"),
    ("created", "created"),
    ("updated", "updated"),
    ("identical", "identical"),
    ("rechunked", "re-chunked"),
    ("busy", "busy"),
    ("failed", "failed"),
)
_VERIFY_COLUMNS = (
    ("kind", "kind"),
    ("units", "units"),
    ("records", "records"),
    ("identical", "equal"),
    ("mismatches", "differ/missing"),
    ("only_in_destination", "only in destination"),
    ("failed", "failed"),
)


@click.command()
@click.argument("src", metavar="SRC_URL")
@click.argument("dst", metavar="DST_URL")
@click.option(
    "--only",
    "only",
    multiple=True,
    metavar="KINDS",
    help=f"Copy only these kinds (comma-separated or repeated): {', '.join(KINDS)}.",
)
@click.option("--dry-run", is_flag=True, help="Count what would be copied; write nothing.")
@click.option("--verify", is_flag=True, help="Afterwards compare both sides record by record.")
@click.option(
    "--jobs", default=8, show_default=True, type=click.IntRange(1, 256), help="Units in parallel."
)
@click.option(
    "--busy-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds to keep retrying sessions held by a running turn.",
)
@click.option("--sessions-prefix", default="session:", show_default=True, help="Scope prefix.")
@click.option("--memory-prefix", default="memory:", show_default=True, help="Scope prefix.")
@click.option("--runs-namespace", default="cp", show_default=True, help="Checkpointer namespace.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@run_async
async def copy(
    src: str,
    dst: str,
    only: tuple[str, ...],
    dry_run: bool,
    verify: bool,
    jobs: int,
    busy_timeout: float,
    sessions_prefix: str,
    memory_prefix: str,
    runs_namespace: str,
    as_json: bool,
    quiet: bool,
) -> None:
    """Copy sessions, memory and runs from SRC_URL to DST_URL (resumable).

    Safe while SRC is in use: a session under an active turn is retried, then reported.
    A rerun skips what the destination already holds unchanged; nothing that was there
    before is deleted. Records larger than DST holds are re-chunked to its limit; one that
    cannot be split fails its unit (listed by --dry-run), and a failed unit leaves nothing
    behind in DST.
    """
    from rich.console import Console

    from ..connection import connect

    redact = Redactor([src, dst])
    try:
        kinds = _parse_kinds(only)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None
    console = Console(stderr=True, highlight=False)
    out = Console(highlight=False)
    src_conn = connect(src)
    dst_conn = connect(dst)
    try:
        src_sessions = (
            _source_sessions(src_conn, sessions_prefix, console) if "sessions" in kinds else None
        )
        if not dry_run:
            await dst_conn.kv.setup()
        bars = _Bars(console, enabled=not quiet and not as_json)
        transfer = Transfer(
            src_conn.kv,
            dst_conn.kv,
            kinds=kinds,
            layout=Layout(sessions_prefix, memory_prefix, runs_namespace),
            src_sessions=src_sessions,
            jobs=jobs,
            busy_timeout=busy_timeout,
            progress=bars.advance,
            describe_error=redact,
        )
        plan = await transfer.plan()
        what = "counting" if dry_run else "copying"
        if not as_json:
            console.print(
                redact(
                    f"{what} {', '.join(kinds)} from {StoreURL.parse(src).render()} "
                    f"to {StoreURL.parse(dst).render()}"
                ),
                markup=False,
            )
        with bars.run(plan, "would copy" if dry_run else "copy"):
            report = await transfer.copy(dry_run=dry_run, plan=plan)
        checked: TransferReport | None = None
        if verify:
            with bars.run(plan, "verify"):
                checked = await transfer.verify(plan=plan)
    finally:
        await src_conn.aclose()
        await dst_conn.aclose()
    if as_json:
        out.print_json(redact(json.dumps(_summary_doc(src, dst, dry_run, report, checked))))
    else:
        _print_summary(out, redact, dry_run, report, checked)
    if not report.ok or (checked is not None and not checked.ok):
        raise SystemExit(1)


def _source_sessions(conn: Any, prefix: str, console: Console) -> Any:
    """The source's session store (lease checks while copying), or None without the harness."""
    try:
        return conn.sessions(scope_prefix=prefix)
    except ImportError:
        console.print(
            "[yellow]sessions are copied without lease checks: the session store "
            "needs agent-stores[harness][/]"
        )
        return None


def _summary_doc(
    src: str, dst: str, dry_run: bool, report: TransferReport, checked: TransferReport | None
) -> dict[str, Any]:
    """The ``--json`` summary."""
    doc: dict[str, Any] = {
        "source": StoreURL.parse(src).render(),
        "destination": StoreURL.parse(dst).render(),
        "dry_run": dry_run,
        "seconds": round(report.seconds, 3),
        "kinds": summary_rows(report),
        "busy": {k: s.busy for k, s in report.kinds.items() if s.busy},
        "failed": {k: s.failed for k, s in report.kinds.items() if s.failed},
        "too_large": {
            k: [t.as_dict() for t in s.too_large] for k, s in report.kinds.items() if s.too_large
        },
    }
    if checked is not None:
        doc["verify"] = {
            "kinds": summary_rows(checked),
            "mismatches": {k: s.mismatches for k, s in checked.kinds.items() if s.mismatches},
            "ok": checked.ok,
        }
    return doc


def _print_summary(
    out: Console,
    redact: Redactor,
    dry_run: bool,
    report: TransferReport,
    checked: TransferReport | None,
) -> None:
    """The tables printed without ``--json``."""
    title = "dry run (nothing written)" if dry_run else f"copied in {report.seconds:.1f}s"
    _table(out, title, report, _COLUMNS)
    _problems(out, report, redact)
    if checked is not None:
        verdict = "equal" if checked.ok else "DIFFERENT"
        _table(out, f"verify: {verdict}", checked, _VERIFY_COLUMNS)
        _problems(out, checked, redact)


class _Bars:
    """A rich progress bar per kind: units done of the plan, records and their rate."""

    def __init__(self, console: Console, *, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}
        self._records: dict[str, int] = {}
        self._started = time.monotonic()

    def run(self, plan: dict[str, list[str]], verb: str) -> Any:
        from contextlib import nullcontext

        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichProgress

        if not self.enabled:
            self._progress = None
            return nullcontext()
        self._progress = RichProgress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[records]} records, {task.fields[rate]}/s"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._tasks = {
            kind: self._progress.add_task(f"{verb} {kind}", total=len(scopes), records=0, rate=0)
            for kind, scopes in plan.items()
        }
        self._records = dict.fromkeys(plan, 0)
        self._started = time.monotonic()
        return self._progress

    def advance(self, event: Progress) -> None:
        if self._progress is None:
            return
        self._records[event.kind] = self._records.get(event.kind, 0) + event.records
        elapsed = max(time.monotonic() - self._started, 1e-6)
        total = sum(self._records.values())
        self._progress.update(
            self._tasks[event.kind],
            advance=1,
            records=self._records[event.kind],
            rate=int(total / elapsed),
        )


def _table(
    out: Console, title: str, report: TransferReport, columns: tuple[tuple[str, str], ...]
) -> None:
    from rich.table import Table

    table = Table(title=title)
    for _, header in columns:
        table.add_column(header, justify="left" if header == "kind" else "right")
    for row in summary_rows(report):
        table.add_row(*(str(row[key]) for key, _ in columns))
    out.print(table)


def _problems(out: Console, report: TransferReport, redact: Redactor) -> None:
    from rich.markup import escape

    def safe(text: str) -> str:
        return escape(redact(text))

    for kind, stats in report.kinds.items():
        for t in stats.too_large:
            out.print(
                f"[red]too large[/] {kind} {safe(t.scope)} {safe(t.key)}: {t.size} bytes, "
                f"the destination holds {t.limit} ({safe(t.reason)})"
            )
        for scope in stats.busy:
            out.print(f"[yellow]busy[/] {kind} {safe(scope)}: in use for the whole wait; run again")
        for scope, error in stats.failed:
            out.print(f"[red]failed[/] {kind} {safe(scope)}: {safe(error)}")
        for scope, key, why in stats.mismatches[:50]:
            out.print(f"[red]differs[/] {kind} {safe(scope)} {safe(key)}: {why}")
        if len(stats.mismatches) > 50:
            out.print(f"… and {len(stats.mismatches) - 50} more {kind} differences")
