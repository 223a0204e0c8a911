"""Subjects: whose data it is, recorded when it is written, so it can all be erased.

A *subject* is the person (or tenant) data belongs to, by an id of the application's
choosing. Each store records it at write time:

* sessions: the session's ``owner`` (``turn(id, owner=…)``), in the owner's index
  (:mod:`agent_stores.sessions.catalog`);
* memory: the namespace a file is written under, when the memory store is given
  ``subject_of`` (``namespace_subject()`` for the usual one notebook per user);
* runs: ``RunRecord.metadata["subject"]`` at registration, or
  :meth:`Checkpointer.bind_subject`; and a run whose conversation id is one of the
  subject's sessions belongs to the subject through that session.

Memory namespaces and runs are listed in one KV scope per subject (``subject:<id>``):
``m/<digest>`` names a namespace of a memory store, ``r/<digest>`` a run of a
checkpointer, ``c/<digest>`` a conversation (a session id, copied there by an erase
before the sessions go, so a resumed erase still finds their runs). ``~erasing`` is
present while an erase runs, then ``~erased`` for a short while: every recording write
reads them first and is refused with :class:`SubjectErasingError`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .errors import AppError, ConflictError, ErrorCode, InvalidIdError
from .kv.base import KVStore
from .memory._records import digest

#: The default prefix of the per-subject scopes.
DEFAULT_SUBJECT_PREFIX = "subject:"
ERASING_KEY = "~erasing"
ERASED_KEY = "~erased"
#: Seconds the ``~erased`` marker refuses writes after an erase: a write that read no
#: marker just before the erase began and lands after it is caught by the erase's last
#: read-back only if it lands within the erase; this closes the rest of the window for
#: any call bounded by the default deadline.
ERASED_MARKER_SECONDS = 120.0

EntryKind = Literal["memory", "run", "conversation"]
_KIND_PREFIX: dict[EntryKind, str] = {"memory": "m/", "run": "r/", "conversation": "c/"}
#: Entries a process remembers having recorded (bounded: it only saves a create).
_KNOWN_ENTRIES = 4096


class SubjectErasingError(AppError, RuntimeError):
    """The subject is being (or was moments ago) erased: the write was refused, nothing of
    it was stored."""

    default_code = ErrorCode.SUBJECT_ERASING


@dataclass(frozen=True, slots=True)
class SubjectEntry:
    """One thing of a subject: a memory namespace, a run, or a conversation (session id)."""

    kind: EntryKind
    store: str
    """The scope prefix of the store holding it (``KVMemoryStore.scope_prefix``,
    ``Checkpointer.space.scope_prefix``; empty for a conversation)."""
    ref: str
    """The namespace (a path prefix ending in ``/``), the run id, or the session id."""

    @property
    def key(self) -> str:
        return _KIND_PREFIX[self.kind] + digest(f"{self.store}\x00{self.ref}")

    def dump(self) -> bytes:
        return json.dumps({"store": self.store, "ref": self.ref}).encode()


def subject_problem(value: object, noun: str = "subject") -> str | None:
    """What is wrong with ``value`` as a subject (or session owner) id, or None.

    ``noun`` names it in the message: "subject", or "owner" for the session catalog.
    """
    article = "an" if noun[0] in "aeiou" else "a"
    if not isinstance(value, str):
        return f"{article} {noun} must be a string, got {type(value).__name__}"
    if not value or "\x00" in value:
        return f"{article} {noun} must be a non-empty string without NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{noun} {value[:80]!r} is not valid Unicode"
    return None


def check_subject(subject: object) -> str:
    """``subject`` if it is an id a subject scope can be named by; ``InvalidIdError`` if not."""
    problem = subject_problem(subject)
    if problem is not None:
        raise InvalidIdError(detail=problem)
    assert isinstance(subject, str)
    return subject


def namespace_subject(depth: int = 1) -> Callable[[str], tuple[str, str] | None]:
    """A memory store's ``subject_of``: a path's first ``depth`` segments are its namespace,
    and the last of them names the subject.

    ``namespace_subject()`` maps ``alice/main/MEMORY.md`` to namespace ``alice/`` of subject
    ``alice`` (the harness's ``namespace=lambda ctx: ctx.deps.user_id``);
    ``namespace_subject(2)`` maps ``acme/alice/notes.md`` to ``acme/alice/`` of ``alice``.
    A path with no more than ``depth`` segments has no subject.
    """
    if not isinstance(depth, int) or depth < 1:
        raise ValueError("depth must be an integer >= 1")

    def subject_of(path: str) -> tuple[str, str] | None:
        parts = path.split("/")
        if len(parts) <= depth:
            return None
        return "/".join(parts[:depth]) + "/", parts[depth - 1]

    return subject_of


class SubjectIndex:
    """The per-subject scopes on one KV store: record entries, fence, list, erase markers."""

    def __init__(self, kv: KVStore, *, prefix: str = DEFAULT_SUBJECT_PREFIX) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError("the subject prefix must be a non-empty string")
        self.kv = kv
        self.prefix = prefix
        self._known: OrderedDict[tuple[str, str], None] = OrderedDict()

    def scope_for(self, subject: str) -> str:
        check_subject(subject)
        limit = self.kv.limits.max_scope_chars - len(self.prefix)
        if len(subject) > limit:
            raise InvalidIdError(
                detail=f"subject {subject[:40]!r}… is {len(subject)} characters; "
                f"{self.kv.backend_name} allows at most {limit}"
            )
        return self.prefix + subject

    async def record(self, subject: str, entry: SubjectEntry) -> bool:
        """Check the subject is not being erased and make sure ``entry`` is listed.

        One read (the markers and the entry together); a write the first time the entry
        is seen. Returns True when the entry was created now (its data is new to the
        subject, for instance after an erase). Raises :class:`SubjectErasingError`.
        """
        scope = self.scope_for(subject)
        known = (scope, entry.key) in self._known
        keys = [ERASING_KEY, ERASED_KEY] if known else [ERASING_KEY, ERASED_KEY, entry.key]
        found = await self.kv.get_many(scope, keys)
        if ERASING_KEY in found or ERASED_KEY in found:
            self._known.pop((scope, entry.key), None)
            raise SubjectErasingError(
                detail=f"subject {subject!r} is being (or was moments ago) erased; "
                f"the {entry.kind} write was refused"
            )
        if known or entry.key in found:
            self._remember(scope, entry.key)
            return False
        try:
            await self.kv.create(scope, entry.key, entry.dump())
        except ConflictError:
            pass  # recorded by a concurrent write
        self._remember(scope, entry.key)
        return True

    def _remember(self, scope: str, key: str) -> None:
        self._known[(scope, key)] = None
        self._known.move_to_end((scope, key))
        while len(self._known) > _KNOWN_ENTRIES:
            self._known.popitem(last=False)

    def forget(self, subject: str) -> None:
        """Drop what this process remembers of ``subject`` (after erasing it)."""
        scope = self.scope_for(subject)
        for known in [k for k in self._known if k[0] == scope]:
            del self._known[known]

    async def entries(self, subject: str, kind: EntryKind | None = None) -> list[SubjectEntry]:
        """The subject's recorded entries (of ``kind``), in key order."""
        scope = self.scope_for(subject)
        kinds = [kind] if kind is not None else list(_KIND_PREFIX)
        out: list[SubjectEntry] = []
        for each in kinds:
            async for item in self.kv.iter_scan(scope, prefix=_KIND_PREFIX[each], page_size=500):
                assert item.entry is not None
                parsed = _parse(each, item.entry.value)
                if parsed is not None:
                    out.append(parsed)
        return out

    async def add(self, subject: str, entry: SubjectEntry) -> None:
        """List ``entry`` without the fence (an erase recording what it will remove)."""
        try:
            await self.kv.create(self.scope_for(subject), entry.key, entry.dump())
        except ConflictError:
            pass

    async def remove(self, subject: str, entry: SubjectEntry) -> None:
        await self.kv.delete(self.scope_for(subject), entry.key)

    async def begin_erase(self, subject: str, started_at: float) -> bool:
        """Set the erasing marker; True when one was there already (an erase resumed)."""
        scope = self.scope_for(subject)
        self.forget(subject)
        try:
            await self.kv.create(scope, ERASING_KEY, json.dumps({"since": started_at}).encode())
        except ConflictError:
            return True
        return False

    async def finish_erase(self, subject: str) -> None:
        """Replace the erasing marker by the short-lived erased one."""
        scope = self.scope_for(subject)
        try:
            await self.kv.create(scope, ERASED_KEY, b"{}", ttl=ERASED_MARKER_SECONDS)
        except ConflictError:  # left by an earlier erase: start its time again
            stored = await self.kv.get(scope, ERASED_KEY)
            if stored is not None:
                try:
                    await self.kv.replace(
                        scope,
                        ERASED_KEY,
                        b"{}",
                        expected_version=stored.version,
                        ttl=ERASED_MARKER_SECONDS,
                    )
                except ConflictError:
                    pass  # a concurrent erase renewed it
        await self.kv.delete(scope, ERASING_KEY)

    async def left(self, subject: str) -> int:
        """Entries of the subject's scope other than its markers."""
        scope = self.scope_for(subject)
        left = 0
        async for item in self.kv.iter_scan(scope, page_size=500, values=False):
            left += not item.key.startswith("~")
        return left


def _parse(kind: EntryKind, value: bytes) -> SubjectEntry | None:
    try:
        data: Any = json.loads(value)
        store, ref = data["store"], data["ref"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(store, str) or not isinstance(ref, str):
        return None
    return SubjectEntry(kind, store, ref)
