"""Session store: one active turn per session, on any backend.

Usage (the Pydantic AI ``Agent`` stays yours; the store only keeps the history)::

    from agent_stores import open_sessions

    async with open_sessions("sqlite:///agent.db") as sessions:
        async with sessions.turn("user:42") as session:
            result = await agent.run(
                "Remember that my favourite colour is green.",
                message_history=session.messages,
                conversation_id=session.session_id,
            )
            session.replace(result.all_messages())

Guarantees: while a turn holds its lease no other task or process can use the same
session (different sessions stay concurrent); the lease is renewed in the background and,
if it is lost, the task running the turn is cancelled and ``SESSION_LEASE_LOST`` raised;
every write is a compare-and-swap fenced by the session's state version, so a stale owner
can never save. ``replace()`` is explicit: not called, nothing changes; the block raises,
nothing is saved; checkpoints stay; a failed save raises.

Layers (for backend authors):

* :class:`SessionStore` (``store.py``) — the public API and everything that is not
  storage: the per-process FIFO queue of turns on one session, polling with jittered
  backoff, the renewal task, cancelling the owner on lease loss, draining on close.
* :class:`KVSessionStorage` (``storage.py``) — every read and state transition, written
  once on the KV CAS base class: ``load_and_acquire`` (get + one CAS, chunk reads in
  parallel), ``renew``, ``mark_effects``, ``checkpoint``, ``save_and_release`` (chunk
  writes + one CAS), ``release``, ``reset``, ``clear_recovery``, ``force_reset``,
  ``note_waiting``, ``inspect``, ``read_messages``, ``list_sessions``.
* ``records.py`` — the stored layout (one ``state`` record per session: lease, fence,
  chunk list, inline tail, recovery marker; immutable ``h/<id>/<part>`` chunks) and the
  message encoding (``ModelMessagesTypeAdapter``). ``cache.py`` — decoded chunks cached by
  key (they never change).

* ``port.py`` — the native port: :class:`SessionPort` (``acquire`` + load in one round
  trip, ``save`` of chunks + fenced state), the generic :class:`KVSessionPort`; backend
  authors import its types from :mod:`agent_stores.backend`.

A backend with a native path (acquire + load in one Redis script, save + release in one
PostgreSQL statement) implements :class:`SessionPort` and returns it from its
``session_port`` hook.
Everything else — waiting, renewal, cancellation, checkpoints, the recovery latch, the
capabilities — stays the core's, and the session contract suite must pass as is.
"""

from __future__ import annotations

from .catalog import IdlePurge, OwnerErasure, SessionPage, SessionSummary
from .errors import (
    BranchNotFoundError,
    EffectCall,
    InvalidSessionError,
    LeaseLostError,
    OwnerErasingError,
    RecoveryRequiredError,
    SessionBusyError,
    SessionError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStoreError,
    TransientStoreError,
    TurnOutOfRangeError,
)
from .forks import BranchInfo, ForkReport
from .info import SessionInfo
from .port import KVSessionPort, SessionPort
from .store import Session, SessionStore, Turn

# The user API. Backend authors find the port types (and the KV base) in
# ``agent_stores.backend``; ``SessionPort`` and ``KVSessionPort`` are here too because
# ``SessionStore(kv, port=...)`` takes one.
__all__ = [
    "BranchInfo",
    "BranchNotFoundError",
    "EffectCall",
    "ForkReport",
    "IdlePurge",
    "InvalidSessionError",
    "KVSessionPort",
    "LeaseLostError",
    "OwnerErasingError",
    "OwnerErasure",
    "RecoveryRequiredError",
    "Session",
    "SessionBusyError",
    "SessionError",
    "SessionExistsError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionPage",
    "SessionPort",
    "SessionStore",
    "SessionStoreError",
    "SessionSummary",
    "TransientStoreError",
    "Turn",
    "TurnOutOfRangeError",
]
