"""``SessionStore``: one active turn per session, on any KV backend."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import logging
import os
import random
import secrets
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from .. import telemetry
from ..errors import ConfigError, ResourceClosedError
from ..kv.base import KVStore, random_hex
from ..lifecycle import KVBackedStore
from .catalog import CatalogUpdate, IdlePurge, OwnerErasure, SessionPage
from .errors import (
    EffectCall,
    InvalidSessionError,
    LeaseLostError,
    SessionBusyError,
    SessionError,
    SessionNotFoundError,
    TransientStoreError,
)
from .forks import BranchInfo, ForkReport
from .history import StoredHistory, as_list, begins_with
from .info import SessionInfo
from .port import SessionPort
from .storage import Acquired, Busy, KVSessionStorage, LeaseHandle, Ticket
from .sync import NotAwaitable

if TYPE_CHECKING:
    # Imported at run time only where messages are handled: Pydantic AI is heavy to
    # import, and listing or inspecting sessions never needs it.
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.messages import ModelMessage
    from pydantic_ai.run import AgentRunResult

log = logging.getLogger("agent_stores.sessions")

T = TypeVar("T")


@dataclass(slots=True)
class _Wait:
    """Where one client waiting for a busy session stands: its backoff, its place in the
    session's queue of clients, and what it learnt about the holder."""

    deadline: float
    #: the current backoff of the polls (jittered, doubling up to ``poll_max_seconds``)
    delay: float
    ticket: Ticket | None
    #: the ticket is first in the queue (or no ticket: nothing to wait behind)
    at_head: bool
    #: tickets ahead of ours, counted up to 2
    rank: int = 2
    holder: str | None = None
    #: the hand-over hint this client left is known to be in place
    hinted: bool = False

    def next_pause(self, ceiling: float) -> float:
        """A jittered pause of the current backoff, which then doubles (up to ``ceiling``)."""
        pause = self.delay * random.uniform(0.5, 1.0)
        self.delay = min(self.delay * 2, ceiling)
        return pause


class Session:
    """The session of one active turn: its history and the means to save it.

    Obtained from ``async with store.turn(session_id) as session``. ``messages`` was
    loaded under exclusion; nothing is saved unless :meth:`replace` is called (then on a
    clean exit of the block) or :meth:`checkpoint` is awaited (at once).
    """

    def __init__(self, turn: Turn, handle: LeaseHandle) -> None:
        # Weak: the turn holds its session, and a cycle between them would keep a turn's
        # history, header and handle alive until the interpreter's cyclic garbage
        # collector finds them (a collection walks everything young, every few turns).
        self._turn_ref = weakref.ref(turn)
        self._handle = handle
        self.session_id: str = handle.session_id
        #: The history loaded when the turn started (your own list: mutating it saves nothing).
        self.messages: list[ModelMessage] = as_list(handle.messages)
        self._replacement: Sequence[ModelMessage] | None = None

    @property
    def _turn(self) -> Turn:
        turn = self._turn_ref()
        if turn is None:  # the turn ended and nothing holds it any more
            raise ResourceClosedError(detail=f"the turn on session {self.session_id!r} is over")
        return turn

    def __repr__(self) -> str:
        return (
            f"<Session {self.session_id!r} messages={len(self.messages)} "
            f"fence={self.fence} changed={self.changed}>"
        )

    @property
    def changed(self) -> bool:
        """True once :meth:`replace` was called: the block's clean exit will save."""
        return self._replacement is not None

    @property
    def fence(self) -> int:
        """This turn's fence number: it increases with every acquisition of the session."""
        return self._handle.fence

    @property
    def lease_expires_at(self) -> float:
        """When the lease runs out unless renewed (store clock, unix seconds)."""
        return self._handle.lease_expires_at

    @property
    def pending_effects(self) -> tuple[EffectCall, ...]:
        """Effect calls marked and not yet confirmed by a successful tool return."""
        return self._handle.pending_effects

    def replace(self, messages: Sequence[ModelMessage]) -> NotAwaitable:
        """Mark ``messages`` as the new history, saved when the block exits without an exception.

        Typically ``session.replace(result.all_messages())``. The last call wins. When the
        list extends the stored history only the new messages are written. Synchronous: it
        does no I/O (the save happens on exit), so ``await session.replace(...)`` raises a
        TypeError saying so.
        """
        from pydantic_ai.messages import ModelRequest, ModelResponse

        self._turn.check_usable()
        # A list is read without copying it first: what is kept is copied below.
        items = messages if type(messages) is list else list(messages)
        loaded = self._handle.messages
        # The usual list starts with the loaded history itself (``[*session.messages,
        # ...]``): those messages were checked when they were loaded or saved, and the
        # save reuses this one C-speed comparison instead of making it again.
        start = 0
        if begins_with(items, loaded):
            start = len(loaded)
        # The set of exact types first: a C-speed pass; the per-item check runs only when
        # something else (a subclass, or an error) is there.
        if not set(map(type, items[start:])) <= {ModelRequest, ModelResponse}:
            for index, message in enumerate(items):
                if not isinstance(message, (ModelRequest, ModelResponse)):
                    raise TypeError(
                        f"replace() expects Pydantic AI ModelMessage objects; item {index} is "
                        f"{type(message).__name__}"
                    )
        replacement: Sequence[ModelMessage]
        if start:
            # Kept as the loaded history's own pieces and a copy of the new messages, not
            # as a second list of the whole history (agent_stores.sessions.history): the
            # same snapshot, and no young list of a long history for the collector to walk.
            replacement = StoredHistory.joined(loaded, items[start:])
            self._handle.extension = (replacement, loaded)
        else:
            replacement = list(items) if items is messages else items
            self._handle.extension = None
        self._replacement = replacement
        return NotAwaitable("Session.replace()", "it only records the history saved on exit")

    def set_catalog(
        self,
        *,
        owner: str | None = None,
        title: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> NotAwaitable:
        """Set catalog fields (owner, title, tags, metadata), saved with the turn on a clean exit.

        Fields left None keep their value; a ``metadata`` key set to None is removed. Like
        :meth:`replace` it does no I/O, and it merges with what ``turn(...)`` was given.
        """
        self._turn.check_usable()
        update = CatalogUpdate.of(owner, title, tags, metadata)
        if update is not None:
            self._turn.set_catalog(update)
        return NotAwaitable("Session.set_catalog()", "it only records fields saved on exit")

    @property
    def conversation(self) -> Conversation:
        """The session as a Pydantic AI ``Conversation``, to run as ``agent.run(…, conversation=…)``.

        Its messages are the history loaded when the turn began; its ``usage`` and
        ``deferred_tool_requests`` are those the last :meth:`save` kept (zero and None for a
        session only ever saved with :meth:`replace`); its ``conversation_id`` is the
        session id.
        """
        from pydantic_ai.conversation import Conversation

        from .conversation_state import decoded
        from .records import RecordError

        try:
            usage, deferred = decoded(self._handle.header.extra)
        except RecordError as exc:
            raise InvalidSessionError(
                f"session {self.session_id!r}: {exc}", session_id=self.session_id
            ) from None
        return Conversation(
            messages=list(self.messages),
            usage=usage,
            conversation_id=self.session_id,
            deferred_tool_requests=deferred,
        )

    def save(self, result: AgentRunResult[Any] | Conversation) -> NotAwaitable:
        """Keep a run's whole conversation: its messages (as :meth:`replace`), its running
        ``usage`` and the ``deferred_tool_requests`` it paused on, saved on a clean exit.

        Typically ``session.save(await agent.run(prompt, conversation=session.conversation))``.
        """
        from pydantic_ai.run import AgentRunResult

        from .conversation_state import EXTRA_KEY, encoded

        conversation = result.conversation if isinstance(result, AgentRunResult) else result
        if conversation.conversation_id != self.session_id:
            raise InvalidSessionError(
                f"a conversation {conversation.conversation_id!r} cannot be saved as session "
                f"{self.session_id!r}; run it with conversation=session.conversation",
                session_id=self.session_id,
            )
        self.replace(conversation.messages)
        header = self._handle.header
        state = encoded(conversation.usage, conversation.deferred_tool_requests)
        # Carried by the save's header (the exit writes ``extra`` over as it is here).
        self._handle.header = dataclasses.replace(header, extra={**header.extra, EXTRA_KEY: state})
        return NotAwaitable("Session.save()", "it only records the conversation saved on exit")

    @telemetry.traced("session.checkpoint", kv=lambda s: s._turn.store.kv)
    async def checkpoint(self, messages: Sequence[ModelMessage]) -> None:
        """Save ``messages`` now, keeping the turn; it stays saved even if the block fails later.

        Clears the recovery marker when every marked effect call has a successful
        ``ToolReturnPart`` in ``messages``. Used by the ``session_checkpoints`` capability.
        """
        self._turn.check_usable()
        items = list(messages)
        await self._turn.locked(lambda: self._turn.storage.checkpoint(self._handle, items))

    @telemetry.traced("session.mark_effects", kv=lambda s: s._turn.store.kv)
    async def mark_effects(self, calls: Iterable[EffectCall | tuple[str, str]]) -> None:
        """Durably record effect calls (tool name and call id, never arguments) before they run.

        While any marked call lacks a successful return in a saved history, the next
        ``turn()`` raises ``SESSION_RECOVERY_REQUIRED``.
        """
        self._turn.check_usable()
        items = [EffectCall(str(name), str(call_id)) for name, call_id in calls]
        if not items:
            return
        await self._turn.locked(lambda: self._turn.storage.mark_effects(self._handle, items))


class Turn:
    """The async context manager returned by :meth:`SessionStore.turn`.

    ``async with store.turn(session_id) as session:`` waits for the session's lease,
    loads its history and yields the :class:`Session`; on exit it saves what
    :meth:`Session.replace` recorded (if the block did not raise) and releases the lease.
    Annotate with it when a turn is passed around before it is entered.
    """

    def __init__(
        self,
        store: SessionStore,
        session_id: str,
        timeout_seconds: float,
        catalog: CatalogUpdate | None = None,
    ) -> None:
        self.store = store
        self.storage = store.storage
        self.session_id = session_id
        self.timeout_seconds = timeout_seconds
        #: catalog fields saved with the turn (``turn(owner=...)``, ``Session.set_catalog``)
        self.catalog = catalog
        self.handle: LeaseHandle | None = None
        self.session: Session | None = None
        self._task: asyncio.Task[Any] | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._renew_timer: asyncio.TimerHandle | None = None
        # Made when first needed (most turns need none of them): each is an object, and
        # those of the turns in flight are what the garbage collector walks while they wait.
        self._stop: asyncio.Event | None = None  # for a running renewer
        self._stopped = False
        self._lock: asyncio.Lock | None = None  # between a checkpoint and the renewer
        self._done: asyncio.Event | None = None  # for a closing store
        self._failure: SessionError | ResourceClosedError | None = None
        self._cancel_requested = False
        self._exiting = False
        self._finished = False

    # -- used by Session ------------------------------------------------------------------

    def set_catalog(self, update: CatalogUpdate) -> None:
        if update.owner is not None:
            self.storage.catalog.scope_for(update.owner)
            self.storage.catalog.check_session_id(self.session_id)
        old = self.catalog or CatalogUpdate()
        merged_meta = (
            update.metadata if old.metadata is None else {**old.metadata, **(update.metadata or {})}
        )
        self.catalog = CatalogUpdate(
            update.owner if update.owner is not None else old.owner,
            update.title if update.title is not None else old.title,
            update.tags if update.tags is not None else old.tags,
            merged_meta,
        )

    def check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._finished or self._exiting:
            raise ResourceClosedError(detail=f"the turn on session {self.session_id!r} is over")

    def _write_lock(self) -> asyncio.Lock:
        """The lock between the turn's writes (a checkpoint, the renewer, the last write)."""
        lock = self._lock
        if lock is None:
            lock = self._lock = asyncio.Lock()
        return lock

    def _done_event(self) -> asyncio.Event:
        """An event set when the turn has finished (set already if it has)."""
        done = self._done
        if done is None:
            done = self._done = asyncio.Event()
            if self._finished:
                done.set()
        return done

    async def locked(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run a state write under the turn's lock, to completion even if the caller is cancelled.

        A write cut off mid-flight would leave the fencing token unknown and make every
        later write of this turn fail; shielding keeps the turn consistent.
        """

        async def run() -> T:
            async with self._write_lock():
                self.check_usable()
                return await operation()

        return await _shielded(asyncio.ensure_future(run()))

    # -- enter ----------------------------------------------------------------------------

    @telemetry.turn_enter
    async def __aenter__(self) -> Session:
        self._task = asyncio.current_task()
        handle = await self.store._acquire(self.session_id, self.timeout_seconds)
        self.handle = handle
        self.session = Session(self, handle)
        self.store._active.add(self)
        # Most turns end long before the first renewal is due: a timer until then, so a
        # turn costs no renewal task (nor its sleeps) unless it lasts a third of the lease.
        self._renew_timer = asyncio.get_running_loop().call_later(
            self.store.lease_seconds / 3, self._start_renewal
        )
        return self.session

    # -- renewal --------------------------------------------------------------------------

    def _start_renewal(self) -> None:
        self._renew_timer = None
        if self._stopped:
            return
        self._stop = asyncio.Event()
        self._renewer = asyncio.get_running_loop().create_task(
            self._renew_loop(sleep_first=False), name=f"agent-stores lease {self.session_id[:40]}"
        )

    async def _sleep_or_stop(self, seconds: float) -> bool:
        """Sleep ``seconds``; True when asked to stop meanwhile."""
        assert self._stop is not None  # made with the renewer
        try:
            await asyncio.wait_for(self._stop.wait(), timeout=max(seconds, 0.0))
        except TimeoutError:
            return self._stopped
        return True

    def _must_stop_at(self, handle: LeaseHandle) -> float:
        """Event-loop time by which the owner must know its lease is gone.

        A little before the lease expires, so the owner is interrupted before anyone else
        may take the session over, whatever a hanging request is doing.
        """
        margin = min(self.store.lease_seconds * 0.1, 1.0)
        left = handle.lease_expires_at - margin - self.storage.clock()
        return asyncio.get_running_loop().time() + left

    def _expired(self, handle: LeaseHandle, cause: BaseException | None) -> LeaseLostError:
        why = "no renewal" if cause is None else f"last error: {cause}"
        lost = LeaseLostError(
            f"session {self.session_id!r}: the lease could not be renewed before it "
            f"expired ({why})",
            session_id=self.session_id,
        )
        lost.__cause__ = cause
        handle.lost = True
        return lost

    async def _renew_loop(self, *, sleep_first: bool = True) -> None:
        assert self.handle is not None
        handle = self.handle
        lease = self.store.lease_seconds
        due = not sleep_first
        while due or not await self._sleep_or_stop(lease / 3):
            due = False
            backoff = min(0.05, lease / 20)
            last: BaseException | None = None
            while True:
                # Each attempt (waiting for the turn's lock included: a hanging checkpoint
                # holds it) ends by the time the owner must stop.
                stop_at = self._must_stop_at(handle)
                try:
                    async with asyncio.timeout_at(stop_at):
                        async with self._write_lock():
                            if self._stopped:
                                return
                            await self.storage.renew(handle)
                    break
                except LeaseLostError as exc:
                    self._fail(exc)
                    return
                except ResourceClosedError as exc:
                    self._fail(exc)
                    return
                except TimeoutError as exc:
                    if asyncio.get_running_loop().time() >= stop_at:
                        self._fail(self._expired(handle, last or exc))
                        return
                    last = exc
                except Exception as exc:
                    last = exc
                left = stop_at - asyncio.get_running_loop().time()
                if left <= 0:
                    self._fail(self._expired(handle, last))
                    return
                log.warning(
                    "session %r: lease renewal failed (%s); retrying for %.2fs",
                    self.session_id,
                    last,
                    left,
                )
                if await self._sleep_or_stop(min(backoff * random.uniform(0.5, 1.5), left)):
                    return
                backoff = min(backoff * 2, lease / 6)

    def _fail(self, error: SessionError | ResourceClosedError) -> None:
        """Record why the turn cannot continue and interrupt its owner task."""
        if self._failure is not None:
            return
        self._failure = error
        if isinstance(error, LeaseLostError):
            log.error("%s", error.detail)
        if not self._exiting and self._task is not None and not self._task.done():
            self._cancel_requested = True
            self._task.cancel(msg=f"agent-stores: {error.code}")

    # -- exit -----------------------------------------------------------------------------

    @telemetry.turn_exit
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        # Set before any await: from now on a lease loss no longer cancels this task.
        self._exiting = True
        assert self.handle is not None and self.session is not None
        outer_cancel = False
        if self._cancel_requested and self._task is not None:
            outer_cancel = self._task.uncancel() > 0
        try:
            self._stopped = True
            if self._stop is not None:
                self._stop.set()
            if self._renew_timer is not None:
                self._renew_timer.cancel()
                self._renew_timer = None
            if self._renewer is not None:
                await asyncio.shield(self._renewer)
            failure = self._failure
            if failure is not None:
                if not isinstance(failure, LeaseLostError):
                    await self._release_quietly()
                cancelled = exc_type is not None and issubclass(exc_type, asyncio.CancelledError)
                if cancelled and (outer_cancel or not self._cancel_requested):
                    # Someone else cancelled this task too: their cancellation wins.
                    return False
                raise failure from exc
            if exc_type is None:
                replacement = self.session._replacement
                handle = self.handle
                catalog = self.catalog
                await self._retried_exit(
                    functools.partial(self.storage.save_and_release, handle, replacement, catalog)
                )
                return False
            await self._release_quietly()
            return False
        finally:
            self._finished = True
            self.store._turn_finished(self)
            if self._done is not None:
                self._done.set()

    async def _retried_exit(self, operation: Callable[[], Awaitable[None]]) -> None:
        """Run the turn's last write, retrying a transient failure while the lease lasts.

        A retry is safe: the storage settles the earlier attempt's unknown outcome first
        (its own write is recognised, never written twice). Without it a failed release
        would keep the session held until the lease expired.
        """
        assert self.handle is not None
        handle = self.handle
        backoff = 0.05
        while True:
            try:
                await self.locked_exit(operation)
                return
            except TransientStoreError as exc:
                left = self._must_stop_at(handle) - asyncio.get_running_loop().time()
                pause = backoff * random.uniform(0.5, 1.5)
                if left <= pause:
                    raise
                log.warning(
                    "session %r: the turn's last write failed (%s); retrying", self.session_id, exc
                )
                await asyncio.sleep(pause)
                backoff = min(backoff * 2, 1.0)

    async def locked_exit(self, operation: Callable[[], Awaitable[None]]) -> None:
        eager = _EAGER_TASK
        if eager is not None and self.store.kv.capabilities.answers_inline:
            # Finished without a round of the event loop when nothing waits for I/O.
            future = eager(asyncio.get_running_loop(), self._exit_write(operation))
        else:
            future = asyncio.ensure_future(self._exit_write(operation))
        if future.done():  # eager, and finished already: nothing left to shield
            future.result()
            return
        await _shielded(future)

    async def _exit_write(self, operation: Callable[[], Awaitable[None]]) -> None:
        lock = self._lock
        if lock is None:
            # No checkpoint or renewal ever wrote, and none can start now: the renewer is
            # stopped and a checkpoint finds the turn exiting (under the lock).
            await operation()
            return
        async with lock:
            await operation()

    async def _release_quietly(self) -> None:
        assert self.handle is not None
        handle = self.handle
        if handle.lost:
            return
        try:
            await self._retried_exit(lambda: self.storage.release(handle))
        except Exception as exc:
            log.warning(
                "session %r: could not release the lease (%s); it expires in %.1fs",
                self.session_id,
                exc,
                handle.lease_expires_at - self.storage.clock(),
            )

    def interrupt(self, error: ResourceClosedError) -> None:
        """Stop this turn from outside (store closing): its owner task is cancelled, nothing saved."""
        self._fail(error)


class SessionStore(KVBackedStore):
    """One active turn per session, on any KV backend; the generic implementation.

    ``SessionStore(kv, *, owns_kv=False, ttl_seconds=86_400, lease_seconds=30, ...)``.
    Usually opened with ``agent_stores.open_sessions(url)`` or ``connect(url).sessions()``.

    Options:

    ``ttl_seconds``
        Sliding expiry of an idle session (None: never). Every turn renews it.
    ``lease_seconds``
        How long a turn holds the session without renewal; renewed every third of it.
    ``poll_initial_seconds`` / ``poll_max_seconds``
        Jittered exponential backoff of a turn waiting for a busy session.
    ``handover_courtesy_seconds``
        After releasing a session, this store lets another client's waiting turn take it
        for this long before taking it again (default: twice ``poll_max_seconds``), plus
        six backend round trips as this store measures them, so a waiter on a slow or
        loaded backend still gets its turn.
    ``close_timeout_seconds``
        How long :meth:`aclose` waits for active turns before interrupting them.
    ``scope_prefix``
        Prefix of the KV scopes of sessions (isolates sessions from other stores' data).
    ``cache_bytes``
        Bound of this store's cache of decoded history chunks, in bytes of their JSON
        (default 64 MiB): size it to the histories served at once (docs/sessions.md).
    ``tail_bytes``, ``chunk_bytes``, ``fanout``
        History layout tuning; see :class:`~agent_stores.sessions.storage.KVSessionStorage`.
    ``catalog_prefix``
        Prefix of the KV scopes of the owners' indexes (``list_owner_sessions``); neither
        it nor ``scope_prefix`` may start with the other.
    ``port``
        The backend's native :class:`~agent_stores.sessions.port.SessionPort` (acquire +
        load, save + release). None: the one a plugin's ``session_port`` hook offers for
        ``kv``, else the generic :class:`~agent_stores.sessions.port.KVSessionPort`.
    """

    #: The storage layer class; a backend's native store overrides it.
    storage_class: ClassVar[type[KVSessionStorage]] = KVSessionStorage

    def __init__(
        self,
        kv: KVStore,
        *,
        owns_kv: bool = False,
        ttl_seconds: float | None = 86_400,
        lease_seconds: float = 30,
        poll_initial_seconds: float = 0.002,
        poll_max_seconds: float = 0.05,
        handover_courtesy_seconds: float | None = None,
        close_timeout_seconds: float = 30.0,
        scope_prefix: str = "session:",
        cache_bytes: int = 64 << 20,
        tail_bytes: int | None = None,
        chunk_bytes: int | None = None,
        fanout: int = 8,
        port: SessionPort | None = None,
        catalog_prefix: str = "session-owner:",
    ) -> None:
        if not isinstance(kv, KVStore):
            raise ConfigError(detail=f"SessionStore needs a KVStore, got {type(kv).__name__}")
        _positive("lease_seconds", lease_seconds)
        if ttl_seconds is not None:
            _positive("ttl_seconds", ttl_seconds)
            if ttl_seconds < 2 * lease_seconds:
                raise ConfigError(
                    detail=f"ttl_seconds ({ttl_seconds}) must be at least twice lease_seconds "
                    f"({lease_seconds}) so a session cannot expire under an active turn"
                )
        _positive("poll_initial_seconds", poll_initial_seconds)
        _positive("poll_max_seconds", poll_max_seconds)
        if close_timeout_seconds < 0:
            raise ConfigError(detail="close_timeout_seconds must be >= 0")
        if fanout < 2:
            raise ConfigError(detail="fanout must be >= 2")
        if not scope_prefix:
            raise ConfigError(detail="scope_prefix must not be empty")
        self.kv = kv
        self.owns_kv = owns_kv
        self.ttl_seconds = ttl_seconds
        self.lease_seconds = float(lease_seconds)
        self.poll_initial_seconds = poll_initial_seconds
        self.poll_max_seconds = poll_max_seconds
        self.close_timeout_seconds = close_timeout_seconds
        #: Identifies this store object in lease owners: ``host:pid:token``.
        self.store_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        courtesy = (
            handover_courtesy_seconds
            if handover_courtesy_seconds is not None
            else 2 * poll_max_seconds
        )
        self.storage = self.storage_class(
            kv,
            store_id=self.store_id,
            ttl_seconds=ttl_seconds,
            lease_seconds=self.lease_seconds,
            scope_prefix=scope_prefix,
            tail_bytes=tail_bytes,
            chunk_bytes=chunk_bytes,
            fanout=fanout,
            cache_bytes=cache_bytes,
            handover_courtesy_seconds=courtesy,
            waiter_hint_seconds=max(4 * poll_max_seconds, 2 * courtesy),
            port=port,
            catalog_prefix=catalog_prefix,
        )
        self._active: set[Turn] = set()
        # By session: the lock its tasks of this store queue on (None until a second one
        # comes: most turns meet no other), and how many hold or wait for it.
        self._queues: dict[str, tuple[asyncio.Lock | None, int]] = {}
        # Sessions this store had to wait for, and when it last released such a session
        # (event-loop time): taking a contended session straight back first looks for
        # clients queued for it (fair hand-over). Uncontended sessions never pay for it.
        self._contended: set[str] = set()
        self._released: dict[str, float] = {}
        self._closing = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} on {self.kv.describe()} lease={self.lease_seconds}s>"

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` has started."""
        return self._closing

    def _check_open(self) -> None:
        if self._closing:
            raise ResourceClosedError(detail=f"the session store on {self.kv.describe()} is closed")

    # -- turns ----------------------------------------------------------------------------

    def turn(
        self,
        session_id: str,
        timeout_seconds: float = 5.0,
        *,
        owner: str | None = None,
        title: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Turn:
        """Hold ``session_id`` exclusively for one turn: ``async with store.turn(id) as session``.

        Waits up to ``timeout_seconds`` for another turn to finish (then raises
        ``SESSION_BUSY``). Raises ``SESSION_RECOVERY_REQUIRED`` while an effect call is
        latched and ``SESSION_INVALID`` for unusable ids or corrupted data. The lease is
        renewed in the background; if it is lost the task running the block is cancelled
        and the block raises ``SESSION_LEASE_LOST``. On a clean exit the history given to
        :meth:`Session.replace` is saved and the session released, in one write.

        Catalog fields (``owner``, ``title``, ``tags``, ``metadata``; None keeps the stored
        value) are saved in that same write on a clean exit. A session with an owner is
        listed by :meth:`list_owner_sessions`; its owner's index is written just before
        that write when what a listing shows changed (one request).
        """
        self._check_open()
        self.storage.scope_for(session_id)
        if timeout_seconds < 0:
            raise ValueError("timeout_seconds must be >= 0")
        turn = Turn(self, session_id, timeout_seconds)
        update = CatalogUpdate.of(owner, title, tags, metadata)
        if update is not None:
            turn.set_catalog(update)
        return turn

    async def _acquire(
        self,
        session_id: str,
        timeout_seconds: float,
        *,
        allow_recovery: bool = False,
        load_history: bool = True,
    ) -> LeaseHandle:
        """Wait for the session (tasks of this store queue in FIFO order) and take its lease."""
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        lock = await self._queue_enter(session_id)
        try:
            try:
                # None: nobody else of this store holds or waits for it, so it is the
                # caller's at once (no lock, no timer).
                if lock is not None:
                    async with asyncio.timeout_at(deadline):
                        await lock.acquire()
            except TimeoutError:
                raise SessionBusyError(
                    f"session {session_id!r} stayed busy for {timeout_seconds}s "
                    "(another turn of this process holds it)",
                    session_id=session_id,
                ) from None
            try:
                return await self._acquire_remote(
                    session_id, deadline, allow_recovery=allow_recovery, load_history=load_history
                )
            except BaseException:
                self._queue_unlock(session_id)
                raise
        except BaseException:
            self._queue_leave(session_id)
            raise

    async def _acquire_remote(
        self, session_id: str, deadline: float, *, allow_recovery: bool, load_history: bool
    ) -> LeaseHandle:
        """Take the lease; once the session was found busy, wait in its queue of clients.

        The first attempt goes straight to the backend (an uncontended turn costs nothing
        more). After a ``Busy`` this store takes a ticket in the session's queue and tries
        again only while its ticket is the first one, so clients of different processes
        are served in arrival order.
        """
        loop = asyncio.get_running_loop()
        owner = f"{self.store_id}:{random_hex(4)}"
        ticket = await self._queue_behind_waiters(session_id)
        wait = _Wait(deadline, self.poll_initial_seconds, ticket, at_head=ticket is None)
        try:
            while True:
                self._check_open()
                attempt_started = loop.time()
                try:
                    # Only once our ticket (when we hold one) is first; None: not yet.
                    # Inline, not a coroutine of its own: each level of the await chain
                    # is resumed on every reply of the acquire.
                    if wait.ticket is not None:
                        await self._advance_in_queue(session_id, wait)
                    outcome: Acquired | Busy | None = None
                    if wait.at_head:
                        outcome = await self.storage.load_and_acquire(
                            session_id,
                            owner=owner,
                            allow_recovery=allow_recovery,
                            load_history=load_history,
                        )
                except TransientStoreError:
                    # Retrying with the same owner token is safe: if the lost answer was a
                    # successful acquire, the next attempt finds our own lease and continues.
                    # No attempt starts that would likely end past the turn's timeout: one
                    # that ran into the backend's deadline would take as long again.
                    took = loop.time() - attempt_started
                    if loop.time() + max(wait.delay, took) >= deadline:
                        raise
                    telemetry.record_retry("session.acquire", self.kv)
                    await asyncio.sleep(wait.next_pause(self.poll_max_seconds))
                    continue
                if isinstance(outcome, Acquired):
                    self._note_handover(session_id, wait)
                    return outcome.handle
                self._give_up_when_late(session_id, wait, outcome)
                if await self._announce_waiting(session_id, wait, outcome):
                    continue  # a ticket just taken: see where it stands at once
                await self._poll_pause(wait, outcome)
        except BaseException:
            if wait.hinted:
                # Nobody waits any more: the holder's store need not hold the session
                # back for us at its release (a native port's warm acquire may also
                # require that no hint is stored at all, expired or not).
                self.storage.withdraw_hint(session_id)
            raise
        finally:
            if wait.ticket is not None:
                self.storage.leave_queue(session_id, wait.ticket)

    async def _advance_in_queue(self, session_id: str, wait: _Wait) -> None:
        """Keep our ticket (there is one) alive and, until it is first, count the tickets
        still ahead of it."""
        assert wait.ticket is not None
        wait.ticket = await self.storage.keep_ticket(session_id, wait.ticket)
        if wait.at_head:
            return
        front = await self.storage.queue_front(session_id)
        ahead = sum(1 for key in front if key < wait.ticket.key)
        if ahead < wait.rank:
            # Moved up: the session may come free soon, poll promptly.
            wait.delay = self.poll_initial_seconds
        wait.rank = ahead
        # Tickets only join at the end, so the head stays the head.
        wait.at_head = ahead == 0

    def _note_handover(self, session_id: str, wait: _Wait) -> None:
        """Count a session passed on to us after it was found busy, and remember it as
        contended: taking it straight back after releasing it first looks for queued clients."""
        if wait.holder is not None or wait.ticket is not None:
            telemetry.record_handover(self.kv)
            self._contended.add(session_id)

    def _give_up_when_late(self, session_id: str, wait: _Wait, outcome: Busy | None) -> None:
        """Raise ``SESSION_BUSY`` once the turn's timeout has passed, naming the last holder seen."""
        if outcome is not None:
            wait.holder = outcome.holder or wait.holder
        if asyncio.get_running_loop().time() >= wait.deadline:
            who = f" by {wait.holder}" if wait.holder else ""
            raise SessionBusyError(
                f"session {session_id!r} stayed busy{who} for the whole timeout",
                session_id=session_id,
            )

    async def _announce_waiting(self, session_id: str, wait: _Wait, outcome: Busy | None) -> bool:
        """Leave the hand-over hint and, until we have one, take a ticket in the session's queue.

        True when a ticket was just taken.
        """
        # Leave our hint until it is known to be in place; then only when none is
        # (it expires after a while). A hint seen in the state read may be a stale
        # one of the holder itself, which would not make it hand over.
        want_hint = (
            outcome is not None
            and outcome.retry_after is None
            and not (outcome.waiter_hinted and wait.hinted)
        )
        if wait.ticket is None:
            return await self._join_queue(session_id, wait, want_hint=want_hint)
        if want_hint:
            wait.hinted = await self._leave_hint(session_id)
        return False

    async def _join_queue(self, session_id: str, wait: _Wait, *, want_hint: bool) -> bool:
        """Take a ticket, with the hint if wanted; True when the queue gave us a place."""
        # The hint goes out with the ticket, so the holder's store yields the session at
        # its next release instead of looping on it (one round trip).
        results = await asyncio.gather(
            self._take_ticket(session_id),
            self._leave_hint(session_id) if want_hint else _no_hint(),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        placed, noted = results
        if want_hint:
            wait.hinted = noted is True
        if not isinstance(placed, Ticket):
            return False  # no place in the queue: waiting works without it, only less fairly
        wait.ticket, wait.at_head, wait.rank = placed, False, 2
        return True

    async def _poll_pause(self, wait: _Wait, outcome: Busy | None) -> None:
        """Sleep until the next attempt, never past the deadline.

        Polls back off exponentially with jitter; a courtesy pause (we just released the
        session and someone else waits) is polled through the same way, so that if the
        other client takes the session we get it back in turn.
        """
        pause = wait.next_pause(self.poll_max_seconds)
        if outcome is not None and outcome.retry_after is not None:
            pause = min(pause, outcome.retry_after + random.uniform(0, self.poll_initial_seconds))
        remaining = wait.deadline - asyncio.get_running_loop().time()
        await asyncio.sleep(min(pause, max(remaining, 0.0)))

    async def waiting(self, session_id: str) -> list[str]:
        """The store ids of the clients waiting for ``session_id``, in the order they are served.

        A client is listed from the moment it first found the session busy until it takes
        it or gives up. Tasks of one store wait in that store's own FIFO queue behind its
        one entry.
        """
        self._check_open()
        return await self.storage.queue(session_id)

    async def _queue_enter(self, session_id: str) -> asyncio.Lock | None:
        """Count the caller in the session's queue; the lock to wait for, or None when the
        caller is alone (it holds the session at once)."""
        lock, users = self._queues.get(session_id, (None, 0))
        if not users:
            self._queues[session_id] = (None, 1)
            return None
        if lock is None:
            # The first holder took the session without a lock: made now and taken on its
            # behalf (a free lock's acquire returns without suspending, so nothing runs
            # in between).
            lock = asyncio.Lock()
            await lock.acquire()
        self._queues[session_id] = (lock, users + 1)
        return lock

    def _queue_unlock(self, session_id: str) -> None:
        """The holder lets the session go to the next task of this store (if any)."""
        lock, _ = self._queues[session_id]
        if lock is not None:
            lock.release()

    def _queue_leave(self, session_id: str) -> None:
        lock, users = self._queues[session_id]
        if users <= 1:
            del self._queues[session_id]
        else:
            self._queues[session_id] = (lock, users - 1)

    def _release_queue(self, session_id: str) -> None:
        self._note_released(session_id)
        self._queue_unlock(session_id)
        self._queue_leave(session_id)

    def _turn_finished(self, turn: Turn) -> None:
        if turn in self._active:
            self._active.discard(turn)
            self._release_queue(turn.session_id)

    def _note_released(self, session_id: str) -> None:
        if session_id not in self._contended:
            return
        self._contended.discard(session_id)
        now = asyncio.get_running_loop().time()
        if len(self._released) >= 1024:  # only the last fraction of a second matters
            courtesy = self.storage.courtesy_seconds
            self._released = {sid: at for sid, at in self._released.items() if now - at < courtesy}
        self._released[session_id] = now

    async def _queue_behind_waiters(self, session_id: str) -> Ticket | None:
        """A ticket if this store just released the session and other clients wait for it.

        Without it, a client looping on one session would take it straight back while
        the waiter at the head of the queue sleeps between polls.
        """
        released = self._released.pop(session_id, None)
        loop = asyncio.get_running_loop()
        if released is None or loop.time() - released >= self.storage.courtesy_seconds:
            return None
        try:
            if not await self.storage.queue_front(session_id, 1):
                return None
        except SessionError:
            return None  # the queue is for fairness only: go ahead without it
        return await self._take_ticket(session_id)

    async def _take_ticket(self, session_id: str) -> Ticket | None:
        """A place in the session's queue, or None if it cannot be had (fairness only)."""
        try:
            return await self.storage.enqueue(session_id)
        except SessionError:
            return None

    async def _leave_hint(self, session_id: str) -> bool:
        """The hand-over hint; False if it could not be left (it is a courtesy)."""
        try:
            return await self.storage.note_waiting(session_id)
        except SessionError:
            return False

    # -- administration -------------------------------------------------------------------

    @telemetry.traced("session.reset")
    async def reset(self, session_id: str, *, timeout_seconds: float = 5.0) -> bool:
        """Delete the session's history and recovery marker. True if it existed.

        Waits for an active turn like :meth:`turn` does. A session whose stored state
        cannot be decoded is erased too (that is the way out of ``SESSION_INVALID``).
        """
        self._check_open()
        self.storage.scope_for(session_id)
        try:
            handle = await self._acquire(
                session_id, timeout_seconds, allow_recovery=True, load_history=False
            )
        except InvalidSessionError:
            return await self.storage.force_reset(session_id)
        try:
            existed = handle.fence > 1 or bool(handle.header.chunks) or handle.header.tail_count > 0
            await self.storage.reset(handle)
            return existed
        finally:
            self._release_queue(session_id)

    @telemetry.traced("session.clear_recovery")
    async def clear_recovery(self, session_id: str, *, timeout_seconds: float = 5.0) -> bool:
        """Clear the recovery marker and keep the history. True if a marker was set.

        Call it after reconciling the effects listed by :meth:`inspect` by your own means.
        """
        self._check_open()
        self.storage.scope_for(session_id)
        if not await self.storage.exists(session_id):
            return False
        handle = await self._acquire(
            session_id, timeout_seconds, allow_recovery=True, load_history=False
        )
        try:
            return await self.storage.clear_recovery(handle)
        finally:
            self._release_queue(session_id)

    # -- forks and rewinds ------------------------------------------------------------------

    @telemetry.traced("session.fork")
    async def fork(
        self,
        source_id: str,
        new_id: str,
        *,
        at_turn: int | None = None,
        owner: str | None = None,
        title: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> ForkReport:
        """Create session ``new_id`` whose history is ``source_id``'s up to ``at_turn``.

        ``at_turn=None`` takes the whole committed history; ``at_turn=k`` the history
        before its ``k``-th user prompt (its first ``k`` turns). Takes no lease and never
        reads half a turn: while a turn of the source runs, the fork starts from the
        history as it was before that turn (``SESSION_BUSY`` if that turn rewrote it).

        Copy-on-write: the new session refers to the source's immutable history chunks
        and writes only its own state (and the messages of the one chunk a cut falls
        in), so the cost does not grow with the history. The shared chunks are pinned: no
        turn, reset, purge or expiry of the source deletes a chunk the fork still reads.
        Catalog fields are the source's unless given; when the fork's owner differs from
        the source's, every chunk is copied instead (erasing one owner never touches the
        other's session). Pending effect calls of a latched source inside the part taken
        latch the fork too. The lineage (source, fork point) is recorded in the new session
        (:meth:`inspect`, :meth:`lineage`). Raises :class:`SessionExistsError` when
        ``new_id`` exists, :class:`SessionNotFoundError` when ``source_id`` does not,
        ``ValueError`` for a turn past the end.
        """
        self._check_open()
        update = CatalogUpdate.of(owner, title, tags, metadata)
        return await self.storage.fork(source_id, new_id, at_turn=at_turn, catalog=update)

    @telemetry.traced("session.rewind")
    async def rewind(
        self, session_id: str, to_turn: int, *, timeout_seconds: float = 5.0
    ) -> BranchInfo:
        """Move the session back to its first ``to_turn`` turns, keeping what it held.

        A turn of its own: it waits for the lease like :meth:`turn` (``SESSION_BUSY``
        after ``timeout_seconds``), and a latched session raises
        ``SESSION_RECOVERY_REQUIRED`` (rewinding does not undo effects). The discarded
        history is kept as a branch (:meth:`branches`, :meth:`restore`); nothing is
        copied, the branch refers to the same chunks. Returns that branch.
        """
        return await self._held(
            session_id, timeout_seconds, lambda handle: self.storage.rewind(handle, to_turn)
        )

    @telemetry.traced("session.restore")
    async def restore(
        self, session_id: str, branch_id: str, *, timeout_seconds: float = 5.0
    ) -> BranchInfo:
        """Make the branch ``branch_id`` the session's history again (a turn of its own).

        The history it replaces becomes a branch in turn (returned), so a restore can be
        undone the same way. Raises :class:`BranchNotFoundError` for an unknown branch.
        """
        return await self._held(
            session_id, timeout_seconds, lambda handle: self.storage.restore(handle, branch_id)
        )

    @telemetry.traced("session.branches")
    async def branches(self, session_id: str) -> list[BranchInfo]:
        """The histories rewinds and restores of the session set aside, oldest first."""
        self._check_open()
        return await self.storage.branches(session_id)

    @telemetry.traced("session.lineage")
    async def lineage(self, session_id: str) -> list[dict[str, Any]]:
        """Where a forked session came from: ``{"session_id", "source", "count", "turn",
        "at"}`` for it, then for its source if that was forked too, and so on."""
        self._check_open()
        return await self.storage.lineage(session_id)

    async def _held(
        self,
        session_id: str,
        timeout_seconds: float,
        operation: Callable[[LeaseHandle], Awaitable[T]],
    ) -> T:
        """Run ``operation`` on the session's lease, taken like a turn takes it; the
        operation's own write releases it, anything else releases it unchanged."""
        self._check_open()
        self.storage.scope_for(session_id)
        if not await self.storage.exists(session_id):
            raise SessionNotFoundError(
                f"session {session_id!r} does not exist", session_id=session_id
            )
        handle = await self._acquire(session_id, timeout_seconds)
        try:
            return await operation(handle)
        except BaseException:
            if not handle.lost:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.storage.release(handle))
            raise
        finally:
            self._release_queue(session_id)

    @telemetry.traced("session.inspect")
    async def inspect(self, session_id: str) -> SessionInfo | None:
        """History length, lease holder and expiry, pending effect calls; None if absent. No lease taken."""
        self._check_open()
        return await self.storage.inspect(session_id)

    @telemetry.traced("session.read_messages")
    async def read_messages(self, session_id: str) -> list[ModelMessage] | None:
        """A snapshot of the saved history without taking the lease (None if absent)."""
        self._check_open()
        return await self.storage.read_messages(session_id)

    @telemetry.traced("session.list_owner")
    async def list_owner_sessions(
        self,
        owner: str,
        *,
        limit: int = 20,
        cursor: str | None = None,
        tags: Sequence[str] | None = None,
        order: str = "recent",
    ) -> SessionPage:
        """The owner's sessions, most recent activity first: one page and the next page's cursor.

        Served from the owner's index: one range read and one batched read per page (more
        only when ``tags`` filters entries out, or stale entries are skipped), never a read
        of other owners' data nor of any history. ``tags``: only sessions carrying all of
        them. Cursors are opaque; a session that becomes more recent while you page moves
        to the front (it is not repeated on a later page).
        """
        self._check_open()
        if order != "recent":
            raise ValueError(f"order must be 'recent', got {order!r}")
        if limit < 1:
            raise ValueError("limit must be >= 1")
        return await self.storage.list_owner(owner, limit=limit, cursor=cursor, tags=tags)

    async def set_catalog(
        self,
        session_id: str,
        *,
        owner: str | None = None,
        title: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        timeout_seconds: float = 5.0,
    ) -> bool:
        """Set catalog fields of an existing session outside a turn (takes its lease briefly).

        False when the session does not exist (nothing is created).
        """
        self._check_open()
        if CatalogUpdate.of(owner, title, tags, metadata) is None:
            raise ValueError("set_catalog needs at least one of owner, title, tags, metadata")
        if not await self.storage.exists(session_id):
            return False
        async with self.turn(
            session_id, timeout_seconds, owner=owner, title=title, tags=tags, metadata=metadata
        ):
            pass
        return True

    @telemetry.traced("session.purge_idle")
    async def purge_idle(
        self, idle_seconds: float, *, include_latched: bool = False, prefix: str = ""
    ) -> IdlePurge:
        """Retention: delete every session no turn has used for ``idle_seconds``.

        For stores without a TTL (``ttl_seconds=None``), or a shorter retention than the
        TTL, on any backend (no native expiry needed). Walks every session once (an admin
        operation); a session a turn uses meanwhile is kept; latched sessions (pending
        effect calls) are kept and listed unless ``include_latched``. ``prefix``: only
        session ids starting with it. Idempotent: run it again after a crash.
        """
        self._check_open()
        _positive("idle_seconds", idle_seconds)
        return await self.storage.purge_idle(
            idle_seconds, include_latched=include_latched, prefix=prefix
        )

    @telemetry.traced("session.erase_owner")
    async def erase_owner(self, owner: str) -> OwnerErasure:
        """Erase every session of ``owner`` (state, history, latch, queue, index) and verify.

        Resumable and idempotent: an erase cut off anywhere (a killed process) is finished
        by running it again, and a second erase finds nothing. While it runs, a turn that
        would save a session of the owner is refused (:class:`OwnerErasingError`) and a turn
        already holding one loses its lease (``SESSION_LEASE_LOST``): nothing it had not
        saved is kept. The report lists the sessions erased and the entries left in every
        scope read back afterwards (0: complete). Only this store's sessions: memory and
        run journals are not touched.
        """
        self._check_open()
        return await self.storage.erase_owner(owner)

    @telemetry.traced("session.list")
    async def list_sessions(
        self,
        prefix: str = "",
        *,
        start_after: str | None = None,
        limit: int = 100,
        latched_only: bool = False,
    ) -> list[SessionInfo]:
        """Sessions whose id starts with ``prefix``, in byte order (admin use: may be slow).

        Latched sessions (pending effect calls) are included; ``latched_only`` keeps only
        them. Page with ``start_after=<last session_id>``. To list one owner's sessions use
        :meth:`list_owner_sessions`, which reads only that owner's index.
        """
        self._check_open()
        out: list[SessionInfo] = []
        cursor = start_after
        while True:
            page = await self.storage.list_sessions(prefix, start_after=cursor, limit=limit)
            out.extend(i for i in page if i.recovery_required or i.problem or not latched_only)
            if len(page) < limit or len(out) >= limit:
                return out[:limit]
            cursor = page[-1].session_id

    # -- closing --------------------------------------------------------------------------

    async def aclose(self, timeout_seconds: float | None = None) -> None:
        """Stop accepting turns, wait for active ones (up to ``close_timeout_seconds``), close.

        Turns still active after the timeout are interrupted: their tasks are cancelled,
        they save nothing and raise ``RESOURCE_CLOSED``. Closes the KV store when the
        store owns it. Idempotent.
        """
        if self._closed:
            return
        self._closing = True
        timeout = self.close_timeout_seconds if timeout_seconds is None else timeout_seconds
        current = asyncio.current_task()
        others = [t for t in self._active if t._task is not current]
        if others:
            waiters = [asyncio.ensure_future(t._done_event().wait()) for t in others]
            _, pending = await asyncio.wait(waiters, timeout=timeout)
            if pending:
                for turn in others:
                    if not turn._done_event().is_set():
                        turn.interrupt(
                            ResourceClosedError(
                                detail=f"session {turn.session_id!r}: the store closed while the "
                                "turn was active; nothing was saved"
                            )
                        )
                await asyncio.wait(pending, timeout=max(self.lease_seconds, 1.0))
                for waiter in pending:
                    waiter.cancel()
        await self.storage.drain()
        self._closed = True
        if self.owns_kv:
            await self.kv.aclose()


#: ``asyncio.eager_task_factory`` (Python 3.12+): the task runs at once until it first waits.
_EAGER_TASK: Callable[..., asyncio.Task[Any]] | None = getattr(asyncio, "eager_task_factory", None)


#: The context of :func:`_settle` callbacks, which read no context variable: a callback
#: added without one runs in a copy of the caller's, made per callback.
_NO_CONTEXT = contextvars.Context()


def _shielded(inner: asyncio.Future[T]) -> asyncio.Future[T]:
    """``asyncio.shield(inner)``: a future settled as ``inner`` is, whose cancellation (the
    caller's) leaves ``inner`` running; ``inner``'s outcome is retrieved either way (no
    "never retrieved" warning). One callback where ``shield`` and a retrieving callback
    add three, each with its own copy of the context: a turn's last write waits on it,
    and what a waiting turn holds is what the garbage collector walks."""
    outer: asyncio.Future[T] = inner.get_loop().create_future()
    inner.add_done_callback(functools.partial(_settle, outer), context=_NO_CONTEXT)
    return outer


def _settle(outer: asyncio.Future[T], inner: asyncio.Future[T]) -> None:
    if inner.cancelled():
        if not outer.done():
            outer.cancel()
        return
    error = inner.exception()
    if outer.done():  # the caller was cancelled: nobody waits for the outcome
        return
    if error is not None:
        outer.set_exception(error)
    else:
        outer.set_result(inner.result())


def _positive(name: str, value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ConfigError(detail=f"{name} must be a positive number, got {value!r}")


async def _no_hint() -> bool:
    return False
