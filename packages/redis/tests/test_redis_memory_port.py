"""The native memory port on Redis: the memory contract on the generic path as well (the
native path runs in ``test_redis_contract``), and a memory write as one script.

Commands are counted on the client (each one a round trip), never timed.
"""

from __future__ import annotations

import pytest
from agent_stores import connect
from agent_stores.memory._harness import MemoryOperation, MemoryOperationConflictError
from agent_stores_contract import MemoryContract
from agent_stores_redis.kv import RedisKV
from agent_stores_redis.memory import RedisMemoryPort
from redis_test_support import Commands, with_fresh_prefix


class TestRedisMemoryGeneric(MemoryContract):
    """The memory contract on standalone Redis through the generic KV port."""

    store_path = "generic"

    @pytest.fixture
    def store_url(self, redis_urls: dict[str, str]) -> str:
        return with_fresh_prefix(redis_urls["redis"])


async def test_memory_write_is_one_script(
    standalone_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create in a new directory and each replace with a receipt: one EVALSHA each; the
    listing, the receipt index and replays all hold."""
    async with connect(standalone_url) as conn:
        memory = conn.memory()
        kv = conn.kv
        assert isinstance(kv, RedisKV) and isinstance(memory.port, RedisMemoryPort)
        assert memory.port.atomic
        await memory.write("warm/w.md", "w", expected_version=None)  # script cached
        commands = Commands(monkeypatch)
        created = await memory.write(
            "u/deep/a.md", "v0", expected_version=None, operation=MemoryOperation("op0", "f0")
        )
        assert commands.sent == ["EVALSHA"], commands.sent
        version = created.version
        for i in range(1, 5):
            commands.sent.clear()
            done = await memory.write(
                "u/deep/a.md",
                f"v{i}",
                expected_version=version,
                operation=MemoryOperation(f"op{i}", f"f{i}"),
            )
            assert commands.sent == ["EVALSHA"], commands.sent
            version = done.version
        assert await memory.list_paths("u/", limit=10) == ["u/deep/a.md"]
        found = await memory.get_operation(MemoryOperation("op4", "f4"))
        assert found is not None and found.version == version
        replay = await memory.write(
            "u/deep/a.md", "v4", expected_version="stale", operation=MemoryOperation("op4", "f4")
        )
        assert replay.replayed and replay.version == version
        # A reused operation id on another path writes nothing.
        with pytest.raises(MemoryOperationConflictError):
            await memory.write(
                "u/deep/b.md", "x", expected_version=None, operation=MemoryOperation("op4", "zz")
            )
        assert await memory.read("u/deep/b.md", max_chars=10) is None


async def test_memory_port_is_generic_on_a_cluster(redis_urls: dict[str, str]) -> None:
    """A script may not span hash tags on a cluster: the port leaves writes to the generic
    algorithm there, and receipts stay in the records."""
    async with connect(with_fresh_prefix(redis_urls["redis-cluster"])) as conn:
        memory = conn.memory()
        assert isinstance(memory.port, RedisMemoryPort) and not memory.port.atomic
        first = await memory.write(
            "u/a.md", "x", expected_version=None, operation=MemoryOperation("c0", "f")
        )
        again = await memory.write(
            "u/a.md", "x", expected_version=None, operation=MemoryOperation("c0", "f")
        )
        assert again.replayed and again.version == first.version
