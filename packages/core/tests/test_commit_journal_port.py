"""CommitJournalPort: an append as one commit of the counter and the entry, on any KV store
whose commit is atomic (here the in-memory one; DynamoDB and Firestore run the contract)."""

from __future__ import annotations

import uuid

import pytest
from agent_stores import open_kv
from agent_stores.backend import AppendRequest, CommitJournalPort, ConflictError, KVStore


def request(head_version: str | None, key: str = "e/1", head: bytes = b"1") -> AppendRequest:
    return AppendRequest("run", "head", head, head_version, key, b"entry", None)


@pytest.fixture
async def kv() -> KVStore:
    return open_kv(f"memory://commit-port-{uuid.uuid4().hex}")


async def test_an_append_writes_counter_and_entry(kv: KVStore) -> None:
    outcome = await CommitJournalPort(kv).append(request(None))
    head, entry = await kv.get("run", "head"), await kv.get("run", "e/1")
    assert head is not None and entry is not None
    assert (outcome.head_version, outcome.created_version) == (head.version, entry.version)
    assert outcome.existing is None and entry.value == b"entry"


async def test_a_duplicate_returns_the_entry_and_moves_nothing(kv: KVStore) -> None:
    port = CommitJournalPort(kv)
    first = await port.append(request(None))
    assert first.head_version is not None
    again = await port.append(request(first.head_version, head=b"2"))
    assert again.created_version is None and again.head_version is None
    assert again.existing is not None and again.existing.version == first.created_version
    head = await kv.get("run", "head")
    assert head is not None and (head.value, head.version) == (b"1", first.head_version)


async def test_a_moved_counter_is_a_conflict_and_writes_nothing(kv: KVStore) -> None:
    port = CommitJournalPort(kv)
    await port.append(request(None))
    with pytest.raises(ConflictError):
        await port.append(request("stale-version", key="e/2", head=b"2"))
    assert await kv.get("run", "e/2") is None
    with pytest.raises(ConflictError):  # a new log whose counter exists already
        await port.append(request(None, key="e/3"))
    assert await kv.get("run", "e/3") is None
