"""``agent-stores conversations URL list | show ID``: conversations saved through Pydantic
AI's ConversationStore (``open_conversations``), with their usage and pending deferred
tool requests."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..connection import open_conversations
from .common import run_async, scope_prefix_option

if TYPE_CHECKING:
    from pydantic_ai.conversation_store import ConversationRecord

    from ..conversations import KVConversationStore

T = TypeVar("T")


@click.group()
@click.argument("url", metavar="URL")
@scope_prefix_option("conversation:", "conversation store")
@click.pass_context
def conversations(ctx: click.Context, url: str, scope_prefix: str) -> None:
    """List and show the Pydantic AI conversations stored at URL."""
    ctx.obj = (url, scope_prefix)


async def _with_store(ctx: click.Context, body: Callable[[KVConversationStore], Awaitable[T]]) -> T:
    url, scope_prefix = ctx.obj
    try:
        async with open_conversations(url, scope_prefix=scope_prefix) as store:
            return await body(store)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _pending(record: ConversationRecord) -> list[dict[str, Any]]:
    """The deferred tool calls a paused conversation waits on: name, call id, kind (never arguments)."""
    requests = record.deferred_tool_requests
    if requests is None:
        return []
    return [
        {"tool_name": call.tool_name, "tool_call_id": call.tool_call_id, "kind": kind}
        for kind, calls in (("approval", requests.approvals), ("external", requests.calls))
        for call in calls
    ]


def _summary(record: ConversationRecord) -> dict[str, Any]:
    usage = record.usage
    return {
        "conversation_id": record.conversation_id,
        "scope": record.scope,
        "title": record.title,
        "updated_at": record.updated_at.isoformat(timespec="seconds"),
        "usage": {
            "requests": usage.requests,
            "tool_calls": usage.tool_calls,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
        },
        "pending_deferred": _pending(record),
        "forked_from": record.forked_from,
        "branches": len(record.branches),
        "revision": record.revision,
    }


@conversations.command("list")
@click.option("--scope", default=None, help="Only this scope's conversations (the owner).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@run_async
async def list_(ctx: click.Context, scope: str | None, limit: int, as_json: bool) -> None:
    """Most recently saved first: id, scope, updated, usage, pending deferred calls, title."""

    async def body(store: KVConversationStore) -> None:
        for record in await store.list_conversations(scope=scope, limit=limit):
            summary = _summary(record)
            if as_json:
                click.echo(json.dumps(summary))
                continue
            usage = summary["usage"]
            click.echo(
                f"{record.conversation_id}\t{record.scope or '-'}\t{summary['updated_at']}\t"
                f"{usage['requests']} requests, {usage['input_tokens']}+{usage['output_tokens']} "
                f"tokens\t{len(summary['pending_deferred'])} pending\t{record.title or ''}"
            )

    await _with_store(ctx, body)


@conversations.command("show")
@click.argument("conversation_id")
@click.option("--scope", default=None, help="Only if it was saved with this scope.")
@click.option(
    "--last", default=20, show_default=True, type=click.IntRange(min=0), help="Messages shown."
)
@click.option("--json", "as_json", is_flag=True, help="The record and messages as JSON.")
@click.pass_context
@run_async
async def show(
    ctx: click.Context, conversation_id: str, scope: str | None, last: int, as_json: bool
) -> None:
    """A conversation's record (usage, pending deferred calls, branches) and its last messages."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    async def body(store: KVConversationStore) -> None:
        record = await store.read_record(conversation_id)
        if record is None or (scope is not None and record.scope != scope):
            raise click.ClickException(f"no conversation {conversation_id!r} at this URL")
        entries = await store.load_entries(conversation_id, limit=last, scope=scope) or []
        summary = _summary(record)
        if as_json:
            summary["messages"] = ModelMessagesTypeAdapter.dump_python(
                [entry.message for entry in entries], mode="json"
            )
            click.echo(json.dumps(summary, indent=2))
            return
        for key, value in summary.items():
            click.echo(f"{key}: {json.dumps(value) if isinstance(value, dict | list) else value}")
        for entry in entries:
            for part in entry.message.parts:
                text = getattr(part, "content", None)
                shown = text if isinstance(text, str) else getattr(part, "tool_name", "")
                click.echo(f"  [{part.part_kind}] {str(shown)[:200]}")

    await _with_store(ctx, body)
