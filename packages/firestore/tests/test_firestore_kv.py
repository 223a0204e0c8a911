"""Firestore-specific behaviour of ``FirestoreKV`` on Google's emulator.

The contract suite covers the semantics every backend shares; these tests cover what is
particular to Firestore: the 1 MiB document limit, awkward ids, update-time versions,
the commit's preconditions, the TTL-policy field, ready clients, and a stopped emulator.
"""

from __future__ import annotations

import datetime as dt
import shutil
import tempfile
from pathlib import Path

import pytest
from agent_stores import open_kv
from agent_stores.errors import (
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    InvalidIdError,
    ValueTooLargeError,
)
from agent_stores.kv.base import Check, Create, Delete, Replace
from agent_stores_firestore.config import HARD_MAX_VALUE_BYTES
from agent_stores_firestore.kv import F_GC, FirestoreKV
from firestore_test_support import server


def shift_clock(kv: FirestoreKV, seconds: float) -> None:
    base = kv.clock
    kv.clock = lambda: base() + seconds


async def raw_ids(kv: FirestoreKV, scope: str) -> list[str]:
    return [doc_id async for doc_id in kv.iter_documents(scope)]


# -- limits ---------------------------------------------------------------------------------


async def test_oversized_value_writes_nothing(kv: FirestoreKV) -> None:
    """A 1.5 MB value raises ValueTooLargeError and nothing reaches Firestore."""
    big = b"x" * 1_500_000
    with pytest.raises(ValueTooLargeError) as caught:
        await kv.create("s", "big", big)
    assert caught.value.size == 1_500_000 and caught.value.limit == HARD_MAX_VALUE_BYTES
    version = await kv.create("s", "small", b"v")
    with pytest.raises(ValueTooLargeError):
        await kv.replace("s", "small", big, expected_version=version)
    with pytest.raises(ValueTooLargeError):
        await kv.commit("s", [Create("other", b"1"), Create("big", big)])
    assert await kv.get("s", "big") is None
    assert await kv.get("s", "other") is None
    entry = await kv.get("s", "small")
    assert entry is not None and entry.value == b"v" and entry.version == version
    assert len(await raw_ids(kv, "s")) == 1


async def test_largest_value_fits_with_the_longest_names(kv: FirestoreKV) -> None:
    """The limit leaves room for the document name and fields: the emulator accepts it."""
    scope = "s" * 512
    key = "k" * 512
    value = bytes(range(256)) * (HARD_MAX_VALUE_BYTES // 256) + b"z" * (HARD_MAX_VALUE_BYTES % 256)
    assert len(value) == HARD_MAX_VALUE_BYTES
    await kv.create(scope, key, value, ttl=3600)
    entry = await kv.get(scope, key)
    assert entry is not None and entry.value == value


async def test_ids_over_firestore_limit_are_typed_errors(kv: FirestoreKV) -> None:
    emoji_key = "\U0001f600" * 400  # 400 characters (under the core's 512), 1,600 bytes
    with pytest.raises(InvalidIdError, match="1500"):
        await kv.create("s", emoji_key, b"v")
    assert await raw_ids(kv, "s") == []


# -- awkward ids ------------------------------------------------------------------------------

ODD = ["/", ".", "..", "__x__", "a/b", "a.b", "./..", "__.__", "é/ü", "\U0001f600", "x" * 500]


async def test_odd_keys_and_scopes_round_trip_in_order(kv: FirestoreKV) -> None:
    """Keys and scopes with '/', '.', '..', '__x__', unicode, 500 characters never collide."""
    for scope in ODD:
        for key in reversed(ODD):
            await kv.create(scope, key, f"{scope}|{key}".encode())
    ordered = sorted(ODD, key=lambda s: s.encode())
    for scope in ODD:
        items = await kv.scan(scope, limit=100)
        assert [i.key for i in items] == ordered
        assert all(i.entry and i.entry.value == f"{scope}|{i.key}".encode() for i in items)
        page = await kv.scan(scope, limit=3, start_after=ordered[2])
        assert [i.key for i in page] == ordered[3:6]
        found = await kv.get_many(scope, ODD)
        assert {k: e.value for k, e in found.items()} == {k: f"{scope}|{k}".encode() for k in ODD}
    assert await kv.scopes(limit=100) == ordered
    assert [i.key for i in await kv.scan("a/b", prefix="a", limit=100)] == ["a.b", "a/b"]
    assert await kv.drop_scope("..") == len(ODD)
    assert await kv.scan("..") == []
    assert len(await kv.scan(".", limit=100)) == len(ODD)


# -- versions ---------------------------------------------------------------------------------


async def test_versions_never_reused_after_delete_and_create(kv: FirestoreKV) -> None:
    """Update times of one document strictly increase, across delete + create too."""
    seen: list[str] = []
    for _ in range(40):
        seen.append(await kv.create("s", "k", b"same"))
        seen.append(await kv.replace("s", "k", b"same", expected_version=seen[-1]))
        assert await kv.delete("s", "k", expected_version=seen[-1])
    assert len(set(seen)) == len(seen)
    stamps = [tuple(int(p) for p in v.split("~")[0].split(".")[:2]) for v in seen]
    assert stamps == sorted(stamps)
    stale = seen[0]
    await kv.create("s", "k", b"same")
    with pytest.raises(ConflictError):
        await kv.replace("s", "k", b"new", expected_version=stale)
    assert not await kv.delete("s", "k", expected_version=stale)
    assert not await kv.delete("s", "k", expected_version="not-a-version")


async def test_expired_entry_is_replaced_by_create_under_precondition(kv: FirestoreKV) -> None:
    old = await kv.create("s", "k", b"old", ttl=5)
    shift_clock(kv, 10)
    with pytest.raises(ConflictError):
        await kv.replace("s", "k", b"x", expected_version=old)
    assert not await kv.delete("s", "k", expected_version=old)
    new = await kv.create("s", "k", b"new")
    assert new != old
    entry = await kv.get("s", "k")
    assert entry is not None and entry.value == b"new" and entry.expires_at is None


async def test_ttl_policy_field(kv: FirestoreKV) -> None:
    """``gc_at`` (for a Firestore TTL policy) trails the expiry; no expiry, no field."""
    await kv.create("s", "ttl", b"v", ttl=100)
    await kv.create("s", "forever", b"v")
    entries = kv.client.collection(kv.collection)
    docs = {}
    async for snap in (
        entries.document("k" + kv.prefix)
        .collection("scopes")
        .document("ks")
        .collection("entries")
        .stream()
    ):
        docs[snap.id] = snap.to_dict()
    entry = await kv.get("s", "ttl")
    assert entry is not None and entry.expires_at is not None
    gc_at = docs["kttl"][F_GC]
    assert gc_at > dt.datetime.fromtimestamp(entry.expires_at, dt.UTC)
    assert F_GC not in docs["kforever"]
    version = await kv.replace("s", "ttl", b"w", expected_version=entry.version)
    assert await kv.replace("s", "ttl", b"w", expected_version=version)
    snap = (
        await entries.document("k" + kv.prefix)
        .collection("scopes")
        .document("ks")
        .collection("entries")
        .document("kttl")
        .get()
    )
    assert F_GC not in (snap.to_dict() or {})


# -- commit -----------------------------------------------------------------------------------


async def test_commit_checks_do_not_write(kv: FirestoreKV) -> None:
    a = await kv.create("s", "a", b"a")
    versions = await kv.commit(
        "s", [Check("a", a), Check("absent", None), Create("b", b"b"), Delete("zzz")]
    )
    assert versions[0] is None and versions[1] is None and versions[2] is not None
    both = await kv.commit("s", [Create("c1", b"1"), Create("c2", b"2")])
    assert len(set(both)) == 2  # one commit timestamp, two versions
    entry = await kv.get("s", "a")
    assert entry is not None and entry.version == a  # a Check leaves the version alone
    assert await kv.get("s", "absent") is None
    with pytest.raises(ConflictError) as caught:
        await kv.commit("s", [Replace("b", b"b2", versions[2] or ""), Check("a", "1.000000000")])
    assert caught.value.index == 1
    entry_b = await kv.get("s", "b")
    assert entry_b is not None and entry_b.value == b"b"


async def test_commit_reports_the_first_failing_operation(kv: FirestoreKV) -> None:
    """A version that cannot be this store's fails its operation only if no earlier one fails.

    Found by the model-based contract test: a Create over a live key (decided by the
    server) came before a Replace with a foreign version (decided locally), and the
    conflict named the Replace.
    """
    await kv.create("s", "live", b"v")
    with pytest.raises(ConflictError) as caught:
        await kv.commit(
            "s", [Create("live", b"x"), Replace("other", b"y", "not-a-version-of-this-store")]
        )
    assert caught.value.index == 0
    with pytest.raises(ConflictError) as caught:
        await kv.commit("s", [Delete("live"), Replace("other", b"y", "not-a-version")])
    assert caught.value.index == 1  # an unconditional delete cannot fail: decided locally
    entry = await kv.get("s", "live")
    assert entry is not None and entry.value == b"v" and await kv.get("s", "other") is None


async def test_commit_over_expired_entries(kv: FirestoreKV) -> None:
    """Expired documents count as absent in a commit (the second, read-then-pin pass)."""
    await kv.create("s", "gone", b"old", ttl=5)
    await kv.create("s", "gone2", b"old", ttl=5)
    shift_clock(kv, 10)
    versions = await kv.commit("s", [Create("gone", b"new"), Check("gone2", None)])
    entry = await kv.get("s", "gone")
    assert entry is not None and entry.value == b"new" and entry.version == versions[0]


# -- clients and failures -----------------------------------------------------------------------


async def test_ready_client_is_not_closed(firestore_url: str) -> None:
    from google.cloud.firestore import AsyncClient, Client

    probe = FirestoreKV.from_url(firestore_url)
    with pytest.raises(ConfigError, match="not connected yet"):
        _ = probe.client  # built by the first call, off the event loop
    await probe.setup()
    client: AsyncClient = probe.client
    store = open_kv(client, collection=probe.collection, prefix=probe.prefix)
    assert isinstance(store, FirestoreKV) and "ready client" in store.describe()
    await store.create("s", "k", b"v")
    await store.aclose()
    entry = await probe.get("s", "k")  # the shared client still works
    assert entry is not None and entry.value == b"v"
    await probe.aclose()
    with pytest.raises(ConfigError, match="AsyncClient"):
        open_kv(Client(project="p", credentials=client._credentials))


async def test_unreachable_endpoint_is_a_typed_error() -> None:
    port = server.free_port()
    kv = open_kv(f"firestore://p/c?emulator_host=127.0.0.1:{port}&retries=1&timeout=2")
    try:
        with pytest.raises(BackendUnavailableError) as caught:
            await kv.get("s", "k")
        assert "firestore://p/c" in str(caught.value)
        with pytest.raises(BackendUnavailableError):
            await kv.create("s", "k", b"v")
    finally:
        await kv.aclose()


async def test_stopped_emulator_is_a_typed_error() -> None:
    """A real emulator, stopped under a working store: BackendUnavailableError, no hang."""
    folder = Path(tempfile.mkdtemp(prefix="as-fs-stop-"))
    emulator = server.start_emulator(folder)
    try:
        # The default timeout: a just-booted emulator answers its first request slowly.
        kv = open_kv(server.url_for(emulator.port) + "&retries=1")
        version = await kv.create("s", "k", b"v")
        emulator.stop()
        with pytest.raises(BackendUnavailableError):
            await kv.get("s", "k")
        with pytest.raises(BackendUnavailableError):
            await kv.replace("s", "k", b"w", expected_version=version)
        with pytest.raises(BackendUnavailableError):
            await kv.scan("s")
        await kv.aclose()
    finally:
        emulator.stop()
        shutil.rmtree(folder, ignore_errors=True)


async def test_scopes_skip_scan_at_the_id_length_limit(kv: FirestoreKV) -> None:
    """``scopes`` jumps past each scope, also past one whose id is exactly 1,500 bytes."""
    longest = "aaa" + "\U0001f600" * 374  # 377 characters; id: "k" + 1,499 bytes
    assert len(("k" + longest).encode()) == 1500
    names = ["a", longest, "aé", "b", "b.", "b/"]
    for name in names:
        for key in ("k1", "k2", "k3"):
            await kv.create(name, key, b"v")
    await kv.create("c", "gone", b"v", ttl=5)
    await kv.create("c", "z-live", b"v")  # the first entry found has expired
    await kv.create("d", "gone", b"v", ttl=5)  # only expired entries: not listed
    shift_clock(kv, 10)
    ordered = sorted([*names, "c"], key=lambda s: s.encode())
    assert await kv.scopes(limit=100) == ordered
    assert await kv.scopes(start_after=longest, limit=100) == ordered[ordered.index(longest) + 1 :]
    assert await kv.scopes(prefix="b", limit=2) == ["b", "b."]
    assert await kv.scopes(prefix="b", start_after="b.", limit=5) == ["b/"]
