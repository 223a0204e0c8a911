"""Import runs from a pydantic-ai-harness step store (``SqliteStepStore``,
``PostgresStepStore``, or any ``StepStore``) into agent-stores' :class:`KVStepStore`, so a
run started on the harness can be continued with ``continue_run`` on agent-stores.

Read through the harness ``StepStore`` protocol (plus ``list_snapshots``, which the
harness stores offer beside it). What maps to what:

* run records (lineage: conversation, parent, agent name): registered unchanged;
* step events, in order; continuable snapshots (settled and interrupted), in order;
* tool-effect records of every tool call id the events or the unresolved list name.

Rerunnable: what the target already holds as a prefix of the source's events and
snapshots is skipped, the rest appended. A target whose events differ from the source's
is reported, never overwritten.
"""

from __future__ import annotations

from typing import Any

from .report import ImportReport


def _event_key(event: Any) -> tuple[Any, ...]:
    return (
        event.kind,
        event.step_index,
        event.timestamp,
        event.tool_call_id,
        event.tool_name,
        event.idempotency_key,
    )


def _snapshot_key(snapshot: Any) -> tuple[Any, ...]:
    return (snapshot.step_index, snapshot.state, snapshot.idempotency_key, snapshot.timestamp)


async def _snapshots(store: Any, run_id: str) -> list[Any] | None:
    lister = getattr(store, "list_snapshots", None)
    if lister is None:
        return None
    return list(await lister(run_id=run_id, include_interrupted=True))


async def import_steps(
    source: Any, target: Any, *, run_ids: list[str] | None = None, label: str = "runs"
) -> ImportReport:
    """Copy runs (all, or ``run_ids``) from the harness step store ``source`` to ``target``."""
    report = ImportReport(label)
    if run_ids is None:
        records = list(await source.list_runs())
    else:
        records = []
        for run_id in run_ids:
            record = await source.get_run(run_id=run_id)
            if record is None:
                report.failed.append(f"{run_id}: no such run in the source")
            else:
                records.append(record)
    for record in records:
        try:
            changed = await _import_run(source, target, record, report)
        except Exception as exc:  # one bad run must not stop the others
            report.failed.append(f"{record.run_id}: {type(exc).__name__}: {exc}")
            continue
        if changed == "new":
            report.imported += 1
        elif changed == "more":
            report.updated += 1
        elif changed == "same":
            report.identical += 1
    return report


async def _import_run(source: Any, target: Any, record: Any, report: ImportReport) -> str:
    run_id = record.run_id
    existed = await target.get_run(run_id=run_id) is not None
    await target.register_run(record)  # identical re-registration is a no-op
    added = 0
    events = list(await source.list_events(run_id=run_id))
    have = list(await target.list_events(run_id=run_id))
    if [_event_key(e) for e in have] != [_event_key(e) for e in events[: len(have)]]:
        report.failed.append(f"{run_id}: the target's events differ from the source's; left as is")
        return "conflict"
    for event in events[len(have) :]:
        await target.append_event(event)
        added += 1
    snapshots = await _snapshots(source, run_id)
    if snapshots is None:
        report.not_carried.append(
            f"{run_id}: earlier snapshots (the source cannot list them); only the latest ones"
        )
        snapshots = [
            s
            for s in (
                await source.latest_snapshot(run_id=run_id, include_interrupted=False),
                await source.latest_snapshot(run_id=run_id, include_interrupted=True),
            )
            if s is not None
        ]
    have_snaps = await target.list_snapshots(run_id=run_id, include_interrupted=True)
    done = [_snapshot_key(s) for s in have_snaps]
    wanted = [_snapshot_key(s) for s in snapshots]
    if done != wanted[: len(done)]:
        report.failed.append(f"{run_id}: the target's snapshots differ from the source's")
        return "conflict"
    for snapshot in snapshots[len(done) :]:
        await target.save_snapshot(snapshot)
        added += 1
    calls = {e.tool_call_id for e in events if e.tool_call_id}
    calls |= {r.tool_call_id for r in await source.list_unresolved_tool_effects(run_id=run_id)}
    for call_id in sorted(calls):
        effect = await source.get_tool_effect(run_id=run_id, tool_call_id=call_id)
        if effect is None:
            continue
        mine = await target.get_tool_effect(run_id=run_id, tool_call_id=call_id)
        if mine != effect:
            await target.record_tool_effect(effect)
            added += 1
    if not existed:
        return "new"
    return "more" if added else "same"
