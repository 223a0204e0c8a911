"""The KV CAS base class: the one contract a backend implements.

A backend subclasses :class:`KVStore` and writes the ``_``-prefixed primitives. The
public methods here validate ids and sizes, turn TTLs into absolute expiry times on the
core's clock, and hide expired entries, so every backend behaves the same:

* every conditional primitive must be atomic *in the server* (conditional write, ETag,
  Lua, transaction), never read-check-write in the client;
* versions are opaque strings, never reused for a key (delete + create gives a new one);
* expiry is decided by the core's clock (``now`` is passed in); native TTL, if any, is
  only garbage collection;
* ``scan`` returns keys in byte (code point) order, paginated.

Entries are addressed by ``(scope, key)``. The scope is the unit of locality (a session
id, a memory directory, a run id) and maps to the backend's partition.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, ParamSpec, TypeVar

from .. import telemetry
from ..errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidIdError,
    ResourceClosedError,
    UnsupportedError,
    ValueTooLargeError,
)
from ..lifecycle import AsyncCloseable
from .ports import resolve_default_ports

if TYPE_CHECKING:
    from ..url import URLOptions
    from .ports import NativePorts

Clock = Callable[[], float]

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_DEADLINE_SECONDS = 20.0
"""The default of :attr:`KVStore.deadline_seconds` (backends take it from ``?deadline=``)."""


class _Slot:
    """One bounded call: its task, when it must end, and whether the watch cancelled it."""

    __slots__ = ("cancelling", "ends", "fired", "task")

    task: asyncio.Task[Any]
    ends: float
    cancelling: int
    fired: bool

    def cut_off(self) -> bool:
        """On a cancellation of the task: True when it was this slot's timer alone (the
        cancellation is then taken back), False when someone else cancelled it too."""
        return self.fired and self.task.uncancel() <= self.cancelling


class _Bound(_Slot):
    """A ``with`` block, its own slot in the loop's deadline watch while entered (see
    :class:`Deadline`): a call waiting holds one object for it, not two."""

    __slots__ = ("_watch",)

    _watch: _DeadlineWatch | None  # None: not in the watch

    @staticmethod
    def _starting(
        seconds: float | None,
    ) -> tuple[asyncio.Task[Any], asyncio.AbstractEventLoop, float] | None:
        """The current task, its loop and the loop time a bound of ``seconds`` from now
        ends at; None when there is no bound (``seconds`` None, or outside a task)."""
        if seconds is None:
            return None
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always inside a task under asyncio.run
            return None
        loop = task.get_loop()
        return task, loop, loop.time() + seconds

    def _enter(
        self,
        watch: _DeadlineWatch,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],
        ends: float,
    ) -> None:
        self.task = task
        self.ends = ends
        self.cancelling = task.cancelling()
        self.fired = False
        self._watch = watch
        watch.enter(loop, self)

    def _left(self, kind: type[BaseException] | None) -> bool:
        """Leave the watch; True when the block ends by this bound's own cancellation (then
        taken back), False when it ended otherwise or someone else cancelled it too."""
        watch = self._watch
        if watch is None:
            return False
        self._watch = None
        watch.leave(self)
        return kind is not None and issubclass(kind, asyncio.CancelledError) and self.cut_off()


class Deadline(_Bound):
    """``with Deadline(kv): await …`` bounds the awaits inside by ``kv.deadline_seconds``,
    as :func:`within_deadline` does for one awaitable, without a coroutine of its own.

    Each coroutine between a task and the socket it waits on is resumed in turn whenever
    the socket answers, so a bound that is not one costs on every reply of every request;
    store code on hot paths uses this form. A call still running at the deadline is
    cancelled and reported as :class:`~agent_stores.errors.BackendUnavailableError`
    (raised from the ``with``), its outcome unknown, exactly like a lost reply. Inside an
    outer bound of the same store and task that ends no later, it does nothing.
    """

    __slots__ = ("_kv", "_outer")

    def __init__(self, kv: KVStore) -> None:
        self._kv = kv
        self._watch = None

    def __enter__(self) -> None:
        kv = self._kv
        starting = self._starting(kv.deadline_seconds)
        if starting is None:
            return
        task, loop, ends = starting
        watch = _DeadlineWatch.of(loop)
        outer = watch.running.get(task)
        if outer is not None and outer[0] == id(kv) and outer[1] <= ends:
            return  # already bounded by an outer call of this store, which ends first
        self._outer = outer
        watch.running[task] = (id(kv), ends)
        self._enter(watch, loop, task, ends)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: Any
    ) -> None:
        watch = self._watch
        if watch is not None:
            outer = self._outer
            if outer is None:
                watch.running.pop(self.task, None)
            else:
                watch.running[self.task] = outer
        if self._left(kind):
            deadline = self._kv.deadline_seconds
            raise BackendUnavailableError(
                detail=f"{self._kv.describe()} did not answer within {deadline:g} s "
                "(the call's deadline: the URL option deadline=SECONDS)"
            ) from None


class TimeBound(_Bound):
    """``with TimeBound(seconds): await …`` bounds the awaits inside by ``seconds`` (None:
    unbounded), as :func:`within_seconds` does for one awaitable, without a coroutine of
    its own (see :class:`Deadline`): ``TimeoutError`` is raised from the ``with``."""

    __slots__ = ("_seconds",)

    def __init__(self, seconds: float | None) -> None:
        self._seconds = seconds
        self._watch = None

    def __enter__(self) -> None:
        starting = self._starting(self._seconds)
        if starting is not None:
            task, loop, ends = starting
            self._enter(_DeadlineWatch.of(loop), loop, task, ends)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: Any
    ) -> None:
        if self._left(kind):
            raise TimeoutError(f"no answer within {self._seconds:g} s") from None


async def within_deadline(kv: KVStore, call: Awaitable[T]) -> T:
    """Await ``call`` (a backend request of ``kv``) for at most ``kv.deadline_seconds``.

    A call still running then is cancelled and reported as
    :class:`~agent_stores.errors.BackendUnavailableError` naming the backend and its
    (redacted) location: its outcome is unknown, exactly like a lost reply. Native ports
    run their requests through this too (or :class:`Deadline`, its ``with`` form), so no
    store call outlives the deadline.
    """
    with Deadline(kv):
        return await call


async def within_seconds(seconds: float | None, call: Awaitable[T]) -> T:
    """Await ``call`` for at most ``seconds`` (None: unbounded); then it is cancelled and
    ``TimeoutError`` raised, as ``asyncio.timeout`` does, but on the shared timer of
    :func:`within_deadline` (about 1 µs a call instead of a timer armed and cancelled).

    For a backend's per-attempt bounds inside a store call (a Redis reply that does not
    come is given up and the command retried, within the call's deadline). The timer
    checks every 50 ms, so a bound is met to within that. :class:`TimeBound` is its
    ``with`` form.
    """
    with TimeBound(seconds):
        return await call


class _DeadlineWatch:
    """The deadlines of one event loop, checked by one timer.

    ``asyncio.timeout`` arms and cancels a timer per call (a heap push each), which a
    store pays on every request; here a call only enters and leaves a set, and one timer,
    armed while calls are running (and one tick after), cancels the tasks of those past
    their end. It fires every :data:`_WATCH_TICK` seconds, or earlier for a call that ends
    sooner, so a call is cancelled at most a tick after its deadline.
    """

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _DeadlineWatch]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Nothing here may hold the loop (it is this watch's key in ``_by_loop``): the
        # timer is known by its time and generation, never by its handle.
        self._loop = weakref.ref(loop)
        self.slots: set[_Slot] = set()
        #: by task, the store (its id) and loop time of the innermost running ``Deadline``:
        #: a call nested in another of the same store in the same task (a native port's
        #: request inside the session layer's bounded call) that would end no earlier needs
        #: no slot of its own. Kept here rather than in a context variable: a variable's
        #: set makes three objects (token and mapping nodes) for the garbage collector to
        #: walk while the call waits, and a task started inside a bounded call is not
        #: covered by that call's slot anyway.
        self.running: dict[asyncio.Task[Any], tuple[int, float]] = {}
        self.next_check: float | None = None
        self.generation = 0

    #: the last loop asked for and its watch: nearly every call asks for the same loop, and
    #: a ``WeakKeyDictionary`` lookup makes a weak reference each time
    _last: ClassVar[tuple[int, weakref.ref[asyncio.AbstractEventLoop] | None, Any]] = (
        0,
        None,
        None,
    )

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _DeadlineWatch:
        loop_id, ref, last = cls._last
        if loop_id == id(loop) and ref is not None and ref() is loop:
            return last  # type: ignore[no-any-return]
        watch = cls._by_loop.get(loop)
        if watch is None:
            watch = cls._by_loop[loop] = cls(loop)
        cls._last = (id(loop), watch._loop, watch)
        return watch

    def enter(self, loop: asyncio.AbstractEventLoop, slot: _Slot) -> None:
        self.slots.add(slot)
        ends = slot.ends
        if self.next_check is None:
            self._arm(loop, min(ends, loop.time() + _WATCH_TICK))
        elif ends < self.next_check:
            self._arm(loop, ends)  # the earlier timer supersedes the armed one

    def leave(self, slot: _Slot) -> None:
        # The timer stays armed: it lapses at its next check when no call is left, so
        # calls one after another do not arm and cancel one each.
        self.slots.discard(slot)

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self.generation += 1
        self.next_check = when
        loop.call_at(when, self._check, self.generation)

    def _check(self, generation: int) -> None:
        loop = self._loop()
        if generation != self.generation or loop is None:
            return  # superseded by an earlier one
        now = loop.time()
        earliest = now + _WATCH_TICK
        for slot in self.slots:
            if slot.fired:
                continue
            if slot.ends <= now:
                slot.fired = True
                slot.task.cancel()
            else:
                earliest = min(earliest, slot.ends)
        if self.slots:
            self._arm(loop, earliest)
        else:
            self.next_check = None


#: Seconds between two checks of the running calls' deadlines (see ``_DeadlineWatch``).
_WATCH_TICK = 0.05


def _bounded(
    fn: Callable[Concatenate[KVStore, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[KVStore, P], Coroutine[Any, Any, T]]:
    """Bound a public KV method by the store's deadline (see :func:`within_deadline`)."""

    @functools.wraps(fn)
    async def wrapper(self: KVStore, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with Deadline(self):
            return await fn(self, *args, **kwargs)

    return wrapper


@dataclass(frozen=True, slots=True)
class Entry:
    """A stored value with its opaque version and absolute expiry (unix seconds or None)."""

    value: bytes
    version: str
    expires_at: float | None = None

    def expired(self, now: float) -> bool:
        """True when the entry is past its expiry at time ``now``."""
        return self.expires_at is not None and self.expires_at <= now


@dataclass(frozen=True, slots=True)
class ScanItem:
    """One key returned by :meth:`KVStore.scan`; ``entry`` is None when values were not asked for."""

    key: str
    entry: Entry | None


MIN_VALUE_BYTES = 1024
"""The smallest per-entry size limit a backend (or a ``max_value_bytes`` option) may set."""


@dataclass(frozen=True, slots=True)
class KVLimits:
    """What a backend can hold. Stores size their records from these numbers."""

    max_value_bytes: int
    max_scope_chars: int = 512
    max_key_chars: int = 512

    def __post_init__(self) -> None:
        # One check for every backend: below this the stores cannot hold their own records.
        if not isinstance(self.max_value_bytes, int) or self.max_value_bytes < MIN_VALUE_BYTES:
            raise ConfigError(
                detail=f"max_value_bytes must be an integer >= {MIN_VALUE_BYTES}, "
                f"got {self.max_value_bytes!r}"
            )


@dataclass(frozen=True, slots=True)
class KVCapabilities:
    """Optional features of a backend."""

    commit: bool = False
    """``commit`` is all-or-nothing across keys of one scope."""
    shared_across_processes: bool = True
    """Two processes opening the same URL see the same data (False for ``memory://``)."""
    answers_inline: bool = False
    """Calls usually finish without waiting for I/O or yielding to the event loop (an
    embedded database run on the loop's thread, as SQLite; not ``memory://``, which yields
    at every call on purpose). The session store then starts a turn's last write as an
    eager task (Python 3.12+), which finishes it without a round of the event loop; on a
    networked backend that only reorders work, so leave it False there."""


# -- operations for commit ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Create:
    """Create ``key`` if absent or expired."""

    key: str
    value: bytes
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class Replace:
    """Replace ``key`` if its current version is ``expected_version``."""

    key: str
    value: bytes
    expected_version: str
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key``: only at ``expected_version`` when given, else unconditionally."""

    key: str
    expected_version: str | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """Require ``key`` to be at ``expected_version`` (None: absent) without writing it."""

    key: str
    expected_version: str | None


Operation = Create | Replace | Delete | Check


# Versions, lease owners and write marks must be unique, not secret (they tell writes
# apart; whoever could exploit guessing one can write the record itself), so they come from
# a generator seeded by the OS instead of a system call each (several per turn). A private
# one: an application's random.seed() must not make two processes draw the same ids;
# reseeded in a forked child for the same reason.
_ids = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ids.seed)


# Bound once (a fork reseeds the same generator); ``int.to_bytes(...).hex()`` formats in a
# quarter of the time of an ``f"{n:032x}"`` with a computed width, and a store makes
# several versions per operation.
_random_bits = _ids.getrandbits


def random_hex(nbytes: int) -> str:
    """``nbytes`` random bytes as hex, for ids that must be unique (not secret)."""
    return _random_bits(nbytes * 8).to_bytes(nbytes, "big").hex()


def new_version() -> str:
    """A fresh opaque version: 128 random bits, so a version is never reused for a key."""
    return _random_bits(128).to_bytes(16, "big").hex()


class KVStore(AsyncCloseable, ABC):
    """Async key-value store with per-key compare-and-swap, TTL and ordered scans.

    Subclasses implement the ``_`` primitives; callers use the public methods. A store is
    an async context manager; :meth:`aclose` releases connections it created.
    """

    #: scheme names, for messages
    backend_name: ClassVar[str] = "kv"

    limits: KVLimits = KVLimits(max_value_bytes=1 << 20)
    capabilities: KVCapabilities = KVCapabilities()

    #: The most one call may take, retries included, before it fails with
    #: BackendUnavailableError (None: unbounded). Backends set it from ``?deadline=``.
    deadline_seconds: float | None = DEFAULT_DEADLINE_SECONDS

    #: The URL query options this backend's URLs accept (declared next to its URL parser,
    #: checked by it, and listed in ``docs/reference/url-options.md``); None: undeclared.
    url_options: ClassVar[URLOptions | None] = None

    _ports: NativePorts | None = None

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or time.time
        self._closed = False

    @property
    def ports(self) -> NativePorts:
        """The native ports the stores built on this KV store use (:mod:`agent_stores.kv.ports`).

        Resolved once per KV store, when :func:`agent_stores.open_kv` opens it or when a
        store first asks: the plugins' ``session_port``/``memory_port``/``journal_port``
        hooks answer (through the selection layer, so no store depends on the plugin
        registry). A wrapper sets its inner store's ports here
        (:class:`~agent_stores.kv.counting.CountingKV`, a fault injector's), and a user may
        replace them (``kv.ports = NativePorts(...)``; ``GENERIC_ONLY`` for none).
        """
        if self._ports is None:
            self._ports = resolve_default_ports(self)
        return self._ports

    @ports.setter
    def ports(self, ports: NativePorts) -> None:
        self._ports = ports

    # -- lifecycle ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Release what the store created. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._aclose()

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` was called."""
        return self._closed

    async def setup(self) -> None:
        """Create tables, indexes or schema if the backend needs them. Idempotent."""

    @property
    def auto_setup(self) -> bool:
        """May a store create the backend's schema on its own (see :meth:`prepare`)?

        True where setup is cheap and implicit (embedded files, schemaless servers, the
        PostgreSQL default); backends whose setup creates billable resources (a DynamoDB
        table, a Cosmos container) return False unless the URL asks for it.
        """
        return True

    async def prepare(self) -> None:
        """Make the store ready for the stores built on it: :meth:`setup` if :attr:`auto_setup`.

        Entering a session store, memory store or checkpointer calls this, so the three
        behave the same. With ``auto_setup`` off nothing is created; an operation on a
        missing schema then fails with a typed error naming ``agent-stores setup URL``.
        """
        if self.auto_setup:
            await within_deadline(self, self.setup())

    async def purge_expired(self) -> int:
        """Physically delete expired entries where the backend cannot do it natively.

        Returns how many were removed (0 when the backend collects garbage itself).
        """
        return 0

    def describe(self) -> str:
        """A one-line description for people: backend name and redacted location."""
        return self.backend_name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"

    # -- public API -----------------------------------------------------------------------

    @telemetry.kv_call
    @_bounded
    async def get(self, scope: str, key: str) -> Entry | None:
        """The live entry at ``(scope, key)``, or None when absent or expired."""
        self.check_open()
        self.check_ids(scope, key)
        entry = await self._get(scope, key)
        if entry is None or entry.expired(self.clock()):
            return None
        return entry

    @telemetry.kv_call
    @_bounded
    async def get_many(self, scope: str, keys: Sequence[str]) -> dict[str, Entry]:
        """Live entries of ``keys`` in one round trip where the backend can; missing keys are omitted."""
        self.check_open()
        unique = list(dict.fromkeys(keys))
        for key in unique:
            self.check_ids(scope, key)
        if not unique:
            return {}
        found = await self._get_many(scope, unique)
        now = self.clock()
        return {k: e for k, e in found.items() if not e.expired(now)}

    @telemetry.kv_call
    @_bounded
    async def create(self, scope: str, key: str, value: bytes, *, ttl: float | None = None) -> str:
        """Write ``value`` only if the key is absent or expired; returns the new version.

        Raises :class:`~agent_stores.errors.ConflictError` when a live entry exists.
        """
        self.check_open()
        self.check_ids(scope, key)
        self.check_value(scope, key, value)
        now = self.clock()
        return await self._create(scope, key, value, self.expires_at(ttl, now), now)

    @telemetry.kv_call
    @_bounded
    async def replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        *,
        expected_version: str,
        ttl: float | None = None,
    ) -> str:
        """Write ``value`` only if the live entry is at ``expected_version``; returns the new version.

        ``ttl`` applies to the new value (None: never expires). Raises
        :class:`~agent_stores.errors.ConflictError` otherwise.
        """
        self.check_open()
        self.check_ids(scope, key)
        self.check_value(scope, key, value)
        now = self.clock()
        return await self._replace(
            scope, key, value, expected_version, self.expires_at(ttl, now), now
        )

    @telemetry.kv_call
    @_bounded
    async def delete(self, scope: str, key: str, *, expected_version: str | None = None) -> bool:
        """Delete the live entry (only at ``expected_version`` when given). True if it happened."""
        self.check_open()
        self.check_ids(scope, key)
        return await self._delete(scope, key, expected_version, self.clock())

    @telemetry.kv_call
    @_bounded
    async def scan(
        self,
        scope: str,
        *,
        prefix: str = "",
        start_after: str | None = None,
        limit: int = 100,
        values: bool = True,
    ) -> list[ScanItem]:
        """Live keys of ``scope`` starting with ``prefix``, in byte order, after ``start_after``.

        At most ``limit`` items; fewer means the end was reached. ``values=False`` lets the
        backend skip reading values (``ScanItem.entry`` is then None).
        """
        self.check_open()
        self.check_scope(scope)
        if limit < 1:
            raise ValueError("limit must be >= 1")
        return await self._scan(scope, prefix, start_after, limit, values, self.clock())

    async def iter_scan(
        self, scope: str, *, prefix: str = "", page_size: int = 100, values: bool = True
    ) -> AsyncIterator[ScanItem]:
        """Every live key of ``scope`` under ``prefix``, paging through :meth:`scan`."""
        start_after: str | None = None
        while True:
            page = await self.scan(
                scope, prefix=prefix, start_after=start_after, limit=page_size, values=values
            )
            for item in page:
                yield item
            if len(page) < page_size:
                return
            start_after = page[-1].key

    @telemetry.kv_call
    @_bounded
    async def scopes(
        self, *, prefix: str = "", start_after: str | None = None, limit: int = 100
    ) -> list[str]:
        """Scopes holding at least one entry, in byte order. Admin use: may be slow."""
        self.check_open()
        if limit < 1:
            raise ValueError("limit must be >= 1")
        return await self._scopes(prefix, start_after, limit, self.clock())

    async def iter_scopes(self, *, prefix: str = "", page_size: int = 500) -> AsyncIterator[str]:
        """Every scope holding a live entry under ``prefix``, each once, in no promised order.

        The admin walk (``copy``, ``doctor``): its cost grows linearly with the data, where
        paging :meth:`scopes` costs a whole listing per page on a backend with no ordered
        index of scopes (Redis, DynamoDB). Each page is one bounded call. A scope live for
        the whole walk is yielded; one created or emptied during it may or may not be. The
        names already yielded are kept (to drop a backend cursor's repeats) until the walk ends.
        """
        self.check_open()
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        pages = self._scope_pages(prefix, page_size, self.clock())
        seen: set[str] = set()
        try:
            while True:
                try:
                    page = await within_deadline(self, anext(pages))
                except StopAsyncIteration:
                    return
                for scope in page:
                    if scope not in seen and scope.startswith(prefix):
                        seen.add(scope)
                        yield scope
        finally:
            await pages.aclose()

    @telemetry.kv_call
    @_bounded
    async def drop_scope(self, scope: str) -> int:
        """Delete every entry of ``scope`` (erasure). Returns how many were deleted."""
        self.check_open()
        self.check_scope(scope)
        return await self._drop_scope(scope)

    @telemetry.kv_call
    @_bounded
    async def commit(self, scope: str, ops: Sequence[Operation]) -> list[str | None]:
        """Apply ``ops`` all-or-nothing inside one scope, where ``capabilities.commit`` says so.

        Returns the new version of each operation (None for Delete and Check). On a failed
        condition nothing is written and :class:`~agent_stores.errors.ConflictError` is raised
        with ``index`` set to the first failing operation.
        """
        self.check_commit(scope, ops)
        if not ops:
            return []
        return await self._commit(scope, list(ops), self.clock())

    # -- helpers for subclasses and the public API ----------------------------------------

    # -- checks, public so native ports apply exactly the public API's ----------------------

    def expires_at(self, ttl: float | None, now: float) -> float | None:
        """The absolute expiry of a write made at ``now`` with ``ttl`` seconds (None: never);
        ``ttl`` must be positive. An entry is expired once ``expires_at <= now``."""
        if ttl is None:
            return None
        if ttl <= 0:
            raise ValueError("ttl must be positive (or None for no expiry)")
        return now + ttl

    def check_open(self) -> None:
        """Raise ResourceClosedError once :meth:`aclose` was called."""
        if self._closed:
            raise ResourceClosedError(detail=f"{self.describe()} is closed")

    def check_scope(self, scope: str) -> None:
        """Raise InvalidIdError unless ``scope`` is a valid scope name (``docs/kv.md``)."""
        _check_id("scope", scope, self.limits.max_scope_chars)

    def check_ids(self, scope: str, key: str) -> None:
        """Raise InvalidIdError unless ``scope`` and ``key`` are valid ids (``docs/kv.md``)."""
        _check_id("scope", scope, self.limits.max_scope_chars)
        _check_id("key", key, self.limits.max_key_chars)

    def check_commit(self, scope: str, ops: Sequence[Operation]) -> None:
        """The checks of :meth:`commit`, before anything is sent: raise ResourceClosedError
        once closed, UnsupportedError unless ``capabilities.commit``, InvalidIdError for an
        invalid scope or key, ValueError for a key that appears twice and
        ValueTooLargeError for a value over the limits."""
        self.check_open()
        if not self.capabilities.commit:
            raise UnsupportedError(detail=f"{self.backend_name} does not support multi-key commit")
        self.check_scope(scope)
        seen: set[str] = set()
        for op in ops:
            self.check_ids(scope, op.key)
            if op.key in seen:
                raise ValueError(f"commit: key {op.key!r} appears twice")
            seen.add(op.key)
            if isinstance(op, Create | Replace):
                self.check_value(scope, op.key, op.value)

    def check_value(self, scope: str, key: str, value: bytes) -> None:
        """Raise ValueTooLargeError when ``value`` exceeds ``limits.max_value_bytes`` (TypeError
        when it is not bytes)."""
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"value must be bytes, got {type(value).__name__}")
        if len(value) > self.limits.max_value_bytes:
            raise ValueTooLargeError(
                f"value for key {key[:80]!r} in scope {scope[:80]!r} is {len(value)} bytes; "
                f"{self.backend_name} holds at most {self.limits.max_value_bytes} bytes per entry",
                size=len(value),
                limit=self.limits.max_value_bytes,
            )

    # -- primitives a backend implements ------------------------------------------------

    async def _aclose(self) -> None:
        """Release resources. Called once."""

    @abstractmethod
    async def _get(self, scope: str, key: str) -> Entry | None:
        """The stored entry (expired ones may be returned; the caller filters)."""

    async def _get_many(self, scope: str, keys: Sequence[str]) -> Mapping[str, Entry]:
        """Stored entries of ``keys``. Override with a single round trip where possible."""
        results = await asyncio.gather(*(self._get(scope, k) for k in keys))
        return {k: e for k, e in zip(keys, results, strict=True) if e is not None}

    @abstractmethod
    async def _create(
        self, scope: str, key: str, value: bytes, expires_at: float | None, now: float
    ) -> str:
        """Atomically write if absent or ``expires_at <= now``; raise ConflictError otherwise."""

    @abstractmethod
    async def _replace(
        self,
        scope: str,
        key: str,
        value: bytes,
        expected_version: str,
        expires_at: float | None,
        now: float,
    ) -> str:
        """Atomically write if the live entry's version is ``expected_version``; else ConflictError."""

    @abstractmethod
    async def _delete(self, scope: str, key: str, expected_version: str | None, now: float) -> bool:
        """Atomically delete (at ``expected_version`` if given). True only if a live entry was deleted.

        An expired entry may be physically removed but counts as absent (returns False).
        """

    @abstractmethod
    async def _scan(
        self,
        scope: str,
        prefix: str,
        start_after: str | None,
        limit: int,
        values: bool,
        now: float,
    ) -> list[ScanItem]:
        """Up to ``limit`` live keys in byte order, never reading the whole scope."""

    @abstractmethod
    async def _scopes(
        self, prefix: str, start_after: str | None, limit: int, now: float
    ) -> list[str]:
        """Up to ``limit`` scopes holding a live entry at ``now``, under ``prefix``, after ``start_after``, in byte order.

        A scope whose entries have all expired is not listed (the contract checks it).
        """

    async def _scope_pages(
        self, prefix: str, page_size: int, now: float
    ) -> AsyncGenerator[list[str], None]:
        """Pages of scopes holding a live entry at ``now`` under ``prefix``, for :meth:`iter_scopes`.

        Any order; a scope may appear in several pages (the caller drops repeats); a page
        may be empty without the walk being over. The default pages through
        :meth:`_scopes` by ``start_after``, linear where scopes are an ordered index; a
        backend whose ``_scopes`` walks everything for each page overrides this with its
        native cursor.
        """
        start_after: str | None = None
        while True:
            page = await self._scopes(prefix, start_after, page_size, now)
            if page:
                yield page
            if len(page) < page_size:
                return
            start_after = page[-1]

    @abstractmethod
    async def _drop_scope(self, scope: str) -> int:
        """Delete everything in ``scope``."""

    async def _commit(self, scope: str, ops: list[Operation], now: float) -> list[str | None]:
        """All-or-nothing multi-key write; only called when ``capabilities.commit`` is True."""
        raise UnsupportedError(detail=f"{self.backend_name} does not support multi-key commit")


def prefix_upper_bound(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (None: unbounded).

    Lets backends turn a prefix into a key range served by an ordered index.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code == 0xD800:  # skip the surrogate block, not encodable
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def _check_id(kind: str, value: str, max_chars: int) -> None:
    # The usual id, ASCII (``isascii`` reads a flag, no scan; ASCII always encodes): what
    # the full checks below would accept, decided without encoding the id.
    if (
        type(value) is str
        and value.isascii()
        and 0 < len(value) <= max_chars
        and "\x00" not in value
    ):
        return
    if not isinstance(value, str):
        raise InvalidIdError(detail=f"{kind} must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidIdError(detail=f"{kind} must not be empty")
    if len(value) > max_chars:
        raise InvalidIdError(
            detail=f"{kind} {value[:40]!r}… is {len(value)} characters; the limit is {max_chars}"
        )
    if "\x00" in value:
        raise InvalidIdError(detail=f"{kind} {value[:80]!r} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidIdError(
            detail=f"{kind} {value[:80]!r} is not valid Unicode (lone surrogate)"
        ) from None
