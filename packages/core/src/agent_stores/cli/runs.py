"""``agent-stores runs URL list | show RUN | delete RUN | fork RUN``: inspect, erase and fork
checkpointed runs."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..connection import open_checkpointer
from ..errors import AppError
from ..url import StoreURL
from .common import run_async, scope_prefix_option

if TYPE_CHECKING:
    from ..checkpointer import Checkpointer, RunFork

T = TypeVar("T")


@click.group()
@click.argument("url", metavar="URL")
@scope_prefix_option("cp/", "checkpointer")
@click.option(
    "--namespace",
    default=None,
    hidden=True,
    help="Deprecated: --scope-prefix NAMESPACE/ (the checkpointer's old option).",
)
@click.pass_context
def runs(ctx: click.Context, url: str, scope_prefix: str, namespace: str | None) -> None:
    """List, show, delete and fork the runs checkpointed at URL (journals and step-persistence
    runs)."""
    if namespace is not None:
        click.echo(f"--namespace is deprecated; use --scope-prefix {namespace}/", err=True)
        scope_prefix = f"{namespace}/"
    ctx.obj = (url, scope_prefix)


async def _with_checkpointer(ctx: click.Context, body: Callable[[Checkpointer], Awaitable[T]]) -> T:
    url, scope_prefix = ctx.obj
    try:
        async with open_checkpointer(url, scope_prefix=scope_prefix) as checkpointer:
            return await body(checkpointer)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "never"
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds")


def _shown(ctx: click.Context) -> str:
    try:
        return StoreURL.parse(ctx.obj[0]).render()
    except ValueError:
        return "the given URL"


@runs.command("list")
@click.option("--limit", default=100, show_default=True, help="List at most this many runs.")
@click.option("--after", default=None, help="Start after this run id (for paging).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
@run_async
async def list_(ctx: click.Context, limit: int, after: str | None, as_json: bool) -> None:
    """List runs in id order: run id, first write, expiry."""

    async def body(checkpointer: Checkpointer) -> None:
        for info in await checkpointer.list_runs(start_after=after, limit=limit):
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "run_id": info.run_id,
                            "created_at": info.created_at,
                            "expires_at": info.expires_at,
                        }
                    )
                )
            else:
                click.echo(
                    f"{info.run_id}\tcreated {_when(info.created_at)}\texpires {_when(info.expires_at)}"
                )

    await _with_checkpointer(ctx, body)


async def _describe(checkpointer: Checkpointer, run_id: str) -> dict[str, Any] | None:
    info = await checkpointer.get_run_info(run_id)
    state = await checkpointer.load(run_id)
    report: dict[str, Any] = {
        "run_id": run_id,
        "created_at": info.created_at if info else None,
        "expires_at": info.expires_at if info else None,
        "journal": [
            {
                "seq": e.seq,
                "step_id": e.step_id,
                "phase": e.phase.value,
                "kind": e.kind,
                "outcome": e.outcome.value,
            }
            for e in state.entries
        ],
        "uncertain_steps": state.uncertain_steps(),
    }
    lineage = await checkpointer.fork_of(run_id)
    report["forked_from"] = (
        {
            "run_id": lineage.source_run_id,
            "point": lineage.point.describe(),
            "complete": lineage.complete,
        }
        if lineage is not None
        else None
    )
    report["forks"] = [fork.run_id for fork in await checkpointer.list_forks(run_id)]
    try:
        steps = checkpointer.step_store()
    except ImportError:  # the harness extra is not installed: journal only
        return report if info is not None or state.entries else None
    record = await steps.get_run(run_id=run_id)
    events = await steps.list_events(run_id=run_id)
    snapshots = await steps.numbered_snapshots(run_id=run_id, include_interrupted=True)
    unresolved = await steps.list_unresolved_tool_effects(run_id=run_id)
    report["record"] = (
        {
            "conversation_id": record.conversation_id,
            "parent_run_id": record.parent_run_id,
            "agent_name": record.agent_name,
            "started_at": record.started_at.isoformat(),
        }
        if record is not None
        else None
    )
    report["events"] = [
        {"kind": e.kind, "step_index": e.step_index, "tool_name": e.tool_name, "error": e.error}
        for e in events
    ]
    report["snapshots"] = [
        {"position": n, "step_index": s.step_index, "state": s.state, "messages": len(s.messages)}
        for n, s in snapshots
    ]
    report["unresolved_tool_effects"] = [
        {"tool_call_id": r.tool_call_id, "tool_name": r.tool_name} for r in unresolved
    ]
    if info is None and not state.entries and record is None and not events and not snapshots:
        return None
    return report


@runs.command("show")
@click.argument("run_id", metavar="RUN")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@run_async
async def show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """Show a run: its journal, step events, snapshots and unresolved tool effects."""
    report = await _with_checkpointer(ctx, lambda cp: _describe(cp, run_id))
    if report is None:
        raise click.ClickException(f"no run {run_id!r} at {_shown(ctx)}")
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"run {run_id}")
    click.echo(f"  created {_when(report['created_at'])}, expires {_when(report['expires_at'])}")
    record = report.get("record")
    if record:
        lineage = ", ".join(f"{k}={v}" for k, v in record.items() if v is not None)
        click.echo(f"  registered: {lineage}")
    forked = report["forked_from"]
    if forked:
        state = "" if forked["complete"] else " (INCOMPLETE: run the fork again to finish it)"
        click.echo(f"  forked from {forked['run_id']} at {forked['point']}{state}")
    if report["forks"]:
        click.echo(f"  forks: {', '.join(report['forks'])}")
    click.echo(f"  journal: {len(report['journal'])} entries")
    for entry in report["journal"]:
        click.echo(
            f"    {entry['seq']:>6}  {entry['step_id']}  {entry['phase']}"
            + (f"  ({entry['outcome']})" if entry["outcome"] != "result" else "")
        )
    if report["uncertain_steps"]:
        click.echo(f"  uncertain steps: {', '.join(report['uncertain_steps'])}")
    if "events" in report:
        click.echo(f"  step events: {len(report['events'])}")
        for event in report["events"]:
            extra = f" {event['tool_name']}" if event["tool_name"] else ""
            click.echo(f"    step {event['step_index']:>3}  {event['kind']}{extra}")
        click.echo(f"  snapshots: {len(report['snapshots'])}")
        for snap in report["snapshots"]:
            click.echo(
                f"    #{snap['position']:<4} step {snap['step_index']:>3}  {snap['state']}  "
                f"{snap['messages']} messages"
            )
        for effect in report["unresolved_tool_effects"]:
            click.echo(
                f"  unresolved tool effect: {effect['tool_name']} ({effect['tool_call_id']})"
            )


@runs.command("delete")
@click.argument("run_id", metavar="RUN")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@run_async
async def delete(ctx: click.Context, run_id: str, yes: bool) -> None:
    """Erase a run: journal, step events, snapshots, tool effects and index entries."""
    if not yes:
        click.confirm(f"Delete run {run_id!r} at {_shown(ctx)}?", abort=True)
    deleted = await _with_checkpointer(ctx, lambda cp: cp.delete_run(run_id))
    if not deleted:
        raise click.ClickException(f"no run {run_id!r} at {_shown(ctx)}")
    click.echo(f"deleted run {run_id}")


def _point(at: str | None) -> int | str | None:
    """``--at``: digits name a snapshot position, anything else a journal step id."""
    if at is None:
        return None
    return int(at) if at.isdigit() else at


def _fork_report(fork: RunFork) -> dict[str, Any]:
    return {
        "run_id": fork.run_id,
        "source_run_id": fork.source_run_id,
        "point": fork.point.describe(),
        "journal_entries": fork.journal_entries,
        "snapshots": fork.snapshots,
        "tool_effects": fork.tool_effects,
        "calls": [
            {"tool_call_id": c.tool_call_id, "tool_name": c.tool_name, "state": c.state.value}
            for c in fork.calls
        ],
        "latched": list(fork.latched),
    }


@runs.command("fork")
@click.argument("run_id", metavar="RUN")
@click.option(
    "--at",
    default=None,
    metavar="POINT",
    help="A snapshot position (as `show` lists them, #N) or a journal step id; "
    "default: the latest point.",
)
@click.option("--new-id", default=None, help="The fork's run id (default: RUN.fork-<random>).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@run_async
async def fork(
    ctx: click.Context, run_id: str, at: str | None, new_id: str | None, as_json: bool
) -> None:
    """Start a new run from a point of RUN, inheriting what it knows of its tool effects.

    Done calls are replayed from their recorded result when the fork is resumed; a call
    whose outcome is uncertain keeps the fork latched until it is decided (resume_run's
    decisions=). The source is not changed.
    """

    async def body(checkpointer: Checkpointer) -> RunFork:
        try:
            return await checkpointer.fork_run(run_id, new_run_id=new_id, at=_point(at))
        except AppError as exc:
            raise click.ClickException(exc.detail or str(exc)) from None

    made = await _with_checkpointer(ctx, body)
    report = _fork_report(made)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"forked run {made.source_run_id} at {report['point']} into {made.run_id}")
    click.echo(
        f"  copied {made.journal_entries} journal entries, {made.snapshots} snapshots, "
        f"{made.tool_effects} tool effects"
    )
    for call in report["calls"]:
        click.echo(f"  open call {call['tool_name']} ({call['tool_call_id']}): {call['state']}")
    if made.latched:
        click.echo(
            f"  LATCHED: the outcome of {', '.join(made.latched)} is uncertain; resuming the "
            "fork refuses until each is decided (retry, deny, or the result it had)"
        )
