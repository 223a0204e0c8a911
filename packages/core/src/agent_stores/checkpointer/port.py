"""The native port of the checkpointer: appending an entry to a run's log in one commit.

Every append to a run's journal or step-event log is two writes: advance the log's
position counter (``head/<log>``) by one CAS, and create the entry under its idempotency
key (a duplicate is found, not written). The generic path does them one after the other
with KV primitives (and gives the position back on a duplicate). A backend with
transactions implements :class:`JournalPort` with ``atomic = True`` and does both in one
transaction, and returns it from its ``journal_port`` hook, which every
:class:`~agent_stores.checkpointer.Checkpointer` (and
:class:`~agent_stores.checkpointer.KVStepStore`) built without an explicit port asks::

    @hookimpl
    def journal_port(kv):
        return MyJournalPort(kv) if isinstance(kv, MyKV) else None

Positions, idempotency, chunking of large records, TTL anchoring and replay stay in the
core and run unchanged over every port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..errors import ConflictError
from ..kv.base import Create, Entry, Operation, Replace

if TYPE_CHECKING:
    from ..kv.base import KVStore


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """Advance ``head_key`` and create ``key``, unless ``key`` already exists."""

    scope: str
    #: the log's position counter and its new value
    head_key: str
    head_value: bytes
    #: the counter's current version; None: the counter must be absent (a new log)
    head_version: str | None
    #: the entry (idempotency key) and its bytes
    key: str
    value: bytes
    #: TTL of both writes (None: no expiry)
    ttl: float | None


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """What :meth:`JournalPort.append` did."""

    #: the entry's version when this call created it; None when it did not
    created_version: str | None
    #: the counter's new version when it was advanced (even if the entry then turned out
    #: to exist: a concurrent append created it; the position stays a gap)
    head_version: str | None
    #: the entry already stored under ``key``, when known (None: read it back)
    existing: Entry | None


def check_append(kv: KVStore, request: AppendRequest) -> None:
    """Refuse, before anything is written, all that the public KV API would refuse in
    ``request``, in the core's two-step order: a closed client; the counter, then the entry
    (id, then size); the TTL. A native port calls this first."""
    kv.check_open()
    kv.check_ids(request.scope, request.head_key)
    kv.check_value(request.scope, request.head_key, request.head_value)
    kv.check_ids(request.scope, request.key)
    kv.check_value(request.scope, request.key, request.value)
    kv.expires_at(request.ttl, kv.clock())


@runtime_checkable
class JournalPort(Protocol):
    """The checkpointer operation a backend may implement natively."""

    #: True when :meth:`append` is one transaction (the core then uses it for appends)
    atomic: bool

    async def append(self, request: AppendRequest) -> AppendOutcome:
        """If ``key`` exists, return it and write nothing; else advance the counter (its
        condition failing raises ConflictError, nothing written) and create ``key``."""
        ...


class KVJournalPort:
    """The default: not atomic, so the core allocates a position with one CAS on the counter
    and then creates the entry (giving the position back on a duplicate)."""

    atomic = False

    async def append(self, request: AppendRequest) -> AppendOutcome:  # pragma: no cover
        """Never called: the core runs its generic two-step algorithm instead."""
        raise NotImplementedError("the generic journal port appends through RunSpace")


class CommitJournalPort:
    """An atomic :class:`JournalPort` for any KV store whose ``commit`` is one transaction
    (``capabilities.commit``): the counter and the entry in one commit, so an append is one
    request where a commit is one (a Firestore Commit, DynamoDB's TransactWriteItems).

    When the commit fails its conditions, nothing was written and one read tells which
    failed: the entry is already stored (a duplicate: returned) or the counter moved
    (:class:`~agent_stores.errors.ConflictError`; the core reads it and tries again). A
    backend offers it from its ``journal_port`` hook::

        @hookimpl
        def journal_port(kv):
            return CommitJournalPort(kv) if isinstance(kv, MyKV) else None
    """

    atomic = True

    def __init__(self, kv: KVStore) -> None:
        if not kv.capabilities.commit:
            raise ValueError(f"{type(kv).__name__} has no atomic commit (capabilities.commit)")
        self.kv = kv

    async def append(self, request: AppendRequest) -> AppendOutcome:
        """See :meth:`JournalPort.append`."""
        check_append(self.kv, request)
        head: Operation
        if request.head_version is None:
            head = Create(request.head_key, request.head_value, ttl=request.ttl)
        else:
            head = Replace(
                request.head_key, request.head_value, request.head_version, ttl=request.ttl
            )
        entry = Create(request.key, request.value, ttl=request.ttl)
        try:
            versions = await self.kv.commit(request.scope, [head, entry])
        except ConflictError:
            existing = await self.kv.get(request.scope, request.key)
            if existing is not None:
                return AppendOutcome(None, None, existing)
            raise
        return AppendOutcome(versions[1], versions[0], None)
