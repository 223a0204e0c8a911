"""``agent-stores import …``: bring data in from the stores agent-stores replaces."""

from __future__ import annotations

from typing import Any

import click

from ..importers import ImportReport
from ..transfer.redact import Redactor
from ..url import StoreURL
from .common import run_async


@click.group("import")
def import_() -> None:
    """Import from pydantic-ai-harness stores and Cortex Agent SDK Redis sessions.

    Every import is idempotent and prints what it could not carry over, and why.
    """


def _echo(report: ImportReport, redact: Redactor) -> None:
    for line in report.lines():
        click.echo(redact(line))
    if not report.ok:
        raise SystemExit(1)


async def _asyncpg_pool(url: str) -> Any:
    try:
        import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise click.ClickException(
            "reading the harness PostgreSQL stores needs asyncpg (as the harness does): "
            "pip install asyncpg"
        ) from None
    parsed = StoreURL.parse(url)
    return await asyncpg.create_pool(
        host=parsed.host or None,
        port=parsed.port or 5432,
        user=parsed.username,
        password=parsed.password,
        database=parsed.path.lstrip("/") or None,
        min_size=1,
        max_size=4,
    )


def _sqlite_path(url: str) -> str:
    parsed = StoreURL.parse(url)
    if parsed.scheme != "sqlite":
        raise click.BadParameter("expected sqlite:///file.db or postgresql://…", param_hint="SRC")
    # sqlite:///relative.db and sqlite:////absolute.db, as the sqlite:// backend reads them.
    return parsed.path[1:]


@import_.command(
    "harness-memory", short_help="Memory files of a harness SQLite or PostgreSQL store."
)
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST_URL")
@click.option("--prefix", default="", help="Only paths starting with this.")
@click.option("--table", default="agent_memory", show_default=True, help="PostgreSQL table.")
@run_async
async def harness_memory(src: str, dst: str, prefix: str, table: str) -> None:
    """Memory files of a harness SqliteMemoryStore (sqlite:///file.db) or
    PostgresMemoryStore (postgresql://…) into the memory store at DST_URL."""
    from ..connection import connect
    from ..importers.memory import import_memory, postgres_fingerprints, sqlite_fingerprints

    redact = Redactor([src, dst])
    scheme = StoreURL.parse(src).scheme
    pool = None
    if scheme in ("postgres", "postgresql"):
        from pydantic_ai_harness.memory import PostgresMemoryStore

        pool = await _asyncpg_pool(src)
        source: Any = PostgresMemoryStore(pool, table=table)
        lookup, receipts = await postgres_fingerprints(pool, table)
    else:
        from pydantic_ai_harness.memory import SqliteMemoryStore

        path = _sqlite_path(src)
        source = SqliteMemoryStore(database=path)
        lookup, receipts = sqlite_fingerprints(path)
    try:
        async with connect(dst) as conn:
            await conn.kv.setup()
            report = await import_memory(
                source,
                conn.memory(),
                prefix=prefix,
                fingerprint_of=lookup,
                receipts_total=receipts,
                label=f"harness memory {StoreURL.parse(src).render()}",
            )
    finally:
        if pool is not None:
            await pool.close()
    _echo(report, redact)


@import_.command("harness-steps", short_help="Runs of a harness SQLite or PostgreSQL step store.")
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST_URL")
@click.option("--run-id", "run_ids", multiple=True, help="Only this run (repeatable).")
@click.option("--table", default=None, help="PostgreSQL table prefix, if not the default.")
@run_async
async def harness_steps(src: str, dst: str, run_ids: tuple[str, ...], table: str | None) -> None:
    """Runs of a harness SqliteStepStore (sqlite:///file.db) or PostgresStepStore
    (postgresql://…) into the run store at DST_URL, continuable with continue_run."""
    from ..connection import connect
    from ..importers.steps import import_steps

    redact = Redactor([src, dst])
    scheme = StoreURL.parse(src).scheme
    pool = None
    if scheme in ("postgres", "postgresql"):
        from pydantic_ai_harness.step_persistence import PostgresStepStore

        pool = await _asyncpg_pool(src)
        source: Any = PostgresStepStore(pool, table=table) if table else PostgresStepStore(pool)
    else:
        from pydantic_ai_harness.step_persistence import SqliteStepStore

        source = SqliteStepStore(database=_sqlite_path(src))
    try:
        async with connect(dst) as conn:
            await conn.kv.setup()
            report = await import_steps(
                source,
                conn.checkpointer().step_store(),
                run_ids=list(run_ids) or None,
                label=f"harness runs {StoreURL.parse(src).render()}",
            )
    finally:
        if pool is not None:
            await pool.close()
    _echo(report, redact)


@import_.command("cortex-redis", short_help="Cortex Agent SDK sessions kept in Redis.")
@click.argument("src", metavar="REDIS_URL")
@click.argument("dst", metavar="DST_URL")
@click.option(
    "--key-prefix",
    default="cortex:pydantic:sessions",
    show_default=True,
    help="The RedisSessionStore's key_prefix.",
)
@click.option(
    "--session-id",
    "session_ids",
    multiple=True,
    help="Import this session under its own id (repeatable); default: all, by digest.",
)
@click.option("--busy-timeout", default=30.0, show_default=True, type=click.FloatRange(0))
@run_async
async def cortex_redis(
    src: str, dst: str, key_prefix: str, session_ids: tuple[str, ...], busy_timeout: float
) -> None:
    """Cortex Agent SDK sessions from Redis (history and recovery marker) into the
    session store at DST_URL; the marker becomes the fail-closed latch."""
    from ..connection import connect
    from ..importers.cortex import import_cortex_sessions

    redact = Redactor([src, dst])
    try:
        import redis.asyncio as aioredis
    except ImportError:
        raise click.ClickException(
            "reading Cortex sessions needs redis-py: pip install 'agent-stores[redis]'"
        ) from None
    client = aioredis.Redis.from_url(StoreURL.parse(src).render_with_secrets())
    try:
        async with connect(dst) as conn:
            await conn.kv.setup()
            report = await import_cortex_sessions(
                client,
                conn.sessions(),
                key_prefix=key_prefix,
                session_ids=list(session_ids) or None,
                busy_timeout=busy_timeout,
            )
    finally:
        await client.aclose()
    _echo(report, redact)


@import_.command("conversations", short_help="Conversations of any Pydantic AI ConversationStore.")
@click.argument("source", metavar="MODULE:FACTORY")
@click.argument("dst", metavar="DST_URL")
@run_async
async def conversations(source: str, dst: str) -> None:
    """Every conversation of the ConversationStore that MODULE:FACTORY makes (a store, a
    function returning one, or an async context manager giving one) copied into the
    conversation store at DST_URL, with its revision, entry ids, branches and forks;
    conversations already there are left as they are (run it again to finish)."""
    import contextlib
    import importlib
    import inspect

    from pydantic_ai.conversation_store import ConversationStore

    from ..connection import open_conversations
    from ..conversations.copy_in import copy_conversations

    module_name, _, attribute = source.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter("expected module:attribute", param_hint="MODULE:FACTORY")
    try:
        made: Any = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"{source}: {exc}", param_hint="MODULE:FACTORY") from None
    redact = Redactor([dst])
    async with contextlib.AsyncExitStack() as stack:
        if callable(made) and not isinstance(made, ConversationStore):
            made = made()
        if inspect.isawaitable(made):
            made = await made
        if hasattr(made, "__aenter__") and not isinstance(made, ConversationStore):
            made = await stack.enter_async_context(made)
        if not isinstance(made, ConversationStore):
            raise click.BadParameter(
                f"{source} gave {type(made).__name__}, not a ConversationStore",
                param_hint="MODULE:FACTORY",
            )
        target = await stack.enter_async_context(open_conversations(dst))
        report = await copy_conversations(made, target)
    click.echo(
        f"copied {len(report.copied)} conversations ({report.entries} entries); "
        f"{len(report.present)} already there"
    )
    for conversation_id, reason in report.failed:
        click.echo(redact(f"not copied: {conversation_id!r}: {reason}"))
    if not report.ok:
        raise SystemExit(1)
