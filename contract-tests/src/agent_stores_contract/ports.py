"""The port contract: a backend's native ports, driven directly and through the stores.

A backend's native ports (``docs/plugins.md``, "Native paths") replace the core's generic
KV algorithms: :class:`~agent_stores.sessions.port.SessionPort` (acquire + load, save +
release), :class:`~agent_stores.memory.port.MemoryPort` (read, write with receipt index
and directory markers) and :class:`~agent_stores.checkpointer.port.JournalPort` (append).
:class:`PortContract` obtains the native ports a client carries (``kv.ports``, which the
backend's plugin hooks fill; the generic KV ports where a backend offers none), calls each
method through its public interface the way the KV contract calls the ``_`` primitives,
and runs the stores on exactly those ports. Every rule is checked on the store's clock,
moved by the suite (a :class:`StoreClock` shared by the test's clients, frozen between
moves), exactly on each boundary (``expires_at == now`` is expired) and one millisecond
before it.

The rules (each test's docstring is its behaviour, listed in ``docs/contract.md``):

* everything a port writes expires at its documented lifetime and not earlier: session
  state (``ttl_seconds`` after the write), history chunk parts (their ``expires_at``),
  memory records and tombstones (``ttl``), receipt index entries (``index.ttl``), directory
  markers (never), journal entries and counters (``ttl``);
* an expired record is never taken for a live one: not for fencing, not as a duplicate
  operation or journal entry, not as a remembered (cached) state, not after a takeover;
* values over many parts (10 and 100) are stored and read back byte-equal and in order;
* every waiting hint is removed by the acquire it served or expires, so waiters are
  served in the order they hinted;
* idempotency keys and operation ids are compared whole (keys sharing long prefixes);
* the native acquire honours the sessions' sliding TTL and refresh horizon;
* a port applies the checks of the public KV API (sizes, ids, damaged records).

Every port call is recorded (:mod:`agent_stores_contract.reach`): the run's summary lists
per port method how many tests reached it and with which edge cases, and a method the
backend offers that no test reached fails the run.

A port may always answer an acquire with ``GENERIC`` (the core then runs its own
algorithm); the rules then hold through the core, and the reach table shows how often the
port decided itself (``outcome=acquired``, ``outcome=busy``, …).
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from agent_stores import KVStore
from agent_stores.checkpointer import Checkpointer, JournalEvent
from agent_stores.checkpointer.port import (
    AppendOutcome,
    AppendRequest,
    JournalPort,
    KVJournalPort,
)
from agent_stores.errors import (
    ConflictError,
    InvalidIdError,
    ResourceClosedError,
    ValueTooLargeError,
)
from agent_stores.kv import Entry
from agent_stores.memory import KVMemoryStore
from agent_stores.memory.port import MARKER_VALUE, FileWrite, IndexWrite, KVMemoryPort, MemoryPort
from agent_stores.sessions import EffectCall, InvalidSessionError, LeaseLostError, SessionStore
from agent_stores.sessions.port import (
    AcquireReply,
    AcquireRequest,
    ChunkWrite,
    KVSessionPort,
    SaveRequest,
    SessionPort,
    acquired_state,
    fresh_state,
)
from agent_stores.sessions.records import (
    EMPTY_ARRAY,
    STATE_KEY,
    WAITER_KEY,
    ChunkRef,
    Lease,
    RecordError,
    StateHeader,
    decode_state,
    encode_messages,
    encode_state,
)
from agent_stores.sessions.storage import Acquired, Busy, KVSessionStorage
from pydantic_ai.messages import ModelMessage
from pydantic_ai_harness.memory import MemoryOperation

from .base import ContractBase, KVFactory
from .reach import (
    REGISTRY,
    RecordingJournalPort,
    RecordingMemoryPort,
    RecordingSessionPort,
    describe,
    edge,
    rule,
)
from .session_workers import pair, texts

#: "Just before" a boundary: one millisecond.
EPS = 0.001
#: Edge-case names of the boundary checks, as the reach table shows them.
AT_EXPIRY = "expires_at == now"
BEFORE_EXPIRY = "1 ms before expiry"


class StoreClock:
    """The store's clock as the suite moves it: frozen at ``now`` until a test moves it.

    It starts at a whole second of the machine's time, and tests move it by whole seconds
    (and :data:`EPS`), so every ``now + ttl`` a port computes is exact in binary floating
    point and a check at ``expires_at == now`` is exactly on the boundary.
    """

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def at(self, when: float) -> None:
        """Set the time (backwards too: each check picks its instant)."""
        self.now = when


@dataclass(frozen=True)
class PortSet:
    """The ports under test for one KV client, and where each came from."""

    sessions: SessionPort
    memory: MemoryPort
    journal: JournalPort
    #: ``kind -> "native" | "generic" | "given"``
    sources: dict[str, str] = field(default_factory=dict)


PortMaker = Callable[[KVStore], PortSet]


def backend_ports(kv: KVStore, *, generic: bool = False) -> PortSet:
    """The native ports ``kv`` carries (``kv.ports``, as every store reads them), the
    core's generic KV ports for what it has none of (or for everything: ``generic``)."""
    sessions = None if generic else kv.ports.session
    memory = None if generic else kv.ports.memory
    journal = None if generic else kv.ports.journal
    return PortSet(
        sessions or KVSessionPort(kv),
        memory or KVMemoryPort(kv),
        journal or KVJournalPort(),
        {
            "sessions": "native" if sessions else "generic",
            "memory": "native" if memory else "generic",
            "journal": "native" if journal else "generic",
        },
    )


def recording(ports: PortSet) -> PortSet:
    """``ports`` wrapped so every call is counted in the reach table."""
    src = ports.sources
    return PortSet(
        RecordingSessionPort(
            ports.sessions, describe(ports.sessions, src.get("sessions", "given"), "sessions")
        ),
        RecordingMemoryPort(
            ports.memory, describe(ports.memory, src.get("memory", "given"), "memory")
        ),
        RecordingJournalPort(
            ports.journal, describe(ports.journal, src.get("journal", "given"), "journal")
        ),
        dict(src),
    )


@dataclass
class Client:
    """One client of the backend under test with its (recording) ports."""

    kv: KVStore
    ports: PortSet

    @property
    def clock(self) -> StoreClock:
        clock = self.kv.clock
        assert isinstance(clock, StoreClock)
        return clock


ClientFactory = Callable[..., Awaitable[Client]]


# -- session records ------------------------------------------------------------------------


def messages_blob(tag: str, count: int, pad: int = 40) -> tuple[list[ModelMessage], bytes]:
    """``count`` messages (pairs tagged ``tag0``, ``tag1``, …) and their stored JSON array."""
    messages = [m for i in range(max(1, count // 2)) for m in pair(f"{tag}{i}", pad)]
    return messages, encode_messages(messages)


def cut(blob: bytes, parts: int) -> list[bytes]:
    """``blob`` cut into exactly ``parts`` non-empty pieces, in order."""
    assert len(blob) >= parts
    size = len(blob)
    return [blob[size * i // parts : size * (i + 1) // parts] for i in range(parts)]


def new_chunk(
    key: str, messages: Sequence[ModelMessage], blob: bytes, parts: int, expires_at: float | None
) -> tuple[ChunkRef, ChunkWrite]:
    """A history chunk of ``messages`` stored as ``parts`` parts: its reference and its write."""
    pieces = cut(blob, parts)
    ref = ChunkRef(
        key=key,
        count=len(messages),
        size=len(blob),
        parts=parts,
        level=0,
        sealed=False,
        expires_at=expires_at,
    )
    return ref, ChunkWrite(key, pieces, expires_at)


def state_value(
    now: float,
    *,
    fence: int = 1,
    lease: tuple[str, float] | None = None,
    released: tuple[str, float] | None = None,
    chunks: Sequence[ChunkRef] = (),
    recovery: Sequence[EffectCall] = (),
) -> bytes:
    """A ``state`` record as the core writes it (empty inline tail)."""
    header = StateHeader(
        lease=None if lease is None else Lease(lease[0], fence, lease[1], now),
        fence=fence,
        chunks=tuple(chunks),
        tail_count=0,
        recovery=tuple(recovery),
        recovery_since=now if recovery else None,
        created_at=now,
        updated_at=now,
        released_by=None if released is None else released[0],
        released_at=None if released is None else released[1],
    )
    return encode_state(header, EMPTY_ARRAY)


def acquire_request(
    scope: str,
    now: float,
    *,
    owner: str = "owner-b",
    store_id: str = "store-b",
    lease_seconds: float = 10.0,
    ttl_seconds: float | None = 100.0,
    courtesy_seconds: float = 0.5,
    horizon: float | str | None = "ttl",
    load_history: bool = True,
    held: frozenset[str] = frozenset(),
    known: Entry | None = None,
) -> AcquireRequest:
    """An acquire as the core sends it (refresh horizon ``now + ttl_seconds`` by default)."""
    if horizon == "ttl":
        horizon = None if ttl_seconds is None else now + ttl_seconds
    assert not isinstance(horizon, str)
    return AcquireRequest(
        scope=scope,
        owner=owner,
        now=now,
        lease_end=now + lease_seconds,
        store_id=store_id,
        courtesy_seconds=courtesy_seconds,
        ttl_seconds=ttl_seconds,
        refresh_horizon=horizon,
        load_history=load_history,
        held_chunks=held,
        known=known,
    )


async def put_state(
    client: Client,
    scope: str,
    value: bytes,
    *,
    ttl: float | None,
    chunks: Sequence[ChunkWrite] = (),
    chunk_ttl: float | None = None,
) -> str:
    """Create a fresh session (a KV create, as the generic acquire does), then save ``value``
    through the port: the state is one the port itself wrote last (a warm session)."""
    now = client.clock.now
    first = await client.kv.create(scope, STATE_KEY, fresh_state("seed", now + 1, now), ttl=ttl)
    return await client.ports.sessions.save(
        SaveRequest(scope, value, first, ttl, chunk_ttl, list(chunks))
    )


def check_acquired(reply: AcquireReply, stored: bytes, request: AcquireRequest) -> None:
    """An ``acquired`` reply holds the state :func:`acquired_state` makes of ``stored``
    (decoded: a port rewriting the header in the server may format the JSON its own way),
    under a new version."""
    expected = acquired_state(
        stored, owner=request.owner, lease_end=request.lease_end, now=request.now
    )
    assert expected is not None
    assert reply.version, "an acquired reply carries the new version"
    assert reply.state is not None, "an acquired reply carries the state"
    want = decode_state(expected)
    try:
        got = decode_state(reply.state)
    except RecordError as exc:
        raise AssertionError(f"the acquired state does not decode: {exc}") from None
    assert got == want, (
        "the acquired state must be acquired_state() of the stored one: fence + 1, the new "
        f"lease, updated_at, released cleared, every other field and the inline tail "
        f"unchanged;\n got {got}\nwant {want}"
    )


def check_started_over(reply: AcquireReply, request: AcquireRequest, why: str) -> None:
    """An ``acquired`` reply holds a fresh session: fence 1, no chunks, an empty tail,
    the request's owner holding the lease."""
    assert reply.state is not None, "an acquired reply carries the state"
    header, tail = decode_state(reply.state)
    assert header.fence == 1 and header.chunks == () and tail == EMPTY_ARRAY, why
    assert header.lease is not None and header.lease.owner == request.owner, why


async def stored(kv: KVStore, scope: str, key: str = STATE_KEY) -> tuple[bytes, str] | None:
    entry = await kv.get(scope, key)
    return None if entry is None else (entry.value, entry.version)


def dumped(messages: Sequence[ModelMessage]) -> bytes:
    return encode_messages(list(messages))


# -- memory and journal helpers -----------------------------------------------------------------


def file_write(
    scope: str,
    key: str,
    value: bytes,
    *,
    expected: str | None = None,
    ttl: float | None = None,
    index: IndexWrite | None = None,
    markers: Sequence[tuple[str, str]] = (),
) -> FileWrite:
    return FileWrite(scope, key, value, expected, ttl, index, list(markers))


def op(name: str, fingerprint: str = "fp") -> MemoryOperation:
    return MemoryOperation(id=name, fingerprint=fingerprint)


def crash_content(size: int) -> str:
    """``size`` characters, multi-byte ones included, whose every line is numbered (order shows)."""
    out: list[str] = []
    total = 0
    line = 0
    while total < size:
        text = f"{line:06d} é😀日本 line\n"
        out.append(text)
        total += len(text)
        line += 1
    return "".join(out)[:size]


@dataclass
class _Seq:
    """Distinct names within one test."""

    prefix: str
    n: int = 0

    def __call__(self, what: str = "") -> str:
        """A new scope name under the test's namespace."""
        return f"{self.prefix}:{self.short(what)}"

    def short(self, what: str = "") -> str:
        """A new session id (the storage puts its own scope prefix in front)."""
        self.n += 1
        return f"{what}{self.n}"


class PortContract(ContractBase):
    """The native-port contract. Subclass it and provide ``store_url`` or ``kv_factory``.

    Override the ``port_maker`` fixture to test ports of your own that no plugin hands
    out (the suite's self-test runs deliberately broken ports this way).
    """

    pytestmark = pytest.mark.asyncio

    #: Seconds of the TTLs used by the tests: short enough to read, whole numbers so every
    #: boundary is exact.
    TTL: ClassVar[float] = 10.0

    @pytest.fixture(autouse=True)
    def _reach_test(self, request: pytest.FixtureRequest) -> Iterator[None]:
        """Port calls made during this test are recorded under its node id."""
        REGISTRY.current = request.node.nodeid
        REGISTRY.current_rules = tuple(getattr(request.function, "port_rules", ()))
        try:
            yield
        finally:
            REGISTRY.current = None
            REGISTRY.current_rules = ()

    @pytest.fixture
    def port_maker(self) -> PortMaker:
        """A callable giving the ports under test for a KV client: the backend's native ports
        (from its plugin hooks, as the stores take them), the generic KV ports where it offers
        none (or everywhere when ``store_path = "generic"``)."""
        generic = self.store_path == "generic"
        return lambda kv: backend_ports(kv, generic=generic)

    @pytest.fixture
    def store_clock(self) -> StoreClock:
        """The clock every client of the test shares, frozen at a whole second of now."""
        return StoreClock(float(math.floor(time.time())))

    @pytest_asyncio.fixture
    async def open_client(
        self,
        kv: KVStore,
        kv_factory: KVFactory,
        port_maker: PortMaker,
        store_clock: StoreClock,
    ) -> AsyncIterator[ClientFactory]:
        """Opens more clients of the backend (``await open_client(max_value_bytes=N)``), each
        on the test's clock with its own recording ports; the first call returns ``kv``'s."""
        opened: list[KVStore] = []
        first = True

        async def make(*, max_value_bytes: int | None = None) -> Client:
            nonlocal first
            if first:
                store = kv
                first = False
            else:
                store = kv_factory()
                await store.setup()
                opened.append(store)
            store.clock = store_clock
            if max_value_bytes is not None and max_value_bytes < store.limits.max_value_bytes:
                # A smaller item limit on this client only: the stores then cut values into
                # many parts without megabytes of data.
                store.limits = replace(store.limits, max_value_bytes=max_value_bytes)
            return Client(store, recording(port_maker(store)))

        try:
            yield make
        finally:
            for store in opened:
                await store.aclose()

    @pytest_asyncio.fixture
    async def client(self, open_client: ClientFactory) -> Client:
        """The test's first client (the ``kv`` fixture's) with its ports."""
        return await open_client()

    @pytest.fixture
    def names(self, ns: str) -> _Seq:
        """Fresh scope names under the test's namespace."""
        return _Seq(f"{ns}:p")

    def _storage(self, client: Client, ns: str, store_id: str, **options: Any) -> KVSessionStorage:
        settings: dict[str, Any] = {
            "ttl_seconds": 100.0,
            "lease_seconds": 10.0,
            "scope_prefix": f"{ns}:s:",
            **options,
        }
        return KVSessionStorage(
            client.kv, store_id=store_id, port=client.ports.sessions, **settings
        )

    # -- sessions: acquire ------------------------------------------------------------------

    @rule("many-parts")
    async def test_session_acquire_copies_state_and_sends_missing_parts(
        self, client: Client, names: _Seq
    ) -> None:
        """An acquire of a free session writes the state acquired_state() makes of the stored one under a fresh version (fence + 1, the new lease, released cleared, every other field and the inline tail unchanged) and returns exactly the stored bytes, with byte-equal parts of the chunks the request does not hold and none of those it holds.

        A port may answer GENERIC instead; it may leave out parts (the core reads them).
        """
        clock = client.clock
        t = clock.now
        scope = names("acquire")
        chunks = []
        writes = []
        for name, parts in (("h/held", 3), ("h/twelve", 12), ("h/one", 1)):
            messages, blob = messages_blob(name[2:], 6)
            ref, write = new_chunk(name, messages, blob, parts, t + 200)
            chunks.append(ref)
            writes.append(write)
        value = state_value(t, fence=3, released=("store-a", t), chunks=chunks)
        before = await put_state(client, scope, value, ttl=100, chunks=writes, chunk_ttl=200)
        clock.at(t + 1)
        request = acquire_request(scope, t + 1, held=frozenset({"h/held"}))
        with edge("free session"):
            reply = await client.ports.sessions.acquire(request)
        assert reply.outcome in ("acquired", "generic"), f"a free session answered {reply}"
        if reply.outcome == "generic":
            return
        check_acquired(reply, value, request)
        assert reply.version != before
        assert await stored(client.kv, scope) == (reply.state, reply.version), (
            "the reply's state and version are the stored ones"
        )
        header, _ = decode_state(reply.state or b"")
        assert header.fence == 4 and header.lease is not None and header.lease.owner == "owner-b"
        wanted = {f"{w.key}/{i}": p for w in writes[1:] for i, p in enumerate(w.parts)}
        held = {f"{writes[0].key}/{i}" for i in range(3)}
        assert not set(reply.parts) & held, "parts of held chunks are never sent back"
        assert set(reply.parts) <= set(wanted), f"unexpected parts {set(reply.parts) - set(wanted)}"
        for key, part in reply.parts.items():
            assert part == wanted[key], f"part {key} differs from the stored bytes"

    @rule("expiry", "expired-not-live", "hand-over")
    async def test_session_acquire_lease_expiry_boundary(self, client: Client, names: _Seq) -> None:
        """An acquire by another owner one millisecond before the holder's lease runs out answers busy (naming the holder, the lease's expiry, and whether a live hint waits) or GENERIC, never acquired; at expires_at == now the lease is expired and the acquire never answers busy; a hint at its own expires_at == now no longer counts as waiting."""
        clock = client.clock
        t = clock.now
        lease_end = t + self.TTL
        hint_end = t + self.TTL - 1
        checks = [
            (hint_end - EPS, True, BEFORE_EXPIRY),
            (hint_end, True, AT_EXPIRY),
            (lease_end - EPS, True, BEFORE_EXPIRY),
            (lease_end, False, AT_EXPIRY),
        ]
        for when, live, what in checks:
            scope = names("lease")
            clock.at(t)
            value = state_value(t, fence=5, lease=("owner-a", lease_end))
            await put_state(client, scope, value, ttl=100)
            await client.kv.create(scope, WAITER_KEY, b"store-x", ttl=hint_end - t)
            clock.at(when)
            request = acquire_request(scope, when)
            with edge(what, "lease held by another owner"):
                reply = await client.ports.sessions.acquire(request)
            if live:
                assert reply.outcome in ("busy", "generic"), (
                    f"at {when - t:+.3f}s the lease (ends +{lease_end - t:g}s) is live, "
                    f"yet the acquire answered {reply.outcome}"
                )
                if reply.outcome == "busy":
                    assert reply.holder == "owner-a"
                    assert reply.lease_expires_at == lease_end
                    assert reply.waiter_hinted is (when < hint_end), (
                        f"waiter_hinted={reply.waiter_hinted} at {when - t:+.3f}s for a hint "
                        f"expiring at +{hint_end - t:g}s"
                    )
            else:
                assert reply.outcome in ("acquired", "generic"), (
                    f"a lease at expires_at == now was taken for live: {reply.outcome}"
                )
                if reply.outcome == "acquired":
                    check_acquired(reply, value, request)

    @rule("expiry", "expired-not-live")
    async def test_session_acquire_expired_state_is_absent(
        self, client: Client, names: _Seq
    ) -> None:
        """A state record whose TTL has run out (expires_at == now) is absent for an acquire even while the lease inside it still runs and the port wrote it last: the answer is a fresh session (fence 1, no chunks, empty tail) or GENERIC, never busy and never the old history; one millisecond earlier the session is busy."""
        clock = client.clock
        t = clock.now
        for when, what in ((t + self.TTL - EPS, BEFORE_EXPIRY), (t + self.TTL, AT_EXPIRY)):
            scope = names("expired")
            clock.at(t)
            messages, blob = messages_blob("old", 4)
            ref, write = new_chunk("h/old", messages, blob, 2, t + 2 * self.TTL)
            value = state_value(t, fence=7, lease=("owner-a", t + 100), chunks=[ref])
            await put_state(
                client, scope, value, ttl=self.TTL, chunks=[write], chunk_ttl=2 * self.TTL
            )
            clock.at(when)
            request = acquire_request(scope, when)
            with edge(what, "state ttl"):
                reply = await client.ports.sessions.acquire(request)
            if what == BEFORE_EXPIRY:
                assert reply.outcome in ("busy", "generic"), (
                    f"a live session held by another owner answered {reply.outcome}"
                )
                continue
            assert reply.outcome in ("acquired", "generic"), (
                f"an expired state was taken for a live one: {reply.outcome}"
            )
            if reply.outcome == "acquired":
                check_started_over(reply, request, "an expired session must start over")
                assert await stored(client.kv, scope) == (reply.state, reply.version)

    @rule("hand-over", "expired-not-live")
    async def test_session_acquire_courtesy_boundary(self, client: Client, names: _Seq) -> None:
        """A store that released a session while another store's hint waits gets courtesy (retry_after: the rest of the window) or GENERIC until released.at + courtesy_seconds, never the lease; at that instant, or once the hint expired (expires_at == now), or when the hint is its own, it is not held back."""
        clock = client.clock
        t = clock.now
        courtesy = 2.0
        cases: list[tuple[str, float, float, bool, str]] = [
            # (hint owner, hint lifetime, when, held back?, edge)
            ("store-x", 30, t + courtesy - EPS, True, BEFORE_EXPIRY),
            ("store-x", 30, t + courtesy, False, AT_EXPIRY),
            ("store-x", 1, t + 1 - EPS, True, BEFORE_EXPIRY),
            ("store-x", 1, t + 1, False, AT_EXPIRY),
            ("store-a", 30, t + 1, False, "own hint"),
        ]
        for hint_owner, hint_ttl, when, held_back, what in cases:
            scope = names("courtesy")
            clock.at(t)
            value = state_value(t, fence=2, released=("store-a", t))
            await put_state(client, scope, value, ttl=100)
            await client.kv.create(scope, WAITER_KEY, hint_owner.encode(), ttl=hint_ttl)
            clock.at(when)
            request = acquire_request(
                scope, when, owner="owner-a2", store_id="store-a", courtesy_seconds=courtesy
            )
            with edge(what, "courtesy"):
                reply = await client.ports.sessions.acquire(request)
            if held_back:
                assert reply.outcome in ("courtesy", "generic"), (
                    f"within the courtesy window, with {hint_owner}'s hint live, the releasing "
                    f"store got {reply.outcome}"
                )
                if reply.outcome == "courtesy":
                    assert reply.retry_after is not None
                    assert 0 < reply.retry_after <= t + courtesy - when + 1e-6, (
                        f"retry_after {reply.retry_after} outlasts the courtesy window"
                    )
            else:
                assert reply.outcome in ("acquired", "generic"), (
                    f"{what}: the releasing store was held back ({reply.outcome})"
                )
                if reply.outcome == "acquired":
                    check_acquired(reply, value, request)

    @rule("hand-over", "expired-not-live")
    async def test_session_warm_acquire_takes_only_the_known_state(
        self, client: Client, names: _Seq
    ) -> None:
        """An acquire whose request names the state the store wrote last (``known``) takes the lease on it only while it is the stored version: a state written since by another client decides (its history, not the known one, is acquired); a live hint of another client still holds the releasing store back (courtesy or GENERIC); an expired state is still absent (a fresh session)."""
        clock = client.clock
        t = clock.now
        cases = ("current", "stale", "hinted", "expired")
        for case in cases:
            scope = names(f"warm-{case}")
            clock.at(t)
            known_value = state_value(t, fence=2, released=("store-b", t))
            known_version = await put_state(
                client, scope, known_value, ttl=self.TTL if case == "expired" else 100
            )
            known = Entry(known_value, known_version, None)
            current = known_value
            if case == "stale":
                # Another client's turn since: a new state (another history) and version.
                current = state_value(t, fence=3, released=("store-x", t))
                await client.ports.sessions.save(
                    SaveRequest(scope, current, known_version, 100, None, [])
                )
            if case == "hinted":
                await client.kv.create(scope, WAITER_KEY, b"store-x", ttl=30)
            when = t + self.TTL if case == "expired" else t + 0.25
            clock.at(when)
            request = acquire_request(scope, when, store_id="store-b", known=known)
            with edge(AT_EXPIRY if case == "expired" else "known state", "warm acquire", case):
                reply = await client.ports.sessions.acquire(request)
            if case == "hinted":
                assert reply.outcome in ("courtesy", "generic"), (
                    f"a known state let the releasing store pass a waiting hint: {reply.outcome}"
                )
                continue
            assert reply.outcome in ("acquired", "generic"), f"{case}: {reply}"
            if reply.outcome == "generic":
                continue
            if case == "expired":
                check_started_over(
                    reply, request, "an expired session must not be revived from the known state"
                )
            else:
                check_acquired(reply, current, request)
            assert await stored(client.kv, scope) == (reply.state, reply.version), (
                "the reply's state and version are the stored ones"
            )

    @rule("hand-over")
    async def test_session_acquire_removes_only_its_own_hint(
        self, client: Client, names: _Seq
    ) -> None:
        """An acquire that takes the lease deletes the waiting hint when it is this store's (so the next waiter can leave its own) and leaves another store's hint as it was."""
        clock = client.clock
        t = clock.now
        for hint_owner in ("store-b", "store-x"):
            scope = names("hint")
            value = state_value(t, fence=2, released=("store-a", t))
            await put_state(client, scope, value, ttl=100)
            hint_version = await client.kv.create(scope, WAITER_KEY, hint_owner.encode(), ttl=30)
            request = acquire_request(scope, t)
            with edge("own hint" if hint_owner == "store-b" else "another store's hint"):
                reply = await client.ports.sessions.acquire(request)
            assert reply.outcome in ("acquired", "generic"), reply
            if reply.outcome == "generic":
                continue
            left = await stored(client.kv, scope, WAITER_KEY)
            if hint_owner == "store-b":
                assert left is None, "the acquire left this store's own hint behind"
            else:
                assert left == (hint_owner.encode(), hint_version), (
                    "the acquire removed or changed another store's hint"
                )

    @rule("sliding-ttl", "expiry")
    async def test_session_acquire_refresh_horizon_and_sliding_ttl(
        self, client: Client, names: _Seq
    ) -> None:
        """An acquire answers GENERIC when a referenced chunk expires before refresh_horizon (by a millisecond) or the state carries a recovery marker; a chunk expiring exactly at the horizon is not due, and a state it acquires expires ttl_seconds after now (the sliding TTL): live one millisecond before, gone at expires_at == now."""
        clock = client.clock
        t = clock.now
        horizon = t + 100

        async def seeded(chunk_expiry: float, recovery: Sequence[EffectCall] = ()) -> str:
            scope = names("horizon")
            messages, blob = messages_blob("r", 4)
            ref, write = new_chunk("h/r", messages, blob, 2, chunk_expiry)
            value = state_value(
                t, fence=2, released=("store-a", t), chunks=[ref], recovery=recovery
            )
            await put_state(
                client, scope, value, ttl=100, chunks=[write], chunk_ttl=chunk_expiry - t
            )
            return scope

        due = await seeded(horizon - EPS)
        with edge(BEFORE_EXPIRY, "refresh horizon"):
            reply = await client.ports.sessions.acquire(acquire_request(due, t))
        assert reply.outcome == "generic", (
            f"a chunk expiring before the refresh horizon must be re-copied by the core "
            f"(GENERIC), the port answered {reply.outcome}"
        )
        latched = await seeded(horizon + 100, recovery=[EffectCall("charge", "c1")])
        with edge("recovery marker"):
            reply = await client.ports.sessions.acquire(acquire_request(latched, t))
        assert reply.outcome == "generic", f"a recovery marker answered {reply.outcome}"
        exact = await seeded(horizon)
        with edge(AT_EXPIRY, "refresh horizon"):
            reply = await client.ports.sessions.acquire(acquire_request(exact, t))
        assert reply.outcome in ("acquired", "generic"), reply
        if reply.outcome == "generic":
            return
        clock.at(t + 100 - EPS)
        assert await stored(client.kv, exact) == (reply.state, reply.version), (
            "the acquired state expired before now + ttl_seconds"
        )
        clock.at(t + 100)
        assert await client.kv.get(exact, STATE_KEY) is None, (
            "the acquired state outlived now + ttl_seconds"
        )

    @rule("public-checks")
    async def test_session_acquire_leaves_damaged_state_to_the_core(
        self, client: Client, names: _Seq, ns: str
    ) -> None:
        """An acquire on a state the port cannot read (not JSON, another format, a cut inline tail) answers GENERIC and leaves the stored bytes and version untouched; through the store the turn then fails with SESSION_INVALID and still nothing is written."""
        t = client.clock.now
        good = state_value(t, fence=2, released=("store-a", t))
        damaged = {
            "not JSON": b"\x00garbage{",
            "another format": good.replace(b"agent-stores.session/1", b"agent-stores.session/9"),
            "cut tail": good[: good.index(b"\n")] + b'\n[{"parts":',
        }
        storage = self._storage(client, ns, "store-b")
        for what, value in damaged.items():
            sid = names.short("damaged-" + what.replace(" ", "-"))
            scope = storage.scope_for(sid)
            version = await client.kv.create(scope, STATE_KEY, value, ttl=100)
            with edge(f"damaged: {what}"):
                reply = await client.ports.sessions.acquire(acquire_request(scope, t))
            assert reply.outcome == "generic", f"{what}: the port answered {reply.outcome}"
            assert await stored(client.kv, scope) == (value, version), f"{what}: overwritten"
            with pytest.raises(InvalidSessionError):
                await storage.load_and_acquire(sid, owner="owner-b")
            assert await stored(client.kv, scope) == (value, version), f"{what}: overwritten"

    # -- sessions: save -----------------------------------------------------------------------

    @rule("expired-not-live", "expiry")
    async def test_session_save_is_fenced_and_an_expired_state_is_not_live(
        self, client: Client, names: _Seq
    ) -> None:
        """save replaces the state only at expected_version: a stale version raises ConflictError and changes nothing of the state; a state past its TTL (expires_at == now) is absent, so a save naming its last version fails too, while one millisecond earlier it lands."""
        clock = client.clock
        t = clock.now
        scope = names("fenced")
        value = state_value(t, fence=2, released=("store-a", t))
        first = await put_state(client, scope, value, ttl=self.TTL)
        port = client.ports.sessions
        newer = state_value(t, fence=3, released=("store-b", t))
        with edge("stale version"), pytest.raises(ConflictError):
            await port.save(SaveRequest(scope, newer, "0" * 32, self.TTL, None, []))
        assert await stored(client.kv, scope) == (value, first)
        clock.at(t + self.TTL - EPS)
        with edge(BEFORE_EXPIRY, "state ttl"):
            second = await port.save(SaveRequest(scope, newer, first, self.TTL, None, []))
        assert await stored(client.kv, scope) == (newer, second)
        clock.at(t + self.TTL - EPS + self.TTL)
        latest = state_value(t, fence=4, released=("store-c", t))
        with edge(AT_EXPIRY, "state ttl"), pytest.raises(ConflictError):
            await port.save(SaveRequest(scope, latest, second, self.TTL, None, []))
        assert await client.kv.get(scope, STATE_KEY) is None, (
            "a save fenced by an expired state's version wrote it"
        )

    @rule("expiry")
    async def test_session_save_expiry_of_state_and_chunk_parts(
        self, client: Client, names: _Seq
    ) -> None:
        """A save's state record expires ttl_seconds after the save and every chunk part at its chunk's expires_at (now + chunk_ttl_seconds): each live one millisecond before, gone at expires_at == now; saved without a TTL neither expires."""
        clock = client.clock
        t = clock.now
        port = client.ports.sessions
        scope = names("expiry")
        first = await client.kv.create(scope, STATE_KEY, fresh_state("seed", t + 1, t), ttl=100)
        writes = []
        refs = []
        for name, parts in (("h/a", 1), ("h/b", 3)):
            messages, blob = messages_blob(name[2:], 4)
            ref, write = new_chunk(name, messages, blob, parts, t + 2 * self.TTL)
            refs.append(ref)
            writes.append(write)
        value = state_value(t, fence=2, released=("store-a", t), chunks=refs)
        await port.save(SaveRequest(scope, value, first, self.TTL, 2 * self.TTL, writes))
        part_keys = [f"{w.key}/{i}" for w in writes for i in range(len(w.parts))]

        async def live(keys: Sequence[str]) -> set[str]:
            return set(await client.kv.get_many(scope, list(keys)))

        clock.at(t + self.TTL - EPS)
        assert await live([STATE_KEY, *part_keys]) == {STATE_KEY, *part_keys}, BEFORE_EXPIRY
        clock.at(t + self.TTL)
        assert await live([STATE_KEY, *part_keys]) == set(part_keys), (
            "the state must expire at now + ttl_seconds, its chunks later"
        )
        clock.at(t + 2 * self.TTL - EPS)
        assert await live(part_keys) == set(part_keys), "a chunk part expired early"
        clock.at(t + 2 * self.TTL)
        assert await live(part_keys) == set(), "a chunk part outlived its expires_at"

        clock.at(t)
        forever = names("no-ttl")
        messages, blob = messages_blob("n", 4)
        ref, write = new_chunk("h/n", messages, blob, 2, None)
        value = state_value(t, fence=2, released=("store-a", t), chunks=[ref])
        first = await client.kv.create(forever, STATE_KEY, fresh_state("seed", t + 1, t))
        with edge("no ttl"):
            await port.save(SaveRequest(forever, value, first, None, None, [write]))
        clock.at(t + 10 * 365 * 86_400)
        found = await client.kv.get_many(forever, [STATE_KEY, "h/n/0", "h/n/1"])
        assert set(found) == {STATE_KEY, "h/n/0", "h/n/1"}, "saved without TTL, yet expired"

    @rule("many-parts")
    async def test_session_save_many_parts_read_back_in_order(
        self, open_client: ClientFactory, names: _Seq, ns: str
    ) -> None:
        """Chunks of 12 and 120 parts written by one save are stored byte-equal under key/0 … key/n-1, and a client holding none of them loads the history from them in order, byte for byte; so does a history the store itself cuts into over 100 parts (items of 1 KiB)."""
        client = await open_client()
        clock = client.clock
        t = clock.now
        storage = self._storage(client, ns, "store-a")
        sid = names.short("parts")
        scope = storage.scope_for(sid)
        first_messages, first_blob = messages_blob("twelve", 12)
        second_messages, second_blob = messages_blob("hundred", 120)
        refs = []
        writes = []
        for key, messages, blob, parts in (
            ("h/twelve", first_messages, first_blob, 12),
            ("h/hundred", second_messages, second_blob, 120),
        ):
            ref, write = new_chunk(key, messages, blob, parts, t + 200)
            refs.append(ref)
            writes.append(write)
        value = state_value(t, fence=1, released=("store-a", t), chunks=refs)
        await put_state(client, scope, value, ttl=100, chunks=writes, chunk_ttl=200)
        for write in writes:
            keys = [f"{write.key}/{i}" for i in range(len(write.parts))]
            found = await client.kv.get_many(scope, keys)
            assert [found[k].value if k in found else None for k in keys] == list(write.parts), (
                f"the parts of {write.key} are not stored in order under <key>/<n>"
            )
        cold = await open_client()
        reader = self._storage(cold, ns, "store-b")
        with edge("parts>=100", "cold client"):
            result = await reader.load_and_acquire(sid, owner="owner-b")
        assert isinstance(result, Acquired)
        assert dumped(result.handle.messages) == dumped([*first_messages, *second_messages]), (
            "the history read back from many parts is not the one saved"
        )
        await reader.release(result.handle)
        await reader.drain()
        # The store cuts the parts itself on clients whose items hold 1 KiB.
        small = await open_client(max_value_bytes=1024)
        cold_small = await open_client(max_value_bytes=1024)
        writer = self._storage(small, ns, "store-c")
        sid = names.short("store-parts")
        big = pair("big", 52_000)
        first = await writer.load_and_acquire(sid, owner="owner-c")
        assert isinstance(first, Acquired)
        with edge("store-cut parts"):
            await writer.save_and_release(first.handle, big)
        entry = await small.kv.get(writer.scope_for(sid), STATE_KEY)
        assert entry is not None
        header, _ = decode_state(entry.value)
        assert max(c.parts for c in header.chunks) >= 100, "the history was not cut into parts"
        reader = self._storage(cold_small, ns, "store-d")
        with edge("store-cut parts", "cold client"):
            loaded = await reader.load_and_acquire(sid, owner="owner-d")
        assert isinstance(loaded, Acquired)
        assert dumped(loaded.handle.messages) == dumped(big)
        await reader.release(loaded.handle)
        await reader.drain()
        await writer.drain()

    @rule("public-checks")
    async def test_session_save_refuses_oversized_values(self, client: Client, names: _Seq) -> None:
        """save refuses a state or a chunk part larger than the KV's max_value_bytes with ValueTooLargeError, as the KV API does, and the stored state stays as it was."""
        t = client.clock.now
        limit = client.kv.limits.max_value_bytes
        scope = names("size")
        value = state_value(t, fence=2, released=("store-a", t))
        version = await put_state(client, scope, value, ttl=100)
        port = client.ports.sessions
        with edge("state over the limit"), pytest.raises(ValueTooLargeError):
            await port.save(SaveRequest(scope, b"x" * (limit + 1), version, 100, None, []))
        assert await stored(client.kv, scope) == (value, version)
        big = ChunkWrite("h/big", [b"[", b"y" * (limit + 1)], t + 200)
        with edge("part over the limit"), pytest.raises(ValueTooLargeError):
            await port.save(SaveRequest(scope, value, version, 100, 200, [big]))
        assert await stored(client.kv, scope) == (value, version)
        assert await client.kv.get(scope, "h/big/1") is None, "an oversized part was stored"

    # -- sessions: through the stores -----------------------------------------------------------

    @rule("sliding-ttl", "expiry")
    async def test_session_turns_from_several_clients_keep_the_sliding_ttl(
        self, open_client: ClientFactory, names: _Seq, ns: str
    ) -> None:
        """Turns from three clients (none sharing a cache) on one session with a 10 s TTL, each 7 s after the last, keep the whole history — chunks due before the refresh horizon are re-copied — and never fail with SESSION_INVALID; the idle session then expires whole at its last write + TTL, not a millisecond earlier."""
        clients = [await open_client() for _ in range(3)]
        clock = clients[0].clock
        t = clock.now
        stores = [
            SessionStore(
                c.kv,
                ttl_seconds=self.TTL,
                lease_seconds=1,
                scope_prefix=f"{ns}:s:",
                port=c.ports.sessions,
            )
            for c in clients
        ]
        sid = names.short("sliding")
        history = [m for i in range(30) for m in pair(f"m{i}", 300)]  # several chunks
        try:
            async with stores[0].turn(sid) as session:
                session.replace(history)
            expected = list(history)
            for step in range(1, 6):
                clock.at(t + 7 * step)
                store = stores[step % 3]
                with edge("several clients", "sliding ttl"):
                    async with store.turn(sid) as session:
                        assert dumped(session.messages) == dumped(expected), (
                            f"turn {step}: the history changed"
                        )
                        expected = [*session.messages, *pair(f"step{step}")]
                        session.replace(expected)
            last = t + 7 * 5
            clock.at(last + self.TTL - EPS)
            info = await stores[1].inspect(sid)
            assert info is not None and info.message_count == len(expected), BEFORE_EXPIRY
            clock.at(last + self.TTL)
            assert await stores[1].inspect(sid) is None, "the idle session outlived its TTL"
            async with stores[2].turn(sid) as session:
                assert session.messages == [], "an expired session came back"
        finally:
            for store in stores:
                await store.aclose(timeout_seconds=5)

    @rule("expired-not-live")
    async def test_session_expired_lease_takeover_is_fenced(
        self, open_client: ClientFactory, names: _Seq, ns: str
    ) -> None:
        """One millisecond before a holder's lease runs out another client is refused (busy); at expires_at == now it takes the session with a higher fence, the old holder's save raises SESSION_LEASE_LOST and writes nothing, and the old holder's next acquire loads the new owner's history, not one it remembers."""
        one, two = await open_client(), await open_client()
        clock = one.clock
        t = clock.now
        a = self._storage(one, ns, "store-a", lease_seconds=self.TTL)
        b = self._storage(two, ns, "store-b", lease_seconds=self.TTL)
        sid = names.short("takeover")
        first = await a.load_and_acquire(sid, owner="owner-a")
        assert isinstance(first, Acquired)
        await a.save_and_release(first.handle, pair("base"))
        held = await a.load_and_acquire(sid, owner="owner-a")
        assert isinstance(held, Acquired)
        clock.at(t + self.TTL - EPS)
        with edge(BEFORE_EXPIRY, "takeover"):
            refused = await b.load_and_acquire(sid, owner="owner-b")
        assert isinstance(refused, Busy), "a live lease was taken over"
        clock.at(t + self.TTL)
        with edge(AT_EXPIRY, "takeover"):
            taken = await b.load_and_acquire(sid, owner="owner-b")
        assert isinstance(taken, Acquired), "an expired lease was taken for live"
        assert taken.handle.fence > held.handle.fence
        assert texts(taken.handle.messages) == ["q:base", "a:base"]
        await b.save_and_release(taken.handle, [*taken.handle.messages, *pair("thief")])
        with edge("fenced out"), pytest.raises(LeaseLostError):
            await a.save_and_release(held.handle, [*held.handle.messages, *pair("stale")])
        again = await a.load_and_acquire(sid, owner="owner-a")
        assert isinstance(again, Acquired)
        assert texts(again.handle.messages) == ["q:base", "a:base", "q:thief", "a:thief"], (
            "the old holder loaded a history it remembered, not the stored one"
        )
        await a.release(again.handle)
        await a.drain()
        await b.drain()

    @rule("expired-not-live")
    async def test_session_expired_session_is_not_revived(
        self, client: Client, names: _Seq, ns: str
    ) -> None:
        """A session whose state expired (expires_at == now) starts empty on the next turn of the very client that wrote it last (a state its port remembers is never taken for the stored one); one millisecond earlier that turn loads the history."""
        clock = client.clock
        t = clock.now
        storage = self._storage(client, ns, "store-a", ttl_seconds=self.TTL, lease_seconds=1)
        for when, what in ((t + self.TTL - EPS, BEFORE_EXPIRY), (t + self.TTL, AT_EXPIRY)):
            clock.at(t)
            sid = names.short("revive")
            first = await storage.load_and_acquire(sid, owner="owner-a")
            assert isinstance(first, Acquired)
            await storage.save_and_release(
                first.handle, [m for i in range(6) for m in pair(f"r{i}", 200)]
            )
            clock.at(when)
            with edge(what, "remembered state"):
                again = await storage.load_and_acquire(sid, owner="owner-a")
            assert isinstance(again, Acquired)
            if what == AT_EXPIRY:
                assert again.handle.messages == [], "an expired session was revived"
                assert again.handle.fence == 1
            else:
                assert len(again.handle.messages) == 12
            await storage.release(again.handle)
        await storage.drain()

    @rule("hand-over", "expiry")
    async def test_session_hints_are_removed_or_expire(
        self, open_client: ClientFactory, names: _Seq, ns: str
    ) -> None:
        """Waiters' hints are removed by the acquire that serves them, so clients are served in the order they hinted and no hint is left behind; a hint nobody removes expires at its expires_at == now, after which the releasing client is no longer held back (one millisecond earlier it is)."""
        clients = [await open_client() for _ in range(3)]
        clock = clients[0].clock
        a, b, c = (
            self._storage(
                client,
                ns,
                f"store-{name}",
                handover_courtesy_seconds=30,
                waiter_hint_seconds=1,
            )
            for client, name in zip(clients, "abc", strict=True)
        )
        kv = clients[0].kv
        sid = names.short("handover")
        scope = a.scope_for(sid)

        async def turn(storage: KVSessionStorage, owner: str) -> Acquired | Busy:
            result = await storage.load_and_acquire(sid, owner=owner)
            if isinstance(result, Acquired):
                await storage.save_and_release(
                    result.handle, [*result.handle.messages, *pair(owner)]
                )
            await storage.drain()
            return result

        assert isinstance(await turn(a, "a1"), Acquired)
        served: list[str] = []
        for releaser, waiter, owner in ((a, b, "b1"), (b, c, "c1"), (c, a, "a2")):
            assert await waiter.note_waiting(sid)
            with edge("hand-over", "several clients"):
                assert isinstance(await turn(releaser, "again"), Busy), (
                    "the releasing client took the session back while another waited"
                )
                assert isinstance(await turn(waiter, owner), Acquired)
            served.append(owner)
            assert await kv.get(scope, WAITER_KEY) is None, (
                f"{owner}'s hint is left behind after its acquire"
            )
        assert served == ["b1", "c1", "a2"]
        assert await b.note_waiting(sid)
        hint = await kv.get(scope, WAITER_KEY)
        assert hint is not None and hint.expires_at is not None
        clock.at(hint.expires_at - EPS)
        with edge(BEFORE_EXPIRY, "hand-over"):
            assert isinstance(await turn(a, "a3"), Busy), "a live hint was ignored"
        clock.at(hint.expires_at)
        with edge(AT_EXPIRY, "hand-over"):
            assert isinstance(await turn(a, "a3"), Acquired), (
                "an expired hint still held the releasing client back"
            )
        final = await a.read_messages(sid)
        assert texts(final or [])[::2] == ["q:a1", "q:b1", "q:c1", "q:a2", "q:a3"]

    # -- memory: the port ---------------------------------------------------------------------

    def _memory_scopes(self, ns: str) -> tuple[str, str, str]:
        """(a directory's scope, its parent's scope, the receipt index scope)."""
        return f"{ns}:m:dir", f"{ns}:m:", f"{ns}:m:~ops/ab"

    @rule("expired-not-live")
    async def test_memory_write_conditions_and_expired_records(
        self, client: Client, ns: str
    ) -> None:
        """write creates a record only when it is absent or expired (a tombstone at expires_at == now counts as absent, one millisecond earlier it conflicts) and replaces one only at expected_version; a failed condition writes no record and no index entry (and, on an atomic port, no marker)."""
        clock = client.clock
        t = clock.now
        port = client.ports.memory
        scope, parent, ops = self._memory_scopes(ns)
        first = await port.write(file_write(scope, "f.md", b"tombstone", ttl=self.TTL))
        clock.at(t + self.TTL - EPS)
        blocked = file_write(
            scope,
            "f.md",
            b"new",
            index=IndexWrite(ops, "i1", b"receipt-1", 50),
            markers=[(parent, "m1/")],
        )
        with edge(BEFORE_EXPIRY, "tombstone"), pytest.raises(ConflictError):
            await port.write(blocked)
        assert await stored(client.kv, scope, "f.md") == (b"tombstone", first)
        assert await client.kv.get(ops, "i1") is None, "a refused write left its index entry"
        if port.atomic:
            assert await client.kv.get(parent, "m1/") is None, "a refused write left a marker"
        clock.at(t + self.TTL)
        with edge(AT_EXPIRY, "tombstone"):
            second = await port.write(blocked)
        assert await stored(client.kv, scope, "f.md") == (b"new", second)
        index = await client.kv.get(ops, "i1")
        assert index is not None and index.value == b"receipt-1"
        marker = await client.kv.get(parent, "m1/")
        assert marker is not None and marker.value == MARKER_VALUE
        stale = file_write(
            scope,
            "f.md",
            b"stale",
            expected=first,
            index=IndexWrite(ops, "i2", b"receipt-2", 50),
            markers=[(parent, "m2/")],
        )
        with edge("stale version"), pytest.raises(ConflictError):
            await port.write(stale)
        assert await stored(client.kv, scope, "f.md") == (b"new", second)
        assert await client.kv.get(ops, "i2") is None
        if port.atomic:
            assert await client.kv.get(parent, "m2/") is None
        third = await port.write(file_write(scope, "f.md", b"newer", expected=second))
        assert await stored(client.kv, scope, "f.md") == (b"newer", third)
        assert len({first, second, third}) == 3

    @rule("expiry")
    async def test_memory_write_expiry_of_record_index_and_markers(
        self, client: Client, ns: str
    ) -> None:
        """A record written with a ttl (a tombstone) expires at now + ttl and its receipt index entry at now + index.ttl, each live one millisecond before and gone at expires_at == now; directory markers and records written without a ttl never expire."""
        clock = client.clock
        t = clock.now
        port = client.ports.memory
        scope, parent, ops = self._memory_scopes(ns)
        await port.write(
            file_write(
                scope,
                "gone.md",
                b"tombstone",
                ttl=self.TTL,
                index=IndexWrite(ops, "expiring", b"receipt", 3 * self.TTL),
                markers=[(parent, "dir/")],
            )
        )
        await port.write(file_write(scope, "kept.md", b"live"))
        checks = [
            (t + self.TTL - EPS, {"gone.md", "kept.md"}, True, BEFORE_EXPIRY),
            (t + self.TTL, {"kept.md"}, True, AT_EXPIRY),
            (t + 3 * self.TTL - EPS, {"kept.md"}, True, BEFORE_EXPIRY),
            (t + 3 * self.TTL, {"kept.md"}, False, AT_EXPIRY),
            (t + 10 * 365 * 86_400, {"kept.md"}, False, "no ttl"),
        ]
        for when, files, indexed, boundary in checks:
            clock.at(when)
            what = f"at +{when - t:g}s"
            with edge(boundary):
                found = {k for k in ("gone.md", "kept.md") if await port.read(scope, k)}
            assert found == files, f"{what}: live records {found}, expected {files}"
            assert (await client.kv.get(ops, "expiring") is not None) is indexed, (
                f"{what}: the index entry's expiry is wrong"
            )
            assert await client.kv.get(parent, "dir/") is not None, f"{what}: a marker expired"

    @rule("whole-keys", "expired-not-live")
    async def test_memory_index_entries_are_compared_whole(self, client: Client, ns: str) -> None:
        """An index entry matches only its own key: keys sharing a 200-character prefix with a stored one, or being its prefix, are written as their own entries; on an atomic port a live entry under the very key makes the write conflict and write nothing, one that expired (expires_at == now) no longer does."""
        clock = client.clock
        t = clock.now
        port = client.ports.memory
        scope, _, ops = self._memory_scopes(ns)
        key = "k" * 200
        await port.write(
            file_write(scope, "a.md", b"a", index=IndexWrite(ops, key, b"receipt-a", self.TTL))
        )
        for name, other in (("c", key + "x"), ("d", key[:-1]), ("e", "k" * 199 + "j")):
            with edge("shared prefix"):
                await port.write(
                    file_write(
                        scope,
                        f"{name}.md",
                        name.encode(),
                        index=IndexWrite(ops, other, f"receipt-{name}".encode(), self.TTL),
                    )
                )
            entry = await client.kv.get(ops, other)
            assert entry is not None and entry.value == f"receipt-{name}".encode(), (
                f"the index entry {other[-3:]!r} was taken for {key[-3:]!r}"
            )
        clock.at(t + self.TTL - EPS)
        again = file_write(scope, "b.md", b"b", index=IndexWrite(ops, key, b"receipt-b", 30))
        if port.atomic:
            with edge(BEFORE_EXPIRY, "index taken"), pytest.raises(ConflictError):
                await port.write(again)
            assert await client.kv.get(scope, "b.md") is None
        else:
            with edge(BEFORE_EXPIRY, "index taken"):
                await port.write(again)
        entry = await client.kv.get(ops, key)
        assert entry is not None and entry.value == b"receipt-a", "a live index entry was replaced"
        clock.at(t + self.TTL)
        with edge(AT_EXPIRY, "index taken"):
            await port.write(
                file_write(scope, "f.md", b"f", index=IndexWrite(ops, key, b"receipt-f", 30))
            )
        entry = await client.kv.get(ops, key)
        assert entry is not None and entry.value == b"receipt-f", (
            "an expired index entry was taken for a live one"
        )

    @rule("public-checks", "expiry")
    async def test_memory_read_is_a_checked_get(self, client: Client, ns: str) -> None:
        """read returns what the KV's get returns for a live record (value and version), None for an absent one or one at expires_at == now (one millisecond earlier it is returned), and refuses invalid ids with the KV's InvalidIdError."""
        clock = client.clock
        t = clock.now
        port = client.ports.memory
        scope, _, _ = self._memory_scopes(ns)
        version = await port.write(file_write(scope, "r.md", b"record", ttl=self.TTL))
        entry = await port.read(scope, "r.md")
        assert entry is not None and (entry.value, entry.version) == (b"record", version)
        assert await port.read(scope, "absent.md") is None
        clock.at(t + self.TTL - EPS)
        with edge(BEFORE_EXPIRY):
            assert await port.read(scope, "r.md") is not None
        clock.at(t + self.TTL)
        with edge(AT_EXPIRY):
            assert await port.read(scope, "r.md") is None, "read returned an expired record"
        for bad_scope, bad_key in (
            (scope, ""),
            (scope, "a\x00b"),
            ("", "r.md"),
            (scope, "k" * (client.kv.limits.max_key_chars + 1)),
        ):
            with edge("invalid id"), pytest.raises(InvalidIdError):
                await port.read(bad_scope, bad_key)

    @rule("public-checks")
    async def test_memory_write_refuses_oversized_values(self, client: Client, ns: str) -> None:
        """write refuses a record or an index entry larger than the KV's max_value_bytes with ValueTooLargeError, as the KV API does; an oversized record writes nothing, and on an atomic port neither does an oversized index entry."""
        port = client.ports.memory
        scope, parent, ops = self._memory_scopes(ns)
        limit = client.kv.limits.max_value_bytes
        with edge("record over the limit"), pytest.raises(ValueTooLargeError):
            await port.write(
                file_write(
                    scope,
                    "big.md",
                    b"x" * (limit + 1),
                    index=IndexWrite(ops, "big", b"receipt", 30),
                    markers=[(parent, "big/")],
                )
            )
        assert await client.kv.get(scope, "big.md") is None
        assert await client.kv.get(ops, "big") is None
        with edge("index over the limit"), pytest.raises(ValueTooLargeError):
            await port.write(
                file_write(
                    scope, "idx.md", b"small", index=IndexWrite(ops, "idx", b"y" * (limit + 1), 30)
                )
            )
        assert await client.kv.get(ops, "idx") is None
        if port.atomic:
            assert await client.kv.get(scope, "idx.md") is None

    # -- memory: through the store ---------------------------------------------------------------

    def _memory(self, client: Client, ns: str, **options: Any) -> KVMemoryStore:
        return KVMemoryStore(
            client.kv, scope_prefix=f"{ns}:ms:", port=client.ports.memory, **options
        )

    @rule("public-checks")
    async def test_port_methods_refuse_what_the_kv_api_refuses(
        self, open_client: ClientFactory, names: _Seq, ns: str
    ) -> None:
        """Every port method refuses an invalid scope or key (empty, with a NUL, longer than the KV's limit, a lone surrogate) with the KV's InvalidIdError, as kv.create does for the same id, and a journal counter over max_value_bytes with its ValueTooLargeError; nothing is written (on a port that is not atomic, nothing before the refused id). An acquire may answer GENERIC instead of raising (the core's KV calls then refuse the scope); one whose new state (a longer owner in the lease) would exceed max_value_bytes answers GENERIC or raises ValueTooLargeError, and the stored state stays as it was."""
        client = await open_client(max_value_bytes=1024)
        kv, ports = client.kv, client.ports
        t = client.clock.now
        longest = max(kv.limits.max_scope_chars, kv.limits.max_key_chars)
        scope = names("checks")
        runs = names("checks-run")
        directory, parent, ops = self._memory_scopes(ns)
        value = state_value(t, fence=2, released=("store-a", t))
        version = await put_state(client, scope, value, ttl=100)
        invalid = ("", "a\x00b", "k" * (longest + 1), "bad\ud800")
        for n, bad in enumerate(invalid):
            for bad_scope, bad_key in ((bad, "k"), ("s", bad)):
                with pytest.raises(InvalidIdError):  # the reference: the KV API refuses it
                    await kv.create(bad_scope, bad_key, b"v")
            with edge("invalid id"):
                await self._sessions_refuse_id(ports, bad, scope, value, version, t)
                await self._memory_refuses_id(ports, bad, n, (directory, parent, ops))
                if ports.journal.atomic:
                    await self._journal_refuses_id(ports, bad, runs)
        assert await stored(kv, scope) == (value, version), "a refused save changed the state"
        assert [item.key for item in await kv.scan(scope)] == [STATE_KEY], "a part was stored"
        written = {item.key for item in await kv.scan(directory)}
        assert not written & {"f.md", *(f"m{n}.md" for n in range(len(invalid)))}
        if ports.memory.atomic:
            assert not written, f"an atomic write stored {sorted(written)} and then refused an id"
        if ports.journal.atomic:
            await self._journal_refuses_oversized_counter(client, runs)
        await self._acquire_refuses_growing_over_the_limit(client, names("full"), t)

    async def _sessions_refuse_id(
        self, ports: PortSet, bad: str, scope: str, value: bytes, version: str, t: float
    ) -> None:
        """acquire (or GENERIC) and save, with ``bad`` as the scope or a chunk id."""
        try:
            reply = await ports.sessions.acquire(acquire_request(bad, t))
        except InvalidIdError:
            pass
        else:
            assert reply.outcome == "generic", (
                f"acquire in the invalid scope {bad[:20]!r} answered {reply.outcome}"
            )
        with pytest.raises(InvalidIdError):
            await ports.sessions.save(SaveRequest(bad, value, version, 100, None, []))
        if bad:  # an empty chunk id still makes a valid part key (h//0)
            chunk = ChunkWrite(f"h/{bad}", [b"[]"], t + 200)
            with pytest.raises(InvalidIdError):
                await ports.sessions.save(SaveRequest(scope, value, version, 100, 200, [chunk]))

    async def _memory_refuses_id(
        self, ports: PortSet, bad: str, n: int, scopes: tuple[str, str, str]
    ) -> None:
        """read and write, with ``bad`` as the scope, the key, a marker or an index key."""
        directory, parent, ops = scopes
        with pytest.raises(InvalidIdError):
            await ports.memory.read(bad, "f.md")
        for write in (
            file_write(bad, "f.md", b"f"),
            file_write(directory, bad, b"f"),
            file_write(directory, f"m{n}.md", b"f", markers=[(parent, bad)]),
            file_write(directory, f"i{n}.md", b"f", index=IndexWrite(ops, bad, b"r", 30)),
        ):
            with pytest.raises(InvalidIdError):
                await ports.memory.write(write)

    async def _journal_refuses_id(self, ports: PortSet, bad: str, runs: str) -> None:
        """append, with ``bad`` as the scope, the head key or the event key."""
        for request in (
            AppendRequest(bad, "head/j", b'{"next":1}', None, "j/a", b"a", None),
            AppendRequest(runs, bad, b'{"next":1}', None, "j/a", b"a", None),
            AppendRequest(runs, "head/j", b'{"next":1}', None, bad, b"a", None),
        ):
            with pytest.raises(InvalidIdError):
                await ports.journal.append(request)

    async def _journal_refuses_oversized_counter(self, client: Client, runs: str) -> None:
        limit = client.kv.limits.max_value_bytes
        with edge("counter over the limit"), pytest.raises(ValueTooLargeError):
            await client.ports.journal.append(
                AppendRequest(runs, "head/j", b"9" * (limit + 1), None, "j/a", b"a", None)
            )
        assert await client.kv.scan(runs) == [], "a refused append wrote something"

    async def _acquire_refuses_growing_over_the_limit(
        self, client: Client, full_scope: str, t: float
    ) -> None:
        """A stored state exactly at the limit, which the lease of a long owner id would grow."""
        limit = client.kv.limits.max_value_bytes
        header = StateHeader(
            lease=None,
            fence=2,
            chunks=(),
            tail_count=1,
            recovery=(),
            recovery_since=None,
            created_at=t,
            updated_at=t,
            released_by="store-a",
            released_at=t,
        )
        pad = limit - len(encode_state(header, b'[""]'))
        full = encode_state(header, b'["' + b"t" * pad + b'"]')
        assert len(full) == limit
        full_version = await client.kv.create(full_scope, STATE_KEY, full, ttl=100)
        with edge("state would grow over the limit"):
            try:
                reply = await client.ports.sessions.acquire(
                    acquire_request(full_scope, t, owner="o" * 100)
                )
            except ValueTooLargeError:
                pass
            else:
                assert reply.outcome == "generic", (
                    f"an acquire whose new state exceeds max_value_bytes answered {reply.outcome}"
                )
        assert await stored(client.kv, full_scope) == (full, full_version)

    @rule("public-checks")
    async def test_port_methods_on_a_closed_client_raise_resource_closed(
        self, open_client: ClientFactory, names: _Seq, ns: str
    ) -> None:
        """On a closed client every port method raises ResourceClosedError, as the KV API does, even when the call is also invalid (an oversized value, an empty id): the KV API checks the store first. An acquire may answer GENERIC instead (the core's first KV call then raises it)."""
        first = await open_client()
        client = await open_client()
        t = client.clock.now
        big = b"x" * (client.kv.limits.max_value_bytes + 1)
        scope = names("closed")
        directory, _, _ = self._memory_scopes(ns)
        version = await put_state(first, scope, state_value(t, fence=2), ttl=100)
        await client.kv.aclose()
        ports = client.ports
        with pytest.raises(ResourceClosedError):  # the reference
            await client.kv.create("", "k", big)
        with edge("closed client"):
            for bad_scope in (scope, ""):
                try:
                    reply = await ports.sessions.acquire(acquire_request(bad_scope, t))
                except ResourceClosedError:
                    pass
                else:
                    assert reply.outcome == "generic", f"a closed client answered {reply.outcome}"
            with pytest.raises(ResourceClosedError):
                await ports.sessions.save(SaveRequest(scope, big, version, 100, None, []))
            with pytest.raises(ResourceClosedError):
                await ports.memory.read("", "f.md")
            with pytest.raises(ResourceClosedError):
                await ports.memory.write(file_write(directory, "f.md", big))
            if ports.journal.atomic:
                with pytest.raises(ResourceClosedError):
                    await ports.journal.append(
                        AppendRequest(f"{ns}/run/closed", "head/j", b"{}", None, "j/a", big, None)
                    )

    @rule("public-checks")
    async def test_port_methods_refuse_non_positive_ttls(
        self, client: Client, names: _Seq, ns: str
    ) -> None:
        """A TTL of zero or less raises ValueError, as the KV API does for the same TTL, instead of writing an entry that is expired at once: a memory write's record or index entry, a journal append, a session save's state or chunk parts; an acquire raises it or answers GENERIC. Nothing is written."""
        kv, ports = client.kv, client.ports
        t = client.clock.now
        scope = names("ttl")
        runs = names("ttl-run")
        directory, _, ops = self._memory_scopes(ns)
        value = state_value(t, fence=2, released=("store-a", t))
        version = await put_state(client, scope, value, ttl=100)
        with pytest.raises(ValueError, match="ttl"):  # the reference: the KV API refuses it
            await kv.create(directory, "reference.md", b"x", ttl=0)
        with edge("ttl <= 0"):
            with pytest.raises(ValueError, match="ttl"):
                await ports.memory.write(file_write(directory, "f.md", b"f", ttl=0))
            index = IndexWrite(ops, "op-ttl", b"receipt", -1)
            with pytest.raises(ValueError, match="ttl"):
                await ports.memory.write(file_write(directory, "g.md", b"g", index=index))
            if ports.journal.atomic:
                with pytest.raises(ValueError, match="ttl"):
                    await ports.journal.append(
                        AppendRequest(runs, "head/j", b'{"next":1}', None, "j/a", b"a", 0)
                    )
            with pytest.raises(ValueError, match="ttl"):
                await ports.sessions.save(SaveRequest(scope, value, version, 0, None, []))
            chunk = ChunkWrite("h/ttl", [b"[]"], t - 5)
            with pytest.raises(ValueError, match="ttl"):
                await ports.sessions.save(SaveRequest(scope, value, version, 100, -5, [chunk]))
            try:
                reply = await ports.sessions.acquire(acquire_request(scope, t, ttl_seconds=0))
            except ValueError:
                pass
            else:
                assert reply.outcome == "generic", f"an acquire with ttl 0 answered {reply.outcome}"
        assert await stored(kv, scope) == (value, version), "a refused call changed the state"
        assert [item.key for item in await kv.scan(scope)] == [STATE_KEY], "a part was stored"
        assert await kv.scan(directory) == [], "a refused memory write stored something"
        assert await kv.scan(ops) == [], "a refused memory write stored its index entry"
        assert await kv.scan(runs) == [], "a refused append wrote something"

    @rule("many-parts")
    async def test_memory_files_of_many_chunks_read_back_in_order(
        self, client: Client, ns: str
    ) -> None:
        """Through the store on this port, files of more than 10 and more than 100 chunks (max_record_bytes 1,024) read back character for character and in order, whole and cut anywhere."""
        store = self._memory(client, ns, max_record_bytes=1024)
        for path, size in (("u/ten.md", 8_000), ("u/hundred.md", 72_000)):
            content = crash_content(size)
            with edge("parts>=100" if size > 50_000 else "parts>=10"):
                written = await store.write(path, content, expected_version=None)
                whole = await store.read(path, max_chars=size + 10)
            assert whole is not None and whole.version == written.version
            assert whole.content == content, f"{path}: content differs after the round trip"
            for max_chars in (1, 1023, 1025, size // 2 + 7, size - 1):
                part = await store.read(path, max_chars=max_chars)
                assert part is not None and part.content == content[:max_chars] and part.truncated

    @rule("expiry", "expired-not-live")
    async def test_memory_receipts_and_tombstones_expire_on_the_boundary(
        self, client: Client, ns: str
    ) -> None:
        """Through the store, a write's and a delete's receipts (index entries, tombstone) last exactly receipt_ttl: one millisecond before, get_operation answers and a retry replays; at expires_at == now the ids are forgotten, the tombstone is gone, and a write with the old id is new and lands."""
        clock = client.clock
        t = clock.now
        store = self._memory(client, ns, receipt_ttl_seconds=60)
        written = await store.write("u/a.md", "one", expected_version=None, operation=op("op-w"))
        doomed = await store.write("u/d.md", "d", expected_version=None)
        await store.delete("u/d.md", expected_version=doomed.version, operation=op("op-d"))
        clock.at(t + 60 - EPS)
        with edge(BEFORE_EXPIRY, "receipt"):
            assert await store.get_operation(op("op-w")) is not None
            assert await store.get_operation(op("op-d")) is not None
            retry = await store.write("u/a.md", "one", expected_version=None, operation=op("op-w"))
        assert retry.replayed and retry.version == written.version
        clock.at(t + 60)
        with edge(AT_EXPIRY, "receipt"):
            assert await store.get_operation(op("op-w")) is None
            assert await store.get_operation(op("op-d")) is None
            again = await store.write(
                "u/a.md", "two", expected_version=written.version, operation=op("op-w")
            )
        assert not again.replayed, "a forgotten operation id was taken for a replay"
        found = await store.read("u/a.md", max_chars=100)
        assert found is not None and found.content == "two"
        scope = store.directory_scope("u")
        assert await client.kv.get(scope, "d.md") is None, "the tombstone outlived receipt_ttl"

    @rule("whole-keys")
    async def test_memory_operation_ids_are_compared_whole(self, client: Client, ns: str) -> None:
        """Through the store, operation ids sharing a 150-character prefix, or one a prefix of another, are distinct: each write lands, none is taken for another's replay, and get_operation answers each with its own version."""
        store = self._memory(client, ns)
        base = "op-" + "p" * 150
        ids = [base + "a", base + "b", base, base + "a" * 20]
        versions = {}
        for n, operation_id in enumerate(ids):
            with edge("shared prefix"):
                mutation = await store.write(
                    f"u/f{n}.md", f"content {n}", expected_version=None, operation=op(operation_id)
                )
            assert not mutation.replayed, f"id #{n} was taken for another id's replay"
            versions[operation_id] = mutation.version
        for operation_id, version in versions.items():
            found = await store.get_operation(op(operation_id))
            assert found is not None and found.version == version

    # -- journal ---------------------------------------------------------------------------------

    def _checkpointer(self, client: Client, ns: str, **options: Any) -> Checkpointer:
        return Checkpointer(client.kv, scope_prefix=f"{ns}/", port=client.ports.journal, **options)

    @rule("public-checks")
    async def test_journal_append_advances_the_counter_and_is_fenced(
        self, client: Client, ns: str
    ) -> None:
        """An atomic append on a new log (no counter version) creates the counter and the entry; the next one advances the counter at the version returned; a stale counter version, or a counter that exists when none is given, raises ConflictError and writes no entry; an oversized entry raises ValueTooLargeError and moves no counter. (On a port that is not atomic the core's own two-step append runs; it is checked through the checkpointer.)"""
        port = client.ports.journal
        if not port.atomic:
            checkpointer = self._checkpointer(client, ns, ttl_seconds=None)
            results = [
                await checkpointer.append("r", JournalEvent.completed(f"s{i}", {"i": i}))
                for i in range(3)
            ]
            assert [r.seq for r in results] == [0, 1, 2]
            return
        scope = f"{ns}/run/fenced"
        first = await port.append(
            AppendRequest(scope, "head/j", b'{"next":1}', None, "j/a", b"entry-a", None)
        )
        assert first.created_version is not None and first.head_version is not None
        assert await stored(client.kv, scope, "head/j") == (b'{"next":1}', first.head_version)
        assert await stored(client.kv, scope, "j/a") == (b"entry-a", first.created_version)
        second = await port.append(
            AppendRequest(scope, "head/j", b'{"next":2}', first.head_version, "j/b", b"b", None)
        )
        assert second.created_version is not None and second.head_version is not None
        for head_version, what in ((first.head_version, "stale version"), (None, "counter exists")):
            with edge(what), pytest.raises(ConflictError):
                await port.append(
                    AppendRequest(scope, "head/j", b'{"next":9}', head_version, "j/c", b"c", None)
                )
            assert await client.kv.get(scope, "j/c") is None, f"{what}: the entry was written"
        limit = client.kv.limits.max_value_bytes
        with edge("entry over the limit"), pytest.raises(ValueTooLargeError):
            await port.append(
                AppendRequest(
                    scope,
                    "head/j",
                    b'{"next":3}',
                    second.head_version,
                    "j/d",
                    b"d" * (limit + 1),
                    None,
                )
            )
        assert await stored(client.kv, scope, "head/j") == (b'{"next":2}', second.head_version)
        assert await client.kv.get(scope, "j/d") is None

    @rule("whole-keys", "expired-not-live")
    async def test_journal_duplicates_are_whole_live_keys(self, client: Client, ns: str) -> None:
        """An atomic append whose entry key is live writes nothing and returns the stored entry; keys sharing a 200-character prefix with it, or being its prefix, are new entries; an entry past its expiry (expires_at == now) is no duplicate and is written again, one millisecond earlier it is. (Not atomic: checked through the checkpointer with step ids sharing a long prefix and a run at its TTL.)"""
        clock = client.clock
        t = clock.now
        port = client.ports.journal
        if not port.atomic:
            await self._checkpointer_duplicates(client, ns)
            return
        scope = f"{ns}/run/dups"
        key = "j/" + "s" * 200 + "/completed"
        state: dict[str, Any] = {"head": None, "next": 0}

        async def append(entry_key: str, value: bytes) -> AppendOutcome:
            outcome = await port.append(
                AppendRequest(
                    scope,
                    "head/j",
                    b'{"next":%d}' % (state["next"] + 1),
                    state["head"],
                    entry_key,
                    value,
                    self.TTL,
                )
            )
            if outcome.head_version is not None:
                state["head"] = outcome.head_version
                state["next"] += 1
            return outcome

        original = await append(key, b"original")
        assert original.created_version is not None
        clock.at(t + self.TTL - EPS)
        with edge(BEFORE_EXPIRY, "duplicate"):
            duplicate = await append(key, b"retry")
        assert duplicate.created_version is None, "a live entry was written again"
        existing = duplicate.existing or await client.kv.get(scope, key)
        assert existing is not None and existing.value == b"original"
        for other in (key[:-1], key + "x", "j/" + "s" * 199 + "t/completed", "j/" + "s" * 200):
            with edge("shared prefix"):
                outcome = await append(other, other.encode())
            assert outcome.created_version is not None, (
                f"{other[-12:]!r} was taken for {key[-12:]!r}"
            )
        assert await stored(client.kv, scope, key) == (b"original", original.created_version)
        clock.at(t + self.TTL)
        with edge(AT_EXPIRY, "duplicate"):
            renewed = await append(key, b"after expiry")
        assert renewed.created_version is not None, "an expired entry was taken for a duplicate"
        assert await stored(client.kv, scope, key) == (b"after expiry", renewed.created_version)

    async def _checkpointer_duplicates(self, client: Client, ns: str) -> None:
        clock = client.clock
        t = clock.now
        checkpointer = self._checkpointer(client, ns, ttl_seconds=self.TTL)
        step = "s" * 150
        first = await checkpointer.append("r", JournalEvent.completed(step, {"n": 0}))
        for n, other in enumerate((step + "x", step[:-1], "s" * 149 + "t"), start=1):
            result = await checkpointer.append("r", JournalEvent.completed(other, {"n": n}))
            assert not result.duplicate and result.seq == n
        clock.at(t + self.TTL - EPS)
        again = await checkpointer.append("r", JournalEvent.completed(step, {"n": 0}))
        assert again.duplicate and again.seq == first.seq
        clock.at(t + self.TTL)
        fresh = await checkpointer.append("r", JournalEvent.completed(step, {"n": 0}))
        assert not fresh.duplicate and fresh.seq == 0

    @rule("expiry")
    async def test_journal_counter_and_entry_expire_at_their_ttl(
        self, client: Client, ns: str
    ) -> None:
        """An atomic append's counter and entry expire at now + ttl (live one millisecond before, gone at expires_at == now; without a ttl never); an expired counter is absent: a counter version from before is stale, and none given creates it anew. (Not atomic: the run's records, counter included, are checked through the checkpointer.)"""
        clock = client.clock
        t = clock.now
        port = client.ports.journal
        if not port.atomic:
            checkpointer = self._checkpointer(client, ns, ttl_seconds=self.TTL)
            await checkpointer.append("r", JournalEvent.completed("s0", {}))
            clock.at(t + self.TTL - EPS)
            assert (await checkpointer.append("r", JournalEvent.completed("s1", {}))).seq == 1
            assert len(await checkpointer.load("r")) == 2
            clock.at(t + self.TTL)
            assert len(await checkpointer.load("r")) == 0
            assert (await checkpointer.append("r", JournalEvent.completed("s1", {}))).seq == 0
            return
        scope = f"{ns}/run/ttl"
        first = await port.append(
            AppendRequest(scope, "head/e", b'{"next":1}', None, "j/e", b"e", self.TTL)
        )
        await port.append(AppendRequest(scope, "head/n", b'{"next":1}', None, "j/n", b"n", None))
        clock.at(t + self.TTL - EPS)
        with edge(BEFORE_EXPIRY):
            found = await client.kv.get_many(scope, ["head/e", "j/e"])
        assert set(found) == {"head/e", "j/e"}, "the counter or the entry expired early"
        clock.at(t + self.TTL)
        with edge(AT_EXPIRY):
            assert await client.kv.get_many(scope, ["head/e", "j/e"]) == {}
            with pytest.raises(ConflictError):
                await port.append(
                    AppendRequest(
                        scope, "head/e", b'{"next":2}', first.head_version, "j/f", b"f", self.TTL
                    )
                )
            assert await client.kv.get(scope, "j/f") is None
            restarted = await port.append(
                AppendRequest(scope, "head/e", b'{"next":1}', None, "j/e", b"e2", self.TTL)
            )
        assert restarted.created_version is not None
        clock.at(t + 10 * 365 * 86_400)
        assert set(await client.kv.get_many(scope, ["head/n", "j/n"])) == {"head/n", "j/n"}

    @rule("expiry", "expired-not-live")
    async def test_checkpointer_on_the_port_keeps_runs_whole_until_their_ttl(
        self, client: Client, ns: str
    ) -> None:
        """Through the checkpointer on this port with a 10 s TTL: appends take positions in order, a re-append one millisecond before the run expires is a duplicate at its original position, and at expires_at == now the run is gone and the same step starts it again at position 0."""
        clock = client.clock
        t = clock.now
        checkpointer = self._checkpointer(client, ns, ttl_seconds=self.TTL)
        results = [
            await checkpointer.append("run", JournalEvent.completed(f"{i:06d}-model", {"i": i}))
            for i in range(3)
        ]
        assert [r.seq for r in results] == [0, 1, 2]
        clock.at(t + self.TTL - EPS)
        with edge(BEFORE_EXPIRY, "run ttl"):
            again = await checkpointer.append(
                "run", JournalEvent.completed("000001-model", {"i": 1})
            )
        assert again.duplicate and again.seq == 1
        assert len(await checkpointer.load("run")) == 3
        clock.at(t + self.TTL)
        with edge(AT_EXPIRY, "run ttl"):
            assert len(await checkpointer.load("run")) == 0
            fresh = await checkpointer.append(
                "run", JournalEvent.completed("000001-model", {"i": 1})
            )
        assert not fresh.duplicate and fresh.seq == 0
