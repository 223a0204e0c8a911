"""KVMemoryStore beyond the contract: small item limits, round trips, layout, collection, errors."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_stores import (
    CorruptRecordError,
    KVStore,
    ValueTooLargeError,
    connect,
    open_kv,
    open_memory,
)
from agent_stores.damage import list_quarantined
from agent_stores.kv.counting import CountingKV
from agent_stores.memory import KVMemoryStore, append_memory, read_whole
from agent_stores_contract.memory import MemoryContract, crash_content, op
from pydantic_ai_harness.memory import (
    InMemoryMemoryStore,
    MemoryConflictError,
    MemoryOperation,
    SqliteMemoryStore,
)


def _name() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(params=["memory", "sqlite"])
def small_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A backend URL whose items hold at most 16 KiB."""
    if request.param == "memory":
        return f"memory://small-{_name()}?max_value_bytes=16384"
    return f"sqlite:///{tmp_path}/small.db?max_value_bytes=16384"


@pytest.fixture
async def small_kv(small_url: str) -> AsyncIterator[KVStore]:
    kv = open_kv(small_url)
    await kv.setup()
    yield kv
    await kv.aclose()


async def _all_entries(kv: KVStore, prefix: str) -> list[tuple[str, str, bytes]]:
    out = []
    for scope in await kv.scopes(prefix=prefix, limit=1000):
        async for item in kv.iter_scan(scope):
            assert item.entry is not None
            out.append((scope, item.key, item.entry.value))
    return out


# -- small item limits: chunking, never truncation --------------------------------------


async def test_70000_characters_on_16k_items(small_kv: KVStore) -> None:
    store = KVMemoryStore(small_kv)
    text = crash_content(70_000)
    await store.write("u/main/big.md", text, expected_version=None)
    for i in range(3):
        await append_memory(store, "u/main/big.md", f"line {i}")
    whole = await read_whole(store, "u/main/big.md")
    assert whole is not None
    assert whole.content == text + "\nline 0\nline 1\nline 2"
    entries = await _all_entries(small_kv, "memory:")
    assert max(len(value) for _, _, value in entries) <= 16384
    assert len(entries) > 5, "the file was split into chunks"


async def test_url_item_limit_is_respected_by_every_record(small_kv: KVStore) -> None:
    store = KVMemoryStore(small_kv, max_receipts_per_file=32)
    meta = {"k": "é" * 4000}  # 8 KB of metadata: with receipts it cannot stay inline
    version = None
    for i in range(40):
        mutation = await store.write_with_metadata(
            "u/main/a.md",
            crash_content(9000 + i),
            expected_version=version,
            metadata=meta,
            operation=op(f"w{i}"),
        )
        version = mutation.version
    current = await store.read("u/main/a.md", max_chars=100_000)
    assert current is not None and current.metadata == meta
    assert current.content == crash_content(9039)
    for _, _, value in await _all_entries(small_kv, "memory:"):
        assert len(value) <= 16384


async def test_tiny_records_chunk_metadata_and_trim_receipts() -> None:
    kv = open_kv(f"memory://tiny-{_name()}?max_value_bytes=1024")
    store = KVMemoryStore(kv, max_receipts_per_file=32)
    meta = {"who": "x" * 3000}
    version = None
    for i in range(10):
        op_i = MemoryOperation(id=f"operation-{i}", fingerprint="f")
        mutation = await store.write_with_metadata(
            "u/main/a.md", "y" * 2500, expected_version=version, metadata=meta, operation=op_i
        )
        version = mutation.version
    current = await store.read("u/main/a.md", max_chars=10_000)
    assert current is not None and current.content == "y" * 2500 and current.metadata == meta
    for _, _, value in await _all_entries(kv, "memory:"):
        assert len(value) <= 1024
    # Every operation still replays: trimmed receipts remain in the receipt index.
    for i in range(10):
        replay = await store.get_operation(MemoryOperation(id=f"operation-{i}", fingerprint="f"))
        assert replay is not None and replay.replayed


async def test_readers_never_see_mixed_chunks(small_kv: KVStore) -> None:
    """Rewrites replace chunk sets; concurrent readers always get one whole version."""
    writer = KVMemoryStore(small_kv)
    reader = KVMemoryStore(small_kv)
    versions = [crash_content(40_000 + i) for i in range(8)]
    current = await writer.write("u/main/a.md", versions[0], expected_version=None)
    stop = False
    seen: list[str] = []

    async def read_loop() -> None:
        while not stop:
            found = await read_whole(reader, "u/main/a.md")
            assert found is not None
            seen.append(found.content)
            await asyncio.sleep(0)

    readers = [asyncio.create_task(read_loop()) for _ in range(3)]
    for text in versions[1:]:
        current = await writer.write("u/main/a.md", text, expected_version=current.version)
        await asyncio.sleep(0)
    stop = True
    await asyncio.gather(*readers)
    assert seen and all(text in versions for text in seen)


# -- round trips --------------------------------------------------------------------------


async def test_round_trips_per_operation() -> None:
    counting = CountingKV(open_kv(f"memory://rt-{_name()}"))
    store = KVMemoryStore(counting)
    await store.write("u/main/MEMORY.md", "a", expected_version=None)
    counting.reset_counts()
    current = await store.read("u/main/MEMORY.md", max_chars=100)
    assert counting.total_calls == 1
    assert current is not None
    counting.reset_counts()
    current_version = (
        await store.write("u/main/MEMORY.md", "b", expected_version=current.version)
    ).version
    assert dict(counting.calls) == {"get": 1, "replace": 1}
    counting.reset_counts()
    await store.write("u/main/MEMORY.md", "c", expected_version=current_version, operation=op("rt"))
    # Record and receipt index read together, one CAS, one index write.
    assert dict(counting.calls) == {"get": 2, "replace": 1, "create": 1}
    counting.reset_counts()
    await store.write("u/main/other.md", "x", expected_version=None)
    assert dict(counting.calls) == {"get": 1, "create": 1}, "directory markers are remembered"


async def test_directory_markers_written_once_per_process() -> None:
    counting = CountingKV(open_kv(f"memory://mk-{_name()}"))
    store = KVMemoryStore(counting)
    await store.write("a/b/c/d.md", "x", expected_version=None)
    assert counting.calls["create"] == 4  # three markers, one record
    again = KVMemoryStore(counting)
    counting.reset_counts()
    await again.write("a/b/c/e.md", "x", expected_version=None)
    assert counting.calls["create"] == 4  # a new process re-asserts the markers once
    counting.reset_counts()
    await again.write("a/b/c/f.md", "x", expected_version=None)
    assert counting.calls["create"] == 1


# -- layout -------------------------------------------------------------------------------


async def test_deep_directories_fall_back_to_hashed_scopes() -> None:
    kv = open_kv(f"memory://deep-{_name()}")
    store = KVMemoryStore(kv)
    deep = "/".join(["d" * 150] * 5)
    await store.write(f"{deep}/MEMORY.md", "deep", expected_version=None)
    await store.write(f"{deep}/x/y.md", "deeper", expected_version=None)
    scope = store.directory_scope(deep)
    assert len(scope) <= kv.limits.max_scope_chars and "~h/" in scope
    assert await store.list_paths("", limit=10) == [f"{deep}/MEMORY.md", f"{deep}/x/y.md"]
    found = await store.search(
        f"{deep}/", "deep", limit=5, max_files=5, max_chars=500, max_file_chars=100
    )
    assert [m.path for m in found.matches] == [f"{deep}/MEMORY.md"]


async def test_scope_prefixes_isolate_stores() -> None:
    kv = open_kv(f"memory://iso-{_name()}")
    a, b = KVMemoryStore(kv, scope_prefix="a:"), KVMemoryStore(kv, scope_prefix="b:")
    await a.write("u/main/MEMORY.md", "a", expected_version=None, operation=op("same"))
    assert await b.read("u/main/MEMORY.md", max_chars=10) is None
    assert await b.list_paths("", limit=10) == []
    assert await b.get_operation(op("same")) is None
    await b.write("u/main/MEMORY.md", "b", expected_version=None, operation=op("same", "other"))


async def test_corrupt_record_is_reported_and_overwritten_only_unconditionally() -> None:
    """Reading it raises; a versioned write cannot match it; an unconditional overwrite
    replaces it after moving its raw bytes into the quarantine scope (issue 14)."""
    kv = open_kv(f"memory://bad-{_name()}")
    store = KVMemoryStore(kv)
    await store.write("u/main/a.md", "fine", expected_version=None)
    scope = store.directory_scope("u/main")
    entry = await kv.get(scope, "a.md")
    assert entry is not None
    await kv.replace(scope, "a.md", b"\xff not json", expected_version=entry.version)
    with pytest.raises(CorruptRecordError):
        await store.read("u/main/a.md", max_chars=10)
    with pytest.raises(CorruptRecordError):
        await store.write("u/main/a.md", "x", expected_version="some-version")
    raw = await kv.get(scope, "a.md")
    assert raw is not None and raw.value == b"\xff not json"
    await store.write("u/main/a.md", "x", expected_version=None)
    again = await store.read("u/main/a.md", max_chars=10)
    assert again is not None and again.content == "x"
    kept = await list_quarantined(kv)
    assert [q.raw for q in kept] == [b"\xff not json"]


async def test_collect_garbage_removes_only_old_orphans() -> None:
    kv = open_kv(f"memory://gc-{_name()}?max_value_bytes=1024")
    store = KVMemoryStore(kv, chunk_grace_seconds=60)
    await store.write("u/main/a.md", "z" * 5000, expected_version=None)
    scope = store.directory_scope("u/main")
    now = int(kv.clock())
    await kv.create(scope, f"~c/a.md/{now - 3600:x}-deadbeef/c0", b"old orphan")
    await kv.create(scope, f"~c/a.md/{now:x}-cafe/c0", b"write in flight")
    await kv.create(scope, f"~c/gone.md/{now - 3600:x}-beef/c0", b"file gone")
    assert await store.collect_garbage() == 2
    keys = [item.key async for item in kv.iter_scan(scope, prefix="~c/", values=False)]
    assert f"~c/a.md/{now:x}-cafe/c0" in keys
    assert not any("deadbeef" in k or "gone.md" in k for k in keys)
    whole = await read_whole(store, "u/main/a.md")
    assert whole is not None and whole.content == "z" * 5000


# -- construction, lifecycle --------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"scope_prefix": ""},
        {"receipt_ttl": 0},
        {"max_receipts_per_file": 0},
        {"max_record_bytes": 100},
        {"page_size": 0},
        {"chunk_grace": -1},
    ],
)
def test_bad_options_rejected(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        KVMemoryStore(open_kv("memory://"), **options)  # type: ignore[arg-type]


async def test_owns_kv_and_context_manager() -> None:
    kv = open_kv(f"memory://own-{_name()}")
    async with KVMemoryStore(kv) as store:
        await store.write("a.md", "x", expected_version=None)
    assert not kv.closed
    async with KVMemoryStore(kv, owns_kv=True):
        pass
    assert kv.closed


async def test_open_memory_and_connect(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    async with open_memory(url) as store:
        assert isinstance(store, KVMemoryStore)
        await store.write("u/main/MEMORY.md", "hi", expected_version=None)
    assert store.kv.closed
    async with connect(url) as connection:
        shared = connection.memory()
        found = await shared.read("u/main/MEMORY.md", max_chars=10)
        assert found is not None and found.content == "hi"
        await shared.aclose()
        assert not connection.kv.closed
    assert "sqlite" in repr(shared)


# -- append_memory on any store -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["in-memory", "sqlite"])
async def test_append_memory_on_harness_stores(kind: str, tmp_path: Path) -> None:
    store = (
        InMemoryMemoryStore()
        if kind == "in-memory"
        else SqliteMemoryStore(database=tmp_path / "h.db")
    )
    await asyncio.gather(*(append_memory(store, "u/main/log.md", f"t{i}") for i in range(20)))
    found = await store.read("u/main/log.md", max_chars=10_000)
    assert found is not None
    assert sorted(found.content.split("\n")) == sorted(f"t{i}" for i in range(20))


async def test_append_memory_separator_and_metadata() -> None:
    store = KVMemoryStore(open_kv(f"memory://ap-{_name()}"))
    await append_memory(store, "a.md", "one")
    await append_memory(store, "a.md", "two\n")
    await append_memory(store, "a.md", "three", metadata={"by": "hook"})
    await append_memory(store, "b.md", "x", separator="")
    await append_memory(store, "b.md", "y", separator="")
    a = await store.read("a.md", max_chars=100)
    b = await store.read("b.md", max_chars=100)
    assert a is not None and a.content == "one\ntwo\nthree" and a.metadata == {"by": "hook"}
    assert b is not None and b.content == "xy"
    with pytest.raises(TypeError):
        await append_memory(_NoMetadata(), "a.md", "x", metadata={"k": "v"})
    with pytest.raises(ValueError):
        await append_memory(store, "../a.md", "x")
    with pytest.raises(ValueError):
        await append_memory(store, "a.md", "x", max_attempts=0)


async def test_append_memory_gives_up_after_max_attempts(tmp_path: Path) -> None:
    """With one attempt and racing writers, a lost race surfaces as MemoryConflictError."""
    # memory:// suspends on every operation like a network round trip, so the writers
    # really interleave between their read and their write (SQLite runs a statement on
    # the event loop when its connection is free, which would serialise them).
    store = KVMemoryStore(open_kv(f"memory://race-{tmp_path.name}"), owns_kv=True)
    await store.write("a.md", "0", expected_version=None)
    errors = 0
    for i in range(30):
        results = await asyncio.gather(
            *(append_memory(store, "a.md", f"{i}-{j}", max_attempts=1) for j in range(5)),
            return_exceptions=True,
        )
        errors += sum(isinstance(r, MemoryConflictError) for r in results)
        assert not [
            r
            for r in results
            if isinstance(r, BaseException) and not isinstance(r, MemoryConflictError)
        ]
    assert errors > 0
    await store.aclose()


class _NoMetadata:
    """A MemoryStore without write_with_metadata (the protocol's minimum)."""

    def __init__(self) -> None:
        self._inner = InMemoryMemoryStore()
        self.read = self._inner.read
        self.get_operation = self._inner.get_operation
        self.write = self._inner.write
        self.delete = self._inner.delete
        self.list_paths = self._inner.list_paths


# -- the whole contract on 16 KiB items ----------------------------------------------------


class TestContractOnSmallItems(MemoryContract):
    """Every memory contract test on a memory:// store whose items hold at most 16 KiB."""

    @pytest.fixture
    def store_url(self) -> str:
        return "memory://contract-small?max_value_bytes=16384"


class TestContractOnSmallSqliteItems(MemoryContract):
    """Every memory contract test on SQLite with 16 KiB items (multi-process tests included)."""

    @pytest.fixture
    def store_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path}/contract.db?max_value_bytes=16384"


async def test_file_too_large_for_one_record_writes_nothing() -> None:
    kv = open_kv(f"memory://huge-{_name()}?max_value_bytes=1024")
    store = KVMemoryStore(kv)
    with pytest.raises(ValueTooLargeError):
        await store.write("u/main/huge.md", "h" * 1_000_000, expected_version=None)
    assert await store.read("u/main/huge.md", max_chars=10) is None
    scope = store.directory_scope("u/main")
    assert [item.key async for item in kv.iter_scan(scope, values=False)] == []


def test_path_rules_are_the_harness_rules() -> None:
    """The store keeps a copy of the harness's path rules (so listing needs no harness
    import): both accept and reject exactly the same paths and prefixes."""
    import random

    from agent_stores.memory import _harness
    from pydantic_ai_harness.memory import _store as theirs

    rng = random.Random(7)
    alphabet = "aZ9_.-/ é\x00\\~:"
    samples = [
        *("", ".", "..", "/", "//", "a", "a/", "/a", "a//b", "a/./b", "a/../b", "a..b", ".a"),
        *("a.", "-", "_", "x" * 200, "x" * 201, "a/" * 20 + "deep.md", "é", "a b", "a\nb"),
        *("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(3000)),
    ]

    def outcome(check: Any, value: str) -> str | None:
        try:
            check(value)
        except ValueError as exc:
            return str(exc)
        return None

    for sample in samples:
        for ours, reference in (
            (_harness.validate_store_path, theirs.validate_store_path),
            (_harness.validate_store_prefix, theirs.validate_store_prefix),
        ):
            assert outcome(ours, sample) == outcome(reference, sample), repr(sample)


def test_lazy_names_are_the_harness_objects() -> None:
    """``agent_stores.memory`` and its ``_harness`` re-export the real objects on first use."""
    import agent_stores.memory
    import pydantic_ai_harness.memory as harness
    from agent_stores.memory import _harness
    from agent_stores.memory.store import KVMemoryStore as Store

    assert _harness.MemoryFile is harness.MemoryFile
    assert _harness.MemoryConflictError is harness.MemoryConflictError
    assert agent_stores.memory.KVMemoryStore is Store is KVMemoryStore
    assert {"KVMemoryStore", "append_memory", "read_whole"} <= set(dir(agent_stores.memory))
    with pytest.raises(AttributeError):
        _ = agent_stores.memory.NoSuchName  # type: ignore[attr-defined]


# -- what a store remembers ----------------------------------------------------------------


async def test_remembered_records_are_bounded_by_bytes(tmp_path: Path) -> None:
    """On an atomic port a write that expects the version it last saw skips the read; the
    records kept for that are bounded by their bytes (16 MiB), not only by their number,
    so a store serving many large files does not grow with them."""
    counting = CountingKV(open_kv(f"sqlite:///{tmp_path}/known.db"))
    store = KVMemoryStore(counting)
    assert store.port.atomic

    async def reads_before_writing(path: str, version: str) -> int:
        counting.reset_counts()
        await store.write(path, "changed", expected_version=version)
        return counting.calls["get"] + counting.calls["memory.read"]

    small = await store.write("u/small.md", "x", expected_version=None)
    assert await reads_before_writing("u/small.md", small.version) == 0
    huge = await store.write("u/huge.md", "h" * (1 << 20) + "!", expected_version=None)
    assert await reads_before_writing("u/huge.md", huge.version) == 1  # over 1 MiB: not kept

    versions = [
        (await store.write(f"u/{i:02d}.md", f"{i:02d}" * 450_000, expected_version=None)).version
        for i in range(20)
    ]  # 18 MB written: the oldest are forgotten, the newest kept
    assert await reads_before_writing("u/19.md", versions[19]) == 0
    assert await reads_before_writing("u/00.md", versions[0]) == 1
    await store.aclose()
    await counting.aclose()


async def test_an_operation_of_the_wrong_type_is_refused_before_anything_is_written() -> None:
    """A string (say, the operation's id alone) where the MemoryOperation goes: a
    TypeError naming what is expected, and the file neither created nor changed."""
    store = KVMemoryStore(open_kv(f"memory://op-type-{_name()}"))
    first = await store.write("a.md", "one", expected_version=None)
    for bad in ("op-1", 7, object()):
        with pytest.raises(TypeError, match="MemoryOperation"):
            await store.write("a.md", "two", expected_version=first.version, operation=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="MemoryOperation"):
            await store.write("b.md", "new", expected_version=None, operation=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="MemoryOperation"):
            await store.delete("a.md", expected_version=first.version, operation=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="MemoryOperation"):
            await store.get_operation(bad)  # type: ignore[arg-type]
    found = await store.read("a.md", max_chars=100)
    assert found is not None and found.content == "one" and found.version == first.version
    assert await store.read("b.md", max_chars=100) is None
    await store.aclose()
