"""What every contract class shares: how it gets a store, and test isolation.

A contract class needs one thing from a backend: ``kv_factory``, a fixture returning a
zero-argument callable that opens a *new* client of the backend under test (two calls
give two independent clients of the same data). The default builds it from
``store_url`` (``--store-url`` / ``AGENT_STORES_CONTRACT_URL``); a backend author may
override ``kv_factory`` instead.

Every test works in scopes named from a random per-test ``ns`` prefix, so the suite can
run against a shared server without touching other data.
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, ClassVar, Literal

import pytest
import pytest_asyncio
from agent_stores import KVStore, open_kv

if TYPE_CHECKING:
    from agent_stores.memory.vector_port import VectorPort

KVFactory = Callable[[], KVStore]

#: How long a test waits for something that takes real time (a worker process starting, a
#: lease renewal on the event loop's timer) before it fails. Generous: a loaded machine
#: must never fail a healthy backend; expiry itself is tested on the store's clock.
REAL_TIME_LIMIT_SECONDS = 120.0

#: At most this many rounds of listing and dropping when cleaning up (a broken ``scopes``
#: that keeps naming new scopes would otherwise keep the cleanup going).
CLEANUP_ROUNDS = 1000

#: How a capability skip's reason starts; the plugin lists these in the run's summary
#: and fails any other skip of a contract test.
CAPABILITY_SKIP = "not applicable: capability"


def require_capability(kv: KVStore, capability: str, why: str) -> None:
    """Skip the calling contract test unless ``kv.capabilities.<capability>`` is True.

    The only sanctioned way for a contract test to skip: the backend's own declaration
    justifies it, and the run's summary lists it.
    """
    if not getattr(kv.capabilities, capability):
        pytest.skip(f"{CAPABILITY_SKIP} {capability}=False ({kv.backend_name}): {why}")


async def require_vector_port(kv: KVStore) -> VectorPort:
    """The backend's native vector port on ``kv``; skips the calling contract test when
    the backend declares none, or declares it unavailable on the server under test (its
    ``unavailable()`` reason, e.g. no extension): both listed in the run's summary."""
    port = kv.ports.vector
    if port is None:
        pytest.skip(
            f"{CAPABILITY_SKIP} vector_port=None ({kv.backend_name}): the generic path serves "
            "semantic search (checked by the semantic contract)"
        )
    reason = await port.unavailable()
    if reason is not None:
        pytest.skip(f"{CAPABILITY_SKIP} vector_port unavailable ({kv.backend_name}): {reason}")
    return port


async def wait_until(
    condition: Callable[[], Awaitable[bool]],
    what: str,
    *,
    limit_seconds: float = REAL_TIME_LIMIT_SECONDS,
    interval_seconds: float = 0.01,
) -> None:
    """Poll ``condition`` until it holds: the contract's wait for real time, never a fixed sleep.

    Fails naming ``what`` after ``limit_seconds``, so a backend that never gets there
    fails the test instead of hanging it.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_seconds
    while not await condition():
        if loop.time() >= deadline:
            raise AssertionError(f"still waiting after {limit_seconds:g} s: {what}")
        await asyncio.sleep(interval_seconds)


async def drop_namespace(store: KVStore, ns: str) -> int:
    """Drop every scope whose name starts with ``ns``: the suite leaves nothing behind.

    A failure here is reported as a warning, not as the test's failure: the behaviour
    under test was already judged.
    """
    # Every entry is live at time 0, so scopes holding only expired entries are listed too.
    store.clock = lambda: 0.0
    done: set[str] = set()
    try:
        # Bounded: every round must drop scopes not dropped before. A backend whose
        # drop_scope leaves entries behind stops the cleanup here (its KV test
        # kv.drop_scope_leaves_nothing names the rule) instead of looping until a timeout.
        for _ in range(CLEANUP_ROUNDS):
            names = await store.scopes(prefix=ns, limit=100)
            if not names:
                break
            again = sorted(set(names) & done)
            if again:
                warnings.warn(
                    f"contract cleanup: scope {again[0]!r} is still listed after drop_scope "
                    "(see kv.drop_scope_leaves_nothing); cleanup stopped",
                    stacklevel=1,
                )
                break
            for name in names:
                await store.drop_scope(name)
                done.add(name)
        else:
            warnings.warn(
                f"contract cleanup: scopes {ns}* still listed after {CLEANUP_ROUNDS} rounds; "
                "cleanup stopped",
                stacklevel=1,
            )
    except Exception as exc:
        warnings.warn(f"contract cleanup of scopes {ns}* failed: {exc!r}", stacklevel=1)
    return len(done)


class ContractBase:
    """Base of every contract class. Subclass a contract, never this."""

    #: ``{"test_name": "reason"}``: standard tests this backend is known to fail, each run
    #: as ``xfail(strict=True, reason=...)`` so it turns red the day the gap is fixed.
    contract_xfails: dict[str, str] = {}

    #: ``"native"``: the stores take the backend's native ports, as a user's stores do;
    #: ``"generic"``: the core's generic KV ports, so a backend with native ports can run
    #: the same contract on the generic path too (set it on a second subclass).
    store_path: ClassVar[Literal["native", "generic"]] = "native"

    @pytest.fixture
    def store_url(self, contract_store_url: str) -> str:
        """The URL under test (from ``--store-url`` or ``AGENT_STORES_CONTRACT_URL``)."""
        return contract_store_url

    @pytest.fixture
    def kv_factory(self, store_url: str) -> KVFactory:
        """A callable opening a new, independent client of the backend under test."""
        return lambda: open_kv(store_url)

    @pytest_asyncio.fixture
    async def backend_ready(self, kv_factory: KVFactory) -> None:
        """The backend's tables, containers or schema exist (``setup()`` on a client of its
        own, closed again): every fixture handing a test clients it does not set up itself
        depends on this one, so any test passes alone, first on a fresh server, or in any
        order. Nothing is torn down: ``setup()`` is idempotent and shared by every test."""
        store = kv_factory()
        try:
            await store.setup()
        finally:
            await store.aclose()

    @pytest_asyncio.fixture
    async def kv(self, kv_factory: KVFactory, ns: str) -> AsyncIterator[KVStore]:
        """One client of the backend under test; after the test its ``ns`` scopes are dropped."""
        store = kv_factory()
        await store.setup()
        try:
            yield store
        finally:
            try:
                if not store.closed:
                    await drop_namespace(store, ns)
            finally:
                await store.aclose()

    @pytest.fixture
    def ns(self, backend_ready: None) -> str:
        """A random prefix isolating this test's scopes, on a backend that is ready for them
        (``backend_ready``): a test working in its namespace through clients of its own
        (``kv_factory``, a store factory) never depends on another test having set it up."""
        return f"ct-{uuid.uuid4().hex[:12]}"
