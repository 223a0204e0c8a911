"""Linearizability of a KV store, checked on a recorded history (Wing & Gong, as Knossos and Porcupine do).

Counting what is left at the end of a concurrent run proves little: two conditional
writes that both pass (an emulator's race, a condition checked outside the write) can
leave a plausible end state. Instead, every call is recorded and the whole history is
checked against a sequential model of the store.

**The recorder** (:class:`RecordingKV`) wraps a :class:`~agent_stores.KVStore` for one
worker and records, for each ``get``, ``get_many``, ``create``, ``replace``, ``delete`` and
``commit``: the worker, the operation and its arguments, the invocation and response
times (:func:`time.monotonic_ns`, one clock for every process of the machine), and the
outcome:

* ``ok`` with the result (the entry read, the new version, the delete's boolean, the
  versions of a commit);
* ``conflict``: a :class:`~agent_stores.ConflictError` — definitely *not* applied (a
  store that reports a conflict for a write that in fact landed, say after a lost reply,
  is wrong, and the checker says so);
* ``unknown``: :class:`~agent_stores.BackendUnavailableError`, a timeout, any transient
  error — the operation may or may not have taken effect. As in Knossos and Porcupine its
  response is at +infinity: it may be linearized anywhere after its call, and "it never
  happened" is the same as "it happened after everything else". An unknown read has no
  effect and is dropped.

**The model**: per key, absent or ``(value, version)``. Versions are the store's opaque
strings and must match exactly: ``create`` succeeds iff absent, ``replace(v)`` iff the
current version is ``v``, ``delete`` iff present (and at ``v`` when given), ``get`` returns
exactly the current value and version, ``get_many`` is one such read per key (the store
does not promise a snapshot across keys, so each key's read linearizes on its own within
the call), and ``commit`` applies all its operations or none. Every write must produce a
*fresh* version: a version the key had before is a violation (checked over the whole
history). TTLs are not modelled: a workload must not use them.

The version an unknown write would produce is not returned to anyone; workloads write
values unique per call, so when some read saw the write's value, its version is the one
read with it, otherwise a fresh placeholder no one can name.

**The checker** (:func:`check_history`) runs Lowe's memoized version of the Wing & Gong
search (as Porcupine does): walk the history's call/return events in time order,
linearize a pending call when the model accepts it, backtrack at a return whose call was
not linearized yet, and never explore the same (set of linearized operations, model
state) twice. Keys are checked independently (P-compositionality): operations are
grouped into partitions of keys they touch together — ``get_many`` is split per key,
a ``commit`` joins its keys into one partition.

*Commit* is in the workload, on two of the hot keys only (``k0`` and ``k1``), when the
store advertises ``capabilities.commit``: its all-or-nothing promise is exactly what a
linearizability check is good at, and limiting it to a pair keeps the other keys in
partitions of their own, so the search stays small.

*The bound*: each partition's search stops after ``max_steps`` model steps (default
5,000,000: about five seconds of CPython) and raises :class:`LinearizabilityInconclusive`.
The memoized search visits each (set of linearized operations, state) pair at most
once, so its cost grows with how many operations overlap in time (up to ``2^c`` for
``c`` concurrent calls), not with the history's length. Unknown outcomes overlap
everything after them; the search only places one where it changes the state ("it had
no effect" is the same as "it happened after everything else"), which keeps them cheap.
Two exact reductions (see :func:`_search`) cut the rest: states that differ only in
versions no operation names are one state, and an operation that fits and changes
nothing (a read, a refusal) is taken as a forced move. Measured on ``memory://``: 8
tasks x 30 calls on four hot keys take a few hundred steps per run; with commits
joining two keys and 20 % injected faults, a median of ~3,600 steps and at most
~77,000 in 150 seeded runs (the same histories without the reductions: a median of
~36,000 and at most ~1,400,000, and a rare run past 5,000,000).

*Faults*: with injected faults (``check_history(..., resent_writes=True)``), an SDK may
resend a write whose reply was lost and report only the last attempt: a conflict with
its own applied write, or a second success when the condition held again in between.
Each write may then also have been applied by an earlier attempt within its call (an
optional extra operation, skipped at the call's return); a successful write
conditioned on a version cannot repeat (the version would be needed twice), so it gets
none. Stale reads are not modelled: a read from a lagging replica is not linearizable.

**On a violation** :class:`LinearizabilityViolation` (an ``AssertionError``) prints the
smallest offending window of the failing partition (see :func:`_explain`): it closes at
the earliest response after which the history cannot be ordered, opens as late as
possible (the keys then start in any state), and within it every result not needed for
the contradiction is demoted, leaving the results that contradict each other (marked
``!``, each one needed), the writes whose effects count, and the writes outside the
window that produced the values and versions they mention. Versions are printed as
short aliases (``v1``, ``v2``…) with the table of real strings below.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from agent_stores import (
    ConflictError,
    CorruptRecordError,
    KVStore,
    ResourceClosedError,
    UnsupportedError,
)
from agent_stores.kv import Check, Create, Delete, Entry, Operation, Replace

Outcome = Literal["ok", "conflict", "unknown", "maybe"]
"""``maybe`` is the checker's own: a result not needed (applied within the call, or refused)."""
Kind = Literal["get", "get_many", "create", "replace", "delete", "commit"]

#: Errors that are never an indeterminate outcome: a bug of the caller or of the store.
_DEFINITE_FAILURES: tuple[type[BaseException], ...] = (
    ValueError,  # InvalidIdError, ValueTooLargeError, ConfigError
    TypeError,
    ResourceClosedError,
    UnsupportedError,
    CorruptRecordError,
)

DEFAULT_MAX_STEPS = 5_000_000
"""Model steps one partition's search may take before the check is inconclusive."""

_INF = float("inf")


@dataclass(frozen=True)
class CommitItem:
    """One operation of a recorded ``commit``: ``kind`` is create, replace, delete or check."""

    kind: Literal["create", "replace", "delete", "check"]
    key: str
    value: bytes | None = None
    expected: str | None = None


@dataclass(frozen=True)
class Op:
    """One recorded call.

    ``result`` by kind, when ``outcome == "ok"``: ``get``: ``(value, version)`` or None;
    ``get_many``: ``{key: (value, version)}``; ``create`` / ``replace``: the new version;
    ``delete``: bool; ``commit``: the list of versions (None for delete and check). For a
    ``conflict`` of a commit, ``result`` is the failing index (or None).
    """

    id: int
    worker: str
    kind: Kind
    keys: tuple[str, ...]
    call: int
    ret: int | None
    outcome: Outcome
    value: bytes | None = None
    expected: str | None = None
    items: tuple[CommitItem, ...] = ()
    result: Any = None
    error: str = ""
    asked: tuple[str, ...] = ()
    """For the one-key part of a ``get_many`` the checker makes: every key the call asked for."""

    @property
    def key(self) -> str:
        return self.keys[0]

    def to_json(self) -> dict[str, Any]:
        """A JSON-able record (bytes as latin-1 text), for workers in other processes."""
        result: Any = self.result
        if self.outcome == "ok" and self.kind == "get" and result is not None:
            result = [_text(result[0]), result[1]]
        elif self.outcome == "ok" and self.kind == "get_many":
            result = {k: [_text(v), ver] for k, (v, ver) in result.items()}
        return {
            "worker": self.worker,
            "kind": self.kind,
            "keys": list(self.keys),
            "call": self.call,
            "ret": self.ret,
            "outcome": self.outcome,
            "value": None if self.value is None else _text(self.value),
            "expected": self.expected,
            "items": [
                [i.kind, i.key, None if i.value is None else _text(i.value), i.expected]
                for i in self.items
            ],
            "result": result,
            "error": self.error,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any], id: int) -> Op:
        """The inverse of :meth:`to_json` (``id`` renumbers it in the merged history)."""
        kind = data["kind"]
        result = data["result"]
        if data["outcome"] == "ok" and kind == "get" and result is not None:
            result = (_bytes(result[0]), result[1])
        elif data["outcome"] == "ok" and kind == "get_many":
            result = {k: (_bytes(v), ver) for k, (v, ver) in result.items()}
        return Op(
            id=id,
            worker=data["worker"],
            kind=kind,
            keys=tuple(data["keys"]),
            call=int(data["call"]),
            ret=None if data["ret"] is None else int(data["ret"]),
            outcome=data["outcome"],
            value=None if data["value"] is None else _bytes(data["value"]),
            expected=data["expected"],
            items=tuple(
                CommitItem(k, key, None if v is None else _bytes(v), e)
                for k, key, v, e in data["items"]
            ),
            result=result,
            error=data["error"],
        )


def _text(value: bytes) -> str:
    return value.decode("latin-1")


def _bytes(value: str) -> bytes:
    return value.encode("latin-1")


class History:
    """The operations recorded by every worker of one run (merge other processes' with :meth:`extend_json`)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._ids = itertools.count()

    def record(self, **fields: Any) -> Op:
        op = Op(id=next(self._ids), **fields)
        self.ops.append(op)
        return op

    def extend_json(self, records: Iterable[Mapping[str, Any]]) -> None:
        for data in records:
            self.ops.append(Op.from_json(data, next(self._ids)))

    def __len__(self) -> int:
        return len(self.ops)


class RecordingKV:
    """A worker's view of a :class:`~agent_stores.KVStore` that records every call into a :class:`History`.

    Only the calls of the linearizability workload (one scope); the store is not closed
    by the recorder.
    """

    def __init__(self, kv: KVStore, scope: str, worker: str, history: History) -> None:
        self.kv = kv
        self.scope = scope
        self.worker = worker
        self.history = history

    async def _call(self, kind: Kind, keys: tuple[str, ...], call: Any, **fields: Any) -> Any:
        start = time.monotonic_ns()
        try:
            result = await call
        except ConflictError as exc:
            end = time.monotonic_ns()
            index = exc.index if kind == "commit" else None
            self.history.record(
                worker=self.worker,
                kind=kind,
                keys=keys,
                call=start,
                ret=end,
                outcome="conflict",
                result=index,
                **fields,
            )
            raise
        except _DEFINITE_FAILURES:
            raise
        except Exception as exc:
            self.history.record(
                worker=self.worker,
                kind=kind,
                keys=keys,
                call=start,
                ret=None,
                outcome="unknown",
                error=f"{type(exc).__name__}: {exc}"[:300],
                **fields,
            )
            raise
        end = time.monotonic_ns()
        self.history.record(
            worker=self.worker,
            kind=kind,
            keys=keys,
            call=start,
            ret=end,
            outcome="ok",
            result=_recorded(kind, result),
            **fields,
        )
        return result

    async def get(self, key: str) -> Entry | None:
        entry: Entry | None = await self._call("get", (key,), self.kv.get(self.scope, key))
        return entry

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        unique = tuple(dict.fromkeys(keys))
        found: dict[str, Entry] = await self._call(
            "get_many", unique, self.kv.get_many(self.scope, unique)
        )
        return found

    async def create(self, key: str, value: bytes) -> str:
        version: str = await self._call(
            "create", (key,), self.kv.create(self.scope, key, value), value=value
        )
        return version

    async def replace(self, key: str, value: bytes, expected_version: str) -> str:
        version: str = await self._call(
            "replace",
            (key,),
            self.kv.replace(self.scope, key, value, expected_version=expected_version),
            value=value,
            expected=expected_version,
        )
        return version

    async def delete(self, key: str, expected_version: str | None = None) -> bool:
        deleted: bool = await self._call(
            "delete",
            (key,),
            self.kv.delete(self.scope, key, expected_version=expected_version),
            expected=expected_version,
        )
        return deleted

    async def commit(self, ops: Sequence[Operation]) -> list[str | None]:
        items = tuple(_commit_item(op) for op in ops)
        results: list[str | None] = await self._call(
            "commit",
            tuple(i.key for i in items),
            self.kv.commit(self.scope, ops),
            items=items,
        )
        return results


def _commit_item(op: Operation) -> CommitItem:
    if isinstance(op, Create):
        return CommitItem("create", op.key, bytes(op.value))
    if isinstance(op, Replace):
        return CommitItem("replace", op.key, bytes(op.value), op.expected_version)
    if isinstance(op, Delete):
        return CommitItem("delete", op.key, None, op.expected_version)
    return CommitItem("check", op.key, None, op.expected_version)


def _recorded(kind: Kind, result: Any) -> Any:
    if kind == "get":
        return None if result is None else (bytes(result.value), result.version)
    if kind == "get_many":
        return {k: (bytes(e.value), e.version) for k, e in result.items()}
    if kind == "commit":
        return list(result)
    return result


# -- the checker ----------------------------------------------------------------------------


class LinearizabilityViolation(AssertionError):
    """The history has no sequential order agreeing with the KV model (the message shows the window)."""


class LinearizabilityInconclusive(AssertionError):
    """The search ran out of its step budget before deciding: the history is too concurrent."""


@dataclass(frozen=True)
class CheckReport:
    """What a successful check covered."""

    operations: int
    unknown: int
    partitions: int
    steps: int
    concurrent_pairs: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)


State = tuple[tuple[bytes, str] | None, ...]

_ANY: tuple[bytes, str] = (b"", "\x00<any state>")
"""A key in any state (compared by identity): the window search starts from it."""


@dataclass(frozen=True)
class _Sub:
    """One operation as the model steps it (a get_many is split into one read per key)."""

    op: Op
    kind: str
    outcome: str  # an Outcome, or "maybe": applied within the call, or refused
    keys: tuple[str, ...]
    call: int
    ret: float
    observed: tuple[bytes, str] | None = None
    writes: tuple[tuple[bytes, str] | None, ...] = ()
    slots: tuple[int, ...] = ()
    label: str = ""
    optional: bool = False
    """It may not have happened at all (a resent write's earlier attempt): skipped at its return."""


def _written_versions(op: Op, bind: Mapping[tuple[str, bytes], str]) -> list[str | None]:
    """The version each write of ``op`` produces (None for a delete or check).

    Known when the store returned it (an ``ok`` write, or one demoted to unknown by the
    window search); for an unknown write, the version some read saw with its value, else
    a placeholder no operation can name.
    """
    if op.kind in ("create", "replace"):
        if isinstance(op.result, str):
            return [op.result]
        assert op.value is not None
        return [bind.get((op.key, op.value), f"<unread version of #{op.id}>")]
    if op.kind == "commit":
        out: list[str | None] = []
        for n, item in enumerate(op.items):
            if item.kind not in ("create", "replace"):
                out.append(None)
            elif isinstance(op.result, list):
                out.append(op.result[n])
            else:
                assert item.value is not None
                out.append(bind.get((item.key, item.value), f"<unread version of #{op.id}.{n}>"))
        return out
    return []


def _bindings(ops: Iterable[Op]) -> dict[tuple[str, bytes], str]:
    """(key, value) -> the version a read saw with it: the version of an unknown write of that value."""
    bind: dict[tuple[str, bytes], str] = {}
    for op in ops:
        for key, seen in _observations(op):
            if seen is not None:
                bind.setdefault((key, seen[0]), seen[1])
    return bind


def _observations(op: Op) -> list[tuple[str, tuple[bytes, str] | None]]:
    """Every (key, entry read) of a successful read."""
    if op.outcome != "ok":
        return []
    if op.kind == "get":
        return [(op.key, op.result)]
    if op.kind == "get_many":
        return [(k, op.result.get(k)) for k in op.keys]
    return []


def _seen_versions(ops: Iterable[Op]) -> dict[tuple[str, bytes], list[str]]:
    """(key, value) -> every version reads saw with it, in order (two: a write applied twice)."""
    seen: dict[tuple[str, bytes], list[str]] = {}
    for op in ops:
        for key, entry in _observations(op):
            if entry is not None and entry[1] not in seen.setdefault((key, entry[0]), []):
                seen[(key, entry[0])].append(entry[1])
    return seen


def _subs(ops: Sequence[Op], echo: bool = False, blurred: Set[int] = frozenset()) -> list[_Sub]:
    bind = _bindings(ops)
    seen = _seen_versions(ops) if echo else {}
    subs: list[_Sub] = []
    for op in ops:
        ret = _INF if op.ret is None or op.outcome == "unknown" else float(op.ret)
        outcome: str = op.outcome
        if outcome == "maybe" and op.kind in ("get", "get_many"):
            continue
        if op.id in blurred:
            # Running when the window opens: its effect is "anything" (see _explain).
            if op.kind not in ("get", "get_many"):
                subs.append(_Sub(op, "blur", outcome, op.keys, op.call, ret, label=f"#{op.id}"))
            continue
        if op.kind in ("get", "get_many"):
            if op.outcome != "ok":
                continue  # an unknown read changes nothing
            for key, entry in _observations(op):
                label = f"#{op.id}" if op.kind == "get" else f"#{op.id}[{key}]"
                subs.append(
                    _Sub(op, "get", "ok", (key,), op.call, ret, observed=entry, label=label)
                )
            continue
        versions = _written_versions(op, bind)
        subs.append(_write_sub(op, outcome, ret, versions, f"#{op.id}"))
        if echo and outcome != "unknown" and _may_repeat(op):
            # An SDK resending this write after a lost reply: an earlier attempt may have
            # been applied within the call too (the reply tells of the last attempt only).
            returned = _written(op, _returned_versions(op))
            ghost = [
                _other_version(op, n, key, value, version, seen)
                for n, (key, value, version) in enumerate(returned)
            ]
            subs.append(
                replace(_write_sub(op, "maybe", ret, ghost, f"#{op.id} (resent)"), optional=True)
            )
    return subs


def _may_repeat(op: Op) -> bool:
    """Whether an earlier attempt of ``op`` may have been applied besides the one reported.

    Not for a successful write conditioned on a version: applying it twice would need
    the key at that version twice, and versions are never reused.
    """
    if op.outcome != "ok" or (op.kind == "delete" and not op.result):
        return True  # a refusal may echo our own earlier attempt
    if op.kind in ("replace", "delete"):
        return op.expected is None
    if op.kind == "commit":
        return all(item.expected is None for item in op.items)
    return True


def _returned_versions(op: Op) -> list[str | None]:
    """The versions the store returned for ``op``'s writes (None where it returned none)."""
    if op.kind == "commit":
        if isinstance(op.result, list):
            return list(op.result)
        return [None] * len(op.items)
    return [op.result if isinstance(op.result, str) else None]


def _written(op: Op, versions: Sequence[str | None]) -> list[tuple[str, bytes | None, str | None]]:
    if op.kind == "commit":
        return [(item.key, item.value, v) for item, v in zip(op.items, versions, strict=True)]
    return [(op.key, op.value, versions[0] if versions else None)]


def _other_version(
    op: Op,
    n: int,
    key: str,
    value: bytes | None,
    version: str | None,
    seen: Mapping[tuple[str, bytes], list[str]],
) -> str | None:
    """The version an earlier, resent attempt of ``op`` wrote: one a read saw that is not ``version``."""
    if value is None:
        return None
    others = [v for v in seen.get((key, value), []) if v != version]
    return others[0] if others else f"<unread version of #{op.id}.{n} (resent)>"


def _write_sub(
    op: Op, outcome: str, ret: float, versions: Sequence[str | None], label: str
) -> _Sub:
    if op.kind == "commit":
        writes = tuple(
            None if v is None or item.value is None else (item.value, v)
            for item, v in zip(op.items, versions, strict=True)
        )
        return _Sub(op, "commit", outcome, op.keys, op.call, ret, writes=writes, label=label)
    if op.kind == "delete":
        return _Sub(op, "delete", outcome, op.keys, op.call, ret, label=label)
    assert op.value is not None and versions and versions[0] is not None
    return _Sub(
        op,
        op.kind,
        outcome,
        op.keys,
        op.call,
        ret,
        writes=((op.value, versions[0]),),
        label=label,
    )


def _condition(item: CommitItem, current: tuple[bytes, str] | None) -> bool:
    if item.kind == "create":
        return current is None
    if item.kind == "replace":
        return current is not None and current[1] == item.expected
    if item.kind == "delete":
        return (
            current is not None
            if item.expected is None
            else (current is not None and current[1] == item.expected)
        )
    return (current[1] if current is not None else None) == item.expected


def _step(state: State, sub: _Sub) -> State | None:
    """The model: the state after ``sub`` linearized now, or None when its result contradicts ``state``.

    A key may be :data:`_ANY` (any state: only while the window search looks at a part of
    the history); a read pins it, a write that does not say what it found keeps it "any".
    """
    if sub.kind == "get":
        return _step_get(state, sub)
    if sub.kind == "blur":
        return _step_blur(state, sub)
    if any(state[s] is _ANY for s in sub.slots):
        return _step_any(state, sub)
    if sub.kind == "commit":
        return _step_commit(state, sub)
    return _step_write(state, sub)


def _step_get(state: State, sub: _Sub) -> State | None:
    current = state[sub.slots[0]]
    if current is _ANY:
        return _set(state, sub.slots[0], sub.observed)
    return state if current == sub.observed else None


def _step_blur(state: State, sub: _Sub) -> State:
    new = list(state)
    for slot in sub.slots:
        new[slot] = _ANY
    return tuple(new)


def _step_commit(state: State, sub: _Sub) -> State | None:
    """:func:`_step` for a commit on keys in a known state: all of its operations or none."""
    op, outcome = sub.op, sub.outcome
    currents = [state[s] for s in sub.slots]
    each = [_commit_holds(item, cur) for item, cur in zip(op.items, currents, strict=True)]
    if outcome == "conflict":
        index = op.result
        if index is not None and 0 <= index < len(each):
            return state if not each[index] else None
        return state if not all(each) else None
    if not all(each):
        return None if outcome == "ok" else state
    new = list(state)
    for item, slot, write in zip(op.items, sub.slots, sub.writes, strict=True):
        if item.kind in ("create", "replace"):
            new[slot] = write
        elif item.kind == "delete":
            new[slot] = None
    return tuple(new)


def _write_holds(sub: _Sub, current: tuple[bytes, str] | None) -> bool:
    """Whether a single-key write's condition holds on ``current``."""
    op = sub.op
    if sub.kind == "create":
        return current is None
    if sub.kind == "replace":
        return current is not None and current[1] == op.expected
    # delete
    return current is not None and (op.expected is None or current[1] == op.expected)


def _write_applies(sub: _Sub, holds: bool) -> bool | None:
    """Whether a single-key write took effect given its result: None when the result contradicts ``holds``."""
    kind, outcome = sub.kind, sub.outcome
    if outcome in ("unknown", "maybe"):
        return holds
    if kind == "delete":
        return holds if bool(sub.op.result) == holds else None
    if outcome == "conflict":
        return False if not holds else None
    return True if holds else None


def _step_write(state: State, sub: _Sub) -> State | None:
    """:func:`_step` for a create, replace or delete on a key in a known state."""
    slot = sub.slots[0]
    applies = _write_applies(sub, _write_holds(sub, state[slot]))
    if applies is None:
        return None
    if not applies:
        return state
    new = list(state)
    new[slot] = None if sub.kind == "delete" else sub.writes[0]
    return tuple(new)


def _set(state: State, slot: int, value: tuple[bytes, str] | None) -> State:
    new = list(state)
    new[slot] = value
    return tuple(new)


def _step_any(state: State, sub: _Sub) -> State | None:
    """:func:`_step` where a key it touches may be in any state: an over-approximation.

    Only results that fix the state afterwards make it concrete (a successful write, a
    delete that happened); everything else leaves the keys it may have written "any".
    That admits more than the real model, so a window that still fails is a real violation.
    """
    kind, outcome, op = sub.kind, sub.outcome, sub.op
    new = list(state)
    if kind == "commit":
        if outcome == "ok":
            for item, slot, write in zip(op.items, sub.slots, sub.writes, strict=True):
                current = state[slot]
                if current is not _ANY and not _commit_holds(item, current):
                    return None
                if item.kind in ("create", "replace"):
                    new[slot] = write
                elif item.kind == "delete":
                    new[slot] = None
            return tuple(new)
        for item, slot in zip(op.items, sub.slots, strict=True):
            if item.kind != "check":
                new[slot] = _ANY
        return tuple(new)
    slot = sub.slots[0]
    if outcome == "ok" and kind in ("create", "replace"):
        new[slot] = sub.writes[0]
    elif outcome == "ok" and kind == "delete" and op.result:
        new[slot] = None
    return tuple(new)


def _commit_holds(item: CommitItem, current: tuple[bytes, str] | None) -> bool:
    # In a commit, a Delete without a version is unconditional (absent is fine).
    if item.kind == "delete" and item.expected is None:
        return True
    return _condition(item, current)


_UNNAMED: tuple[bytes, str] = (b"", "\x00<a version no operation names>")
"""What a key holds after a write whose version no read saw and no condition names."""


def _unnamed_merged(subs: Sequence[_Sub]) -> list[_Sub]:
    """``subs`` with every write of a version no operation can name made :data:`_UNNAMED`.

    A key holding such a version fails every read (a read names the version it saw) and
    every versioned condition, and passes every presence test, whatever the value: so
    all such states behave alike, and merging them lets the memo see them as one.
    """
    named: set[str] = set()
    for sub in subs:
        if sub.observed is not None:
            named.add(sub.observed[1])
        if sub.op.expected is not None:
            named.add(sub.op.expected)
        named.update(item.expected for item in sub.op.items if item.expected is not None)
    return [
        replace(
            sub,
            writes=tuple(w if w is None or w[1] in named else _UNNAMED for w in sub.writes),
        )
        if sub.writes
        else sub
        for sub in subs
    ]


def _inert(sub: _Sub) -> bool:
    """Whether ``sub``, wherever it is linearized, leaves the keys as they were.

    A read, a refused write, a delete that found nothing: linearizing one the moment it
    fits changes nothing that follows (the keys are unchanged, and any operation that
    must precede it in real time has returned, so is linearized already). So the search
    takes such an operation first, as a forced move, and never tries the others in its
    place.
    """
    if sub.ret == _INF or sub.optional:
        return False
    return (
        sub.kind == "get"
        or sub.outcome == "conflict"
        or (sub.kind == "delete" and sub.outcome == "ok" and not sub.op.result)
    )


def _search(
    subs: Sequence[_Sub], keys: Sequence[str], max_steps: int, *, any_start: bool = False
) -> tuple[bool | None, int]:
    """Lowe's memoized Wing & Gong search over ``subs`` (one partition): (linearizable?, steps).

    None when the step budget ran out. An operation with an unknown outcome (response at
    +infinity) is only linearized where it changes the state: "it had no effect" is
    always available by putting it after everything else, so the search succeeds once
    every operation with a response is linearized. Without that, every subset of the
    pending unknown operations would be tried as no-ops.

    Two reductions keep a history with many unknown outcomes small, both exact: states
    that differ only in versions no operation names are one state
    (:func:`_unnamed_merged`), and an operation that fits and changes nothing
    (:func:`_inert`) is taken as a forced move before any other is tried; when the
    state after it was searched already, this one fails too. Only where every key
    starts in a known state: with "any state" a read pins a key, so it is no longer
    inert.

    The moves (forced, linearize a call, skip an optional operation, backtrack) are
    methods of :class:`_Search`; this loop only picks the next one and counts steps.
    """
    if not subs:
        return True, 0
    search = _Search.start(subs, keys, any_start=any_start)
    steps = 0
    while search.left:
        steps += 1
        if steps > max_steps:
            return None, steps
        if search.new_node:
            search.new_node = False
            if search.take_forced():
                continue
        if not search.dead_end and search.entry % 2 == 1:  # a call
            search.try_call()
        elif not search.dead_end and search.may_skip():
            search.skip_optional()
        elif not search.backtrack():  # a return whose call is not linearized yet
            return False, steps
    return True, steps


@dataclass
class _Search:
    """The state of one :func:`_search`: the event list (``nxt``/``prv``, call of i is
    node 2i+1, its return 2i+2), the keys' state, the operations linearized (a bit
    each), how many with a response are left, the memo of (linearized, state) searched
    already and the stack of moves to backtrack, and where the search stands (``entry``;
    ``new_node``: just moved there; ``dead_end``: must backtrack)."""

    subs: list[_Sub]
    nxt: list[int]
    prv: list[int]
    #: whether each operation has a response (must be linearized)
    finite: list[bool]
    #: whether each operation is inert (:func:`_inert`), taken as a forced move
    inert: list[bool]
    state: State
    left: int
    entry: int
    linearized: int = 0
    cache: set[tuple[int, State]] = field(default_factory=set)
    #: (call, state before it, forced move)
    stack: list[tuple[int, State, bool]] = field(default_factory=list)
    new_node: bool = True
    dead_end: bool = False

    @classmethod
    def start(cls, subs: Sequence[_Sub], keys: Sequence[str], *, any_start: bool) -> _Search:
        slot_of = {k: i for i, k in enumerate(keys)}
        merged = [
            replace(s, slots=tuple(slot_of[k] for k in s.keys)) for s in _unnamed_merged(subs)
        ]
        nxt, prv = _event_list(merged)
        finite = [s.ret != _INF and not s.optional for s in merged]
        known_start = not any_start and all(s.kind != "blur" for s in merged)
        return cls(
            subs=merged,
            nxt=nxt,
            prv=prv,
            finite=finite,
            inert=[known_start and _inert(s) for s in merged],
            state=tuple(_ANY if any_start else None for _ in keys),
            left=sum(finite),
            entry=nxt[0],
        )

    def _moved(self, call: int) -> None:
        """Lift the linearized ``call`` (and its return) out of the event list and start
        again from its head, at a new node."""
        _lift(self.nxt, self.prv, call)
        self.entry, self.new_node = self.nxt[0], True

    def take_forced(self) -> bool:
        """At a new node, linearize the first inert operation that fits, as a forced move;
        whether it was taken (when the state after it was searched already, the node is a
        dead end instead)."""
        forced = _first_fitting(self.nxt, self.subs, self.inert, self.state)
        if forced is None:
            return False
        bits = self.linearized | (1 << (forced // 2))
        if (bits, self.state) in self.cache:
            self.dead_end = True  # searched already from here: backtrack
            return False
        self.cache.add((bits, self.state))
        self.stack.append((forced, self.state, True))
        self.linearized = bits
        self.left -= 1
        self._moved(forced)
        return True

    def try_call(self) -> None:
        """At a call: linearize it when it fits the state (and, without a response, changes
        it) into a state not searched already; else go on to the next event."""
        i = self.entry // 2
        new = _step(self.state, self.subs[i])
        if new is not None and (self.finite[i] or new != self.state):
            bits = self.linearized | (1 << i)
            memo = (bits, new)
            if memo not in self.cache:
                self.cache.add(memo)
                self.stack.append((self.entry, self.state, False))
                self.state, self.linearized = new, bits
                self.left -= self.finite[i]
                self._moved(self.entry)
                return
        self.entry = self.nxt[self.entry]

    def may_skip(self) -> bool:
        """At a return: whether it is an optional operation's, skipping it not searched yet."""
        i = (self.entry - 1) // 2
        return self.subs[i].optional and (self.linearized | (1 << i), self.state) not in self.cache

    def skip_optional(self) -> None:
        """An optional operation's return: it did not happen. Lift it as skipped."""
        i = (self.entry - 1) // 2
        call = self.entry - 1
        self.cache.add((self.linearized | (1 << i), self.state))
        self.stack.append((call, self.state, False))
        self.linearized |= 1 << i
        self._moved(call)

    def backtrack(self) -> bool:
        """Undo the moves back to the last one that was not forced, and go on after it;
        False when there is none left (not linearizable)."""
        self.dead_end = False
        while True:
            if not self.stack:
                return False
            entry, self.state, was_forced = self.stack.pop()
            i = entry // 2
            self.linearized &= ~(1 << i)
            self.left += self.finite[i]
            _unlift(self.nxt, self.prv, entry)
            if not was_forced:
                break
        self.entry = self.nxt[entry]
        return True


def _first_fitting(
    nxt: Sequence[int], subs: Sequence[_Sub], inert: Sequence[bool], state: State
) -> int | None:
    """The call event of the first inert operation that may be linearized now and fits ``state``."""
    entry = nxt[0]
    while entry % 2 == 1:
        i = entry // 2
        if inert[i] and _step(state, subs[i]) is not None:
            return entry
        entry = nxt[entry]
    return None


def _event_list(subs: Sequence[_Sub]) -> tuple[list[int], list[int]]:
    """The doubly linked list of call/return events in time order: (next, previous) of each node.

    Call of i is node 2i+1, return is 2i+2; 0 is the head. Calls sort before returns at
    the same instant (so touching operations count as concurrent).
    """
    events = sorted(
        [(s.call, 0, 2 * i + 1) for i, s in enumerate(subs)]
        + [(s.ret, 1, 2 * i + 2) for i, s in enumerate(subs)]
    )
    size = 2 * len(subs) + 2
    nxt = [0] * size
    prv = [0] * size
    order = [0] + [e[2] for e in events]
    end = size - 1  # sentinel after the last event (never reached: see _search)
    order.append(end)
    for a, b in itertools.pairwise(order):
        nxt[a], prv[b] = b, a
    return nxt, prv


def _lift(nxt: list[int], prv: list[int], call: int) -> None:
    """Take a call and its return (the node after it) out of the event list."""
    ret = call + 1
    nxt[prv[call]], prv[nxt[call]] = nxt[call], prv[call]
    nxt[prv[ret]], prv[nxt[ret]] = nxt[ret], prv[ret]


def _unlift(nxt: list[int], prv: list[int], call: int) -> None:
    """Put a lifted call and its return back: the return first, then the call."""
    ret = call + 1
    nxt[prv[ret]] = ret
    prv[nxt[ret]] = ret
    nxt[prv[call]] = call
    prv[nxt[call]] = call


def _partitions(ops: Sequence[Op]) -> list[list[Op]]:
    """Operations grouped by the keys they touch together (union-find over commit's keys)."""
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for op in ops:
        if op.kind == "commit":
            for a, b in itertools.pairwise(op.keys):
                parent[find(a)] = find(b)
        else:
            for k in op.keys:
                find(k)
    groups: dict[str, list[Op]] = {}
    for op in ops:
        if op.kind == "get_many":
            for key in op.keys:  # one read per key, each in its key's partition
                groups.setdefault(find(key), []).append(
                    replace(
                        op,
                        keys=(key,),
                        asked=op.keys,
                        result={key: op.result[key]}
                        if op.outcome == "ok" and key in op.result
                        else ({} if op.outcome == "ok" else None),
                    )
                )
        elif op.keys:
            groups.setdefault(find(op.keys[0]), []).append(op)
    return [groups[k] for k in sorted(groups)]


def _keys_of(ops: Iterable[Op]) -> list[str]:
    return sorted({k for op in ops for k in op.keys})


def _linearizable(
    ops: Sequence[Op],
    max_steps: int,
    echo: bool,
    *,
    blurred: Set[int] = frozenset(),
    any_start: bool = False,
) -> tuple[bool | None, int]:
    return _search(_subs(ops, echo, blurred), _keys_of(ops), max_steps, any_start=any_start)


def _weaken(op: Op) -> Op | None:
    """``op`` with its outcome forgotten and its response at +infinity (None for a read, which then says nothing).

    A write keeps the version it is known to have produced (``result``), if any.
    """
    if op.kind in ("get", "get_many"):
        return None
    return replace(op, outcome="unknown", ret=None, error="(running at the cut)")


def _demote(op: Op) -> Op | None:
    """``op`` with its result not needed: applied within the call, or refused (None for a read).

    A weaker claim than any result, still bounded by the call's return, so demoting
    writes does not open the search up the way unknown outcomes do.
    """
    if op.kind in ("get", "get_many"):
        return None
    return replace(op, outcome="maybe")


def _as_unknown(ops: Sequence[Op], weakened: set[int]) -> list[Op]:
    out: list[Op] = []
    for op in ops:
        if op.id in weakened and op.outcome != "unknown":
            w = _demote(op)
            if w is not None:
                out.append(w)
        else:
            out.append(op)
    return out


def _writes(op: Op, bind: Mapping[tuple[str, bytes], str]) -> list[tuple[str, str]]:
    """(key, version) of every write ``op`` made or may have made, placeholders left out."""
    if op.outcome == "conflict" or op.kind not in ("create", "replace", "commit"):
        return []
    keys = [op.key] if op.kind != "commit" else [i.key for i in op.items]
    return [
        (k, v)
        for k, v in zip(keys, _written_versions(op, bind), strict=True)
        if v is not None and not v.startswith("<unread version of #")
    ]


def _check_fresh_versions(ops: Sequence[Op]) -> None:
    bind = _bindings(ops)
    seen: dict[tuple[str, str], Op] = {}
    for op in sorted(ops, key=lambda o: o.call):
        for key, version in _writes(op, bind):
            earlier = seen.get((key, version))
            if earlier is not None and earlier.id != op.id:
                raise LinearizabilityViolation(
                    f"history is not linearizable: key {key!r} was given the same version twice "
                    "(a version must be fresh: never one the key had before)\n"
                    + _table([earlier, op], {earlier.id: "!", op.id: "!"})
                )
            seen[(key, version)] = op


def check_history(
    ops: Sequence[Op] | History,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    resent_writes: bool = False,
) -> CheckReport:
    """Check ``ops`` against the KV model; raise :class:`LinearizabilityViolation` with the smallest window if it fails.

    Raises :class:`LinearizabilityInconclusive` when a partition's search exceeds
    ``max_steps`` model steps (see the module doc for the bound).

    ``resent_writes``: for a run with injected faults. An SDK that resends a write whose
    reply was lost reports the last attempt only: a conflict with its own applied write
    (a ``ConflictError``, or ``False`` from ``delete``), or even a second success when the
    condition held again in between (a create resent after someone deleted the first
    one). The KV API cannot tell these apart; the stores above resolve them by reading
    back. With ``resent_writes`` every write may also have been applied once more, by an
    earlier attempt within its call; everything stays bounded by the call's return.
    Without faults (the default) a refusal is definite and a write happens once.
    """
    history = list(ops.ops if isinstance(ops, History) else ops)
    _check_fresh_versions(history)
    total_steps = 0
    parts = _partitions(history)
    for part in parts:
        verdict, steps = _linearizable(part, max_steps, resent_writes)
        total_steps += steps
        if verdict is None:
            raise LinearizabilityInconclusive(
                f"the linearizability search of keys {_keys_of(part)} ({len(part)} operations) "
                f"gave up after {max_steps} steps: too many operations overlap (unknown outcomes "
                "overlap everything after them); lower the workload's concurrency or fault rate"
            )
        if not verdict:
            raise LinearizabilityViolation(
                _explain(part, max_steps, resent_writes, start=_start(history))
            )
    outcomes: dict[str, int] = {}
    for op in history:
        outcomes[op.outcome] = outcomes.get(op.outcome, 0) + 1
    return CheckReport(
        operations=len(history),
        unknown=outcomes.get("unknown", 0),
        partitions=len(parts),
        steps=total_steps,
        concurrent_pairs=concurrent_pairs(history),
        by_outcome=outcomes,
    )


def concurrent_pairs(ops: Sequence[Op]) -> int:
    """How many pairs of operations of different workers overlap in time (0: nothing was concurrent)."""
    events = sorted((op.call, op.ret if op.ret is not None else op.call, op.worker) for op in ops)
    pairs = 0
    open_: list[tuple[int, str]] = []
    for call, ret, worker in events:
        open_ = [(r, w) for r, w in open_ if r >= call]
        pairs += sum(1 for _, w in open_ if w != worker)
        open_.append((ret, worker))
    return pairs


def by_process(ops: Iterable[Op]) -> list[Op]:
    """``ops`` attributed to their process (``p0-``, ``p1-``… or ``main``) instead of their task."""
    return [
        replace(op, worker=op.worker.split("-", 1)[0] if op.worker.startswith("p") else "main")
        for op in ops
    ]


def _start(ops: Sequence[Op]) -> int:
    return min((op.call for op in ops), default=0)


def _explain(part: Sequence[Op], max_steps: int, echo: bool, *, start: int) -> str:
    """The smallest window of a failing partition, as a readable table.

    1. The window closes at the earliest response after which the history cannot be
       ordered: the shortest failing prefix (operations still running then get an
       unknown outcome).
    2. It opens as late as possible: the keys start in any state, reads that began
       before the opening and writes that finished before it are left out, and writes
       running across it may have done anything. This admits more than the real model,
       so a window that still fails holds a real violation on its own.
    3. Within it, every result not needed for the contradiction is demoted (a read
       dropped, a write to "applied within the call, or refused"), oldest first; the
       results left are the ones that contradict each other, each one needed.
    """
    fails = _Trials(max_steps, echo)
    closed = _close_window(part, fails)
    window, blurred, any_start = _open_window(closed, fails)
    demoted = _demote_unneeded(window, blurred, any_start, fails)
    essential = [
        op
        for op in window
        if op.id not in demoted and op.id not in blurred and op.outcome != "unknown"
    ]
    sources = _sources(part, essential)
    in_window = {op.id for op in window if op.kind not in ("get", "get_many")}
    in_window |= {op.id for op in essential}
    marks: dict[int, str] = {op.id: "." for op in part if op.id in sources}
    marks.update({i: " " for i in in_window})
    marks.update({i: "~" for i in blurred})
    marks.update({op.id: "!" for op in essential})
    keys = _keys_of(part)
    return (
        f"history is not linearizable on key{'s' if len(keys) > 1 else ''} "
        f"{', '.join(map(repr, keys))}: no sequential order of these operations agrees with "
        f"a KV store.\n"
        f"  ! {len(essential)} results that contradict each other (each one needed)\n"
        "    (unmarked) writes in the window: their effects count, their replies are not needed\n"
        "  ~ running when the window opens: may have done anything\n"
        "  . outside the window: wrote a value or version the window mentions\n"
        "  ? outcome unknown: may or may not have happened, any time after its call\n"
        + _table([op for op in part if op.id in marks], marks, start=start)
    )


class _Trials:
    """Whether a candidate window fails, with the model steps of all such searches bounded by ``max_steps`` too."""

    def __init__(self, max_steps: int, echo: bool) -> None:
        self.max_steps = max_steps
        self.echo = echo
        self.spent = 0

    def __call__(
        self, candidate: Sequence[Op], blurred: Set[int] = frozenset(), any_start: bool = False
    ) -> bool:
        # "Cannot tell" (a search out of budget) counts as "does not fail", so the
        # window only ever shrinks on proof; once the budget is spent it stays as is.
        budget = min(self.max_steps // 10, self.max_steps - self.spent)
        if budget <= 0:
            return False
        verdict, steps = _linearizable(
            candidate, budget, self.echo, blurred=blurred, any_start=any_start
        )
        self.spent += steps
        return verdict is False


def _prefix(part: Sequence[Op], cut: int) -> list[Op]:
    """``part`` as it stood at ``cut``: later calls left out, running ones weakened."""
    out: list[Op] = []
    for op in part:
        if op.call > cut:
            continue
        if op.ret is not None and op.ret > cut and op.outcome != "unknown":
            w = _weaken(op)
            if w is not None:
                out.append(w)
            continue
        out.append(op)
    return out


def _close_window(part: Sequence[Op], fails: _Trials) -> list[Op]:
    """Step 1 of :func:`_explain`: the shortest failing prefix (binary search over the responses)."""
    returns = sorted(op.ret for op in part if op.ret is not None and op.outcome != "unknown")
    lo, hi = 0, len(returns) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(_prefix(part, returns[mid])):
            hi = mid
        else:
            lo = mid + 1
    closed = _prefix(part, returns[lo]) if returns else list(part)
    if not fails(closed):  # not monotone after all: keep the whole partition
        closed = list(part)
    return closed


def _opened(closed: Sequence[Op], at: int) -> tuple[list[Op], set[int]]:
    """``closed`` opened at ``at``: the operations kept, and the writes running across ``at``."""
    ops: list[Op] = []
    blurred: set[int] = set()
    for op in closed:
        if op.kind in ("get", "get_many"):
            if op.call >= at:
                ops.append(op)
        elif op.ret is None or op.outcome == "unknown" or op.ret >= at:
            ops.append(op)
            if op.call < at:
                blurred.add(op.id)
    return ops, blurred


def _open_window(closed: list[Op], fails: _Trials) -> tuple[list[Op], set[int], bool]:
    """Step 2 of :func:`_explain`: the latest opening that still fails: (window, blurred, any_start)."""
    calls = sorted({op.call for op in closed})
    if not (calls and fails(*_opened(closed, calls[0]), any_start=True)):
        return closed, set[int](), False
    lo, hi = 0, len(calls) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fails(*_opened(closed, calls[mid]), any_start=True):
            lo = mid
        else:
            hi = mid - 1
    window, blurred = _opened(closed, calls[lo])
    return window, blurred, True


def _demote_unneeded(
    window: Sequence[Op], blurred: set[int], any_start: bool, fails: _Trials
) -> set[int]:
    """Step 3 of :func:`_explain`: the results not needed for the contradiction, oldest first."""
    demoted: set[int] = set()
    for op in sorted(window, key=lambda o: o.call):
        if op.outcome == "unknown" or op.id in blurred:
            continue
        if fails(_as_unknown(window, demoted | {op.id}), blurred, any_start):
            demoted.add(op.id)
    return demoted


def _mentions(essential: Iterable[Op]) -> tuple[set[tuple[str, str]], set[tuple[str, bytes]]]:
    """The (key, version) pairs and (key, value) pairs the essential results mention."""
    mentioned: set[tuple[str, str]] = set()
    values: set[tuple[str, bytes]] = set()
    for op in essential:
        if op.expected is not None:
            mentioned.add((op.key, op.expected))
        for item in op.items:
            if item.expected is not None:
                mentioned.add((item.key, item.expected))
        for key, seen in _observations(op):
            if seen is not None:
                values.add((key, seen[0]))
                mentioned.add((key, seen[1]))
    return mentioned, values


def _sources(part: Sequence[Op], essential: Iterable[Op]) -> set[int]:
    """The writes that produced the values and versions the essential results mention."""
    mentioned, values = _mentions(essential)
    bind = _bindings(part)
    sources: set[int] = set()
    for op in part:
        written = [(op.key, op.value)] if op.kind in ("create", "replace") else []
        written += [(i.key, i.value) for i in op.items if i.value is not None]
        if any(w in values for w in written) or any(w in mentioned for w in _writes(op, bind)):
            sources.add(op.id)
    return sources


def _table(rows: Sequence[Op], marks: Mapping[int, str], *, start: int | None = None) -> str:
    if start is None:
        start = min((op.call for op in rows), default=0)
    aliases: dict[str, str] = {}

    def v(version: str | None) -> str:
        if version is None:
            return "-"
        if version not in aliases:
            aliases[version] = f"v{len(aliases) + 1}"
        return aliases[version]

    def ms(t: int | None) -> str:
        return "      ?" if t is None else f"{(t - start) / 1e6:7.3f}"

    lines = [
        "    op     worker     call ms  return ms  operation                                  result"
    ]
    for op in sorted(rows, key=lambda o: (o.call, o.id)):
        lines.append(
            f"  {marks.get(op.id, ' ')} #{op.id:<5} {op.worker:<10} {ms(op.call)}  {ms(op.ret)}    "
            f"{_describe(op, v):<42} {_result(op, v)}"
        )
    if aliases:
        lines.append(
            "versions: " + ", ".join(f"{alias} = {real!r}" for real, alias in aliases.items())
        )
    return "\n".join(lines)


def _show(value: bytes | None) -> str:
    if value is None:
        return "-"
    text = value.decode("utf-8", "backslashreplace")
    return repr(text if len(text) <= 24 else text[:21] + "...")


def _describe(op: Op, v: Any) -> str:
    if op.kind == "get":
        return f"get {op.key}"
    if op.kind == "get_many":
        return f"get_many {', '.join(op.asked or op.keys)}"
    if op.kind == "create":
        return f"create {op.key} = {_show(op.value)}"
    if op.kind == "replace":
        return f"replace {op.key} = {_show(op.value)} if {v(op.expected)}"
    if op.kind == "delete":
        return f"delete {op.key}" + (f" if {v(op.expected)}" if op.expected is not None else "")
    parts = []
    for item in op.items:
        if item.kind == "create":
            parts.append(f"create {item.key} = {_show(item.value)}")
        elif item.kind == "replace":
            parts.append(f"replace {item.key} = {_show(item.value)} if {v(item.expected)}")
        elif item.kind == "delete":
            parts.append(
                f"delete {item.key}" + (f" if {v(item.expected)}" if item.expected else "")
            )
        else:
            parts.append(f"check {item.key} at {v(item.expected) if item.expected else 'absent'}")
    return "commit [" + "; ".join(parts) + "]"


def _result(op: Op, v: Any) -> str:
    if op.outcome == "unknown":
        return f"? {op.error}"
    if op.outcome == "conflict":
        suffix = f" at [{op.result}]" if op.kind == "commit" and op.result is not None else ""
        return "ConflictError" + suffix
    if op.kind == "get":
        return "absent" if op.result is None else f"{_show(op.result[0])} @ {v(op.result[1])}"
    if op.kind == "get_many":
        return (
            "{"
            + ", ".join(
                f"{k}: {_show(val)} @ {v(ver)}" for k, (val, ver) in sorted(op.result.items())
            )
            + "}"
        )
    if op.kind in ("create", "replace"):
        return f"ok -> {v(op.result)}"
    if op.kind == "delete":
        return "True (deleted)" if op.result else "False (nothing deleted)"
    return "ok -> [" + ", ".join(v(x) for x in op.result) + "]"


# -- the workload ---------------------------------------------------------------------------

HOT_KEYS = ("k0", "k1", "k2", "k3")
COMMIT_KEYS = ("k0", "k1")


async def run_worker(
    client: RecordingKV,
    *,
    ops: int,
    seed: int | str,
    keys: Sequence[str] = HOT_KEYS,
    use_commit: bool = False,
    use_get_many: bool = True,
) -> None:
    """One worker of the linearizability workload: ``ops`` random calls on a few hot keys.

    A seeded mix of get, get_many, create, replace (with the last version this worker
    saw, often stale by then), delete (with and without a version) and, with
    ``use_commit``, commits on :data:`COMMIT_KEYS`. Every value written is unique
    (``worker:n``). Conflicts and unknown outcomes are recorded, not raised.
    """
    worker = _Worker(client, seed, keys, use_commit=use_commit, use_get_many=use_get_many)
    for _ in range(ops):
        key = worker.rng.choice(list(keys))
        r = worker.rng.random()
        try:
            await worker.call(key, r)
        except ConflictError:
            continue
        except _DEFINITE_FAILURES:
            raise
        except Exception:
            # Unknown outcome, recorded; this worker no longer knows the key's version.
            worker.known.pop(key, None)
            continue


class _Worker:
    """The state of one :func:`run_worker`: its random source and the last version it saw of each key."""

    def __init__(
        self,
        client: RecordingKV,
        seed: int | str,
        keys: Sequence[str],
        *,
        use_commit: bool,
        use_get_many: bool,
    ) -> None:
        self.client = client
        self.keys = keys
        self.use_commit = use_commit
        self.use_get_many = use_get_many
        self.rng = random.Random(f"{seed}-{client.worker}")
        self.known: dict[str, str | None] = {}
        self.counter = itertools.count()

    def value(self) -> bytes:
        return f"{self.client.worker}:{next(self.counter)}".encode()

    def version_for(self, key: str) -> str:
        got = self.known.get(key)
        return got if got is not None else f"never-issued-{self.rng.randrange(1000)}"

    async def call(self, key: str, r: float) -> None:
        """The call the random draw ``r`` picks, on ``key``."""
        client, known = self.client, self.known
        if r < 0.28:
            await self.get(key)
        elif r < 0.43:
            known[key] = await client.create(key, self.value())
        elif r < 0.68:
            known[key] = await client.replace(key, self.value(), self.version_for(key))
        elif r < 0.76:
            if await client.delete(key):
                known[key] = None
        elif r < 0.86:
            if await client.delete(key, self.version_for(key)):
                known[key] = None
        elif r < 0.93 or not self.use_commit:
            await self.read_all(key)
        else:
            await self.commit()

    async def get(self, key: str) -> None:
        entry = await self.client.get(key)
        self.known[key] = None if entry is None else entry.version

    async def read_all(self, key: str) -> None:
        if not self.use_get_many:
            await self.get(key)
            return
        found = await self.client.get_many(list(self.keys))
        for k in self.keys:
            self.known[k] = found[k].version if k in found else None

    async def commit(self) -> None:
        """A commit on :data:`COMMIT_KEYS` built from what this worker last saw of them."""
        rng = self.rng
        a, b = COMMIT_KEYS if rng.random() < 0.5 else COMMIT_KEYS[::-1]
        batch: list[Operation] = []
        for k in (a, b):
            seen = self.known.get(k)
            choice = rng.random()
            if k == b and choice < 0.4:
                batch.append(Check(k, seen))
            elif seen is None:
                batch.append(Create(k, self.value()))
            elif choice < 0.85:
                batch.append(Replace(k, self.value(), seen))
            else:
                batch.append(Delete(k, seen))
        results = await self.client.commit(batch)
        for op, version in zip(batch, results, strict=True):
            if isinstance(op, Create | Replace):
                self.known[op.key] = version
            elif isinstance(op, Delete):
                self.known[op.key] = None


async def run_workload(
    clients: Sequence[KVStore],
    scope: str,
    history: History,
    *,
    tasks: int = 8,
    ops: int = 30,
    seed: int | str = 0,
    prefix: str = "t",
    use_commit: bool = False,
) -> None:
    """``tasks`` concurrent workers (``{prefix}0``…) sharing ``clients`` round-robin, all recorded into ``history``."""
    workers = [
        RecordingKV(clients[i % len(clients)], scope, f"{prefix}{i}", history) for i in range(tasks)
    ]
    await asyncio.gather(
        *(run_worker(w, ops=ops, seed=seed, use_commit=use_commit) for w in workers)
    )


async def run_with_processes(
    url: str,
    scope: str,
    history: History,
    in_process: Callable[[], Awaitable[None]],
    *,
    processes: int = 2,
    tasks: int = 2,
    ops: int = 20,
    seed: int | str = 0,
    use_commit: bool = False,
) -> None:
    """Run the workload in ``processes`` OS processes (``linearizability_workers``) at the same time as ``in_process()``.

    Each process opens its own client, prints ``ready``, and starts on one line of stdin,
    so every process and the local tasks start together; their recorded operations are
    merged into ``history`` (one monotonic clock for the whole machine).
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent_stores_contract.linearizability_workers",
            url,
            scope,
            str(seed),
            f"p{n}-",
            str(tasks),
            str(ops),
            "1" if use_commit else "0",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for n in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            if line.strip() != b"ready":
                _, err = await proc.communicate()
                raise AssertionError(
                    f"linearizability worker did not start: {line!r} {err.decode()[-3000:]}"
                )
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
        local = asyncio.ensure_future(in_process())
        outputs = [await proc.communicate() for proc in procs]
        await local
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()[-3000:]
        history.extend_json(json.loads(line) for line in out.decode().splitlines() if line.strip())
