"""What ``SessionStore.inspect`` and the admin listing report about a session."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import EffectCall


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A read-only summary of one stored session (no messages are loaded to build it).

    Times are unix seconds on the store's clock.
    """

    session_id: str
    message_count: int
    """Messages in the saved history."""
    chunk_count: int
    """Immutable history chunks the history is spread over (plus the inline tail)."""
    stored_bytes: int
    """JSON bytes of the saved history."""
    lease_owner: str | None
    """Who holds the session (``host:pid:token``) while a turn is active, else None."""
    lease_expires_at: float | None
    """When the current lease runs out unless renewed (None: not leased)."""
    fence: int
    """How many times the session was acquired; increases with every turn."""
    pending_effects: tuple[EffectCall, ...]
    """Effect tool calls (name, call id) whose success is not recorded: non-empty means latched."""
    recovery_since: float | None
    """When the first pending effect call was marked."""
    created_at: float
    updated_at: float
    expires_at: float | None
    """When the session expires unless used again (None: never)."""
    problem: str | None = None
    """Set (and everything else is zero) when the stored state cannot be decoded."""
    owner: str | None = None
    """The subject the session belongs to (``turn(..., owner=...)``), if set."""
    title: str | None = None
    tags: tuple[str, ...] = ()
    forked_from: str | None = None
    """The session this one was forked from (``SessionStore.fork``), if it was."""
    fork_point: int | None = None
    """How many of the source's messages the fork started with."""
    usage: dict[str, Any] = field(default_factory=dict)
    """The conversation's running usage as ``session.save(result)`` kept it (JSON: requests,
    input_tokens, output_tokens, tool_calls, …); empty for a session only ever replaced."""
    pending_deferred: tuple[tuple[str, str, str], ...] = ()
    """The deferred tool calls the last saved run paused on: (tool name, call id, ``approval``
    or ``external``), never their arguments."""

    @property
    def recovery_required(self) -> bool:
        """True while the recovery marker holds effect calls: the next turn raises SESSION_RECOVERY_REQUIRED."""
        return bool(self.pending_effects)

    def lease_active(self, now: float) -> bool:
        """True when a turn holds the session at ``now``."""
        return self.lease_expires_at is not None and self.lease_expires_at > now
