"""``agent-stores memory URL ls PREFIX | cat PATH | rm PATH``: browse and edit memory files."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import click

from ..connection import open_memory
from ..url import StoreURL
from .common import run_async, scope_prefix_option

if TYPE_CHECKING:
    from ..memory import KVMemoryStore

T = TypeVar("T")

_DEFAULT_PREFIX = "memory:"


@click.group()
@click.argument("url", metavar="URL")
@scope_prefix_option(_DEFAULT_PREFIX, "memory store")
@click.pass_context
def memory(ctx: click.Context, url: str, scope_prefix: str) -> None:
    """Browse and edit the memory files kept at URL (paths look like NAMESPACE/AGENT/MEMORY.md)."""
    ctx.obj = (url, scope_prefix)


async def _with_store(ctx: click.Context, body: Callable[[KVMemoryStore], Awaitable[T]]) -> T:
    url, scope_prefix = ctx.obj
    try:
        async with open_memory(url, scope_prefix=scope_prefix) as store:
            return await body(store)
    except ValueError as exc:
        # A bad path is the user's typo, not a crash: one line, exit status 1.
        raise click.ClickException(str(exc)) from None
    except Exception as exc:
        if _is_conflict(exc):
            raise click.ClickException(
                "the file changed meanwhile; nothing was done, try again"
            ) from None
        raise


def _is_conflict(exc: Exception) -> bool:
    # Only the harness raises its MemoryConflictError, so without the harness imported
    # (``ls`` never imports it) there is none, and another error need not import it.
    harness = sys.modules.get("pydantic_ai_harness.memory")
    return harness is not None and isinstance(exc, harness.MemoryConflictError)


def _shown(ctx: click.Context) -> str:
    url, _ = ctx.obj
    try:
        return StoreURL.parse(url).render()
    except ValueError:
        return "the given URL"


@memory.command("ls")
@click.argument("prefix", default="")
@click.option("--limit", default=1000, show_default=True, help="List at most this many paths.")
@click.pass_context
@run_async
async def ls(ctx: click.Context, prefix: str, limit: int) -> None:
    """List the paths starting with PREFIX (every path when omitted), sorted."""

    async def body(store: KVMemoryStore) -> list[str]:
        paths = await store.list_paths(prefix, limit=limit)
        for problem in store.problems.take():
            # Listed on stderr: stdout stays one path per line for scripts.
            click.echo(f"skipped damaged record {problem.where}: {problem.detail}", err=True)
        return paths

    for path in await _with_store(ctx, body):
        click.echo(path)


@memory.command("cat")
@click.argument("path")
@click.option("--metadata", is_flag=True, help="Print the version and write metadata first.")
@click.pass_context
@run_async
async def cat(ctx: click.Context, path: str, metadata: bool) -> None:
    """Print the whole content of the file at PATH, however long."""
    from ..memory import read_whole

    found = await _with_store(ctx, lambda store: read_whole(store, path))
    if found is None:
        raise click.ClickException(f"no memory file {path!r} at {_shown(ctx)}")
    if metadata:
        click.echo(f"# version: {found.version}")
        for key, value in sorted((found.metadata or {}).items()):
            click.echo(f"# {key}: {value}")
    click.echo(found.content, nl=False)


@memory.command("rm")
@click.argument("path")
@click.pass_context
@run_async
async def rm(ctx: click.Context, path: str) -> None:
    """Delete the file at PATH (the version just read: a concurrent change makes it fail safely)."""

    async def body(store: KVMemoryStore) -> bool:
        from ..errors import CorruptRecordError

        try:
            current = await store.read(path, max_chars=1)
        except CorruptRecordError:
            # An undecodable record has no version to match: the store removes it only
            # unconditionally, keeping its bytes in the quarantine scope.
            await store.delete(path, expected_version=None)
            return True
        if current is None:
            return False
        await store.delete(path, expected_version=current.version)
        return True

    if not await _with_store(ctx, body):
        raise click.ClickException(f"no memory file {path!r} at {_shown(ctx)}")
    click.echo(f"deleted {path}")
