"""The errors a session store raises, each an :class:`~agent_stores.errors.AppError` with a session code.

Every error names the session it is about. Callers branch on ``error.code``
(:class:`~agent_stores.errors.ErrorCode`), exactly as Cortex users branched on
``CodigoError``; the mapping is in ``docs/sessions.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..errors import AppError, ErrorCode, Severity


class EffectCall(NamedTuple):
    """An effect tool call recorded by the recovery marker: the tool's name and call id, never its arguments."""

    tool_name: str
    tool_call_id: str


class SessionError(AppError):
    """Base of the session errors; ``session_id`` names the session concerned."""

    def __init__(self, detail: str = "", *, session_id: str = "") -> None:
        super().__init__(detail=detail)
        self.session_id = session_id


class SessionBusyError(SessionError, TimeoutError):
    """Another turn held the session for the whole ``timeout_seconds`` (``SESSION_BUSY``)."""

    default_code = ErrorCode.SESSION_BUSY
    default_severity = Severity.WARNING


class LeaseLostError(SessionError):
    """The turn's lease was taken over or could not be renewed in time (``SESSION_LEASE_LOST``).

    Nothing the turn had not already checkpointed was saved.
    """

    default_code = ErrorCode.SESSION_LEASE_LOST


class RecoveryRequiredError(SessionError):
    """An effect tool may have run without its result being recorded (``SESSION_RECOVERY_REQUIRED``).

    ``pending_effects`` lists the marked calls (names and ids). Reconcile the effects by
    your own means, then call ``store.clear_recovery(session_id)`` (keeps the history) or
    ``store.reset(session_id)`` (deletes it).
    """

    default_code = ErrorCode.SESSION_RECOVERY_REQUIRED

    def __init__(
        self, detail: str = "", *, session_id: str = "", pending_effects: Sequence[EffectCall] = ()
    ) -> None:
        super().__init__(detail, session_id=session_id)
        self.pending_effects = tuple(pending_effects)


class InvalidSessionError(SessionError, ValueError):
    """A session id is unusable, or the session's stored data cannot be decoded (``SESSION_INVALID``).

    Stored data is never overwritten because of this error: inspect it, then ``reset`` the
    session to start over.
    """

    default_code = ErrorCode.SESSION_INVALID
    default_severity = Severity.CRITICAL


class SessionStoreError(SessionError):
    """The backend failed during a session operation (``SESSION_STORE_FAILURE``); see ``__cause__``."""

    default_code = ErrorCode.SESSION_STORE_FAILURE
    default_severity = Severity.CRITICAL


class OwnerErasingError(SessionStoreError):
    """The session's owner is being erased (``erase_owner``): the turn was refused, nothing
    of it was saved (``SESSION_STORE_FAILURE``)."""


class TransientStoreError(SessionStoreError):
    """The backend could not be reached or timed out (``SESSION_STORE_UNAVAILABLE``); the
    same operation may succeed if retried.

    Its own code tells it from a configuration or programming failure
    (``SESSION_STORE_FAILURE``) without parsing messages.

    The lease renewer retries these while the lease is still valid.
    """

    default_code = ErrorCode.SESSION_STORE_UNAVAILABLE


class SessionNotFoundError(InvalidSessionError, LookupError):
    """The session does not exist (``SESSION_INVALID``): nothing to fork, rewind or restore."""


class SessionExistsError(InvalidSessionError):
    """A fork's new session id is taken (``SESSION_INVALID``): a fork never overwrites a session."""


class BranchNotFoundError(InvalidSessionError, LookupError):
    """The session has no branch of that id (``SESSION_INVALID``): see ``branches()``."""


class TurnOutOfRangeError(InvalidSessionError):
    """A fork or rewind point past the end of the history, or not a turn number
    (``SESSION_INVALID``; a ``ValueError``)."""
