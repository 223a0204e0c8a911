"""The KV CAS contract: what every backend's primitives guarantee.

Each test's docstring states the guarantee it checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agent_stores import (
    ConflictError,
    Entry,
    InvalidIdError,
    KVStore,
    ResourceClosedError,
    StoreURL,
    UnsupportedError,
    ValueTooLargeError,
)
from agent_stores.kv import Check, Create, Delete, Operation, Replace

from .base import CAPABILITY_SKIP, ContractBase, KVFactory, require_capability
from .kv_model import CLOCK_STEP, run_model
from .linearizability import (
    History,
    LinearizabilityViolation,
    by_process,
    check_history,
    concurrent_pairs,
    run_with_processes,
    run_workload,
)

pytestmark = pytest.mark.asyncio

AWKWARD_IDS = [
    "a/b",
    "a%2Fb",
    "a%b",
    "{a}",
    "{a}:b",
    "a:b",
    "..",
    "../x",
    ".",
    "a b",
    " a",
    "a ",
    "é",
    "e\u0301",
    "日本語",
    "😀",
    "a\\b",
    "a#b",
    "a?b=c&d",
    "'; DROP TABLE x; --",
    "*",
    "[a]",
    "x" * 500,
    "y" * 499 + "/",
]


@dataclass(frozen=True)
class Win:
    """One successful compare-and-swap increment: the version it replaced and the result."""

    replaced: str
    version: str
    value: int


def check_counter_history(initial: str, wins: list[Win], final: Entry | None, total: int) -> None:
    """The increments form one chain from ``initial`` to ``final``: a linearizable counter.

    Each version is replaced at most once (no two swaps won on the same version), each
    swap wrote the value before it plus one, every success is in the chain, and the final
    entry is the chain's end holding the number of successes.
    """
    assert len(wins) == total, f"{len(wins)} increments reported, {total} expected"
    successor: dict[str, Win] = {}
    for win in wins:
        assert win.replaced not in successor, (
            f"two swaps won on version {win.replaced}: {successor[win.replaced]} and {win}"
        )
        successor[win.replaced] = win
    version, value, steps = initial, 0, 0
    # Bounded by the number of wins: a backend that hands out a version again would
    # otherwise send this walk round a cycle forever.
    while version in successor and steps <= total:
        win = successor[version]
        assert win.value == value + 1, f"swap {win} did not increment {value}"
        version, value, steps = win.version, win.value, steps + 1
    assert steps == total, f"only {steps} of {total} successful swaps form one history"
    assert final is not None and final.version == version and int(final.value) == total, (
        f"final entry {final!r} is not the end of the history ({version}, {total})"
    )


async def run_workers(
    command: str, *args: str, barrier: Path, processes: int
) -> list[list[dict[str, Any]]]:
    """Run ``processes`` copies of a worker behind a file barrier; their JSON lines, per worker."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent_stores_contract.workers",
            command,
            *args,
            "--barrier",
            str(barrier),
            str(processes),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(processes)
    ]
    outputs = [await p.communicate() for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()[-3000:]
    return [
        [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        for out, _ in outputs
    ]


def offset_clock(kv: KVStore, seconds: float) -> None:
    """Move the store's clock forward by ``seconds`` (expiry is decided by the core's clock)."""
    base = kv.clock
    kv.clock = lambda: base() + seconds


def hold_clock(kv: KVStore, at: float) -> None:
    """Stop the store's clock at ``at``, so a test can stand exactly on an expiry boundary."""
    kv.clock = lambda: at


def boundary_start(kv: KVStore, skew: float = 0.0) -> float:
    """A clock reading for a boundary test, ``skew`` seconds from the store's clock.

    A quarter past a whole second: every ``start + ttl`` and every step of
    :data:`CLOCK_STEP` around it is an exact binary fraction, so ``expires_at == now``
    holds exactly on every backend, and a backend that rounds ``now`` to whole seconds
    is caught.
    """
    return float(int(kv.clock() + skew)) + 0.25


class KVContract(ContractBase):
    """The KV CAS contract. Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    # -- create / replace / delete ------------------------------------------------------

    async def test_create_then_get(self, kv: KVStore, ns: str) -> None:
        """create writes a value readable by get, with the version create returned."""
        version = await kv.create(ns, "k", b"hello")
        entry = await kv.get(ns, "k")
        assert entry is not None
        assert entry.value == b"hello"
        assert entry.version == version
        assert entry.expires_at is None
        assert await kv.get(ns, "missing") is None

    async def test_create_conflicts_when_present(self, kv: KVStore, ns: str) -> None:
        """create on a live key raises ConflictError and leaves the value unchanged."""
        await kv.create(ns, "k", b"1")
        with pytest.raises(ConflictError):
            await kv.create(ns, "k", b"2")
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.value == b"1"

    async def test_replace_requires_current_version(self, kv: KVStore, ns: str) -> None:
        """replace succeeds only with the current version; a stale version conflicts and writes nothing."""
        v1 = await kv.create(ns, "k", b"1")
        v2 = await kv.replace(ns, "k", b"2", expected_version=v1)
        with pytest.raises(ConflictError):
            await kv.replace(ns, "k", b"stale", expected_version=v1)
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.value == b"2" and entry.version == v2

    async def test_replace_absent_conflicts(self, kv: KVStore, ns: str) -> None:
        """replace of a missing key raises ConflictError and does not create it."""
        with pytest.raises(ConflictError):
            await kv.replace(ns, "k", b"x", expected_version="no-such-version")
        assert await kv.get(ns, "k") is None

    async def test_delete_conditional(self, kv: KVStore, ns: str) -> None:
        """delete with a stale version does nothing and reports False; with the current version it deletes."""
        v1 = await kv.create(ns, "k", b"1")
        v2 = await kv.replace(ns, "k", b"2", expected_version=v1)
        assert await kv.delete(ns, "k", expected_version=v1) is False
        assert await kv.get(ns, "k") is not None
        assert await kv.delete(ns, "k", expected_version=v2) is True
        assert await kv.get(ns, "k") is None
        assert await kv.delete(ns, "k", expected_version=v2) is False

    async def test_delete_unconditional(self, kv: KVStore, ns: str) -> None:
        """delete without a version removes a live entry (True) and reports False when absent."""
        await kv.create(ns, "k", b"1")
        assert await kv.delete(ns, "k") is True
        assert await kv.get(ns, "k") is None
        assert await kv.delete(ns, "k") is False

    async def test_versions_never_reused(self, kv: KVStore, ns: str) -> None:
        """Every write yields a fresh version, also after delete + create; an old version never matches again."""
        seen: set[str] = set()
        version = await kv.create(ns, "k", b"0")
        seen.add(version)
        for i in range(1, 20):
            version = await kv.replace(ns, "k", str(i).encode(), expected_version=version)
            assert version not in seen
            seen.add(version)
        first_generation = set(seen)
        for _ in range(10):
            assert await kv.delete(ns, "k")
            version = await kv.create(ns, "k", b"again")
            assert version not in seen
            seen.add(version)
        for old in first_generation:
            with pytest.raises(ConflictError):
                await kv.replace(ns, "k", b"resurrected", expected_version=old)

    async def test_binary_values_round_trip(self, kv: KVStore, ns: str) -> None:
        """Values are arbitrary bytes: every byte value, and the empty value, round-trip exactly."""
        blob = bytes(range(256)) * 4
        await kv.create(ns, "blob", blob)
        await kv.create(ns, "empty", b"")
        got = await kv.get(ns, "blob")
        assert got is not None and got.value == blob
        empty = await kv.get(ns, "empty")
        assert empty is not None and empty.value == b""

    async def test_get_many(self, kv: KVStore, ns: str) -> None:
        """get_many returns the live entries of the keys asked for; missing and expired keys are omitted."""
        versions = {f"k{i}": await kv.create(ns, f"k{i}", f"v{i}".encode()) for i in range(30)}
        await kv.create(ns, "short", b"x", ttl=5)
        offset_clock(kv, 10)
        found = await kv.get_many(ns, [*versions, "missing", "short", "k0"])
        assert set(found) == set(versions)
        for key, version in versions.items():
            assert found[key].version == version
            assert found[key].value == f"v{key[1:]}".encode()
        assert await kv.get_many(ns, []) == {}

    async def test_two_clients_share_data(self, kv_factory: KVFactory, ns: str) -> None:
        """Two clients opened on the same backend see each other's writes and conflict with each other."""
        a, b = kv_factory(), kv_factory()
        try:
            v = await a.create(ns, "k", b"from-a")
            entry = await b.get(ns, "k")
            assert entry is not None and entry.value == b"from-a" and entry.version == v
            with pytest.raises(ConflictError):
                await b.create(ns, "k", b"from-b")
        finally:
            await a.aclose()
            await b.aclose()

    # -- concurrency ----------------------------------------------------------------------

    async def test_concurrent_cas_one_key(self, kv_factory: KVFactory, ns: str) -> None:
        """16 tasks CAS-incrementing one key really interleave, and the history is linearizable: one winner per version, no lost increment."""
        clients = [kv_factory() for _ in range(4)]
        initial = await clients[0].create(ns, "counter", b"0")
        # Every round costs as many swaps as there are contenders: 16 keeps slow
        # emulators within the deadline and still forces 15 conflicts in the first round.
        tasks, per_task = 16, 4
        wins: list[Win] = []
        conflicts = 0
        # Every task reads the same version before any of them writes: a correct store
        # must then refuse all but one of the first round's swaps.
        barrier = asyncio.Barrier(tasks)

        async def worker(client: KVStore) -> None:
            nonlocal conflicts
            done, first = 0, True
            while done < per_task:
                entry = await client.get(ns, "counter")
                assert entry is not None
                if first:
                    first = False
                    await barrier.wait()
                value = int(entry.value) + 1
                try:
                    version = await client.replace(
                        ns, "counter", str(value).encode(), expected_version=entry.version
                    )
                except ConflictError:
                    conflicts += 1
                    # A swap loses only to another task's win since its read: far more
                    # conflicts than that means swaps on the current version fail.
                    assert conflicts <= tasks * tasks * per_task, (
                        f"{conflicts} conflicts for {len(wins)} wins: a swap on the "
                        "current version keeps failing"
                    )
                    continue
                wins.append(Win(entry.version, version, value))
                done += 1

        try:
            await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(tasks)))
            assert conflicts >= tasks - 1, (
                f"only {conflicts} conflicts: the tasks did not run concurrently, so this "
                "test proved nothing (a backend must suspend on every round trip)"
            )
            final = await clients[0].get(ns, "counter")
            check_counter_history(initial, wins, final, tasks * per_task)
        finally:
            for client in clients:
                await client.aclose()

    async def test_concurrent_create_single_winner(self, kv_factory: KVFactory, ns: str) -> None:
        """50 tasks creating the same absent key at the same moment: exactly one succeeds, 49 conflict, the winner's value is stored."""
        clients = [kv_factory() for _ in range(5)]
        tasks = 50
        barrier = asyncio.Barrier(tasks)

        async def attempt(i: int) -> tuple[int, str] | None:
            client = clients[i % 5]
            assert await client.get(ns, "once") is None
            await barrier.wait()
            try:
                return i, await client.create(ns, "once", str(i).encode())
            except ConflictError:
                return None

        try:
            outcomes = await asyncio.gather(*(attempt(i) for i in range(tasks)))
            results = [r for r in outcomes if r is not None]
            assert len(results) == 1, f"{len(results)} creates of one key won"
            winner, version = results[0]
            entry = await clients[0].get(ns, "once")
            assert (
                entry is not None
                and entry.value == str(winner).encode()
                and entry.version == version
            )
        finally:
            for client in clients:
                await client.aclose()

    async def test_multiprocess_cas_one_key(
        self, kv: KVStore, store_url: str, ns: str, tmp_path: Path
    ) -> None:
        """4 OS processes released by a barrier CAS-increment one key: they interleave (conflicts, switches) and the history is linearizable."""
        require_capability(
            kv,
            "shared_across_processes",
            "process-local: there is no data for a second process to share",
        )
        initial = await kv.create(ns, "counter", b"0")
        processes, per_process = 4, 25
        outputs = await run_workers(
            "kv-increment",
            store_url,
            ns,
            "counter",
            str(per_process),
            barrier=tmp_path,
            processes=processes,
        )
        wins: list[Win] = []
        conflicts = 0
        owner: dict[int, int] = {}
        for worker, lines in enumerate(outputs):
            for line in lines:
                if "conflicts" in line:
                    conflicts += int(line["conflicts"])
                    continue
                wins.append(Win(line["replaced"], line["version"], line["value"]))
                owner[int(line["value"])] = worker
        assert conflicts >= processes - 1, (
            f"only {conflicts} conflicts: the processes did not run concurrently"
        )
        switches = sum(1 for v in range(2, len(owner) + 1) if owner.get(v) != owner.get(v - 1))
        assert switches >= processes - 1, f"the processes took turns only {switches} times"
        final = await kv.get(ns, "counter")
        check_counter_history(initial, wins, final, processes * per_process)

    async def test_multiprocess_create_single_winner(
        self, kv: KVStore, store_url: str, ns: str, tmp_path: Path
    ) -> None:
        """4 OS processes released by a barrier create one absent key: exactly one wins and its value is stored."""
        require_capability(
            kv,
            "shared_across_processes",
            "process-local: there is no data for a second process to share",
        )
        processes = 4
        outputs = await run_workers(
            "kv-create", store_url, ns, "once", barrier=tmp_path, processes=processes
        )
        results = [line for lines in outputs for line in lines]
        assert len(results) == processes
        won = [r for r in results if r["won"]]
        assert len(won) == 1, f"{len(won)} processes created the same key"
        entry = await kv.get(ns, "once")
        assert entry is not None and entry.version == won[0]["version"]
        assert entry.value == str(won[0]["pid"]).encode()

    # -- linearizability --------------------------------------------------------------------

    async def test_linearizable_under_concurrency(
        self, kv: KVStore, kv_factory: KVFactory, ns: str, request: pytest.FixtureRequest
    ) -> None:
        """8 tasks (plus 2 OS processes where the data is shared across processes) doing random get, get_many, create, replace, delete and commit on 4 hot keys leave a linearizable history.

        Every call's invocation, response and result is recorded and the whole history is
        checked against the sequential KV model (``agent_stores_contract.linearizability``:
        a Wing & Gong search, as Knossos and Porcupine do), so two conditional writes that
        both pass, a stale read or a torn commit fail with the smallest offending window.
        """
        scope, seed = f"{ns}-lin", ns
        clients = [kv_factory() for _ in range(4)]
        history = History()
        tasks, ops = 8, 30
        use_commit = kv.capabilities.commit

        async def local() -> None:
            await run_workload(
                clients, scope, history, tasks=tasks, ops=ops, seed=seed, use_commit=use_commit
            )

        processes, per_process = 0, 0
        try:
            if kv.capabilities.shared_across_processes:
                processes, per_process = 2, 2
                await run_with_processes(
                    request.getfixturevalue("store_url"),
                    scope,
                    history,
                    local,
                    processes=processes,
                    tasks=per_process,
                    ops=20,
                    seed=seed,
                    use_commit=use_commit,
                )
            else:
                await local()
        finally:
            for client in clients:
                await client.aclose()
        assert len(history) == tasks * ops + processes * per_process * 20
        try:
            report = check_history(history)
        except LinearizabilityViolation as exc:
            raise LinearizabilityViolation(f"(workload seed {seed!r}) {exc}") from None
        assert report.concurrent_pairs > 0, "no two calls overlapped: the check proved nothing"
        if processes:
            assert concurrent_pairs(by_process(history.ops)) > 0, (
                "the processes never ran at the same time"
            )
        definite = report.operations - report.unknown
        assert definite >= 0.75 * report.operations, (
            f"only {definite} of {report.operations} calls had an outcome: {report.by_outcome}"
        )

    async def test_linearizable_under_faults(self, kv: KVStore, ns: str, store_url: str) -> None:
        """The same workload through the backend's own fault injector (20 % of requests faulted: throttling, conflicts, resets, lost replies) still leaves a linearizable history.

        A call that fails with an unknown outcome may or may not have taken effect, any
        time after its call (as in Knossos); a refusal may echo the caller's own write
        resent by its SDK (applied within the call, or refused). Stale reads and
        blackholes are not injected here: a read from a lagging replica is a consistency
        level, not a race, and a blackhole only ends at the deadline. Skipped (listed in
        the summary) when the backend's plugin offers no ``fault_injector``.
        """
        from agent_stores.faults import FaultKind
        from agent_stores.plugins import get_registry

        url = StoreURL.parse(store_url)
        injector = get_registry().hook.fault_injector(url=url)
        if injector is None:
            pytest.skip(
                f"{CAPABILITY_SKIP} fault_injector=None ({kv.backend_name}): the backend's "
                "plugin offers no fault injector (the fault_injector hook)"
            )
        faults = [
            name
            for name, kind in injector.faults.items()
            if kind not in (FaultKind.BLACKHOLE, FaultKind.STALE_READ)
        ]
        scope, seed = f"{ns}-linf", ns
        clients = [await injector.open_kv(url) for _ in range(4)]
        history = History()
        try:
            injector.set_rate(0.2, faults, seed=random.Random(seed).randrange(1 << 30))
            await run_workload(
                clients,
                scope,
                history,
                tasks=8,
                ops=30,
                seed=seed,
                use_commit=kv.capabilities.commit,
            )
        finally:
            injector.set_rate(0.0)
            for client in clients:
                await client.aclose()
        injected = injector.injected()
        assert sum(injected.values()) > 0, "the injector injected nothing: the run proved nothing"
        try:
            # An injector whose client re-sends writes it cannot stop (the core's KV-level
            # one models a naive client library; botocore against moto) declares it: a
            # write applied once more within its own call is tolerated there. Every other
            # backend gets the strict check: its store must never apply a call twice.
            report = check_history(
                history, resent_writes=bool(getattr(injector, "resends_writes", False))
            )
        except LinearizabilityViolation as exc:
            raise LinearizabilityViolation(
                f"(workload seed {seed!r}, faults injected {injected}) {exc}"
            ) from None
        assert report.concurrent_pairs > 0, "no two calls overlapped: the check proved nothing"
        definite = report.operations - report.unknown
        assert definite >= 0.5 * report.operations, (
            f"only {definite} of {report.operations} calls had an outcome: {report.by_outcome}"
        )

    # -- TTL ------------------------------------------------------------------------------

    async def test_ttl_entry_expires(self, kv: KVStore, ns: str) -> None:
        """An entry past its TTL reads as absent (get, scan); before it, it is visible with expires_at set."""
        before = kv.clock()
        await kv.create(ns, "k", b"v", ttl=60)
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.expires_at is not None
        assert before + 59 <= entry.expires_at <= kv.clock() + 61
        offset_clock(kv, 61)
        assert await kv.get(ns, "k") is None
        assert await kv.scan(ns) == []

    async def test_ttl_real_time(self, kv: KVStore, ns: str) -> None:
        """A short real TTL expires with the passing of real time, without clock tricks."""
        await kv.create(ns, "k", b"v", ttl=0.4)
        assert await kv.get(ns, "k") is not None
        deadline = time.monotonic() + 5
        while await kv.get(ns, "k") is not None:
            assert time.monotonic() < deadline, "entry never expired"
            await asyncio.sleep(0.1)

    async def test_create_over_expired_entry(self, kv: KVStore, ns: str) -> None:
        """create succeeds over an expired entry, with a new version; the expired version is dead."""
        old = await kv.create(ns, "k", b"old", ttl=10)
        offset_clock(kv, 11)
        new = await kv.create(ns, "k", b"new")
        assert new != old
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.value == b"new" and entry.expires_at is None

    async def test_expired_entry_cannot_be_replaced_or_deleted(self, kv: KVStore, ns: str) -> None:
        """replace and conditional delete treat an expired entry as absent."""
        version = await kv.create(ns, "k", b"v", ttl=10)
        offset_clock(kv, 11)
        with pytest.raises(ConflictError):
            await kv.replace(ns, "k", b"w", expected_version=version)
        assert await kv.delete(ns, "k", expected_version=version) is False
        assert await kv.get(ns, "k") is None

    async def test_replace_sets_new_ttl(self, kv: KVStore, ns: str) -> None:
        """replace applies its own ttl: None clears expiry, a ttl sets a new one."""
        v1 = await kv.create(ns, "k", b"1", ttl=10)
        v2 = await kv.replace(ns, "k", b"2", expected_version=v1)
        offset_clock(kv, 20)
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.version == v2 and entry.expires_at is None
        await kv.replace(ns, "k", b"3", expected_version=v2, ttl=10)
        offset_clock(kv, 11)
        assert await kv.get(ns, "k") is None

    # -- scan -----------------------------------------------------------------------------

    async def test_scan_byte_order(self, kv: KVStore, ns: str) -> None:
        """scan returns keys in byte (code point) order, with their entries."""
        keys = [
            "b",
            "a",
            "B",
            "a0",
            "a/",
            "a-",
            "aa",
            "Z",
            "0",
            "~",
            "é",
            "日",
            "😀",
            "a\u00ff",
            "a\u0100",
        ]
        for key in keys:
            await kv.create(ns, key, key.encode())
        items = await kv.scan(ns, limit=100)
        assert [i.key for i in items] == sorted(keys, key=lambda k: k.encode())
        for item in items:
            assert item.entry is not None and item.entry.value == item.key.encode()

    async def test_scan_prefix_boundaries(self, kv: KVStore, ns: str) -> None:
        """A prefix returns exactly the keys that start with it: 'u1/' never leaks 'u10/…'."""
        for key in ["u1/a", "u1/b", "u10/a", "u1", "u2/a", "u1.x", "u1/\uffff", "u0/z"]:
            await kv.create(ns, key, b"x")
        assert [i.key for i in await kv.scan(ns, prefix="u1/")] == ["u1/a", "u1/b", "u1/\uffff"]
        assert [i.key for i in await kv.scan(ns, prefix="u1")] == [
            "u1",
            "u1.x",
            "u1/a",
            "u1/b",
            "u1/\uffff",
            "u10/a",
        ]
        assert await kv.scan(ns, prefix="u3") == []

    async def test_scan_pagination(self, kv: KVStore, ns: str) -> None:
        """start_after and limit page through a scope: every key once, in order, pages of at most limit."""
        keys = [f"k{i:03d}" for i in range(57)]
        for key in reversed(keys):
            await kv.create(ns, key, b"v")
        seen: list[str] = []
        start_after: str | None = None
        # Bounded: a backend whose pages never end fails here, not at the test's timeout.
        for _ in range(len(keys) // 10 + 2):
            page = await kv.scan(ns, start_after=start_after, limit=10)
            assert len(page) <= 10
            seen += [i.key for i in page]
            if len(page) < 10:
                break
            start_after = page[-1].key
        else:
            raise AssertionError(f"paging by 10 never ended: {len(seen)} keys so far")
        assert seen == keys
        assert [i.key for i in await kv.scan(ns, start_after="k050", limit=3)] == [
            "k051",
            "k052",
            "k053",
        ]
        assert [i.key for i in await kv.scan(ns, prefix="k05", start_after="k054")] == [
            "k055",
            "k056",
        ]
        assert [i.key async for i in kv.iter_scan(ns, page_size=7)] == keys

    async def test_scan_start_after_outside_prefix(self, kv: KVStore, ns: str) -> None:
        """start_after before the prefix range starts at the prefix; after it returns nothing."""
        for key in ["a1", "b1", "b2", "c1"]:
            await kv.create(ns, key, b"v")
        assert [i.key for i in await kv.scan(ns, prefix="b", start_after="a9")] == ["b1", "b2"]
        assert await kv.scan(ns, prefix="b", start_after="b9") == []

    async def test_scan_skips_expired_and_values_flag(self, kv: KVStore, ns: str) -> None:
        """Expired entries never show in scan; values=False returns keys without entries."""
        await kv.create(ns, "a", b"1")
        await kv.create(ns, "b", b"2", ttl=10)
        await kv.create(ns, "c", b"3")
        offset_clock(kv, 11)
        assert [i.key for i in await kv.scan(ns)] == ["a", "c"]
        keys_only = await kv.scan(ns, values=False)
        assert [i.key for i in keys_only] == ["a", "c"]
        assert all(i.entry is None for i in keys_only)

    # -- ids ------------------------------------------------------------------------------

    async def test_awkward_ids_never_collide(self, kv: KVStore, ns: str) -> None:
        """Ids with / % { } .. spaces, unicode and 500 characters are stored injectively as scopes and keys."""
        for i, key in enumerate(AWKWARD_IDS):
            await kv.create(ns, key, f"key-{i}".encode())
        items = await kv.scan(ns, limit=1000)
        assert sorted(i.key for i in items) == sorted(AWKWARD_IDS)
        for i, key in enumerate(AWKWARD_IDS):
            entry = await kv.get(ns, key)
            assert entry is not None and entry.value == f"key-{i}".encode()
        for i, ident in enumerate(AWKWARD_IDS):
            scope = (ns + ident)[: kv.limits.max_scope_chars]
            await kv.create(scope, "k", f"scope-{i}".encode())
        for i, ident in enumerate(AWKWARD_IDS):
            scope = (ns + ident)[: kv.limits.max_scope_chars]
            assert [x.key for x in await kv.scan(scope)] == ["k"]
            entry = await kv.get(scope, "k")
            assert entry is not None and entry.value == f"scope-{i}".encode()

    async def test_ids_never_escape_their_scope(self, kv: KVStore, ns: str) -> None:
        """(scope 'a', key 'b/c') and (scope 'a/b', key 'c') and similar pairs are distinct entries."""
        pairs = [
            (f"{ns}a", "b/c"),
            (f"{ns}a/b", "c"),
            (f"{ns}a:b", "c"),
            (f"{ns}a", "b:c"),
            (f"{ns}{{a}}", "b"),
            (f"{ns}a", "{b}"),
            (f"{ns}a/..", "b"),
            (f"{ns}a", "../b"),
        ]
        for i, (scope, key) in enumerate(pairs):
            await kv.create(scope, key, str(i).encode())
        for i, (scope, key) in enumerate(pairs):
            entry = await kv.get(scope, key)
            assert entry is not None and entry.value == str(i).encode()
        assert [i.key for i in await kv.scan(f"{ns}a")] == sorted(
            ["b/c", "b:c", "{b}", "../b"], key=str.encode
        )
        await kv.drop_scope(f"{ns}a")
        assert await kv.get(f"{ns}a/b", "c") is not None

    async def test_invalid_ids_rejected(self, kv: KVStore, ns: str) -> None:
        """Empty, over-long or NUL-containing ids raise InvalidIdError (a ValueError) and write nothing."""
        too_long = "k" * (kv.limits.max_key_chars + 1)
        for scope, key in [
            ("", "k"),
            (ns, ""),
            (ns, too_long),
            ("s" * (kv.limits.max_scope_chars + 1), "k"),
            (ns, "a\x00b"),
        ]:
            with pytest.raises(InvalidIdError):
                await kv.create(scope, key, b"v")
            with pytest.raises(ValueError):
                await kv.get(scope, key)
        assert await kv.scan(ns) == []

    async def test_oversized_value_rejected(self, kv: KVStore, ns: str) -> None:
        """A value over limits.max_value_bytes raises ValueTooLargeError and writes nothing; one at the limit fits."""
        limit = kv.limits.max_value_bytes
        with pytest.raises(ValueTooLargeError):
            await kv.create(ns, "big", b"x" * (limit + 1))
        assert await kv.get(ns, "big") is None
        version = await kv.create(ns, "big", b"y" * limit)
        with pytest.raises(ValueTooLargeError):
            await kv.replace(ns, "big", b"z" * (limit + 1), expected_version=version)
        entry = await kv.get(ns, "big")
        assert entry is not None and entry.version == version and len(entry.value) == limit

    # -- scopes ---------------------------------------------------------------------------

    async def test_drop_scope(self, kv: KVStore, ns: str) -> None:
        """drop_scope deletes every entry of the scope and nothing of any other scope."""
        for i in range(25):
            await kv.create(f"{ns}-x", f"k{i}", b"v")
        await kv.create(f"{ns}-xy", "k", b"v")
        await kv.create(f"{ns}-w", "k", b"v")
        assert await kv.drop_scope(f"{ns}-x") >= 25
        assert await kv.scan(f"{ns}-x") == []
        assert await kv.get(f"{ns}-xy", "k") is not None
        assert await kv.get(f"{ns}-w", "k") is not None
        await kv.create(f"{ns}-x", "k0", b"again")

    async def test_scopes_listing(self, kv: KVStore, ns: str) -> None:
        """scopes lists scopes with live entries under a prefix, in byte order, paginated."""
        names = [f"{ns}/s{i:02d}" for i in range(12)]
        for name in reversed(names):
            await kv.create(name, "k", b"v")
        await kv.create(f"{ns}/s99", "k", b"v", ttl=10)
        await kv.create(f"{ns}x", "k", b"v")
        offset_clock(kv, 11)
        assert await kv.scopes(prefix=f"{ns}/", limit=100) == names
        first = await kv.scopes(prefix=f"{ns}/", limit=5)
        assert first == names[:5]
        assert await kv.scopes(prefix=f"{ns}/", start_after=first[-1], limit=5) == names[5:10]

    async def test_iter_scopes_walks_every_live_scope_once(self, kv: KVStore, ns: str) -> None:
        """iter_scopes yields each scope with a live entry under the prefix exactly once, in pages of any size; expired, dropped and other scopes never."""
        names = {f"{ns}/w{i:02d}" for i in range(23)}
        for name in sorted(names):
            for key in ("a", "b", "c"):  # several entries: a scope must still come once
                await kv.create(name, key, b"v")
        await kv.create(f"{ns}/expired", "k", b"v", ttl=10)
        await kv.create(f"{ns}/dropped", "k", b"v")
        await kv.drop_scope(f"{ns}/dropped")
        await kv.create(f"{ns}x", "k", b"v")
        offset_clock(kv, 11)
        for page_size in (1, 4, 500):
            walked = [s async for s in kv.iter_scopes(prefix=f"{ns}/", page_size=page_size)]
            assert sorted(walked) == sorted(names), page_size
            assert len(walked) == len(set(walked)), page_size
        with pytest.raises(ValueError):
            async for _ in kv.iter_scopes(prefix=ns, page_size=0):
                pass

    async def test_iter_scopes_during_writes(self, kv: KVStore, ns: str) -> None:
        """A scope live for a whole walk is yielded even while other scopes are created and dropped during it."""
        steady = {f"{ns}/steady{i:02d}" for i in range(12)}
        for name in steady:
            await kv.create(name, "k", b"v")
        walked: list[str] = []
        churned = 0
        async for scope in kv.iter_scopes(prefix=f"{ns}/", page_size=2):
            walked.append(scope)
            await kv.create(f"{ns}/new{churned:03d}", "k", b"v")
            await kv.drop_scope(f"{ns}/new{max(churned - 1, 0):03d}")
            churned += 1
        assert steady <= set(walked)
        assert len(walked) == len(set(walked))

    # -- commit ---------------------------------------------------------------------------

    async def test_commit_all_or_nothing(self, kv: KVStore, ns: str) -> None:
        """Where commit is advertised, a batch with one failing condition writes nothing; a good batch writes all.

        Without the capability, commit raises UnsupportedError.
        """
        if not kv.capabilities.commit:
            with pytest.raises(UnsupportedError):
                await kv.commit(ns, [Create("a", b"1")])
            return
        va = await kv.create(ns, "a", b"1")
        vb = await kv.create(ns, "b", b"1")
        with pytest.raises(ConflictError) as info:
            await kv.commit(
                ns,
                [
                    Replace("a", b"2", va),
                    Create("c", b"1"),
                    Replace("b", b"2", "stale"),
                    Delete("d", None),
                ],
            )
        assert info.value.index == 2
        a, b = await kv.get(ns, "a"), await kv.get(ns, "b")
        assert a is not None and a.version == va and a.value == b"1"
        assert b is not None and b.version == vb
        assert await kv.get(ns, "c") is None
        results = await kv.commit(
            ns, [Replace("a", b"2", va), Create("c", b"1"), Delete("b", vb), Check("d", None)]
        )
        assert (
            results[0] is not None
            and results[1] is not None
            and results[2] is None
            and results[3] is None
        )
        a = await kv.get(ns, "a")
        assert a is not None and a.value == b"2" and a.version == results[0]
        assert await kv.get(ns, "b") is None
        c = await kv.get(ns, "c")
        assert c is not None and c.version == results[1]
        with pytest.raises(ConflictError):
            await kv.commit(ns, [Check("a", va), Create("e", b"1")])
        assert await kv.get(ns, "e") is None

    async def test_closed_store_refuses_work(self, kv_factory: KVFactory, ns: str) -> None:
        """After aclose, every operation raises ResourceClosedError; aclose is idempotent."""
        store = kv_factory()
        await store.create(ns, "k", b"v")
        await store.aclose()
        await store.aclose()
        with pytest.raises(ResourceClosedError):
            await store.get(ns, "k")

    # -- every rule at the KV level -----------------------------------------------------

    async def test_get_many_complete_any_order(self, kv: KVStore, ns: str) -> None:
        """get_many returns every live key asked for, whatever the order, count or duplicates of the request."""
        keys = [f"k{i:02d}-\u00e9" for i in range(40)]
        versions = {key: await kv.create(ns, key, key.encode()) for key in keys}
        for size in (1, 2, 3, 7, 16, 39, 40):
            for asked in (keys[:size], keys[-size:][::-1], keys[size // 2 :: 3]):
                found = await kv.get_many(ns, [*asked, "absent", *asked[:1]])
                assert sorted(found) == sorted(asked), f"asked {len(asked)}, got {len(found)}"
                for key in asked:
                    assert found[key].version == versions[key]
                    assert found[key].value == key.encode()

    async def test_scan_every_page_boundary(self, kv: KVStore, ns: str) -> None:
        """Paging a scope with every limit from 1 to past its size returns each key exactly once, in order."""
        keys = sorted((f"p{i:02d}" for i in range(13)), key=str.encode)
        for key in keys:
            await kv.create(ns, key, b"v")
        for limit in range(1, len(keys) + 2):
            seen: list[str] = []
            start_after: str | None = None
            for _ in range(len(keys) // limit + 2):
                page = await kv.scan(ns, start_after=start_after, limit=limit, values=False)
                assert len(page) <= limit
                seen += [i.key for i in page]
                if len(page) < limit:
                    break
                start_after = page[-1].key
            else:
                raise AssertionError(f"paging by {limit} never ended: {seen[: 3 * len(keys)]}")
            assert seen == keys, f"paging by {limit}: {seen}"

    async def test_scan_byte_order_non_ascii_paging(self, kv: KVStore, ns: str) -> None:
        """Non-ASCII keys sort by their UTF-8 bytes, also across pages and under a prefix."""
        keys = ["x\u00e9", "xe\u0301", "x\u00c5", "x\u212b", "x\uffff", "x\U0001f600", "xz", "xA"]
        for key in keys:
            await kv.create(ns, key, b"v")
        want = sorted(keys, key=str.encode)
        got = [i.key async for i in kv.iter_scan(ns, prefix="x", page_size=3, values=False)]
        assert got == want
        after = want[3]
        assert [i.key for i in await kv.scan(ns, start_after=after)] == want[4:]

    async def test_scopes_sharing_a_prefix_are_isolated(self, kv: KVStore, ns: str) -> None:
        """Scopes whose names extend each other ('s', 's/', 's/a', 'sa') share no entries in get, scan, get_many or drop_scope."""
        names = [ns, f"{ns}/", f"{ns}/a", f"{ns}a", f"{ns}A", f"{ns}_"]
        for i, scope in enumerate(names):
            await kv.create(scope, "k", str(i).encode())
            await kv.create(scope, f"own-{i}", b"x")
        for i, scope in enumerate(names):
            assert [x.key for x in await kv.scan(scope)] == sorted(
                ["k", f"own-{i}"], key=str.encode
            )
            entry = await kv.get(scope, "k")
            assert entry is not None and entry.value == str(i).encode()
            assert set(await kv.get_many(scope, [f"own-{j}" for j in range(len(names))])) == {
                f"own-{i}"
            }
        await kv.drop_scope(ns)
        assert await kv.scan(ns) == []
        for i, scope in enumerate(names[1:], start=1):
            entry = await kv.get(scope, "k")
            assert entry is not None and entry.value == str(i).encode()

    async def test_expired_entries_invisible_everywhere(self, kv: KVStore, ns: str) -> None:
        """An expired entry is absent for get, get_many, scan and scopes, does not block create, and replace/delete cannot reach it."""
        scope = f"{ns}/ttl"
        start = boundary_start(kv)
        hold_clock(kv, start)
        old = await kv.create(scope, "gone", b"old", ttl=30)
        await kv.create(f"{ns}/live", "k", b"v")
        hold_clock(kv, start + 30)  # exactly at expires_at: expired
        assert await kv.get(scope, "gone") is None
        assert await kv.get_many(scope, ["gone"]) == {}
        assert await kv.scan(scope) == []
        assert await kv.scopes(prefix=f"{ns}/") == [f"{ns}/live"]
        with pytest.raises(ConflictError):
            await kv.replace(scope, "gone", b"x", expected_version=old)
        assert await kv.delete(scope, "gone") is False
        new = await kv.create(scope, "gone", b"new")
        assert new != old
        entry = await kv.get(scope, "gone")
        assert entry is not None and entry.value == b"new" and entry.expires_at is None

    async def test_replace_ttl_as_documented(self, kv: KVStore, ns: str) -> None:
        """replace gives the new value its own ttl: a ttl sets expires_at = now + ttl, none clears it."""
        clock = kv.clock()
        kv.clock = lambda: clock
        v1 = await kv.create(ns, "k", b"1", ttl=100)
        e1 = await kv.get(ns, "k")
        assert (
            e1 is not None
            and e1.expires_at is not None
            and abs(e1.expires_at - (clock + 100)) < 0.01
        )
        v2 = await kv.replace(ns, "k", b"2", expected_version=v1, ttl=50)
        e2 = await kv.get(ns, "k")
        assert (
            e2 is not None
            and e2.expires_at is not None
            and abs(e2.expires_at - (clock + 50)) < 0.01
        )
        kv.clock = lambda: clock + 49
        v3 = await kv.replace(ns, "k", b"3", expected_version=v2)
        kv.clock = lambda: clock + 1000
        e3 = await kv.get(ns, "k")
        assert e3 is not None and e3.version == v3 and e3.expires_at is None

    async def test_delete_conditional_after_recreate(self, kv: KVStore, ns: str) -> None:
        """A version from before delete + create no longer deletes; a delete with a version on an absent key returns False."""
        assert await kv.delete(ns, "k", expected_version="never-issued") is False
        v1 = await kv.create(ns, "k", b"1")
        assert await kv.delete(ns, "k", expected_version=v1) is True
        v2 = await kv.create(ns, "k", b"2")
        assert await kv.delete(ns, "k", expected_version=v1) is False
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.version == v2
        assert await kv.delete(ns, "k", expected_version=v2) is True

    async def test_drop_scope_leaves_nothing(self, kv: KVStore, ns: str) -> None:
        """After drop_scope no entry of the scope is readable by get, get_many, scan or scopes, and old versions are dead."""
        scope = f"{ns}/d"
        keys = [f"k{i:03d}" for i in range(120)] + ["\u00e9", "a/b"]
        versions = {
            key: await kv.create(scope, key, b"v", ttl=None if i % 2 else 3600)
            for i, key in enumerate(keys)
        }
        assert await kv.drop_scope(scope) >= len(keys)
        assert await kv.scan(scope, limit=1000) == []
        assert await kv.get_many(scope, keys) == {}
        for key in keys[:5] + keys[-2:]:
            assert await kv.get(scope, key) is None
        assert await kv.scopes(prefix=scope) == []
        with pytest.raises(ConflictError):
            await kv.replace(scope, keys[0], b"x", expected_version=versions[keys[0]])
        assert await kv.drop_scope(scope) == 0

    async def test_oversize_rejected_writes_nothing(self, kv: KVStore, ns: str) -> None:
        """An oversize create, replace or commit raises ValueTooLargeError, stores nothing and changes nothing: never truncated."""
        limit = kv.limits.max_value_bytes
        with pytest.raises(ValueTooLargeError):
            await kv.create(ns, "k", b"a" * (limit + 1))
        assert await kv.get(ns, "k") is None and await kv.scan(ns) == []
        version = await kv.create(ns, "k", b"small")
        with pytest.raises(ValueTooLargeError):
            await kv.replace(ns, "k", b"b" * (limit + 1), expected_version=version)
        if kv.capabilities.commit:
            with pytest.raises(ValueTooLargeError):
                await kv.commit(
                    ns, [Create("other", b"c"), Replace("k", b"c" * (limit + 1), version)]
                )
            assert await kv.get(ns, "other") is None
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.value == b"small" and entry.version == version

    # -- expiry boundaries: expires_at <= now is expired, on the store's clock ----------

    async def test_boundary_reads(self, kv: KVStore, ns: str) -> None:
        """get, get_many, scan (with and without values, paged) and scopes show an entry just before its expires_at and never when the clock reads exactly expires_at or later.

        The clock is held still, so ``now == expires_at`` holds exactly. An expired entry
        between live ones takes no place in a scan page.
        """
        scope, alone = f"{ns}/b", f"{ns}/alone"
        start = boundary_start(kv)
        hold_clock(kv, start)
        await kv.create(scope, "a", b"a")
        version = await kv.create(scope, "k", b"k", ttl=30)
        await kv.create(scope, "z", b"z")
        await kv.create(alone, "k", b"k", ttl=30)
        expires_at = start + 30

        hold_clock(kv, expires_at - CLOCK_STEP)
        entry = await kv.get(scope, "k")
        assert entry is not None and entry.version == version, "live just before expires_at"
        assert entry.expires_at is not None and abs(entry.expires_at - expires_at) < 0.01
        found = await kv.get_many(scope, ["a", "k", "z"])
        assert sorted(found) == ["a", "k", "z"] and found["k"].version == version
        assert [i.key for i in await kv.scan(scope)] == ["a", "k", "z"]
        assert [i.key for i in await kv.scan(scope, values=False)] == ["a", "k", "z"]
        assert [i.key for i in await kv.scan(scope, start_after="a", limit=1)] == ["k"]
        assert [i.key async for i in kv.iter_scan(scope, page_size=1)] == ["a", "k", "z"]
        assert await kv.scopes(prefix=alone) == [alone]

        for now in (expires_at, expires_at + CLOCK_STEP):
            hold_clock(kv, now)
            at = "at" if now == expires_at else "just after"
            assert await kv.get(scope, "k") is None, f"get returned the entry {at} expires_at"
            assert sorted(await kv.get_many(scope, ["a", "k", "z"])) == ["a", "z"], (
                f"get_many returned the entry {at} expires_at"
            )
            assert [i.key for i in await kv.scan(scope)] == ["a", "z"], (
                f"scan returned the entry {at} expires_at"
            )
            assert [i.key for i in await kv.scan(scope, values=False)] == ["a", "z"], (
                f"scan(values=False) returned the entry {at} expires_at"
            )
            assert [i.key for i in await kv.scan(scope, start_after="a", limit=1)] == ["z"], (
                f"scan(limit=1) {at} expires_at did not skip the expired entry"
            )
            assert [i.key async for i in kv.iter_scan(scope, page_size=1)] == ["a", "z"]
            assert await kv.scopes(prefix=alone) == [], (
                f"scopes listed a scope whose only entry expired {at} expires_at"
            )

    async def test_boundary_create(self, kv: KVStore, ns: str) -> None:
        """create conflicts with an entry just before its expires_at and succeeds over it when the clock reads exactly expires_at; the new entry expires exactly ttl seconds after its create."""
        start = boundary_start(kv)
        hold_clock(kv, start)
        old = await kv.create(ns, "k", b"old", ttl=30)
        hold_clock(kv, start + 30 - CLOCK_STEP)
        with pytest.raises(ConflictError):
            await kv.create(ns, "k", b"early")
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.version == old and entry.value == b"old"

        hold_clock(kv, start + 30)
        new = await kv.create(ns, "k", b"new", ttl=10)
        assert new != old
        hold_clock(kv, start + 40 - CLOCK_STEP)
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.version == new and entry.value == b"new"
        with pytest.raises(ConflictError):
            await kv.create(ns, "k", b"early")
        hold_clock(kv, start + 40)
        assert await kv.get(ns, "k") is None
        assert await kv.create(ns, "k", b"newer") not in (old, new)

    async def test_boundary_replace(self, kv: KVStore, ns: str) -> None:
        """replace with the current version succeeds just before expires_at and conflicts when the clock reads exactly expires_at or later; the replacement expires exactly ttl seconds after the replace."""
        start = boundary_start(kv)
        hold_clock(kv, start)
        v1 = await kv.create(ns, "k", b"1", ttl=30)
        late = start + 30 - CLOCK_STEP
        hold_clock(kv, late)
        v2 = await kv.replace(ns, "k", b"2", expected_version=v1, ttl=20)
        hold_clock(kv, late + 20 - CLOCK_STEP)
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.version == v2 and entry.value == b"2"
        v3 = await kv.replace(ns, "k", b"3", expected_version=v2, ttl=20)
        expires_at = late + 40 - CLOCK_STEP
        for now in (expires_at, expires_at + CLOCK_STEP):
            hold_clock(kv, now)
            with pytest.raises(ConflictError):
                await kv.replace(ns, "k", b"4", expected_version=v3, ttl=20)
            assert await kv.get(ns, "k") is None

    async def test_boundary_delete(self, kv: KVStore, ns: str) -> None:
        """delete, with and without a version, removes an entry just before its expires_at (True) and finds nothing (False) when the clock reads exactly expires_at or later."""
        start = boundary_start(kv)
        hold_clock(kv, start)
        versions = {key: await kv.create(ns, key, b"v", ttl=30) for key in "abcdef"}
        hold_clock(kv, start + 30 - CLOCK_STEP)
        assert await kv.delete(ns, "a") is True
        assert await kv.delete(ns, "b", expected_version=versions["b"]) is True
        assert await kv.get_many(ns, ["a", "b"]) == {}
        hold_clock(kv, start + 30)
        assert await kv.delete(ns, "c") is False, "delete reported an entry expired at now"
        assert await kv.delete(ns, "d", expected_version=versions["d"]) is False, (
            "a versioned delete matched an entry expired at now"
        )
        hold_clock(kv, start + 30 + CLOCK_STEP)
        assert await kv.delete(ns, "e") is False
        assert await kv.delete(ns, "f", expected_version=versions["f"]) is False
        assert await kv.scan(ns) == []

    async def test_boundary_commit(self, kv: KVStore, ns: str) -> None:
        """commit's Create, Replace, Delete and Check take an entry as live just before its expires_at and as absent when the clock reads exactly expires_at."""
        require_capability(kv, "commit", "no multi-key commit to check at the boundary")
        start = boundary_start(kv)
        hold_clock(kv, start)
        v = {key: await kv.create(ns, key, key.encode(), ttl=30) for key in "abcdefgh"}
        hold_clock(kv, start + 30 - CLOCK_STEP)
        early: list[list[Operation]] = [[Create("a", b"x")], [Check("a", None)], [Check("a", "x")]]
        for ops in early:
            with pytest.raises(ConflictError) as info:
                await kv.commit(ns, ops)
            assert info.value.index == 0, f"{ops!r} failed at {info.value.index}"
        results = await kv.commit(
            ns, [Check("a", v["a"]), Replace("b", b"B", v["b"], ttl=30), Delete("c", v["c"])]
        )
        assert results[0] is None and results[1] is not None and results[2] is None
        assert await kv.get(ns, "c") is None

        hold_clock(kv, start + 30)
        late: list[list[Operation]] = [
            [Check("d", v["d"])],
            [Check("d", None), Replace("e", b"E", v["e"])],
            [Check("d", None), Delete("f", v["f"])],
        ]
        for ops in late:
            with pytest.raises(ConflictError) as info:
                await kv.commit(ns, ops)
            assert info.value.index == len(ops) - 1, f"{ops!r} failed at {info.value.index}"
        results = await kv.commit(
            ns, [Check("d", None), Create("e", b"new", ttl=5), Delete("g", None), Check("h", None)]
        )
        assert results[1] not in (None, v["e"]) and results[2] is None
        entry = await kv.get(ns, "e")
        assert entry is not None and entry.value == b"new" and entry.version == results[1]
        b = await kv.get(ns, "b")
        assert b is not None and b.value == b"B", "the replace just before expiry was lost"
        hold_clock(kv, start + 35 - CLOCK_STEP)
        assert await kv.get(ns, "e") is not None
        hold_clock(kv, start + 35)
        assert await kv.get(ns, "e") is None

    async def test_boundary_purge_expired(self, kv: KVStore, ns: str) -> None:
        """purge_expired, on the store's clock, never removes an entry before its expires_at, and leaves it absent once the clock reads exactly expires_at.

        The clock is set minutes behind the machine's, so the test only ever purges
        entries long expired in real time, also on a shared server.
        """
        start = boundary_start(kv, skew=-600)
        hold_clock(kv, start)
        version = await kv.create(ns, "k", b"v", ttl=30)
        await kv.create(ns, "forever", b"v")
        hold_clock(kv, start + 30 - CLOCK_STEP)
        removed = await kv.purge_expired()
        assert isinstance(removed, int) and removed >= 0
        entry = await kv.get(ns, "k")
        assert entry is not None and entry.version == version, (
            "purge_expired removed an entry before its expires_at"
        )
        hold_clock(kv, start + 30)
        await kv.purge_expired()
        assert await kv.get(ns, "k") is None
        assert [i.key for i in await kv.scan(ns)] == ["forever"]
        assert await kv.create(ns, "k", b"again") != version

    async def test_expiry_on_store_clock_not_server(self, kv: KVStore, ns: str) -> None:
        """Expiry follows the store's clock, never the server's: with the clock minutes behind the machine's, entries written by create, replace and commit stay live until the clock reaches their expires_at, though it is long past in real time; with the clock ahead, they are gone exactly at expires_at though the server would keep them.

        Native TTL (Redis, DynamoDB, Cosmos DB, Firestore) may only collect entries
        already expired on the store's clock.
        """
        for skew in (-300.0, 300.0):
            scope = f"{ns}/{'behind' if skew < 0 else 'ahead'}"
            start = boundary_start(kv, skew=skew)
            hold_clock(kv, start)
            written = {"c": await kv.create(scope, "c", b"c", ttl=30)}
            first = await kv.create(scope, "r", b"r")
            written["r"] = await kv.replace(scope, "r", b"r2", expected_version=first, ttl=30)
            if kv.capabilities.commit:
                made = await kv.commit(scope, [Create("m", b"m", ttl=30)])
                assert made[0] is not None
                written["m"] = made[0]
            if skew < 0 and kv.capabilities.shared_across_processes:
                # Room for a server's TTL of whole seconds, wrongly taken from the machine's
                # clock, to act (a process-local store has no server clock to wait for).
                await asyncio.sleep(1.1)
            hold_clock(kv, start + 30 - CLOCK_STEP)
            keys = sorted(written)
            found = await kv.get_many(scope, keys)
            assert {k: e.version for k, e in found.items()} == written, (
                f"clock {skew:+g} s from the machine's: entries live on the store's clock "
                f"were not all found: {sorted(found)} of {keys}"
            )
            assert [i.key for i in await kv.scan(scope)] == keys
            assert await kv.scopes(prefix=scope) == [scope]
            with pytest.raises(ConflictError):
                await kv.create(scope, "c", b"early")
            hold_clock(kv, start + 30)
            assert await kv.get_many(scope, keys) == {}
            assert await kv.scan(scope) == []
            assert await kv.scopes(prefix=scope) == []
            with pytest.raises(ConflictError):
                await kv.replace(scope, "r", b"late", expected_version=written["r"])
            assert await kv.create(scope, "c", b"again") != written["c"]

    # -- the model ----------------------------------------------------------------------

    async def test_model_based_sequences(
        self, kv: KVStore, ns: str, contract_examples: tuple[int, int]
    ) -> None:
        """Random sequences of every primitive on prefix-sharing scopes with awkward names, over a moving clock, answer exactly as a reference model."""
        examples, steps = contract_examples
        loop = asyncio.get_running_loop()

        def runner(coro: Coroutine[Any, Any, Any]) -> Any:
            # A hung call fails this example instead of blocking the worker thread forever.
            return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=120)

        await asyncio.to_thread(run_model, kv, ns, runner, examples=examples, steps=steps)
