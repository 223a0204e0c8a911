"""``agent-stores check [URL]``: can we reach the backend, and how fast is a CAS round trip."""

from __future__ import annotations

import time
import uuid

import click

from ..kv.base import within_deadline
from ..selection import open_kv
from ..url import StoreURL
from .common import resolve_url, run_async, url_argument


@click.command()
@url_argument()
@click.option("--rounds", default=5, show_default=True, help="How many CAS round trips to time.")
@run_async
async def check(url: str | None, rounds: int) -> None:
    """Connect to URL, do create/replace/get/delete in a throwaway scope, print latency.

    URL defaults to $AGENT_STORES_URL, else the embedded SQLite file. The URL is printed
    with its password hidden.
    """
    target = resolve_url(url)
    shown = StoreURL.parse(target).render()
    click.echo(f"checking {shown}")
    kv = open_kv(target)
    scope = f"agent-stores-check-{uuid.uuid4().hex}"
    created = False
    try:
        started = time.perf_counter()
        # Bounded like every call: a silent server is reported within the deadline.
        await within_deadline(kv, kv.setup())
        version = await kv.create(scope, "probe", b"0", ttl=300)
        created = True
        click.echo(
            f"  connected (setup and a first write) in "
            f"{(time.perf_counter() - started) * 1000:.1f} ms"
        )
        timings = []
        for i in range(1, rounds + 1):
            t0 = time.perf_counter()
            version = await kv.replace(
                scope, "probe", str(i).encode(), expected_version=version, ttl=300
            )
            timings.append((time.perf_counter() - t0) * 1000)
        entry = await kv.get(scope, "probe")
        if entry is None or entry.value != str(rounds).encode() or entry.version != version:
            raise click.ClickException("read-back after CAS did not match what was written")
        timings.sort()
        click.echo(
            f"  CAS round trip: median {timings[len(timings) // 2]:.2f} ms, "
            f"max {timings[-1]:.2f} ms over {rounds} rounds"
        )
        for warning in await _warnings(kv):
            click.secho(f"  warning: {warning}", fg="yellow")
        click.secho("  ok", fg="green")
    finally:
        try:
            if created:  # nothing to clean when the first write never happened
                await kv.drop_scope(scope)
        finally:
            await kv.aclose()


async def _warnings(kv: object) -> list[str]:
    """Backend-specific warnings (a backend may define ``async health_warnings()``)."""
    probe = getattr(kv, "health_warnings", None)
    if probe is None:
        return []
    return list(await probe())
