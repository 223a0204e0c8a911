"""Retention policies: what a store may forget, declared once, applied by ``purge`` or the API.

A policy is a short text, ``"sessions-idle=90d runs-keep=20 quarantine=30d"`` (items
separated by spaces or commas; durations in ``d``, ``h``, ``m`` or ``s``), given to
``agent-stores purge URL --policy …`` or kept in ``$AGENT_STORES_RETENTION``:

``sessions-idle=DURATION``
    sessions no turn used for that long (:meth:`SessionStore.purge_idle`); add
    ``include-latched`` to delete idle sessions waiting for recovery too;
``runs-keep=N``
    in every conversation, runs past its N most recent (:meth:`Checkpointer.keep_latest_runs`);
``quarantine=DURATION``
    records quarantined by ``doctor --repair`` longer ago (:func:`damage.purge_quarantined`);
``memory-age=DURATION``
    memory files not written for that long, in every namespace
    (:meth:`KVMemoryStore.purge_older_than`; its ``prefix=`` limits it to one namespace);
``conversations-idle=DURATION``
    Pydantic AI conversations (``open_conversations``) not saved for that long
    (:meth:`KVConversationStore.purge_idle`).

Each part works on backends without native expiry, reports what it deleted, and is
finished by running it again after an interruption.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .damage import purge_quarantined

if TYPE_CHECKING:
    from .checkpointer import Checkpointer, RunRetention
    from .conversations import KVConversationStore
    from .conversations.store import ConversationPurge
    from .kv.base import KVStore
    from .memory import KVMemoryStore
    from .memory.store import MemoryRetention
    from .sessions import IdlePurge, SessionStore

#: The environment variable ``purge`` reads a policy from when ``--policy`` is not given.
POLICY_ENV = "AGENT_STORES_RETENTION"

_UNITS = {"d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([dhms])$")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """What to delete; None leaves that kind of data alone."""

    sessions_idle_seconds: float | None = None
    include_latched: bool = False
    runs_keep: int | None = None
    quarantine_seconds: float | None = None
    memory_age_seconds: float | None = None
    conversations_idle_seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> RetentionPolicy:
        """A policy from its text; ``ValueError`` naming the item it cannot read."""
        policy = cls()
        for item in filter(None, re.split(r"[\s,]+", text.strip())):
            name, sep, value = item.partition("=")
            if name == "include-latched" and not sep:
                policy = replace(policy, include_latched=True)
            elif name == "sessions-idle" and sep:
                policy = replace(policy, sessions_idle_seconds=_duration(item, value))
            elif name == "quarantine" and sep:
                policy = replace(policy, quarantine_seconds=_duration(item, value))
            elif name == "memory-age" and sep:
                policy = replace(policy, memory_age_seconds=_duration(item, value))
            elif name == "conversations-idle" and sep:
                policy = replace(policy, conversations_idle_seconds=_duration(item, value))
            elif name == "runs-keep" and sep:
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"{item!r}: runs-keep needs a whole number >= 1")
                policy = replace(policy, runs_keep=int(value))
            else:
                raise ValueError(
                    f"unknown retention item {item!r}; expected sessions-idle=DURATION, "
                    "include-latched, runs-keep=N, quarantine=DURATION, memory-age=DURATION "
                    "or conversations-idle=DURATION"
                )
        if policy.include_latched and policy.sessions_idle_seconds is None:
            raise ValueError("include-latched needs sessions-idle=DURATION")
        return policy

    def merged(self, other: RetentionPolicy) -> RetentionPolicy:
        """This policy with every item ``other`` sets taken from ``other``."""
        return RetentionPolicy(
            other.sessions_idle_seconds
            if other.sessions_idle_seconds is not None
            else self.sessions_idle_seconds,
            self.include_latched or other.include_latched,
            other.runs_keep if other.runs_keep is not None else self.runs_keep,
            other.quarantine_seconds
            if other.quarantine_seconds is not None
            else self.quarantine_seconds,
            other.memory_age_seconds
            if other.memory_age_seconds is not None
            else self.memory_age_seconds,
            other.conversations_idle_seconds
            if other.conversations_idle_seconds is not None
            else self.conversations_idle_seconds,
        )

    @property
    def empty(self) -> bool:
        return (
            self.sessions_idle_seconds is None
            and self.runs_keep is None
            and self.quarantine_seconds is None
            and self.memory_age_seconds is None
            and self.conversations_idle_seconds is None
        )


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What :func:`apply_retention` deleted, per part of the policy (None: not applied)."""

    sessions: IdlePurge | None = None
    runs: RunRetention | None = None
    quarantined: tuple[str, ...] | None = None
    memory: MemoryRetention | None = None
    conversations: ConversationPurge | None = None


async def apply_retention(
    policy: RetentionPolicy,
    *,
    kv: KVStore | None = None,
    sessions: SessionStore | None = None,
    checkpointer: Checkpointer | None = None,
    memory: KVMemoryStore | None = None,
    conversations: KVConversationStore | None = None,
) -> RetentionReport:
    """Apply each part of ``policy`` to the store it concerns (``ValueError`` if one is missing)."""
    report = RetentionReport()
    if policy.quarantine_seconds is not None:
        if kv is None:
            raise ValueError("the policy deletes quarantined records: pass kv=")
        found = await purge_quarantined(kv, policy.quarantine_seconds)
        report = replace(report, quarantined=tuple(found))
    if policy.runs_keep is not None:
        if checkpointer is None:
            raise ValueError("the policy keeps the latest runs: pass checkpointer=")
        report = replace(report, runs=await checkpointer.keep_latest_runs(policy.runs_keep))
    if policy.memory_age_seconds is not None:
        if memory is None:
            raise ValueError("the policy deletes old memory files: pass memory=")
        report = replace(report, memory=await memory.purge_older_than(policy.memory_age_seconds))
    if policy.conversations_idle_seconds is not None:
        if conversations is None:
            raise ValueError("the policy deletes idle conversations: pass conversations=")
        purged = await conversations.purge_idle(policy.conversations_idle_seconds)
        report = replace(report, conversations=purged)
    if policy.sessions_idle_seconds is not None:
        if sessions is None:
            raise ValueError("the policy deletes idle sessions: pass sessions=")
        idle = await sessions.purge_idle(
            policy.sessions_idle_seconds, include_latched=policy.include_latched
        )
        report = replace(report, sessions=idle)
    return report


def _duration(item: str, value: str) -> float:
    match = _DURATION.match(value)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{item!r}: expected a duration such as 90d, 12h, 30m or 45s")
    return float(match.group(1)) * _UNITS[match.group(2)]
