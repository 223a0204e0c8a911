"""The memory contract: the harness memory protocols on any backend, and what we add to them.

Covers every behaviour of ``pydantic_ai_harness.memory``'s ``MemoryStore``,
``SearchableMemoryStore`` and ``MetadataMemoryStore`` (checked side by side with the
harness's own ``InMemoryMemoryStore`` where the harness defines the answer), the 15 guarantees
of pydantic-ai-memory-core's contract, and the ones that contract never had: lost
acknowledgements replay, crashes never wedge an operation id, receipts are collected,
search and listing cost a bounded number of round trips and never leave their namespace,
large files are chunked and never truncated. Each test's docstring states its guarantee.

The store under test is :class:`agent_stores.memory.KVMemoryStore` on the backend's KV
store (``memory_factory``); tests that check the storage layout say so.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import pytest
import pytest_asyncio
from agent_stores import BackendUnavailableError, KVStore, open_memory
from agent_stores.kv import Entry, ScanItem
from agent_stores.kv.counting import CountingKV
from agent_stores.memory import KVMemoryStore, append_memory, read_whole
from agent_stores.memory.port import KVMemoryPort
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextContent,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai_harness.memory import (
    InMemoryMemoryStore,
    Memory,
    MemoryConflictError,
    MemoryMutation,
    MemoryOperation,
    MemoryOperationConflictError,
    MemorySearchResult,
    MemoryStore,
    MetadataMemoryStore,
    SearchableMemoryStore,
)

from .base import ContractBase, KVFactory, require_capability

MemoryFactory = Callable[..., KVMemoryStore]

BAD_PATHS = [
    "",
    "/",
    "/a",
    "a/",
    "a//b",
    ".",
    "..",
    "a/./b",
    "a/../b",
    "a..b",
    "a b",
    " a",
    "a\x00b",
    "é",
    "a\\b",
    "a:b",
    "x" * 201,
    "ok/" + "y" * 201,
]
GOOD_EDGE_PATHS = ["-", "_", "a.b", "A-Z_0.9", "x" * 200, "a/" * 20 + "deep.md"]
BAD_PREFIXES = ["/", "//", "a//", "../", "./", "a/../", "a b/", "é"]


def offset_clock(kv: KVStore, seconds: float) -> None:
    """Move a KV client's clock forward (expiry and receipt age use the KV store's clock)."""
    base = kv.clock
    kv.clock = lambda: base() + seconds


def op(name: str, fingerprint: str = "fp") -> MemoryOperation:
    """A memory operation with a readable id."""
    return MemoryOperation(id=f"op-{name}", fingerprint=fingerprint)


def crash_content(size: int) -> str:
    """Deterministic content of ``size`` characters with multi-byte characters in it."""
    unit = "line é 😀 ünïcödé 日本語\n"
    return (unit * (size // len(unit) + 1))[:size]


T = TypeVar("T")


# -- fault injection ------------------------------------------------------------------------


class SimulatedCrash(BaseException):
    """The process running the store died. A BaseException so no ``except Exception`` survives it."""


class FaultKV(CountingKV):
    """A client that dies or loses an acknowledgement at a chosen write.

    ``crash_after=k``: the first k writes (create/replace/delete) reach the server, then the
    process dies: the (k+1)-th write never happens and every later call fails. With
    ``kill_process=True`` the process really is killed (SIGKILL) at that moment.
    ``lose_ack_at=k``: the k-th write lands, but the caller gets ``BackendUnavailableError``.
    A call of the backend's native memory port (carried through the wrapper) is one write.
    """

    def __init__(
        self,
        inner: KVStore,
        *,
        crash_after: int | None = None,
        lose_ack_at: int | None = None,
        kill_process: bool = False,
        native_ports: bool = True,
    ) -> None:
        super().__init__(inner, native_ports=native_ports)
        self.crash_after = crash_after
        self.lose_ack_at = lose_ack_at
        self.kill_process = kill_process
        self.writes_started = 0
        self.dead = False

    def _alive(self) -> None:
        if self.dead:
            raise SimulatedCrash("the process is dead")

    def _die(self) -> None:
        if self.kill_process:
            os.kill(os.getpid(), signal.SIGKILL)
        self.dead = True
        raise SimulatedCrash(f"crashed after {self.crash_after} writes")

    async def _write(self, call: Callable[[], Any]) -> Any:
        self._alive()
        if self.crash_after is not None and self.writes_started >= self.crash_after:
            self._die()
        self.writes_started += 1
        number = self.writes_started
        result = await call()
        self._alive()  # an answer arriving after the crash reaches no one
        if self.lose_ack_at == number:
            raise BackendUnavailableError(detail="connection reset: acknowledgement lost")
        return result

    async def through_port(
        self, call: str, run: Callable[[], Awaitable[T]], *, write: bool, sent: int, key: str
    ) -> T:
        """A native port's call is one step: a write the process may die before or lose the
        acknowledgement of, like any other."""
        counted = super().through_port
        if write:
            return cast(
                "T", await self._write(lambda: counted(call, run, write=write, sent=sent, key=key))
            )
        self._alive()
        return await counted(call, run, write=write, sent=sent, key=key)

    async def _get(self, scope: str, key: str) -> Entry | None:
        self._alive()
        return await super()._get(scope, key)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        self._alive()
        return await super()._get_many(scope, keys)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        self._alive()
        return await super()._scan(scope, prefix, start_after, limit, values, now)

    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        return str(
            await self._write(lambda: CountingKV._create(self, scope, key, value, expires_at, now))
        )

    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        return str(
            await self._write(
                lambda: CountingKV._replace(
                    self, scope, key, value, expected_version, expires_at, now
                )
            )
        )

    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        return bool(
            await self._write(lambda: CountingKV._delete(self, scope, key, expected_version, now))
        )

    async def _aclose(self) -> None:
        """The wrapped client belongs to the test."""


class ScopeRecordingKV(CountingKV):
    """Counts calls and records every scope read, for isolation checks."""

    def __init__(self, inner: KVStore) -> None:
        super().__init__(inner)
        self.scopes_read: set[str] = set()

    async def _get(self, scope: str, key: str) -> Entry | None:
        self.scopes_read.add(scope)
        return await super()._get(scope, key)

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        self.scopes_read.add(scope)
        return await super()._get_many(scope, keys)

    async def _scan(
        self, scope: str, prefix: str, start_after: str | None, limit: int, values: bool, now: float
    ) -> list[ScanItem]:
        self.scopes_read.add(scope)
        return await super()._scan(scope, prefix, start_after, limit, values, now)

    async def _aclose(self) -> None:
        """The wrapped client belongs to the test."""


@dataclass
class _Outcome:
    kind: str
    value: Any


async def _outcome(call: Any) -> _Outcome:
    try:
        return _Outcome("ok", await call)
    except ValueError as exc:
        return _Outcome("ValueError", type(exc).__name__)
    except TypeError as exc:
        return _Outcome("TypeError", type(exc).__name__)
    except MemoryConflictError as exc:
        return _Outcome("conflict", type(exc).__name__)


#: Each writer of the append race starts every append at a random moment of this window,
#: so the writers overlap whatever the backend's speed: on a fast one, the in-process
#: tasks finished before the processes had woken up, or one process after another.
RACE_WINDOW_SECONDS = 0.2


async def append_within_race_window(store: KVMemoryStore, path: str, line: str) -> None:
    """``append_memory`` after a random pause within :data:`RACE_WINDOW_SECONDS`."""
    await asyncio.sleep(random.random() * RACE_WINDOW_SECONDS)
    await append_memory(store, path, line)


def _lines(content: str) -> list[str]:
    return [line for line in content.split("\n") if line]


async def start_append_processes(
    store_url: str,
    memory_prefix: str,
    per_process: int,
    *,
    worker: str = "append",
    path: str = "u/main/log.md",
    tag: str = "proc",
) -> list[asyncio.subprocess.Process]:
    """3 ``memory_workers WORKER`` processes appending ``TAG<p>-<i>`` lines to ``path``,
    each ready and waiting for its go."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent_stores_contract.memory_workers",
            worker,
            store_url,
            memory_prefix,
            path,
            f"{tag}{p}",
            str(per_process),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for p in range(3)
    ]
    for proc in procs:
        assert proc.stdout is not None
        ready = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
        assert ready.strip() == b"ready", ready
    return procs


async def _race_appends(
    procs: Sequence[asyncio.subprocess.Process], stores: Sequence[KVMemoryStore]
) -> None:
    """Release the processes and start 50 appending tasks at once; every process must succeed."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    tasks = asyncio.gather(
        *(append_within_race_window(stores[i % 5], "u/main/log.md", f"task-{i}") for i in range(50))
    )
    outputs = await asyncio.gather(*(p.communicate() for p in procs))
    await tasks
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()


async def _assert_appends_landed_and_raced(store: KVMemoryStore, per_process: int) -> None:
    whole = await read_whole(store, "u/main/log.md")
    assert whole is not None
    expected = [f"task-{i}" for i in range(50)]
    expected += [f"proc{p}-{j}" for p in range(3) for j in range(per_process)]
    assert Counter(_lines(whole.content)) == Counter(expected)
    # Appended in order of landing: the 4 writers (tasks, 3 processes) one after
    # another would switch 3 times; more proves the appends really raced.
    sources = [line.split("-")[0] for line in _lines(whole.content)]
    switches = sum(1 for a, b in itertools.pairwise(sources) if a != b)
    assert switches > 3, f"the writers appended one after another ({switches} switches)"


class MemoryContract(ContractBase):
    """The memory store contract. Subclass it and provide ``store_url`` or ``kv_factory``."""

    pytestmark = pytest.mark.asyncio

    @pytest.fixture
    def memory_prefix(self, ns: str) -> str:
        """The scope prefix isolating this test's memory files."""
        return f"{ns}:memory:"

    @pytest.fixture
    def memory_factory(self, memory_prefix: str) -> MemoryFactory:
        """Builds a memory store on a KV client: ``memory_factory(kv, **options)``."""

        generic = self.store_path == "generic"

        def make(kv: KVStore, **options: Any) -> KVMemoryStore:
            if generic:
                options = {"port": KVMemoryPort(kv), **options}
            store = KVMemoryStore(kv, **{"scope_prefix": memory_prefix, **options})
            if generic:
                assert type(store.port) is KVMemoryPort, "not on the generic path"
            return store

        return make

    @pytest_asyncio.fixture
    async def memory(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> AsyncIterator[KVMemoryStore]:
        """A memory store on the ``kv`` client."""
        async with memory_factory(kv) as store:
            yield store

    # -- the protocols --------------------------------------------------------------------

    async def test_implements_harness_protocols(
        self, memory: KVMemoryStore, store_url: str
    ) -> None:
        """The store, also as opened by ``open_memory(url)``, is a MemoryStore, SearchableMemoryStore and MetadataMemoryStore."""
        assert isinstance(memory, MemoryStore)
        assert isinstance(memory, SearchableMemoryStore)
        assert isinstance(memory, MetadataMemoryStore)
        async with open_memory(store_url) as opened:
            assert isinstance(opened, MemoryStore)
            assert isinstance(opened, SearchableMemoryStore)
            assert isinstance(opened, MetadataMemoryStore)

    async def test_read_missing_is_none(self, memory: KVMemoryStore) -> None:
        """Reading a path never written returns None."""
        assert await memory.read("u/main/MEMORY.md", max_chars=100) is None

    async def test_read_truncates_to_max_chars(self, memory: KVMemoryStore) -> None:
        """read returns at most max_chars characters and sets truncated exactly when content was cut."""
        written = await memory.write("u/main/MEMORY.md", "0123456789", expected_version=None)
        cut = await memory.read("u/main/MEMORY.md", max_chars=4)
        assert cut is not None and cut.content == "0123" and cut.truncated
        assert cut.version == written.version and cut.operation_id is None
        exact = await memory.read("u/main/MEMORY.md", max_chars=10)
        assert exact is not None and exact.content == "0123456789" and not exact.truncated
        roomy = await memory.read("u/main/MEMORY.md", max_chars=1000)
        assert roomy is not None and roomy.content == "0123456789" and not roomy.truncated

    async def test_create_conflicts_when_path_exists(self, memory: KVMemoryStore) -> None:
        """expected_version=None means must-not-exist: writing over an existing file conflicts and changes nothing."""
        first = await memory.write("u/main/a.md", "one", expected_version=None)
        assert first.existed is False and first.replayed is False and first.version
        with pytest.raises(MemoryConflictError):
            await memory.write("u/main/a.md", "two", expected_version=None)
        current = await memory.read("u/main/a.md", max_chars=100)
        assert current is not None and current.content == "one" and current.version == first.version

    async def test_replace_needs_current_version(self, memory: KVMemoryStore) -> None:
        """A replace succeeds only with the current version; a stale or unknown version conflicts and writes nothing."""
        v1 = (await memory.write("u/main/a.md", "one", expected_version=None)).version
        second = await memory.write("u/main/a.md", "two", expected_version=v1)
        assert second.existed is True and second.version != v1
        for stale in (v1, "not-a-version", ""):
            with pytest.raises(MemoryConflictError):
                await memory.write("u/main/a.md", "stale", expected_version=stale)
        current = await memory.read("u/main/a.md", max_chars=100)
        assert (
            current is not None and current.content == "two" and current.version == second.version
        )

    async def test_write_absent_with_version_conflicts(self, memory: KVMemoryStore) -> None:
        """Writing a missing path with a version conflicts and does not create it."""
        with pytest.raises(MemoryConflictError):
            await memory.write("u/main/a.md", "x", expected_version="some-version")
        assert await memory.read("u/main/a.md", max_chars=10) is None
        assert await memory.list_paths("u/", limit=10) == []

    async def test_delete_semantics(self, memory: KVMemoryStore) -> None:
        """delete: stale version conflicts, None on an existing file conflicts, the current version
        deletes (existed=True, version None), and an absent path with None succeeds with existed=False."""
        v1 = (await memory.write("u/main/a.md", "one", expected_version=None)).version
        v2 = (await memory.write("u/main/a.md", "two", expected_version=v1)).version
        with pytest.raises(MemoryConflictError):
            await memory.delete("u/main/a.md", expected_version=v1)
        with pytest.raises(MemoryConflictError):
            await memory.delete("u/main/a.md", expected_version=None)
        assert await memory.read("u/main/a.md", max_chars=10) is not None
        gone = await memory.delete("u/main/a.md", expected_version=v2)
        assert gone.existed is True and gone.version is None and gone.replayed is False
        assert await memory.read("u/main/a.md", max_chars=10) is None
        absent = await memory.delete("u/main/a.md", expected_version=None)
        assert absent.existed is False and absent.version is None
        never = await memory.delete("u/main/never.md", expected_version=None)
        assert never.existed is False
        with pytest.raises(MemoryConflictError):
            await memory.delete("u/main/never.md", expected_version=v2)

    async def test_versions_fresh_on_every_mutation(self, memory: KVMemoryStore) -> None:
        """Every mutation yields a new opaque version (same content rewritten, delete then recreate
        included), and no earlier version is ever accepted again."""
        seen: list[str] = []
        version = (await memory.write("u/main/a.md", "same", expected_version=None)).version
        assert isinstance(version, str) and version
        seen.append(version)
        for _ in range(5):
            version = (await memory.write("u/main/a.md", "same", expected_version=version)).version
            assert version is not None
            seen.append(version)
        for _ in range(3):
            await memory.delete("u/main/a.md", expected_version=version)
            version = (await memory.write("u/main/a.md", "same", expected_version=None)).version
            assert version is not None
            seen.append(version)
        assert len(set(seen)) == len(seen)
        for old in seen[:-1]:
            with pytest.raises(MemoryConflictError):
                await memory.write("u/main/a.md", "resurrected", expected_version=old)

    async def test_deleted_file_leaves_no_trace(self, memory: KVMemoryStore) -> None:
        """A deleted file is not read, listed or searched, and can be created again from scratch."""
        v = (await memory.write("u/main/a.md", "findme", expected_version=None)).version
        await memory.write("u/main/b.md", "other", expected_version=None)
        await memory.delete("u/main/a.md", expected_version=v, operation=op("del"))
        assert await memory.list_paths("u/", limit=10) == ["u/main/b.md"]
        result = await memory.search(
            "u/main/", "findme", limit=5, max_files=10, max_chars=500, max_file_chars=100
        )
        assert result.matches == [] and result.scanned == 1
        again = await memory.write("u/main/a.md", "new", expected_version=None)
        assert again.existed is False and again.version != v

    # -- operation receipts ---------------------------------------------------------------

    async def test_write_operation_replays(self, memory: KVMemoryStore) -> None:
        """Repeating a write with the same operation returns the first result with replayed=True and writes nothing."""
        first = await memory.write("u/main/a.md", "one", expected_version=None, operation=op("w"))
        assert first.replayed is False
        again = await memory.write("u/main/a.md", "one", expected_version=None, operation=op("w"))
        assert again == type(first)(version=first.version, replayed=True, existed=False)
        current = await memory.read("u/main/a.md", max_chars=100)
        assert current is not None
        assert current.content == "one" and current.version == first.version
        assert current.operation_id == "op-w"
        # Still a replay after the file moved on.
        later = await memory.write("u/main/a.md", "two", expected_version=first.version)
        replay = await memory.write("u/main/a.md", "one", expected_version=None, operation=op("w"))
        assert replay.version == first.version and replay.replayed
        current = await memory.read("u/main/a.md", max_chars=100)
        assert current is not None and current.version == later.version

    async def test_delete_operation_replays(self, memory: KVMemoryStore) -> None:
        """A delete with an operation replays, also for a path that never existed (existed=False)."""
        v = (await memory.write("u/main/a.md", "one", expected_version=None)).version
        first = await memory.delete("u/main/a.md", expected_version=v, operation=op("d"))
        again = await memory.delete("u/main/a.md", expected_version=v, operation=op("d"))
        assert (again.version, again.replayed, again.existed) == (None, True, True)
        assert first.replayed is False
        absent = await memory.delete("u/main/zz.md", expected_version=None, operation=op("d2"))
        assert absent.existed is False and not absent.replayed
        replay = await memory.delete("u/main/zz.md", expected_version=None, operation=op("d2"))
        assert replay.existed is False and replay.replayed
        recreated = await memory.write("u/main/zz.md", "x", expected_version=None)
        assert recreated.existed is False
        # The receipt survives the file being recreated.
        assert (
            await memory.delete("u/main/zz.md", expected_version=None, operation=op("d2"))
        ).replayed

    async def test_reused_operation_with_other_fingerprint_conflicts(
        self, memory: KVMemoryStore
    ) -> None:
        """An operation id reused with another fingerprint raises MemoryOperationConflictError, on any path, and writes nothing."""
        await memory.write("u/main/a.md", "one", expected_version=None, operation=op("x", "fp1"))
        with pytest.raises(MemoryOperationConflictError):
            await memory.write(
                "u/main/a.md", "two", expected_version=None, operation=op("x", "fp2")
            )
        with pytest.raises(MemoryOperationConflictError):
            await memory.write(
                "u/main/b.md", "two", expected_version=None, operation=op("x", "fp2")
            )
        with pytest.raises(MemoryOperationConflictError):
            await memory.delete("u/main/a.md", expected_version=None, operation=op("x", "fp2"))
        with pytest.raises(MemoryOperationConflictError):
            await memory.get_operation(op("x", "fp2"))
        assert await memory.read("u/main/b.md", max_chars=10) is None
        current = await memory.read("u/main/a.md", max_chars=10)
        assert current is not None and current.content == "one"

    async def test_failed_operation_leaves_no_receipt(self, memory: KVMemoryStore) -> None:
        """A write or delete that conflicts records no receipt: get_operation finds nothing and the id can succeed later."""
        v = (await memory.write("u/main/a.md", "one", expected_version=None)).version
        with pytest.raises(MemoryConflictError):
            await memory.write("u/main/a.md", "two", expected_version="stale", operation=op("f"))
        with pytest.raises(MemoryConflictError):
            await memory.delete("u/main/a.md", expected_version="stale", operation=op("g"))
        assert await memory.get_operation(op("f")) is None
        assert await memory.get_operation(op("g")) is None
        ok = await memory.write("u/main/a.md", "two", expected_version=v, operation=op("f"))
        assert ok.replayed is False and ok.existed is True
        assert await memory.get_operation(op("f")) == type(ok)(ok.version, True, True)

    async def test_get_operation(self, memory: KVMemoryStore) -> None:
        """get_operation returns each completed write and delete (replayed=True) and None for unknown ids."""
        assert await memory.get_operation(op("unknown")) is None
        w = await memory.write("u/main/a.md", "one", expected_version=None, operation=op("w"))
        u = await memory.write("u/main/a.md", "two", expected_version=w.version, operation=op("u"))
        d = await memory.delete("u/main/a.md", expected_version=u.version, operation=op("d"))
        found = {name: await memory.get_operation(op(name)) for name in ("w", "u", "d")}
        assert found["w"] == type(w)(w.version, True, False)
        assert found["u"] == type(u)(u.version, True, True)
        assert found["d"] == type(d)(None, True, True)

    async def test_operation_ids_of_any_shape(self, memory: KVMemoryStore) -> None:
        """Operation ids and fingerprints are opaque strings of any length or content."""
        odd = [
            MemoryOperation(id="x" * 3000, fingerprint="y" * 3000),
            MemoryOperation(id="a/b:{c}\x00é😀", fingerprint="\n"),
            MemoryOperation(id="", fingerprint=""),
        ]
        for i, operation in enumerate(odd):
            first = await memory.write(
                f"u/main/f{i}.md", "c", expected_version=None, operation=operation
            )
            again = await memory.write(
                f"u/main/f{i}.md", "c", expected_version=None, operation=operation
            )
            assert again.replayed and again.version == first.version
            assert await memory.get_operation(operation) == again

    # -- listing --------------------------------------------------------------------------

    async def test_list_paths_sorted_prefixed_limited(self, memory: KVMemoryStore) -> None:
        """list_paths returns every path starting with the prefix (nested ones too), sorted, at most limit."""
        paths = [
            "u/main/MEMORY.md",
            "u/main/b.md",
            "u/main/a-b.md",
            "u/main/sub/x.md",
            "u/main/sub.md",
            "u/main0/y.md",
            "u/mainframe.md",
            "v/main/MEMORY.md",
            "top.md",
            "u/main/sub/deeper/z.md",
        ]
        for path in paths:
            await memory.write(path, path, expected_version=None)
        assert await memory.list_paths("", limit=100) == sorted(paths)
        assert await memory.list_paths("u/main/", limit=100) == sorted(
            p for p in paths if p.startswith("u/main/")
        )
        assert await memory.list_paths("u/main", limit=100) == sorted(
            p for p in paths if p.startswith("u/main")
        )
        assert await memory.list_paths("u/main/s", limit=100) == [
            "u/main/sub.md",
            "u/main/sub/deeper/z.md",
            "u/main/sub/x.md",
        ]
        assert (
            await memory.list_paths("u/", limit=3)
            == sorted(p for p in paths if p.startswith("u/"))[:3]
        )
        assert await memory.list_paths("nobody/", limit=5) == []
        assert await memory.list_paths(limit=1) == [sorted(paths)[0]]

    async def test_listing_pages_through_many_files(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """Listing and search stay correct when a directory holds more files than one scan page."""
        store = memory_factory(kv, page_size=7)
        names = [f"u/main/f{i:03d}.md" for i in range(40)]
        await asyncio.gather(*(store.write(n, f"note {n}", expected_version=None) for n in names))
        await store.write("u/main/sub/x.md", "x", expected_version=None)
        for i in range(0, 40, 3):
            await store.delete(names[i], expected_version=(await _version(store, names[i])))
        alive = [n for i, n in enumerate(names) if i % 3]
        assert await store.list_paths("u/main/", limit=1000) == sorted([*alive, "u/main/sub/x.md"])
        assert (
            await store.list_paths("u/main/", limit=11) == sorted([*alive, "u/main/sub/x.md"])[:11]
        )
        result = await store.search(
            "u/main/", "note", limit=100, max_files=1000, max_chars=100_000, max_file_chars=100
        )
        assert sorted(m.path for m in result.matches) == alive
        assert result.scanned == len(alive) and not result.truncated

    async def test_listing_never_leaves_the_namespace(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """Listing one namespace reads only its own scopes and a bounded number of them: other
        namespaces, including ones whose names extend it, are never scanned or read."""
        recorder = ScopeRecordingKV(kv)
        store = memory_factory(recorder)
        big = "z" * 2000
        for i in range(60):
            await store.write(f"bob/main/f{i:02d}.md", big, expected_version=None)
        await store.write("bob/main/deep/er/x.md", big, expected_version=None)
        await store.write("alice/main/MEMORY.md", "a", expected_version=None)
        await store.write("alice/main/sub/n.md", "n", expected_version=None)
        await store.write("alice/mainframe/x.md", big, expected_version=None)
        await store.write("alicex/main/x.md", big, expected_version=None)

        async def scopes_of(prefix: str) -> tuple[set[str], list[str], int, int]:
            recorder.scopes_read.clear()
            recorder.reset_counts()
            listed = await store.list_paths(prefix, limit=100)
            return set(recorder.scopes_read), listed, recorder.total_calls, recorder.bytes_read

        alice, listed, calls, read = await scopes_of("alice/main/")
        assert listed == ["alice/main/MEMORY.md", "alice/main/sub/n.md"]
        assert calls <= 2, "one scan per directory under the prefix"
        assert read < 2000, "no other namespace's content was read"
        for other in ("bob/main/", "alice/mainframe/", "alicex/"):
            scopes, _, _, _ = await scopes_of(other)
            assert not (scopes & alice), f"{other} shares a scope with alice/main/"
        recorder.reset_counts()
        await store.search(
            "alice/main/", "a", limit=5, max_files=10, max_chars=100, max_file_chars=100
        )
        assert recorder.bytes_read < 2000

    # -- search ---------------------------------------------------------------------------

    async def test_search_matches_harness_reference(self, memory: KVMemoryStore) -> None:
        """search returns exactly what the harness's own InMemoryMemoryStore returns (matches, snippets,
        scores, scanned, truncated) for the same files, queries and bounds."""
        files = {
            "u/main/MEMORY.md": "- likes tea\n- lives in Lisbon\n",
            "u/main/tea.md": "green tea, black tea, oolong tea " * 20,
            "u/main/travel.md": "Lisbon in May; Porto in June. " * 10,
            "u/main/empty.md": "",
            "u/main/sub/nested-tea.md": "tea tea tea",
            "u/mainframe/tea.md": "tea tea",
            "v/main/tea.md": "tea",
            "u/main/z.md": "nothing relevant " * 100,
        }
        reference = InMemoryMemoryStore()
        for path, content in files.items():
            await memory.write(path, content, expected_version=None)
            await reference.write(path, content, expected_version=None)
        cases: list[tuple[str, str, dict[str, int]]] = [
            ("u/main/", "tea", {}),
            ("u/main/", "TEA lisbon", {}),
            ("u/main/", "tea", {"limit": 1}),
            ("u/main/", "tea", {"max_files": 2}),
            ("u/main/", "tea", {"max_chars": 30}),
            ("u/main/", "tea", {"max_file_chars": 10}),
            ("u/main/", "relevant", {"max_file_chars": 50, "max_chars": 15}),
            ("u/main", "tea", {}),
            ("u/main/t", "tea", {}),
            ("u/", "tea", {}),
            ("", "tea", {}),
            ("u/main/", "absent-term", {}),
            ("u/main/", "   ", {}),
            ("u/main/", "tea", {"limit": 0}),
            ("u/main/", "tea", {"max_files": 0}),
            ("u/main/", "tea", {"max_chars": -1}),
            ("u/main/", "tea", {"max_file_chars": 0}),
        ]
        for prefix, query, bounds in cases:
            kwargs: dict[str, Any] = {
                "limit": 10,
                "max_files": 100,
                "max_chars": 4000,
                "max_file_chars": 65536,
                **bounds,
            }
            ours = await memory.search(prefix, query, **kwargs)
            theirs = await reference.search(prefix, query, **kwargs)
            assert isinstance(ours, MemorySearchResult)
            assert ours == theirs, (prefix, query, bounds)

    async def test_search_is_scoped_and_bounded(self, memory: KVMemoryStore) -> None:
        """search sees only files directly below its prefix and honours limit, max_files, max_chars
        and max_file_chars, reporting scanned and truncated."""
        for i in range(12):
            await memory.write(f"u/main/n{i:02d}.md", f"apple {'pear ' * i}", expected_version=None)
        await memory.write("u/main/deep/apple.md", "apple apple apple", expected_version=None)
        await memory.write("u/other/apple.md", "apple apple apple", expected_version=None)
        full = await memory.search(
            "u/main/", "apple", limit=100, max_files=100, max_chars=100_000, max_file_chars=1000
        )
        assert full.scanned == 12 and not full.truncated
        assert {m.path for m in full.matches} == {f"u/main/n{i:02d}.md" for i in range(12)}
        limited = await memory.search(
            "u/main/", "apple", limit=3, max_files=100, max_chars=100_000, max_file_chars=1000
        )
        assert len(limited.matches) == 3 and limited.truncated
        few = await memory.search(
            "u/main/", "apple", limit=100, max_files=5, max_chars=100_000, max_file_chars=1000
        )
        assert few.scanned == 5 and few.truncated
        assert {m.path for m in few.matches} == {f"u/main/n{i:02d}.md" for i in range(5)}
        short = await memory.search(
            "u/main/", "pear", limit=100, max_files=100, max_chars=40, max_file_chars=1000
        )
        assert (
            sum(len(m.path.removeprefix("u/main/")) + len(m.snippet) for m in short.matches) <= 40
        )
        assert short.truncated
        clipped = await memory.search(
            "u/main/", "pear", limit=100, max_files=100, max_chars=100_000, max_file_chars=8
        )
        assert clipped.matches == [] and clipped.truncated  # "pear" lies past the 8th character

    async def test_search_round_trips_are_bounded(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """search reads its files in scan pages plus one batched read of chunks, never one round trip per file."""
        counting = CountingKV(kv)
        store = memory_factory(counting, max_record_bytes=4096)
        for i in range(30):
            size = 6000 if i % 3 == 0 else 200  # every third file is chunked
            await store.write(
                f"u/main/f{i:02d}.md", crash_content(size) + " needle", expected_version=None
            )
        counting.reset_counts()
        result = await store.search(
            "u/main/", "needle", limit=50, max_files=100, max_chars=100_000, max_file_chars=10_000
        )
        assert result.scanned == 30 and len(result.matches) == 30
        assert counting.calls["get"] == 0
        assert counting.total_calls <= 2, dict(counting.calls)

    async def test_search_and_read_are_async_safe(self, memory: KVMemoryStore) -> None:
        """search is a coroutine that yields while scoring (the harness's lexical_search is awaited, not called),
        so concurrent searches and writes interleave without error."""
        for i in range(20):
            await memory.write(f"u/main/f{i}.md", "word " * 500, expected_version=None)

        async def search() -> int:
            r = await memory.search(
                "u/main/", "word", limit=5, max_files=100, max_chars=1000, max_file_chars=5000
            )
            return int(r.scanned)

        async def writer() -> None:
            for i in range(10):
                await memory.write(f"u/main/g{i}.md", "word", expected_version=None)

        results = await asyncio.gather(*(search() for _ in range(5)), writer())
        assert all(isinstance(n, int) and 20 <= n <= 30 for n in results[:5])

    # -- validation, exactly as the harness -----------------------------------------------

    async def test_bad_paths_and_bounds_match_harness(self, memory: KVMemoryStore) -> None:
        """Bad paths, prefixes, bounds and metadata raise ValueError/TypeError exactly where the harness's
        InMemoryMemoryStore does, and valid edge cases are accepted by both."""
        reference = InMemoryMemoryStore()
        bad_metadata: list[Any] = [{"k": 1}, {"k\x00": "v"}, {"k": "v" * 5000}, {1: "v"}]
        for store in (memory, reference):
            await store.write("ok/exists.md", "x", expected_version=None)

        async def both(method: str, *args: Any, **kwargs: Any) -> None:
            ours = await _outcome(getattr(memory, method)(*args, **kwargs))
            theirs = await _outcome(getattr(reference, method)(*args, **kwargs))
            assert ours.kind == theirs.kind, (method, args, kwargs, ours, theirs)

        for path in [*BAD_PATHS, *GOOD_EDGE_PATHS]:
            await both("read", path, max_chars=10)
            await both("write", path, "c", expected_version=None)
            await both("delete", path, expected_version=None)
            await both("write_with_metadata", path, "c", expected_version=None, metadata={"k": "v"})
        for prefix in [*BAD_PREFIXES, "", "ok", "ok/", "ok/e"]:
            await both("list_paths", prefix, limit=5)
            await both("search", prefix, "x", limit=1, max_files=1, max_chars=10, max_file_chars=10)
        for bound in (0, -1):
            await both("read", "ok/exists.md", max_chars=bound)
            await both("list_paths", "ok/", limit=bound)
        for metadata in bad_metadata:
            await both(
                "write_with_metadata", "ok/m.md", "c", expected_version=None, metadata=metadata
            )
            # A bad path is reported before bad metadata.
            await both("write_with_metadata", "../m", "c", expected_version=None, metadata=metadata)
        with pytest.raises(ValueError):
            await memory.read("../etc/passwd", max_chars=10)
        assert await memory.list_paths("", limit=1000) == await reference.list_paths("", limit=1000)

    # -- metadata -------------------------------------------------------------------------

    async def test_metadata_round_trips(self, memory: KVMemoryStore) -> None:
        """write_with_metadata records metadata with the version; write records none; an empty mapping is none;
        a replay keeps the stored metadata; delete removes it."""
        meta = {"updated_by": "agent", "user": "ünï 😀", "quote": '"\\\n'}
        v1 = await memory.write_with_metadata(
            "u/main/a.md", "one", expected_version=None, metadata=meta, operation=op("m")
        )
        read = await memory.read("u/main/a.md", max_chars=10)
        assert read is not None and read.metadata == meta
        replay = await memory.write_with_metadata(
            "u/main/a.md", "one", expected_version=None, metadata={"other": "x"}, operation=op("m")
        )
        assert replay.replayed
        read = await memory.read("u/main/a.md", max_chars=10)
        assert read is not None and read.metadata == meta
        v2 = await memory.write("u/main/a.md", "two", expected_version=v1.version)
        read = await memory.read("u/main/a.md", max_chars=10)
        assert read is not None and read.metadata is None
        v3 = await memory.write_with_metadata(
            "u/main/a.md", "three", expected_version=v2.version, metadata={}
        )
        read = await memory.read("u/main/a.md", max_chars=10)
        assert read is not None and read.metadata is None
        largest = {"k": "é" * 4000}
        v4 = await memory.write_with_metadata(
            "u/main/a.md", "four", expected_version=v3.version, metadata=largest
        )
        read = await memory.read("u/main/a.md", max_chars=10)
        assert read is not None and read.metadata == largest
        await memory.delete("u/main/a.md", expected_version=v4.version)
        await memory.write("u/main/a.md", "five", expected_version=None)
        read = await memory.read("u/main/a.md", max_chars=10)
        assert read is not None and read.metadata is None

    # -- beyond the anchors: atomic receipts ------------------------------------------------

    async def test_lost_acknowledgement_replays(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """A write or delete that landed but whose acknowledgement was lost is replayed when retried with
        the same operation (same version, replayed=True), never reported as a conflict; get_operation then finds it."""
        store = memory_factory(kv)
        v0 = (await store.write("u/main/a.md", "zero", expected_version=None)).version
        faulty = FaultKV(kv, lose_ack_at=1)  # the first write of the next call is the file's CAS
        with pytest.raises(BackendUnavailableError):
            await memory_factory(faulty).write(
                "u/main/a.md", "one", expected_version=v0, operation=op("w")
            )
        landed = await store.read("u/main/a.md", max_chars=100)
        assert landed is not None and landed.content == "one", "the write landed"
        retry = await store.write("u/main/a.md", "one", expected_version=v0, operation=op("w"))
        assert retry.replayed and retry.version == landed.version and retry.existed
        assert await store.get_operation(op("w")) == retry
        after = await store.read("u/main/a.md", max_chars=100)
        assert after is not None and after.version == landed.version

        faulty = FaultKV(kv, lose_ack_at=1)
        with pytest.raises(BackendUnavailableError):
            await memory_factory(faulty).delete(
                "u/main/a.md", expected_version=landed.version, operation=op("d")
            )
        assert await store.read("u/main/a.md", max_chars=10) is None
        retry_delete = await store.delete(
            "u/main/a.md", expected_version=landed.version, operation=op("d")
        )
        assert retry_delete.replayed and retry_delete.existed and retry_delete.version is None

    async def test_lost_acknowledgement_append_lands_once(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """append_memory retried with the same operation after a lost acknowledgement appends exactly once."""
        store = memory_factory(kv)
        await store.write("u/main/log.md", "first", expected_version=None)
        faulty = FaultKV(kv, lose_ack_at=1)
        with pytest.raises(BackendUnavailableError):
            await append_memory(
                memory_factory(faulty), "u/main/log.md", "second", operation=op("a")
            )
        result = await append_memory(store, "u/main/log.md", "second", operation=op("a"))
        assert result.replayed
        current = await store.read("u/main/log.md", max_chars=1000)
        assert current is not None and current.content == "first\nsecond"

    async def test_crash_between_any_two_steps_never_wedges(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """A process dying after any number of the writes a mutation makes (chunks, directory markers, the
        record CAS, the receipt index, chunk cleanup) leaves the operation retryable: the retry completes or
        replays, the content is exactly right, and the id then replays and detects reuse as usual."""
        options: dict[str, Any] = {"max_record_bytes": 2048}
        size = 7000  # several chunks at 2 KiB
        for label, seeded, is_delete in (
            ("create", False, False),
            ("update", True, False),
            ("delete", True, True),
        ):
            probe = FaultKV(kv)
            expected = await _seed(
                memory_factory(kv, **options), f"u/{label}/probe/MEMORY.md", seeded, size
            )
            await _mutate_once(
                memory_factory(probe, **options),
                f"u/{label}/probe/MEMORY.md",
                expected,
                is_delete,
                size,
                f"{label}-probe",
            )
            writes = probe.writes_started
            assert writes >= 1
            for k in range(writes + 1):
                path = f"u/{label}/k{k}/MEMORY.md"
                expected = await _seed(memory_factory(kv, **options), path, seeded, size)
                dying = FaultKV(kv, crash_after=k)
                crashed = False
                try:
                    await _mutate_once(
                        memory_factory(dying, **options),
                        path,
                        expected,
                        is_delete,
                        size,
                        f"{label}-{k}",
                    )
                except SimulatedCrash:
                    crashed = True
                assert crashed == (k < writes), (label, k, writes)
                # The retry runs in a "new process": a store with nothing cached.
                await _check_retry(
                    memory_factory(kv, **options),
                    path,
                    expected,
                    is_delete,
                    size,
                    f"{label}-{k}",
                    crashed,
                )
            collector = memory_factory(kv, **options, chunk_grace_seconds=0)
            await collector.collect_garbage(f"u/{label}")
            for k in range(writes + 1):
                whole = await read_whole(collector, f"u/{label}/k{k}/MEMORY.md")
                if is_delete:
                    assert whole is None
                else:
                    assert whole is not None and whole.content == crash_content(size)

    async def test_killed_process_never_wedges(
        self, kv: KVStore, store_url: str, memory_prefix: str, memory_factory: MemoryFactory
    ) -> None:
        """A real OS process SIGKILLed in the middle of a chunked write (before the CAS, right after it, or
        after the index) leaves the operation retryable by another process with the exact content."""
        require_capability(
            kv,
            "shared_across_processes",
            "process-local: there is no data for a second process to share",
        )
        options: dict[str, Any] = {"max_record_bytes": 2048}
        size = 7000
        probe = FaultKV(kv)
        await _mutate_once(
            memory_factory(probe, **options), "k/probe/MEMORY.md", None, False, size, "kill-probe"
        )
        writes = probe.writes_started
        for k in sorted({0, writes // 2, writes - 2, writes - 1}):
            path = f"k/n{k}/MEMORY.md"
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent_stores_contract.memory_workers",
                "crash-write",
                store_url,
                memory_prefix,
                path,
                str(size),
                str(k),
                f"kill-{k}",
                "2048",
                self.store_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            _, err = await proc.communicate()
            assert proc.returncode == -signal.SIGKILL, err.decode()
            await _check_retry(
                memory_factory(kv, **options), path, None, False, size, f"kill-{k}", True
            )

    async def test_receipts_bounded_and_collected(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """A file record keeps a bounded number of receipts; after receipt_ttl the receipt index entries and
        tombstones expire, an old operation id is forgotten, and only live records and directory markers remain
        (layout of KVMemoryStore)."""
        counting = CountingKV(kv)
        store = memory_factory(counting, max_receipts_per_file=4, receipt_ttl_seconds=60)
        version = (
            await store.write("u/main/a.md", "c", expected_version=None, operation=op("0"))
        ).version
        sizes: list[int] = []
        for i in range(1, 25):
            version = (
                await store.write(
                    "u/main/a.md", "c", expected_version=version, operation=op(str(i))
                )
            ).version
            counting.reset_counts()
            await store.read("u/main/a.md", max_chars=10)
            sizes.append(counting.bytes_read)
        assert max(sizes[4:]) <= sizes[3] + 16, f"the record grows with every receipt: {sizes}"
        # Within the TTL, old operations still replay through the receipt index.
        assert (await store.get_operation(op("0"))) is not None
        assert (
            await store.write("u/main/a.md", "c", expected_version=None, operation=op("0"))
        ).replayed
        for i in range(5):
            v = (await store.write(f"u/main/t{i}.md", "t", expected_version=None)).version
            await store.delete(f"u/main/t{i}.md", expected_version=v, operation=op(f"del{i}"))
        offset_clock(kv, 61)
        assert await store.get_operation(op("0")) is None
        assert await store.get_operation(op("del0")) is None
        fresh = await store.write("u/main/a.md", "c", expected_version=version, operation=op("0"))
        assert fresh.replayed is False, "a collected operation id is new again"
        leftovers = []
        for scope in await kv.scopes(prefix=store.scope_prefix, limit=1000):
            async for item in kv.iter_scan(scope, values=False):
                leftovers.append((scope, item.key))
        receipts_left = [x for x in leftovers if "~ops" in x[0]]
        assert len(receipts_left) == 1, "only the index entry of the write made after the TTL"
        records = [x for x in leftovers if "~ops" not in x[0] and not x[1].endswith("/")]
        assert records == [(store.directory_scope("u/main"), "a.md")], "tombstones are gone"

    async def test_expired_operation_id_never_swallows_a_write(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """Once receipt_ttl has passed (exactly on the boundary: expires_at == now), a write with the same operation id is new:
        it writes its content and is not reported as replayed, even while the old receipt still sits in the
        file record."""
        store = memory_factory(kv, receipt_ttl_seconds=60)
        start = kv.clock()
        kv.clock = lambda: start  # the store's clock, held still so the boundary is exact
        first = await store.write("u/main/r.md", "one", expected_version=None, operation=op("x"))
        assert not first.replayed
        kv.clock = lambda: start + 60  # expires_at == now: expired
        assert await store.get_operation(op("x")) is None
        again = await store.write(
            "u/main/r.md", "two", expected_version=first.version, operation=op("x")
        )
        assert not again.replayed, "a forgotten operation id was taken for a replay"
        found = await store.read("u/main/r.md", max_chars=100)
        assert found is not None and found.content == "two"

    # -- large files ----------------------------------------------------------------------

    async def test_large_file_never_truncated(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """A 70,000-character file on a store whose records hold at most 16 KiB keeps every character through
        append_memory (the old store cut files at 65,536); bounded reads see the right prefix."""
        store = memory_factory(kv, max_record_bytes=16384)
        base = crash_content(70_000)
        await store.write("u/main/big.md", base, expected_version=None)
        mutation = await append_memory(store, "u/main/big.md", "the tail")
        assert mutation.existed
        whole = await read_whole(store, "u/main/big.md")
        assert not base.endswith("\n")
        assert whole is not None and whole.content == base + "\nthe tail"
        assert len(whole.content) == 70_009
        for max_chars in (1, 100, 16384, 65536, 70_008):
            part = await store.read("u/main/big.md", max_chars=max_chars)
            assert part is not None and part.content == whole.content[:max_chars] and part.truncated
        found = await store.search(
            "u/main/", "tail", limit=1, max_files=1, max_chars=100, max_file_chars=100_000
        )
        assert [m.path for m in found.matches] == ["u/main/big.md"]

    async def test_content_round_trips_exactly(
        self, kv: KVStore, memory_factory: MemoryFactory
    ) -> None:
        """Any string round-trips exactly, inline or chunked: multi-byte characters across chunk
        boundaries, NUL, lone surrogates, newlines, the empty string."""
        small = memory_factory(kv, max_record_bytes=1024)
        samples = [
            "",
            "\x00\x01\n\r\t",
            "😀" * 900,
            "a" + "é" * 1500,
            "日本語" * 700,
            "\ud800 lone surrogate \udfff",
            crash_content(5000),
        ]
        for i, text in enumerate(samples):
            for store in (small, memory_factory(kv)):
                path = f"u/{'s' if store is small else 'n'}/f{i}.md"
                await store.write(path, text, expected_version=None)
                whole = await read_whole(store, path)
                assert whole is not None and whole.content == text and not whole.truncated
                if text:
                    cut = await store.read(path, max_chars=max(1, len(text) // 3))
                    assert cut is not None and cut.content == text[: max(1, len(text) // 3)]

    # -- retention ------------------------------------------------------------------------

    async def test_purge_older_than_deletes_files_not_written_for_that_long(
        self, kv_factory: KVFactory, memory_factory: MemoryFactory
    ) -> None:
        """Retention without native expiry: purge_older_than deletes the files under its
        prefix whose current version is older than the period (a chunked one with its
        chunks), keeps a file rewritten since, a young one and every file outside the
        prefix (value and version), and a second run deletes nothing."""
        writer_kv, purger_kv = kv_factory(), kv_factory()
        try:
            writer = memory_factory(writer_kv)
            big = "long " * writer_kv.limits.max_value_bytes
            for path in ("u/old.md", "u/notes/big.md", "u/renewed.md", "v/old.md"):
                await writer.write(path, big if "big" in path else path, expected_version=None)
            base = purger_kv.clock
            purger_kv.clock = lambda: base() + 40 * 86_400
            writer_kv.clock = purger_kv.clock
            renewed = await writer.read("u/renewed.md", max_chars=100)
            assert renewed is not None
            await writer.write("u/renewed.md", "again", expected_version=renewed.version)
            await writer.write("u/young.md", "new", expected_version=None)
            outside = await writer.read("v/old.md", max_chars=100)
            purger = memory_factory(purger_kv)
            report = await purger.purge_older_than(30 * 86_400, prefix="u/")
            assert sorted(report.removed) == ["u/notes/big.md", "u/old.md"]
            assert report.scanned == 4 and report.undated == 0
            assert await writer.list_paths("", limit=10) == [
                "u/renewed.md",
                "u/young.md",
                "v/old.md",
            ]
            assert await writer.read("u/notes/big.md", max_chars=10) is None
            chunks = await purger_kv.scan(
                writer.directory_scope("u/notes"), prefix="~c/", limit=10, values=False
            )
            assert chunks == []
            assert await writer.read("v/old.md", max_chars=100) == outside
            again = await purger.purge_older_than(30 * 86_400, prefix="u/")
            assert again.removed == () and again.scanned == 2
        finally:
            await writer_kv.aclose()
            await purger_kv.aclose()

    # -- concurrency ----------------------------------------------------------------------

    async def test_two_clients_share_memory(
        self, kv_factory: KVFactory, memory_factory: MemoryFactory
    ) -> None:
        """Two stores on two clients see each other's files and versions and conflict with each other."""
        a_kv, b_kv = kv_factory(), kv_factory()
        try:
            a, b = memory_factory(a_kv), memory_factory(b_kv)
            written = await a.write(
                "u/main/a.md", "from a", expected_version=None, operation=op("s")
            )
            seen = await b.read("u/main/a.md", max_chars=100)
            assert seen is not None and seen.content == "from a" and seen.version == written.version
            assert await b.get_operation(op("s")) is not None
            with pytest.raises(MemoryConflictError):
                await b.write("u/main/a.md", "from b", expected_version=None)
            assert await b.list_paths("u/", limit=10) == ["u/main/a.md"]
        finally:
            await a_kv.aclose()
            await b_kv.aclose()

    async def test_concurrent_creates_single_winner(
        self, kv_factory: KVFactory, memory_factory: MemoryFactory
    ) -> None:
        """20 tasks on 4 clients creating one path at once: exactly one succeeds and its content is stored."""
        clients = [kv_factory() for _ in range(4)]
        stores = [memory_factory(c) for c in clients]

        async def attempt(i: int) -> int | None:
            try:
                await stores[i % 4].write("u/main/once.md", f"writer {i}", expected_version=None)
                return i
            except MemoryConflictError:
                return None

        try:
            winners = [
                w for w in await asyncio.gather(*(attempt(i) for i in range(20))) if w is not None
            ]
            assert len(winners) == 1
            current = await stores[0].read("u/main/once.md", max_chars=100)
            assert current is not None and current.content == f"writer {winners[0]}"
        finally:
            for client in clients:
                await client.aclose()

    async def test_concurrent_appends_from_tasks(
        self, kv_factory: KVFactory, memory_factory: MemoryFactory
    ) -> None:
        """50 concurrent append_memory calls from tasks on 5 clients all land, each exactly once."""
        clients = [kv_factory() for _ in range(5)]
        stores = [memory_factory(c) for c in clients]
        try:
            await asyncio.gather(
                *(append_memory(stores[i % 5], "u/main/log.md", f"task-{i}") for i in range(50))
            )
            whole = await read_whole(stores[0], "u/main/log.md")
            assert whole is not None
            assert Counter(_lines(whole.content)) == Counter(f"task-{i}" for i in range(50))
        finally:
            for client in clients:
                await client.aclose()

    async def test_concurrent_appends_from_tasks_and_processes(
        self,
        kv: KVStore,
        kv_factory: KVFactory,
        store_url: str,
        memory_prefix: str,
        memory_factory: MemoryFactory,
    ) -> None:
        """50 appends from tasks and 3 OS processes released together race (their lines interleave) and all land, each exactly once."""
        require_capability(
            kv,
            "shared_across_processes",
            "process-local: there is no data for a second process to share",
        )
        per_process = 10
        procs = await start_append_processes(store_url, memory_prefix, per_process)
        clients = [kv_factory() for _ in range(5)]
        stores = [memory_factory(c) for c in clients]
        try:
            await _race_appends(procs, stores)
            await _assert_appends_landed_and_raced(stores[0], per_process)
        finally:
            for client in clients:
                await client.aclose()

    # -- end to end -----------------------------------------------------------------------

    async def test_memory_capability_end_to_end(self, store_url: str, ns: str) -> None:
        """Through the real harness Memory capability on an Agent with a scripted FunctionModel: run 1 writes
        memory (with write metadata); run 2 of the same user sees it injected and finds it with search_memory;
        another namespace sees nothing; replaying run 1's tool call (same run id, step and tool call id) does
        not write twice."""
        model = _ScriptedModel()
        async with open_memory(store_url) as store:
            agent = Agent(
                FunctionModel(model),
                deps_type=_User,
                capabilities=[
                    Memory(
                        store=store,
                        namespace=lambda ctx: f"{ns}-{ctx.deps.name}",
                        write_metadata={"updated_by": "agent"},
                    )
                ],
            )
            alice, bob = _User("alice"), _User("bob")
            path = f"{ns}-alice/main/MEMORY.md"
            run_id = f"{ns}-run-1"

            await agent.run("remember: likes green tea", deps=alice, run_id=run_id)
            first: dict[str, Any] = model.tool_results[-1]
            assert first["status"] == "created" and first["replayed"] is False
            written = await store.read(path, max_chars=10_000)
            assert written is not None and written.content == "- likes green tea\n"
            assert written.metadata == {"updated_by": "agent"}

            await agent.run("what do I like?", deps=alice)
            assert "likes green tea" in model.seen[-1], (
                "run 2 of the same user sees the memory injected"
            )

            await agent.run("search: green", deps=alice)
            found = model.tool_results[-1]
            assert [m["file"] for m in found["matches"]] == ["MEMORY.md"] and found["scanned"] == 1

            await agent.run("what do I like?", deps=bob)
            assert "green tea" not in model.seen[-1], "another namespace sees nothing"
            assert await store.list_paths(f"{ns}-bob/", limit=10) == []

            await agent.run("remember: likes green tea", deps=alice, run_id=run_id)
            replayed: dict[str, Any] = model.tool_results[-1]
            assert replayed["replayed"] is True and replayed["version"] == written.version
            after = await store.read(path, max_chars=10_000)
            assert after is not None
            assert after.content == "- likes green tea\n" and after.version == written.version
            assert await store.list_paths(f"{ns}-alice/", limit=10) == [path]


@dataclass
class _User:
    name: str


class _ScriptedModel:
    """A FunctionModel script: ``remember: X`` writes memory, ``search: X`` searches, else it answers.

    Records the user-channel text of every request (``seen``), memory snapshots included,
    and the content of every tool result (``tool_results``). The command is the run's user
    prompt: the first text part of its first request (each run starts a new conversation).
    What capabilities add later is not it: since pydantic-ai-harness 0.75 the memory snapshot
    reaches the model as user-channel parts after the prompt (a ``<system>`` note, then the
    ``<memory>`` block).
    """

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.tool_results: list[Any] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        texts: list[str] = []
        prompt = ""
        for message in messages:
            if not isinstance(message, ModelRequest):
                continue
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    if isinstance(part.content, str):
                        texts.append(part.content)
                        prompt = prompt or part.content
                    else:
                        texts += [c.content for c in part.content if isinstance(c, TextContent)]
                        texts += [c for c in part.content if isinstance(c, str)]
        self.seen.append("\n".join(texts))
        returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if returns:
            self.tool_results += [p.content for p in returns]
            return ModelResponse(parts=[TextPart("noted")])
        if prompt.startswith("remember: "):
            fact = prompt.removeprefix("remember: ")
            call = ToolCallPart("write_memory", {"content": f"- {fact}"}, tool_call_id="call-1")
            return ModelResponse(parts=[call])
        if prompt.startswith("search: "):
            query = prompt.removeprefix("search: ")
            call = ToolCallPart("search_memory", {"query": query}, tool_call_id="call-2")
            return ModelResponse(parts=[call])
        return ModelResponse(parts=[TextPart("hello")])


async def _version(store: KVMemoryStore, path: str) -> str:
    current = await store.read(path, max_chars=1)
    assert current is not None
    return str(current.version)


async def _seed(store: KVMemoryStore, path: str, seeded: bool, size: int) -> str | None:
    """Create ``path`` (half-size content) when the scenario mutates an existing file; its version."""
    if not seeded:
        return None
    written = await store.write(path, crash_content(size // 2), expected_version=None)
    return str(written.version)


async def _mutate_once(
    store: KVMemoryStore, path: str, expected: str | None, is_delete: bool, size: int, name: str
) -> None:
    if is_delete:
        await store.delete(path, expected_version=expected, operation=op(name))
    else:
        await store.write(path, crash_content(size), expected_version=expected, operation=op(name))


async def _check_retry(
    store: KVMemoryStore,
    path: str,
    expected: str | None,
    is_delete: bool,
    size: int,
    name: str,
    crashed: bool,
) -> None:
    """The retry of a possibly crashed mutation succeeds with the right end state, then behaves as a receipt."""
    if is_delete:
        retry = await store.delete(path, expected_version=expected, operation=op(name))
        assert retry.version is None
        assert await store.read(path, max_chars=10) is None
    else:
        retry = await store.write(
            path, crash_content(size), expected_version=expected, operation=op(name)
        )
        assert retry.version is not None
        whole = await read_whole(store, path)
        assert whole is not None and whole.content == crash_content(size)
        assert whole.version == retry.version and whole.operation_id == op(name).id
    assert crashed or retry.replayed, "a mutation that completed must replay"
    again = await _mutate_again(store, path, expected, is_delete, size, name)
    assert again.replayed and again.version == retry.version
    assert await store.get_operation(op(name)) == again
    with pytest.raises(MemoryOperationConflictError):
        await store.write(path, "other", expected_version=None, operation=op(name, "other-fp"))


async def _mutate_again(
    store: KVMemoryStore, path: str, expected: str | None, is_delete: bool, size: int, name: str
) -> MemoryMutation:
    if is_delete:
        return await store.delete(path, expected_version=expected, operation=op(name))
    return await store.write(
        path, crash_content(size), expected_version=expected, operation=op(name)
    )
