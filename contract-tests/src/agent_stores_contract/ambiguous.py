"""Ambiguous outcomes in the fault mode: judged by what happened, never guessed.

Two cases the routine fault runs could not see (issue 59):

* **A lost reply on a conditional replace or delete.** The server applies the write and
  the connection drops before the reply. Whatever the client stack does next (an HTTP
  library re-sending a PUT or DELETE once on its own was the case on Cosmos DB), the store
  must report the write as applied, or its outcome as unknown (a typed unavailable
  error), never as a conflict or "not found". The reply is lost below every SDK where the
  backend can be reached through a TCP proxy (:meth:`~agent_stores_contract.proxy.TCPProxy.lose_reply`,
  the ``proxied_url`` hook), else by the core's KV-level injector (``LostReply``). The
  reply lost is the first, second, … of the operation's requests, until one runs without
  losing any, so every request of the operation is tried.
* **A rejected first attempt, then a real conflict.** A fault the service documents as a
  rejection (throttling, most often: nothing was applied) on the first attempt, retried
  below the store, then the real server's answer: a failed condition. A retry after a
  rejection keeps the definite answer: a conflict (False for a delete), never "unknown".
  The faults are the injector's ``rejections`` (by default every ``transient`` and
  ``conflict`` fault), armed on each kind of request the operation sends in turn (the
  injector's own operation names, learnt from its request counts).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from agent_stores import BackendUnavailableError, ConflictError, KVStore, StoreURL, connect, open_kv
from agent_stores.faults import FaultInjector, FaultKind
from agent_stores.kv.faulty import KVFaultInjector
from agent_stores.memory import KVMemoryStore
from agent_stores.sessions import LeaseLostError
from pydantic_ai_harness.memory import MemoryConflictError, MemoryOperation

from .proxy import TCPProxy
from .proxying import server_address, through_proxy
from .session_workers import pair, texts

#: The most requests of one operation a lost reply is tried on (the first to this one).
MAX_REQUESTS = 12

if TYPE_CHECKING:
    from .faults import FaultReport

#: Runs one operation; raises what the store raised.
Act = Callable[[], Awaitable[Any]]
#: Judges an operation's outcome (its result, or the error it raised that is neither a
#: typed unavailable error nor a bad one): what is wrong with it, None if nothing.
Judge = Callable[[Any, BaseException | None], Awaitable[str | None]]
#: Sets up a fresh case ``n`` and returns its operation and judge.
Trial = Callable[[int], Awaitable[tuple[Act, Judge]]]


def rejections(injector: FaultInjector) -> list[str]:
    """The faults ``injector`` offers that its service documents as rejected, nothing
    applied: its ``rejections`` attribute, else every ``transient`` and ``conflict`` fault."""
    declared = getattr(injector, "rejections", None)
    if declared is not None:
        return sorted(declared)
    kinds = (FaultKind.TRANSIENT, FaultKind.CONFLICT)
    return sorted(f for f, kind in injector.faults.items() if kind in kinds)


class ReplyLoser:
    """Loses the reply to one request of a store's (see the module doc)."""

    def __init__(self, store_url: str) -> None:
        self.store_url = store_url
        self.proxy: TCPProxy | None = None
        self.through: str | None = None
        self.injector = KVFaultInjector()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReplyLoser]:
        """The proxy in front of the server while the cases run (when there is a server)."""
        url = StoreURL.parse(self.store_url)
        address = server_address(url)
        if address is None:
            yield self
            return
        async with TCPProxy(*address) as proxy:
            self.through = through_proxy(url, proxy.host, proxy.port)
            self.proxy = proxy if self.through is not None else None
            yield self

    @property
    def where(self) -> str:
        return "TCP proxy" if self.proxy is not None else "KV-level injector"

    @property
    def requests_tried(self) -> int:
        """How many requests of an operation can be tried: a proxy reaches each; the
        KV-level injector only the operation's next write (a whole call, or port call)."""
        return MAX_REQUESTS if self.proxy is not None else 1

    async def open(self) -> KVStore:
        """A KV client whose replies this loser can lose, warmed up (its first requests,
        such as reading the account or the table, already sent)."""
        if self.proxy is not None and self.through is not None:
            kv = open_kv(self.through)
        else:
            kv = self.injector.wrap(open_kv(self.store_url), owns_inner=True)
        await kv.get("agent-stores-contract-warm-up", "k")
        return kv

    def arm(self, skip: int) -> None:
        """Lose the reply to the operation's request number ``skip + 1``."""
        if self.proxy is not None:
            self.proxy.lose_reply(skip=skip)
        else:
            self.injector.arm("LostReply")

    def disarm(self) -> None:
        if self.proxy is not None:
            self.proxy.disarm()
        else:
            self.injector.disarm()

    def lost(self) -> int:
        if self.proxy is not None:
            return self.proxy.lost_replies
        return self.injector.injected().get("LostReply", 0)


async def _outcome(act: Act) -> tuple[Any, BaseException | None]:
    try:
        return await act(), None
    except Exception as exc:
        return None, exc


async def lost_reply_trials(
    loser: ReplyLoser, name: str, trial: Trial, report: FaultReport
) -> None:
    """For each request of an operation in turn, lose its reply and judge the outcome.

    ``trial(n)`` sets up a fresh case and returns the operation and its judge. A typed
    unavailable error is an honest "unknown"; anything else is judged (nothing else
    writes, so a conflict or "not found" is a misreport).
    """
    for skip in range(loser.requests_tried):
        act, judge = await trial(skip)
        before = loser.lost()
        loser.arm(skip)
        result, error = await _outcome(act)
        loser.disarm()
        if loser.lost() == before:
            report.outcome(error)
            assert skip > 0, f"{name}: no reply was lost ({loser.where})"
            return  # the operation sent fewer requests: every one was tried
        if report.outcome(error) not in ("ok", "conflict"):
            continue  # unknown (typed), or a bad error the report already holds
        wrong = await judge(result, error)
        if wrong is not None:
            where = f"{name}, reply to request {skip + 1} lost ({loser.where})"
            report.misreported.append(f"{where}: {wrong}"[:300])


def _raised(error: BaseException | None) -> str | None:
    """A conflict where nothing else writes: a misreport."""
    return None if error is None else f"reported {type(error).__name__}: {error}"


async def kv_lost_replies(loser: ReplyLoser, plain: KVStore, ns: str, report: FaultReport) -> None:
    """A conditional replace and a conditional delete, at the KV level."""
    kv = await loser.open()
    try:

        async def replace_trial(n: int) -> tuple[Act, Judge]:
            scope = f"{ns}:lost-replace-{n}"
            version = await plain.create(scope, "k", b"before")

            async def judge(new_version: Any, error: BaseException | None) -> str | None:
                entry = await plain.get(scope, "k")
                if error is None and (entry is None or entry.version != new_version):
                    return f"reported applied, but the entry is {entry}"
                return _raised(error)

            return (lambda: kv.replace(scope, "k", b"after", expected_version=version)), judge

        async def delete_trial(n: int) -> tuple[Act, Judge]:
            scope = f"{ns}:lost-delete-{n}"
            version = await plain.create(scope, "k", b"before")

            async def judge(deleted: Any, error: BaseException | None) -> str | None:
                if error is None and deleted is not True:
                    return f"reported {deleted!r} (nothing at that version) for a delete"
                if error is None and await plain.get(scope, "k") is not None:
                    return "reported deleted, but the entry is still there"
                return _raised(error)

            return (lambda: kv.delete(scope, "k", expected_version=version)), judge

        await lost_reply_trials(loser, "kv.replace", replace_trial, report)
        await lost_reply_trials(loser, "kv.delete", delete_trial, report)
    finally:
        await kv.aclose()


async def _settled(act: Act, attempts: int = 10) -> Any:
    """``act`` again (same operation id) while it is unavailable, as a caller would."""
    for _ in range(attempts - 1):
        with contextlib.suppress(BackendUnavailableError):
            return await act()
    return await act()


async def memory_lost_replies(
    loser: ReplyLoser, plain: KVStore, ns: str, report: FaultReport
) -> None:
    """Through the memory store: a write and a delete at a version, with operation receipts
    (a typed unknown is retried with the same operation, which must then settle it)."""
    kv = await loser.open()
    memory = KVMemoryStore(kv, scope_prefix=f"{ns}:lrm:")
    checker = KVMemoryStore(plain, scope_prefix=f"{ns}:lrm:")
    try:

        async def write_trial(n: int) -> tuple[Act, Judge]:
            path = f"u/main/w{n}.md"
            first = await checker.write(path, "before", expected_version=None)
            op = MemoryOperation(id=f"lost-write-{n}", fingerprint="after")

            async def act() -> Any:
                return await _settled(
                    lambda: memory.write(
                        path, "after", expected_version=first.version, operation=op
                    )
                )

            async def judge(_: Any, error: BaseException | None) -> str | None:
                found = await checker.read(path, max_chars=100)
                if error is None and (found is None or found.content != "after"):
                    return f"memory write reported done, but the file holds {found}"
                return _raised(error)

            return act, judge

        async def delete_trial(n: int) -> tuple[Act, Judge]:
            path = f"u/main/d{n}.md"
            first = await checker.write(path, "before", expected_version=None)
            op = MemoryOperation(id=f"lost-delete-{n}", fingerprint="")

            async def act() -> Any:
                return await _settled(
                    lambda: memory.delete(path, expected_version=first.version, operation=op)
                )

            async def judge(mutation: Any, error: BaseException | None) -> str | None:
                if error is None and not mutation.existed:
                    return "memory delete reported the file absent, though it was there"
                if error is None and await checker.read(path, max_chars=100) is not None:
                    return "memory delete reported done, but the file is still there"
                return _raised(error)

            return act, judge

        await lost_reply_trials(loser, "memory.write", write_trial, report)
        await lost_reply_trials(loser, "memory.delete", delete_trial, report)
    finally:
        await kv.aclose()


async def session_lost_replies(
    loser: ReplyLoser, plain: KVStore, ns: str, report: FaultReport
) -> None:
    """Through the session store: a turn whose acquire, save or release loses a reply.
    Saved means stored; a lost lease means truly absent; unknown may be either."""
    kv = await loser.open()
    sessions = connect(kv).sessions(scope_prefix=f"{ns}:lrs:")
    reader = connect(plain).sessions(scope_prefix=f"{ns}:lrs:")
    try:

        async def turn_trial(n: int) -> tuple[Act, Judge]:
            sid = f"s{n}"
            async with reader.turn(sid) as session:
                session.replace(pair("t0"))

            async def act() -> Any:
                async with sessions.turn(sid, timeout_seconds=30) as session:
                    session.replace([*session.messages, *pair("t1")])

            async def judge(_: Any, error: BaseException | None) -> str | None:
                stored = [
                    t for t in texts(await reader.read_messages(sid) or []) if t.startswith("q:")
                ]
                if error is None and stored != ["q:t0", "q:t1"]:
                    return f"turn reported saved, history {stored}"
                if error is not None and not isinstance(error, LeaseLostError):
                    return _raised(error)
                if error is not None and stored != ["q:t0"]:
                    return f"turn reported lost ({type(error).__name__}), history {stored}"
                return None

            return act, judge

        await lost_reply_trials(loser, "session turn", turn_trial, report)
    finally:
        await sessions.aclose()
        await reader.aclose()
        await kv.aclose()


# -- a rejected first attempt, then a real conflict -------------------------------------------


async def _kinds_of_requests(injector: FaultInjector, act: Act) -> list[str | None]:
    """The injector's operation names of the requests ``act`` sends (None: any request,
    when the injector does not count requests)."""
    counting = getattr(injector, "requests", None)
    if counting is None:
        return [None]
    counting(reset=True)
    with contextlib.suppress(Exception):
        await act()
    names: list[str | None] = sorted(counting(reset=True))
    return names or [None]


async def rejected_then_conflict(
    injector: FaultInjector,
    name: str,
    trial: Callable[[int], Awaitable[Act]],
    expect: Callable[[Any, BaseException | None], bool],
    report: FaultReport,
) -> None:
    """For every rejection the injector offers, armed on each kind of request the operation
    sends in turn: the operation's answer must still be the definite one (``expect``)."""
    operations: list[str | None] = [None]
    with contextlib.suppress(Exception):
        operations = await _kinds_of_requests(injector, await trial(-1))
    disarm = getattr(injector, "disarm", lambda: None)
    n = 0
    for fault in rejections(injector):
        for operation in operations:
            act = await trial(n)
            n += 1
            before = injector.injected().get(fault, 0)
            injector.arm(fault, operation=operation)
            result, error = await _outcome(act)
            disarm()
            if injector.injected().get(fault, 0) == before:
                continue  # that request did not carry this fault
            report.outcome(error)
            if isinstance(injector, KVFaultInjector) and isinstance(error, BackendUnavailableError):
                # The KV-level injector rejects the KV call itself: the caller retries.
                result, error = await _outcome(act)
            if not expect(result, error):
                report.misreported.append(
                    f"{name} after {fault} on {operation or 'a request'}: "
                    f"{type(error).__name__ if error else 'returned'} {error or result!r}"[:300]
                )


def _is(kind: type[BaseException]) -> Callable[[Any, BaseException | None], bool]:
    return lambda _result, error: isinstance(error, kind)


async def kv_rejected_then_conflict(
    injector: FaultInjector,
    opened: Callable[[], Awaitable[KVStore]],
    plain: KVStore,
    ns: str,
    report: FaultReport,
) -> None:
    """A create over a live entry, a replace and a delete at a stale version, each after a
    rejected first attempt: a conflict, a conflict, and False."""
    kv = await opened()
    await kv.get(f"{ns}:warm", "k")

    fresh = itertools.count()

    async def entry(_: int) -> tuple[str, str]:
        scope = f"{ns}:rej-{next(fresh)}"
        stale = await plain.create(scope, "k", b"0")
        await plain.replace(scope, "k", b"1", expected_version=stale)
        return scope, stale

    async def create(n: int) -> Act:
        scope, _ = await entry(n)
        return lambda: kv.create(scope, "k", b"again")

    async def replace(n: int) -> Act:
        scope, stale = await entry(n)
        return lambda: kv.replace(scope, "k", b"2", expected_version=stale)

    async def delete(n: int) -> Act:
        scope, stale = await entry(n)
        return lambda: kv.delete(scope, "k", expected_version=stale)

    await rejected_then_conflict(injector, "kv.create", create, _is(ConflictError), report)
    await rejected_then_conflict(injector, "kv.replace", replace, _is(ConflictError), report)
    await rejected_then_conflict(
        injector,
        "kv.delete",
        delete,
        lambda result, error: error is None and result is False,
        report,
    )


async def store_rejected_then_conflict(
    injector: FaultInjector,
    opened: Callable[[], Awaitable[KVStore]],
    plain: KVStore,
    ns: str,
    report: FaultReport,
) -> None:
    """Through the memory store: a write and a delete at a stale version, after a rejected
    first attempt, are a MemoryConflictError."""
    memory = KVMemoryStore(await opened(), scope_prefix=f"{ns}:rjm:")
    checker = KVMemoryStore(plain, scope_prefix=f"{ns}:rjm:")

    fresh = itertools.count()

    async def stale(_: int) -> tuple[str, str]:
        path = f"u/main/f{next(fresh)}.md"
        first = await checker.write(path, "0", expected_version=None)
        assert first.version is not None
        await checker.write(path, "1", expected_version=first.version)
        return path, first.version

    async def write(n: int) -> Act:
        path, version = await stale(n)
        return lambda: memory.write(path, "2", expected_version=version)

    async def delete(n: int) -> Act:
        path, version = await stale(n)
        return lambda: memory.delete(path, expected_version=version)

    conflict = _is(MemoryConflictError)
    await rejected_then_conflict(injector, "memory.write", write, conflict, report)
    await rejected_then_conflict(injector, "memory.delete", delete, conflict, report)
