"""Reach: which tests reached each port method, and with which edge cases.

The port contract (:mod:`agent_stores_contract.ports`) hands every store and every direct
call a *recording* port: a thin proxy around the port under test that counts, per port
method, the tests that called it and tags each call with the edge cases it carried — some
read from the request and the answer (``outcome=busy``, ``parts>=100``, ``conflict``), some
named by the test around the call (``with edge("expires_at == now"):``). The plugin prints
the table at the end of the run and fails the run when a method the port offers was
reached by no test, so a backend author sees at once what their port was tested on.

Nothing here imports Pydantic AI: the plugin reads the registry without loading the stores.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from agent_stores.checkpointer.port import AppendOutcome, AppendRequest, JournalPort
    from agent_stores.kv.base import Entry
    from agent_stores.memory.port import FileWrite, MemoryPort
    from agent_stores.sessions.port import AcquireReply, AcquireRequest, SaveRequest, SessionPort

F = TypeVar("F", bound=Callable[..., Any])

#: The methods each kind of port offers (a journal port's ``append`` only when atomic: the
#: core never calls a non-atomic one).
METHODS: Mapping[str, tuple[str, ...]] = {
    "sessions": ("acquire", "save"),
    "memory": ("read", "write"),
    "journal": ("append",),
}


@dataclass(frozen=True, slots=True)
class PortKey:
    """One port under test: its kind, class and where it came from."""

    kind: str
    name: str
    #: ``native`` (a plugin hook offered it), ``generic`` (the core's KV port) or ``given``
    source: str

    def label(self) -> str:
        return f"{self.kind} {self.name} ({self.source})"


#: The rules of the port contract, as the reach table names them (see ``ports.py``).
RULES: Mapping[str, str] = {
    "expiry": "everything a port writes expires at its documented lifetime, not earlier",
    "expired-not-live": "an expired record is never taken for a live one",
    "many-parts": "values over many parts read back byte-equal and in order",
    "hand-over": "every waiting hint is removed or expires",
    "whole-keys": "idempotency keys and operation ids are compared whole",
    "sliding-ttl": "the sessions' sliding TTL and refresh horizon",
    "public-checks": "a port applies the public API's checks (sizes, ids, damage)",
}


_SESSION_RULES = (
    "expiry",
    "expired-not-live",
    "many-parts",
    "hand-over",
    "sliding-ttl",
    "public-checks",
)
#: The rules each port method must be tested on: a run of the whole port contract fails
#: when an offered method was reached by no test of one of its rules.
APPLIES: Mapping[str, tuple[str, ...]] = {
    "acquire": _SESSION_RULES,
    "save": _SESSION_RULES,
    "read": ("expiry", "expired-not-live", "many-parts", "public-checks"),
    "write": ("expiry", "expired-not-live", "many-parts", "whole-keys", "public-checks"),
    "append": ("expiry", "expired-not-live", "whole-keys", "public-checks"),
}


def rule(*names: str) -> Callable[[F], F]:
    """Mark a port contract test with the rules it checks (shown per port method in the reach table)."""
    unknown = set(names) - set(RULES)
    if unknown:
        raise ValueError(f"unknown port rules {sorted(unknown)}")

    def mark(func: F) -> F:
        setattr(func, "port_rules", tuple(names))  # noqa: B010 - an attribute mypy cannot see
        return func

    return mark


@dataclass
class MethodReach:
    """The tests that reached one port method, and per rule and edge case the tests that did."""

    tests: set[str] = field(default_factory=set)
    rules: dict[str, set[str]] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=dict)
    calls: int = 0


@dataclass
class Registry:
    """Everything recorded in this process."""

    #: port -> the methods it offers (registered when a test receives the port)
    offered: dict[PortKey, tuple[str, ...]] = field(default_factory=dict)
    reached: dict[tuple[PortKey, str], MethodReach] = field(default_factory=dict)
    #: set by the plugin when the run selected every standard test of a port contract
    #: class: only then does an unreached method fail the run
    enforce: bool = False
    #: the node id of the test running now and the rules it checks (set by the port
    #: contract's autouse fixture)
    current: str | None = None
    current_rules: tuple[str, ...] = ()

    def offer(self, port: PortKey, methods: Sequence[str]) -> None:
        known = self.offered.get(port, ())
        self.offered[port] = tuple(dict.fromkeys((*known, *methods)))

    def record(self, port: PortKey, method: str, edges: Sequence[str]) -> None:
        test = self.current
        if test is None:
            return
        reach = self.reached.setdefault((port, method), MethodReach())
        reach.tests.add(test)
        reach.calls += 1
        for rule_name in self.current_rules:
            reach.rules.setdefault(rule_name, set()).add(test)
        for edge_name in (*edges, *EDGES.get()):
            reach.edges.setdefault(edge_name, set()).add(test)

    def unreached(self) -> list[tuple[PortKey, str, str | None]]:
        """Offered methods no test reached (rule None), and per method the rules of
        :data:`APPLIES` no test that reached it checked."""
        missing: list[tuple[PortKey, str, str | None]] = []
        for port, methods in self.offered.items():
            for method in methods:
                reach = self.reached.get((port, method), MethodReach())
                if not reach.tests:
                    missing.append((port, method, None))
                    continue
                missing += [
                    (port, method, name)
                    for name in APPLIES.get(method, ())
                    if not reach.rules.get(name)
                ]
        return missing

    def failures(self) -> list[str]:
        """What :meth:`unreached` found, one sentence each."""
        return [
            f"{port.label()}.{method} is offered but no test reached it; "
            "the port contract has not tested it"
            if name is None
            else f"{port.label()}.{method} was reached by no test of the rule {name!r} "
            f"({RULES[name]})"
            for port, method, name in self.unreached()
        ]

    def lines(self) -> list[str]:
        """The table: one line per offered port method, its edge cases on the next."""
        out: list[str] = []
        for port, methods in sorted(self.offered.items(), key=lambda kv: kv[0].label()):
            if not methods:
                out.append(
                    f"{port.label()}: offers no method (not atomic: the core's own steps run)"
                )
            for method in methods:
                reach = self.reached.get((port, method), MethodReach())
                out.append(
                    f"{port.label()}.{method}: {len(reach.tests)} tests, {reach.calls} calls"
                    + ("" if reach.tests else "  <-- REACHED BY NO TEST")
                )
                if reach.tests:
                    out.append(
                        "    rules (tests): "
                        + ", ".join(
                            f"{name} {len(reach.rules.get(name, ()))}"
                            + ("" if reach.rules.get(name) else " <-- NOT TESTED")
                            for name in RULES
                            if reach.rules.get(name) or name in APPLIES.get(method, ())
                        )
                    )
                if reach.edges:
                    edges = sorted(reach.edges.items(), key=lambda item: (-len(item[1]), item[0]))
                    out.append(
                        "    edge cases (tests): "
                        + ", ".join(f"{name} {len(tests)}" for name, tests in edges)
                    )
        return out


REGISTRY = Registry()
#: Edge cases named by the code around a call (see :func:`edge`).
EDGES: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "agent_stores_contract_edges", default=()
)


@contextlib.contextmanager
def edge(*names: str) -> Iterator[None]:
    """Tag every port call made inside the block with the edge cases ``names``."""
    token = EDGES.set((*EDGES.get(), *names))
    try:
        yield
    finally:
        EDGES.reset(token)


def _error_edge(exc: BaseException) -> str:
    return "conflict" if type(exc).__name__ == "ConflictError" else f"raised {type(exc).__name__}"


def _parts_edges(counts: Sequence[int]) -> list[str]:
    most = max(counts, default=0)
    if most >= 100:
        return ["parts>=100", "parts>=10"]
    if most >= 10:
        return ["parts>=10"]
    return []


class RecordingSessionPort:
    """A :class:`~agent_stores.sessions.port.SessionPort` recording its calls, forwarding to ``inner``."""

    def __init__(self, inner: SessionPort, key: PortKey) -> None:
        self.inner = inner
        self.key = key
        REGISTRY.offer(key, METHODS["sessions"])

    async def acquire(self, request: AcquireRequest) -> AcquireReply:
        edges = ["held chunks"] if request.held_chunks else []
        if not request.load_history:
            edges.append("no history")
        try:
            reply = await self.inner.acquire(request)
        except BaseException as exc:
            REGISTRY.record(self.key, "acquire", [*edges, _error_edge(exc)])
            raise
        edges.append(f"outcome={reply.outcome}")
        counts: dict[str, int] = {}
        for part in reply.parts:
            chunk = part.rpartition("/")[0]
            counts[chunk] = counts.get(chunk, 0) + 1
        edges += _parts_edges(list(counts.values()))
        REGISTRY.record(self.key, "acquire", edges)
        return reply

    async def save(self, request: SaveRequest) -> str:
        edges = ["new chunks"] if request.chunks else []
        edges += _parts_edges([len(c.parts) for c in request.chunks])
        if request.ttl_seconds is None:
            edges.append("no ttl")
        try:
            version = await self.inner.save(request)
        except BaseException as exc:
            REGISTRY.record(self.key, "save", [*edges, _error_edge(exc)])
            raise
        REGISTRY.record(self.key, "save", edges)
        return version


class RecordingMemoryPort:
    """A :class:`~agent_stores.memory.port.MemoryPort` recording its calls, forwarding to ``inner``."""

    def __init__(self, inner: MemoryPort, key: PortKey) -> None:
        self.inner = inner
        self.key = key
        # A port decides once whether it is atomic (Redis: not on a cluster).
        self.atomic = bool(inner.atomic)
        REGISTRY.offer(key, METHODS["memory"])

    async def read(self, scope: str, key: str) -> Entry | None:
        try:
            entry = await self.inner.read(scope, key)
        except BaseException as exc:
            REGISTRY.record(self.key, "read", [_error_edge(exc)])
            raise
        REGISTRY.record(self.key, "read", ["hit" if entry is not None else "miss"])
        return entry

    async def write(self, write: FileWrite) -> str:
        edges = ["replace" if write.expected_version is not None else "create"]
        if write.index is not None:
            edges.append("with index")
        if write.markers:
            edges.append("with markers")
        if write.ttl is not None:
            edges.append("tombstone ttl")
        edges.append("atomic" if self.atomic else "not atomic")
        try:
            version = await self.inner.write(write)
        except BaseException as exc:
            REGISTRY.record(self.key, "write", [*edges, _error_edge(exc)])
            raise
        REGISTRY.record(self.key, "write", edges)
        return version


class RecordingJournalPort:
    """A :class:`~agent_stores.checkpointer.port.JournalPort` recording its calls, forwarding to ``inner``."""

    def __init__(self, inner: JournalPort, key: PortKey) -> None:
        self.inner = inner
        self.key = key
        self.atomic = bool(inner.atomic)
        # The core calls append only on an atomic port: a non-atomic one offers nothing.
        REGISTRY.offer(key, METHODS["journal"] if self.atomic else ())

    async def append(self, request: AppendRequest) -> AppendOutcome:
        edges = ["new log" if request.head_version is None else "next position"]
        if request.ttl is None:
            edges.append("no ttl")
        try:
            outcome = await self.inner.append(request)
        except BaseException as exc:
            REGISTRY.record(self.key, "append", [*edges, _error_edge(exc)])
            raise
        edges.append("created" if outcome.created_version is not None else "duplicate")
        REGISTRY.record(self.key, "append", edges)
        return outcome


def describe(inner: Any, source: str, kind: str) -> PortKey:
    """The registry key of a port object."""
    return PortKey(kind, type(inner).__qualname__, source)
