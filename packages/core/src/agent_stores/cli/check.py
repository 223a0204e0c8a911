"""``agent-stores check [URL]``: can we reach the backend, and how fast is a round trip.

Read-only unless asked: a check must never be the thing that creates a billed table for
a misspelt name or a wrong region. ``--write`` adds a compare-and-set probe in a
throwaway scope (deleted again); ``--setup`` creates what is missing first, as
``agent-stores setup`` does.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import click

from ..errors import AppError
from ..kv.base import KVStore, within_deadline
from ..selection import open_kv
from ..url import StoreURL
from .common import resolve_url, run_async, url_argument


@click.command()
@url_argument()
@click.option("--rounds", default=5, show_default=True, help="How many round trips to time.")
@click.option(
    "--write",
    is_flag=True,
    help="Also time compare-and-set writes in a throwaway scope (deleted afterwards).",
)
@click.option(
    "--setup",
    "run_setup",
    is_flag=True,
    help="Create the table / container / schema first if missing (as `agent-stores setup`).",
)
@run_async
async def check(url: str | None, rounds: int, write: bool, run_setup: bool) -> None:
    """Connect to URL and time read round trips; creates nothing unless asked.

    By default only reads (a missing table, container or database file is reported,
    never created). ``--write`` also times create/replace/get in a throwaway scope,
    ``--setup`` first creates what is missing. URL defaults to $AGENT_STORES_URL, else
    the embedded SQLite file; it is printed with its password hidden.
    """
    target = resolve_url(url)
    shown = StoreURL.parse(target).render()
    click.echo(f"checking {shown}")
    kv = open_kv(target)
    try:
        await _check(kv, shown, rounds=rounds, write=write, run_setup=run_setup)
    finally:
        await kv.aclose()


async def _check(kv: KVStore, shown: str, *, rounds: int, write: bool, run_setup: bool) -> None:
    missing = _missing_file(kv)
    if missing is not None and not run_setup:
        raise click.ClickException(
            f"{shown}: the database file {missing} does not exist (check creates nothing); "
            "create it with --setup, `agent-stores setup URL`, or by opening any store on it"
        )
    # Bounded like every call: a silent server is reported within the deadline.
    started = time.perf_counter()
    if run_setup:
        await within_deadline(kv, kv.setup())
        click.echo(f"  set up in {(time.perf_counter() - started) * 1000:.1f} ms")
        started = time.perf_counter()
    scope = f"agent-stores-check-{uuid.uuid4().hex}"
    await kv.get(scope, "probe")
    # Printed only now: the first read answered, so the server, credentials and table are real.
    click.echo(f"  connected (a first read) in {(time.perf_counter() - started) * 1000:.1f} ms")
    reads = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await kv.get(scope, "probe")
        reads.append((time.perf_counter() - t0) * 1000)
    click.echo(f"  read round trip: {_spread(reads)}")
    if write:
        await _write_probe(kv, scope, rounds)
    await _vector_index(kv, probe=write or run_setup)
    for warning in await _warnings(kv):
        click.secho(f"  warning: {warning}", fg="yellow")
    click.secho("  ok", fg="green")


async def _write_probe(kv: KVStore, scope: str, rounds: int) -> None:
    created = False
    failed = False
    try:
        version = await kv.create(scope, "probe", b"0", ttl=300)
        created = True
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
        click.echo(f"  CAS round trip: {_spread(timings)}")
    except BaseException:
        failed = True
        raise
    finally:
        if created:  # nothing to clean when the first write never happened
            try:
                await kv.drop_scope(scope)
            except AppError as exc:
                # The first error is the one to report; the probe expires in 5 minutes anyway.
                if not failed:
                    click.secho(
                        f"  warning: could not delete the probe scope {scope} "
                        f"({exc.code}); it expires within 5 minutes",
                        fg="yellow",
                    )


async def _vector_index(kv: KVStore, *, probe: bool) -> None:
    """Say which index memory search by meaning uses here: the backend's native one, or
    the generic path and why. Probing may create the index's tables (or the database
    extension), so only with --write or --setup."""
    port = kv.ports.vector
    if port is None:
        click.echo(
            "  memory search by meaning: generic path (this backend has no native vector index)"
        )
        return
    if not probe:
        click.echo(
            f"  memory search by meaning: {port.name} offered, not probed (it creates its "
            "tables on first use; --setup or --write probes it)"
        )
        return
    reason = await port.unavailable()
    if reason is None:
        click.echo(f"  memory search by meaning: native {port.name} index")
    else:
        click.secho(
            f"  memory search by meaning: generic path, {port.name} unavailable: {reason}",
            fg="yellow",
        )


def _spread(timings: list[float]) -> str:
    if not timings:
        return "not timed (--rounds 0)"
    ordered = sorted(timings)
    return (
        f"median {ordered[len(ordered) // 2]:.2f} ms, max {ordered[-1]:.2f} ms "
        f"over {len(ordered)} rounds"
    )


def _missing_file(kv: KVStore) -> Path | None:
    """The embedded database file when it does not exist yet (opening it would create it)."""
    from ..backends.sqlite import SQLiteKV

    if isinstance(kv, SQLiteKV):
        path = Path(kv.path).expanduser()
        return None if path.exists() else path
    return None


async def _warnings(kv: object) -> list[str]:
    """Backend-specific warnings (a backend may define ``async health_warnings()``)."""
    probe = getattr(kv, "health_warnings", None)
    if probe is None:
        return []
    return list(await probe())
