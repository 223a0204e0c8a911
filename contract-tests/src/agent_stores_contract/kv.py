"""The KV CAS contract: what every backend's primitives guarantee.

Each test's docstring states the guarantee it checks.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from agent_stores import (
    ConflictError,
    InvalidIdError,
    KVStore,
    ResourceClosedError,
    UnsupportedError,
    ValueTooLargeError,
)
from agent_stores.kv import Check, Create, Delete, Replace

from .base import ContractBase, KVFactory

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


def offset_clock(kv: KVStore, seconds: float) -> None:
    """Move the store's clock forward by ``seconds`` (expiry is decided by the core's clock)."""
    base = kv.clock
    kv.clock = lambda: base() + seconds


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
        """50 tasks CAS-incrementing one key: exactly one winner per version, and no increment is lost."""
        clients = [kv_factory() for _ in range(5)]
        await clients[0].create(ns, "counter", b"0")
        replaced: list[str] = []
        per_task = 4

        async def worker(client: KVStore) -> None:
            done = 0
            while done < per_task:
                entry = await client.get(ns, "counter")
                assert entry is not None
                try:
                    await client.replace(
                        ns,
                        "counter",
                        str(int(entry.value) + 1).encode(),
                        expected_version=entry.version,
                    )
                except ConflictError:
                    await asyncio.sleep(0)
                    continue
                replaced.append(entry.version)
                done += 1

        try:
            await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(50)))
            final = await clients[0].get(ns, "counter")
            assert final is not None
            assert int(final.value) == 50 * per_task
            assert len(replaced) == len(set(replaced)) == 50 * per_task
        finally:
            for client in clients:
                await client.aclose()

    async def test_concurrent_create_single_winner(self, kv_factory: KVFactory, ns: str) -> None:
        """50 tasks creating the same key at once: exactly one succeeds, its value is the one stored."""
        clients = [kv_factory() for _ in range(5)]

        async def attempt(i: int) -> tuple[int, str] | None:
            try:
                return i, await clients[i % 5].create(ns, "once", str(i).encode())
            except ConflictError:
                return None

        try:
            results = [
                r for r in await asyncio.gather(*(attempt(i) for i in range(50))) if r is not None
            ]
            assert len(results) == 1
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

    async def test_multiprocess_cas_one_key(self, kv: KVStore, store_url: str, ns: str) -> None:
        """Several OS processes CAS-incrementing one key: one winner per version, every increment kept."""
        if not kv.capabilities.shared_across_processes:
            pytest.skip(
                f"{kv.backend_name} is process-local: there is no data for a second process to share"
            )
        await kv.create(ns, "counter", b"0")
        processes, per_process = 4, 25
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent_stores_contract.workers",
                "kv-increment",
                store_url,
                ns,
                "counter",
                str(per_process),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
            for _ in range(processes)
        ]
        outputs = [await p.communicate() for p in procs]
        for proc, (_, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err.decode()
        wins = [
            json.loads(line)
            for out, _ in outputs
            for line in out.decode().splitlines()
            if line.strip()
        ]
        assert len(wins) == processes * per_process
        replaced = [w["replaced"] for w in wins]
        assert len(set(replaced)) == len(replaced), "two processes won the same version"
        assert sorted(w["value"] for w in wins) == list(range(1, processes * per_process + 1))
        final = await kv.get(ns, "counter")
        assert final is not None and int(final.value) == processes * per_process

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
        while True:
            page = await kv.scan(ns, start_after=start_after, limit=10)
            assert len(page) <= 10
            seen += [i.key for i in page]
            if len(page) < 10:
                break
            start_after = page[-1].key
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
