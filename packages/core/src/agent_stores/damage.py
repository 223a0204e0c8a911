"""One rule for damaged records: a record that cannot be decoded costs only itself.

Every store (sessions, memory, checkpointer) follows it (see ``docs/design.md``):

* an operation on *other* records keeps working: listings and searches skip the
  undecodable record, log one warning and add a :class:`RecordProblem` to the store's
  :class:`ProblemLog` (``store.problems``), which the caller can read and clear;
* an operation *on* the damaged record raises a typed error (``RECORD_CORRUPTED``,
  ``SESSION_INVALID``) and changes nothing, except the explicit ways out: overwriting or
  deleting it (memory), resetting it (sessions), deleting the run (checkpointer);
* nothing is dropped silently: an overwrite moves the raw bytes into the quarantine scope
  first (:func:`quarantine`), and ``agent-stores doctor --repair`` does the same for
  every damaged record it finds.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .kv.base import Entry, KVStore

logger = logging.getLogger("agent_stores.damage")

#: The KV scope holding quarantined records (raw bytes plus where they came from).
QUARANTINE_SCOPE = "agent-stores:quarantine"
#: Problems a store remembers for its caller; older ones are dropped (they were logged).
DEFAULT_PROBLEM_LOG_SIZE = 256


@dataclass(frozen=True, slots=True)
class RecordProblem:
    """One record an operation skipped because it could not be decoded."""

    store: str
    """``memory``, ``sessions`` or ``runs``."""
    where: str
    """The record's location (``scope/key``), as the store names it."""
    detail: str
    """Why it could not be used."""


class ProblemLog:
    """The records a store skipped, newest last; bounded, so a long-lived store never grows.

    Iterate it, or :meth:`take` to read and clear. Each problem is also logged once as a
    warning on the ``agent_stores.damage`` logger.
    """

    def __init__(self, store: str, maxlen: int = DEFAULT_PROBLEM_LOG_SIZE) -> None:
        self.store = store
        self._items: deque[RecordProblem] = deque(maxlen=maxlen)

    def report(self, where: str, error: BaseException | str) -> RecordProblem:
        detail = getattr(error, "detail", None) or str(error)
        problem = RecordProblem(self.store, where, detail)
        self._items.append(problem)
        logger.warning("%s: skipped damaged record %s: %s", self.store, where, detail)
        return problem

    def take(self) -> list[RecordProblem]:
        """The problems reported so far, clearing the log."""
        out = list(self._items)
        self._items.clear()
        return out

    def __iter__(self) -> Iterator[RecordProblem]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __repr__(self) -> str:
        return f"<ProblemLog {self.store} {len(self._items)} problem(s)>"


@dataclass(frozen=True, slots=True)
class Quarantined:
    """A record moved aside: its origin and its bytes exactly as they were stored."""

    key: str
    """Key in :data:`QUARANTINE_SCOPE`."""
    scope: str
    origin_key: str
    version: str
    reason: str
    at: float
    raw: bytes


# Bytes kept free in the first entry for the digits of the header's part count.
_PARTS_DIGITS = 20


def encode_quarantined(
    scope: str, key: str, entry: Entry, reason: str, at: float, max_value_bytes: int
) -> list[tuple[str, bytes]]:
    """Quarantine entries for ``entry``: a JSON header line, then the raw bytes.

    Bytes that do not fit one value go on in continuation entries ``<key>/<i>``, each as
    large as the store allows (the header takes room in the first entry only), so a
    record is split into about ``size / max_value_bytes`` entries even where values are
    as small as the KV contract allows (1 KiB).
    """
    header: dict[str, object] = {
        "f": 1,
        "scope": scope,
        "key": key,
        "version": entry.version,
        "reason": reason[:500],
        "at": round(at, 3),
        "parts": 0,
    }

    def header_bytes() -> bytes:
        return json.dumps(header, ensure_ascii=False).encode("utf-8") + b"\n"

    # A long reason gives way first: the header must leave room in one value.
    while len(header_bytes()) + _PARTS_DIGITS > max_value_bytes and header["reason"]:
        header["reason"] = str(header["reason"])[: len(str(header["reason"])) // 2]
    first_room = max(0, max_value_bytes - len(header_bytes()) - _PARTS_DIGITS)
    raw = entry.value
    pieces = [raw[:first_room]] + [
        raw[i : i + max_value_bytes] for i in range(first_room, len(raw), max_value_bytes)
    ]
    header["parts"] = len(pieces)
    qkey = f"{int(at * 1000):013d}-{uuid.uuid4().hex[:12]}"
    first = header_bytes() + pieces[0]
    return [(qkey, first)] + [(f"{qkey}/{i}", piece) for i, piece in enumerate(pieces) if i]


def decode_quarantined(key: str, value: bytes, rest: list[bytes] | None = None) -> Quarantined:
    """Inverse of :func:`encode_quarantined` (``ValueError`` for something else)."""
    head, sep, raw = value.partition(b"\n")
    if not sep:
        raise ValueError(f"quarantine entry {key!r} has no header line")
    header = json.loads(head)
    if int(header.get("parts", 1)) != 1 + len(rest or []):
        raise ValueError(f"quarantine entry {key!r} is missing continuation parts")
    return Quarantined(
        key,
        str(header["scope"]),
        str(header["key"]),
        str(header["version"]),
        str(header["reason"]),
        float(header["at"]),
        raw + b"".join(rest or []),
    )


async def quarantine(kv: KVStore, scope: str, key: str, entry: Entry, *, reason: str) -> str:
    """Copy ``entry`` (read from ``(scope, key)``) into the quarantine scope; return its key.

    Only copies: the caller removes or replaces the original afterwards, conditionally on
    ``entry.version``, so a crash in between leaves a duplicate, never a loss.
    """
    entries = encode_quarantined(scope, key, entry, reason, kv.clock(), kv.limits.max_value_bytes)
    # Continuations first: a header is only ever seen with all its bytes behind it.
    for part_key, part in entries[1:]:
        await kv.create(QUARANTINE_SCOPE, part_key, part)
    qkey, value = entries[0]
    await kv.create(QUARANTINE_SCOPE, qkey, value)
    logger.warning(
        "quarantined damaged record %s/%s as %s/%s (%s)", scope, key, QUARANTINE_SCOPE, qkey, reason
    )
    return qkey


async def list_quarantined(kv: KVStore) -> list[Quarantined]:
    """Every quarantined record, oldest first."""
    heads: list[tuple[str, bytes]] = []
    parts: dict[str, list[tuple[int, bytes]]] = {}
    async for item in kv.iter_scan(QUARANTINE_SCOPE):
        assert item.entry is not None
        base, slash, index = item.key.partition("/")
        if slash:
            parts.setdefault(base, []).append((int(index), item.entry.value))
        else:
            heads.append((item.key, item.entry.value))
    out: list[Quarantined] = []
    for key, value in heads:
        rest = [piece for _, piece in sorted(parts.get(key, []))]
        try:
            out.append(decode_quarantined(key, value, rest))
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("unreadable quarantine entry %s: %s", key, exc)
    return out


async def purge_quarantined(
    kv: KVStore,
    older_than_seconds: float,
    *,
    scope_prefix: str = "",
    origin: Callable[[str], bool] | None = None,
) -> list[str]:
    """Retention: delete quarantined records older than ``older_than_seconds``; their keys.

    Only records moved aside from scopes starting with ``scope_prefix`` (all by default),
    and, with ``origin``, only those whose scope it accepts (an erasure's scopes).
    Keys start with the time of quarantine, so the walk stops at the first younger one.
    A record's header goes before its continuation parts; parts a crashed purge left
    without their header are deleted by the next purge without ``scope_prefix``.
    """
    if older_than_seconds < 0:
        raise ValueError("older_than_seconds must be >= 0")
    cutoff_ms = int((kv.clock() - older_than_seconds) * 1000)
    chosen: set[str] = set()
    seen: set[str] = set()
    removed: list[str] = []
    async for item in kv.iter_scan(QUARANTINE_SCOPE, page_size=100):
        base, slash, _ = item.key.partition("/")
        stamp = base.partition("-")[0]
        if not stamp.isdigit():
            continue
        if int(stamp) >= cutoff_ms:
            break
        if not slash:
            seen.add(base)
            assert item.entry is not None
            came_from = _origin(item.entry.value)
            if not came_from.startswith(scope_prefix) or (
                origin is not None and not origin(came_from)
            ):
                continue
            chosen.add(base)
            await kv.delete(QUARANTINE_SCOPE, item.key)
            removed.append(item.key)
        elif base in chosen or (base not in seen and not scope_prefix and origin is None):
            await kv.delete(QUARANTINE_SCOPE, item.key)
    return removed


def _origin(value: bytes) -> str:
    """The scope a quarantined record came from ("" when its header cannot be read)."""
    try:
        scope = json.loads(value.partition(b"\n")[0]).get("scope")
    except (ValueError, AttributeError):
        return ""
    return scope if isinstance(scope, str) else ""
