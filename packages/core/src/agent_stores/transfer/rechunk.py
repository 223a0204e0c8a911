"""Fitting a unit into a destination with a smaller value limit, and comparing units by content.

Stores size their records from the limit of the backend they write to (SQLite holds 4 MB
per entry, DynamoDB 400 KB), so a unit written on a large backend can hold entries a
smaller one refuses. Each store splits its large data into chunks whose layout allows
a re-split without decoding the data:

sessions
    A history chunk ``h/<id>`` is stored as parts ``h/<id>/0..n-1`` that readers
    concatenate; the ``state`` header records each chunk's part count. Re-split: cut the
    concatenated bytes into parts of the destination's size and rewrite the part count
    in the state (nothing else of the state changes: lease, fence, recovery latch,
    write mark and tail stay as they are).
memory
    A file record holds its content (and metadata) inline or as chunks
    ``~c/<name>/<token>/c<i>`` (``m<i>``) with their sizes in characters. Re-split: the
    content is cut at character boundaries into chunks of the destination's size and
    the record rewritten with the new sizes (same memory version, operation id,
    receipts); content that was inline in a record too large for the destination moves
    into chunks, as the store itself does for large files. A vector record
    (``~v/<model>/<name>``) too large is left out: it is derived from the file, and the
    destination's next search computes it again.
runs
    A large record is a stub ``{..., "blob": {"sha256", "chunks", "size"}}`` whose bytes
    are content-addressed chunks ``x/<sha256>/<n>``. Re-split: the chunks are cut at the
    size the checkpointer itself uses on the destination (so a later write of the same
    bytes there finds matching chunks) and the chunk count in every stub referencing
    them rewritten; an inline record of a kind readers unpack (journal entries, step
    events, snapshots, messages, tool effects and results) becomes a stub with the
    fields readers need without the chunks, exactly what the checkpointer writes.

Anything else larger than the destination holds (a session state, a run record, an
index entry, an unreferenced memory chunk) cannot be split: :func:`fit` reports it as
:class:`TooLarge` and the unit is not copied.

:func:`content_view` is what ``verify`` compares for a re-chunked unit: every chunk
group joined and every record that references chunks replaced by the content it stands
for, so two units are equal when they hold the same data however it is cut.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..checkpointer.codec import canonical, decode_record, digest
from ..errors import CorruptRecordError
from ..kv.base import Entry
from ..memory._records import (
    CHUNK_PREFIX as MEMORY_CHUNK_PREFIX,
)
from ..memory._records import (
    INTERNAL_KEY_MARK,
    MARKER_SUFFIX,
    FileRecord,
    content_chunk_key,
    decode_text,
    encode_text,
    metadata_chunk_key,
    split_utf8,
)
from ..memory.vectors import VECTOR_PREFIX
from ..sessions.records import (
    CHUNK_PREFIX as SESSION_CHUNK_PREFIX,
)
from ..sessions.records import (
    STATE_KEY,
    ChunkRef,
    RecordError,
    StateHeader,
    decode_state,
    encode_state,
    split_parts,
)

#: Fields a checkpointer stub keeps next to its blob reference, by key prefix: the
#: ``keep`` argument of each ``RunSpace.pack`` call (journal entries, step events,
#: snapshots, snapshot messages, tool effects, tool results). Only these kinds of record
#: are read through ``unpack``, so only they may become stubs.
RUN_STUB_FIELDS: dict[str, tuple[str, ...]] = {
    "j/": ("v", "seq", "fp", "step_id", "phase", "kind"),
    "ev/": ("v", "seq"),
    "sn/": ("v", "seq", "state", "pruned"),
    "m/": (),
    "t/": (),
    "r/": ("v",),
}
_RUN_CHUNK_PREFIX = "x/"
# Digits of a run chunk's index: ``x/<sha256>/000000``.
_RUN_CHUNK_WIDTH = 6
# RunSpace.pack cuts chunks at this margin below the item limit.
_RUN_PIECE_MARGIN = 64


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A record larger than the destination holds that cannot be split."""

    kind: str
    scope: str
    key: str
    size: int
    limit: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "scope": self.scope,
            "key": self.key,
            "size": self.size,
            "limit": self.limit,
            "reason": self.reason,
        }


@dataclass(slots=True)
class Fitted:
    """The entries to write for a unit (``entries``), and whether they differ from the source's."""

    entries: dict[str, Entry]
    rechunked: bool = False
    too_large: list[TooLarge] = field(default_factory=list)


def oversized(entries: dict[str, Entry], limit: int) -> bool:
    """True when some entry is larger than ``limit``: the unit must be re-chunked."""
    return any(len(e.value) > limit for e in entries.values())


def fit(
    kind: str,
    scope: str,
    entries: dict[str, Entry],
    limit: int,
    *,
    now: float,
    existing: dict[str, Entry] | None = None,
) -> Fitted:
    """The entries of a unit re-chunked to hold at most ``limit`` bytes each.

    Unchanged (the same dict) when everything fits. ``now`` (the destination's clock)
    and ``existing`` (the destination's entries of the scope) only name new memory chunk
    sets: a rerun reuses the name it chose before, so it finds its chunks in place.
    New entries carry an empty version.
    """
    if not oversized(entries, limit):
        return Fitted(entries)
    fitter = _Fitter(kind, scope, entries, limit)
    if kind == "sessions":
        fitter.sessions()
    elif kind == "memory":
        fitter.memory(now, existing or {})
    elif kind == "runs":
        fitter.runs()
    elif kind == "conversations":
        fitter.conversations()
    fitter.flag_rest()
    return Fitted(fitter.out, rechunked=True, too_large=fitter.too_large)


def content_view(kind: str, entries: dict[str, Entry]) -> dict[str, Entry]:
    """The unit as content: chunk parts joined, records standing for the data they reference.

    Keys and expiries are the records' own; a chunk group no record references is one
    entry named after the group. Anything that does not decode is kept as it is.
    """
    if kind == "sessions":
        return _session_view(entries)
    if kind == "memory":
        return _memory_view(entries)
    if kind == "runs":
        return _run_view(entries)
    if kind == "conversations":
        return _conversation_view(entries)
    return dict(entries)


def _conversation_view(entries: dict[str, Entry]) -> dict[str, Entry]:
    """Each entry segment as its joined bytes under its base key; the rest as it is."""
    from ..conversations.layout import PART_MARK, joined_segments

    segments = sorted(key for key in entries if key.startswith("e/"))
    view = {k: e for k, e in entries.items() if not k.startswith("e/")}
    joined = dict(joined_segments([(key, entries[key].value) for key in segments]))
    for key in segments:
        if PART_MARK in key.rsplit("/", 1)[-1] and key.split(PART_MARK)[0] in joined:
            continue  # a part, folded into its segment
        entry = entries[key]
        view[key] = Entry(joined.get(key, entry.value), entry.version, entry.expires_at)
    return view


# -- shared -------------------------------------------------------------------------------


def _groups(entries: dict[str, Entry], prefix: str, width: int = 0) -> dict[str, list[str]]:
    """``group -> part keys`` for keys ``<prefix><id>/<n>`` whose parts are all present.

    ``width`` is the zero padding of ``n`` (0: none). A group with a gap is left out: its
    parts are then handled one by one.
    """
    found: dict[str, dict[int, str]] = {}
    for key in entries:
        if not key.startswith(prefix):
            continue
        group, _, index = key.rpartition("/")
        if not index.isdigit() or group == prefix[:-1]:
            continue
        if width and len(index) != width:
            continue
        if not width and str(int(index)) != index:
            continue
        found.setdefault(group, {})[int(index)] = key
    out: dict[str, list[str]] = {}
    for group, parts in found.items():
        if sorted(parts) == list(range(len(parts))):
            out[group] = [parts[i] for i in range(len(parts))]
    return out


def _joined(entries: dict[str, Entry], keys: Iterable[str]) -> bytes:
    return b"".join(entries[k].value for k in keys)


def _latest(expiries: Iterable[float | None]) -> float | None:
    """The expiry that keeps every piece alive as long as the longest-lived one (None wins)."""
    latest = 0.0
    for expiry in expiries:
        if expiry is None:
            return None
        latest = max(latest, expiry)
    return latest


class _Fitter:
    def __init__(self, kind: str, scope: str, entries: dict[str, Entry], limit: int) -> None:
        self.kind = kind
        self.scope = scope
        self.source = entries
        self.limit = limit
        self.out = dict(entries)
        self.too_large: list[TooLarge] = []
        # Source keys whose size no longer matters (replaced by re-cut entries).
        self.handled: set[str] = set()

    def big(self, key: str) -> bool:
        return len(self.source[key].value) > self.limit

    def flag(self, key: str, reason: str) -> None:
        self.too_large.append(
            TooLarge(self.kind, self.scope, key, len(self.source[key].value), self.limit, reason)
        )
        self.handled.add(key)

    def flag_big(self, keys: Iterable[str], reason: str) -> None:
        """Flag the pieces of a group that do not fit (the others are copied as they are)."""
        for key in keys:
            if self.big(key):
                self.flag(key, reason)

    def flag_rest(self) -> None:
        for key in sorted(self.source):
            if key not in self.handled and self.big(key):
                self.flag(key, "a single record, which cannot be split")
        for key, entry in self.out.items():
            if len(entry.value) > self.limit and entry is not self.source.get(key):
                # A rewritten head (state, file record, stub) that still does not fit.
                self.too_large.append(
                    TooLarge(
                        self.kind,
                        self.scope,
                        key,
                        len(entry.value),
                        self.limit,
                        "still too large after moving its data into chunks",
                    )
                )
        self.too_large.sort(key=lambda t: t.key)

    def put(self, key: str, value: bytes, expires_at: float | None) -> None:
        self.out[key] = Entry(value, "", expires_at)

    def put_parts(
        self, group: str, parts: list[bytes], expires_at: float | None, width: int
    ) -> int:
        """Write ``parts`` as ``<group>/<n>`` (``n`` zero-padded to ``width``); their count."""
        for index, part in enumerate(parts):
            self.put(f"{group}/{str(index).zfill(width)}", part, expires_at)
        return len(parts)

    def drop(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.out.pop(key, None)
            self.handled.add(key)

    def conversations(self) -> None:
        """Pydantic AI conversations: an entry segment is cut again into parts of this size
        (its base key's ``P<count>`` header and ``~NNNN`` parts, ``conversations.layout``);
        records, pins and pointers are small and copied as they are."""
        from ..conversations.layout import PART_MARK, joined_segments, part_key, split_parts

        segments = sorted(key for key in self.source if key.startswith("e/"))
        items = [(key, self.source[key].value) for key in segments]
        for base, value in joined_segments(items):
            parts = [k for k in segments if k.startswith(base + PART_MARK)]
            if not any(self.big(k) for k in [base, *parts]):
                continue
            expires = _latest(self.source[k].expires_at for k in [base, *parts])
            self.drop([base, *parts])
            values = split_parts(value, self.limit)
            self.put(base, values[0], expires)
            for index, part in enumerate(values[1:], 1):
                self.put(part_key(base, index), part, expires)

    def oversized_groups(self, groups: dict[str, list[str]]) -> dict[str, list[str]]:
        return {g: keys for g, keys in groups.items() if any(self.big(k) for k in keys)}

    def recut(self, group: str, keys: list[str], data: bytes, size: int, width: int) -> int:
        """Replace the parts ``keys`` of ``group`` by ``data`` cut at ``size``; the new count.

        The new parts live as long as the longest-lived old one.
        """
        expires = _latest(self.source[k].expires_at for k in keys)
        self.drop(keys)
        return self.put_parts(group, split_parts(data, size), expires, width)

    # -- sessions ---------------------------------------------------------------------

    def sessions(self) -> None:
        wanted = self.oversized_groups(_groups(self.source, SESSION_CHUNK_PREFIX))
        if not wanted:
            return
        state = self.source.get(STATE_KEY)
        try:
            decoded = None if state is None else decode_state(state.value)
        except RecordError:
            for keys in wanted.values():
                self.flag_big(
                    keys, "the session's state does not decode, so its chunks cannot be re-cut"
                )
            return
        refs = {} if decoded is None else {ref.key: ref for ref in decoded[0].chunks}
        counts: dict[str, int] = {}
        for group, keys in wanted.items():
            count = self.recut_history(group, keys, refs.get(group))
            if count is not None:
                counts[group] = count
        if state is not None and decoded is not None:
            self.recount_state(state, *decoded, counts)

    def recut_history(self, group: str, keys: list[str], ref: ChunkRef | None) -> int | None:
        """Re-cut one history chunk; its new part count, None when it disagrees with ``ref``."""
        data = _joined(self.source, keys)
        if ref is not None and (ref.parts != len(keys) or ref.size != len(data)):
            self.flag_big(keys, "the history chunk does not match its reference in the state")
            return None
        return self.recut(group, keys, data, self.limit, width=0)

    def recount_state(
        self, state: Entry, header: StateHeader, tail: bytes, counts: dict[str, int]
    ) -> None:
        """Rewrite the part counts of the re-cut chunks in the state, and nothing else."""
        chunks = tuple(
            replace(ref, parts=counts[ref.key]) if ref.key in counts else ref
            for ref in header.chunks
        )
        if chunks != header.chunks:
            self.handled.add(STATE_KEY)
            self.put(
                STATE_KEY, encode_state(replace(header, chunks=chunks), tail), state.expires_at
            )

    # -- memory -----------------------------------------------------------------------

    def memory(self, now: float, existing: dict[str, Entry]) -> None:
        for name, entry in self.source.items():
            self.refit_file(name, entry, now, existing)
        # A vector record is derived data: one too large for the destination is left
        # out, and the destination's next search (or reindex) computes it again with
        # passages sized to its limit.
        self.drop(key for key in self.source if key.startswith(VECTOR_PREFIX) and self.big(key))
        for key in self.source:
            if key.startswith(MEMORY_CHUNK_PREFIX) and key not in self.handled and self.big(key):
                self.flag(
                    key,
                    "a memory chunk no file record references (left by an interrupted "
                    "write; collect_garbage() on the source removes it)",
                )

    def refit_file(self, name: str, entry: Entry, now: float, existing: dict[str, Entry]) -> None:
        """Re-cut the file at ``name`` when it or one of its chunks does not fit.

        A file that does not decode, misses a chunk or cannot fit in any shape is left
        as it is: :meth:`flag_rest` lists its oversized pieces.
        """
        record = _live_file(name, entry, where=repr(f"{self.scope}/{name}"))
        if record is None:
            return
        own = _own_keys(name, record)
        if not self.big(name) and not any(k in self.source and self.big(k) for k in own):
            return
        data = _file_data(self.source, name, record, own)
        if data is None:
            return
        content = data.content or ""
        if len(content) != record.length:
            return
        token = record.token or _memory_token(name, record, now, existing)
        new = _memory_record(name, record, content, data.metadata, token, self.limit)
        if new is None:
            return
        rewritten, pieces = new
        expires = _latest([entry.expires_at, *(self.source[k].expires_at for k in own)])
        self.drop(own)
        self.handled.add(name)
        for key, piece in pieces.items():
            self.put(key, piece, expires)
        self.put(name, rewritten, entry.expires_at)

    # -- runs -------------------------------------------------------------------------

    def runs(self) -> None:
        piece = max(1024, self.limit - _RUN_PIECE_MARGIN)
        groups = _groups(self.source, _RUN_CHUNK_PREFIX, width=_RUN_CHUNK_WIDTH)
        stubs = _run_stubs(self.source)
        counts = self.recut_blobs(groups, piece)
        self.recount_stubs(stubs, counts)
        for key, entry in self.source.items():
            if key not in stubs and not key.startswith(_RUN_CHUNK_PREFIX) and self.big(key):
                self.stub_record(key, entry, groups, counts, piece)

    def recut_blobs(self, groups: dict[str, list[str]], piece: int) -> dict[str, int]:
        """Re-cut the blobs with a part that does not fit; ``sha256 -> new chunk count``."""
        counts: dict[str, int] = {}
        for group, keys in self.oversized_groups(groups).items():
            data = _joined(self.source, keys)
            sha = group[len(_RUN_CHUNK_PREFIX) :]
            if digest(data) != sha:
                self.flag_big(keys, "the run chunks do not match their checksum")
                continue
            counts[sha] = self.recut(group, keys, data, piece, width=_RUN_CHUNK_WIDTH)
        return counts

    def recount_stubs(self, stubs: dict[str, dict[str, Any]], counts: dict[str, int]) -> None:
        """Rewrite the chunk count in every stub that references a re-cut blob."""
        for key, record in stubs.items():
            blob = record["blob"]
            sha = blob.get("sha256")
            if isinstance(sha, str) and sha in counts:
                stub = {**record, "blob": {**blob, "chunks": counts[sha]}}
                self.handled.add(key)
                self.put(key, canonical(stub), self.source[key].expires_at)

    def stub_record(
        self,
        key: str,
        entry: Entry,
        groups: dict[str, list[str]],
        counts: dict[str, int],
        piece: int,
    ) -> None:
        """Turn an inline record too large for the destination into a stub and chunks,
        as the checkpointer writes it; left as it is (and flagged) when readers never
        unpack its kind or it does not decode."""
        keep = next((f for p, f in RUN_STUB_FIELDS.items() if key.startswith(p)), None)
        if keep is None:
            return
        try:
            record = decode_record(entry.value, what=key)
        except CorruptRecordError:
            return
        data = entry.value
        sha = digest(data)
        count = counts.get(sha)
        if count is None:
            count = self.blob_chunks(sha, data, entry.expires_at, groups, counts, piece)
        stub = {name: record[name] for name in keep if name in record}
        stub["blob"] = {"sha256": sha, "chunks": count, "size": len(data)}
        self.handled.add(key)
        self.put(key, canonical(stub), entry.expires_at)

    def blob_chunks(
        self,
        sha: str,
        data: bytes,
        expires_at: float | None,
        groups: dict[str, list[str]],
        counts: dict[str, int],
        piece: int,
    ) -> int:
        """The chunk count of blob ``sha`` (not re-cut above): chunks of the same bytes
        already in the unit, or ``data`` cut here (counted in ``counts``)."""
        group = f"{_RUN_CHUNK_PREFIX}{sha}"
        present = groups.get(group)
        if present is not None and all(not self.big(k) for k in present):
            return len(present)  # the same bytes are already chunked: reuse them
        parts = split_parts(data, piece)
        count = counts[sha] = self.put_parts(group, parts, expires_at, width=_RUN_CHUNK_WIDTH)
        return count


def _run_stubs(entries: dict[str, Entry]) -> dict[str, dict[str, Any]]:
    """The decoded records of the unit that reference a blob (``"blob": {...}``)."""
    stubs: dict[str, dict[str, Any]] = {}
    for key, entry in entries.items():
        if key.startswith(_RUN_CHUNK_PREFIX):
            continue
        try:
            record = decode_record(entry.value, what=key)
        except CorruptRecordError:
            continue
        if isinstance(record.get("blob"), dict):
            stubs[key] = record
    return stubs


# -- memory helpers -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FileData:
    content: str | None
    """None for a record with neither inline content nor chunks."""
    metadata: str | None


def _live_file(name: str, entry: Entry, *, where: str) -> FileRecord | None:
    """The record of the live file at ``name``; None for other keys, tombstones and
    records that do not decode."""
    if name.startswith(INTERNAL_KEY_MARK) or name.endswith(MARKER_SUFFIX):
        return None
    try:
        record = FileRecord.load(entry.value, where=where)
    except CorruptRecordError:
        return None
    return record if record.live else None


def _own_keys(name: str, record: FileRecord) -> list[str]:
    """The content and metadata chunk keys ``record`` references."""
    return (record.chunk_keys(name) if record.chunked else []) + record.metadata_keys(name)


def _file_data(
    entries: dict[str, Entry], name: str, record: FileRecord, own: list[str]
) -> _FileData | None:
    """The content and metadata of a file, joined from its chunks (``own``); None when a
    chunk is missing or not text."""
    if any(k not in entries for k in own):
        return None
    try:
        content = (
            "".join(decode_text(entries[k].value) for k in record.chunk_keys(name))
            if record.chunked
            else record.content
        )
        metadata = record.metadata
        if record.metadata_chunks:
            metadata = decode_text(_joined(entries, record.metadata_keys(name)))
    except UnicodeDecodeError:
        return None
    return _FileData(content, metadata)


def _memory_token(name: str, record: FileRecord, now: float, existing: dict[str, Entry]) -> str:
    """A chunk-set name for a file whose content was inline: the store's form (creation
    time, random part), the random part derived from the file version, so a rerun finds
    the name it gave the same version before (in the record, or in chunks a copy that
    was cut short left) and writes the same keys again."""
    named = encode_text(name) + b"\x00" + encode_text(record.version or "")
    suffix = f"-{digest(named)[:12]}"
    current = existing.get(name)
    if current is not None:
        try:
            token = FileRecord.load(current.value, where=name).token
        except CorruptRecordError:
            token = None
        if token is not None and token.endswith(suffix):
            return token
    mine = f"{MEMORY_CHUNK_PREFIX}{name}/"
    for key in existing:
        token = key[len(mine) :].partition("/")[0] if key.startswith(mine) else ""
        if token.endswith(suffix):
            return token
    return f"{int(now):x}{suffix}"


def _memory_record(
    name: str, record: FileRecord, content: str, metadata: str | None, token: str, limit: int
) -> tuple[bytes, dict[str, bytes]] | None:
    """The record (and its chunks) of ``record`` re-cut for ``limit``, in the first shape
    that fits, tried in the store's order; None when none does."""
    pieces = list(split_utf8(encode_text(content), limit))
    sizes = [len(decode_text(p)) for p in pieces]
    meta_pieces = list(split_utf8(encode_text(metadata), limit)) if metadata else []
    for chunk_content, chunk_metadata in ((False, False), (True, False), (True, True)):
        if chunk_metadata and not metadata:
            continue
        new = FileRecord(
            live=True,
            version=record.version,
            operation_id=record.operation_id,
            length=record.length,
            content=None if chunk_content else content,
            token=token if chunk_content or chunk_metadata else None,
            chunks=sizes if chunk_content else [],
            metadata=None if chunk_metadata else metadata,
            metadata_chunks=len(meta_pieces) if chunk_metadata else 0,
            receipts=list(record.receipts),
        )
        encoded = new.encoded()
        if len(encoded) > limit:
            continue
        chunks: dict[str, bytes] = {}
        if chunk_content:
            chunks.update(
                {content_chunk_key(name, token, i): piece for i, piece in enumerate(pieces)}
            )
        if chunk_metadata:
            chunks.update(
                {metadata_chunk_key(name, token, i): piece for i, piece in enumerate(meta_pieces)}
            )
        return encoded, chunks
    return None


# -- content views ----------------------------------------------------------------------------


def _session_view(entries: dict[str, Entry]) -> dict[str, Entry]:
    view = dict(entries)
    for group, keys in _groups(entries, SESSION_CHUNK_PREFIX).items():
        for key in keys:
            del view[key]
        view[group] = Entry(
            _joined(entries, keys), "", _latest(entries[k].expires_at for k in keys)
        )
    state = entries.get(STATE_KEY)
    if state is not None:
        try:
            header, tail = decode_state(state.value)
        except RecordError:
            return view
        # The part counts are how the chunks are cut, not what they hold.
        chunks = tuple(replace(ref, parts=0) for ref in header.chunks)
        view[STATE_KEY] = Entry(
            encode_state(replace(header, chunks=chunks), tail), "", state.expires_at
        )
    return view


def _memory_view(entries: dict[str, Entry]) -> dict[str, Entry]:
    # Vector records are derived from the files (and may be left out by a re-cut).
    view = {key: entry for key, entry in entries.items() if not key.startswith(VECTOR_PREFIX)}
    absorbed: set[str] = set()
    for name, entry in entries.items():
        record = _live_file(name, entry, where=name)
        if record is None:
            continue
        own = _own_keys(name, record)
        data = _file_data(entries, name, record, own)
        if data is None:
            continue
        doc = {
            "version": record.version,
            "operation_id": record.operation_id,
            "length": record.length,
            "content": data.content,
            "metadata": data.metadata,
            "receipts": [r.dump() for r in record.receipts],
        }
        # ASCII escapes: content may hold lone surrogates.
        view[name] = Entry(json.dumps(doc, sort_keys=True).encode(), "", entry.expires_at)
        absorbed.update(own)
    for key in absorbed:
        view.pop(key, None)
    return view


def _run_view(entries: dict[str, Entry]) -> dict[str, Entry]:
    view = dict(entries)
    groups = _groups(entries, _RUN_CHUNK_PREFIX, width=_RUN_CHUNK_WIDTH)
    for group, keys in groups.items():
        for key in keys:
            del view[key]
        view[group] = Entry(
            _joined(entries, keys), "", _latest(entries[k].expires_at for k in keys)
        )
    referenced: set[str] = set()
    for key, record in _run_stubs(entries).items():
        entry, blob = entries[key], record["blob"]
        group = f"{_RUN_CHUNK_PREFIX}{blob.get('sha256')}"
        data = view.get(group)
        if group not in groups or data is None or digest(data.value) != blob.get("sha256"):
            continue
        # A stub stands for the record it was cut from: the same bytes as inline.
        view[key] = Entry(data.value, "", entry.expires_at)
        referenced.add(group)
    for group in referenced:
        del view[group]
    return view
