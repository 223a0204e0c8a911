"""``agent-stores setup URL`` and ``agent-stores purge URL``."""

from __future__ import annotations

import os

import click

from ..damage import purge_quarantined
from ..retention import POLICY_ENV, RetentionPolicy
from ..selection import open_kv
from ..url import StoreURL
from .common import resolve_url, run_async, url_argument


@click.command()
@url_argument()
@run_async
async def setup(url: str | None) -> None:
    """Create the backend's tables, schema or indexes. Safe to run again and concurrently."""
    target = resolve_url(url)
    async with open_kv(target) as kv:
        await kv.setup()
    click.echo(f"set up {StoreURL.parse(target).render()}")


@click.command()
@url_argument()
@click.option(
    "--policy",
    "policies",
    multiple=True,
    help="Retention policy, e.g. 'sessions-idle=90d runs-keep=20 quarantine=30d' "
    f"(default: ${POLICY_ENV}).",
)
@click.option(
    "--sessions-idle-days",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Retention: also delete sessions no turn has used for this many days.",
)
@click.option(
    "--include-latched",
    is_flag=True,
    help="With --sessions-idle-days: delete idle sessions waiting for recovery too.",
)
@click.option(
    "--runs-keep",
    type=click.IntRange(min=1),
    default=None,
    help="Retention: in every conversation keep only its N most recent runs.",
)
@click.option(
    "--quarantine-days",
    type=click.FloatRange(min=0),
    default=None,
    help="Retention: delete records quarantined (doctor --repair) more than N days ago.",
)
@click.option(
    "--memory-age-days",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Retention: delete memory files not written for this many days.",
)
@click.option("--memory-prefix", default="", help="With memory-age: only paths starting with this.")
@click.option(
    "--memory-scope-prefix",
    default="memory:",
    show_default=True,
    help="Of the memory store.",
)
@click.option(
    "--conversations-idle-days",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Retention: delete Pydantic AI conversations not saved for this many days.",
)
@click.option("--scope-prefix", default="session:", show_default=True, help="Of the sessions.")
@click.option("--session-prefix", default="", help="Only session ids starting with this.")
@run_async
async def purge(
    url: str | None,
    policies: tuple[str, ...],
    sessions_idle_days: float | None,
    include_latched: bool,
    runs_keep: int | None,
    quarantine_days: float | None,
    memory_age_days: float | None,
    memory_prefix: str,
    memory_scope_prefix: str,
    conversations_idle_days: float | None,
    scope_prefix: str,
    session_prefix: str,
) -> None:
    """Delete expired entries the backend does not collect; optionally apply retention.

    A retention policy (--policy, or $AGENT_STORES_RETENTION) names what may go:
    sessions-idle=DURATION (sessions no turn used for that long; add include-latched for
    those waiting for recovery), runs-keep=N (runs of each conversation past its N most
    recent), quarantine=DURATION (quarantined copies older than that), memory-age=DURATION
    (memory files not written for that long), conversations-idle=DURATION (Pydantic AI
    conversations not saved for that long). The --*-days and --runs-keep options set the
    same items. Each part reports what it deleted; run it
    again after an interruption.
    """
    policy = _policy(
        policies,
        RetentionPolicy(
            None if sessions_idle_days is None else sessions_idle_days * 86_400,
            include_latched,
            runs_keep,
            None if quarantine_days is None else quarantine_days * 86_400,
            None if memory_age_days is None else memory_age_days * 86_400,
            None if conversations_idle_days is None else conversations_idle_days * 86_400,
        ),
    )
    if policy.memory_age_seconds is None and memory_prefix:
        raise click.UsageError("--memory-prefix needs --memory-age-days (or memory-age=)")
    if policy.sessions_idle_seconds is None and (policy.include_latched or session_prefix):
        raise click.UsageError("--include-latched and --session-prefix need --sessions-idle-days")
    target = resolve_url(url)
    async with open_kv(target) as kv:
        removed = await kv.purge_expired()
        click.echo(f"purged {removed} expired entries from {StoreURL.parse(target).render()}")
        if policy.quarantine_seconds is not None:
            dropped = await purge_quarantined(kv, policy.quarantine_seconds)
            click.echo(
                f"deleted {len(dropped)} records quarantined more than "
                f"{_days(policy.quarantine_seconds)} ago"
            )
    if policy.runs_keep is not None:
        from ..connection import open_checkpointer

        async with open_checkpointer(target) as checkpointer:
            runs = await checkpointer.keep_latest_runs(policy.runs_keep)
        click.echo(
            f"deleted {len(runs.removed)} runs; kept the {policy.runs_keep} most recent of each "
            f"of {runs.conversations} conversations ({runs.kept} runs)"
        )
    if policy.memory_age_seconds is not None:
        from ..connection import open_memory

        async with open_memory(target, scope_prefix=memory_scope_prefix) as memory:
            aged = await memory.purge_older_than(policy.memory_age_seconds, prefix=memory_prefix)
        click.echo(
            f"deleted {len(aged.removed)} of {aged.scanned} memory files not written for "
            f"{_days(policy.memory_age_seconds)}"
            + (f" (kept {aged.undated} with no write time)" if aged.undated else "")
        )
    if policy.conversations_idle_seconds is not None:
        from ..connection import open_conversations

        async with open_conversations(target) as conversations:
            idle = await conversations.purge_idle(policy.conversations_idle_seconds)
        click.echo(
            f"deleted {len(idle.removed)} of {idle.scanned} conversations not saved for "
            f"{_days(policy.conversations_idle_seconds)}"
        )
    if policy.sessions_idle_seconds is None:
        return
    from ..connection import open_sessions

    async with open_sessions(target, scope_prefix=scope_prefix) as store:
        report = await store.purge_idle(
            policy.sessions_idle_seconds,
            include_latched=policy.include_latched,
            prefix=session_prefix,
        )
    click.echo(
        f"deleted {len(report.removed)} of {report.scanned} sessions idle for more than "
        f"{_days(policy.sessions_idle_seconds)}"
    )
    if report.kept_latched:
        click.echo(
            f"kept {len(report.kept_latched)} idle sessions waiting for recovery "
            "(--include-latched deletes them): " + ", ".join(report.kept_latched[:20])
        )


def _policy(texts: tuple[str, ...], options: RetentionPolicy) -> RetentionPolicy:
    """The --policy texts (or the environment's), then the explicit options over them."""
    sources = texts or ((os.environ[POLICY_ENV],) if os.environ.get(POLICY_ENV) else ())
    policy = RetentionPolicy()
    for text in sources:
        try:
            policy = policy.merged(RetentionPolicy.parse(text))
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--policy") from None
    return policy.merged(options)


def _days(seconds: float) -> str:
    return f"{seconds / 86_400:g} days"
