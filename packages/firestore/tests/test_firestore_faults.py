"""Lost replies and transient failures, injected around the real client on the emulator.

Each test lets a request reach the emulator and then loses its reply (or fails before
sending), once, so the store's own retry meets the state the first attempt left behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from agent_stores.errors import BackendUnavailableError
from agent_stores.kv.base import Create, Replace
from agent_stores_firestore.kv import FirestoreKV
from google.api_core.exceptions import ServiceUnavailable
from google.cloud.firestore import AsyncDocumentReference, AsyncWriteBatch


@pytest_asyncio.fixture
async def kv(firestore_url: str) -> AsyncIterator[FirestoreKV]:
    store = FirestoreKV.from_url(firestore_url + "&retries=2")
    try:
        yield store
    finally:
        await store.aclose()


def lose_reply_once(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str, *, applied: bool = True
) -> list[int]:
    """Patch ``cls.name``: the first call runs (if ``applied``) and then fails as if the
    connection broke before its reply arrived; later calls are untouched."""
    original: Callable[..., Awaitable[Any]] = getattr(cls, name)
    calls: list[int] = []

    async def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            if applied:
                await original(self, *args, **kwargs)
                raise ServiceUnavailable("recvmsg:Connection reset by peer")
            raise ServiceUnavailable("failed to connect to all addresses; Connection refused")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, flaky)
    return calls


async def test_create_whose_reply_was_lost(
    kv: FirestoreKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = lose_reply_once(monkeypatch, AsyncDocumentReference, "create")
    version = await kv.create("s", "k", b"v")
    assert len(calls) == 2  # the retry met ALREADY_EXISTS and found its own nonce
    entry = await kv.get("s", "k")
    assert entry is not None and entry.version == version and entry.value == b"v"


async def test_replace_whose_reply_was_lost(
    kv: FirestoreKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await kv.create("s", "k", b"v1")
    calls = lose_reply_once(monkeypatch, AsyncDocumentReference, "update")
    version = await kv.replace("s", "k", b"v2", expected_version=first)
    assert len(calls) == 2
    entry = await kv.get("s", "k")
    assert entry is not None and entry.version == version and entry.value == b"v2"


async def test_delete_whose_reply_was_lost_is_unknown(
    kv: FirestoreKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    version = await kv.create("s", "k", b"v")
    lose_reply_once(monkeypatch, AsyncDocumentReference, "delete")
    with pytest.raises(BackendUnavailableError, match="may or may not"):
        await kv.delete("s", "k", expected_version=version)
    assert await kv.get("s", "k") is None


async def test_commit_whose_reply_was_lost(
    kv: FirestoreKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = await kv.create("s", "a", b"a1")
    calls = lose_reply_once(monkeypatch, AsyncWriteBatch, "commit")
    versions = await kv.commit("s", [Replace("a", b"a2", a), Create("b", b"b1")])
    assert len(calls) == 2
    found = await kv.get_many("s", ["a", "b"])
    assert [found["a"].version, found["b"].version] == versions
    assert (found["a"].value, found["b"].value) == (b"a2", b"b1")


async def test_unsent_request_is_retried(kv: FirestoreKV, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = lose_reply_once(monkeypatch, AsyncDocumentReference, "create", applied=False)
    version = await kv.create("s", "k", b"v")
    assert len(calls) == 2
    entry = await kv.get("s", "k")
    assert entry is not None and entry.version == version
