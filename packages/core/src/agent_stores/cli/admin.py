"""``agent-stores setup URL`` and ``agent-stores purge URL``."""

from __future__ import annotations

import click

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
@run_async
async def purge(url: str | None) -> None:
    """Physically delete expired entries (for backends without native TTL collection)."""
    target = resolve_url(url)
    async with open_kv(target) as kv:
        removed = await kv.purge_expired()
    click.echo(f"purged {removed} expired entries from {StoreURL.parse(target).render()}")
