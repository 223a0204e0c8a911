"""``agent-stores sessions URL list | show ID | reset ID | erase-owner OWNER | clear-recovery ID
| fork SOURCE NEW | rewind ID TURN | branches ID | restore ID BRANCH``."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import click

from ..sessions import SessionInfo, SessionStore, SessionSummary
from ..url import StoreURL
from .common import run_async, scope_prefix_option

DEFAULT_SCOPE_PREFIX = "session:"

#: (URL, scope prefix) given to the ``sessions`` group.
Target = tuple[str, str]


def _open(target: Target) -> SessionStore:
    from ..connection import open_sessions

    url, scope_prefix = target
    return open_sessions(url, scope_prefix=scope_prefix)


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _lease(info: SessionInfo, now: float) -> str:
    if info.lease_owner is None or info.lease_expires_at is None:
        return "free"
    return f"held by {info.lease_owner} ({info.lease_expires_at - now:.1f}s left)"


def _as_dict(info: SessionInfo) -> dict[str, Any]:
    return {
        "session_id": info.session_id,
        "message_count": info.message_count,
        "chunk_count": info.chunk_count,
        "stored_bytes": info.stored_bytes,
        "lease_owner": info.lease_owner,
        "lease_expires_at": info.lease_expires_at,
        "fence": info.fence,
        "pending_effects": [list(c) for c in info.pending_effects],
        "recovery_since": info.recovery_since,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "expires_at": info.expires_at,
        "problem": info.problem,
        "owner": info.owner,
        "title": info.title,
        "tags": list(info.tags),
        "forked_from": info.forked_from,
        "fork_point": info.fork_point,
        "usage": info.usage,
        "pending_deferred": [
            {"tool_name": name, "tool_call_id": call_id, "kind": kind}
            for name, call_id, kind in info.pending_deferred
        ],
    }


def _summary_dict(summary: SessionSummary) -> dict[str, Any]:
    return {
        "session_id": summary.session_id,
        "owner": summary.owner,
        "title": summary.title,
        "tags": list(summary.tags),
        "metadata": dict(summary.metadata),
        "created_at": summary.created_at,
        "last_activity_at": summary.last_activity_at,
        "message_count": summary.message_count,
        "preview": summary.preview,
    }


@click.group()
@click.argument("url", metavar="URL")
@scope_prefix_option(DEFAULT_SCOPE_PREFIX, "session store")
@click.pass_context
def sessions(ctx: click.Context, url: str, scope_prefix: str) -> None:
    """Inspect and repair the sessions stored at URL."""
    ctx.obj = (url, scope_prefix)


@sessions.command("list")
@click.option("--owner", default=None, help="One owner's sessions, most recent first.")
@click.option("--tag", "tags", multiple=True, help="With --owner: only sessions with this tag.")
@click.option("--cursor", default=None, help="With --owner: the cursor a previous page printed.")
@click.option("--prefix", default="", help="Only session ids starting with this.")
@click.option("--latched", is_flag=True, help="Only sessions waiting for recovery.")
@click.option(
    "--limit",
    default=None,
    type=click.IntRange(1, 10_000),
    help="At most this many [100; 20 with --owner].",
)
@click.option("--after", default=None, help="Page: start after this session id.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
@run_async
async def list_sessions(
    target: Target,
    owner: str | None,
    tags: tuple[str, ...],
    cursor: str | None,
    prefix: str,
    latched: bool,
    limit: int | None,
    after: str | None,
    as_json: bool,
) -> None:
    """List sessions: one owner's, most recent first (--owner), or all, by id (admin).

    Without --owner every session is listed (latched ones marked RECOVERY); that walks
    the whole store. With --owner only that owner's index is read.
    """
    if owner is None and (tags or cursor):
        raise click.UsageError("--tag and --cursor need --owner")
    if owner is not None and (prefix or latched or after):
        raise click.UsageError("--prefix, --latched and --after do not combine with --owner")
    if owner is not None:
        await _list_owner(target, owner, tags, cursor, limit or 20, as_json)
        return
    limit = limit or 100
    async with _open(target) as store:
        found = await store.list_sessions(
            prefix, start_after=after, limit=limit, latched_only=latched
        )
        now = store.kv.clock()
    if as_json:
        for info in found:
            click.echo(json.dumps(_as_dict(info)))
        return
    if not found:
        click.echo(f"no sessions in {StoreURL.parse(target[0]).render()}")
        return
    for info in found:
        if info.problem:
            state = "INVALID"
        elif info.recovery_required:
            state = f"RECOVERY ({len(info.pending_effects)} pending)"
        else:
            state = _lease(info, now)
        lineage = "" if info.forked_from is None else f"\tforked from {info.forked_from}"
        click.echo(
            f"{info.session_id}\t{info.message_count} messages\t{state}\t"
            f"updated {_when(info.updated_at)}{lineage}"
        )


async def _list_owner(
    target: Target,
    owner: str,
    tags: tuple[str, ...],
    cursor: str | None,
    limit: int,
    as_json: bool,
) -> None:
    async with _open(target) as store:
        try:
            page = await store.list_owner_sessions(
                owner, limit=limit, cursor=cursor, tags=list(tags) or None
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--cursor") from None
    if as_json:
        for summary in page.sessions:
            click.echo(json.dumps(_summary_dict(summary)))
        if page.cursor is not None:
            click.echo(json.dumps({"cursor": page.cursor}))
        return
    if not page.sessions:
        click.echo(f"no sessions of owner {owner!r}")
    for summary in page.sessions:
        title = summary.title or "(untitled)"
        tag_text = f"\t[{', '.join(summary.tags)}]" if summary.tags else ""
        click.echo(
            f"{summary.session_id}\t{title}\t{summary.message_count} messages\t"
            f"active {_when(summary.last_activity_at)}{tag_text}"
        )
        if summary.preview:
            click.echo(f"    {summary.preview}")
    if page.cursor is not None:
        click.echo(f"more: --cursor {page.cursor}")


@sessions.command("show")
@click.argument("session_id")
@click.option("--messages", "show_messages", is_flag=True, help="Also print the history.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
@run_async
async def show(target: Target, session_id: str, show_messages: bool, as_json: bool) -> None:
    """Show one session: history size, lease, pending effect calls."""
    async with _open(target) as store:
        info = await store.inspect(session_id)
        if info is None:
            raise click.ClickException(f"no session {session_id!r}")
        messages = (
            await store.read_messages(session_id) if show_messages and not info.problem else None
        )
        now = store.kv.clock()
    if as_json:
        out = _as_dict(info)
        if messages is not None:
            from pydantic_ai.messages import ModelMessagesTypeAdapter

            out["messages"] = json.loads(ModelMessagesTypeAdapter.dump_json(messages))
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(f"session      {info.session_id}")
    if info.owner or info.title or info.tags:
        click.echo(
            f"owner        {info.owner or '-'}; title {info.title or '-'}; "
            f"tags {', '.join(info.tags) or '-'}"
        )
    if info.problem:
        click.echo(f"INVALID      {info.problem}")
        click.echo("             (reset it to start over: the data is left as found)")
        return
    click.echo(
        f"messages     {info.message_count} ({info.stored_bytes} bytes, {info.chunk_count} chunks)"
    )
    click.echo(f"lease        {_lease(info, now)}; fence {info.fence}")
    if info.forked_from is not None:
        click.echo(f"forked from  {info.forked_from} (its first {info.fork_point} messages)")
    click.echo(f"updated      {_when(info.updated_at)}; expires {_when(info.expires_at)}")
    if info.usage:
        click.echo(
            f"usage        {info.usage.get('requests', 0)} requests, "
            f"{info.usage.get('input_tokens', 0)}+{info.usage.get('output_tokens', 0)} tokens"
        )
    for name, call_id, kind in info.pending_deferred:
        click.echo(f"deferred     {name} (call {call_id}) waits for {kind}")
    if info.pending_effects:
        click.echo(
            f"RECOVERY     required since {_when(info.recovery_since)}; pending effect calls:"
        )
        for call in info.pending_effects:
            click.echo(f"               {call.tool_name} (call {call.tool_call_id})")
        click.echo(
            "             check them by your own means, then: clear-recovery (keeps history) or reset"
        )
    else:
        click.echo("recovery     not required")
    for line in _describe(messages or []):
        click.echo(line)


def _describe(messages: list[Any]) -> list[str]:
    if not messages:
        return []  # without importing Pydantic AI: ``show`` without --messages needs none
    from pydantic_ai.messages import (
        ModelRequest,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )

    lines: list[str] = []
    for i, message in enumerate(messages):
        for part in message.parts:
            if isinstance(part, UserPromptPart):
                text = f"user: {part.content}"
            elif isinstance(part, TextPart):
                text = f"model: {part.content}"
            elif isinstance(part, ToolCallPart):
                text = f"tool call {part.tool_name} ({part.tool_call_id})"
            elif isinstance(part, ToolReturnPart):
                text = f"tool return {part.tool_name} [{part.outcome}]: {part.model_response_str()}"
            else:
                text = type(part).__name__
            kind = "req" if isinstance(message, ModelRequest) else "res"
            lines.append(f"  {i:>4} {kind}  {text[:160]}")
    return lines


@sessions.command("reset")
@click.argument("session_id")
@click.pass_obj
@run_async
async def reset(target: Target, session_id: str) -> None:
    """Delete a session's history and recovery marker (waits for an active turn)."""
    async with _open(target) as store:
        existed = await store.reset(session_id)
    click.echo(
        f"reset {session_id}" if existed else f"no session {session_id!r} (nothing to reset)"
    )


@sessions.command("erase-owner")
@click.argument("owner")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (keep it).")
@click.pass_obj
@run_async
async def erase_owner(target: Target, owner: str, as_json: bool) -> None:
    """Erase every session of OWNER (history, latch, index) and verify nothing is left.

    Run it again after an interruption: it resumes. Memory and run journals are not
    touched. Exits 1 when entries are left.
    """
    async with _open(target) as store:
        report = await store.erase_owner(owner)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        resumed = " (resumed an unfinished erase)" if report.resumed else ""
        click.echo(f"erased {len(report.sessions)} sessions of owner {owner!r}{resumed}")
        for session_id in report.sessions:
            click.echo(f"  {session_id}")
        click.echo(
            f"verified: {report.scopes_checked} scopes read back, "
            f"{report.entries_left} entries left"
        )
    if not report.complete:
        raise SystemExit(1)


@sessions.command("clear-recovery")
@click.argument("session_id")
@click.pass_obj
@run_async
async def clear_recovery(target: Target, session_id: str) -> None:
    """Clear the recovery marker of a session, keeping its history."""
    async with _open(target) as store:
        info = await store.inspect(session_id)
        cleared = await store.clear_recovery(session_id)
    if cleared and info is not None:
        calls = ", ".join(f"{c.tool_name} ({c.tool_call_id})" for c in info.pending_effects)
        click.echo(f"cleared the recovery marker of {session_id} (was pending: {calls})")
    else:
        click.echo(f"session {session_id!r} had no recovery marker")


@sessions.command("fork")
@click.argument("source_id")
@click.argument("new_id")
@click.option(
    "--at-turn",
    type=click.IntRange(0),
    default=None,
    help="Take the source's first N turns [all of its committed history].",
)
@click.option("--owner", default=None, help="The new session's owner [the source's].")
@click.option("--title", default=None, help="The new session's title [the source's].")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_obj
@run_async
async def fork(
    target: Target,
    source_id: str,
    new_id: str,
    at_turn: int | None,
    owner: str | None,
    title: str | None,
    as_json: bool,
) -> None:
    """Create NEW_ID with SOURCE_ID's history (copy-on-write: no history is copied).

    Another owner than the source's gets a copy of every chunk instead.
    """
    async with _open(target) as store:
        report = await store.fork(source_id, new_id, at_turn=at_turn, owner=owner, title=title)
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(report), indent=2))
        return
    how = (
        "copied (another owner)"
        if report.copied
        else f"{report.shared_chunks} history chunks shared"
    )
    click.echo(
        f"forked {source_id} into {new_id}: {report.message_count} messages, {how}, "
        f"{report.bytes_written} bytes written"
    )


@sessions.command("rewind")
@click.argument("session_id")
@click.argument("turn", type=click.IntRange(0))
@click.option("--timeout", "timeout_seconds", default=5.0, show_default=True, type=float)
@click.pass_obj
@run_async
async def rewind(target: Target, session_id: str, turn: int, timeout_seconds: float) -> None:
    """Move SESSION_ID back to its first TURN turns; what it held is kept as a branch."""
    async with _open(target) as store:
        branch = await store.rewind(session_id, turn, timeout_seconds=timeout_seconds)
    click.echo(
        f"rewound {session_id} to turn {turn}; the {branch.message_count} messages it held "
        f"are branch {branch.branch_id} (restore it with: restore {session_id} "
        f"{branch.branch_id})"
    )


@sessions.command("branches")
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_obj
@run_async
async def branches(target: Target, session_id: str, as_json: bool) -> None:
    """List the histories rewinds and restores of SESSION_ID set aside, oldest first."""
    async with _open(target) as store:
        found = await store.branches(session_id)
    for branch in found:
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(branch)))
        else:
            click.echo(
                f"{branch.branch_id}  {_when(branch.created_at)}  "
                f"{branch.message_count} messages  ({branch.reason})"
            )
    if not found and not as_json:
        click.echo(f"session {session_id!r} has no branches")


@sessions.command("restore")
@click.argument("session_id")
@click.argument("branch_id")
@click.option("--timeout", "timeout_seconds", default=5.0, show_default=True, type=float)
@click.pass_obj
@run_async
async def restore(target: Target, session_id: str, branch_id: str, timeout_seconds: float) -> None:
    """Make branch BRANCH_ID the history of SESSION_ID again (the current one becomes a branch)."""
    async with _open(target) as store:
        kept = await store.restore(session_id, branch_id, timeout_seconds=timeout_seconds)
    click.echo(
        f"restored branch {branch_id} of {session_id}; the {kept.message_count} messages it "
        f"replaced are branch {kept.branch_id}"
    )
