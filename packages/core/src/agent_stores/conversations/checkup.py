"""``doctor`` for conversations: records and entry segments that cannot be used.

An owner scope is examined on its own: every record must decode and its history must be
readable to its first entry (through the homes of the conversations it was forked from);
every segment must decode. A damaged record, or a record whose history is damaged or
incomplete, is reported on the record with the damaged segments of its own home as the
related keys; ``--repair`` quarantines them together (the conversation then reads as one
the store does not have, its bytes kept in the quarantine scope). A damaged segment no
record reaches is reported alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CorruptRecordError
from ..kv.base import KVStore
from .layout import Home, decode_record_named, decode_segment, joined_segments
from .store import KVConversationStore

REPAIR = "quarantine the record (and its damaged segments): the conversation reads as absent"


@dataclass(slots=True)
class Damage:
    """One damaged record or segment: key, kind, detail and the keys quarantined with it."""

    key: str
    kind: str
    detail: str
    related: list[str] = field(default_factory=list)


async def check_owner_scope(kv: KVStore, prefix: str, owner: str) -> list[Damage]:
    """The damage found in one owner scope of the conversation store under ``prefix``."""
    store = KVConversationStore(kv, scope_prefix=prefix)
    records: list[tuple[str, bytes]] = []
    segments: list[tuple[str, bytes]] = []
    async for item in kv.iter_scan(owner, page_size=500):
        assert item.entry is not None
        if item.key.startswith("r/"):
            records.append((item.key, item.entry.value))
        elif item.key.startswith("e/"):
            segments.append((item.key, item.entry.value))
    bad_segments = _damaged_segments(segments)
    found: list[Damage] = []
    claimed: set[str] = set()
    for key, raw in records:
        damage = await _check_record(store, owner, key, raw, bad_segments)
        if damage is not None:
            claimed.update(damage.related)
            found.append(damage)
    found += [
        Damage(key, "damaged-chunk", detail, [])
        for key, detail in bad_segments.items()
        if key not in claimed
    ]
    return found


def _damaged_segments(segments: list[tuple[str, bytes]]) -> dict[str, str]:
    damaged: dict[str, str] = {}
    joined = dict(joined_segments(segments))
    for key, _ in segments:
        if "~" in key.rsplit("/", 1)[-1]:
            continue
        if key not in joined:
            damaged[key] = "a part of the segment is missing"
            continue
        try:
            decode_segment(key.split("/")[1], key, joined[key])
        except CorruptRecordError as exc:
            damaged[key] = exc.detail
    return damaged


async def _check_record(
    store: KVConversationStore, owner: str, key: str, raw: bytes, bad: dict[str, str]
) -> Damage | None:
    name = key[len("r/") :]
    try:
        stored = decode_record_named(name, raw)
    except CorruptRecordError as exc:
        return Damage(key, "undecodable", exc.detail)
    home = Home(owner, name, stored.inc)
    own_bad = [k for k in bad if k.startswith(store.layout.segments_prefix(home))]
    try:
        for tip in [stored.record.head_id, *stored.record.branches]:
            await store.read_history(tip)
    except (CorruptRecordError, KeyError) as exc:
        detail = exc.detail if isinstance(exc, CorruptRecordError) else f"entry {exc} is missing"
        return Damage(
            key,
            "missing-chunk" if isinstance(exc, KeyError) else "damaged-chunk",
            f"conversation {stored.record.conversation_id!r}: its history cannot be read: {detail}",
            own_bad,
        )
    return None
