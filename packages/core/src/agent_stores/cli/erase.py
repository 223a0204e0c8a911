"""``agent-stores erase [URL] --subject S``: erase a subject everywhere and verify."""

from __future__ import annotations

import json

import click

from ..url import StoreURL
from .common import resolve_url, run_async, url_argument


@click.command()
@url_argument()
@click.option("--subject", required=True, help="The subject (owner) id to erase.")
@click.option(
    "--memory-prefix",
    "memory_prefixes",
    multiple=True,
    help="Scope prefix of a memory store to erase from (repeatable; default: every "
    "prefix recorded for the subject).",
)
@click.option(
    "--runs-prefix",
    default=None,
    help="Scope prefix of the checkpointer (default: the checkpointer's, cp/).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (keep it).")
@run_async
async def erase(
    url: str | None,
    subject: str,
    memory_prefixes: tuple[str, ...],
    runs_prefix: str | None,
    as_json: bool,
) -> None:
    """Erase every session, memory namespace, run and quarantined copy of a subject.

    Writes of the subject are refused while it runs. Run it again after an interruption:
    it resumes; a second erase finds nothing. Ends with a verification report (every
    scope read back); exits 1 when entries are left. Backups, replicas and logs the
    database keeps are not touched (docs/subjects.md).
    """
    from ..connection import connect

    target = resolve_url(url)
    async with connect(target) as connection:
        report = await connection.erase_subject(
            subject,
            memory_scope_prefixes=list(memory_prefixes) or None,
            checkpointer_options={"scope_prefix": runs_prefix} if runs_prefix else None,
        )
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        resumed = " (resumed an unfinished erase)" if report.resumed else ""
        click.echo(f"erased subject {subject!r} from {StoreURL.parse(target).render()}{resumed}")
        click.echo(f"  sessions:   {len(report.sessions)}")
        click.echo(f"  conversations: {len(report.conversations)}")
        click.echo(f"  namespaces: {', '.join(report.namespaces) or '-'}")
        click.echo(f"  runs:       {len(report.runs)}")
        click.echo(f"  quarantined copies: {report.quarantined}")
        for missing in report.not_erased:
            click.echo(f"  not erased (no store given for it): {missing}")
        click.echo(
            f"verified: {report.scopes_checked} scopes read back, "
            f"{report.entries_left} entries left"
        )
    if not report.complete:
        raise SystemExit(1)
