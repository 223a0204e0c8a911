# The exception under test comes out of the ``async with store.turn()`` block itself.
"""The fault contract: a backend survives its own service's routine faults.

The faults come from the backend's :class:`~agent_stores.faults.FaultInjector` (the
``fault_injector`` hook), which injects them at the SDK's transport while the real server
answers everything else; a backend without one gets the core's KV-level injector
(``agent_stores.kv.faulty``: it faults each KV call, and each call of the native ports
it carries, as one request). Silence comes from the
contract's own TCP proxy (:mod:`agent_stores_contract.proxy`), placed in front of the
server through the ``proxied_url`` hook; a backend that cannot be proxied (no network, or
a cluster client that follows redirects) is made silent by the KV-level injector instead.

Every operation of the workloads must succeed or raise the right typed error: a transient
fault retried within its budget and then reported as unavailable (never as a
configuration error), a lost compare-and-swap as a conflict. Afterwards nothing may be
lost, applied twice or left corrupt. Each run's tally (faults injected by name,
outcomes, lost / duplicated / corrupt) is printed in pytest's summary.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from agent_stores import (
    AppError,
    BackendUnavailableError,
    ConfigError,
    ConflictError,
    ErrorCode,
    KVStore,
    StoreURL,
    connect,
    open_kv,
)
from agent_stores.checkpointer import Checkpointer
from agent_stores.faults import FaultInjector, FaultKind
from agent_stores.kv.faulty import KVFaultInjector
from agent_stores.memory import KVMemoryStore
from agent_stores.plugins import get_registry
from agent_stores.sessions import (
    LeaseLostError,
    SessionBusyError,
    SessionStore,
    TransientStoreError,
)
from pydantic_ai_harness.memory import MemoryConflictError, MemoryOperation

from .ambiguous import (
    ReplyLoser,
    kv_lost_replies,
    kv_rejected_then_conflict,
    memory_lost_replies,
    session_lost_replies,
    store_rejected_then_conflict,
)
from .base import ContractBase, drop_namespace
from .proxy import TCPProxy
from .proxying import server_address, through_proxy
from .session_workers import pair, texts

#: Opens a KV client of the backend under test; ``faulty=False``: one that bypasses the
#: injector (to check the data afterwards, when a replica's lag is no fault of the store).
Opener = Callable[..., Awaitable[KVStore]]

#: Every fault run's tally, printed by the plugin at the end of the run.
REPORTS: list[FaultReport] = []

UNAVAILABLE = (TransientStoreError, BackendUnavailableError)
LOST_CAS = (LeaseLostError, ConflictError, SessionBusyError, MemoryConflictError)


@dataclass
class FaultReport:
    """What one fault run injected, how the operations ended, and what the data says."""

    backend: str
    workload: str
    injector: str
    injected: dict[str, int] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    misreported: list[str] = field(default_factory=list)
    bad_errors: list[str] = field(default_factory=list)

    def outcome(self, error: BaseException | None) -> str:
        """Count how an operation ended: ``ok``, ``unavailable``, ``conflict``, or a bad one."""
        kind = classify(error)
        self.outcomes[kind] += 1
        if kind in ("configuration", "untyped") and error is not None:
            self.bad_errors.append(f"{type(error).__name__}: {error}"[:300])
        return kind

    def line(self) -> str:
        injected = ", ".join(f"{k} {v}" for k, v in sorted(self.injected.items())) or "none"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        return (
            f"{self.backend} [{self.workload}, {self.injector}]: injected {injected}; "
            f"outcomes {outcomes}; lost {len(self.lost)}, duplicated {len(self.duplicated)}, "
            f"corrupt {len(self.corrupt)}, misreported {len(self.misreported)}, "
            f"configuration/untyped errors {len(self.bad_errors)}"
        )

    def check(self) -> None:
        """Fail unless nothing was lost, duplicated, corrupt, misreported or badly typed."""
        REPORTS.append(self)
        problems = {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "corrupt": self.corrupt,
            "misreported": self.misreported,
            "configuration or untyped errors": self.bad_errors,
        }
        found = {k: v[:10] for k, v in problems.items() if v}
        assert not found, f"{self.line()}\n{found}"


def tags(messages: list[Any] | None) -> list[str]:
    """The tag of each stored pair (see :func:`~agent_stores_contract.session_workers.pair`)."""
    return [t.removeprefix("q:") for t in texts(messages or []) if t.startswith("q:")]


def classify(error: BaseException | None) -> str:
    """``ok``, ``unavailable`` (typed, retryable), ``conflict`` (a lost CAS or lease), or
    ``configuration`` / ``untyped`` — the two a routine fault must never produce."""
    if error is None:
        return "ok"
    if isinstance(error, UNAVAILABLE):
        return "unavailable"
    if isinstance(error, LOST_CAS):
        return "conflict"
    if isinstance(error, ConfigError) or (
        isinstance(error, AppError) and error.code == ErrorCode.CONFIG_INVALID
    ):
        return "configuration"
    cause = error.__cause__
    if isinstance(error, AppError) and isinstance(cause, ConfigError):
        return "configuration"
    return "untyped"


def injector_for(url: str) -> FaultInjector:
    """The backend's own injector, else the core's KV-level one."""
    found = get_registry().hook.fault_injector(url=StoreURL.parse(url))
    return found if found is not None else KVFaultInjector()


def injector_name(injector: FaultInjector) -> str:
    if isinstance(injector, KVFaultInjector):
        return "KV-level injector (native ports faulted per call)"
    return f"{type(injector).__module__}.{type(injector).__name__}"


async def retried(
    call: Callable[[], Awaitable[Any]], report: FaultReport, attempts: int = 30
) -> Any:
    """Run ``call`` until it succeeds, retrying (same arguments) while it is unavailable."""
    for attempt in range(attempts):
        try:
            result = await call()
        except UNAVAILABLE as exc:
            report.outcome(exc)
            await asyncio.sleep(min(0.01 * 2**attempt, 0.2))
            continue
        except Exception as exc:
            report.outcome(exc)
            raise
        report.outcome(None)
        return result
    raise AssertionError(f"still unavailable after {attempts} attempts: {report.line()}")


class FaultContract(ContractBase):
    """The fault contract. Subclass it and provide ``store_url`` (the injector is found by URL)."""

    pytestmark = pytest.mark.asyncio

    #: the share of requests faulted in the random workloads
    fault_rate: ClassVar[float] = 0.2
    #: session workload size: workers on one session, turns each
    session_workers: ClassVar[int] = 4
    session_turns: ClassVar[int] = 5

    @pytest.fixture
    def injector(self, store_url: str) -> FaultInjector:
        """The injector of the backend under test (or the core's KV-level one)."""
        return injector_for(store_url)

    @pytest_asyncio.fixture
    async def opened(
        self, injector: FaultInjector, store_url: str, ns: str
    ) -> AsyncIterator[Opener]:
        """Opens KV clients whose requests pass through the injector (closed after the test)."""
        clients: list[KVStore] = []
        plain = open_kv(store_url)
        try:
            await plain.setup()  # before any fault: the workloads' stores are never entered
        finally:
            await plain.aclose()

        async def open_one(*, faulty: bool = True) -> KVStore:
            if faulty:
                kv = await injector.open_kv(StoreURL.parse(store_url))
            else:
                kv = open_kv(store_url)
            clients.append(kv)
            return kv

        try:
            yield open_one
        finally:
            injector.set_rate(0.0)
            for kv in clients:
                if not kv.closed:
                    await kv.aclose()
            cleaner = open_kv(store_url)
            try:
                await drop_namespace(cleaner, ns)
            finally:
                await cleaner.aclose()

    def report(self, store_url: str, workload: str, injector: FaultInjector) -> FaultReport:
        return FaultReport(StoreURL.parse(store_url).scheme, workload, injector_name(injector))

    # -- workloads ------------------------------------------------------------------------

    async def run_sessions(
        self,
        opened: Opener,
        store_url: str,
        ns: str,
        report: FaultReport,
        *,
        workers: int,
        turns: int,
    ) -> None:
        """``workers`` stores take turns on one session, each turn adding its own pair."""
        session_id = "shared"
        stores: list[SessionStore] = [
            connect(await opened()).sessions(owns_kv=True, scope_prefix=f"{ns}:s:")
            for _ in range(workers)
        ]
        saved: list[str] = []
        absent: list[str] = []  # reported lost, or never started: must not be stored
        bodies: list[tuple[float, float, str]] = []

        async def worker(w: int) -> None:
            store = stores[w]
            for t in range(turns):
                tag = f"w{w}t{t}"
                entered = False
                try:
                    async with store.turn(session_id, timeout_seconds=60) as session:
                        entered = True
                        start = time.monotonic()
                        session.replace([*session.messages, *pair(tag)])
                        await asyncio.sleep(random.uniform(0, 0.01))
                        bodies.append((start, time.monotonic(), tag))
                except Exception as exc:
                    kind = report.outcome(exc)
                    if not entered or kind == "conflict":
                        absent.append(tag)
                    continue
                report.outcome(None)
                saved.append(tag)

        try:
            await asyncio.gather(*(worker(w) for w in range(workers)))
        finally:
            for store in stores:
                await store.aclose()
        bodies.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(bodies):
            if start < end:
                report.misreported.append(f"turns {a} and {b} overlapped")
        async with connect(open_kv(store_url)).sessions(
            owns_kv=True, scope_prefix=f"{ns}:s:"
        ) as reader:
            try:
                stored = tags(await reader.read_messages(session_id))
                info = await reader.inspect(session_id)
                if info is not None and info.problem:
                    report.corrupt.append(info.problem)
            except AppError as exc:
                report.corrupt.append(str(exc))
                return
        counts = Counter(stored)
        report.duplicated += [tag for tag, n in counts.items() if n > 1]
        report.lost += [tag for tag in saved if tag not in counts]
        report.misreported += [f"{tag} reported lost but stored" for tag in absent if tag in counts]
        for w in range(workers):
            mine = [int(tag.split("t")[1]) for tag in stored if tag.startswith(f"w{w}t")]
            if mine != sorted(mine):
                report.corrupt.append(f"worker {w}'s turns out of order: {mine}")

    async def run_memory(
        self, opened: Opener, ns: str, report: FaultReport, *, writes: int
    ) -> None:
        """Two writers, each appending a line per write (a CAS on the version it read) with
        an operation id, retried with the same id while unavailable. A conflict (a lagging
        replica served an older version) is handled as a user would: read the file again,
        and write again only if the write is not there yet."""
        memory = KVMemoryStore(await opened(), scope_prefix=f"{ns}:m:")

        async def writer(name: str) -> None:
            path = f"u/main/{name}.md"
            version: str | None = None
            lines: list[str] = []
            for i in range(writes):
                lines.append(f"{name}-{i}")
                content = "\n".join(lines)
                operation = MemoryOperation(id=f"{name}-{i}", fingerprint=content)
                for _ in range(10):
                    write = functools.partial(
                        memory.write, path, content, expected_version=version, operation=operation
                    )
                    try:
                        result = await retried(write, report)
                    except MemoryConflictError:
                        read = functools.partial(memory.read, path, max_chars=10**6)
                        found = await retried(read, report)
                        if found is not None and found.content == content:
                            version = found.version  # it landed
                            break
                        await asyncio.sleep(0.05)
                        continue
                    version = result.version
                    break
                else:
                    report.bad_errors.append(f"{name}-{i}: conflicts without end")

        await asyncio.gather(writer("a"), writer("b"))
        plain = KVMemoryStore(await opened(faulty=False), scope_prefix=f"{ns}:m:")
        for name in ("a", "b"):
            read = functools.partial(plain.read, f"u/main/{name}.md", max_chars=10**6)
            found = await retried(read, report)
            got = [] if found is None else found.content.split("\n")
            want = [f"{name}-{i}" for i in range(writes)]
            report.lost += [line for line in want if line not in got]
            report.duplicated += [line for line, n in Counter(got).items() if n > 1]
            for i in range(writes):
                operation = MemoryOperation(id=f"{name}-{i}", fingerprint="\n".join(want[: i + 1]))
                receipt = await retried(functools.partial(plain.get_operation, operation), report)
                if receipt is None:
                    report.lost.append(f"receipt {name}-{i}")

    async def run_journal(
        self,
        opened: Opener,
        ns: str,
        report: FaultReport,
        *,
        appends: int,
    ) -> None:
        """Two clients append events with idempotency keys to one run, retrying while unavailable."""
        from pydantic_ai_harness.step_persistence import StepEvent

        stores = [
            Checkpointer(await opened(), scope_prefix=f"{ns}:j:").step_store() for _ in range(2)
        ]

        async def appender(c: int) -> None:
            for i in range(appends):
                event = StepEvent(
                    run_id="r",
                    kind="model_request_started",
                    step_index=i,
                    idempotency_key=f"{c}:{i}",
                )
                await retried(functools.partial(stores[c].append_event, event), report)

        await asyncio.gather(appender(0), appender(1))
        checker = Checkpointer(await opened(faulty=False), scope_prefix=f"{ns}:j:").step_store()
        events = await retried(functools.partial(checker.list_events, run_id="r"), report)
        keys = Counter(e.idempotency_key for e in events)
        report.duplicated += [k for k, n in keys.items() if n > 1]
        report.lost += [
            f"{c}:{i}" for c in range(2) for i in range(appends) if f"{c}:{i}" not in keys
        ]

    # -- the tests ------------------------------------------------------------------------

    async def test_routine_faults_lose_nothing(
        self,
        injector: FaultInjector,
        opened: Opener,
        store_url: str,
        ns: str,
    ) -> None:
        """At a random fault rate (every fault the injector offers but silence), session turns from several clients, memory writes with receipts and journal appends each succeed or fail typed; nothing is lost, duplicated, corrupt or misreported, and no transient fault becomes a configuration error."""
        injector.set_rate(self.fault_rate, seed=random.randrange(1 << 30))
        for workload in ("sessions", "memory", "journal"):
            report = self.report(store_url, f"{workload} at {self.fault_rate:.0%}", injector)
            before = injector.injected()
            if workload == "sessions":
                await self.run_sessions(
                    opened,
                    store_url,
                    ns,
                    report,
                    workers=self.session_workers,
                    turns=self.session_turns,
                )
            elif workload == "memory":
                await self.run_memory(opened, f"{ns}{workload}", report, writes=6)
            else:
                await self.run_journal(opened, ns, report, appends=6)
            after = injector.injected()
            report.injected = {
                k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)
            }
            report.check()

    async def test_each_fault_once(
        self,
        injector: FaultInjector,
        opened: Opener,
        store_url: str,
        ns: str,
    ) -> None:
        """Every fault the injector offers but silence, injected into a single chosen call of a session turn, a memory write and a journal append: each ends typed, and nothing is lost, duplicated or corrupt."""
        faults = [f for f, kind in injector.faults.items() if kind is not FaultKind.BLACKHOLE]
        report = self.report(store_url, "each fault once", injector)
        for n, fault in enumerate(faults):
            injector.arm(fault)
            await self.run_sessions(opened, store_url, f"{ns}{n}", report, workers=1, turns=2)
            injector.arm(fault)
            await self.run_memory(opened, f"{ns}{n}", report, writes=2)
            injector.arm(fault)
            await self.run_journal(opened, f"{ns}{n}", report, appends=2)
        report.injected = injector.injected()
        report.check()
        missing = [f for f in faults if f not in report.injected]
        assert not missing, f"never injected: {missing}"

    # -- lost replies on a save that wrote a history chunk --------------------------------

    async def lost_reply_turns(
        self,
        injector: FaultInjector,
        fault: str,
        make: Opener,
        store_url: str,
        ns: str,
        *,
        other_client: bool,
        operation: str | None = None,
    ) -> None:
        """Turn 1 saves; turn 2's save writes a history chunk and its reply is lost (with
        ``other_client``, another client takes the session, and saves, before the retry).
        ``operation`` picks the request that loses its reply (None: the save's first write)."""
        prefix = f"{ns}:lr:"
        a = connect(await make()).sessions(owns_kv=True, scope_prefix=prefix, tail_bytes=1024)
        b = connect(open_kv(store_url)).sessions(owns_kv=True, scope_prefix=prefix)
        reported: dict[str, str] = {}
        try:
            async with a.turn("s") as session:
                session.replace(pair("a0", pad=300))
            reported["a0"] = "saved"

            async def other_turn() -> None:
                async with b.turn("s", timeout_seconds=30) as other:
                    other.replace([*other.messages, *pair("b1", pad=300)])
                reported["b1"] = "saved"

            if other_client and isinstance(injector, KVFaultInjector):
                injector.after_lost_reply = other_turn
            try:
                async with a.turn("s") as session:
                    session.replace([*session.messages, *pair("a1", pad=300), *pair("a2", pad=300)])
                    injector.arm(fault, operation=operation)
                reported["a1"] = reported["a2"] = "saved"
            except LeaseLostError:
                reported["a1"] = reported["a2"] = "lost"
            finally:
                if isinstance(injector, KVFaultInjector):
                    injector.after_lost_reply = None
            if other_client and "b1" not in reported:
                await other_turn()
            assert injector.injected().get(fault, 0) >= 1, f"{fault} was never injected"
        finally:
            await a.aclose()
            await b.aclose()
        async with connect(open_kv(store_url)).sessions(owns_kv=True, scope_prefix=prefix) as c:
            info = await c.inspect("s")
            assert info is not None and info.problem is None, info
            stored = tags(await c.read_messages("s"))
            async with c.turn("s") as session:  # and the next turn works
                assert tags(session.messages) == stored
        for tag, outcome in reported.items():
            assert (tag in stored) == (outcome == "saved"), (tag, outcome, stored)
        assert len(stored) == len(set(stored)), stored

    @pytest.mark.parametrize("other_client", [False, True], ids=["one-client", "second-client"])
    async def test_lost_reply_on_a_chunk_save(
        self,
        injector: FaultInjector,
        opened: Opener,
        store_url: str,
        ns: str,
        other_client: bool,
    ) -> None:
        """A save that wrote a history chunk lands but its reply is lost (also re-sent by the client, and with a second client taking the session before the retry): the session stays readable, every turn reported saved is in the history, and a turn reported lost is truly absent."""
        generic = KVFaultInjector()

        async def wrapped() -> KVStore:
            return generic.wrap(open_kv(store_url), owns_inner=True, native_ports=False)

        # The chunk write's reply lost, and the state write's (the generic port's ``replace``).
        # Another client can take the session only once the state write released it: a
        # lost chunk write leaves the lease held (the other client would wait it out).
        for fault, operation in itertools.product(("LostReply", "ResentWrite"), (None, "replace")):
            if other_client and operation is None:
                continue
            await self.lost_reply_turns(
                generic,
                fault,
                wrapped,
                store_url,
                f"{ns}{fault}{operation}",
                other_client=other_client,
                operation=operation,
            )
        # On the backend's native path: at its transport, or (embedded backends, whose
        # KV-level injector carries their native ports) on a whole port call. A KV-level
        # injector on a store without a native session port would only repeat the above.
        if isinstance(injector, KVFaultInjector):
            probe = await opened()
            if probe.ports.session is None:
                return
        own = [f for f, kind in injector.faults.items() if kind is FaultKind.LOST_REPLY]
        for fault in own:
            await self.lost_reply_turns(
                injector, fault, opened, store_url, f"{ns}n{fault}", other_client=other_client
            )

    # -- ambiguous outcomes (see agent_stores_contract.ambiguous) ------------------------

    async def test_a_lost_reply_on_a_conditional_write_is_applied_or_unknown(
        self, opened: Opener, store_url: str, ns: str
    ) -> None:
        """A conditional replace and a conditional delete the server applied but whose reply is lost (below the SDK, through a TCP proxy where the backend has a server; on each of the operation's requests in turn), at the KV level and through memory writes, memory deletes and session turns: each is reported as applied or unknown, never as a conflict or "not found", and what is reported applied is stored."""
        plain = await opened(faulty=False)
        async with ReplyLoser(store_url).running() as loser:
            report = FaultReport(
                StoreURL.parse(store_url).scheme, "lost replies on conditional writes", loser.where
            )
            await kv_lost_replies(loser, plain, ns, report)
            await memory_lost_replies(loser, plain, ns, report)
            await session_lost_replies(loser, plain, ns, report)
        report.injected = {"lost reply": loser.lost()}
        report.check()

    async def test_a_rejected_first_attempt_then_a_real_conflict_is_a_conflict(
        self, injector: FaultInjector, opened: Opener, store_url: str, ns: str
    ) -> None:
        """Every fault the service documents as a rejection (throttling; the injector's `rejections`), on the first attempt of each kind of request a create, a replace or a delete sends, then the real server's failed condition: at the KV level and through memory writes and deletes, the answer is still a conflict (False for a KV delete), never "unknown"."""
        plain = await opened(faulty=False)
        report = self.report(store_url, "rejected, then a conflict", injector)
        await kv_rejected_then_conflict(injector, opened, plain, ns, report)
        await store_rejected_then_conflict(injector, opened, plain, ns, report)
        report.injected = injector.injected()
        report.check()
        assert report.injected, "no rejection was ever injected"

    # -- silence --------------------------------------------------------------------------

    @pytest_asyncio.fixture
    async def silent(self, store_url: str) -> AsyncIterator[tuple[TCPProxy, str] | None]:
        """A proxy in front of the server and the URL through it (None: cannot be proxied)."""
        url = StoreURL.parse(store_url)
        address = server_address(url)
        if address is None:
            yield None
            return
        async with TCPProxy(*address) as proxy:
            through = through_proxy(url, proxy.host, proxy.port)
            yield None if through is None else (proxy, through)

    async def test_a_silent_server_interrupts_the_owner_before_its_lease_expires(
        self, silent: tuple[TCPProxy, str] | None, store_url: str, ns: str
    ) -> None:
        """Two clients on one session, the owner's server going silent after it acquired: the owner is interrupted with SESSION_LEASE_LOST before its lease expires, and the other client acquires only after that — never two turns at once."""
        # Real time is the point here (the owner must stop by its own timer, the server
        # cannot tell it). The store stops an owner 10 % of the lease before it ends, at
        # most 1 s: at 10 s that margin is the full second, so a loaded machine's slow
        # event loop still lets the owner learn of the loss before its lease runs out.
        lease = 10.0
        prefix = f"{ns}:silent:"
        injector: KVFaultInjector | None = None
        if silent is None:  # no network to cut: the KV-level injector goes silent instead
            injector = KVFaultInjector()
            owner_kv: KVStore = injector.wrap(open_kv(store_url), owns_inner=True)
        else:
            owner_kv = open_kv(silent[1])
        a = connect(owner_kv).sessions(owns_kv=True, scope_prefix=prefix, lease_seconds=lease)
        b = connect(open_kv(store_url)).sessions(owns_kv=True, scope_prefix=prefix)
        events: list[tuple[str, float]] = []
        expires_at = 0.0
        holding = asyncio.Event()

        async def owner() -> None:
            nonlocal expires_at
            try:
                async with a.turn("s") as session:
                    expires_at = session.lease_expires_at
                    if silent is not None:
                        silent[0].go_silent()
                    else:
                        assert injector is not None
                        injector.arm("Blackhole", times=10_000)
                    holding.set()
                    await asyncio.sleep(20 * lease)
            except LeaseLostError:
                events.append(("owner interrupted", time.time()))
            else:
                raise AssertionError("the owner was never interrupted")

        async def other() -> None:
            await holding.wait()
            async with b.turn("s", timeout_seconds=10 * lease):
                events.append(("other acquired", time.time()))

        try:
            await asyncio.wait_for(asyncio.gather(owner(), other()), timeout=15 * lease)
        finally:
            if silent is not None:
                silent[0].heal()
            if injector is not None:
                injector.disarm()
            await asyncio.wait_for(a.aclose(), 30)
            await b.aclose()
        assert [name for name, _ in events] == ["owner interrupted", "other acquired"]
        assert events[0][1] < expires_at, (
            "the owner learnt of the loss only after its lease expired"
        )

    async def test_a_blackhole_is_a_typed_error_within_the_deadline(
        self, silent: tuple[TCPProxy, str] | None, store_url: str, ns: str
    ) -> None:
        """A peer that accepts connections and never answers: a KV call and an agent turn fail with a typed unavailable error naming the backend within the deadline (+1 s), never a hang."""
        deadline = 2.0
        injector: KVFaultInjector | None = None
        if silent is None:
            injector = KVFaultInjector()
            kv: KVStore = injector.wrap(open_kv(store_url), owns_inner=True)
            kv.deadline_seconds = deadline
            injector.arm("Blackhole", times=10_000)
        else:
            silent[0].go_silent()
            kv = open_kv(str(StoreURL.parse(silent[1]).with_query(deadline=str(deadline))))
        scheme = StoreURL.parse(store_url).scheme
        try:
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as raised:
                await kv.get(f"{ns}:bh", "k")
            took = time.monotonic() - started
            assert took <= deadline + 1.0, f"a KV call took {took:.1f} s"
            assert scheme.split("+")[0] in str(raised.value).lower(), raised.value
            sessions = connect(kv).sessions(scope_prefix=f"{ns}:bh:")
            started = time.monotonic()
            with pytest.raises(TransientStoreError):
                async with sessions.turn("s", timeout_seconds=0.5):
                    pass
            took = time.monotonic() - started
            assert took <= deadline + 1.0, f"an agent turn took {took:.1f} s"
            await asyncio.wait_for(sessions.aclose(), deadline + 5)
        finally:
            if injector is not None:
                injector.disarm()
            await asyncio.wait_for(kv.aclose(), 30)
