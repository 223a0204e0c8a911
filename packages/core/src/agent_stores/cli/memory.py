"""``agent-stores memory URL ls PREFIX | cat PATH | rm PATH | search PREFIX QUERY | reindex``:
browse, edit and search memory files."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..connection import open_memory
from ..options import MemoryOptions
from ..url import StoreURL
from .common import run_async, scope_prefix_option

if TYPE_CHECKING:
    from ..memory import KVMemoryStore, SearchConfig
    from ..memory._harness import MemorySearchResult
    from ..memory.semantic import ReindexReport

T = TypeVar("T")

_DEFAULT_PREFIX = "memory:"


@click.group()
@click.argument("url", metavar="URL")
@scope_prefix_option(_DEFAULT_PREFIX, "memory store")
@click.pass_context
def memory(ctx: click.Context, url: str, scope_prefix: str) -> None:
    """Browse and edit the memory files kept at URL (paths look like NAMESPACE/AGENT/MEMORY.md)."""
    ctx.obj = (url, scope_prefix)


async def _with_store(
    ctx: click.Context,
    body: Callable[[KVMemoryStore], Awaitable[T]],
    search: SearchConfig | None = None,
) -> T:
    url, scope_prefix = ctx.obj
    options: MemoryOptions = {"scope_prefix": scope_prefix}
    if search is not None:
        options["search"] = search
    try:
        async with open_memory(url, **options) as store:
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


_EMBEDDER_HELP = (
    "The Pydantic AI embedding model, e.g. openai:text-embedding-3-small (its provider's "
    "credentials come from the environment, as in Pydantic AI); wordllama (offline, the "
    "wordllama extra); or python:MODULE:NAME, a callable returning an Embedder or "
    "EmbeddingModel."
)


def _search_config(mode: str, embedder: str | None) -> SearchConfig | None:
    from ..memory import SearchConfig

    if mode == "lexical":
        return None
    if not embedder:
        raise click.UsageError(f"--mode {mode} needs --embedder (or $AGENT_STORES_EMBEDDER)")
    return SearchConfig(mode=mode, embedder=_embedder(embedder))  # type: ignore[arg-type]


def _embedder(spec: str) -> Any:
    """A Pydantic AI model name as given, WordLlama's shipped model for ``wordllama``, or
    what ``python:MODULE:NAME`` returns."""
    if spec == "wordllama":
        from ..memory.wordllama import WordLlamaEmbeddingModel

        try:
            return WordLlamaEmbeddingModel()
        except ImportError as exc:
            raise click.UsageError(str(exc)) from None
    if not spec.startswith("python:"):
        return spec
    module, _, name = spec.removeprefix("python:").partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise click.UsageError(f"--embedder {spec}: {exc}") from None
    return factory()


@memory.command("search")
@click.argument("prefix")
@click.argument("query")
@click.option(
    "--mode",
    type=click.Choice(["lexical", "semantic", "hybrid"]),
    default="lexical",
    show_default=True,
    help="Rank by terms, by meaning, or both fused.",
)
@click.option("--embedder", envvar="AGENT_STORES_EMBEDDER", help=_EMBEDDER_HELP)
@click.option("--limit", default=10, show_default=True, help="Show at most this many files.")
@click.option(
    "--max-files", default=1000, show_default=True, help="Consider at most this many files."
)
@click.pass_context
@run_async
async def search(
    ctx: click.Context,
    prefix: str,
    query: str,
    mode: str,
    embedder: str | None,
    limit: int,
    max_files: int,
) -> None:
    """Search the files directly below PREFIX (a directory, ending in /) for QUERY."""
    config = _search_config(mode, embedder)

    async def body(store: KVMemoryStore) -> MemorySearchResult:
        return await store.search(
            prefix,
            query,
            limit=limit,
            max_files=max_files,
            max_chars=100_000,
            max_file_chars=1_000_000,
            mode=mode,  # type: ignore[arg-type]
        )

    result = await _with_store(ctx, body, config)
    for match in result.matches:
        click.echo(f"{match.score:.4f}  {match.path}")
        click.echo("    " + match.snippet.replace("\n", "\n    "))
    click.echo(
        f"{len(result.matches)} match(es) among {result.scanned} file(s)"
        + (" (truncated)" if result.truncated else ""),
        err=True,
    )


@memory.command("reindex")
@click.argument("directory", default="")
@click.option("--embedder", envvar="AGENT_STORES_EMBEDDER", required=True, help=_EMBEDDER_HELP)
@click.pass_context
@run_async
async def reindex(ctx: click.Context, directory: str, embedder: str) -> None:
    """Embed every file under DIRECTORY (all when omitted) that has no vectors from the
    embedder's model, or stale ones. Resumable: run it again after an interruption."""
    config = _search_config("semantic", embedder)

    def progress(report: ReindexReport) -> None:
        click.echo(f"files {report.files}, embedded {report.embedded}", err=True)

    async def body(store: KVMemoryStore) -> ReindexReport:
        return await store.reindex(directory, progress=progress)

    report = await _with_store(ctx, body, config)
    changed = f", {len(report.skipped)} changed meanwhile" if report.skipped else ""
    click.echo(
        f"reindexed {report.files} file(s): {report.embedded} embedded, "
        f"{report.up_to_date} up to date{changed}"
    )
