"""Erase a subject everywhere: sessions, memory namespaces, runs and quarantined copies.

:func:`erase_subject` is one resumable, idempotent pass over the stores it is given, all
on one KV store (see :mod:`agent_stores.subjects` for how each records its subject):

1. the subject's scope gets the erasing marker: from then on a memory write under one of
   its namespaces, a run registered for it, and (through the owner's index) a turn of one
   of its sessions are refused;
2. the subject's sessions are copied into its scope as conversations, so the runs of
   those conversations are still found by an erase resumed after the sessions are gone;
3. the sessions are erased (:meth:`SessionStore.erase_owner`: a turn holding one loses
   its lease and saves nothing), then the Pydantic AI conversations saved with the
   subject as their scope (recorded in its scope first, for their runs, then deleted
   with their pointers: :meth:`KVConversationStore.erase_scope`);
4. each memory namespace is erased (:meth:`KVMemoryStore.erase_namespace`), then each run
   (:meth:`Checkpointer.delete_run`) recorded for the subject, of its conversations, and
   of runs those started;
5. quarantined copies of records from any of those scopes are deleted;
6. every scope is read back; each entry of the subject's scope goes once what it names
   is verified gone, and the marker goes last, when nothing is left.

An erase cut off anywhere (a killed process) is finished by running it again, which the
report says (``resumed``); a second erase finds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .damage import purge_quarantined
from .errors import ConfigError
from .subjects import DEFAULT_SUBJECT_PREFIX, SubjectEntry, SubjectIndex, check_subject

if TYPE_CHECKING:
    from .checkpointer import Checkpointer
    from .conversations import KVConversationStore
    from .kv.base import KVStore
    from .memory import KVMemoryStore
    from .sessions import SessionStore

log = logging.getLogger("agent_stores.erasure")

#: Passes over the subject's entries: a write that recorded a new entry just before the
#: marker is found by the next pass.
_PASSES = 3


@dataclass(frozen=True, slots=True)
class SubjectErasure:
    """What :func:`erase_subject` removed and verified: keep it as evidence."""

    subject: str
    sessions: tuple[str, ...]
    namespaces: tuple[str, ...]
    """Memory namespaces erased, as ``<store scope prefix><namespace>``."""
    runs: tuple[str, ...]
    quarantined: int
    """Quarantined copies deleted."""
    scopes_checked: int
    """KV scopes read back afterwards (sessions, owner index, namespace directories,
    runs, the subject's own scope)."""
    entries_left: int
    """Entries found in those scopes afterwards; 0 means the erase is complete."""
    resumed: bool
    started_at: float
    finished_at: float
    not_erased: tuple[str, ...] = field(default=())
    """Recorded entries no store given to the erase holds (counted in ``entries_left``):
    a memory namespace or run of a store with another scope prefix."""
    conversations: tuple[str, ...] = field(default=())
    """Pydantic AI conversations (``open_conversations``) saved with the subject as scope."""
    kept_for_forks: int = 0
    """Entry segments of those conversations kept because a conversation of another scope
    was forked from them (that conversation's history now, not erased with the subject)."""

    @property
    def complete(self) -> bool:
        return self.entries_left == 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for an audit log."""
        return {
            "subject": self.subject,
            "sessions": list(self.sessions),
            "namespaces": list(self.namespaces),
            "runs": list(self.runs),
            "quarantined": self.quarantined,
            "scopes_checked": self.scopes_checked,
            "entries_left": self.entries_left,
            "complete": self.complete,
            "resumed": self.resumed,
            "not_erased": list(self.not_erased),
            "conversations": list(self.conversations),
            "kept_for_forks": self.kept_for_forks,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


@dataclass
class _Progress:
    sessions: dict[str, None] = field(default_factory=dict)
    conversations: dict[str, None] = field(default_factory=dict)
    kept_for_forks: int = 0
    namespaces: dict[str, None] = field(default_factory=dict)
    runs: dict[str, None] = field(default_factory=dict)
    not_erased: dict[str, None] = field(default_factory=dict)
    origins: set[str] = field(default_factory=set)
    origin_prefixes: set[str] = field(default_factory=set)
    scopes_checked: int = 0
    left: int = 0


async def erase_subject(
    subject: str,
    *,
    sessions: SessionStore | None = None,
    memory: KVMemoryStore | Sequence[KVMemoryStore] = (),
    checkpointer: Checkpointer | None = None,
    kv: KVStore | None = None,
    subject_prefix: str | None = None,
    conversations: KVConversationStore | None = None,
) -> SubjectErasure:
    """Erase everything of ``subject`` the given stores hold, then verify (see the module).

    The stores must share one KV store (their data in one database); ``kv`` alone erases
    only quarantined copies and the subject's scope. Raises ``ConfigError`` when none is
    given or their subject prefixes differ.
    """
    check_subject(subject)
    memories = [memory] if not isinstance(memory, Sequence) else list(memory)
    index = _subject_index(kv, sessions, memories, checkpointer, subject_prefix)
    store_kv = index.kv
    started = store_kv.clock()
    resumed = await index.begin_erase(subject, started)
    done = _Progress()

    if sessions is not None:
        # Conversations first: the runs of a session are found through them even after
        # the session is gone (a resumed erase).
        for session_id in sorted(await sessions.storage.catalog.named(subject)):
            if await sessions.storage.owned_by_another(session_id, subject):
                continue  # given to another owner: its runs are not the subject's
            await index.add(subject, SubjectEntry("conversation", "", session_id))
        owner = await sessions.erase_owner(subject)
        done.sessions.update(dict.fromkeys(owner.sessions))
        done.scopes_checked += owner.scopes_checked
        done.left += owner.entries_left
    if conversations is not None:
        await _erase_conversations(index, subject, conversations, done)

    for _ in range(_PASSES):
        entries = await index.entries(subject)
        if not entries:
            break
        for entry in entries:
            if entry.kind == "memory":
                await _erase_namespace(index, subject, entry, memories, done)
        for entry in entries:
            if entry.kind == "run":
                await _erase_runs(index, subject, entry, [entry.ref], checkpointer, done)
            elif entry.kind == "conversation":
                if entry.store == CONVERSATION_STORE:
                    done.conversations[entry.ref] = None
                else:
                    done.sessions[entry.ref] = None
                    if sessions is not None:
                        done.origins.add(sessions.storage.scope_for(entry.ref))
                runs = await _conversation_runs(checkpointer, entry.ref)
                await _erase_runs(index, subject, entry, runs, checkpointer, done)

    quarantined = await purge_quarantined(
        store_kv,
        0.0,
        origin=lambda scope: (
            scope in done.origins or any(scope.startswith(p) for p in done.origin_prefixes)
        ),
    )
    remaining = await index.left(subject)
    done.scopes_checked += 1
    left = done.left + remaining
    if left == 0:
        await index.finish_erase(subject)
    else:
        log.warning(
            "erase of subject %r left %d entries; run it again (the subject stays fenced)",
            subject,
            left,
        )
    return SubjectErasure(
        subject=subject,
        sessions=tuple(sorted(done.sessions)),
        namespaces=tuple(done.namespaces),
        runs=tuple(done.runs),
        quarantined=len(quarantined),
        scopes_checked=done.scopes_checked,
        entries_left=left,
        resumed=resumed,
        started_at=started,
        finished_at=store_kv.clock(),
        not_erased=tuple(done.not_erased),
        conversations=tuple(sorted(done.conversations)),
        kept_for_forks=done.kept_for_forks,
    )


def _subject_index(
    kv: KVStore | None,
    sessions: SessionStore | None,
    memories: Sequence[KVMemoryStore],
    checkpointer: Checkpointer | None,
    subject_prefix: str | None,
) -> SubjectIndex:
    indexes = [m.subjects for m in memories]
    if checkpointer is not None:
        indexes.append(checkpointer.space.subjects)
    prefixes = {i.prefix for i in indexes} | ({subject_prefix} if subject_prefix else set())
    if len(prefixes) > 1:
        raise ConfigError(
            detail=f"the stores record subjects under different prefixes: {sorted(prefixes)}"
        )
    prefix = prefixes.pop() if prefixes else DEFAULT_SUBJECT_PREFIX
    base = kv or (sessions.kv if sessions is not None else None)
    if base is None:
        base = indexes[0].kv if indexes else None
    if base is None:
        raise ConfigError(
            detail="erase_subject needs a store: sessions, memory, checkpointer or kv"
        )
    return SubjectIndex(base, prefix=prefix)


#: ``SubjectEntry.store`` of a Pydantic AI conversation (a session's is empty).
CONVERSATION_STORE = "conversations"


async def _erase_conversations(
    index: SubjectIndex, subject: str, store: KVConversationStore, done: _Progress
) -> None:
    """The subject's conversations: recorded first (their runs are found through them by a
    resumed erase), then deleted with their pointers, and their scope read back."""
    for conversation_id in await store.conversations_of(subject):
        await index.add(subject, SubjectEntry("conversation", CONVERSATION_STORE, conversation_id))
    erased = await store.erase_scope(subject)
    done.conversations.update(dict.fromkeys(erased.conversations))
    done.scopes_checked += 1
    done.left += erased.records_left
    done.kept_for_forks += erased.kept_for_forks


async def _erase_namespace(
    index: SubjectIndex,
    subject: str,
    entry: SubjectEntry,
    memories: Sequence[KVMemoryStore],
    done: _Progress,
) -> None:
    store = next((m for m in memories if m.scope_prefix == entry.store), None)
    name = entry.store + entry.ref
    if store is None:
        done.not_erased[f"memory {name}"] = None
        done.left += 1
        return
    report = await store.erase_namespace(entry.ref)
    directory = store.directory_scope(entry.ref[:-1])
    done.origins.add(directory)
    done.origin_prefixes.add(directory + "/")
    done.namespaces[name] = None
    done.scopes_checked += report.scopes
    if report.entries_left:
        done.left += report.entries_left
        return
    await index.remove(subject, entry)


async def _conversation_runs(checkpointer: Checkpointer | None, conversation_id: str) -> list[str]:
    if checkpointer is None:
        return []
    scope = checkpointer.space.conversation_scope(conversation_id)
    return [item.key async for item in checkpointer.kv.iter_scan(scope, values=False)]


async def _erase_runs(
    index: SubjectIndex,
    subject: str,
    entry: SubjectEntry,
    run_ids: Iterable[str],
    checkpointer: Checkpointer | None,
    done: _Progress,
) -> None:
    """Delete ``run_ids`` and every run they started; drop ``entry`` when all are gone."""
    if entry.kind == "run" and (
        checkpointer is None or checkpointer.space.scope_prefix != entry.store
    ):
        done.not_erased[f"run {entry.store}{entry.ref}"] = None
        done.left += 1
        return
    if checkpointer is None:
        if entry.kind == "conversation":
            await index.remove(subject, entry)
        return
    space = checkpointer.space
    pending = list(run_ids)
    left = 0
    while pending:
        run_id = pending.pop()
        if run_id in done.runs:
            continue
        children = space.parent_scope(run_id)
        pending += [item.key async for item in checkpointer.kv.iter_scan(children, values=False)]
        await checkpointer.delete_run(run_id)
        scope = space.scope(run_id)
        done.origins.add(scope)
        remaining = len(await checkpointer.kv.scan(scope, limit=100, values=False))
        remaining += await checkpointer.get_run_info(run_id) is not None
        done.scopes_checked += 1
        left += remaining
        done.runs[run_id] = None
    done.left += left
    if left == 0:
        await index.remove(subject, entry)
